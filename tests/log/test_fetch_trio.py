"""Fetch and ListOffsets in-process: produce through the real request path, fetch it back.

The server's middle as ``Server.serve`` wires it (KafkaChannel over memory
streams, MultiQueueRequestChannel, RequestHandlers, BatchingPersister with a
real WriteAheadLog, LogManager, FetchApis); the table side is the in-memory
``MemorySink`` of tests/requests/test_handler_trio.py, and ``MemoryTable``
serves reads from its rows the way ``pipeline.table.reader.TableReader``
serves them from Spark. Time is pytest-trio's autojump_clock.
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import trio
import trio.testing
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.fetch.v11.response import FetchResponse
from kio.schema.list_offsets.v5.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.schema.list_offsets.v5.response import ListOffsetsResponse
from kio.serial import entity_reader
from kio.static.primitive import i8, i32, i64

from pipeline.log.fetch import FetchApis
from pipeline.log.manager import RETENTION_CHECK_INTERVAL_S, LogManager
from pipeline.log.state import LogState
from pipeline.network.channel import MemoryWaiters
from pipeline.network.memory_pool import MemoryPool
from pipeline.persist.accumulator import FlushPolicy
from pipeline.persist.persister import BatchingPersister
from pipeline.persist.recovery import recover
from pipeline.log.checkpoint import Checkpoint, StateStore
from pipeline.log.wal import WriteAheadLog
from pipeline.protocol.apis import BrokerInfo
from pipeline.requests.catalog import TopicCatalog
from pipeline.network.request_channel import MultiQueueRequestChannel
from pipeline.requests.handler import KafkaApis, RequestHandler
from pipeline.server import wall_clock_ms
from tests.e2e import raw_client as rc
from tests.requests.test_handler_trio import Broker, MemorySink, eventually, partition_result, produce

pytestmark = pytest.mark.trio

OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION = 1, 3
FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT = 74, 75, 6, 7


class MemoryTable:
    """Reads of the MemorySink's rows as RecordBatch v2, as TableReader does from Spark."""

    def __init__(self, sink: MemorySink) -> None:
        self.sink = sink
        self.reads = 0

    def _rows(self, topic: str, partition: int) -> list[dict]:
        rows = [r for t in self.sink.tables for r in t.to_pylist()
                if r["topic"] == topic and r["partition"] == partition]
        return sorted(rows, key=lambda r: r["offset"])

    def read(self, topic: str, partition: int, offset: int, max_bytes: int, *, end: int, min_one: bool = True):
        self.reads += 1
        rows = [r for r in self._rows(topic, partition) if offset <= r["offset"] < end]
        next_offset = end if not rows else offset  # nothing held in [offset, end): end (TableSlice)
        if not min_one and sum(len(r["value"]) for r in rows) > max_bytes:
            rows = []
        data = b""
        if rows:
            builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                                producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
            base = rows[0]["offset"]
            for r in rows:
                ts = int(r["timestamp"].timestamp() * 1000)
                builder.append(r["offset"] - base, timestamp=ts, key=r["key"], value=r["value"], headers=[])
            out = bytearray(builder.build())
            out[:8] = base.to_bytes(8, "big")
            data = bytes(out)
            next_offset = rows[-1]["offset"] + 1

        @dataclass
        class Slice:
            records: bytes
            next_offset: int
        return Slice(data, next_offset)

    def offset_for_timestamp(self, topic, partition, timestamp_ms, end=None):
        for r in self._rows(topic, partition):
            if end is not None and r["offset"] >= end:
                break
            if int(r["timestamp"].timestamp() * 1000) >= timestamp_ms:
                return r["offset"], int(r["timestamp"].timestamp() * 1000)
        return None

    def max_timestamp(self, topic, partition, end=None):
        rows = [r for r in self._rows(topic, partition) if end is None or r["offset"] < end]
        if not rows:
            return None
        r = max(rows, key=lambda r: r["timestamp"])
        return r["offset"], int(r["timestamp"].timestamp() * 1000)


@dataclass
class ReadBroker(Broker):
    logs: LogManager = None  # type: ignore[assignment]
    fetch: FetchApis = None  # type: ignore[assignment]


@asynccontextmanager
async def broker(tmp_path, *, ack_on: str = "wal", segment_bytes: int = 64 << 20,
                 retention: tuple[int, int] = (-1, -1), sink: MemorySink | None = None,
                 commit_linger_ms: float = 0, cluster=None) -> AsyncIterator[ReadBroker]:
    sink = sink or MemorySink()
    wal = WriteAheadLog(tmp_path / "wal", segment_bytes=segment_bytes, fsync=False)
    store = StateStore(tmp_path / "state")
    logs = LogManager(wal=wal, table=MemoryTable(sink), retention=lambda topic: retention)
    if (tmp_path / "state" / "checkpoint.json").exists():
        checkpoint = recover(sink, wal, store, visit=logs.index_wal_entry).checkpoint
    else:
        wal.open(None, logs.index_wal_entry)
        checkpoint = Checkpoint()
    logs.start(LogState.from_checkpoint(checkpoint), checkpoint.end_offsets)
    persister = BatchingPersister(sink, wal, store, checkpoint, FlushPolicy(linger_ms=commit_linger_ms), ack_on=ack_on,  # type: ignore[arg-type]
                                  log_listener=logs)
    request_channel = MultiQueueRequestChannel(2, 100)
    apis = KafkaApis(BrokerInfo(0, "127.0.0.1", 9092, "test", cluster=cluster), TopicCatalog(initial={"t": 2}),
                     logs, persister,
                     first_producer_id=1000, request_metrics=request_channel.metrics)
    fetch = FetchApis(logs, apis.catalog, request_channel.metrics)
    fetch.register(apis)
    pool = MemoryPool(16 << 20)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(persister.run)
            await nursery.start(apis.run_timeouts)
            await nursery.start(logs.run, wall_clock_ms)
            await nursery.start(fetch.run)
            for i in range(2):
                await nursery.start(RequestHandler(i, apis, request_channel).run)
            try:
                yield ReadBroker(nursery, sink, persister, apis, request_channel, pool, MemoryWaiters(pool),
                                 logs, fetch)
            finally:
                sink.resume()
            nursery.cancel_scope.cancel()
    finally:
        wal.close()


def waited(elapsed: float, wait_s: float, slack_s: float = 0.1) -> bool:
    """``elapsed`` (s, differences of trio times) is the ``wait_s`` a request was held, within
    ``slack_s``: held at least ``wait_s`` up to float rounding (0.7 - 0.2 < 0.5), not much longer."""
    return wait_s - 1e-9 <= elapsed < wait_s + slack_s


def fetch(correlation_id: int, *parts: tuple[str, int, int], max_wait_ms: int = 0, min_bytes: int = 1,
          max_bytes: int = 50 << 20, partition_max_bytes: int = 1 << 20) -> bytes:
    by_topic: dict[str, list] = {}
    for topic, partition, offset in parts:
        by_topic.setdefault(topic, []).append(FetchPartition(
            partition=i32(partition), current_leader_epoch=i32(-1), fetch_offset=i64(offset),
            log_start_offset=i64(-1), partition_max_bytes=i32(partition_max_bytes)))
    request = FetchRequest(
        replica_id=i32(-1), max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=i32(min_bytes),
        max_bytes=i32(max_bytes), isolation_level=i8(0), session_id=i32(0), session_epoch=i32(-1),
        topics=tuple(FetchTopic(topic=t, partitions=tuple(ps)) for t, ps in by_topic.items()),
        forgotten_topics_data=(), rack_id="")
    return rc.frame(request, correlation_id)


def fetched(body: bytes) -> dict[tuple[str, int], tuple[int, int, list[tuple[int, bytes]]]]:
    """(topic, partition) -> (error code, high watermark, [(offset, value)]) of a Fetch v11 response."""
    response, _ = entity_reader(FetchResponse)(body, 0)
    out = {}
    for topic in response.responses:
        for p in topic.partitions:
            records = []
            if p.records:
                batches = MemoryRecords(bytes(p.records))
                while (b := batches.next_batch()) is not None:
                    records.extend((r.offset, r.value) for r in b)
            out[(topic.topic, int(p.partition_index))] = (int(p.error_code), int(p.high_watermark), records)
    return out


async def test_fetch_returns_what_was_produced_with_its_offsets(autojump_clock, tmp_path):
    async with broker(tmp_path) as b:
        client, _ = await b.connect()
        await client.send(produce(1, [b"a", b"b"]) + produce(2, [b"c"]) + produce(3, [b"x"], partition=1))
        await client.wait_responses(3)
        await client.send(fetch(4, ("t", 0, 0), ("t", 1, 0)))
        await client.wait_responses(4)
        got = fetched(client.responses[3][1])
        assert got[("t", 0)] == (0, 3, [(0, b"a"), (1, b"b"), (2, b"c")])
        assert got[("t", 1)] == (0, 1, [(0, b"x")])
        await client.send(fetch(5, ("t", 0, 2)))
        await client.wait_responses(5)
        # whole batches: the one holding offset 2 starts at 2 here
        assert fetched(client.responses[4][1])[("t", 0)][2] == [(2, b"c")]


async def test_a_fetch_from_inside_a_merged_append_starts_at_the_batch_holding_its_offset(autojump_clock, tmp_path):
    """One read of three produce requests is one append of partition 0 in the WAL (a produce run);
    fetches still see the producers' batches, as Kafka serves them (``LogSegment.read``)."""
    async with broker(tmp_path) as b:
        client, _ = await b.connect()
        await client.send(produce(1, [b"a", b"b"]) + produce(2, [b"c", b"d"]) + produce(3, [b"e"]))
        await client.wait_responses(3)
        assert len(b.logs.log("t", 0).locations(0, 1 << 20)) == 1  # merged: one batch set
        await client.send(fetch(4, ("t", 0, 3)))
        await client.wait_responses(4)
        assert fetched(client.responses[3][1])[("t", 0)][2] == [(2, b"c"), (3, b"d"), (4, b"e")]
        # KIP-74 at batch granularity: a max_bytes below one batch gets that batch alone
        await client.send(fetch(5, ("t", 0, 1), partition_max_bytes=1))
        await client.wait_responses(5)
        assert fetched(client.responses[4][1])[("t", 0)][2] == [(0, b"a"), (1, b"b")]
        await client.send(fetch(6, ("t", 0, 0)))
        await client.wait_responses(6)
        assert fetched(client.responses[5][1])[("t", 0)] == (0, 5, list(enumerate([b"a", b"b", b"c", b"d", b"e"])))


@pytest.fixture
def patient_autojump_clock() -> trio.testing.MockClock:
    """Jumps only after 0.3 s of real idleness: a WAL write in a worker thread is done long before,
    so a waiting fetch's deadline is not reached while the append that should wake it is in flight."""
    return trio.testing.MockClock(autojump_threshold=0.3)


async def test_a_long_poll_is_woken_by_the_append_not_by_its_timeout(patient_autojump_clock, tmp_path):
    async with broker(tmp_path) as b:
        consumer, _ = await b.connect()
        producer, _ = await b.connect()
        await consumer.send(fetch(1, ("t", 0, 0), max_wait_ms=10_000))
        while b.fetch.delayed_fetches == 0:
            await trio.testing.wait_all_tasks_blocked()
        assert consumer.responses == []  # waiting in the purgatory, not answered empty
        sent = trio.current_time()
        await producer.send(produce(7, [b"late"]))
        await consumer.wait_responses(1)
        assert consumer.arrived_at[0] - sent < 1.0
        assert fetched(consumer.responses[0][1])[("t", 0)] == (0, 1, [(0, b"late")])
        assert b.fetch.delayed_fetches == 1


async def test_a_long_poll_with_nothing_new_answers_empty_at_max_wait(autojump_clock, tmp_path):
    async with broker(tmp_path) as b:
        client, _ = await b.connect()
        start = trio.current_time()
        await client.send(fetch(1, ("t", 0, 0), max_wait_ms=2_500))
        await client.wait_responses(1)
        assert waited(client.arrived_at[0] - start, 2.5)
        assert fetched(client.responses[0][1])[("t", 0)] == (0, 0, [])


async def test_the_handler_is_free_while_a_fetch_waits(patient_autojump_clock, tmp_path):
    async with broker(tmp_path) as b:
        client, _ = await b.connect()
        other, _ = await b.connect()
        await client.send(fetch(1, ("t", 0, 0), max_wait_ms=1_500))
        await other.send(rc.frame(rc.api_versions(), 2) + produce(3, [b"v"], partition=1))
        await other.wait_responses(2)
        assert client.responses == []
        # the connection's own later request is answered after the fetch, in order
        await client.send(rc.frame(rc.api_versions(), 4))
        await client.wait_responses(2)
        assert client.correlation_ids == [1, 4]


async def test_errors_are_per_partition(autojump_clock, tmp_path):
    async with broker(tmp_path) as b:
        client, _ = await b.connect()
        await client.send(produce(1, [b"a"]))
        await client.wait_responses(1)
        await client.send(fetch(2, ("t", 0, 0), ("t", 1, 5), ("t", 7, 0), ("nope", 0, 0)))
        await client.wait_responses(2)
        got = fetched(client.responses[1][1])
        assert got[("t", 0)] == (0, 1, [(0, b"a")])
        assert got[("t", 1)][0] == OFFSET_OUT_OF_RANGE
        assert got[("t", 7)][0] == UNKNOWN_TOPIC_OR_PARTITION and got[("nope", 0)][0] == UNKNOWN_TOPIC_OR_PARTITION
        assert not client.eof


async def test_only_durable_records_are_served(autojump_clock, tmp_path):
    async with broker(tmp_path, ack_on="spark") as b:
        client, _ = await b.connect()
        b.sink.hold()
        await client.send(produce(1, [b"a"], acks=0))
        await eventually(lambda: b.sink.writes_started == 1)  # in the WAL, not yet in the table
        await client.send(fetch(2, ("t", 0, 0), max_wait_ms=0))
        await client.wait_responses(1)
        assert fetched(client.responses[0][1])[("t", 0)] == (0, 0, [])
        b.sink.resume()  # the Spark commit: now acknowledged, now readable
        cid = 3
        while True:
            await client.send(fetch(cid, ("t", 0, 0), max_wait_ms=0))
            await client.wait_responses(cid - 1)
            got = fetched(client.responses[-1][1])[("t", 0)]
            if got[1]:
                break
            cid += 1
            await trio.sleep(0.1)
        assert got == (0, 1, [(0, b"a")])


async def test_partition_and_response_byte_limits(autojump_clock, tmp_path):
    async with broker(tmp_path) as b:
        client, _ = await b.connect()
        for i in range(3):
            await client.send(produce(i, [b"x" * 500]))
            await client.send(produce(10 + i, [b"y" * 500], partition=1))
        await client.wait_responses(6)
        await client.send(fetch(20, ("t", 0, 0), ("t", 1, 0), partition_max_bytes=10))
        await client.wait_responses(7)
        got = fetched(client.responses[6][1])
        # KIP-74: the first partition with data gets one whole batch, the next nothing that does not fit
        assert [o for o, _ in got[("t", 0)][2]] == [0] and got[("t", 1)][2] == []
        await client.send(fetch(21, ("t", 0, 0), ("t", 1, 0), max_bytes=1200))
        await client.wait_responses(8)
        got = fetched(client.responses[7][1])
        assert [o for o, _ in got[("t", 0)][2]] == [0, 1] and got[("t", 1)][2] == []


async def test_retention_moves_reads_to_the_table(autojump_clock, tmp_path):
    async with broker(tmp_path, segment_bytes=1, retention=(0, -1)) as b:
        client, _ = await b.connect()
        for i in range(4):
            await client.send(produce(i, [b"r%d" % i]))
            await client.wait_responses(i + 1)
            await eventually(lambda i=i: len(b.sink.rows()) == i + 1)
        await eventually(lambda: (b.logs.log("t", 0).first_indexed_offset or 0) >= 2)
        table_reads = b.logs.table.reads
        await client.send(fetch(10, ("t", 0, 0)))
        await client.wait_responses(5)
        assert b.logs.table.reads > table_reads
        got = fetched(client.responses[4][1])[("t", 0)]
        assert got[0] == 0 and got[2][0] == (0, b"r0")
        # a consumer reading on gets every offset once, from the table and then the WAL
        seen, offset = [], 0
        while offset < 4:
            await client.send(fetch(100 + offset, ("t", 0, offset)))
            await client.wait_responses(len(client.responses) + 1)
            records = [r for r in fetched(client.responses[-1][1])[("t", 0)][2] if r[0] >= offset]
            seen += records
            offset = records[-1][0] + 1
        assert seen == [(i, b"r%d" % i) for i in range(4)]


async def test_a_table_record_too_large_for_what_is_left_of_the_response_is_not_skipped(autojump_clock, tmp_path):
    """KIP-74: a partition after the first with data gets only what fits. When its next record is in the
    table and does not fit, the fetch gets nothing of it, not the WAL's first batch after it (which
    would fit): the consumer asks again from the same offset."""
    async with broker(tmp_path, segment_bytes=1, retention=(0, -1)) as b:
        client, _ = await b.connect()
        await client.send(produce(0, [b"x" * 500], partition=1))  # "t"-1 offset 0: large
        await client.send(produce(1, [b"a"]))
        for i in range(2, 6):
            await client.send(produce(i, [b"y"], partition=1))  # "t"-1 offsets 1-4: small
        await client.wait_responses(6)
        # Virtual time: retention runs every RETENTION_CHECK_INTERVAL_S (60 s), so a bound of 60 s raced it.
        with trio.fail_after(10 * RETENTION_CHECK_INTERVAL_S):
            await eventually(lambda: len(b.sink.rows()) == 6)
            # retention let the oldest segments go: "t"-1 offset 0 is in the table only
            await eventually(lambda: (b.logs.log("t", 1).first_indexed_offset or 0) >= 1)
        await client.send(fetch(10, ("t", 0, 0), ("t", 1, 0), max_bytes=300))
        await client.wait_responses(7)
        got = fetched(client.responses[6][1])
        assert [o for o, _ in got[("t", 0)][2]] == [0] and got[("t", 1)][2] == []
        await client.send(fetch(11, ("t", 1, 0)))
        await client.wait_responses(8)
        assert [o for o, _ in fetched(client.responses[7][1])[("t", 1)][2]][0] == 0


async def test_a_restart_indexes_the_retained_wal(autojump_clock, tmp_path):
    sink = MemorySink()
    async with broker(tmp_path, sink=sink) as b:
        client, _ = await b.connect()
        await client.send(produce(1, [b"a", b"b"]) + produce(2, [b"c"]))
        await client.wait_responses(2)
        await eventually(lambda: len(sink.rows()) == 3)
        b.persister.close()  # an ordered stop: the checkpoint covers the table's rows
        await b.persister.wait_closed()
    async with broker(tmp_path, sink=sink) as b:
        assert b.logs.log("t", 0).high_watermark == 3 and b.logs.log("t", 0).first_indexed_offset == 0
        client, _ = await b.connect()
        await client.send(produce(3, [b"d"]))
        await client.wait_responses(1)
        await client.send(fetch(4, ("t", 0, 0)))
        await client.wait_responses(2)
        assert partition_result(client.responses[0][1]) == (0, 3)
        assert fetched(client.responses[1][1])[("t", 0)][2] == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
        assert b.logs.table.reads == 0  # all from the WAL


def list_offsets(correlation_id: int, *parts: tuple[int, int]) -> bytes:
    request = ListOffsetsRequest(replica_id=i32(-1), isolation_level=i8(0), topics=(ListOffsetsTopic(
        name="t", partitions=tuple(ListOffsetsPartition(partition_index=i32(p), current_leader_epoch=i32(-1),
                                                        timestamp=i64(ts)) for p, ts in parts)),))
    return rc.frame(request, correlation_id)


async def test_list_offsets(autojump_clock, tmp_path):
    async with broker(tmp_path) as b:
        client, _ = await b.connect()
        await client.send(produce(1, [b"a", b"b", b"c"]) + produce(2, [b"d"]))
        await client.wait_responses(2)
        base = 1_700_000_000_000  # rc.record_batch timestamps: base + index in the batch
        await client.send(list_offsets(3, (0, -2), (0, -1), (0, base + 1), (0, base + 5), (1, -1)))
        await client.wait_responses(3)
        response, _ = entity_reader(ListOffsetsResponse)(client.responses[2][1], 0)
        got = [(int(p.error_code), int(p.offset), int(p.timestamp)) for p in response.topics[0].partitions]
        assert got == [(0, 0, -1), (0, 4, -1), (0, 1, base + 1), (0, -1, -1), (0, 0, -1)]


async def test_sync_table_waits_until_everything_appended_is_in_the_table(autojump_clock, tmp_path):
    async with broker(tmp_path, commit_linger_ms=3_600_000) as b:  # a commit interval of an hour
        client, _ = await b.connect()
        await client.send(produce(1, [b"a"]) + produce(2, [b"b"], partition=1))
        await client.wait_responses(2)  # acknowledged from the WAL
        assert b.sink.rows() == []
        synced = trio.Event()

        async def sync() -> None:
            await b.persister.sync_table()
            synced.set()

        b.nursery.start_soon(sync)
        await eventually(lambda: synced.is_set())
        assert sorted(r["value"] for r in b.sink.rows()) == [b"a", b"b"]
        assert trio.current_time() < 3_000  # long before the hour of linger (threads let the clock jump)


async def test_the_index_memory_bound_lets_old_segments_go_before_their_retention(autojump_clock, tmp_path):
    async with broker(tmp_path, segment_bytes=1, retention=(-1, -1)) as b:  # retention alone keeps everything
        b.logs.index_max_bytes = 2 * 48  # two indexed appends
        client, _ = await b.connect()
        for i in range(6):
            await client.send(produce(i, [b"r%d" % i]))
            await client.wait_responses(i + 1)
            await eventually(lambda i=i: len(b.sink.rows()) == i + 1)
        await eventually(lambda: b.logs.index_bytes <= 3 * 48)  # bound + the active segment's entry
        assert (b.logs.log("t", 0).first_indexed_offset or 0) >= 3
        seen, offset = [], 0
        while offset < 6:  # still every offset, the older ones from the table
            await client.send(fetch(100 + offset, ("t", 0, offset)))
            await client.wait_responses(len(client.responses) + 1)
            records = [r for r in fetched(client.responses[-1][1])[("t", 0)][2] if r[0] >= offset]
            seen += records
            offset = records[-1][0] + 1
        assert seen == [(i, b"r%d" % i) for i in range(6)]


async def test_a_forgotten_topic_leaves_the_checkpoint_at_once(autojump_clock, tmp_path):
    async with broker(tmp_path, commit_linger_ms=3_600_000) as b:
        client, _ = await b.connect()
        await client.send(produce(1, [b"a", b"b"]))
        await client.wait_responses(1)
        await b.persister.sync_table()
        store = StateStore(tmp_path / "state")
        await eventually(lambda: store.load() is not None and store.load().end_offsets == {("t", 0): 2})
        await b.persister.forget_topic("t")  # what DeleteTopics does after dropping the rows
        assert StateStore(tmp_path / "state").load().end_offsets == {}  # a crash now restarts "t" at 0


async def test_a_partition_another_broker_leads_is_not_served(autojump_clock, tmp_path):
    """In a cluster (pipeline.cluster.membership) Fetch and ListOffsets of a partition this broker does not
    lead answer NOT_LEADER_OR_FOLLOWER (6) for that partition alone."""
    from pipeline.cluster.membership import Cluster, parse_brokers

    cluster = Cluster(parse_brokers("0@127.0.0.1:9092,1@127.0.0.1:9093"), 0)
    mine = next(p for p in (0, 1) if cluster.leads("t", p))
    other = 1 - mine
    assert not cluster.leads("t", other)  # two partitions, two brokers: one each
    async with broker(tmp_path, cluster=cluster) as b:
        client, _ = await b.connect()
        await client.send(fetch(1, ("t", mine, 0), ("t", other, 0)))
        await client.wait_responses(1)
        got = fetched(client.responses[0][1])
        assert got[("t", mine)][0] == 0 and got[("t", other)][0] == 6
        await client.send(list_offsets(2, (mine, -1), (other, -1)))
        await client.wait_responses(2)
        response, _ = entity_reader(ListOffsetsResponse)(client.responses[1][1], 0)
        assert [int(p.error_code) for p in response.topics[0].partitions] == [0, 6]




async def test_a_fetch_waits_for_a_partition_this_broker_is_taking_over(patient_autojump_clock, tmp_path):
    """Broker 0 was made leader of "t"-1 (its row) and takes it over (hand-off, the table's end): a fetch
    of it alone waits as for new data, and reads it once taken over (``LogManager.wake``) rather than
    answer NOT_LEADER_OR_FOLLOWER at once (kafkajs rejoins its group on each such answer). A fetch
    answered early for another partition's data gets it with no error and no records, its high
    watermark the offset asked; one still waiting at its max wait is NOT_LEADER_OR_FOLLOWER."""
    from pipeline.cluster.membership import DynamicCluster
    from pipeline.metadata.leadership import Leadership

    view = DynamicCluster(0, "127.0.0.1", 9092)
    view.member = True
    view.leaders = {("t", 0): Leadership(0, 3, 1, True), ("t", 1): Leadership(0, 2, 1, False)}
    view.loaded = {("t", 0)}
    assert view.taking_over("t", 1) and not view.taking_over("t", 0)
    async with broker(tmp_path, cluster=view) as b:
        client = await _two_records_produced(b)
        start = trio.current_time()
        await client.send(fetch(2, ("t", 1, 0), max_wait_ms=1_000))
        await client.wait_responses(2)
        assert fetched(client.responses[1][1])[("t", 1)] == (NOT_LEADER_OR_FOLLOWER, -1, [])
        assert waited(client.arrived_at[1] - start, 1.0)  # at its max wait, not at once
        # early for "t"-0's records: "t"-1 without error or records
        await client.send(fetch(3, ("t", 0, 0), ("t", 1, 5), max_wait_ms=10_000))
        await client.wait_responses(3)
        got = fetched(client.responses[2][1])
        assert got[("t", 0)] == (0, 2, [(0, b"a"), (1, b"b")]) and got[("t", 1)] == (0, 5, [])
        # taken over while a fetch waits: it reads the partition
        await client.send(fetch(4, ("t", 1, 0), max_wait_ms=10_000))
        while b.fetch.delayed_fetches < 2:
            await trio.testing.wait_all_tasks_blocked()
        taken = trio.current_time()
        b.logs.reset_partition("t", 1, 0)
        view.loaded.add(("t", 1))
        b.logs.wake([("t", 1)])
        producer, _ = await b.connect()
        await producer.send(produce(5, [b"c"], partition=1))
        await client.wait_responses(4)
        assert fetched(client.responses[3][1])[("t", 1)] == (0, 1, [(0, b"c")])
        assert client.arrived_at[3] - taken < 1.0


async def test_records_durable_only_after_the_membership_lease_may_have_run_out_are_not_acknowledged(
        autojump_clock, tmp_path):
    """Leadership through the database: a produce whose records become durable (here: reach the table,
    ``--ack-on spark``) once this broker's lease may have run out (``DynamicCluster.lease_until``, which
    the service keeps a margin before the database's expiry) is not acknowledged: another broker may
    lead the partition by then. It is answered REQUEST_TIMED_OUT ("possibly persisted": the producer
    retries it with its sequence numbers), not NOT_LEADER_OR_FOLLOWER ("not written": librdkafka may
    send it again as new records after an epoch bump). Within the lease, acknowledged."""
    from pipeline.cluster.membership import DynamicCluster
    from pipeline.metadata.leadership import Leadership

    view = DynamicCluster(0, "127.0.0.1", 9092)
    view.member = True
    view.leaders = {("t", 0): Leadership(0, 1), ("t", 1): Leadership(0, 1)}
    view.loaded = {("t", 0), ("t", 1)}
    # Far off: the autojump clock jumps while the sink's thread works, however long that takes (a
    # loaded runner once used a 60 s lease up before the first produce was durable).
    view.lease_until = trio.current_time() + 1e9
    async with broker(tmp_path, cluster=view, ack_on="spark") as b:
        client, _ = await b.connect()
        await client.send(produce(1, [b"a"]))
        await client.wait_responses(1)
        assert partition_result(client.responses[0][1]) == (0, 0)
        b.sink.hold()  # the next write waits: the heartbeats stop reaching the database meanwhile
        view.lease_until = trio.current_time() + 1.0
        await client.send(produce(2, [b"b"]))
        await trio.sleep(2.0)
        assert len(client.responses) == 1  # not durable yet
        b.sink.resume()
        await client.wait_responses(2)
        assert partition_result(client.responses[1][1])[0] == REQUEST_TIMED_OUT


async def test_list_offsets_waits_for_a_partition_this_broker_is_taking_over(autojump_clock, tmp_path):
    """ListOffsets of a partition broker 0 is taking over waits for the take-over (in a task of its own:
    the connection's and other connections' requests go on) and answers its offsets then; one still
    being taken over after ``TAKEOVER_WAIT_MS`` is NOT_LEADER_OR_FOLLOWER."""
    from pipeline.cluster.membership import DynamicCluster
    from pipeline.log.fetch import TAKEOVER_WAIT_MS
    from pipeline.metadata.leadership import Leadership

    view = DynamicCluster(0, "127.0.0.1", 9092)
    view.member = True
    view.leaders = {("t", 0): Leadership(0, 3, 1, True), ("t", 1): Leadership(0, 2, 1, False)}
    view.loaded = {("t", 0)}

    def answers(body: bytes) -> list[tuple[int, int]]:
        response, _ = entity_reader(ListOffsetsResponse)(body, 0)
        return [(int(p.error_code), int(p.offset)) for p in response.topics[0].partitions]

    async with broker(tmp_path, cluster=view) as b:
        client = await _two_records_produced(b)
        start = trio.current_time()
        await client.send(list_offsets(2, (0, -1), (1, -1)))
        await client.wait_responses(2)
        assert answers(client.responses[1][1]) == [(0, 2), (NOT_LEADER_OR_FOLLOWER, -1)]
        assert waited(client.arrived_at[1] - start, TAKEOVER_WAIT_MS / 1000)
        await client.send(list_offsets(3, (1, -1)))
        other, _ = await b.connect()
        await other.send(list_offsets(4, (0, -1)))  # another connection is answered meanwhile
        await other.wait_responses(1)
        assert answers(other.responses[0][1]) == [(0, 2)] and len(client.responses) == 2
        taken = trio.current_time()
        b.logs.reset_partition("t", 1, 7)
        view.loaded.add(("t", 1))
        b.logs.wake([("t", 1)])
        await client.wait_responses(3)
        assert answers(client.responses[2][1]) == [(0, 7)]
        assert client.arrived_at[2] - taken < 1.0


def fetch_v12(correlation_id: int, *parts: tuple[int, int]) -> bytes:
    """Fetch v12 of topic "t" from offset 0: (partition, current_leader_epoch) each."""
    from kio.schema.fetch.v12.request import FetchPartition as P12, FetchRequest as R12, FetchTopic as T12

    request = R12(replica_id=i32(-1), max_wait=datetime.timedelta(0), min_bytes=i32(1), max_bytes=i32(1 << 20),
                  isolation_level=i8(0), session_id=i32(0), session_epoch=i32(-1), forgotten_topics_data=(),
                  rack_id="", topics=(T12(topic="t", partitions=tuple(
                      P12(partition=i32(p), current_leader_epoch=i32(epoch), fetch_offset=i64(0), last_fetched_epoch=i32(-1),
                          log_start_offset=i64(-1), partition_max_bytes=i32(1 << 20)) for p, epoch in parts)),))
    return rc.frame(request, correlation_id)


def list_offsets_v7(correlation_id: int, *parts: tuple[int, int]) -> bytes:
    """ListOffsets v7 of topic "t", latest offset: (partition, current_leader_epoch) each."""
    from kio.schema.list_offsets.v7.request import (ListOffsetsPartition as P7, ListOffsetsRequest as R7,
                                                    ListOffsetsTopic as T7)

    return rc.frame(R7(replica_id=i32(-1), isolation_level=i8(0), topics=(T7(name="t", partitions=tuple(
        P7(partition_index=i32(p), current_leader_epoch=i32(epoch), timestamp=i64(-1)) for p, epoch in parts)),)),
        correlation_id)


def _leading_t0_at_epoch_3():
    """Broker 0's view of a cluster led through the database: it leads "t"-0 at leader epoch 3 (loaded),
    broker 1 leads "t"-1 at 5."""
    from pipeline.cluster.membership import DynamicCluster
    from pipeline.metadata.leadership import Leadership

    view = DynamicCluster(0, "127.0.0.1", 9092)
    view.member = True
    view.leaders = {("t", 0): Leadership(0, 3, 1, True), ("t", 1): Leadership(1, 5, 0, True)}
    view.loaded = {("t", 0)}
    return view


async def _two_records_produced(b):
    """A client of ``b`` that produced b"a", b"b" to "t"-0 (offsets 0 and 1)."""
    client, _ = await b.connect()
    await client.send(produce(1, [b"a", b"b"]))
    await client.wait_responses(1)
    assert partition_result(client.responses[0][1]) == (0, 0)
    return client

async def test_fetch_and_list_offsets_check_the_current_leader_epoch(autojump_clock, tmp_path):
    """KIP-320 with leadership through the database: broker 0 leads "t"-0 at leader epoch 3 (moved twice)
    and serves it to a request naming epoch 3 or -1; an older epoch is FENCED_LEADER_EPOCH, a newer one
    UNKNOWN_LEADER_EPOCH. "t"-1 is led by broker 1 at epoch 5: NOT_LEADER_OR_FOLLOWER whatever the epoch
    asked. Fetch v12's ``current_leader`` stays empty (Kafka fills it from v16 only). ListOffsets answers
    a found offset with the current leader epoch."""
    from kio.schema.fetch.v12.response import FetchResponse as F12
    from kio.schema.list_offsets.v7.response import ListOffsetsResponse as L7

    async with broker(tmp_path, cluster=_leading_t0_at_epoch_3()) as b:
        client = await _two_records_produced(b)
        answers = {}
        for n, (partition, asked) in enumerate([(0, -1), (0, 3), (0, 2), (0, 4), (1, 5), (1, -1)], start=2):
            await client.send(fetch_v12(n, (partition, asked)))
            await client.wait_responses(n)
            response, _ = entity_reader(F12)(client.responses[n - 1][1], 1)  # after the header's tagged fields
            [p] = response.responses[0].partitions
            records = p.records and MemoryRecords(bytes(p.records)).next_batch()
            answers[(partition, asked)] = (int(p.error_code), [r.value for r in records] if records else [],
                                           (int(p.current_leader.leader_id), int(p.current_leader.leader_epoch)))
        assert answers == {
            (0, -1): (0, [b"a", b"b"], (-1, -1)),
            (0, 3): (0, [b"a", b"b"], (-1, -1)),
            (0, 2): (FENCED_LEADER_EPOCH, [], (-1, -1)),
            (0, 4): (UNKNOWN_LEADER_EPOCH, [], (-1, -1)),
            (1, 5): (NOT_LEADER_OR_FOLLOWER, [], (-1, -1)),
            (1, -1): (NOT_LEADER_OR_FOLLOWER, [], (-1, -1)),
        }
        await client.send(list_offsets_v7(8, (0, -1), (0, 3), (0, 1), (0, 9), (1, 5)))
        await client.wait_responses(8)
        response, _ = entity_reader(L7)(client.responses[7][1], 1)
        got = [(int(p.error_code), int(p.offset), int(p.leader_epoch)) for p in response.topics[0].partitions]
        assert got == [(0, 2, 3), (0, 2, 3), (FENCED_LEADER_EPOCH, -1, -1), (UNKNOWN_LEADER_EPOCH, -1, -1),
                       (NOT_LEADER_OR_FOLLOWER, -1, -1)]


def offset_for_leader_epoch(correlation_id: int, version: int, *parts: tuple[str, int, int, int]) -> bytes:
    """OffsetForLeaderEpoch ``version``: (topic, partition, current_leader_epoch, leader_epoch) each."""
    import importlib

    m = importlib.import_module(f"kio.schema.offset_for_leader_epoch.v{version}.request")
    by_topic: dict[str, list] = {}
    for topic, partition, current, asked in parts:
        by_topic.setdefault(topic, []).append(m.OffsetForLeaderPartition(
            partition=i32(partition), current_leader_epoch=i32(current), leader_epoch=i32(asked)))
    topics = tuple(m.OffsetForLeaderTopic(topic=t, partitions=tuple(ps)) for t, ps in by_topic.items())
    request = (m.OffsetForLeaderEpochRequest(topics=topics) if version == 2
               else m.OffsetForLeaderEpochRequest(replica_id=i32(-1), topics=topics))
    return rc.frame(request, correlation_id)


@pytest.mark.parametrize("version", [2, 3, 4])
async def test_offset_for_leader_epoch_answers_the_log_end_for_epochs_up_to_the_leaders(autojump_clock, tmp_path,
                                                                                       version):
    """KIP-320's validation of a consumer's position: broker 0 leads "t"-0 at leader epoch 3, with 2 records.
    An epoch up to 3 ends at the log end offset (nothing served is ever truncated here), a newer one is
    undefined (-1, -1); the current leader epoch is checked as in Fetch; "t"-1 is broker 1's
    (NOT_LEADER_OR_FOLLOWER) and "t"-5 does not exist (UNKNOWN_TOPIC_OR_PARTITION)."""
    import importlib

    response_type = importlib.import_module(f"kio.schema.offset_for_leader_epoch.v{version}.response")
    async with broker(tmp_path, cluster=_leading_t0_at_epoch_3()) as b:
        client = await _two_records_produced(b)
        await client.send(offset_for_leader_epoch(2, version, ("t", 0, -1, 0), ("t", 0, 3, 3), ("t", 0, 3, 1),
                                                  ("t", 0, 3, 4), ("t", 0, 2, 0), ("t", 0, 4, 0), ("t", 1, 5, 0),
                                                  ("t", 5, -1, 0)))
        await client.wait_responses(2)
        body = client.responses[1][1]
        response, _ = entity_reader(response_type.OffsetForLeaderEpochResponse)(body, 1 if version >= 4 else 0)
        got = [(int(p.partition), int(p.error_code), int(p.leader_epoch), int(p.end_offset))
               for t in response.topics for p in t.partitions]
        assert got == [(0, 0, 0, 2), (0, 0, 3, 2), (0, 0, 1, 2), (0, 0, -1, -1),
                       (0, FENCED_LEADER_EPOCH, -1, -1), (0, UNKNOWN_LEADER_EPOCH, -1, -1),
                       (1, NOT_LEADER_OR_FOLLOWER, -1, -1), (5, UNKNOWN_TOPIC_OR_PARTITION, -1, -1)]


async def test_while_the_table_side_starts_a_fetch_below_the_wal_gets_nothing_and_skips_nothing(autojump_clock, tmp_path):
    """A broker that listens before Spark is up (``--ack-on wal``) may take a partition over then, at the end
    its commits recorded (here 630): the offsets below are in the table only. Until the table side is
    attached (``LogManager.table_pending``) a fetch below the WAL's first offset is answered with no records
    and its own offset, not with the WAL's records from 630 (a consumer would skip 0-629, as kafkajs did in
    CI). Without a table to come, the WAL's first offset is where a fetch goes on, as before."""
    async with broker(tmp_path) as b:
        b.logs.table, b.logs.table_pending = None, True
        b.logs.reset_partition("t", 0, 630)
        client, _ = await b.connect()
        await client.send(produce(1, [b"after the take-over"]))
        await client.wait_responses(1)
        await eventually(lambda: b.logs.log("t", 0).high_watermark == 631)
        await client.send(fetch(2, ("t", 0, 0)))
        await client.wait_responses(2)
        assert fetched(client.responses[1][1])[("t", 0)] == (0, 631, [])
        b.logs.abandon_table()  # the table side failed: no table will come
        await client.send(fetch(3, ("t", 0, 0)))
        await client.wait_responses(3)
        assert fetched(client.responses[2][1])[("t", 0)] == (0, 631, [(630, b"after the take-over")])
