"""RecordAccumulator: the flush conditions of Kafka's RecordAccumulator.ready, no clock."""

import pytest

from pipeline.persist.accumulator import FlushPolicy, FlushReason, RecordAccumulator
from pipeline.log.batch import PartitionAppend


def append(records: int, size: int) -> PartitionAppend:
    return PartitionAppend("t", 0, 0, b"x" * size, records, 0)


def test_empty_is_never_ready():
    acc = RecordAccumulator(FlushPolicy(10, 100, 5))
    assert acc.ready(1e9) is None
    acc.close()
    assert acc.ready(1e9) is None
    assert acc.deadline_ms() is None


def test_linger_counts_from_the_first_append():
    acc = RecordAccumulator(FlushPolicy(10, 1000, 5))
    acc.append([append(1, 1)], "a", now_ms=100)
    acc.append([append(1, 1)], "b", now_ms=104)
    assert acc.deadline_ms() == 105
    assert acc.ready(104.9) is None
    assert acc.ready(105) is FlushReason.LINGER
    group = acc.drain(FlushReason.LINGER)
    assert group.waiters == ["a", "b"] and group.records == 2 and group.size_bytes == 2
    assert acc.pending == 0 and acc.deadline_ms() is None


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


def test_a_group_that_grew_past_its_limits_is_drained_in_limit_sized_groups():
    # The flusher was busy while six requests arrived: each drain takes whole waiters up to the first
    # that reaches max_bytes (as a free flusher would have), the rest stays with its own linger clock.
    acc = RecordAccumulator(FlushPolicy(max_records=1000, max_bytes=10, linger_ms=5))
    for i, (records, size) in enumerate([(1, 4), (2, 4), (1, 4), (3, 12), (1, 1), (1, 1)]):
        acc.append([append(records, size), append(0, 0)], f"w{i}", now_ms=100 + i)
    assert acc.ready(100) is FlushReason.FULL_BYTES
    first = acc.drain(FlushReason.FULL_BYTES)
    assert first.waiters == ["w0", "w1", "w2"] and first.records == 4 and first.size_bytes == 12
    assert len(first.appends) == 6 and first.reason is FlushReason.FULL_BYTES
    assert acc.pending == 3 and acc.records == 5 and acc.size_bytes == 14
    assert acc.deadline_ms() == 103 + 5
    second = acc.drain(FlushReason.FULL_BYTES)
    assert second.waiters == ["w3"] and second.records == 3 and second.size_bytes == 12
    assert acc.ready(108.9) is None and acc.ready(109) is FlushReason.LINGER  # w4 appended at 104
    third = acc.drain(FlushReason.LINGER)
    assert third.waiters == ["w4", "w5"] and [a.record_count for a in third.appends] == [1, 0, 1, 0]
    assert acc.pending == 0 and acc.records == 0 and acc.size_bytes == 0 and acc.deadline_ms() is None


def test_drained_groups_keep_every_append_once_in_order():
    acc = RecordAccumulator(FlushPolicy(max_records=7, max_bytes=1 << 30, linger_ms=0))
    sent, per_waiter = [], {}
    for i in range(50):
        batch = [PartitionAppend("t", 0, i * 10 + j, b"v", 1 + (i + j) % 4, 0) for j in range(i % 3 + 1)]
        sent.extend(batch)
        per_waiter[i] = sum(a.record_count for a in batch)
        acc.append(batch, i, now_ms=i)
    groups = []
    while acc.pending:
        groups.append(acc.drain(FlushReason.CLOSING))
    assert [a for g in groups for a in g.appends] == sent
    assert [w for g in groups for w in g.waiters] == list(range(50))
    for g in groups[:-1]:  # full, and it would not have been without its last waiter
        assert g.records >= 7 and g.records - per_waiter[g.waiters[-1]] < 7
    assert all(g.records == sum(a.record_count for a in g.appends) for g in groups)


def test_an_idle_group_big_enough_goes_before_its_linger():
    acc = RecordAccumulator(FlushPolicy(max_records=1000, max_bytes=10_000, linger_ms=10_000,
                                        idle_ms=1000, idle_min_bytes=50))
    acc.append([append(1, 30)], "a", now_ms=0)
    assert acc.deadline_ms() == 10_000  # 30 bytes: below idle_min_bytes, only linger applies
    acc.append([append(1, 30)], "b", now_ms=500)
    assert acc.deadline_ms() == 1500  # 60 bytes, last append at 500
    assert acc.ready(1499) is None
    acc.append([append(1, 30)], "c", now_ms=1400)  # still arriving: not idle
    assert acc.ready(1500) is None and acc.deadline_ms() == 2400
    assert acc.ready(2400) is FlushReason.IDLE
    assert acc.drain(FlushReason.IDLE).waiters == ["a", "b", "c"]
    assert acc.deadline_ms() is None


def test_idle_zero_means_linger_only():
    acc = RecordAccumulator(FlushPolicy(max_records=1000, max_bytes=10_000, linger_ms=10_000))
    acc.append([append(1, 30)], "a", now_ms=0)
    assert acc.ready(9_999) is None and acc.deadline_ms() == 10_000
