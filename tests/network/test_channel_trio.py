"""KafkaChannel in-process: the trio reader/writer over memory streams, the real RequestChannel and MemoryPool.

The sans-I/O rules are tested in test_connection_state.py; these tests check
that the trio layer acts on them: it dispatches what the state hands out,
stops reading when the state says PAUSED and resumes on the right wake-up,
and writes responses in request order. Virtual time (autojump_clock).
"""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from pipeline.network.connection_state import MuteReason
from tests.network.trio_harness import echo_payload, request_frame, serving

pytestmark = pytest.mark.trio


async def test_frames_split_across_chunks_and_coalesced_are_dispatched_in_order(autojump_clock):
    async with serving() as h:
        client, channel = await h.connect()
        data = b"".join(request_frame(cid) for cid in range(20))
        rng = random.Random(8)
        cuts = sorted(rng.sample(range(1, len(data)), 60))
        # A one-byte prefix, many small cuts (some inside a size prefix), and
        # the tail coalesced: frames 12-19 arrive in a single read.
        tail_start = sum(len(request_frame(cid)) for cid in range(12))
        cuts = [1] + [c for c in cuts if 1 < c < tail_start] + [tail_start]
        chunks = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
        assert len(chunks) > 20 and min(map(len, chunks)) >= 1
        for chunk in chunks:
            await client.send(chunk)
            await trio.testing.wait_all_tasks_blocked()  # the channel reads each chunk on its own
        await client.wait_responses(20)
        assert h.handlers.correlation_ids() == list(range(20))
        assert client.correlation_ids == list(range(20))
        assert all(body == b"ok" for _, body in client.responses)
        # the last read cut 8 requests at once: one queue item (multiqueue batches a read)
        assert [len(item) for *_, item in h.handlers.items][-1] == 8
        assert h.pool.available == h.pool.capacity
        assert not channel.muted


async def test_responses_go_back_in_request_order_when_completed_out_of_order(autojump_clock):
    async with serving(auto_answer=False) as h:
        client, channel = await h.connect()
        await client.send(b"".join(request_frame(cid) for cid in (10, 11, 12, 13)))
        first, second, third, fourth = await h.handlers.wait_requests(4)
        h.handlers.answer(fourth)
        h.handlers.answer(second)
        h.handlers.answer(third)
        await trio.testing.wait_all_tasks_blocked()
        assert client.responses == []  # all held back behind request 10
        assert channel.state.in_flight == 4 and channel.state.unsent_bytes == 3 * (4 + 6)
        h.handlers.answer(first)
        await client.wait_responses(4)
        assert client.correlation_ids == [10, 11, 12, 13]
        # an acks=0-style slot (no response) in the middle frees its turn without a frame
        await client.send(request_frame(20) + request_frame(21) + request_frame(22))
        r20, r21, r22 = (await h.handlers.wait_requests(7))[4:]
        h.handlers.answer(r22)
        h.handlers.answer(r21, None)
        await trio.testing.wait_all_tasks_blocked()
        assert len(client.responses) == 4
        h.handlers.answer(r20)
        await client.wait_responses(6)
        assert client.correlation_ids[4:] == [20, 22]
        await trio.testing.wait_all_tasks_blocked()
        assert channel.state.in_flight == 0


async def test_in_flight_cap_stops_reading_until_a_response_is_sent(autojump_clock):
    async with serving(auto_answer=False, max_in_flight=2) as h:
        client, channel = await h.connect()
        await client.send(b"".join(request_frame(cid) for cid in (1, 2, 3, 4)))
        await trio.testing.wait_all_tasks_blocked()
        assert h.handlers.correlation_ids() == [1, 2]  # the 3rd is read but not dispatched
        assert channel.muted and channel.state.mute_reason is MuteReason.IN_FLIGHT
        await trio.sleep(5)  # time alone does not unmute it
        assert h.handlers.correlation_ids() == [1, 2]
        first, second = h.handlers.requests
        h.handlers.answer(second)  # completed, but not sendable: 1 still owed first
        await trio.testing.wait_all_tasks_blocked()
        assert h.handlers.correlation_ids() == [1, 2] and channel.muted
        h.handlers.answer(first)  # both sent: two slots free
        await client.wait_responses(2)
        await trio.testing.wait_all_tasks_blocked()
        assert h.handlers.correlation_ids() == [1, 2, 3, 4]
        assert channel.state.mute_reason is MuteReason.IN_FLIGHT  # full again, with 3 and 4
        for request in h.handlers.requests[2:]:
            h.handlers.answer(request)
        await client.wait_responses(4)
        assert client.correlation_ids == [1, 2, 3, 4]


async def test_memory_mute_waits_for_the_first_request_to_release_then_proceeds(autojump_clock):
    size = len(request_frame(0)) - 4
    async with serving(auto_answer=False, pool_bytes=size + size // 2) as h:
        client, channel = await h.connect()
        await client.send(request_frame(1) + request_frame(2))
        await trio.testing.wait_all_tasks_blocked()
        assert h.handlers.correlation_ids() == [1]
        assert channel.state.mute_reason is MuteReason.MEMORY
        assert h.pool.available == size // 2
        (first,) = h.handlers.requests
        first.connection.complete(first.token, echo_payload(first))  # answered but frame still held
        await client.wait_responses(1)
        await trio.testing.wait_all_tasks_blocked()
        assert h.handlers.correlation_ids() == [1] and channel.state.mute_reason is MuteReason.MEMORY
        first.release()  # the pool's release listener wakes the muted reader
        await trio.testing.wait_all_tasks_blocked()
        assert h.handlers.correlation_ids() == [1, 2] and not channel.muted
        h.handlers.answer(h.handlers.requests[1])
        await client.wait_responses(2)
        assert client.correlation_ids == [1, 2]
        assert h.pool.available == h.pool.capacity


async def test_memory_held_by_one_connection_mutes_another_until_released(autojump_clock):
    size = len(request_frame(0)) - 4
    async with serving(auto_answer=False, pool_bytes=size, receive_timeout_ms=3000) as h:
        a, channel_a = await h.connect()
        b, channel_b = await h.connect()
        await a.send(request_frame(1))
        await trio.testing.wait_all_tasks_blocked()
        await b.send(request_frame(2))
        await trio.testing.wait_all_tasks_blocked()
        assert h.handlers.correlation_ids() == [1]
        assert channel_b.state.mute_reason is MuteReason.MEMORY and not channel_a.muted
        await trio.sleep(10)  # > receive_timeout_ms: time muted is not the sender's
        assert h.handlers.correlation_ids() == [1]
        assert channel_b in h.processor.channels
        h.handlers.answer(h.handlers.requests[0])
        await trio.testing.wait_all_tasks_blocked()
        assert h.handlers.correlation_ids(channel_b.connection_id) == [2]
        h.handlers.answer(h.handlers.requests[1])
        await a.wait_responses(1)
        await b.wait_responses(1)
        assert (a.correlation_ids, b.correlation_ids) == ([1], [2])
        assert h.pool.available == h.pool.capacity
