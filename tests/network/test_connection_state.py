"""ConnectionState: the per-connection rules as plain function calls (bytes and times in, events out)."""

from __future__ import annotations

import pytest

from pipeline.network.connection_state import (
    NEED_DATA,
    PAUSED,
    ConnectionLimits,
    ConnectionState,
    MuteReason,
    ReceivedFrame,
)
from pipeline.network.framing import InvalidReceiveError, encode_frame
from pipeline.network.memory_pool import MemoryPool
from pipeline.protocol.errors import InvalidRequestError
from tests.e2e import raw_client as rc


def request(correlation_id: int, topic: str = "t") -> bytes:
    """A whole framed Metadata request (size prefix included)."""
    return rc.frame(rc.metadata(topic), correlation_id)


def make(pool_bytes: int = 1 << 20, **limits) -> tuple[ConnectionState, MemoryPool]:
    pool = MemoryPool(pool_bytes)
    return ConnectionState(pool, ConnectionLimits(**limits), now=0.0), pool


def drain(state: ConnectionState, now: float = 0.0) -> tuple[list[ReceivedFrame], object]:
    frames = []
    while isinstance(event := state.next_request(now), ReceivedFrame):
        frames.append(event)
    return frames, event


def test_coalesced_requests_come_out_in_order_with_their_memory():
    state, pool = make()
    data = request(1) + request(2) + request(3)
    state.receive_data(data, 0.0)
    frames, event = drain(state)
    assert [f.header.correlation_id for f in frames] == [1, 2, 3]
    assert event is NEED_DATA
    assert sum(f.pool_bytes for f in frames) == len(data) - 3 * 4
    assert pool.used == len(data) - 12
    for f in frames:
        pool.release(f.pool_bytes)
    assert pool.available == pool.capacity


def test_split_request_allocates_at_size_and_waits_for_the_body():
    state, pool = make()
    data = request(7)
    state.receive_data(data[:6], 0.0)
    assert state.next_request(0.0) is NEED_DATA
    assert pool.used == len(data) - 4  # allocated once the size was read (Kafka NetworkReceive)
    state.receive_data(data[6:], 0.1)
    frames, event = drain(state, 0.1)
    assert [f.header.correlation_id for f in frames] == [7] and event is NEED_DATA
    assert pool.used == len(data) - 4  # still held: the handler releases it


def test_pool_that_cannot_serve_mutes_until_memory_returns():
    size = len(request(1)) - 4
    state, pool = make(pool_bytes=size + size // 2)
    state.receive_data(request(1) + request(2), 0.0)
    frames, event = drain(state)
    assert len(frames) == 1 and event is PAUSED
    assert state.mute_reason is MuteReason.MEMORY
    pool.release(frames[0].pool_bytes)
    frames, event = drain(state, 1.0)
    assert [f.header.correlation_id for f in frames] == [2]
    assert state.mute_reason is None


def test_frame_larger_than_the_whole_pool_is_refused():
    state, pool = make(pool_bytes=1000)
    state.receive_data((5000).to_bytes(4, "big") + b"x" * 10, 0.0)
    with pytest.raises(InvalidReceiveError, match="queued.max.request.bytes 1000"):
        state.next_request(0.0)
    assert pool.used == 0


@pytest.mark.parametrize("size", [-1, -(2**31), 2001])
def test_negative_and_oversize_frames_are_refused(size):
    state, _ = make(max_receive_bytes=2000)
    state.receive_data(size.to_bytes(4, "big", signed=True), 0.0)
    with pytest.raises(InvalidReceiveError):
        state.next_request(0.0)


def test_header_truncated_inside_the_client_id_is_an_invalid_request_and_returns_memory():
    state, pool = make()
    # api key 3, version 9, correlation id 1, client id claims 20 bytes, 3 follow
    body = (3).to_bytes(2, "big") + (9).to_bytes(2, "big") + (1).to_bytes(4, "big") + (20).to_bytes(2, "big") + b"abc"
    state.receive_data(encode_frame(body), 0.0)
    with pytest.raises(InvalidRequestError):
        state.next_request(0.0)
    assert pool.used == 0


def test_in_flight_cap_pauses_reading_until_a_response_is_sent():
    state, _ = make(max_in_flight=2)
    state.receive_data(request(1) + request(2) + request(3), 0.0)
    frames, event = drain(state)
    assert [f.header.correlation_id for f in frames] == [1, 2]
    assert event is PAUSED and state.mute_reason is MuteReason.IN_FLIGHT
    state.complete(frames[1].token, b"second")  # out of order: not sendable yet
    assert state.data_to_send(0.0) is None
    assert state.next_request(0.0) is PAUSED
    state.complete(frames[0].token, b"first")
    data = state.data_to_send(0.0)
    assert data == encode_frame(b"first") + encode_frame(b"second")
    assert state.next_request(0.0) is PAUSED  # written, not yet sent: still in flight
    state.send_done(0.0)
    frames, _ = drain(state)
    assert [f.header.correlation_id for f in frames] == [3]


def test_responses_without_payload_free_their_slot_at_their_turn():
    state, _ = make(max_in_flight=1)
    state.receive_data(request(1) + request(2), 0.0)
    (first,), event = drain(state)
    assert event is PAUSED
    state.complete(first.token, None)  # acks=0
    assert state.data_to_send(0.0) == b""
    assert state.in_flight == 0
    frames, _ = drain(state)
    assert [f.header.correlation_id for f in frames] == [2]


def test_response_backlog_pauses_reading():
    state, _ = make(response_buffer_max_bytes=100, max_in_flight=64)
    state.receive_data(request(1), 0.0)
    (first,), _ = drain(state)
    state.complete(first.token, b"x" * 200)
    assert state.unsent_bytes == 204
    state.receive_data(request(2), 0.0)
    frames, event = drain(state)
    assert frames == [] and event is PAUSED
    assert state.mute_reason is MuteReason.RESPONSE_BACKLOG
    state.data_to_send(0.0)
    state.send_done(0.0)
    assert state.unsent_bytes == 0
    assert [f.header.correlation_id for f in drain(state)[0]] == [2]


def test_stalled_sender_times_out_but_not_while_muted():
    size = len(request(1)) - 4
    state, pool = make(pool_bytes=size, receive_timeout_ms=1000, idle_timeout_ms=60_000)
    other = ConnectionState(pool, ConnectionLimits(receive_timeout_ms=1000), now=0.0)
    data = request(1)
    state.receive_data(data[:10], 0.0)
    assert state.next_request(0.0) is NEED_DATA  # holds the whole pool now
    other.receive_data(request(2)[:10], 0.0)
    assert other.next_request(0.0) is PAUSED and other.mute_reason is MuteReason.MEMORY
    assert state.timeout_reason(0.9) is None
    reason = state.timeout_reason(1.0)
    assert reason is not None and "not completed within 1000 ms" in reason
    assert other.timeout_reason(5.0) is None  # muted for memory: not its fault
    state.close()
    assert pool.used == 0
    assert not isinstance(other.next_request(5.0), ReceivedFrame)  # allocated now, body still missing
    assert other.mute_reason is None
    assert other.timeout_reason(5.9) is None  # its clock restarted when reading resumed
    assert other.timeout_reason(6.0) is not None


def test_one_byte_at_a_time_within_the_timeout_is_served():
    state, _ = make(receive_timeout_ms=10_000)
    data = request(5)
    now = 0.0
    for i in range(len(data)):
        state.receive_data(data[i:i + 1], now)
        assert state.timeout_reason(now) is None
        now += 0.01
    frames, _ = drain(state, now)
    assert [f.header.correlation_id for f in frames] == [5]


def test_client_that_does_not_read_times_out():
    state, _ = make(send_timeout_ms=2000)
    state.receive_data(request(1), 0.0)
    (frame,), _ = drain(state)
    state.complete(frame.token, b"response")
    assert state.data_to_send(1.0)
    assert state.timeout_reason(2.9) is None
    reason = state.timeout_reason(3.0)
    assert reason is not None and "did not read its responses" in reason


def test_idle_connection_times_out_only_when_nothing_is_owed():
    state, _ = make(idle_timeout_ms=600_000)
    assert state.timeout_reason(599.0) is None
    assert "connections.max.idle.ms" in state.timeout_reason(600.0)
    busy, _ = make(idle_timeout_ms=1000, receive_timeout_ms=10**9)
    busy.receive_data(request(1), 0.0)
    drain(busy)
    assert busy.timeout_reason(50.0) is None  # a request is in flight (persistence may be slow)


def test_close_returns_the_allocation_of_a_partial_frame_once():
    state, pool = make()
    state.receive_data(request(1)[:8], 0.0)
    state.next_request(0.0)
    assert pool.used > 0
    state.close()
    state.close()
    assert pool.used == 0


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="max_in_flight"):
        ConnectionLimits(max_in_flight=0)


def _handshake(correlation_id: int, version: int) -> bytes:
    from kio.index import load_request_schema

    return rc.frame(load_request_schema(17, version)(mechanism="PLAIN"), correlation_id)


def _answer(state: ConnectionState, frame: ReceivedFrame, payload: bytes, now: float = 0.0) -> bytes:
    state.complete(frame.token, payload)
    data = state.data_to_send(now)
    assert data is not None
    state.send_done(now)
    return data


def test_after_a_sasl_handshake_v0_the_next_frames_are_raw_tokens_read_one_at_a_time():
    """KIP-43: what follows a SaslHandshake v0 depends on its answer, so reading pauses until
    it is written; the handler switches the mode before answering (Kafka SaslServerAuthenticator)."""
    from pipeline.protocol.header import RAW_SASL_TOKEN

    state, pool = make()
    # A client that pipelines its token behind the handshake, then a request behind the token.
    state.receive_data(_handshake(1, 0) + encode_frame(b"\0alice\0pw") + request(2), 0.0)
    frames, event = drain(state)
    assert [(f.header.api_key, f.header.api_version) for f in frames] == [(17, 0)]
    assert event is PAUSED and state.mute_reason is MuteReason.SASL
    state.raw_sasl_tokens = True  # the SASL handler: the handshake succeeded
    assert drain(state)[1] is PAUSED  # still unanswered on the wire
    _answer(state, frames[0], b"handshake answer")
    frames, event = drain(state)
    assert [f.header for f in frames] == [RAW_SASL_TOKEN] and bytes(frames[0].frame) == b"\0alice\0pw"
    assert event is PAUSED and state.mute_reason is MuteReason.SASL
    state.raw_sasl_tokens = False  # authentication complete: requests follow
    assert _answer(state, frames[0], b"") == b"\0\0\0\0"  # an empty token is still a frame
    frames, event = drain(state)
    assert [f.header.correlation_id for f in frames] == [2] and event is NEED_DATA
    pool.release(frames[0].pool_bytes)


def test_a_sasl_handshake_v1_does_not_pause_reading():
    state, _pool = make()
    state.receive_data(_handshake(1, 1) + request(2), 0.0)
    frames, event = drain(state)
    assert [f.header.correlation_id for f in frames] == [1, 2] and event is NEED_DATA
