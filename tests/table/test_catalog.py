"""The catalog table against a real Spark session, a real embedded Hive metastore and real Parquet files.

Compaction, retention and the crash journal are driven through
``TableCatalog`` directly; the server's background maintenance and a reader
in another process are in ``tests/e2e/test_table.py``.
"""

from __future__ import annotations

import os
import threading
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import ConfigError, load_config
from pipeline.table.schema import ARROW_SCHEMA
from pipeline.table.catalog import Journal, TableCatalog, list_data_files, local_path
from pipeline.table.table_config import TableConfig, TopicTableConfig
from pipeline.table.layout import Granularity, add_time_partitions, plan_compaction, table_name_for_topic, DataFile
from tests.conftest import unique_database

UTC = timezone.utc
DAY0 = datetime(2026, 11, 20, tzinfo=UTC)


def rows(topic: str, n: int, start: datetime, step: timedelta, partition: int = 0, base: int = 0) -> pa.Table:
    return pa.Table.from_pylist([
        {"key": b"k", "value": b"v%d" % (base + i), "topic": topic, "partition": partition, "offset": base + i,
         "timestamp": start + i * step, "timestampType": 0, "headers": None}
        for i in range(n)
    ], schema=ARROW_SCHEMA)


@pytest.fixture
def catalog(spark, tmp_path):
    catalog = TableCatalog(spark, tmp_path / "data", TableConfig(
        database=unique_database(), target_file_bytes=1 << 20, compaction_min_files=3, file_delete_delay_ms=0,
        topics={"daily": TopicTableConfig(granularity=Granularity.DAY, retention_days=2)}))
    catalog.ensure()
    return catalog


def count(catalog: TableCatalog, where: str = "true") -> int:
    return catalog.spark.sql(f"SELECT count(*) FROM {catalog.records_table} WHERE {where}").collect()[0][0]


# -- sans-Spark rules -----------------------------------------------------------------

def test_time_partitions_are_utc_date_and_hour_and_null_without_a_timestamp():
    t = pa.Table.from_pylist([
        {"topic": "a", "timestamp": datetime(2026, 11, 23, 23, 59, tzinfo=UTC)},
        {"topic": "a", "timestamp": datetime(2026, 11, 24, 0, 0, tzinfo=UTC)},
        {"topic": "d", "timestamp": datetime(2026, 11, 24, 5, 0, tzinfo=UTC)},
        {"topic": "a", "timestamp": datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)},  # Kafka's -1
        {"topic": "a", "timestamp": None},
    ], schema=pa.schema([("topic", pa.string()), ("timestamp", pa.timestamp("us", tz="UTC"))]))
    out = add_time_partitions(t, frozenset({"d"}))
    assert out.column("date").to_pylist() == ["2026-11-23", "2026-11-24", "2026-11-24", None, None]
    assert out.column("hour").to_pylist() == [23, 0, None, None, None]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-10**12, 253_402_300_799_999_999)), max_size=40),
       st.lists(st.sampled_from(["a", "d"]), min_size=40, max_size=40))
def test_time_partitions_equal_arrows_own_utc_date_and_hour(micros, topics):
    """Against pyarrow's own calendar (``strftime``, ``hour``) on any timestamp up to year 9999."""
    ts = pa.array(micros, pa.timestamp("us", tz="UTC"))
    t = pa.table({"topic": pa.array(topics[:len(micros)], pa.string()), "timestamp": ts})
    out = add_time_partitions(t, frozenset({"d"}))
    valid = [m is not None and m >= 0 for m in micros]
    dates = pc.strftime(ts, format="%Y-%m-%d").to_pylist()
    hours = pc.hour(ts).to_pylist()
    assert out.column("date").to_pylist() == [d if ok else None for d, ok in zip(dates, valid)]
    assert out.column("hour").to_pylist() == [h if ok and topic == "a" else None
                                              for h, ok, topic in zip(hours, valid, topics)]


def test_compaction_plan():
    small = [DataFile(f"f{i}", 100) for i in range(5)]
    assert plan_compaction(small, 1000, 5) == 1
    assert plan_compaction(small[:4], 1000, 5) is None                   # too few small files
    assert plan_compaction([DataFile("big", 900), *small[:2]], 1000, 2) == 2  # 1100 bytes -> 2 files < 3
    assert plan_compaction([DataFile("a", 600), DataFile("b", 600)], 1000, 2) is None  # none small
    with pytest.raises(ValueError):
        plan_compaction(small, 1000, 1)


def test_table_names_for_topics_are_metastore_safe_and_distinct():
    assert table_name_for_topic("orders") == "orders"
    dotted, underscored = table_name_for_topic("a.b"), table_name_for_topic("a_b")
    assert dotted != underscored and dotted.startswith("a_b_")
    assert table_name_for_topic("Orders-V1") != table_name_for_topic("orders-v1")


def test_config_file_keys_and_errors(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('table.commit.interval.ms = 2000\n"file.delete.delay.ms" = 0\n'
                    '[topic."orders.v1"]\ntable.partition.granularity = "day"\ntable.retention.days = 7\n')
    config = load_config(good)
    assert config.server == {"table_commit_interval_ms": 2000}
    assert config.table.file_delete_delay_ms == 0
    assert config.table.topic("orders.v1") == TopicTableConfig(Granularity.DAY, 7)
    assert config.table.topic("other") == TopicTableConfig()
    assert config.sources["topic.orders.v1.table.retention.days"] == f"file:{good}"
    for text, named in [("table.comit.interval.ms = 1", "'table.comit.interval.ms'"),
                        ("table.commit.interval.ms = -5", "table.commit.interval.ms"),
                        ("table.commit.interval.ms = \"10s\"", "table.commit.interval.ms"),
                        ('[topic.t]\ntable.partition.granularity = "week"', "table.partition.granularity"),
                        ('[topic.t]\nretention = 1', "'retention'"),
                        ("not toml = = 1", "not valid TOML")]:
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=named.replace(".", r"\.").replace("'", "'")):
            load_config(bad)


# -- Spark -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_time_range_query_reads_only_its_partition_directories(catalog):
    # 24 hours of one topic, 10 records an hour, one commit per hour
    for h in range(24):
        catalog.write(rows("clicks", 10, DAY0 + timedelta(hours=h), timedelta(minutes=5), base=10 * h))
    df = catalog.spark.table(catalog.records_table).where(
        "topic = 'clicks' AND date = '2026-11-20' AND hour BETWEEN 10 AND 12")
    assert df.count() == 30
    files = df.inputFiles()
    assert files and all(any(f"/hour={h}/" in f for h in (10, 11, 12)) for f in files)
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "PartitionFilters: [" in plan and "(hour#" in plan  # pruned by the partition columns
    assert count(catalog) == 240


@pytest.mark.slow
def test_compaction_swaps_files_without_a_reader_ever_seeing_a_wrong_count(catalog):
    for i in range(8):  # 8 commits into one hour: 8 small files
        catalog.write(rows("orders", 50, DAY0 + timedelta(minutes=i), timedelta(seconds=1), base=50 * i))
    (partition,) = catalog.partitions()
    before = list_data_files(partition.location)
    assert len(before) == 8

    counts: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        session = catalog.spark.newSession()  # its own session state, the same catalog
        while not stop.is_set():
            try:
                counts.append(session.sql(f"SELECT count(*) FROM {catalog.records_table}").collect()[0][0])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        while len(counts) < 2:
            stop.wait(0.05)
        result = catalog.compact()
        catalog.write(rows("orders", 50, DAY0 + timedelta(minutes=30), timedelta(seconds=1), base=400))
        n = len(counts)
        while len(counts) < n + 2 and not errors:
            stop.wait(0.05)
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    assert result.compacted_partitions == 1 and (result.files_before, result.files_after) == (8, 1)
    assert counts == sorted(counts) and set(counts) <= {400, 450}, counts
    assert counts[-1] == 450
    # the partition now lives in the compacted directory: 1 merged file + the new commit's
    (partition,) = catalog.partitions()
    assert "/_compacted/topic=orders/date=2026-11-20/hour=0/v" in partition.location
    assert len(list_data_files(partition.location)) == 2
    # the old directory is gone (file.delete.delay.ms = 0), nothing else is pending
    assert not any(__import__("os").path.exists(f.path) for f in before)
    assert catalog.pending_deletions() == []
    offsets = sorted(r[0] for r in catalog.read().select("offset").collect())
    assert offsets == list(range(450))


@pytest.mark.slow
def test_replaced_files_wait_for_file_delete_delay(catalog):
    delayed = TableCatalog(catalog.spark, catalog.data_dir,
                           TableConfig(database=catalog.config.database, target_file_bytes=1 << 20,
                                       compaction_min_files=3, file_delete_delay_ms=60_000))
    for i in range(3):
        delayed.write(rows("orders", 5, DAY0, timedelta(seconds=1), base=5 * i))
    old = catalog.partitions()[0].location
    now = int(DAY0.timestamp() * 1000)
    delayed.maintain(now_ms=now)
    assert delayed.pending_deletions() == [old]
    assert __import__("os").path.isdir(local_path(old))      # a query planned before the swap can still read it
    delayed.maintain(now_ms=now + 59_000)
    assert __import__("os").path.isdir(local_path(old))
    delayed.maintain(now_ms=now + 60_000)
    assert delayed.pending_deletions() == [] and not __import__("os").path.exists(local_path(old))
    assert count(delayed) == 15


@pytest.mark.slow
def test_a_catalog_is_settled_once_its_records_table_exists(spark, tmp_path):
    """``TableCatalog.settled``: what a broker of a cluster asks at start holding the tables shared;
    False until ``ensure`` made the records table (then a start holds them exclusively for it)."""
    fresh = TableCatalog(spark, tmp_path / "data", TableConfig(database=unique_database()))
    try:
        assert not fresh.settled()
        fresh.ensure()
        assert fresh.settled()
    finally:
        spark.sql(f"DROP DATABASE IF EXISTS {fresh.config.database} CASCADE")


@pytest.mark.slow
def test_a_compaction_cut_short_before_its_swap_leaves_no_trace(catalog):
    for i in range(3):
        catalog.write(rows("orders", 5, DAY0, timedelta(seconds=1), base=5 * i))
    (partition,) = catalog.partitions()
    # a crash after the compacted copy was written but before the swap
    orphan = f"{catalog.table_dir}/_compacted/topic=orders/date=2026-11-20/hour=0/v1"
    catalog.read().where("false").write.parquet(orphan)
    journal = Journal(catalog.data_dir / "_pipeline" / "table-journal.json")
    journal.entries.append({"compacting": orphan, "replaces": partition.location, "partition": partition.values})
    journal.save()
    assert not catalog.settled()  # a start holds the tables exclusively for ensure()

    catalog.resume_journal()   # what ensure() does at start-up
    assert catalog.settled() and catalog.pending_deletions() == [orphan]
    catalog.maintain(now_ms=int(DAY0.timestamp() * 1000))
    import os

    assert not os.path.exists(orphan)
    assert count(catalog) == 15


@pytest.mark.slow
def test_a_compaction_cut_short_after_its_swap_keeps_what_was_committed_into_the_old_directory(catalog):
    """A broker died after its compaction's swap (``SET LOCATION``) and before it settled its journal
    entry, and a commit renamed a file into the replaced directory after the compaction listed it (the
    compacting broker's hold had lapsed: it was cut off). The next start (``resume_journal``) keeps the
    new directory and links that file into it, and only that one (the merged ones are in the new
    directory's copy): every row once."""
    from pipeline.table.catalog import partition_spec_sql

    for i in range(3):
        catalog.write(rows("orders", 5, DAY0, timedelta(seconds=1), base=5 * i))
    (partition,) = catalog.partitions()
    listed = list_data_files(partition.location)
    new = f"{catalog.table_dir}/_compacted/topic=orders/date=2026-11-20/hour=0/v1"
    os.makedirs(local_path(new))
    for f in listed:  # the compacted copy (here: the listed files themselves)
        os.link(f.path, os.path.join(local_path(new), os.path.basename(f.path)))
    journal = Journal(catalog.data_dir / "_pipeline" / "table-journal.json")
    journal.entries.append({"compacting": new, "replaces": partition.location, "partition": partition.values,
                            "table": catalog.records.name, "files": [os.path.basename(f.path) for f in listed]})
    journal.save()
    catalog.write(rows("orders", 5, DAY0, timedelta(seconds=1), base=15))  # committed after the listing
    catalog.spark.sql(f"ALTER TABLE {catalog.records.name} PARTITION ({partition_spec_sql(partition.values)}) "
                      f"SET LOCATION '{new}'")  # the swap; then the broker died
    assert count(catalog) == 15

    catalog.resume_journal()  # what ensure() does at start-up
    assert catalog.pending_deletions() == [partition.location]
    assert count(catalog) == 20
    offsets = [r[0] for r in catalog.read().select("offset").collect()]
    assert sorted(offsets) == list(range(20))


@pytest.mark.slow
def test_retention_drops_old_day_partitions_through_the_catalog(catalog):
    for d in range(5):  # 'daily' keeps 2 days, by day; 'orders' keeps everything, by hour
        catalog.write(rows("daily", 3, DAY0 + timedelta(days=d), timedelta(hours=1), base=3 * d))
        catalog.write(rows("orders", 2, DAY0 + timedelta(days=d), timedelta(hours=1), base=2 * d))
    daily = sorted((p["date"], p["hour"]) for p in catalog.partition_values() if p["topic"] == "daily")
    assert daily == [(f"2026-11-2{d}", None) for d in range(5)]  # one partition per day
    now = int((DAY0 + timedelta(days=4, hours=12)).timestamp() * 1000)
    result = catalog.maintain(now_ms=now)
    assert result.dropped_partitions == 2   # 11-20 and 11-21 are older than 2 days before 11-24 12:00
    kept = sorted(p["date"] for p in catalog.partition_values() if p["topic"] == "daily")
    assert kept == ["2026-11-22", "2026-11-23", "2026-11-24"]
    assert count(catalog, "topic = 'daily'") == 9
    assert count(catalog, "topic = 'orders'") == 10
    assert not list((catalog.data_dir / "tables" / "records" / "topic=daily").glob("date=2026-11-2[01]"))


def _pay_catalog(spark, tmp_path):
    """(database, catalog, formats) of a catalog in a database of its own whose topic "pay" is typed json
    (``id BIGINT, key STRING``), its tables created."""
    database = unique_database()
    config = TableConfig(database=database, topics={
        "pay": TopicTableConfig(value_format="json", value_schema="id BIGINT, key STRING")})
    catalog = TableCatalog(spark, tmp_path / "data", config)
    catalog.ensure()
    return database, catalog, catalog.value_formats()


@pytest.mark.slow
def test_typed_rows_and_dead_letters_land_and_a_changed_schema_is_refused_at_start(spark, tmp_path):
    from pipeline.table.typed import split_typed

    database, catalog, formats = _pay_catalog(spark, tmp_path)
    table = rows("pay", 3, DAY0, timedelta(seconds=1))
    values = [b'{"id": 1, "key": "a"}', b"{oops", b'{"id": 3}']
    table = table.set_column(table.column_names.index("value"), "value", pa.array(values, pa.binary()))
    catalog.write_flush(split_typed(table, formats))
    typed = spark.table(f"{database}.pay").orderBy("offset").collect()
    assert [(r["offset"], r["id"], r["value_key"]) for r in typed] == [(0, 1, "a"), (2, 3, None)]
    dead = spark.table(f"{database}.dead_letters").collect()
    assert [(r["topic"], r["offset"], r["value"]) for r in dead] == [("pay", 1, b"{oops")]
    assert "JSON" in dead[0]["error"]
    catalog.check_typed_tables(formats)   # unchanged: fine

    changed = TableCatalog(spark, tmp_path / "data", TableConfig(database=database, topics={
        "pay": TopicTableConfig(value_format="json", value_schema="id STRING")}))
    with pytest.raises(ValueError, match="topic 'pay': table .*pay has columns"):
        changed.check_typed_tables(changed.value_formats())
    with pytest.raises(ValueError, match="topic 'bad': value.schema"):
        TableCatalog(spark, tmp_path / "data", TableConfig(database=database, topics={
            "bad": TopicTableConfig(value_format="json")})).value_formats()


def test_a_second_brokers_first_typed_view_publication_keeps_the_tail_and_the_view(spark, tmp_path):
    """Two brokers publish one typed topic's live view (``publish_live_typed``), each through its own
    catalog: the second one's first publication finds the tail table made for the table's columns and
    only moves the view (``ALTER VIEW``), so a query between the two never misses the view. (It used
    to take the tail's ``_boundary`` column for a changed schema and drop both, so brokers of a
    cluster dropped each other's views: TABLE_OR_VIEW_NOT_FOUND on CI.)"""
    from pipeline.table.live import Boundary, format_to_json
    from pipeline.table.typed import split_typed

    database, catalog, formats = _pay_catalog(spark, tmp_path)
    table = rows("pay", 2, DAY0, timedelta(seconds=1))
    table = table.set_column(table.column_names.index("value"), "value",
                             pa.array([b'{"id": 1, "key": "a"}', b'{"id": 2, "key": "b"}'], pa.binary()))
    catalog.write_flush(split_typed(table, formats))

    def boundary(end: int) -> Boundary:
        return Boundary({("pay", 0): end}, stopped=True, topic="pay", value_format=format_to_json(formats["pay"]))

    assert catalog.publish_live_typed(boundary(1))
    statements: list[str] = []

    class Recorded:  # the real session; its SQL statements noted
        def __getattr__(self, name):
            return getattr(spark, name)

        def sql(self, text, *args, **kwargs):
            statements.append(text)
            return spark.sql(text, *args, **kwargs)

    second = TableCatalog(Recorded(), tmp_path / "data", catalog.config)  # type: ignore[arg-type]
    assert second.publish_live_typed(boundary(2))
    assert not [t for t in statements if t.lstrip().upper().startswith("DROP")], statements
    assert any(t.startswith("ALTER VIEW") for t in statements)
    assert [r["id"] for r in spark.sql(f"SELECT id FROM `{database}`.`pay_live` ORDER BY offset").collect()] == [1, 2]


def test_staged_typed_rows_commit_as_files_once_the_table_takes_them(spark, tmp_path):
    """A typed topic's staged files (``stage_typed``): the table's first rows go through a Spark
    append (it creates the table), later flushes are committed as files, a retry's ``exclude``
    leaves out rows already in, and files whose columns the table does not have go through Spark."""
    from pipeline.table.staging import StagedRecords, Staging, stage_flush
    from pipeline.table.typed import split_typed

    database, catalog, formats = _pay_catalog(spark, tmp_path)
    staging = Staging(str(tmp_path / "staging"))
    (tmp_path / "staging").mkdir()

    def flush(base: int, n: int):
        table = rows("pay", n, DAY0, timedelta(minutes=30), base=base)
        values = [b'{"id": %d, "key": "k%d"}' % (base + i, base + i) for i in range(n)]
        table = table.set_column(table.column_names.index("value"), "value", pa.array(values, pa.binary()))
        staged = stage_flush(split_typed(table, formats), staging)
        assert isinstance(staged.typed["pay"], StagedRecords) and staged.typed["pay"].num_rows == n
        return staged

    def ids():
        return [(r["offset"], r["id"], r["value_key"], r["hour"])
                for r in spark.table(f"{database}.pay").orderBy("offset").collect()]

    owned = catalog.typed_tables["pay"]
    first = flush(0, 3)
    assert catalog.commit_staged_typed(owned, first.typed["pay"]) == 0  # no table yet: a Spark append made it
    assert not any(os.path.exists(f.path) for f in first.typed["pay"].files)
    second = flush(3, 3)  # offsets 3..5, hours 0 and 1
    # as files this time (offsets 3 and 4 in hour 0, 5 in hour 1); offset 4 is "already in": left out
    assert catalog.commit_staged_typed(owned, second.typed["pay"], exclude={("pay", 0, 4)}) == 2
    assert not any(os.path.exists(f.path) for f in second.typed["pay"].files)
    assert ids() == [(0, 0, "k0", 0), (1, 1, "k1", 0), (2, 2, "k2", 1), (3, 3, "k3", 0), (5, 5, "k5", 1)]

    other = TableCatalog(spark, tmp_path / "data", TableConfig(database=database, topics={
        "pay": TopicTableConfig(value_format="json", value_schema="id BIGINT, key STRING, extra STRING")}))
    wider = split_typed(rows("pay", 1, DAY0, timedelta(minutes=1), base=6).set_column(
        1, "value", pa.array([b'{"id": 6, "key": "k6", "extra": "x"}'], pa.binary())), other.value_formats())
    staged = stage_flush(wider, staging).typed["pay"]
    with pytest.raises(Exception):  # noqa: B017 - not the table's columns: the Spark append refuses them
        catalog.commit_staged_typed(owned, staged)
    assert all(os.path.exists(f.path) for f in staged.files)  # kept for the retry
    assert ids()[-1][:2] == (5, 5)
