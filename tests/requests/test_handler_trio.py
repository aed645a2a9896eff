"""RequestHandler + KafkaApis + BatchingPersister in-process, behind real KafkaChannels over memory streams.

Everything between the socket and Spark is the server's own: KafkaChannel,
MultiQueueRequestChannel, RequestHandler/KafkaApis, BatchingPersister with a
real WriteAheadLog (in tmp_path, without fsync). Only the table side is a test
double: ``MemorySink`` implements the persister's ``GroupSink`` protocol with
the real Arrow decoding and keeps the rows in memory; its writes can be held
to play a stalled Spark. Time is pytest-trio's autojump_clock.

The persister runs its blocking calls in worker threads, and the autojump clock
may move on while one runs (nothing in trio is runnable then). So requests
that must not time out say so with a very long ``timeout_ms``, and waits poll
the state they need rather than counting on time.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pyarrow as pa
import pytest
import trio
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import i16, i32

from pipeline.network.channel import KafkaChannel, MemoryWaiters
from pipeline.network.connection_state import ConnectionLimits, ConnectionState
from pipeline.network.memory_pool import MemoryPool
from pipeline.persist.accumulator import FlushPolicy
from pipeline.table.arrow import appends_to_table
from pipeline.log.batch import PartitionAppend
from pipeline.persist.persister import BatchingPersister
from pipeline.log.checkpoint import Checkpoint, StateStore
from pipeline.log.wal import WriteAheadLog, read_spans
from pipeline.protocol.apis import BrokerInfo
from pipeline.requests.catalog import TopicCatalog
from pipeline.network.request_channel import MultiQueueRequestChannel
from pipeline.requests.handler import KafkaApis, RequestHandler
from pipeline.log.manager import LogManager
from tests.e2e import raw_client as rc
from tests.network.trio_harness import Client, stream_pair

pytestmark = pytest.mark.trio

NO_TIMEOUT_MS = 2_000_000_000
"""A produce timeout (~23 days) no test reaches, however far the clock jumps while threads run."""
REQUEST_TIMED_OUT = 7
EPS = 1e-9
"""Float slack on virtual times: a deadline computed as ``t + d`` minus ``t`` may come out below ``d``."""
_connection_numbers = itertools.count()


class MemorySink:
    """The persister's GroupSink without Spark: real Arrow decoding, tables kept in memory.

    ``hold`` makes every write wait (Spark stalled) until ``resume``.
    """

    def __init__(self) -> None:
        self.tables: list[pa.Table] = []
        self.written_at: list[float] = []
        """trio.current_time() when each write finished."""
        self.writes_started = 0
        self._open = trio.Event()
        self._open.set()

    def hold(self) -> None:
        if self._open.is_set():
            self._open = trio.Event()

    def resume(self) -> None:
        self._open.set()

    def to_table(self, appends: Sequence[PartitionAppend]) -> pa.Table:
        return appends_to_table(appends)

    def write(self, table: pa.Table, exclude: set[tuple[str, int, int]] | None = None) -> None:
        trio.from_thread.run(self._wait_open)
        if exclude:
            keep = [(t, p, o) not in exclude for t, p, o in zip(
                table.column("topic").to_pylist(), table.column("partition").to_pylist(),
                table.column("offset").to_pylist())]
            table = table.filter(pa.array(keep, pa.bool_()))
        self.tables.append(table)
        self.written_at.append(trio.from_thread.run_sync(trio.current_time))

    async def _wait_open(self) -> None:
        self.writes_started += 1
        await self._open.wait()

    def present_offsets(self, ranges: dict[tuple[str, int], tuple[int, int]]) -> set[tuple[str, int, int]]:
        return {(r["topic"], r["partition"], r["offset"]) for r in self.rows()
                if (r["topic"], r["partition"]) in ranges
                and ranges[r["topic"], r["partition"]][0] <= r["offset"] < ranges[r["topic"], r["partition"]][1]}

    def rows(self) -> list[dict]:
        return [row for table in self.tables for row in table.select(
            ["topic", "partition", "offset", "value"]).to_pylist()]


class WalReadingSink(MemorySink):
    """``MemorySink`` with the GroupSink's optional ``to_table_from_wal``: the persister then hands
    it record-less appends and WAL spans, as it does ``SparkGroupSink``; it reads them back with
    the real ``read_spans`` and keeps the appends it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.given: list[PartitionAppend] = []

    def to_table_from_wal(self, appends: Sequence[PartitionAppend], wal_directory: str, spans) -> pa.Table:
        self.given.extend(appends)
        records = read_spans(wal_directory, spans)
        return appends_to_table([dataclasses.replace(a, records=r) for a, r in zip(appends, records)])


@dataclass
class Broker:
    nursery: trio.Nursery
    sink: MemorySink
    persister: BatchingPersister
    apis: KafkaApis
    request_channel: MultiQueueRequestChannel
    pool: MemoryPool
    memory: MemoryWaiters

    async def connect(self) -> tuple[Client, KafkaChannel]:
        client, stream = stream_pair()
        state = ConnectionState(self.pool, ConnectionLimits(), trio.current_time())
        channel = KafkaChannel(f"127.0.0.1:9092-{client.remote[0]}:{client.remote[1]}-{next(_connection_numbers)}",
                               stream, self.request_channel, state, self.memory)
        self.nursery.start_soon(channel.run)
        self.nursery.start_soon(client.run)
        return client, channel


@asynccontextmanager
async def broker(tmp_path, *, ack_on: str = "wal", max_buffer_bytes: int = 64 << 20,
                 queues: int = 2, sink: MemorySink | None = None, cluster=None,
                 node_id: int = 0) -> AsyncIterator[Broker]:
    """The server's middle as ``Server.serve`` wires it, with ``MemorySink`` (or ``sink``) for Spark;
    topic "t", 2 partitions; ``cluster``: the broker's view of its cluster (None: alone), ``node_id``
    this broker's."""
    sink = sink if sink is not None else MemorySink()
    wal = WriteAheadLog(tmp_path / "wal", fsync=False)
    wal.open()
    persister = BatchingPersister(sink, wal, StateStore(tmp_path / "state"), Checkpoint(),
                                  FlushPolicy(linger_ms=0), ack_on=ack_on,  # type: ignore[arg-type]
                                  max_buffer_bytes=max_buffer_bytes)
    apis = KafkaApis(BrokerInfo(node_id, "127.0.0.1", 9092 + node_id, "test", cluster=cluster), TopicCatalog(initial={"t": 2}),
                     LogManager(), persister, first_producer_id=1000)
    request_channel = MultiQueueRequestChannel(queues, 100)
    pool = MemoryPool(16 << 20)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(persister.run)
            await nursery.start(apis.run_timeouts)
            for i in range(queues):
                await nursery.start(RequestHandler(i, apis, request_channel).run)
            try:
                yield Broker(nursery, sink, persister, apis, request_channel, pool, MemoryWaiters(pool))
            finally:
                sink.resume()
            nursery.cancel_scope.cancel()
    finally:
        wal.close()


def produce(correlation_id: int, values: list[bytes], *, acks: int = -1, partition: int = 0,
            timeout_ms: int = NO_TIMEOUT_MS, topic: str = "t") -> bytes:
    return rc.frame(rc.produce(topic, values, acks=acks, partition=partition, timeout_ms=timeout_ms),
                    correlation_id)


def partition_result(body: bytes):
    """(error code, base offset) of the one partition of a Produce v9 response."""
    part = rc.decode_produce_response(body).responses[0].partition_responses[0]
    return int(part.error_code), int(part.base_offset)


async def eventually(predicate: Callable[[], bool]) -> None:
    """Poll (virtual time) until ``predicate()``: for state that worker threads change."""
    while not predicate():
        await trio.sleep(0.01)


async def test_acks_all_is_answered_only_after_the_sink_write_completes(autojump_clock, tmp_path):
    async with broker(tmp_path, ack_on="spark") as b:
        client, _ = await b.connect()
        b.sink.hold()
        await client.send(produce(1, [b"a", b"b"]))
        await eventually(lambda: b.sink.writes_started == 1)
        await trio.sleep(60)  # Spark stalled for a minute: durable in the WAL, not yet in the table
        assert client.responses == [] and b.sink.tables == []
        b.sink.resume()
        await client.wait_responses(1)
        assert partition_result(client.responses[0][1]) == (0, 0)
        assert [r["value"] for r in b.sink.rows()] == [b"a", b"b"]
        assert b.sink.written_at[0] <= client.arrived_at[0]


async def test_ack_on_wal_answers_before_the_sink_write(autojump_clock, tmp_path):
    async with broker(tmp_path, ack_on="wal") as b:
        client, _ = await b.connect()
        b.sink.hold()
        await client.send(produce(1, [b"a"]))
        await client.wait_responses(1)
        assert partition_result(client.responses[0][1]) == (0, 0)
        assert b.sink.tables == []  # acknowledged from the write-ahead log
        b.sink.resume()
        await eventually(lambda: len(b.sink.rows()) == 1)


async def test_acks_zero_gets_no_response_but_its_records_are_persisted(autojump_clock, tmp_path):
    async with broker(tmp_path) as b:
        client, _ = await b.connect()
        await client.send(produce(1, [b"r1"], acks=0) + produce(2, [b"r2"]) + rc.frame(rc.api_versions(), 3)
                          + produce(4, [b"r4a", b"r4b"], acks=0) + produce(5, [b"r5"], acks=1))
        await client.wait_responses(3)
        await eventually(lambda: len(b.sink.rows()) == 5)
        await trio.sleep(5)
        assert client.correlation_ids == [2, 3, 5]  # never a frame for 1 or 4
        assert [partition_result(client.responses[i][1]) for i in (0, 2)] == [(0, 1), (0, 4)]
        rows = sorted(b.sink.rows(), key=lambda r: r["offset"])
        assert [(r["offset"], r["value"]) for r in rows] == [
            (0, b"r1"), (1, b"r2"), (2, b"r4a"), (3, b"r4b"), (4, b"r5")]


async def test_produce_times_out_when_the_persister_is_full_and_spark_stalled(autojump_clock, tmp_path):
    async with broker(tmp_path, max_buffer_bytes=1) as b:
        client, _ = await b.connect()
        b.sink.hold()
        await client.send(produce(1, [b"first"]))
        await client.wait_responses(1)
        assert partition_result(client.responses[0][1]) == (0, 0)  # acknowledged from the WAL
        await eventually(lambda: b.sink.writes_started == 1)
        assert b.persister.buffered_bytes >= 1  # buffer.memory full: the Spark write holds it
        sent = trio.current_time()
        await client.send(produce(2, [b"late0", b"late1"], timeout_ms=2500))
        await client.wait_responses(2)
        assert client.correlation_ids == [1, 2]
        assert partition_result(client.responses[1][1]) == (REQUEST_TIMED_OUT, -1)
        assert 2.5 - EPS <= client.arrived_at[1] - sent <= 2.5 + 0.01
        assert b.apis.logs.log_end_offset("t", 0) == 1  # request 2 was never sequenced
        assert b.apis.stats.records == 1  # nor handed to the persister
        # Spark comes back: the next produce gets the offset after "first", the
        # timed-out records never reach the table.
        await client.send(produce(3, [b"after"]))
        await trio.sleep(1)
        assert len(client.responses) == 2  # still waiting for room
        b.sink.resume()
        await client.wait_responses(3)
        assert partition_result(client.responses[2][1]) == (0, 1)
        await eventually(lambda: len(b.sink.rows()) == 2)
        assert [(r["offset"], r["value"]) for r in b.sink.rows()] == [(0, b"first"), (1, b"after")]
        await trio.sleep(5)
        assert client.correlation_ids == [1, 2, 3] and len(b.sink.rows()) == 2


async def test_records_not_durable_within_the_timeout_are_answered_once_with_request_timed_out(
        autojump_clock, tmp_path):
    async with broker(tmp_path, ack_on="spark") as b:
        client, _ = await b.connect()
        b.sink.hold()
        sent = trio.current_time()
        await client.send(produce(1, [b"slow"], timeout_ms=2000))
        await client.wait_responses(1)
        assert partition_result(client.responses[0][1]) == (REQUEST_TIMED_OUT, -1)
        assert 2.0 - EPS <= client.arrived_at[0] - sent <= 2.0 + 0.1 + 0.01  # the handler checks every 0.1 s
        assert b.sink.tables == []
        b.sink.resume()
        await eventually(lambda: len(b.sink.rows()) == 1)
        await trio.sleep(5)
        assert client.correlation_ids == [1]  # answered exactly once, never with success


async def test_offsets_are_sequential_per_partition_across_connections(autojump_clock, tmp_path):
    async with broker(tmp_path, queues=2) as b:
        clients = [await b.connect() for _ in range(4)]
        sent: dict[tuple[int, int], tuple[int, int]] = {}  # (conn, req) -> (partition, records)
        for req in range(6):
            for conn, (client, _) in enumerate(clients):
                partition, records = (conn + req) % 2, 1 + (conn * 7 + req) % 3
                sent[conn, req] = (partition, records)
                values = [f"c{conn}r{req}k{k}".encode() for k in range(records)]
                await client.send(produce(conn * 100 + req, values, partition=partition))
        for client, _ in clients:
            await client.wait_responses(6)
        base: dict[tuple[int, int], int] = {}
        for conn, (client, _) in enumerate(clients):
            assert client.correlation_ids == [conn * 100 + req for req in range(6)]
            for cid, body in client.responses:
                error, offset = partition_result(body)
                assert error == 0
                base[conn, cid - conn * 100] = offset
        by_partition = defaultdict(list)
        for key, (partition, records) in sent.items():
            by_partition[partition].append((base[key], records, key))
        for _partition, appends in by_partition.items():
            appends.sort()
            expected = 0
            for offset, records, _ in appends:  # contiguous from 0: no gap, no overlap
                assert offset == expected
                expected += records
            for conn in range(4):  # and in each connection's request order
                own = [offset for offset, _, (c, req) in appends if c == conn]
                assert own == sorted(own)
        total = sum(records for _, records in sent.values())
        await eventually(lambda: len(b.sink.rows()) == total)
        for row in b.sink.rows():
            conn, req, k = (int(x) for x in row["value"].decode()[1:].replace("r", " ").replace("k", " ").split())
            assert (row["partition"], row["offset"]) == (sent[conn, req][0], base[conn, req] + k)


async def test_invalid_partitions_and_corrupt_batches_are_refused_without_taking_offsets(autojump_clock, tmp_path):
    async with broker(tmp_path) as b:
        client, _ = await b.connect()
        batch = bytearray(rc.record_batch([b"x"]))
        batch[-1] ^= 0xFF  # the CRC no longer matches
        corrupt = ProduceRequest(
            transactional_id=None, acks=i16(-1), timeout=datetime.timedelta(milliseconds=NO_TIMEOUT_MS),
            topic_data=(TopicProduceData(name="t", partition_data=(
                PartitionProduceData(index=i32(0), records=bytes(batch)),)),))
        await client.send(produce(1, [b"a"], partition=5) + produce(2, [b"b"], topic="nope")
                          + rc.frame(corrupt, 3) + produce(4, [b"ok"]))
        await client.wait_responses(4)
        errors = [partition_result(body) for _, body in client.responses]
        assert [e for e, _ in errors] == [3, 3, 2, 0]  # UNKNOWN_TOPIC_OR_PARTITION x2, CORRUPT_MESSAGE
        assert errors[3] == (0, 0)
        await eventually(lambda: len(b.sink.rows()) == 1)
        assert [(r["partition"], r["offset"], r["value"]) for r in b.sink.rows()] == [(0, 0, b"ok")]


@pytest.mark.parametrize("ack_on", ["wal", "spark"])
async def test_a_sink_that_reads_the_wal_gets_positions_not_record_bytes(autojump_clock, tmp_path, ack_on):
    sink = WalReadingSink()
    async with broker(tmp_path, ack_on=ack_on, sink=sink) as b:
        client, _ = await b.connect()
        b.sink.hold()
        values = [[b"v%d-%d" % (i, j) * (i + 1) for j in range(i % 3 + 1)] for i in range(12)]
        for i, vs in enumerate(values):
            await client.send(produce(i, vs, partition=i % 2))
        if ack_on == "wal":
            await client.wait_responses(len(values))
        await eventually(lambda: b.sink.writes_started >= 1)
        # Spark stalled: the waiting records still count against buffer.memory, by their size.
        assert b.persister.buffered_bytes >= sum(len(v) for vs in values for v in vs)
        b.sink.resume()
        await client.wait_responses(len(values))
        await eventually(lambda: len(b.sink.rows()) == sum(map(len, values)))
    assert sink.given and all(a.records == b"" and a.size_bytes > 0 for a in sink.given)
    for p in (0, 1):
        rows = sorted((r["offset"], r["value"]) for r in sink.rows() if r["partition"] == p)
        expected = [v for i, vs in enumerate(values) if i % 2 == p for v in vs]
        assert rows == list(enumerate(expected))


class AppendRecordingSink(MemorySink):
    """``MemorySink`` that keeps (partition, base offset, record count) of every append it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.appends: list[tuple[int, int, int]] = []

    def to_table(self, appends: Sequence[PartitionAppend]) -> pa.Table:
        self.appends.extend((a.partition, a.base_offset, a.record_count) for a in appends)
        return super().to_table(appends)


def _records_request(correlation_id: int, records: bytes, *, acks: int = -1, partition: int = 0) -> bytes:
    """A Produce v9 frame of topic "t" carrying ``records`` as they are."""
    return rc.frame(ProduceRequest(
        transactional_id=None, acks=i16(acks), timeout=datetime.timedelta(milliseconds=NO_TIMEOUT_MS),
        topic_data=(TopicProduceData(name="t", partition_data=(
            PartitionProduceData(index=i32(partition), records=records),)),)), correlation_id)


def _batch(values: list[bytes], *, compression: int = 0, producer_id: int = -1, base_sequence: int = 0) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=0,
                                        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                                        base_sequence=base_sequence if producer_id >= 0 else -1, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=None, value=value, headers=[])
    batch = bytes(builder.build())
    assert (batch[22] & 7) == compression  # kafka-python stores it uncompressed if that is smaller
    return batch


async def test_a_read_of_plain_produce_requests_is_one_run_with_one_append_per_partition(autojump_clock, tmp_path):
    """Requests of one read (any acks) are sequenced together: each gets the offsets it would get
    alone, and each partition's records reach the persister as one append."""
    sink = AppendRecordingSink()
    async with broker(tmp_path, sink=sink) as b:
        client, _ = await b.connect()
        await client.send(produce(1, [b"a"], acks=0) + produce(2, [b"b", b"c"], acks=1)
                          + produce(3, [b"d"], partition=1) + produce(4, [b"e"]) + produce(5, [b"f"], acks=0))
        await client.wait_responses(3)
        assert client.correlation_ids == [2, 3, 4]
        assert [partition_result(body) for _, body in client.responses] == [(0, 1), (0, 0), (0, 3)]
        await eventually(lambda: len(b.sink.rows()) == 6)
        assert sorted(sink.appends) == [(0, 0, 5), (1, 0, 1)]
        rows = sorted((r["partition"], r["offset"], r["value"]) for r in b.sink.rows())
        assert rows == [(0, 0, b"a"), (0, 1, b"b"), (0, 2, b"c"), (0, 3, b"e"), (0, 4, b"f"), (1, 0, b"d")]
        assert b.apis.stats.produce_requests == 5 and b.apis.stats.records == 6


async def test_requests_that_are_not_plain_cut_the_run_and_keep_their_place(autojump_clock, tmp_path):
    """A compressed batch (inflated in a worker thread, an ``await``), an idempotent producer's
    batch and a refused partition, amid plain requests of one read: every request keeps its
    connection's order and offsets, the plain ones around them merge only with their neighbours."""
    sink = AppendRecordingSink()
    async with broker(tmp_path, sink=sink) as b:
        client, _ = await b.connect()
        await client.send(produce(1, [b"p1"]) + produce(2, [b"p2"])
                          + _records_request(3, _batch([b"z1" * 200, b"z2" * 200], compression=1))  # gzip
                          + produce(4, [b"p4"]) + produce(5, [b"x"], partition=7)
                          + _records_request(6, _batch([b"i1"], producer_id=b.apis.next_producer_id()))
                          + produce(7, [b"p7"]) + produce(8, [b"p8"]))
        await client.wait_responses(8)
        assert client.correlation_ids == list(range(1, 9))
        assert [partition_result(body) for _, body in client.responses] == [
            (0, 0), (0, 1), (0, 2), (0, 4), (3, -1), (0, 5), (0, 6), (0, 7)]
        await eventually(lambda: len(b.sink.rows()) == 8)
        assert sink.appends == [(0, 0, 2), (0, 2, 2), (0, 4, 1), (0, 5, 1), (0, 6, 2)]
        assert [r["value"] for r in sorted(b.sink.rows(), key=lambda r: r["offset"])] == [
            b"p1", b"p2", b"z1" * 200, b"z2" * 200, b"p4", b"i1", b"p7", b"p8"]


async def test_the_shared_unmuted_ablation_keeps_one_scheduling_point_per_request(tmp_path):
    """``yield_before_sequencing`` (the ablation that must expose reordering) never takes runs."""
    wal = WriteAheadLog(tmp_path / "wal", fsync=False)
    persister = BatchingPersister(MemorySink(), wal, StateStore(tmp_path / "state"), Checkpoint(),
                                  FlushPolicy(linger_ms=0))
    info, catalog = BrokerInfo(0, "127.0.0.1", 9092, "test"), TopicCatalog(initial={"t": 1})
    assert KafkaApis(info, catalog, LogManager(), persister, 1).produce_runs
    assert not KafkaApis(info, catalog, LogManager(), persister, 1, yield_before_sequencing=True).produce_runs


NOT_LEADER_OR_FOLLOWER, OUT_OF_ORDER_SEQUENCE_NUMBER = 6, 45


def _leading_t(row):
    """A member's view of leadership through the database in which this broker (node 0) leads and
    serves both partitions of "t" with leadership ``row``."""
    from pipeline.cluster.membership import DynamicCluster

    view = DynamicCluster(0, "127.0.0.1", 9092)
    view.member = True
    view.leaders = {("t", 0): row, ("t", 1): row}
    view.loaded = {("t", 0), ("t", 1)}
    return view


async def test_a_producer_unknown_here_is_refused_retriably_until_its_earlier_batch_comes_or_for_a_while(
        autojump_clock, tmp_path, caplog):
    """The failover test's duplicates (session 55): a new leader with no state of a producer on a
    partition got its batch of sequences 100-104 before 0-99, which the previous leader had refused
    unwritten, and answered UNKNOWN_PRODUCER_ID; librdkafka bumped its epoch and renumbered, on every
    partition, what it had not seen acknowledged, some of it written already: written twice. Such a
    batch is now refused NOT_LEADER_OR_FOLLOWER (retriable, no epoch bump) until its earlier batch
    arrives, and the batches land in sequence order; a batch whose earlier ones never come is accepted
    after ``UNKNOWN_PRODUCER_REFUSALS`` refusals, as Kafka accepts it (KIP-360). A retry of an accepted
    batch is a duplicate with its offset."""
    from pipeline.log.producer_state import UNKNOWN_PRODUCER_REFUSALS

    async with broker(tmp_path) as b:
        pid = b.apis.next_producer_id()
        client, _ = await b.connect()

        def idempotent(correlation_id: int, seq: int, count: int = 1, partition: int = 0) -> bytes:
            return _records_request(correlation_id, _batch([b"s%d" % i for i in range(seq, seq + count)],
                                                           producer_id=pid, base_sequence=seq), partition=partition)

        with caplog.at_level(logging.INFO, logger="pipeline.requests.handler"):
            await client.send(idempotent(1, 1, count=50))   # ahead of its earlier batch
            await client.wait_responses(1)
            await client.send(idempotent(2, 0) + idempotent(3, 1, count=50) + idempotent(4, 1, count=50))
            await client.wait_responses(4)
            assert [partition_result(body) for _, body in client.responses] == [
                (NOT_LEADER_OR_FOLLOWER, -1), (0, 0), (0, 1), (0, 1)]
            # Partition 1: the earlier batches never come; refused, then accepted at its sequence.
            for n in range(UNKNOWN_PRODUCER_REFUSALS + 1):
                await client.send(idempotent(5 + n, 7, partition=1))
                await client.wait_responses(5 + n)
        assert [partition_result(body) for _, body in client.responses[4:]] == [
            (NOT_LEADER_OR_FOLLOWER, -1)] * UNKNOWN_PRODUCER_REFUSALS + [(0, 0)]
        assert caplog.text.count(f"producer {pid} epoch 0 batch of sequences 7-7, with no state of the producer "
                                 "here: refused") == UNKNOWN_PRODUCER_REFUSALS
        assert f"producer {pid} epoch 0 batch of sequences 7-7, with no state of the producer here: accepted" \
            in caplog.text
        await eventually(lambda: len(b.sink.rows()) == 52)
        assert [r["value"] for r in sorted(b.sink.rows(), key=lambda r: (r["partition"], r["offset"]))] == [
            b"s%d" % i for i in range(51)] + [b"s7"]


async def test_a_batch_pipelined_behind_one_refused_unwritten_gets_the_same_answer_not_a_sequence_error(
        autojump_clock, tmp_path):
    """The failover test's duplicates (CI, session 47): a broker taking "t"-0 over answers an
    idempotent batch NOT_LEADER_OR_FOLLOWER; the take-over ends; the next batch, pipelined behind it
    on the same connection, leaves a sequence gap. Kafka's rule answers OUT_OF_ORDER_SEQUENCE_NUMBER,
    on which librdkafka bumps its epoch and renumbers what it has not seen acknowledged, everywhere.
    It gets NOT_LEADER_OR_FOLLOWER again (``RefusedPartitions``), the client retries both in order,
    and both land once. A gap on another connection, or after the retries caught up, is still refused
    by Kafka's rule; so is one behind a refusal that is not retriable."""
    from pipeline.metadata.leadership import Leadership

    view = _leading_t(Leadership(0, 1, 0, True))
    async with broker(tmp_path, cluster=view) as b:
        pid = b.apis.next_producer_id()

        def idempotent(correlation_id: int, seq: int, partition: int = 0) -> bytes:
            return _records_request(correlation_id, _batch([b"s%d" % seq], producer_id=pid, base_sequence=seq),
                                    partition=partition)

        client, _ = await b.connect()
        await client.send(idempotent(1, 0))
        await client.wait_responses(1)
        view.loaded = {("t", 1)}  # "t"-0 moved away and back: this broker takes it over again
        assert view.taking_over("t", 0)
        await client.send(idempotent(2, 1))
        await client.wait_responses(2)
        view.loaded = {("t", 0), ("t", 1)}  # taken over: the next batch, sent before the answer, arrives
        await client.send(idempotent(3, 2))
        await client.wait_responses(3)
        other, _ = await b.connect()  # the same producer id's gap on a connection that was refused nothing
        await other.send(idempotent(1, 3))
        await other.wait_responses(1)
        await client.send(idempotent(4, 1) + idempotent(5, 2) + idempotent(6, 4))  # the retries, then a gap
        await client.wait_responses(6)
        assert [partition_result(body) for _, body in client.responses] == [
            (0, 0), (NOT_LEADER_OR_FOLLOWER, -1), (NOT_LEADER_OR_FOLLOWER, -1), (0, 1), (0, 2),
            (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)]
        assert partition_result(other.responses[0][1]) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
        # A first batch refused (its producer unknown here), then the next: refused retriably too
        # (UnknownProducers), not accepted ahead of it nor answered UNKNOWN_PRODUCER_ID.
        view.loaded = {("t", 0)}
        await client.send(idempotent(7, 0, partition=1))
        await client.wait_responses(7)
        view.loaded = {("t", 0), ("t", 1)}
        await client.send(idempotent(8, 1, partition=1) + idempotent(9, 0, partition=1) + idempotent(10, 1, partition=1))
        await client.wait_responses(10)
        assert [partition_result(body) for _, body in client.responses[6:]] == [
            (NOT_LEADER_OR_FOLLOWER, -1), (NOT_LEADER_OR_FOLLOWER, -1), (0, 0), (0, 1)]
        # Refused for a reason no retry changes (an unknown partition is retriable, a sequence error
        # is not): a gap behind OUT_OF_ORDER_SEQUENCE_NUMBER stays OUT_OF_ORDER_SEQUENCE_NUMBER.
        await client.send(idempotent(11, 7) + idempotent(12, 8))
        await client.wait_responses(12)
        assert [partition_result(body) for _, body in client.responses[10:]] == [
            (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)] * 2
        await eventually(lambda: len(b.sink.rows()) == 5)
        assert sorted((r["partition"], r["offset"], r["value"]) for r in b.sink.rows()) == [
            (0, 0, b"s0"), (0, 1, b"s1"), (0, 2, b"s2"), (1, 0, b"s0"), (1, 1, b"s1")]


async def test_a_gap_after_the_batches_a_take_over_brought_is_refused_retriably_until_they_come_or_for_a_while(
        autojump_clock, tmp_path, caplog):
    """The failover test's duplicates (session 57): a restarted broker took "t"-0 back with a producer's
    batches 0-83 (from the table), and got its batch 85 first, on a new connection: the previous leader
    had refused 84 unwritten (it had lost the partition). Kafka's rule answers OUT_OF_ORDER_SEQUENCE_NUMBER,
    on which librdkafka bumps its epoch and renumbers everywhere what it has not seen acknowledged, some
    of it written by a paused broker: written twice. Such a gap is refused NOT_LEADER_OR_FOLLOWER
    (retriable) until 84 comes; a gap behind a batch appended here gets Kafka's answer at once, and a
    gap whose batches never come gets it after ``UNKNOWN_PRODUCER_REFUSALS`` refusals."""
    from pipeline.log.producer_state import UNKNOWN_PRODUCER_REFUSALS
    from pipeline.metadata.leadership import Leadership

    view = _leading_t(Leadership(0, 2, 1, True))
    async with broker(tmp_path, cluster=view) as b:
        pid = b.apis.next_producer_id()
        for partition in (0, 1):  # taken over at offset 184 with the producer's batches 0-83 (the last at 100)
            b.apis.logs.reset_partition("t", partition, 184, [(pid, 0, 0, 83, 100)])

        def idempotent(correlation_id: int, seq: int, partition: int = 0) -> bytes:
            return _records_request(correlation_id, _batch([b"s%d" % seq], producer_id=pid, base_sequence=seq),
                                    partition=partition)

        client, _ = await b.connect()
        with caplog.at_level(logging.INFO, logger="pipeline.requests.handler"):
            await client.send(idempotent(1, 85))  # ahead of 84
            await client.wait_responses(1)
            await client.send(idempotent(2, 84) + idempotent(3, 85) + idempotent(4, 87))  # then a gap after them
            await client.wait_responses(4)
            for n in range(UNKNOWN_PRODUCER_REFUSALS + 1):  # "t"-1: 84 never comes
                await client.send(idempotent(5 + n, 85, partition=1))
                await client.wait_responses(5 + n)
        assert [partition_result(body) for _, body in client.responses] == [
            (NOT_LEADER_OR_FOLLOWER, -1), (0, 184), (0, 185), (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)] + [
            (NOT_LEADER_OR_FOLLOWER, -1)] * UNKNOWN_PRODUCER_REFUSALS + [(OUT_OF_ORDER_SEQUENCE_NUMBER, -1)]
        assert caplog.text.count(f"producer {pid} epoch 0 batch of sequences 85-85 leaves a gap after the batches "
                                 "the take-over brought: refused") == 1 + UNKNOWN_PRODUCER_REFUSALS
        await eventually(lambda: len(b.sink.rows()) == 2)
        assert sorted((r["partition"], r["offset"], r["value"]) for r in b.sink.rows()) == [
            (0, 184, b"s84"), (0, 185, b"s85")]
