"""What ``BatchingPersister`` asks of its sink: the optional ``WalReadingSink`` and
``MaintainedSink`` methods are found by protocol, compaction without ``maintain`` is refused, and
maintenance runs only while this broker's turn (``maintains``: the controller's, in a cluster),
beside the writes for a cluster's shared tables and in the writer's slot otherwise."""

from __future__ import annotations

import threading
from typing import Sequence

import pytest
import trio
import trio.testing

from pipeline.log.batch import PartitionAppend
from pipeline.log.checkpoint import Checkpoint, StateStore
from pipeline.log.wal import WriteAheadLog
from pipeline.persist.accumulator import FlushPolicy
from pipeline.persist.persister import BatchingPersister, MaintainedSink, WalReadingSink
from pipeline.table.catalog import MaintenanceResult
from tests.e2e import raw_client as rc
from tests.requests.test_handler_trio import MemorySink


class PlainSink:
    """A GroupSink with neither optional method; nothing here is written."""

    def to_table(self, appends: Sequence[PartitionAppend]) -> list[PartitionAppend]:
        return list(appends)

    def write(self, table: object, exclude: set[tuple[str, int, int]] | None = None) -> None:
        pass

    def present_offsets(self, ranges: dict[tuple[str, int], tuple[int, int]]) -> set[tuple[str, int, int]]:
        return set()


class MaintainedPlainSink(PlainSink):
    def maintain(self) -> MaintenanceResult:
        return MaintenanceResult()


def _persister(tmp_path, sink: object, maintenance_interval_s: float | None) -> BatchingPersister:
    wal = WriteAheadLog(tmp_path / "wal", fsync=False)
    wal.open()
    return BatchingPersister(sink, wal, StateStore(tmp_path / "state"), Checkpoint(),  # type: ignore[arg-type]
                             FlushPolicy(linger_ms=0), maintenance_interval_s=maintenance_interval_s)


def test_compaction_interval_needs_a_sink_with_maintain(tmp_path):
    # Before, such a persister started and logged "table maintenance failed: ... no attribute
    # 'maintain'" at every interval; now the misconfiguration is refused where it is made.
    with pytest.raises(ValueError, match="no maintain"):
        _persister(tmp_path, PlainSink(), maintenance_interval_s=60.0)
    assert isinstance(_persister(tmp_path / "a", PlainSink(), None), BatchingPersister)
    assert isinstance(_persister(tmp_path / "b", MaintainedPlainSink(), 60.0), BatchingPersister)


def test_optional_methods_are_found_by_protocol():
    assert not isinstance(PlainSink(), WalReadingSink) and not isinstance(PlainSink(), MaintainedSink)
    assert isinstance(MaintainedPlainSink(), MaintainedSink)


class CountedSink(MaintainedPlainSink):
    def __init__(self) -> None:
        self.runs = 0

    def maintain(self) -> MaintenanceResult:
        self.runs += 1
        return MaintenanceResult()


@pytest.fixture
def patient_autojump_clock() -> trio.testing.MockClock:
    """Jumps only after 0.3 s of real idleness: ``maintain()`` in its worker thread is done long before."""
    return trio.testing.MockClock(autojump_threshold=0.3)


@pytest.mark.trio
async def test_maintenance_runs_while_this_broker_maintains_and_moves_to_it_when_its_turn_comes(
        tmp_path, patient_autojump_clock):
    sink, turn = CountedSink(), [False]
    wal = WriteAheadLog(tmp_path / "wal", fsync=False)
    wal.open()
    persister = BatchingPersister(sink, wal, StateStore(tmp_path / "state"), Checkpoint(),  # type: ignore[arg-type]
                                  FlushPolicy(linger_ms=0), maintenance_interval_s=1.0, maintains=lambda: turn[0])
    async with trio.open_nursery() as nursery:
        await nursery.start(persister.run)
        await trio.sleep(5.5)
        assert sink.runs == 0 and persister.stats.maintenance_runs == 0  # another broker's (the controller's)
        turn[0] = True  # that broker died: this one is the controller now
        with trio.fail_after(60):
            while persister.stats.maintenance_runs < 2:  # maintain() runs in a thread: no count by the clock
                await trio.sleep(0.5)
        turn[0] = False
        await trio.sleep(1.5)  # a run already under way ends
        runs = sink.runs
        await trio.sleep(5)
        assert sink.runs == runs
        nursery.cancel_scope.cancel()
    wal.close()


class StalledMaintenanceSink(MemorySink):
    """The in-memory table side whose ``maintain()`` stalls (a compaction's Spark job) until ``finish``."""

    def __init__(self) -> None:
        super().__init__()
        self.maintaining = threading.Event()
        self.finish = threading.Event()

    def maintain(self) -> MaintenanceResult:
        self.maintaining.set()
        self.finish.wait(60)
        return MaintenanceResult()


@pytest.mark.trio
@pytest.mark.parametrize("beside", [True, False], ids=["beside-writes", "in-the-writers-slot"])
async def test_a_commit_during_a_long_maintenance_waits_for_it_only_in_the_writers_slot(
        tmp_path, beside, patient_autojump_clock):
    """``maintenance_beside_writes`` (a cluster's shared tables, whose maintenance holds their lock
    itself): with ``--ack-on spark`` an append made while a maintenance runs is committed and
    acknowledged before the maintenance ends. Without it (tables of this process alone) the commit
    waits for the maintenance, which must not swap a partition a write adds files to. (Issue 34:
    a new controller's first compaction held back its commits and acknowledgements for 2-7 s.)"""
    sink, turn = StalledMaintenanceSink(), [False]
    wal = WriteAheadLog(tmp_path / "wal", fsync=False)
    wal.open()
    persister = BatchingPersister(sink, wal, StateStore(tmp_path / "state"), Checkpoint(),  # type: ignore[arg-type]
                                  FlushPolicy(linger_ms=0), ack_on="spark", maintenance_interval_s=1.0,
                                  maintains=lambda: turn[0], maintenance_beside_writes=beside)

    async def committed(offset: int):
        return persister.append([PartitionAppend("t", 0, offset, rc.record_batch([b"a", b"b"]), 2, 0)])

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(persister.run)
            first = await committed(0)  # the write path warm (imports), before any maintenance
            with trio.fail_after(60):
                while not first.done:
                    await trio.sleep(0.5)
            turn[0] = True
            with trio.fail_after(60):
                while not sink.maintaining.is_set():
                    await trio.sleep(0.5)
            commit = await committed(2)
            if beside:
                with trio.fail_after(60):
                    while not commit.done:
                        await trio.sleep(0.5)
                assert not sink.finish.is_set()  # the maintenance still stalled
            else:
                await trio.sleep(10)
                assert not commit.done
            sink.finish.set()
            with trio.fail_after(60):
                while not commit.done:
                    await trio.sleep(0.5)
            assert commit.error is None and [r["offset"] for r in sink.rows()] == [0, 1, 2, 3]
            nursery.cancel_scope.cancel()
    finally:
        sink.finish.set()
        wal.close()
