"""Stage accounting through the server's own middle, in-process: KafkaChannel, RequestChannel,
RequestHandler/KafkaApis and BatchingPersister over memory streams, time from pytest-trio's autojump clock.

Wired as ``Server.serve`` wires it (KafkaApis counts errors into the
RequestChannel's metrics); the table side is ``MemorySink``, whose writes can
be held to play a slow Spark, so the remote stage has a known length.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from pipeline.network.channel import MemoryWaiters
from pipeline.network.memory_pool import MemoryPool
from pipeline.persist.accumulator import FlushPolicy
from pipeline.persist.persister import BatchingPersister
from pipeline.log.checkpoint import Checkpoint, StateStore
from pipeline.log.wal import WriteAheadLog
from pipeline.protocol.apis import BrokerInfo
from pipeline.requests.catalog import TopicCatalog
from pipeline.network.request_channel import MultiQueueRequestChannel
from pipeline.requests.handler import KafkaApis, RequestHandler
from pipeline.network.request_metrics import BUCKET_BOUNDS_MS, STAGES
from pipeline.log.manager import LogManager
from tests.e2e import raw_client as rc
from tests.requests.test_handler_trio import Broker, MemorySink, eventually, partition_result, produce

pytestmark = pytest.mark.trio

PRODUCE, API_VERSIONS = 0, 18
QUEUE, LOCAL, REMOTE, RESPONSE_QUEUE, SEND, TOTAL = range(6)
UNKNOWN_TOPIC_OR_PARTITION = 3


@asynccontextmanager
async def serving(tmp_path, *, ack_on: str) -> AsyncIterator[tuple[Broker, list[RequestHandler]]]:
    sink = MemorySink()
    wal = WriteAheadLog(tmp_path / "wal", fsync=False)
    wal.open()
    persister = BatchingPersister(sink, wal, StateStore(tmp_path / "state"), Checkpoint(),
                                  FlushPolicy(linger_ms=0), ack_on=ack_on)  # type: ignore[arg-type]
    request_channel = MultiQueueRequestChannel(2, 100)
    apis = KafkaApis(BrokerInfo(0, "127.0.0.1", 9092, "test"), TopicCatalog(initial={"t": 2}),
                     LogManager(), persister, first_producer_id=1000,
                     request_metrics=request_channel.metrics)
    handlers = [RequestHandler(i, apis, request_channel) for i in range(2)]
    pool = MemoryPool(16 << 20)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(persister.run)
            await nursery.start(apis.run_timeouts)
            for h in handlers:
                await nursery.start(h.run)
            try:
                yield Broker(nursery, sink, persister, apis, request_channel, pool, MemoryWaiters(pool)), handlers
            finally:
                sink.resume()
            nursery.cancel_scope.cancel()
    finally:
        wal.close()


def histogram_count(buckets: list[int]) -> int:
    return sum(buckets)


def bucket_of(ms: float) -> int:
    return next((i for i, bound in enumerate(BUCKET_BOUNDS_MS) if ms <= bound), len(BUCKET_BOUNDS_MS))


async def test_remote_time_is_the_wait_for_durability_and_stages_add_up_to_the_total(autojump_clock, tmp_path):
    async with serving(tmp_path, ack_on="spark") as (b, _):
        client, _ = await b.connect()
        b.sink.hold()
        sent = trio.current_time()
        await client.send(produce(1, [b"a", b"b"]))
        await eventually(lambda: b.sink.writes_started == 1)
        await trio.sleep(30)  # Spark stalled for 30 s: the produce waits, durable only after the commit
        b.sink.resume()
        await client.wait_responses(1)
        assert partition_result(client.responses[0][1]) == (0, 0)
        await eventually(lambda: PRODUCE in b.request_channel.metrics.apis)
        api = b.request_channel.metrics.apis[PRODUCE]
        assert api.requests == {9: 1}
        assert [histogram_count(s) for s in api.buckets] == [1] * len(STAGES)
        # 30 s of the stall at least (the autojump clock also moves on while
        # worker threads run, so not at most), and it is in its bucket
        remote = api.sums_ms[REMOTE]
        assert remote >= 30_000
        assert api.buckets[REMOTE][bucket_of(remote)] == 1
        # the stages tile the request's life: their sum is the total, inside the client's round trip
        assert api.sums_ms[TOTAL] == pytest.approx(sum(api.sums_ms[:TOTAL]))
        assert remote <= api.sums_ms[TOTAL] <= (client.arrived_at[0] - sent) * 1000 + 1e-6
        assert api.errors == {0: 1}


async def test_requests_answered_by_the_handler_have_no_remote_time(autojump_clock, tmp_path):
    async with serving(tmp_path, ack_on="wal") as (b, _):
        client, _ = await b.connect()
        await client.send(rc.frame(rc.api_versions(), 1))
        await client.wait_responses(1)
        await eventually(lambda: API_VERSIONS in b.request_channel.metrics.apis)
        api = b.request_channel.metrics.apis[API_VERSIONS]
        assert api.requests == {3: 1}
        assert api.sums_ms[REMOTE] == 0.0
        assert api.errors == {0: 1}


async def test_errors_are_counted_per_partition_and_acks_zero_is_counted_when_its_turn_comes(autojump_clock,
                                                                                               tmp_path):
    async with serving(tmp_path, ack_on="wal") as (b, _):
        client, _ = await b.connect()
        await client.send(produce(1, [b"x"], partition=5)       # topic t has partitions 0 and 1
                          + produce(2, [b"y"], acks=0)
                          + produce(3, [b"z1", b"z2"], partition=1))
        await client.wait_responses(2)
        assert partition_result(client.responses[0][1])[0] == UNKNOWN_TOPIC_OR_PARTITION
        await eventually(lambda: sum(b.request_channel.metrics.apis[PRODUCE].requests.values()) == 3)
        api = b.request_channel.metrics.apis[PRODUCE]
        # The acks=0 success answers nothing, so it adds no error count (Kafka's NoOpResponse)
        assert api.errors == {UNKNOWN_TOPIC_OR_PARTITION: 1, 0: 1}
        assert b.apis.stats.messages_in == {"t": 3}
        assert b.apis.stats.bytes_in == {"t": len(rc.record_batch([b"y"])) + len(rc.record_batch([b"z1", b"z2"]))}


async def test_handler_idle_time_grows_while_its_queue_is_empty(autojump_clock, tmp_path):
    async with serving(tmp_path, ack_on="wal") as (_, handlers):
        await trio.sleep(0)  # the handlers are waiting for their queues
        before = [h.idle_seconds for h in handlers]
        time.sleep(0.02)  # wall time: idle is measured on time.perf_counter
        after = [h.idle_seconds for h in handlers]
        assert all(a - b >= 0.02 for a, b in zip(after, before))
