"""SparkSink and the read path against a real local Spark session and real Parquet files."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from pipeline.table.schema import ARROW_SCHEMA, COLUMNS, SPARK_SCHEMA
from pipeline.persist.spark_sink import SparkSink, read_records, run_sql
from pipeline.table.table_config import TableConfig
from tests.conftest import unique_database

pytestmark = pytest.mark.slow

TS0 = 1_700_000_000_000  # ms
UTC = timezone.utc

# Spark's Kafka source schema (includeHeaders=true), spelled independently of ours.
KAFKA_SOURCE_DDL = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int, "
    "headers array<struct<key:string,value:binary>>"
)


def ts(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


def rows_for(topic: str, partition: int, n: int, base_offset: int = 0) -> list[dict]:
    return [
        {
            "key": None if i % 3 == 2 else b"k%d" % i,
            "value": None if i == 4 else b"value-%d" % i,
            "topic": topic,
            "partition": partition,
            "offset": base_offset + i,
            "timestamp": ts(TS0 + i),
            "timestampType": i % 2,
            "headers": (
                None if i % 2 else [{"key": "h", "value": b"%d" % i}, {"key": "nul", "value": None}]
            ),
        }
        for i in range(n)
    ]


def table_of(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)


def read_back(spark, database) -> list[dict]:
    """All rows, sorted, as Python dicts with tz-aware UTC timestamps (via Arrow)."""
    df = read_records(spark, database).orderBy("topic", "partition", "offset")
    return df.toArrow().to_pylist()


@pytest.fixture
def database() -> str:
    return unique_database()


@pytest.fixture
def sink(spark, tmp_path, database):
    sink = SparkSink(tmp_path / "data", spark=spark, table_config=TableConfig(database=database))
    sink.start()
    yield sink
    sink.stop()


def test_two_topics_round_trip_exactly(spark, sink, database):
    orders = rows_for("orders", 0, 6) + rows_for("orders", 1, 3, base_offset=10)
    numeric = rows_for("123", 0, 5)
    sink.write(table_of(orders))
    sink.write(table_of(numeric))

    got = read_back(spark, database)
    expected = sorted(orders + numeric, key=lambda r: (r["topic"], r["partition"], r["offset"]))
    assert got == expected

    df = read_records(spark, database)
    assert df.columns == list(COLUMNS)
    assert df.schema == SPARK_SCHEMA
    assert df.schema == spark.createDataFrame([], KAFKA_SOURCE_DDL).schema
    # a topic named like a number stays a string
    assert [r.topic for r in df.select("topic").distinct().collect()].count("123") == 1


def test_the_table_is_in_the_catalog_partitioned_by_topic_date_and_hour(spark, sink, database, tmp_path):
    sink.write(table_of(rows_for("orders", 0, 3)))
    sink.write(table_of(rows_for("123", 0, 2)))
    sink.write(table_of(rows_for("orders", 0, 2, base_offset=3)))

    table = spark.catalog.getTable(f"{database}.records")
    assert table.tableType == "EXTERNAL"
    described = {r[0]: r[1] for r in spark.sql(f"DESCRIBE TABLE EXTENDED {database}.records").collect()}
    assert described["Provider"] == "parquet"
    assert described["Location"] == f"file:{tmp_path / 'data' / 'tables' / 'records'}"
    # TS0 is 2023-11-14 22:13:20 UTC
    assert sorted(r[0] for r in spark.sql(f"SHOW PARTITIONS {database}.records").collect()) == [
        "topic=123/date=2023-11-14/hour=22", "topic=orders/date=2023-11-14/hour=22"]
    records = tmp_path / "data" / "tables" / "records"
    hour_dir = records / "topic=orders" / "date=2023-11-14" / "hour=22"
    # one file per commit (small flushes are coalesced), the partition columns only in the path
    import pyarrow.parquet as pq

    files = sorted(hour_dir.glob("*.parquet"))
    assert len(files) == 2
    assert not {"topic", "date", "hour"} & set(pq.read_schema(files[0]).names)


def test_run_sql_counts_per_topic(spark, sink, database):
    sink.write(table_of(rows_for("orders", 0, 4) + rows_for("123", 0, 2)))
    sink.write(table_of(rows_for("orders", 1, 3)))

    columns, rows = run_sql(
        spark, "SELECT topic, count(*) AS n, max(offset) AS last FROM records GROUP BY topic ORDER BY topic",
        database,
    )
    assert columns == ["topic", "n", "last"]
    assert rows == [("123", 2, 1), ("orders", 7, 3)]


def test_run_sql_reads_the_live_view_as_records_unless_committed(spark, sink, database):
    """``pipeline sql``'s ``records`` is the live view (``--committed``: the table): here published
    ``stopped`` (no tail, no broker) at ends below the table's, so the view is the table's rows below
    them, through the view's own text in the catalog."""
    from pipeline.table.live import Boundary

    sink.write(table_of(rows_for("orders", 0, 6) + rows_for("orders", 1, 2)))
    sink.catalog.publish_live(Boundary({("orders", 0): 4, ("orders", 1): 2}, stopped=True))
    query = "SELECT partition, count(*) AS n, max(offset) AS last FROM records GROUP BY 1 ORDER BY 1"
    assert run_sql(spark, query, database, live=True)[1] == [(0, 4, 3), (1, 2, 1)]
    assert run_sql(spark, query, database)[1] == [(0, 6, 5), (1, 2, 1)]
    # the table by its full name, whatever `records` names
    assert run_sql(spark, f"SELECT count(*) FROM {database}.records", database, live=True)[1] == [(8,)]


def test_empty_table_write_is_a_noop(spark, sink, database, tmp_path):
    records = tmp_path / "data" / "tables" / "records"
    sink.write(ARROW_SCHEMA.empty_table())
    assert not list(records.rglob("*.parquet"))

    sink.write(table_of(rows_for("orders", 0, 2)))
    files_before = sorted(str(p) for p in records.rglob("*"))
    sink.write(ARROW_SCHEMA.empty_table())
    assert sorted(str(p) for p in records.rglob("*")) == files_before


def test_reading_before_any_write_gives_an_empty_table(spark, sink, database):
    df = read_records(spark, database)
    assert df.schema == SPARK_SCHEMA
    assert df.count() == 0
    assert run_sql(spark, "SELECT count(*) AS n FROM records", database) == (["n"], [(0,)])


def test_start_is_idempotent_and_keeps_the_rows(spark, sink, database, tmp_path):
    sink.write(table_of(rows_for("orders", 0, 3)))
    again = SparkSink(tmp_path / "data", spark=spark, table_config=TableConfig(database=database))
    again.start()
    assert read_records(spark, database).count() == 3


def test_wrong_columns_are_rejected(sink):
    bad = table_of(rows_for("orders", 0, 1)).drop_columns(["headers"])
    with pytest.raises(ValueError, match="not the records columns"):
        sink.write(bad)


def test_stop_leaves_a_given_session_running(spark, tmp_path):
    sink = SparkSink(tmp_path / "data", spark=spark, table_config=TableConfig(database=unique_database()))
    sink.start()
    sink.stop()
    assert spark.range(3).count() == 3
