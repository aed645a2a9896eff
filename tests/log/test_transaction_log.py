"""The log's side of transactions (issue 22): markers, producer epochs, the last stable offset.

Markers are checked against kafka-python's reader (an independent RecordBatch v2 implementation);
the rest is the sans-I/O state of ``pipeline.log``.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from pipeline.log.control import ABORT, COMMIT, CONTROL, DATA, batch_kind, build_marker, marker_type
from pipeline.log.partition import Location, PartitionLog
from pipeline.log.producer_state import ProducerStateManager, Verdict
from tests.e2e import raw_client as rc

INVALID_PRODUCER_EPOCH = 47


@given(pid=st.integers(0, 2**63 - 1), epoch=st.integers(0, 32767), commit=st.booleans(),
       coordinator_epoch=st.integers(-(2**31), 2**31 - 1), ts=st.integers(0, 2**42))
def test_marker_reads_back_as_kafka_writes_it(pid, epoch, commit, coordinator_epoch, ts):
    control = COMMIT if commit else ABORT
    data = build_marker(pid, epoch, control, coordinator_epoch, ts)
    batch = DefaultRecordBatch(data)
    assert batch.validate_crc()
    assert batch.is_control_batch and batch.is_transactional
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (pid, epoch, -1)
    [record] = list(batch)
    assert record.key == (0).to_bytes(2, "big") + int(control).to_bytes(2, "big")  # version 0, type
    assert record.value == (0).to_bytes(2, "big") + coordinator_epoch.to_bytes(4, "big", signed=True)
    assert record.timestamp == ts
    assert marker_type(data) is control and batch_kind(data) == CONTROL


def test_batch_kind_of_data_and_stripped_appends():
    assert batch_kind(rc.record_batch([b"x"])) == DATA
    assert batch_kind(b"") == DATA
    with pytest.raises(ValueError):
        marker_type(rc.record_batch([b"x"]))


def test_marker_with_a_newer_epoch_fences_the_old_one_and_the_new_starts_at_zero():
    producers = ProducerStateManager()
    producers.update(9, 0, "t", 0, 0, 4, 100)
    producers.end_transaction(9, 0, "t", 0)  # a commit at the same epoch: the sequence goes on
    assert producers.check(9, 0, "t", 0, 5, 5).verdict is Verdict.APPEND
    producers.end_transaction(9, 1, "t", 0)  # a fence: abort with the bumped epoch
    assert producers.check(9, 0, "t", 0, 5, 5).error_code == INVALID_PRODUCER_EPOCH
    assert producers.check(9, 0, "t", 0, 0, 0).error_code == INVALID_PRODUCER_EPOCH  # even from 0
    assert producers.check(9, 1, "t", 0, 0, 0).verdict is Verdict.APPEND
    # The epoch-only entry survives a snapshot.
    restored = ProducerStateManager()
    restored.restore(producers.snapshot())
    assert restored.check(9, 0, "t", 0, 0, 0).error_code == INVALID_PRODUCER_EPOCH


def test_applying_a_batch_twice_or_an_older_epoch_changes_nothing():
    producers = ProducerStateManager()
    producers.update(9, 1, "t", 0, 0, 1, 10)
    producers.update(9, 1, "t", 0, 2, 3, 12)
    before = producers.snapshot()
    producers.update(9, 1, "t", 0, 0, 1, 10)  # replayed
    producers.update(9, 0, "t", 0, 7, 7, 20)  # an older epoch, applied late
    assert producers.snapshot() == before


def _loc(base: int, end: int) -> Location:
    return Location(base, end, 0, base * 10, 10, 0)


def test_last_stable_offset_and_aborted_transactions():
    plog = PartitionLog("t", 0)
    plog.index(_loc(0, 2))                 # plain records 0-1
    plog.index(_loc(2, 4))                 # producer 5's transaction starts at 2
    plog.transaction_started(5, 2)
    plog.index(_loc(4, 5))                 # producer 6's at 4
    plog.transaction_started(6, 4)
    plog.advance_high_watermark(5)
    assert plog.last_stable_offset == 2
    assert plog.locations(0, 1 << 20, end=plog.last_stable_offset)[-1].end_offset == 2
    plog.index(_loc(5, 6))                 # 5 aborts: marker at 5
    plog.transaction_ended(5, 5, aborted=True)
    plog.advance_high_watermark(6)
    assert plog.last_stable_offset == 4    # 6 is still open
    plog.index(_loc(6, 7))                 # 6 commits
    plog.transaction_ended(6, 6, aborted=False)
    plog.advance_high_watermark(7)
    assert plog.last_stable_offset == 7 == plog.high_watermark
    assert plog.aborted_transactions(0, 7) == [(5, 2)]
    assert plog.aborted_transactions(6, 7) == []    # ended before the read
    assert plog.aborted_transactions(0, 2) == []    # starts after it
    # Retention of the WAL past the aborted transaction forgets it (the table has no aborted record).
    plog.index(Location(7, 8, 1, 0, 10, 0))
    plog.drop_segments_before(1)
    assert plog.aborted == []


def test_a_dead_brokers_wal_settles_its_transactions_by_the_markers_it_holds():
    """``settle_transactions`` (a dead broker's WAL drained): a transaction committed in the backlog goes to the
    table in its marker's entry, an aborted one never does, one without a marker stays open (for the
    partition's next leader); data records and other partitions are untouched; markers are never rows."""
    from pipeline.log.batch import PartitionAppend
    from pipeline.log.control import TRANSACTIONAL
    from pipeline.log.wal import WalPosition
    from pipeline.persist.recovery import settle_transactions

    def txn(pid: int, partition: int, base: int) -> PartitionAppend:
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True, producer_id=pid,
                                            producer_epoch=0, base_sequence=base, batch_size=1 << 20)
        builder.append(0, timestamp=0, key=None, value=b"v", headers=[])
        records = bytes(builder.build())
        assert batch_kind(records) == TRANSACTIONAL
        return PartitionAppend("t", partition, base, records, 1, 0, pid, 0, base)

    def data(partition: int, base: int) -> PartitionAppend:
        return PartitionAppend("t", partition, base, rc.record_batch([b"d"]), 1, 0)

    def marker(pid: int, partition: int, base: int, control) -> PartitionAppend:
        return PartitionAppend("t", partition, base, build_marker(pid, 0, control, 0, 0), 1, 0, pid, 0)

    committed, aborted, still_open = txn(1, 0, 0), txn(2, 0, 1), txn(3, 0, 2)
    other_partition = txn(1, 1, 0)  # producer 1's transaction on partition 1: no marker there yet
    backlog = [(WalPosition(0, 10), [committed, aborted, data(0, 3)]),
               (WalPosition(0, 20), [still_open, other_partition]),
               (WalPosition(0, 30), [marker(1, 0, 4, COMMIT), marker(2, 0, 5, ABORT), data(0, 6)])]
    settled, open_appends = settle_transactions(backlog)
    assert [(position, [(a.partition, a.base_offset) for a in appends]) for position, appends in settled] == [
        (WalPosition(0, 10), [(0, 3)]), (WalPosition(0, 30), [(0, 0), (0, 6)])]
    assert open_appends == [still_open, other_partition]


@given(base=st.integers(0, 2**62), count=st.integers(1, 2**31 - 1))
def test_an_empty_batch_reads_back_as_kafka_writes_one_covering_its_offsets(base, count):
    """``build_empty_batch``: offsets with no record left (markers, aborted records only in a moved
    partition's table), read by kafka-python's RecordBatch v2 reader as the log cleaner's empty batches."""
    from pipeline.log.control import build_empty_batch

    batch = DefaultRecordBatch(build_empty_batch(base, count))
    assert batch.validate_crc()
    assert (batch.base_offset, batch.next_offset, list(batch)) == (base, base + count, [])
    assert not batch.is_control_batch and not batch.is_transactional
