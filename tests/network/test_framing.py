"""FrameDecoder: coalesced and split frames, size checks (Kafka NetworkReceive)."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.network.framing import LARGE_FRAME_BYTES, FrameDecoder, InvalidReceiveError, encode_frame


def drain(decoder: FrameDecoder) -> list[bytes]:
    frames = []
    while (frame := decoder.next_frame()) is not None:
        frames.append(frame)
    return frames


def feed_in_chunks(stream: bytes, cuts: list[int], max_bytes: int = 1 << 20) -> list[bytes]:
    decoder = FrameDecoder(max_bytes)
    frames: list[bytes] = []
    points = sorted({c for c in cuts if 0 < c < len(stream)})
    start = 0
    for end in points + [len(stream)]:
        decoder.receive_data(stream[start:end])
        frames.extend(drain(decoder))
        start = end
    assert decoder.buffered_bytes == 0
    return frames


@settings(max_examples=300, deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=300), max_size=20),
    data=st.data(),
)
def test_any_cut_points_decode_to_the_same_frames(bodies, data):
    stream = b"".join(encode_frame(b) for b in bodies)
    cuts = data.draw(st.lists(st.integers(0, max(len(stream), 1)), max_size=50))
    assert feed_in_chunks(stream, cuts) == bodies


@given(bodies=st.lists(st.binary(max_size=40), min_size=1, max_size=8))
def test_one_byte_at_a_time(bodies):
    stream = b"".join(encode_frame(b) for b in bodies)
    assert feed_in_chunks(stream, list(range(len(stream)))) == bodies


def test_coalesced_frames_in_one_read():
    decoder = FrameDecoder()
    decoder.receive_data(encode_frame(b"a") + encode_frame(b"") + encode_frame(b"ccc") + b"\x00\x00")
    assert drain(decoder) == [b"a", b"", b"ccc"]
    assert decoder.buffered_bytes == 2


def test_zero_size_is_a_valid_empty_frame():
    decoder = FrameDecoder()
    decoder.receive_data(b"\x00\x00\x00\x00")
    assert decoder.next_frame() == b""
    assert decoder.next_frame() is None


@given(size=st.integers(min_value=-(2**31), max_value=-1), split=st.integers(0, 3))
def test_negative_size_is_rejected(size, split):
    decoder = FrameDecoder()
    prefix = struct.pack(">i", size)
    decoder.receive_data(prefix[:split])
    assert decoder.next_frame() is None  # not enough bytes to judge yet
    decoder.receive_data(prefix[split:])
    with pytest.raises(InvalidReceiveError, match="negative") as info:
        decoder.next_frame()
    assert info.value.size == size
    with pytest.raises(InvalidReceiveError):  # poisoned: stays failed
        decoder.next_frame()


@given(max_bytes=st.integers(0, 10_000), excess=st.integers(1, 2**31 - 10_001))
def test_oversize_is_rejected_before_buffering_the_body(max_bytes, excess):
    decoder = FrameDecoder(max_bytes)
    decoder.receive_data(struct.pack(">i", max_bytes + excess))
    with pytest.raises(InvalidReceiveError, match="socket.request.max.bytes"):
        decoder.next_frame()


def test_size_equal_to_max_is_accepted():
    decoder = FrameDecoder(5)
    decoder.receive_data(encode_frame(b"12345"))
    assert decoder.next_frame() == b"12345"


def test_frames_before_an_invalid_size_are_delivered():
    decoder = FrameDecoder(100)
    decoder.receive_data(encode_frame(b"ok") + struct.pack(">i", -1))
    assert decoder.next_frame() == b"ok"
    with pytest.raises(InvalidReceiveError):
        decoder.next_frame()


def test_encode_frame_prefixes_big_endian_size():
    assert encode_frame(b"abc") == b"\x00\x00\x00\x03abc"


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 3 * LARGE_FRAME_BYTES), min_size=1, max_size=6), st.integers(1, 70_000))
def test_large_frames_are_received_into_their_own_buffer(cuts, small):
    big = bytes(range(256)) * (LARGE_FRAME_BYTES // 256 + 3)
    stream = encode_frame(b"s" * small) + encode_frame(big) + encode_frame(b"tail")
    # the limit admits both frames: ``small`` may exceed ``big`` (up to 70,000 bytes)
    frames = feed_in_chunks(stream, cuts, max_bytes=max(len(big), small))
    assert frames == [b"s" * small, big, b"tail"]


def test_large_frame_is_handed_out_without_a_copy():
    decoder = FrameDecoder()
    body = b"z" * LARGE_FRAME_BYTES
    data = encode_frame(body) + encode_frame(b"next")
    decoder.receive_data(data[:1000])
    assert decoder.next_frame() is None
    assert decoder.buffered_bytes == 1000
    decoder.receive_data(data[1000:])
    frame = decoder.next_frame()
    assert isinstance(frame, bytearray) and frame == body
    assert decoder.next_frame() == b"next"


def read_like_a_socket(stream: bytes, read_sizes: list[int]) -> tuple[list[bytes], int]:
    """Feed ``stream`` as the channel reads a plain socket: into ``receive_buffer`` when the
    decoder lends one (a large frame being filled), else through ``receive_data``; each read
    takes at most the next of ``read_sizes`` bytes. Returns the frames and the reads made into buffers."""
    decoder = FrameDecoder(len(stream))
    frames: list[bytes] = []
    pos, i, into_reads = 0, 0, 0
    while pos < len(stream):
        size = read_sizes[i % len(read_sizes)]
        i += 1
        into = decoder.receive_buffer()
        if into is not None:
            n = min(size, len(into), len(stream) - pos)
            into[:n] = stream[pos:pos + n]
            into.release()
            decoder.received_into(n)
            into_reads += 1
        else:
            n = min(size, len(stream) - pos)
            decoder.receive_data(stream[pos:pos + n])
        pos += n
        frames.extend(drain(decoder))
    assert decoder.buffered_bytes == 0 and decoder.receive_buffer() is None
    return frames, into_reads


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 2 * LARGE_FRAME_BYTES), min_size=1, max_size=5),
       st.lists(st.integers(1, 150_000), min_size=1, max_size=8))
def test_reads_into_the_lent_buffer_give_the_same_frames(sizes, read_sizes):
    bodies = [bytes([n % 251]) * n for n in sizes] + [b"tail"]
    stream = b"".join(encode_frame(b) for b in bodies)
    frames, _ = read_like_a_socket(stream, read_sizes)
    assert frames == bodies


def test_a_large_frame_after_its_first_read_is_read_straight_into_its_buffer():
    body = bytes(range(256)) * (4 * LARGE_FRAME_BYTES // 256)
    frames, into_reads = read_like_a_socket(encode_frame(body) + encode_frame(b"x"), [10_000])
    assert frames == [body, b"x"]
    assert into_reads == len(body) // 10_000  # every read after the first went into the frame


def test_received_into_outside_a_large_frame_is_refused():
    decoder = FrameDecoder()
    with pytest.raises(ValueError):
        decoder.received_into(1)
    decoder.receive_data(encode_frame(b"q" * LARGE_FRAME_BYTES)[:100])
    assert decoder.next_frame() is None
    into = decoder.receive_buffer()
    assert into is not None and len(into) == LARGE_FRAME_BYTES - 96
    with pytest.raises(ValueError):
        decoder.received_into(len(into) + 1)
