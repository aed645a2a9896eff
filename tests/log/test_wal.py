"""WriteAheadLog on real files (torn tails, corruption, rolling, truncation) and the payload codec."""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.log.batch import PartitionAppend
from pipeline.log.wal import (
    WalCorruptionError,
    WalEntry,
    WalPosition,
    WriteAheadLog,
    decode_appends,
    encode_appends,
    read_spans,
)

HEADER = 8  # length + CRC32C


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.wal"))


def opened(directory: Path, segment_bytes: int = 1024) -> tuple[WriteAheadLog, list[WalEntry]]:
    wal = WriteAheadLog(directory, segment_bytes=segment_bytes, fsync=False)
    return wal, wal.open()


def payloads(entries: list[WalEntry]) -> list[bytes]:
    return [e.payload for e in entries]


def write_groups(directory: Path, groups: list[list[bytes]], segment_bytes: int) -> list[WalEntry]:
    """Append the groups to a fresh log; return the entries with their expected end positions."""
    wal, replayed = opened(directory, segment_bytes)
    assert replayed == []
    expected: list[WalEntry] = []
    for group in groups:
        before = wal.end_position
        position = wal.append(group)
        segment = position.segment
        offset = position.offset - sum(HEADER + len(p) for p in group)
        assert offset == (before.offset if segment == before.segment else 0)
        for p in group:
            offset += HEADER + len(p)
            expected.append(WalEntry(WalPosition(segment, offset), p))
        assert position == expected[-1].position == wal.end_position
    wal.close()
    return expected


def test_empty_directory_is_created_and_opens_segment_zero(tmp_path):
    wal, entries = opened(tmp_path / "wal")
    assert entries == []
    assert wal.end_position == WalPosition(0, 0)
    assert wal.size_bytes == 0
    assert [p.name for p in segment_files(tmp_path / "wal")] == [f"{0:020d}.wal"]
    wal.close()


def test_entry_layout_is_length_crc_payload(tmp_path):
    import crc32c

    wal, _ = opened(tmp_path)
    assert wal.append([b"hello", b"kafka"]) == WalPosition(0, 26)
    wal.close()
    data = segment_files(tmp_path)[0].read_bytes()
    assert data == (struct.pack(">II", 5, crc32c.crc32c(b"hello")) + b"hello"
                    + struct.pack(">II", 5, crc32c.crc32c(b"kafka")) + b"kafka")


def test_round_trip_across_segments_with_rolling(tmp_path):
    groups = [[bytes([i]) * (10 + 7 * i) for i in range(j, j + 3)] for j in range(0, 30, 3)]
    expected = write_groups(tmp_path, groups, segment_bytes=100)
    files = segment_files(tmp_path)
    assert len(files) > 3
    # A segment rolls only once it holds >= segment_bytes; a group is never split.
    sizes = [f.stat().st_size for f in files]
    assert all(size >= 100 for size in sizes[:-1])
    ends = {e.position.segment: set() for e in expected}
    for e in expected:
        ends[e.position.segment].add(e.position.offset)
    for i, f in enumerate(files):
        assert int(f.stem) == i and max(ends[i]) == f.stat().st_size
    wal, entries = opened(tmp_path, segment_bytes=100)
    assert entries == expected
    assert wal.size_bytes == sum(sizes)
    assert wal.end_position == expected[-1].position
    wal.close()


def test_read_spans_reads_payloads_back_across_segments(tmp_path):
    groups = [[bytes([i]) * (10 + 7 * i) for i in range(j, j + 3)] for j in range(0, 30, 3)]
    expected = write_groups(tmp_path, groups, segment_bytes=100)
    spans = [(e.position.segment, e.position.offset - len(e.payload), len(e.payload)) for e in expected]
    assert len({s for s, _, _ in spans}) > 3
    assert read_spans(str(tmp_path), spans[::-1]) == [e.payload for e in expected][::-1]
    assert read_spans(str(tmp_path), []) == []


def test_read_spans_refuses_a_span_past_the_end_or_in_a_deleted_segment(tmp_path):
    expected = write_groups(tmp_path, [[b"abc"], [b"defg"]], segment_bytes=1)
    last = expected[-1].position
    with pytest.raises(OSError, match="short read"):
        read_spans(str(tmp_path), [(last.segment, last.offset - 4, 5)])
    with pytest.raises(FileNotFoundError):
        read_spans(str(tmp_path), [(last.segment + 5, 0, 1)])


def test_many_entries_in_one_append_are_written_in_order(tmp_path):
    wal, _ = opened(tmp_path, segment_bytes=1 << 30)
    group = [bytes([i % 256]) * (1 + i % 5) for i in range(3000)]  # more buffers than one writev takes
    wal.append(group)
    wal.close()
    _, entries = opened(tmp_path, segment_bytes=1 << 30)
    assert payloads(entries) == group


def test_one_oversized_group_stays_in_one_segment(tmp_path):
    wal, _ = opened(tmp_path, segment_bytes=16)
    first = wal.append([b"a" * 40, b"b" * 40])
    assert first == WalPosition(0, 96)
    assert wal.append([b"c"]) == WalPosition(1, 9)
    wal.close()


def test_empty_group_writes_nothing_and_empty_payload_is_refused(tmp_path):
    wal, _ = opened(tmp_path)
    wal.append([b"x"])
    assert wal.append([]) == WalPosition(0, 9)
    with pytest.raises(ValueError):
        wal.append([b"y", b""])
    assert wal.size_bytes == 9
    wal.close()


def test_appends_after_reopen_continue_the_last_segment(tmp_path):
    wal, _ = opened(tmp_path, segment_bytes=1000)
    wal.append([b"one"])
    wal.close()
    wal, entries = opened(tmp_path, segment_bytes=1000)
    assert payloads(entries) == [b"one"]
    assert wal.append([b"two"]) == WalPosition(0, 22)
    wal.close()
    wal, entries = opened(tmp_path, segment_bytes=1000)
    assert payloads(entries) == [b"one", b"two"]
    wal.close()


def test_truncate_before_deletes_only_fully_covered_inactive_segments(tmp_path):
    wal, _ = opened(tmp_path, segment_bytes=50)
    positions = [wal.append([bytes([i]) * 42]) for i in range(5)]  # 50 bytes each: one segment each
    assert [p.segment for p in positions] == [0, 1, 2, 3, 4]
    total = wal.size_bytes
    assert total == 250

    assert wal.truncate_before(WalPosition(1, 49)) == 50  # segment 1 only partly covered
    assert [int(f.stem) for f in segment_files(tmp_path)] == [1, 2, 3, 4]
    assert wal.truncate_before(positions[0]) == 0  # idempotent
    assert wal.truncate_before(positions[2]) == 100
    assert [int(f.stem) for f in segment_files(tmp_path)] == [3, 4]
    assert wal.truncate_before(positions[4]) == 50  # never the active segment
    assert wal.truncate_before(WalPosition(99, 0)) == 0
    assert [int(f.stem) for f in segment_files(tmp_path)] == [4]
    assert wal.size_bytes == 50
    wal.close()


def test_reopen_after_truncate_replays_the_rest(tmp_path):
    wal, _ = opened(tmp_path, segment_bytes=100)
    for i in range(12):
        wal.append([bytes([i]) * 30, bytes([i]) * 12])  # 58-byte groups, two per segment
    covered = WalPosition(2, 58)  # middle of segment 2
    freed = wal.truncate_before(covered)
    assert freed == 2 * 116
    wal.close()
    wal, entries = opened(tmp_path, segment_bytes=100)
    assert entries[0].position == WalPosition(2, 38)  # segment 2 replays from its start
    assert [e.payload[0] for e in entries[::2]] == list(range(4, 12))
    assert wal.size_bytes == 4 * 116
    wal.append([b"z"])
    wal.close()
    _, entries = opened(tmp_path, segment_bytes=100)
    assert entries[-1].payload == b"z"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    groups=st.lists(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=4),
                    min_size=1, max_size=8),
    cut_fraction=st.floats(min_value=0.0, max_value=1.0),
    later=st.lists(st.binary(min_size=1, max_size=20), min_size=1, max_size=3),
)
def test_torn_tail_at_any_byte_is_truncated(groups, cut_fraction, later):
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        expected = write_groups(directory, groups, segment_bytes=120)
        last = segment_files(directory)[-1]
        segment = int(last.stem)
        cut = round(cut_fraction * last.stat().st_size)
        os.truncate(last, cut)

        wal, entries = opened(directory, segment_bytes=120)
        survivors = [e for e in expected if e.position <= WalPosition(segment, cut)]
        assert entries == survivors
        kept = survivors[-1].position.offset if survivors and survivors[-1].position.segment == segment else 0
        assert last.stat().st_size == kept
        position = wal.append(later)
        wal.close()

        _, replayed = opened(directory, segment_bytes=120)
        assert payloads(replayed) == payloads(survivors) + later
        assert replayed[-1].position == position


def test_zero_filled_tail_is_torn(tmp_path):
    wal, _ = opened(tmp_path)
    wal.append([b"kept"])
    wal.close()
    path = segment_files(tmp_path)[0]
    with path.open("ab") as f:
        f.write(bytes(4096))  # a crash after the size grew but before the data landed
    _, entries = opened(tmp_path)
    assert payloads(entries) == [b"kept"]
    assert path.stat().st_size == 12


def three_entries(directory: Path) -> tuple[Path, list[int]]:
    """A segment with entries of 40, 50 and 60 payload bytes; returns it and the entry starts."""
    wal, _ = opened(directory)
    wal.append([b"a" * 40, b"b" * 50, b"c" * 60])
    wal.close()
    return segment_files(directory)[0], [0, 48, 106]


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("at", range(48, 106))  # every byte of the middle entry
def test_flipped_byte_in_middle_entry_refuses_to_start(tmp_path, at):
    path, _ = three_entries(tmp_path)
    flip(path, at)
    with pytest.raises(WalCorruptionError, match=rf"{path.name}: bad entry at byte 48 "):
        opened(tmp_path)
    assert path.stat().st_size == 174  # nothing truncated


@pytest.mark.parametrize("at", [106, 109, 110, 113, 114, 140, 173])  # length, CRC, payload of the last
def test_flipped_byte_in_last_entry_is_a_torn_tail(tmp_path, at, caplog):
    path, _ = three_entries(tmp_path)
    flip(path, at)
    wal, entries = opened(tmp_path)
    assert payloads(entries) == [b"a" * 40, b"b" * 50]
    assert path.stat().st_size == 106
    assert "truncating torn tail of 68 bytes" in caplog.text
    assert wal.append([b"d"]) == WalPosition(0, 115)
    wal.close()


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 60), min_size=2, max_size=8),
    data=st.data(),
)
def test_any_flipped_byte_before_the_last_entry_refuses_to_start(sizes, data):
    """Whatever byte of a non-last entry flips (length, CRC or payload), the entries after it are a clean run."""
    group = [data.draw(st.binary(min_size=n, max_size=n)) for n in sizes]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        write_groups(directory, [group], segment_bytes=1 << 20)
        path = segment_files(directory)[0]
        last_start = path.stat().st_size - HEADER - sizes[-1]
        at = data.draw(st.integers(0, last_start - 1))
        flip(path, at)
        with pytest.raises(WalCorruptionError, match="refusing to start"):
            opened(directory)


def test_clean_run_ending_in_zero_fill_still_counts_as_corruption(tmp_path):
    path, _ = three_entries(tmp_path)
    flip(path, 60)  # payload of the middle entry
    with path.open("ab") as f:
        f.write(bytes(1000))
    with pytest.raises(WalCorruptionError, match="followed by valid entries from byte 106"):
        opened(tmp_path)


def test_a_wal_frame_inside_a_torn_payload_is_not_guessed_away(tmp_path):
    """The one case the torn-tail rule cannot tell apart: it refuses to start rather than drop data."""
    import crc32c

    inner = struct.pack(">II", 3, crc32c.crc32c(b"abc")) + b"abc"
    wal, _ = opened(tmp_path)
    wal.append([b"ok", b"#" * 20 + inner + b"#" * 20])
    wal.close()
    path = segment_files(tmp_path)[0]
    os.truncate(path, 10 + HEADER + 20 + len(inner))
    with pytest.raises(WalCorruptionError, match="from byte 38 to the end"):
        opened(tmp_path)


def test_bad_entry_in_a_non_last_segment_refuses_to_start(tmp_path):
    wal, _ = opened(tmp_path, segment_bytes=10)
    wal.append([b"first"])
    wal.append([b"second"])
    wal.close()
    first = segment_files(tmp_path)[0]
    flip(first, 12)  # last byte of the only entry of segment 0
    with pytest.raises(WalCorruptionError, match=rf"{first.name}: bad entry at byte 0 "):
        opened(tmp_path)


def test_partial_entry_in_a_non_last_segment_refuses_to_start(tmp_path):
    wal, _ = opened(tmp_path, segment_bytes=10)
    wal.append([b"first"])
    wal.append([b"second"])
    wal.close()
    first = segment_files(tmp_path)[0]
    os.truncate(first, 11)
    with pytest.raises(WalCorruptionError):
        opened(tmp_path)


def test_fsync_path_works(tmp_path):
    wal = WriteAheadLog(tmp_path, segment_bytes=20, fsync=True)
    assert wal.open() == []
    wal.append([b"x" * 30])
    assert wal.append([b"y"]) == WalPosition(1, 9)  # rolled: directory fsynced too
    wal.close()
    assert payloads(WriteAheadLog(tmp_path, fsync=True).open()) == [b"x" * 30, b"y"]


def test_misuse(tmp_path):
    with pytest.raises(ValueError):
        WriteAheadLog(tmp_path, segment_bytes=0)
    wal = WriteAheadLog(tmp_path)
    with pytest.raises(RuntimeError):
        wal.append([b"x"])
    wal.open()
    with pytest.raises(RuntimeError):
        wal.open()
    wal.close()
    wal.close()
    with pytest.raises(RuntimeError):
        wal.append([b"x"])


# --------------------------------------------------------------------- codec

int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
partition_appends = st.builds(
    PartitionAppend,
    topic=st.text(max_size=60),  # empty and any unicode (no lone surrogates: not UTF-8)
    partition=int32,
    base_offset=int64,
    records=st.binary(max_size=2000) | st.just(b"\x00\xff" * 300_000),
    record_count=int32,
    log_append_time_ms=int64,
    producer_id=int64,
    producer_epoch=st.integers(-(2**15), 2**15 - 1),
    base_sequence=int32,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(partition_appends, max_size=5))
def test_encode_decode_round_trip(appends):
    payload = encode_appends(appends)
    assert payload[0] == 1  # format byte
    assert decode_appends(payload) == appends


def test_encode_rejects_out_of_range_fields():
    with pytest.raises(ValueError):
        encode_appends([PartitionAppend("t", 2**31, 0, b"", 0, 0)])
    with pytest.raises(ValueError):
        encode_appends([PartitionAppend("t" * 70_000, 0, 0, b"", 0, 0)])
    with pytest.raises(ValueError):
        encode_appends([PartitionAppend("\ud800", 0, 0, b"", 0, 0)])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_decode_of_garbage_raises_value_error(garbage):
    try:
        decoded = decode_appends(garbage)
    except ValueError:
        return
    assert encode_appends(decoded) == garbage  # only a well-formed payload decodes


@settings(max_examples=200, deadline=None)
@given(st.lists(partition_appends, min_size=1, max_size=3), st.data())
def test_decode_of_truncated_or_extended_payload_raises(appends, data):
    payload = encode_appends(appends)
    cut = data.draw(st.integers(0, len(payload) - 1))
    with pytest.raises(ValueError):
        decode_appends(payload[:cut])
    with pytest.raises(ValueError):
        decode_appends(payload + b"\x00")
    with pytest.raises(ValueError):
        decode_appends(b"\x02" + payload[1:])
