"""Recovery replays a large WAL backlog in flush-sized Spark writes, never one write of everything."""

from __future__ import annotations

from pipeline.persist.accumulator import FlushPolicy
from pipeline.log.batch import PartitionAppend
from pipeline.persist.recovery import recover
from pipeline.log.checkpoint import StateStore
from pipeline.log.wal import WriteAheadLog, encode_appends
from tests.e2e import raw_client as rc


class CountingSink:
    """The table side, in memory: every write's appends, and which offsets are already there."""

    def __init__(self, present: set[tuple[str, int, int]]) -> None:
        self.present = present
        self.writes: list[list[PartitionAppend]] = []

    def end_offsets(self, topics=None) -> dict[tuple[str, int], int]:
        return {}

    def present_offsets(self, ranges):
        return {p for p in self.present if (p[0], p[1]) in ranges}

    def to_table(self, appends):
        return list(appends)

    def write(self, table, exclude=None) -> None:
        self.writes.append(table)


def backlog(tmp_path, groups: int, per_group: int) -> list[PartitionAppend]:
    wal = WriteAheadLog(tmp_path / "wal", fsync=False)
    wal.open()
    appends, offset = [], 0
    for _ in range(groups):
        group = []
        for _ in range(per_group):
            records = rc.record_batch([b"v" * 100] * 4)
            group.append(PartitionAppend("t", 0, offset, records, 4, 0))
            offset += 4
        wal.append([encode_appends(group)])
        appends.extend(group)
    wal.close()
    return appends


def test_a_backlog_is_replayed_in_writes_of_at_most_the_policy(tmp_path):
    appends = backlog(tmp_path, groups=10, per_group=5)  # 50 appends, 200 records
    sink = CountingSink(present=set())
    result = recover(sink, WriteAheadLog(tmp_path / "wal", fsync=False), StateStore(tmp_path / "state"),
                     policy=FlushPolicy(max_records=30, max_bytes=1 << 30, linger_ms=0))
    assert result.replayed_records == 200
    assert [a.base_offset for w in sink.writes for a in w] == [a.base_offset for a in appends]
    assert all(sum(a.record_count for a in w) <= 32 for w in sink.writes)  # 30, plus at most one append
    assert len(sink.writes) == 7
    assert result.checkpoint.end_offsets == {("t", 0): 200}


def test_chunks_already_in_the_table_are_not_written_again(tmp_path):
    backlog(tmp_path, groups=4, per_group=5)  # 80 records
    sink = CountingSink(present={("t", 0, o) for o in range(40)})  # the first half landed before the crash
    result = recover(sink, WriteAheadLog(tmp_path / "wal", fsync=False), StateStore(tmp_path / "state"),
                     policy=FlushPolicy(max_records=20, max_bytes=1 << 30, linger_ms=0))
    assert result.replayed_records == 40 and result.skipped_records == 40
    assert [a.base_offset for w in sink.writes for a in w] == list(range(40, 80, 4))
