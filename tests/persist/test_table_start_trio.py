"""The persister before its table side is up (issue 23: listen before Spark is ready).

``BatchingPersister(table_ready=False)`` acknowledges at the WAL and writes nothing to the
table; ``mark_table_ready`` lets the Spark stage write the recovery backlog first (minus the
rows the table already holds: a crash between a table commit and its checkpoint), then what
was appended meanwhile, each row once, checkpointed. Closed before the table is ready, it
waits for it (``table_start_wait_s``) and writes everything; when the table side does not come
(``abandon_table``, or the wait passes) it writes nothing and the WAL keeps everything for the next
start. ``recover_log`` rebuilds
offsets without the table. Real WAL files in tmp_path; the table side is the in-memory
``MemorySink`` of tests/requests/test_handler_trio.py (real Arrow decoding).
"""

from __future__ import annotations

import pytest
import trio

from pipeline.log.batch import PartitionAppend
from pipeline.log.checkpoint import Checkpoint, StateStore
from pipeline.log.wal import WriteAheadLog
from pipeline.persist.accumulator import FlushPolicy
from pipeline.persist.persister import BatchingPersister
from pipeline.persist.recovery import recover_log
from pipeline.table.arrow import appends_to_table
from tests.e2e import raw_client as rc
from tests.requests.test_handler_trio import MemorySink, WalReadingSink

pytestmark = pytest.mark.trio

PER_APPEND = 4


def appends(first_offset: int, n: int, partition: int = 0) -> list[PartitionAppend]:
    """``n`` appends of ``PER_APPEND`` records each to topic ``t``, from ``first_offset`` on."""
    return [PartitionAppend("t", partition, first_offset + i * PER_APPEND,
                            rc.record_batch([b"o%d" % (first_offset + i * PER_APPEND + j) for j in range(PER_APPEND)]),
                            PER_APPEND, 0) for i in range(n)]


def open_wal(tmp_path) -> WriteAheadLog:
    wal = WriteAheadLog(tmp_path / "wal", fsync=False)
    wal.open()
    return wal


def persister(tmp_path, sink: MemorySink, wal: WriteAheadLog, checkpoint: Checkpoint, **kwargs) -> BatchingPersister:
    return BatchingPersister(sink, wal, StateStore(tmp_path / "state"), checkpoint,  # type: ignore[arg-type]
                             FlushPolicy(max_records=8, linger_ms=0), **kwargs)


def open_unready(tmp_path) -> tuple[WriteAheadLog, MemorySink, BatchingPersister]:
    """A WAL, a table, and a persister on them whose table side is not up (it waits 120 s at close)."""
    wal = open_wal(tmp_path)
    sink = MemorySink()
    return wal, sink, persister(tmp_path, sink, wal, Checkpoint(), table_ready=False, table_start_wait_s=120.0)


async def acknowledged(p: BatchingPersister, batch: list[PartitionAppend]) -> None:
    """Append ``batch`` and wait for its acknowledgement (at the WAL)."""
    commit = p.append(batch)
    while not commit.done:
        await trio.sleep(0)
    assert commit.error is None


def offsets(sink: MemorySink) -> list[int]:
    return [row["offset"] for row in sink.rows()]


async def test_acknowledged_at_the_wal_before_the_table_then_backlog_first_each_row_once(tmp_path):
    # A first run whose Spark never came up: its appends are acknowledged at the WAL, none reach the table.
    sink = WalReadingSink()
    wal = open_wal(tmp_path)
    first = persister(tmp_path, sink, wal, Checkpoint(), table_ready=False, table_start_wait_s=0)  # no wait at close
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        commits = [first.append([a]) for a in appends(0, 3)]
        while not all(c.done for c in commits):
            await trio.sleep(0)
        assert all(c.error is None for c in commits)
        assert first.buffered_records == 3 * PER_APPEND and not sink.tables
        first.close()
        await first.wait_closed()
    wal.close()
    assert not sink.tables and StateStore(tmp_path / "state").load() is None

    # The restart: offsets come back from the WAL alone; the backlog is all three appends.
    wal = WriteAheadLog(tmp_path / "wal", fsync=False)
    recovered = recover_log(wal, StateStore(tmp_path / "state"))
    assert recovered.checkpoint.end_offsets == {("t", 0): 3 * PER_APPEND}
    assert recovered.stored.end_offsets == {} and recovered.backlog_records == 3 * PER_APPEND
    backlog = [a for _, entry in recovered.backlog for a in entry]
    assert [a.base_offset for a in backlog] == [0, 4, 8]

    # The table already holds the first append (the crash fell between a commit and its checkpoint).
    table = MemorySink()
    table.tables.append(appends_to_table(backlog[:1]))
    second = persister(tmp_path, table, wal, recovered.stored, backlog=recovered.backlog, table_ready=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(second.run)
        live = second.append(appends(3 * PER_APPEND, 2))
        while not live.done:
            await trio.sleep(0)
        assert live.error is None and len(table.tables) == 1  # acknowledged; the table untouched
        assert second.backlog_records == 3 * PER_APPEND and not second.table_ready
        second.mark_table_ready()
        await second.wait_backlog_written()
        await second.sync_table()
        second.close()
        await second.wait_closed()
    assert sorted(offsets(table)) == list(range(5 * PER_APPEND))  # every row once
    assert offsets(table)[:3 * PER_APPEND] == list(range(3 * PER_APPEND))  # the backlog before what came since
    saved = StateStore(tmp_path / "state").load()
    assert saved is not None and saved.end_offsets == {("t", 0): 5 * PER_APPEND}
    assert saved.topics == {"t": 1}
    wal.close()

    # Everything is checkpointed: the next start has no backlog.
    again = recover_log(WriteAheadLog(tmp_path / "wal", fsync=False), StateStore(tmp_path / "state"))
    assert again.backlog == [] and again.checkpoint.end_offsets == {("t", 0): 5 * PER_APPEND}


async def test_closed_before_the_table_is_ready_waits_for_it_then_writes_everything(tmp_path, autojump_clock):
    """A clean stop during start-up (issue 34): the Spark stage waits for the table side, then the
    table holds every acknowledged record, checkpointed: the next start has no backlog."""
    wal, sink, p = open_unready(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(p.run)
        await acknowledged(p, appends(0, 2, partition=1))
        p.close()
        await trio.sleep(100)  # Spark takes its time: the persister waits, within its 120 s
        assert not sink.tables and not p._done.is_set()
        p.mark_table_ready()
        await p.wait_closed()
    wal.close()
    assert sorted(offsets(sink)) == list(range(2 * PER_APPEND))
    recovered = recover_log(WriteAheadLog(tmp_path / "wal", fsync=False), StateStore(tmp_path / "state"))
    assert recovered.backlog_records == 0
    assert recovered.checkpoint.end_offsets == {("t", 1): 2 * PER_APPEND}


async def test_closed_before_the_table_is_ready_with_nothing_to_write_does_not_wait(tmp_path, autojump_clock):
    wal, sink, p = open_unready(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(p.run)
        closed_at = trio.current_time()
        p.close()
        await p.wait_closed()
        assert trio.current_time() - closed_at < 1  # no Spark start to wait for
    wal.close()
    assert not sink.tables


@pytest.mark.parametrize("how", ["abandoned", "wait passed"])
async def test_closed_before_a_table_that_does_not_come_writes_nothing_and_keeps_the_wal(tmp_path, autojump_clock,
                                                                                         how, caplog):
    wal, sink, p = open_unready(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(p.run)
        await acknowledged(p, appends(0, 2, partition=1))
        closed_at = trio.current_time()
        p.close()
        if how == "abandoned":  # Spark failed to start
            await trio.sleep(5)
            p.abandon_table()
        await p.wait_closed()  # returns although Spark never came up
        took = trio.current_time() - closed_at
    wal.close()
    assert not sink.tables
    if how == "abandoned":
        assert took < 6 and "stopping without the table side: 8 records stay in the WAL" in caplog.text
    else:
        assert 120 <= took < 121 and "Spark did not start within 120 s of the stop" in caplog.text
    recovered = recover_log(WriteAheadLog(tmp_path / "wal", fsync=False), StateStore(tmp_path / "state"))
    assert recovered.backlog_records == 2 * PER_APPEND
    assert recovered.checkpoint.end_offsets == {("t", 1): 2 * PER_APPEND}


async def test_recover_log_asks_the_table_only_without_a_checkpoint(tmp_path):
    asked: list[bool] = []

    def end_offsets() -> dict[tuple[str, int], int]:
        asked.append(True)
        return {("old", 0): 7}

    wal = WriteAheadLog(tmp_path / "wal", fsync=False)
    recovered = recover_log(wal, StateStore(tmp_path / "state"), end_offsets=end_offsets)
    assert asked and recovered.checkpoint.end_offsets == {("old", 0): 7}
    assert recovered.checkpoint.topics == {"old": 1}
    StateStore(tmp_path / "state").save(recovered.checkpoint)
    asked.clear()
    again = recover_log(WriteAheadLog(tmp_path / "wal", fsync=False), StateStore(tmp_path / "state"),
                        end_offsets=end_offsets)
    assert not asked and again.checkpoint.end_offsets == {("old", 0): 7}
