"""The persister and transactions (issue 22): the table holds committed records only, each once.

A transaction's records go to the WAL (acknowledged there, whatever ``ack_on``) and are held
out of the table until their partition's marker: COMMIT releases them into the next flush,
ABORT drops them. Checkpoints never pass the WAL entry of an open transaction's first
record, so a restart (``recover_log`` + the persister's backlog) finds those records again
and the marker that comes after the restart still decides them. Real WAL files in tmp_path,
real Arrow decoding; the table side is the in-memory sink of tests/requests/test_handler_trio.py.
"""

from __future__ import annotations

import pytest
import trio
from kafka.record.default_records import DefaultRecordBatchBuilder

from pipeline.log.batch import PartitionAppend
from pipeline.log.checkpoint import Checkpoint, StateStore
from pipeline.log.control import ABORT, COMMIT, build_marker
from pipeline.log.state import LogState
from pipeline.log.wal import WriteAheadLog
from pipeline.persist.accumulator import FlushPolicy
from pipeline.persist.persister import BatchingPersister, Commit
from pipeline.persist.recovery import recover_log
from tests.e2e import raw_client as rc
from tests.requests.test_handler_trio import MemorySink, WalReadingSink

pytestmark = pytest.mark.trio

PID, EPOCH = 7000, 0


class Log:
    """Sequences appends like the request handler: offsets per partition, then the persister."""

    def __init__(self) -> None:
        self.state = LogState()
        self.sequence = 0

    def data(self, partition: int, values: list[bytes]) -> PartitionAppend:
        base = self.state.offsets.assign("t", partition, len(values))
        a = PartitionAppend("t", partition, base, rc.record_batch(values), len(values), 0)
        self.state.apply(a)
        return a

    def txn(self, partition: int, values: list[bytes], epoch: int = EPOCH) -> PartitionAppend:
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=1, producer_id=PID,
                                            producer_epoch=epoch, base_sequence=self.sequence, batch_size=1 << 20)
        for i, value in enumerate(values):
            builder.append(i, timestamp=1_700_000_000_000 + i, key=None, value=value, headers=[])
        base = self.state.offsets.assign("t", partition, len(values))
        a = PartitionAppend("t", partition, base, bytes(builder.build()), len(values), 0, PID, epoch, self.sequence)
        self.sequence += len(values)
        self.state.apply(a)
        return a

    def marker(self, partition: int, commit: bool, epoch: int = EPOCH) -> PartitionAppend:
        records = build_marker(PID, epoch, COMMIT if commit else ABORT, 0, 1_700_000_000_000)
        base = self.state.offsets.assign("t", partition, 1)
        a = PartitionAppend("t", partition, base, records, 1, 0, PID, epoch, -1)
        self.state.apply(a)
        return a


def open_wal(tmp_path) -> WriteAheadLog:
    wal = WriteAheadLog(tmp_path / "wal", fsync=False)
    wal.open()
    return wal


def persister(tmp_path, sink: MemorySink, wal: WriteAheadLog, checkpoint: Checkpoint, **kwargs) -> BatchingPersister:
    return BatchingPersister(sink, wal, StateStore(tmp_path / "state"), checkpoint,  # type: ignore[arg-type]
                             FlushPolicy(max_records=1, linger_ms=0), **kwargs)


async def durable(*commits: Commit) -> None:
    with trio.fail_after(10):
        while not all(c.done for c in commits):
            await trio.sleep(0.01)
    assert all(c.error is None for c in commits)


async def table_has(sink: MemorySink, values: set[bytes]) -> None:
    with trio.fail_after(10):
        while {r["value"] for r in sink.rows()} != values:
            await trio.sleep(0.01)


@pytest.mark.parametrize("sink_type", [MemorySink, WalReadingSink])
@pytest.mark.parametrize("ack_on", ["wal", "spark"])
async def test_commit_releases_abort_drops_markers_are_no_rows(tmp_path, sink_type, ack_on):
    sink = sink_type()
    wal = open_wal(tmp_path)
    p = persister(tmp_path, sink, wal, Checkpoint(), ack_on=ack_on)
    log = Log()
    async with trio.open_nursery() as nursery:
        await nursery.start(p.run)
        # A transaction on partitions 0 and 1, data of others around it.
        t1 = p.append([log.txn(0, [b"c1"]), log.txn(1, [b"c2"])], at_wal=True)
        d1 = p.append([log.data(0, [b"d1"])])
        await durable(t1, d1)  # the transaction's produce is acknowledged at the WAL even with ack_on spark
        await table_has(sink, {b"d1"})
        assert p.open_transactions == 1
        commit = p.append([log.marker(0, True), log.marker(1, True)])
        await durable(commit)
        if ack_on == "spark":  # a COMMIT marker resolves once what it releases is in the table
            assert {r["value"] for r in sink.rows()} == {b"d1", b"c1", b"c2"}
        await table_has(sink, {b"d1", b"c1", b"c2"})
        # An aborted one leaves nothing; its marker is no row either.
        t2 = p.append([log.txn(0, [b"a1", b"a2"])], at_wal=True)
        await durable(t2)
        abort = p.append([log.marker(0, False)])
        d2 = p.append([log.data(1, [b"d2"])])
        await durable(abort, d2)
        await table_has(sink, {b"d1", b"c1", b"c2", b"d2"})
        assert p.open_transactions == 0
        p.close()
        await p.wait_closed()
    wal.close()
    rows = sorted((r["partition"], r["offset"]) for r in sink.rows())
    assert rows == sorted(set(rows))  # each once
    # Offsets: c1=0, d1=1, marker=2, a1..a2=3..4, marker=5 on partition 0; c2=0, marker=1, d2=2 on 1.
    assert rows == [(0, 0), (0, 1), (1, 0), (1, 2)]
    # The checkpoint covers everything (nothing is open) and counts the markers' and aborted offsets.
    stored = StateStore(tmp_path / "state").load()
    assert stored is not None and stored.end_offsets == {("t", 0): 6, ("t", 1): 3}


@pytest.mark.parametrize("sink_type", [MemorySink, WalReadingSink])
async def test_open_transaction_survives_a_restart_and_its_marker_decides_after(tmp_path, sink_type):
    sink = sink_type()
    wal = open_wal(tmp_path)
    first = persister(tmp_path, sink, wal, Checkpoint())
    log = Log()
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        before = first.append([log.data(0, [b"before"])])
        await table_has(sink, {b"before"})
        open_txn = first.append([log.txn(0, [b"open1"]), log.txn(1, [b"open2"])], at_wal=True)
        after = [first.append([log.data(1, [b"after%d" % i])]) for i in range(3)]
        await durable(before, open_txn, *after)
        await table_has(sink, {b"before", b"after0", b"after1", b"after2"})
        # Checkpoints after the transaction's entry stay before it.
        stored = StateStore(tmp_path / "state").load()
        assert stored is not None and stored.wal_position is not None
        first.close()
        await first.wait_closed()
    wal.close()
    # The crash: the checkpoint's position is the end of the entry before the open transaction.
    wal = WriteAheadLog(tmp_path / "wal", fsync=False)
    recovered = recover_log(wal, StateStore(tmp_path / "state"))
    replayed = [a for _, entry in recovered.backlog for a in entry]
    assert [a.base_offset for a in replayed if a.partition == 0] == [1]  # the open transaction's first record
    assert recovered.checkpoint.end_offsets == {("t", 0): 2, ("t", 1): 4}
    second = persister(tmp_path, sink, wal, recovered.stored, backlog=recovered.backlog)
    log.state = LogState.from_checkpoint(recovered.checkpoint)
    async with trio.open_nursery() as nursery:
        await nursery.start(second.run)
        await second.wait_backlog_written()
        assert second.open_transactions == 1  # found again, still out of the table
        assert {r["value"] for r in sink.rows()} == {b"before", b"after0", b"after1", b"after2"}
        commit = second.append([log.marker(0, True), log.marker(1, True)])
        await durable(commit)
        await table_has(sink, {b"before", b"after0", b"after1", b"after2", b"open1", b"open2"})
        second.close()
        await second.wait_closed()
    wal.close()
    rows = [(r["partition"], r["offset"]) for r in sink.rows()]
    assert len(rows) == len(set(rows)) == 6  # replayed rows the table held were not written again


async def test_abort_after_a_restart_leaves_nothing(tmp_path):
    sink = WalReadingSink()
    wal = open_wal(tmp_path)
    first = persister(tmp_path, sink, wal, Checkpoint())
    log = Log()
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        t = first.append([log.txn(0, [b"x1", b"x2"])], at_wal=True)
        d = first.append([log.data(0, [b"kept"])])
        await durable(t, d)
        await table_has(sink, {b"kept"})
        first.close()
        await first.wait_closed()
    wal.close()
    wal = WriteAheadLog(tmp_path / "wal", fsync=False)
    recovered = recover_log(wal, StateStore(tmp_path / "state"))
    second = persister(tmp_path, sink, wal, recovered.stored, backlog=recovered.backlog)
    log.state = LogState.from_checkpoint(recovered.checkpoint)
    async with trio.open_nursery() as nursery:
        await nursery.start(second.run)
        await second.wait_backlog_written()
        abort = second.append([log.marker(0, False, epoch=EPOCH + 1)])  # a fence: the epoch moves on
        more = second.append([log.data(0, [b"later"])])
        await durable(abort, more)
        await table_has(sink, {b"kept", b"later"})
        assert second.open_transactions == 0
        second.close()
        await second.wait_closed()
    wal.close()
    stored = StateStore(tmp_path / "state").load()
    assert stored is not None
    # The producer's epoch on the partition is the fence's: its old epoch is refused after a restart too.
    state = LogState.from_checkpoint(stored)
    assert state.producers.check(PID, EPOCH, "t", 0, 2, 2).error_code == 47  # INVALID_PRODUCER_EPOCH


async def test_sync_table_returns_when_the_last_appends_are_a_transactions(tmp_path):
    # DeleteTopics' barrier: a group with nothing for the table (records held, a marker) still completes it.
    sink = WalReadingSink()
    wal = open_wal(tmp_path)
    p = persister(tmp_path, sink, wal, Checkpoint(), ack_on="spark")
    log = Log()
    async with trio.open_nursery() as nursery:
        await nursery.start(p.run)
        await durable(p.append([log.data(0, [b"d"])]))
        await durable(p.append([log.txn(0, [b"x"])], at_wal=True))
        with trio.fail_after(10):
            await p.sync_table()
        abort = p.append([log.marker(0, False)])
        with trio.fail_after(10):
            await p.sync_table()
        await durable(abort)
        assert {r["value"] for r in sink.rows()} == {b"d"} and p.stats.flushes == 1
        p.close()
        await p.wait_closed()
    wal.close()


@pytest.mark.parametrize("sink_type", [MemorySink, WalReadingSink])
async def test_a_moved_partitions_open_transaction_is_handed_over_with_its_records(tmp_path, sink_type):
    """A leader that hands a partition off (leadership through the database) gives its open transactions'
    appends to the next leader (``open_appends``: with their records, read back from the WAL where the
    sink reads them from there), then forgets them (``hand_over_open``): a marker here no longer releases
    them, the other partition's open transaction is kept, and the next leader adopts them as an open
    transaction's appends that its marker releases."""
    sink = sink_type()
    wal = open_wal(tmp_path)
    p = persister(tmp_path, sink, wal, Checkpoint())
    log = Log()
    async with trio.open_nursery() as nursery:
        await nursery.start(p.run)
        moved, kept = log.txn(0, [b"m1", b"m2"]), log.txn(1, [b"k1"])
        await durable(p.append([moved, kept], at_wal=True), p.append([log.data(0, [b"d1"])]))
        await table_has(sink, {b"d1"})
        handed = await trio.to_thread.run_sync(p.open_appends, "t", 0)
        # the records themselves, whatever the sink keeps of them
        assert [(a.base_offset, a.records, a.producer_id, a.base_sequence) for a in handed] == [
            (moved.base_offset, moved.records, PID, 0)]
        assert await trio.to_thread.run_sync(p.open_appends, "t", 2) == []
        assert p.hand_over_open("t", 0) == 1 and p.hand_over_open("t", 0) == 0
        assert p.open_transactions == 1  # partition 1's
        await durable(p.append([log.marker(0, True), log.marker(1, True)]))
        await table_has(sink, {b"d1", b"k1"})  # partition 0's records are the next leader's to write
        p.close()
        await p.wait_closed()
    wal.close()

    # The next leader (its own WAL) adopts them; the marker it gets releases them.
    sink, wal = sink_type(), open_wal(tmp_path / "next")
    p = persister(tmp_path / "next", sink, wal, Checkpoint())
    async with trio.open_nursery() as nursery:
        await nursery.start(p.run)
        await durable(p.append(handed, at_wal=True))
        assert p.open_transactions == 1 and sink.rows() == []
        await durable(p.append([log.marker(0, True)]))
        await table_has(sink, {b"m1", b"m2"})
        p.close()
        await p.wait_closed()
    wal.close()
