"""What ``BatchingPersister`` asks of its sink: the optional ``WalReadingSink`` and
``MaintainedSink`` methods are found by protocol, and compaction without ``maintain`` is refused."""

from __future__ import annotations

from typing import Sequence

import pytest

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
