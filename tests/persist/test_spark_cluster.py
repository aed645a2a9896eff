"""SparkSink round trips beyond ``local[*]``: a Spark Connect server.

The server is real (``pipeline.persist.spark_cluster`` starts it on 127.0.0.1,
once per run: the ``connect_server`` fixture); Connect is a pure gRPC client, so
it runs in this process beside the ``spark`` fixture's ``local[2]``. A standalone
cluster is tested through the whole server (``tests/e2e/test_spark_cluster.py``:
its driver needs a process of its own, one SparkContext per JVM).
"""

from __future__ import annotations

import os

import pytest

from pipeline.table.schema import SPARK_SCHEMA
from pipeline.persist.spark_sink import SparkSink, build_spark_session, read_records, run_sql
from pipeline.table.table_config import TableConfig
from tests.conftest import unique_database
from tests.persist.test_spark_sink import read_back, rows_for, table_of

SQL = "SELECT topic, count(*) AS n, max(offset) AS last FROM records GROUP BY topic ORDER BY topic"


def two_flushes() -> list[list[dict]]:
    return [rows_for("orders", 0, 6) + rows_for("orders", 1, 3, base_offset=10), rows_for("123", 0, 5)]


def expected_rows() -> list[dict]:
    return sorted((r for flush in two_flushes() for r in flush),
                  key=lambda r: (r["topic"], r["partition"], r["offset"]))


pytestmark = pytest.mark.slow


def test_round_trip_through_spark_connect(connect_server, tmp_path):
    data_dir = tmp_path / "data"
    database = unique_database()
    sink = SparkSink(data_dir, remote=connect_server.url, table_config=TableConfig(database=database))
    sink.start()
    try:
        assert type(sink.spark).__module__ == "pyspark.sql.connect.session"
        assert read_records(sink.spark, database).count() == 0  # before any write
        for flush in two_flushes():
            sink.write(table_of(flush))
        sink.write(table_of([]))  # empty: no-op, no Spark call

        assert read_back(sink.spark, database) == expected_rows()
        df = read_records(sink.spark, database)
        assert df.schema == SPARK_SCHEMA
        assert run_sql(sink.spark, SQL, database) == (["topic", "n", "last"], [("123", 5, 4), ("orders", 9, 12)])
        records = data_dir / "tables" / "records"
        assert sorted(p.name for p in records.iterdir() if p.is_dir()) == ["topic=123", "topic=orders"]
    finally:
        sink.stop()


def test_a_flush_above_the_inline_limit_goes_through_connect(connect_spark, tmp_path):
    # Connect sends tables of 1 MiB or more (localRelationCacheThreshold) as
    # artifacts uploaded in 16 MiB chunks, not inline in the plan: ~20 MiB
    # takes that path with two chunks.
    n = 20_000
    value = os.urandom(1000)
    rows = [{**r, "value": value + b"%d" % r["offset"]} for r in rows_for("big", 0, n)]
    table = table_of(rows)
    assert table.nbytes > 16 * 1024 * 1024
    database = unique_database()
    sink = SparkSink(tmp_path / "data", spark=connect_spark, table_config=TableConfig(database=database))
    sink.start()
    sink.write(table)
    sink.stop()  # a given session keeps running
    assert run_sql(connect_spark, "SELECT count(*), count(DISTINCT value), max(offset) FROM records",
                   database) == (
        ["count(1)", "count(DISTINCT value)", "max(offset)"], [(n, n, n - 1)])


@pytest.mark.parametrize("kwargs", [{"master": "local[1]", "remote": "sc://127.0.0.1:1"}])
def test_master_and_remote_are_exclusive(kwargs, tmp_path):
    with pytest.raises(ValueError, match="not both"):
        SparkSink(tmp_path, **kwargs)
    with pytest.raises(ValueError, match="not both"):
        build_spark_session(**kwargs)
