"""``ConnectionState.take_requests``: the read path's C cut (``pipeline._frames``) against
``next_request``, frame by frame.

Two ConnectionStates get the same stream in the same chunks. One is read with ``next_request``
alone, the other as the Processor reads it (``take_requests``, then ``next_request``). Both must
give the same requests (header, frame, token, pool bytes), pauses, mute reasons and errors, and
keep the same buffered bytes, pool use and receive-timeout clock after every chunk: the C path
changes only how fast it happens. The stream mixes requests each path takes (header v1 and v2)
with every header the C path leaves to Python (tagged fields, a null or non-UTF-8 client id,
SaslHandshake, ControlledShutdown v0, unknown api keys, truncated headers, empty frames, bad sizes).
"""

from __future__ import annotations

import dataclasses
import os
import struct

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pipeline._frames import Layout, cut
from pipeline.fastinit import layout
from pipeline.network.channel import _REQUEST_LAYOUT
from pipeline.network.connection_state import (
    NEED_DATA,
    PAUSED,
    ConnectionLimits,
    ConnectionState,
    ReceivedFrame,
)
from pipeline.network.framing import InvalidReceiveError
from pipeline.network.memory_pool import MemoryPool
from pipeline.network.request_channel import Request
from pipeline.protocol.errors import InvalidRequestError
from pipeline.protocol.header import FAST_PATH_TABLE, RequestHeader, parse_request_header
from tests.network.test_fuzz_framing import Piece, chunked

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", 300))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def header(api_key: int, version: int, cid: int, client: bytes | None, tail: bytes = b"") -> bytes:
    """A request frame body: header v1 fields (client id None: a null string), then ``tail``."""
    client_field = struct.pack(">h", -1) if client is None else struct.pack(">h", len(client)) + client
    return struct.pack(">hhi", api_key, version, cid) + client_field + tail


BODIES = (
    header(3, 1, 1, b"fuzz", b"\xff\xff\xff\xff"),  # Metadata v1: header v1
    header(3, 12, 2, b"fuzz", b"\x00\x00"),  # Metadata v12: header v2, no tagged fields
    header(0, 9, 3, b"fuzz", b"\x00\xff\xff\x00\x00\x75\x30\x00"),  # Produce v9
    header(18, 3, 4, b"fuzz", b"\x00\x05rdkaf\x03v2\x00"),  # ApiVersions v3
    header(3, 12, 5, b"fuzz", b"\x01\x00\x02ab\x00"),  # header v2 with a tagged field
    header(3, 12, 6, b"fuzz", b"\x02\x05\x01a\x01\x01b\x00"),  # tagged fields out of order: invalid
    header(3, 1, 7, None, b"\xff\xff\xff\xff"),  # null client id
    header(3, 1, 8, b"\xff\xfe", b"\x00"),  # client id not UTF-8: invalid
    header(3, 1, 9, "prodütor".encode(), b"\x00"),  # a UTF-8 client id
    header(3, 1, 10, b"fuzz"),  # the client id reaches the frame's end (no body)
    header(3, 12, 18, b"fuzz"),  # ... in a v2 header: its tagged fields are missing, invalid
    header(17, 0, 11, b"fuzz", b"\x00\x05PLAIN"),  # SaslHandshake v0: raw tokens follow
    header(17, 1, 12, b"fuzz", b"\x00\x05PLAIN"),  # SaslHandshake v1
    header(7, 0, 13, b"fuzz"),  # ControlledShutdown v0: header v0
    header(999, 0, 14, b"fuzz", b"\x00"),  # unknown api key: invalid
    header(-1, 0, 15, b"fuzz", b"\x00"),  # negative api key: invalid
    header(3, 1, 16, b"a-longer-client-id", b"\xff\xff\xff\xff"),  # another client id
    b"",  # empty frame: invalid
    b"\x00\x03\x00",  # truncated fixed header: invalid
    header(3, 1, 17, b"fuzz")[:9],  # truncated client id length: invalid
)


PLAIN = BODIES[:4] + BODIES[8:9] + BODIES[16:17]
"""Bodies both paths take (header v1 and v2, two client ids)."""
ODD = BODIES[4:8] + BODIES[9:16] + BODIES[17:]
"""Bodies the C path leaves to ``next_request`` (some of them valid)."""


def pieces() -> st.SearchStrategy[list[Piece]]:
    """Mostly plain requests, so that long runs of the C path happen, with now and then an odd
    header, a cut or random body, or a bad size (after which the stream ends)."""
    plain = st.sampled_from(PLAIN).map(lambda b: Piece(len(b), b))
    odd = st.one_of(
        st.sampled_from(ODD),
        st.sampled_from(BODIES).flatmap(lambda b: st.integers(0, len(b)).map(lambda n: b[:n])),
        st.binary(max_size=24),
    ).map(lambda b: Piece(len(b), b))
    bad = st.sampled_from([-1, -(2**31), 2**31 - 1]).map(lambda s: Piece(s, None))
    return st.lists(st.integers(0, 15).flatmap(lambda i: odd if i == 0 else plain), max_size=40).flatmap(
        lambda ps: st.one_of(st.just(ps), st.just(ps), bad.map(lambda b: [*ps, b])))


def outcome(item: object) -> tuple:
    """A request of either path as (header, frame, token, pool bytes)."""
    assert isinstance(item, (ReceivedFrame, Request))
    return item.header, bytes(item.frame), item.token, item.pool_bytes


def snapshot(state: ConnectionState, pool: MemoryPool) -> tuple:
    return (state.mute_reason, state._frame_started, state.in_flight, state.buffered_bytes, pool.used,
            state.raw_sasl_tokens)


def read(state: ConnectionState, pool: MemoryPool, chunks: list[bytes], fast: bool, sasl_after: set[int],
         ) -> tuple[list, list, Exception | None]:
    """Feed ``chunks``; returns (events, snapshots after each chunk, the error that ended it).

    Requests are held until a pause (then every held one is answered with nothing and
    released), so that memory and in-flight pauses happen; a SaslHandshake v0 answered
    successfully switches the connection to raw tokens, as the SASL handler does."""
    events: list = []
    snapshots: list = []
    held: list = []
    tokens_seen = 0

    def release_all(now: float) -> None:
        for item in held:
            pool.release(item.pool_bytes)
            state.complete(item.token, None)
        held.clear()
        assert state.data_to_send(now) in (None, b"")
        state.raw_sasl_tokens = False

    def taken(item: object) -> None:
        nonlocal tokens_seen
        events.append(outcome(item))
        held.append(item)
        tokens_seen += 1
        if item.header.api_key == 17 and item.header.api_version == 0 and tokens_seen in sasl_after:
            state.raw_sasl_tokens = True

    try:
        for i, chunk in enumerate(chunks):
            now = float(i + 1)
            state.receive_data(chunk, now)
            while True:
                if fast:
                    for item in state.take_requests(now, _REQUEST_LAYOUT, "owner"):
                        assert item.connection == "owner" and item.pool is pool and item.received_at == now
                        taken(item)
                result = state.next_request(now)
                if isinstance(result, ReceivedFrame):
                    taken(result)
                    continue
                if result is PAUSED:
                    events.append(("paused", state.mute_reason))
                    release_all(now)
                    continue
                assert result is NEED_DATA
                break
            snapshots.append(snapshot(state, pool))
    except (InvalidReceiveError, InvalidRequestError) as exc:
        events.append(("error", type(exc), str(exc)))
        error: Exception | None = exc
    else:
        error = None
    release_all(0.0)
    state.close()
    return events, snapshots, error


@FUZZ
@given(
    st.sampled_from([120, 400, 1 << 20, 1 << 20]) | st.integers(1, 300),  # pool capacity
    st.sampled_from([60, 1 << 20, 1 << 20]) | st.integers(1, 100),  # max_receive_bytes
    st.sampled_from([1, 3, 64]),  # max_in_flight
    pieces(),
    st.lists(st.integers(0, 1 << 12), max_size=10),
    st.sets(st.integers(1, 40)),  # which SaslHandshake v0 requests (by arrival) succeed
)
def test_take_requests_then_next_request_reads_exactly_as_next_request_alone(
    capacity: int, max_receive: int, max_in_flight: int, stream: list[Piece], cuts: list[int], sasl_after: set[int],
) -> None:
    data = b"".join(p.encode() for p in stream)
    chunks = chunked(data, cuts)
    results = []
    for fast in (False, True):
        pool = MemoryPool(capacity)
        limits = ConnectionLimits(max_receive_bytes=max_receive, max_in_flight=max_in_flight)
        state = ConnectionState(pool, limits, now=0.0)
        results.append(read(state, pool, chunks, fast, sasl_after))
        assert pool.used == 0, "memory not returned"
    (slow_events, slow_snaps, slow_error), (fast_events, fast_snaps, fast_error) = results
    requests = sum(1 for e in slow_events if isinstance(e[0], RequestHeader))
    event(f"{type(slow_error).__name__ if slow_error else 'no error'}, "
          f"{'0' if not requests else '1-5' if requests <= 5 else '6-19' if requests < 20 else '20+'} requests")
    assert fast_events == slow_events
    assert fast_snaps == slow_snaps
    assert type(fast_error) is type(slow_error)


def test_the_fast_path_takes_a_run_of_plain_requests_in_one_call() -> None:
    """A read of 16 Produce requests and a Metadata one: one ``take_requests`` call takes them
    all once each api key has been seen by the header parser, and nothing is left to
    ``next_request``."""
    bodies_ = [header(0, 9, cid, b"producer-1", b"\x00\xff\xff\x00\x00\x75\x30\x00") for cid in range(16)]
    bodies_.append(header(3, 12, 16, b"producer-1", b"\x00\x00"))
    for body in bodies_[15:]:
        parse_request_header(body)  # what the first request of each api key does
    pool = MemoryPool(1 << 20)
    state = ConnectionState(pool, ConnectionLimits(), now=0.0)
    state.receive_data(b"".join(struct.pack(">i", len(b)) + b for b in bodies_), 1.0)
    taken = state.take_requests(1.0, _REQUEST_LAYOUT, None)
    assert [r.header.correlation_id for r in taken] == list(range(17))
    assert [r.token for r in taken] == list(range(17))
    assert [r.header for r in taken] == [parse_request_header(b) for b in bodies_]
    assert all(r.dequeued_at == r.local_done_at == r.response_at == -1.0 for r in taken)
    assert pool.used == sum(map(len, bodies_)) and state.in_flight == 17
    assert state.next_request(1.0) is NEED_DATA and state.buffered_bytes == 0
    assert len({id(r.header.client_id) for r in taken}) == 1  # one str for a repeated client id


def test_cut_stops_at_the_count_and_the_byte_budget() -> None:
    bodies_ = [header(3, 1, 40 + i, b"c", b"\xff\xff\xff\xff") for i in range(5)]
    parse_request_header(bodies_[0])
    size = len(bodies_[0])
    data = b"".join(struct.pack(">i", len(b)) + b for b in bodies_)
    requests, pos, used, cids = cut(data, 0, 3, 1 << 20, 1 << 20, FAST_PATH_TABLE, layout(RequestHeader),
                                    _REQUEST_LAYOUT, None, 7, 0.0, None)
    assert [r.token for r in requests] == [7, 8, 9] and pos == 3 * (4 + size) and used == 3 * size
    assert cids == [r.header.correlation_id for r in requests] == [40, 41, 42]
    requests, pos, used, cids = cut(data, pos, 10, 2 * size - 1, 1 << 20, FAST_PATH_TABLE, layout(RequestHeader),
                                    _REQUEST_LAYOUT, None, 10, 0.0, None)
    assert len(requests) == 1 and used == size and cids == [43]
    with pytest.raises(ValueError, match="pos outside"):
        cut(data, len(data) + 1, 1, 1, 1, FAST_PATH_TABLE, layout(RequestHeader), _REQUEST_LAYOUT, None, 0, 0.0, None)


def test_layout_builds_instances_as_the_dataclass_would() -> None:
    make = layout(RequestHeader)
    built = make(3, 12, 5, "c", 2, 17)
    assert built == RequestHeader(3, 12, 5, "c", 2, 17) and hash(built) == hash(RequestHeader(3, 12, 5, "c", 2, 17))
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.api_key = 4  # type: ignore[misc]
    with pytest.raises(TypeError, match="no default"):
        make(3, 12)
    with pytest.raises(TypeError, match="at most 6"):
        make(1, 2, 3, 4, 5, 6, 7)
    request = _REQUEST_LAYOUT("c", built, b"f", 1)
    assert (request.received_at, request.pool_bytes, request.pool, request.response_at) == (0.0, 0, None, -1.0)

    @dataclasses.dataclass
    class NoSlots:
        a: int

    with pytest.raises(TypeError, match="slots"):
        layout(NoSlots)
    with pytest.raises(TypeError, match="not a slot"):
        Layout(RequestHeader, ("nope",), (None,), object())
