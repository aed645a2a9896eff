"""RecordAccumulator: the flush conditions of Kafka's RecordAccumulator.ready, no clock."""

import pytest

from pipeline.persist.accumulator import FlushPolicy, FlushReason, RecordAccumulator
from pipeline.persist.batch import PartitionAppend


def append(records: int, size: int) -> PartitionAppend:
    return PartitionAppend("t", 0, 0, b"x" * size, records, 0)


def test_empty_is_never_ready():
    acc = RecordAccumulator(FlushPolicy(10, 100, 5))
    assert acc.ready(1e9) is None
    acc.close()
    assert acc.ready(1e9) is None
    assert acc.linger_deadline_ms() is None


def test_linger_counts_from_the_first_append():
    acc = RecordAccumulator(FlushPolicy(10, 1000, 5))
    acc.append([append(1, 1)], "a", now_ms=100)
    acc.append([append(1, 1)], "b", now_ms=104)
    assert acc.linger_deadline_ms() == 105
    assert acc.ready(104.9) is None
    assert acc.ready(105) is FlushReason.LINGER
    group = acc.drain(FlushReason.LINGER)
    assert group.waiters == ["a", "b"] and group.records == 2 and group.size_bytes == 2
    assert acc.pending == 0 and acc.linger_deadline_ms() is None


@pytest.mark.parametrize(
    "records,size,reason",
    [(10, 1, FlushReason.FULL_RECORDS), (1, 100, FlushReason.FULL_BYTES)],
)
def test_full_group_is_ready_at_once(records, size, reason):
    acc = RecordAccumulator(FlushPolicy(10, 100, 10_000))
    acc.append([append(records, size)], "w", now_ms=0)
    assert acc.ready(0) is reason


def test_closing_flushes_the_remainder_and_refuses_appends():
    acc = RecordAccumulator(FlushPolicy(10, 100, 10_000))
    acc.append([append(1, 1)], "w", now_ms=0)
    acc.close()
    assert acc.ready(0) is FlushReason.CLOSING
    with pytest.raises(RuntimeError):
        acc.append([append(1, 1)], "x", now_ms=0)


def test_a_request_is_never_split_across_groups():
    acc = RecordAccumulator(FlushPolicy(3, 10_000, 10_000))
    acc.append([append(2, 1), append(2, 1)], "big", now_ms=0)
    group = acc.drain(acc.ready(0))
    assert group.records == 4 and len(group.appends) == 2 and group.waiters == ["big"]


def test_invalid_policy():
    with pytest.raises(ValueError):
        FlushPolicy(0, 1, 1)
