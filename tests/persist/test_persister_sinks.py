"""What ``BatchingPersister`` asks of its sink: the optional ``WalReadingSink``, ``MaintainedSink`` and
``SteppedMaintenanceSink`` methods are found by protocol, compaction without ``maintain`` is refused,
maintenance runs only while this broker's turn (``maintains``: the controller's, in a cluster), and a
group that comes during a maintenance step is written before the next step."""

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
from pipeline.persist.persister import BatchingPersister, MaintainedSink, SteppedMaintenanceSink, WalReadingSink
from pipeline.table.catalog import MaintenanceResult


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
    assert not isinstance(MaintainedPlainSink(), SteppedMaintenanceSink)
    assert isinstance(SteppedSink(), MaintainedSink) and isinstance(SteppedSink(), SteppedMaintenanceSink)


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
async def test_maintenance_runs_while_this_broker_maintains_and_moves_to_it_an_interval_after_its_turn_comes(
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
        await trio.sleep(1.4)  # its next due time (6.0 s) goes to the partitions it took over
        assert sink.runs == 0 and persister.stats.maintenance_runs == 0
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


class SteppedSink(MaintainedPlainSink):
    """Maintenance in three steps, the first held until the test lets it go; what happens, in order."""

    def __init__(self) -> None:
        self.events: list[object] = []
        self.in_first_step, self.go_on, self.prepared = threading.Event(), threading.Event(), threading.Event()

    def to_table(self, appends: Sequence[PartitionAppend]) -> list[PartitionAppend]:
        self.prepared.set()
        return list(appends)

    def write(self, table: object, exclude: set[tuple[str, int, int]] | None = None) -> None:
        self.events.append(("write", [a.base_offset for a in table]))  # type: ignore[attr-defined]

    def maintain(self) -> MaintenanceResult:
        raise AssertionError("a stepped sink's maintenance runs by its steps")

    def maintenance_steps(self):
        self.events.append("step 1")
        self.in_first_step.set()
        assert self.go_on.wait(30)
        yield
        self.events.append("step 2")
        yield
        self.events.append("step 3")
        result = MaintenanceResult()
        result.compacted_partitions = 1
        return result


@pytest.mark.trio
async def test_a_group_that_comes_during_a_maintenance_step_is_written_before_the_next_step(
        tmp_path, patient_autojump_clock):
    """A compaction of many partitions held back every --ack-on spark acknowledgement for its whole
    length (a new controller's first one: ~11 s, issue 34); its steps now let the writer commit between
    them."""
    sink = SteppedSink()
    wal = WriteAheadLog(tmp_path / "wal", fsync=False)
    wal.open()
    persister = BatchingPersister(sink, wal, StateStore(tmp_path / "state"), Checkpoint(),  # type: ignore[arg-type]
                                  FlushPolicy(linger_ms=0), maintenance_interval_s=1.0, ack_on="spark")
    async with trio.open_nursery() as nursery:
        await nursery.start(persister.run)
        persister.mark_table_ready()
        with trio.fail_after(60):
            await trio.to_thread.run_sync(sink.in_first_step.wait)  # due after 1 s: its first step runs
            commit = persister.append([PartitionAppend("t", 0, 0, b"", 1, 0)])
            await trio.to_thread.run_sync(sink.prepared.wait)
            await trio.sleep(1)  # the group waits for the writer (the mock clock jumps once all is idle)
            assert sink.events == ["step 1"] and not commit.done
            sink.go_on.set()
            while persister.stats.maintenance_runs < 1:
                await trio.sleep(0.1)
        assert sink.events == ["step 1", ("write", [0]), "step 2", "step 3"]
        assert commit.done and persister.stats.compacted_partitions == 1
        nursery.cancel_scope.cancel()
    wal.close()


class FeedingSteppedSink(SteppedSink):
    """``SteppedSink`` whose every write brings the next group before it returns (a producer that never
    stops: a group always waits for the writer), up to ``feeds`` groups."""

    def __init__(self, feeds: int) -> None:
        super().__init__()
        self.feeds = feeds
        self.persister: BatchingPersister | None = None

    def write(self, table: object, exclude: set[tuple[str, int, int]] | None = None) -> None:
        super().write(table, exclude)
        if self.feeds > 0:
            self.feeds -= 1
            trio.from_thread.run(self._feed, [a.base_offset for a in table][-1] + 1)  # type: ignore[attr-defined]

    async def _feed(self, offset: int) -> None:
        assert self.persister is not None
        self.prepared.clear()
        self.persister.append([PartitionAppend("t", 0, offset, b"", 1, 0)])
        await trio.to_thread.run_sync(self.prepared.wait)
        await trio.sleep(1)  # its group waits for the writer (the mock clock jumps once all is idle)


@pytest.mark.trio
async def test_under_steady_load_one_group_is_written_between_two_maintenance_steps(
        tmp_path, patient_autojump_clock):
    """A group always waits for the writer (each write brings the next): between two steps the writer
    commits one, not every one that is ready, which would starve the maintenance as long as the load
    lasts (the trickle test's first compaction came 18 s late that way); the rest follow it."""
    sink = FeedingSteppedSink(feeds=3)
    wal = WriteAheadLog(tmp_path / "wal", fsync=False)
    wal.open()
    # A group of one record is full: it is prepared and sent while the writer still writes the one before
    # (a lingering group would wait for the writer to be free), as groups are under load.
    persister = BatchingPersister(sink, wal, StateStore(tmp_path / "state"), Checkpoint(),  # type: ignore[arg-type]
                                  FlushPolicy(linger_ms=0, max_records=1), maintenance_interval_s=1.0,
                                  ack_on="spark")
    sink.persister = persister
    async with trio.open_nursery() as nursery:
        await nursery.start(persister.run)
        persister.mark_table_ready()
        with trio.fail_after(60):
            await trio.to_thread.run_sync(sink.in_first_step.wait)
            persister.append([PartitionAppend("t", 0, 0, b"", 1, 0)])
            await trio.to_thread.run_sync(sink.prepared.wait)
            await trio.testing.wait_all_tasks_blocked()
            sink.go_on.set()
            while persister.stats.maintenance_runs < 1 or sum(e[0] == "write" for e in sink.events) < 4:
                await trio.sleep(1)
        assert sink.events[:5] == ["step 1", ("write", [0]), "step 2", ("write", [1]), "step 3"]
        assert [e for e in sink.events if e[0] == "write"] == [("write", [o]) for o in range(4)]
        nursery.cancel_scope.cancel()
    wal.close()
