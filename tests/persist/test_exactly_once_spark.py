"""Exactly once across a crash between the table commit and the checkpoint, against real Spark.

The persister commits a flush to the tables, then saves the checkpoint (``pipeline.log.checkpoint``).
A process that dies between the two leaves rows in the tables that the checkpoint does not cover;
start-up recovery (``pipeline.persist.recovery.recover``) replays the WAL after the checkpoint and
must write only what is missing. It asks the table which offsets it holds
(``SparkGroupSink.present_offsets`` -> ``TableCatalog.read_positions`` over the records, typed and
dead-letter tables -> ``present_offsets``) and writes the rest (``SparkGroupSink.write(table,
exclude)`` -> ``FlushTables.without``). The persister's retry of a failed Spark write
(``BatchingPersister._write_spark``, attempt > 1) makes the same two calls.

Here the dying process is this one, stopped at the point of death: the flushes' Spark writes run for
real and the checkpoint write that would follow them is not made; a second flush dies between
``write_flush``'s Spark jobs (raw and typed rows committed, dead letters not). Then recovery runs on
the same data directory, and every row must be in its table exactly once.
"""

from __future__ import annotations

from collections import Counter

import pytest

from pipeline.log.batch import PartitionAppend
from pipeline.persist.group_sink import SparkGroupSink
from pipeline.persist.persister import offset_ranges
from pipeline.persist.recovery import recover
from pipeline.log.checkpoint import Checkpoint, StateStore
from pipeline.log.wal import WriteAheadLog, encode_appends
from pipeline.table.table_config import TableConfig, TopicTableConfig
from pipeline.table.typed import FlushTables
from tests.conftest import unique_database
from tests.e2e import raw_client as rc

RAW, TYPED = "clicks", "pay"
PER_FLUSH = 3  # records per topic per flush; the typed topic's second record of each flush does not parse


def flush_appends(n: int) -> list[PartitionAppend]:
    """Flush ``n`` (0-based): three raw records and three typed ones (one a dead letter) at offsets 3n..3n+2."""
    base = n * PER_FLUSH
    raw = rc.record_batch([f"click-{base + i}".encode() for i in range(PER_FLUSH)])
    typed = rc.record_batch([b'{"id": %d}' % (base + i) if i != 1 else b"{not json" for i in range(PER_FLUSH)])
    return [PartitionAppend(RAW, 0, base, raw, PER_FLUSH, 0), PartitionAppend(TYPED, 0, base, typed, PER_FLUSH, 0)]


def positions(spark, table: str) -> Counter:
    """(topic, partition, offset) -> how many rows of ``table`` have it."""
    return Counter((r[0], r[1], r[2]) for r in spark.table(table).select("topic", "partition", "offset").collect())


@pytest.mark.slow
def test_recovery_after_a_crash_between_table_commit_and_checkpoint_writes_every_row_once(spark, tmp_path):
    data = tmp_path / "data"
    config = TableConfig(database=unique_database(), topics={
        TYPED: TopicTableConfig(value_format="json", value_schema="id BIGINT")})
    # decode in this thread: the decode worker process changes where decoding runs, not what is written.
    sink = SparkGroupSink(data, spark=spark, table_config=config, decode_in_subprocess=False,
                          state_dir=tmp_path / "state")
    sink.start()
    store = StateStore(data / "_pipeline")
    wal = WriteAheadLog(tmp_path / "wal", fsync=False)
    wal.open()
    flushes = [flush_appends(n) for n in range(4)]
    ends = [wal.append([encode_appends(appends)]) for appends in flushes]

    # Flush 0: committed and checkpointed, as the persister does after every Spark commit.
    sink.write(sink.to_table(flushes[0]))
    store.save(Checkpoint(ends[0], {(RAW, 0): 3, (TYPED, 0): 3}, [], {RAW: 1, TYPED: 1}))
    # Flush 1: committed to every table; the process dies before saving the checkpoint.
    sink.write(sink.to_table(flushes[1]))
    # Flush 2: the process dies inside write_flush, after the raw and typed tables' Spark jobs.
    partial = sink.to_table(flushes[2])
    assert partial.dead_letters.num_rows == 1
    sink.catalog.write_flush(FlushTables(partial.records, partial.typed))
    # Flush 3: only in the WAL.
    wal.close()

    records, typed, dead = sink.catalog.records_table, sink.catalog.typed_tables[TYPED].name, \
        sink.catalog.dead_letters.name
    assert set(positions(spark, records)) == {(RAW, 0, o) for o in range(9)}  # the crash's state, for real
    assert set(positions(spark, dead)) == {(TYPED, 0, 1), (TYPED, 0, 4)}
    # A new leader's take-over reads the end offsets of the topics it takes only (the typed
    # topic's rows are in its own table and the dead letters').
    assert sink.end_offsets({RAW}) == {(RAW, 0): 9}
    assert sink.end_offsets({TYPED}) == {(TYPED, 0): 9}
    assert sink.end_offsets() == {(RAW, 0): 9, (TYPED, 0): 9}

    # The restart: recovery on the same data directory and WAL.
    result = recover(sink, WriteAheadLog(tmp_path / "wal", fsync=False), store)
    # After the checkpoint: flushes 1-3, 18 records; present: all 6 of flush 1, 3 raw + 2 typed of flush 2.
    assert (result.skipped_records, result.replayed_records) == (11, 7)
    assert result.checkpoint.end_offsets == {(RAW, 0): 12, (TYPED, 0): 12}
    assert store.load().end_offsets == {(RAW, 0): 12, (TYPED, 0): 12}

    def assert_every_row_once() -> None:
        got_records, got_typed, got_dead = positions(spark, records), positions(spark, typed), \
            positions(spark, dead)
        duplicated = {t: [k for k, n in c.items() if n > 1] for t, c in
                      [("records", got_records), ("typed", got_typed), ("dead letters", got_dead)]}
        assert duplicated == {"records": [], "typed": [], "dead letters": []}
        assert set(got_records) == {(RAW, 0, o) for o in range(12)}
        assert set(got_typed) == {(TYPED, 0, o) for o in range(12) if o % PER_FLUSH != 1}
        assert set(got_dead) == {(TYPED, 0, o) for o in range(12) if o % PER_FLUSH == 1}

    assert_every_row_once()
    assert [r["id"] for r in spark.table(typed).orderBy("offset").collect()] == [0, 2, 3, 5, 6, 8, 9, 11]

    # A retried write of flushes 1-3 (the persister's attempt > 1 after a write that did land):
    # the table is asked which offsets it holds, and those rows are not written again.
    appends = [a for f in flushes[1:] for a in f]
    present = sink.present_offsets(offset_ranges(appends))
    assert len(present) == 18
    sink.write(sink.to_table(appends), present)
    assert_every_row_once()
    sink.stop()
