"""What ``BatchingPersister`` asks of its sink: the optional ``WalReadingSink`` and
``MaintainedSink`` methods are found by protocol, compaction without ``maintain`` is refused, and
maintenance runs only while this broker's turn (``maintains``: the controller's, in a cluster)."""

from __future__ import annotations

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
