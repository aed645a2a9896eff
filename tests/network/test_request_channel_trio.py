"""RequestChannel in-process: real KafkaChannels over memory streams feeding the real queues.

Multiqueue: every request of a connection goes to queue crc32(id) % N, in
order; a full queue stops the connection's reader (backpressure). Baseline:
one shared queue for a handler pool, each connection muted after every request
until its response is written (an in-flight cap of 1, as ``Server`` wires it).
"""

from __future__ import annotations

import zlib
from collections import defaultdict

import pytest
import trio
import trio.testing

from pipeline.network.connection_state import MuteReason
from pipeline.network.memory_pool import MemoryPool
from pipeline.network.request_channel import (MultiQueueRequestChannel, Request, SharedRequestChannel, release_requests,
                                            stable_queue_index)
from pipeline.protocol.header import RequestHeader
from tests.network.trio_harness import request_frame, serving

def test_queue_of_a_connection_is_crc32_of_its_id_not_pythons_salted_hash():
    cid = "127.0.0.1:9092-10.0.0.1:40000-0"
    assert stable_queue_index(cid, 4) == zlib.crc32(cid.encode()) % 4 == 3  # same in every process
    channel = MultiQueueRequestChannel(4, 10)
    assert {channel.queue_index(cid) for _ in range(100)} == {3}


@pytest.mark.trio
async def test_every_request_of_a_connection_goes_to_its_queue_in_order(autojump_clock):
    async with serving(request_channel=MultiQueueRequestChannel(4, 100), handler_count=4) as h:
        clients = []
        while len({stable_queue_index(ch.connection_id, 4) for _, ch in clients}) < 3 or len(clients) < 6:
            clients.append(await h.connect())
        for i in range(5):  # interleaved across connections, one read per request
            for n, (client, _) in enumerate(clients):
                await client.send(request_frame(n * 100 + i))
                await trio.testing.wait_all_tasks_blocked()
        for client, _ in clients:
            await client.wait_responses(5)
        queues_of = defaultdict(set)
        for handler_index, queue_index, item in h.handlers.items:
            assert handler_index == queue_index  # one handler per queue
            for request in item:
                queues_of[request.connection.connection_id].add(queue_index)
        for n, (client, channel) in enumerate(clients):
            assert queues_of[channel.connection_id] == {stable_queue_index(channel.connection_id, 4)}
            assert h.handlers.correlation_ids(channel.connection_id) == [n * 100 + i for i in range(5)]
            assert client.correlation_ids == [n * 100 + i for i in range(5)]
        assert len({q for qs in queues_of.values() for q in qs}) >= 3


@pytest.mark.trio
async def test_full_queue_stops_reading_and_drains_in_order(autojump_clock):
    async with serving(request_channel=MultiQueueRequestChannel(1, 2), handler_count=0) as h:
        a, channel_a = await h.connect()
        b, channel_b = await h.connect()
        for client, cid in ((a, 1), (b, 2), (a, 3), (b, 4)):
            await client.send(request_frame(cid))
            await trio.testing.wait_all_tasks_blocked()
        assert h.request_channel.queue_depths() == [2]  # 1 and 2 queued; 3 and 4 wait to be queued
        await a.send(request_frame(5))
        await trio.testing.wait_all_tasks_blocked()
        assert channel_a.state.in_flight == 2  # 1 and 3: reader blocked on the queue, 5 not read
        assert channel_a.state.buffered_bytes == 0 and not channel_a.muted
        await h.nursery.start(h.handlers.run, 0)  # a handler starts taking requests
        await a.wait_responses(3)
        await b.wait_responses(2)
        assert h.handlers.correlation_ids()[:2] == [1, 2]  # the queue is FIFO
        assert h.handlers.correlation_ids(channel_a.connection_id) == [1, 3, 5]
        assert h.handlers.correlation_ids(channel_b.connection_id) == [2, 4]
        assert (a.correlation_ids, b.correlation_ids) == ([1, 3, 5], [2, 4])
        assert h.request_channel.queue_depths() == [0]


@pytest.mark.trio
async def test_baseline_shared_queue_mutes_each_connection_after_each_request(autojump_clock):
    async with serving(request_channel=SharedRequestChannel(10), handler_count=2, auto_answer=False,
                       max_in_flight=1) as h:
        a, channel_a = await h.connect()
        b, channel_b = await h.connect()
        await a.send(b"".join(request_frame(cid) for cid in (1, 2, 3)))  # coalesced: one read
        await b.send(b"".join(request_frame(cid) for cid in (11, 12, 13)))
        for step in range(3):
            await trio.testing.wait_all_tasks_blocked()
            assert h.handlers.correlation_ids(channel_a.connection_id) == [1, 2, 3][:step + 1]
            assert h.handlers.correlation_ids(channel_b.connection_id) == [11, 12, 13][:step + 1]
            assert channel_a.state.mute_reason is MuteReason.IN_FLIGHT
            assert channel_b.state.mute_reason is MuteReason.IN_FLIGHT
            for request in h.handlers.requests[-2:]:
                h.handlers.answer(request)
            await a.wait_responses(step + 1)
            await b.wait_responses(step + 1)
        assert (a.correlation_ids, b.correlation_ids) == ([1, 2, 3], [11, 12, 13])
        assert all(len(item) == 1 for *_, item in h.handlers.items)  # one request per queue item
        assert {queue for _, queue, _ in h.handlers.items} == {0}
        assert {handler for handler, _, _ in h.handlers.items} == {0, 1}  # the pool shares the queue


def test_release_requests_returns_a_runs_memory_in_one_release_per_pool():
    pools = [MemoryPool(100), MemoryPool(100)]
    wakeups: list[int] = []  # the pool index of each release listener call
    for i, pool in enumerate(pools):
        pool.add_release_listener(lambda i=i: wakeups.append(i))
    header = RequestHeader(0, 9, 1, "c", 2, 10)
    requests = []
    for pool, size in ((pools[0], 30), (pools[1], 5), (pools[0], 20), (None, 0)):
        assert pool is None or pool.try_allocate(size)
        requests.append(Request(None, header, b"x" * size, len(requests), 0.0, size, pool))  # type: ignore[arg-type]
    release_requests(requests)
    assert [p.used for p in pools] == [0, 0] and sorted(wakeups) == [0, 1]
    assert all(r.frame == b"" and r.pool is None and r.local_done_at == -1.0 for r in requests)
    release_requests(requests, 2.5)  # idempotent, as Request.release; the handler's done time set
    assert all(r.local_done_at == 2.5 for r in requests)
    assert [p.used for p in pools] == [0, 0] and sorted(wakeups) == [0, 1]


def _items(channel_id: str, counts: list[int]) -> list[list[Request]]:
    """Queue items of one connection, ``counts[i]`` requests each (no pool, empty frames)."""
    connection = type("Connection", (), {"connection_id": channel_id})()
    header = RequestHeader(0, 9, 1, "c", 2, 10)
    return [[Request(connection, header, b"", k) for k in range(n)] for n in counts]  # type: ignore[arg-type]


@pytest.mark.trio
async def test_senders_waiting_for_a_full_queue_are_admitted_first_come_first_served_one_wake_each():
    """Each take admits the waiting senders that now fit, in arrival order (a large item at the
    head holds back smaller ones behind it: no starvation); a sender that arrives while others
    wait queues behind them; a cancelled waiter gives back its place."""
    channel = MultiQueueRequestChannel(1, 4)
    _, receiver = channel.receiver(0)
    order: list[str] = []

    async def send(name: str, item: list[Request], task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await channel.send_requests(item)
        order.append(name)

    first, big, small, late = (_items(n, [k])[0] for n, k in (("a", 4), ("b", 3), ("c", 1), ("d", 1)))
    assert channel.try_send_requests(first)  # the queue is full (4 of 4)
    async with trio.open_nursery() as nursery:
        await nursery.start(send, "big", big)
        await nursery.start(send, "small", small)
        async with trio.open_nursery() as cancelled:
            cancelled.start_soon(send, "cancelled", _items("e", [1])[0])
            await trio.testing.wait_all_tasks_blocked()
            cancelled.cancel_scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert not channel.try_send_requests(late)  # others wait: it may not jump the line
        await nursery.start(send, "late", late)
        assert order == [] and channel.queue_depths() == [4]
        assert receiver.receive_nowait() is first
        channel.taken(0, 4)  # room for 4: big (3), then small (1); late must wait
        await trio.testing.wait_all_tasks_blocked()
        # Both admitted at this take (trio runs the woken tasks in any order).
        assert sorted(order) == ["big", "small"] and channel.queue_depths() == [4]
        for _ in range(2):
            item = receiver.receive_nowait()
            assert item is big or item is small
            channel.taken(0, len(item))
        await trio.testing.wait_all_tasks_blocked()
        assert order[2:] == ["late"] and receiver.receive_nowait() is late
