"""SparkSink and the read path against a real local Spark session and real Parquet files."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from pipeline.persist.schema import ARROW_SCHEMA, COLUMNS, SPARK_SCHEMA
from pipeline.persist.spark_sink import SparkSink, read_records, run_sql

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


def read_back(spark, data_dir) -> list[dict]:
    """All rows, sorted, as Python dicts with tz-aware UTC timestamps (via Arrow)."""
    df = read_records(spark, data_dir).orderBy("topic", "partition", "offset")
    return df.toArrow().to_pylist()


@pytest.fixture
def sink(spark, tmp_path):
    sink = SparkSink(tmp_path / "data", spark=spark)
    sink.start()
    yield sink
    sink.stop()


def test_two_topics_round_trip_exactly(spark, sink, tmp_path):
    orders = rows_for("orders", 0, 6) + rows_for("orders", 1, 3, base_offset=10)
    numeric = rows_for("123", 0, 5)
    sink.write(table_of(orders))
    sink.write(table_of(numeric))

    assert sink.records_path == os.path.join(str(tmp_path), "data", "records")
    got = read_back(spark, tmp_path / "data")
    expected = sorted(orders + numeric, key=lambda r: (r["topic"], r["partition"], r["offset"]))
    assert got == expected

    df = read_records(spark, tmp_path / "data")
    assert df.columns == list(COLUMNS)
    assert df.schema == SPARK_SCHEMA
    assert df.schema == spark.createDataFrame([], KAFKA_SOURCE_DDL).schema
    # a topic named like a number stays a string
    assert [r.topic for r in df.select("topic").distinct().collect()].count("123") == 1


def test_directory_layout_is_partitioned_by_topic(sink, tmp_path):
    sink.write(table_of(rows_for("orders", 0, 3)))
    sink.write(table_of(rows_for("123", 0, 2)))
    sink.write(table_of(rows_for("orders", 0, 2, base_offset=3)))

    records = tmp_path / "data" / "records"
    assert sorted(p.name for p in records.iterdir() if p.is_dir()) == ["topic=123", "topic=orders"]
    for topic_dir in ("topic=123", "topic=orders"):
        assert list((records / topic_dir).glob("*.parquet"))
    # the topic lives in the path only, not in the files
    import pyarrow.parquet as pq

    some_file = next((records / "topic=orders").glob("*.parquet"))
    assert "topic" not in pq.read_schema(some_file).names


def test_run_sql_counts_per_topic(spark, sink, tmp_path):
    sink.write(table_of(rows_for("orders", 0, 4) + rows_for("123", 0, 2)))
    sink.write(table_of(rows_for("orders", 1, 3)))

    columns, rows = run_sql(
        spark, tmp_path / "data",
        "SELECT topic, count(*) AS n, max(offset) AS last FROM records GROUP BY topic ORDER BY topic",
    )
    assert columns == ["topic", "n", "last"]
    assert rows == [("123", 2, 1), ("orders", 7, 3)]


def test_empty_table_write_is_a_noop(spark, sink, tmp_path):
    sink.write(ARROW_SCHEMA.empty_table())
    assert not (tmp_path / "data").exists()

    sink.write(table_of(rows_for("orders", 0, 2)))
    files_before = sorted(str(p) for p in (tmp_path / "data").rglob("*"))
    sink.write(ARROW_SCHEMA.empty_table())
    assert sorted(str(p) for p in (tmp_path / "data").rglob("*")) == files_before


def test_reading_before_any_write_gives_an_empty_table(spark, tmp_path):
    df = read_records(spark, tmp_path / "nothing-here")
    assert df.schema == SPARK_SCHEMA
    assert df.count() == 0
    assert run_sql(spark, tmp_path / "nothing-here", "SELECT count(*) AS n FROM records") == (
        ["n"], [(0,)]
    )


def test_wrong_columns_are_rejected(sink):
    bad = table_of(rows_for("orders", 0, 1)).drop_columns(["headers"])
    with pytest.raises(ValueError, match="not the records columns"):
        sink.write(bad)


def test_stop_leaves_a_given_session_running(spark, tmp_path):
    sink = SparkSink(tmp_path / "data", spark=spark)
    sink.start()
    sink.stop()
    assert spark.range(3).count() == 3
