"""Processor in-process: connection timeouts enforced by its reaper, and a malformed frame closing one connection only.

Connections are trio memory streams handed to a real Processor (with the real
KafkaChannel, RequestChannel and MemoryPool); the clock is pytest-trio's
autojump_clock, so a 30 s timeout costs no real time. The reaper checks every
``REAP_INTERVAL_S``, which bounds how late a timeout may fire.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from pipeline.network.channel import CLOSE_LINGER_S
from pipeline.network.connection_state import MuteReason
from pipeline.network.processor import REAP_INTERVAL_S
from tests.network.trio_harness import request_frame, serving

pytestmark = pytest.mark.trio

EPS = 1e-9
"""Float slack on virtual times (``t + d - t`` may come out below ``d``)."""
LATE = REAP_INTERVAL_S + 0.02
"""How late after its deadline the reaper may close a connection (s); 0.02: the harness's polling."""


async def test_client_not_reading_is_muted_for_backlog_then_closed_after_send_timeout(autojump_clock):
    async with serving(response_buffer_max_bytes=1, send_timeout_ms=5000) as h:
        client, channel = await h.connect(lockstep_responses=True, read=False)
        await client.send(request_frame(1))
        await trio.testing.wait_all_tasks_blocked()
        started = trio.current_time()  # response 1 is being written, and the client takes none of it
        assert channel.state.unsent_bytes == 4 + 6
        await client.send(request_frame(2))
        await trio.testing.wait_all_tasks_blocked()
        assert channel.muted and channel.state.mute_reason is MuteReason.RESPONSE_BACKLOG
        assert h.handlers.correlation_ids() == [1]  # request 2 is not dispatched
        assert h.pool.used == 0  # and no memory was taken for it while muted
        await h.wait_closed(channel)
        assert 5.0 - EPS <= trio.current_time() - started <= 5.0 + LATE  # send timeout + reaper interval
        assert "did not read its responses for 5000 ms" in channel.close_reason
        assert h.pool.available == h.pool.capacity
        assert h.quotas.open == 0
        # What the client finds when it reads at last: the bytes of the write
        # that was under way (as a kernel send buffer would still deliver
        # them), then EOF; request 2 was never handled nor answered.
        await client.run()
        assert client.correlation_ids == [1] and client.eof


async def test_sender_stalled_inside_a_frame_is_closed_and_its_partial_allocation_returned(autojump_clock):
    async with serving(receive_timeout_ms=3000) as h:
        client, channel = await h.connect()
        await client.send(request_frame(1))
        await client.wait_responses(1)
        partial = request_frame(2)
        await client.send(partial[:10])  # size prefix + 6 body bytes, then nothing
        started = trio.current_time()
        await trio.testing.wait_all_tasks_blocked()
        assert h.pool.used == len(partial) - 4  # allocated at the size, held by the channel
        await h.wait_closed(channel)
        assert 3.0 - EPS <= trio.current_time() - started <= 3.0 + LATE
        assert "request frame not completed within 3000 ms" in channel.close_reason
        assert h.pool.available == h.pool.capacity
        await client.wait_until(lambda: client.eof)
        assert client.correlation_ids == [1]


async def test_idle_connections_are_reaped_only_when_nothing_is_owed(autojump_clock):
    async with serving(idle_timeout_ms=10_000, auto_answer=False) as h:
        idle, idle_channel = await h.connect()
        busy, busy_channel = await h.connect()
        await idle.send(request_frame(1))
        await busy.send(request_frame(2))
        r1, r2 = await h.handlers.wait_requests(2)
        h.handlers.answer(r1)
        await idle.wait_responses(1)
        answered = trio.current_time()
        await h.wait_closed(idle_channel)
        assert 10.0 - EPS <= trio.current_time() - answered <= 10.0 + LATE
        assert "idle for 10000 ms" in idle_channel.close_reason
        await trio.sleep(30)  # a response is owed: never idle, however long the handler takes
        assert busy_channel in h.processor.channels and busy_channel.close_reason is None
        h.handlers.answer(r2)
        await busy.wait_responses(1)
        answered = trio.current_time()
        await h.wait_closed(busy_channel)
        assert 10.0 - EPS <= trio.current_time() - answered <= 10.0 + LATE
        assert h.quotas.open == 0 and h.pool.available == h.pool.capacity


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (b"\xff\xff\xff\xfe", "invalid receive"),                     # negative size
        ((1001).to_bytes(4, "big") + b"x" * 50, "invalid receive"),     # over max_receive_bytes (1000)
        ((2).to_bytes(4, "big") + b"\x00\x12", "invalid request"),      # header cut short
    ],
    ids=["negative-size", "oversize", "truncated-header"],
)
async def test_malformed_frame_closes_only_its_connection(autojump_clock, bad, reason):
    async with serving(auto_answer=False, max_receive_bytes=1000) as h:
        good, good_channel = await h.connect()
        evil, evil_channel = await h.connect()
        await good.send(request_frame(1))
        await evil.send(request_frame(7) + bad)  # one good request, then the malformed frame
        await trio.testing.wait_all_tasks_blocked()
        assert h.handlers.correlation_ids(evil_channel.connection_id) == [7]
        assert reason in evil_channel.close_reason
        # reading stopped, but the request accepted before is still answered
        assert evil_channel in h.processor.channels
        answered = trio.current_time()
        for request in list(h.handlers.requests):
            h.handlers.answer(request)
        await evil.wait_until(lambda: evil.eof)
        assert evil.correlation_ids == [7]
        assert trio.current_time() - answered < 0.1  # FIN once answered, no drain or timeout wait
        await h.wait_closed(evil_channel)  # lingering close: the peer's unread bytes are drained, bounded
        assert trio.current_time() - answered <= CLOSE_LINGER_S + 0.1
        # the other connection, on the same Processor and request queue, is still served
        await good.send(request_frame(2) + request_frame(3))
        await h.handlers.wait_requests(4)
        for request in h.handlers.requests[2:]:
            h.handlers.answer(request)
        await good.wait_responses(3)
        assert good.correlation_ids == [1, 2, 3]
        assert good_channel.close_reason is None and good_channel in h.processor.channels
        assert h.pool.available == h.pool.capacity


async def test_stop_reading_answers_what_is_in_flight_then_closes(autojump_clock):
    async with serving(auto_answer=False) as h:
        client, channel = await h.connect()
        await client.send(request_frame(1))
        (first,) = await h.handlers.wait_requests(1)
        h.processor.stop_reading()  # server shutdown, first stage
        await client.send(request_frame(2))
        await trio.testing.wait_all_tasks_blocked()
        assert h.handlers.correlation_ids() == [1]  # nothing more is read
        assert channel in h.processor.channels  # but the connection stays for its response
        with pytest.raises(trio.ClosedResourceError):
            await h.processor.accept(None, "10.0.0.2")  # type: ignore[arg-type]
        h.handlers.answer(first)
        await client.wait_until(lambda: client.eof)
        assert client.correlation_ids == [1]
        await h.wait_closed(channel)
        assert h.quotas.open == 0 and h.pool.available == h.pool.capacity
