"""SparkSink round trips beyond ``local[*]``: a standalone cluster and a Spark Connect server.

Both are real (``pipeline.persist.spark_cluster`` starts them on 127.0.0.1,
once per run: the ``standalone_cluster`` and ``connect_server`` fixtures).
A process has one SparkContext, and this one's is the ``spark`` fixture's
``local[2]``; so the standalone driver runs in a child process (this module,
run as ``python -m tests.persist.test_spark_cluster MASTER DATA_DIR``), while
Connect, a pure gRPC client, runs here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.table.schema import SPARK_SCHEMA
from pipeline.persist.spark_sink import SparkSink, build_spark_session, read_records, run_sql
from pipeline.table.catalog import TableConfig
from pipeline.table.layout import DEFAULT_DATABASE
from tests.conftest import unique_database
from tests.persist.test_spark_sink import read_back, rows_for, table_of

REPO = Path(__file__).resolve().parents[2]

SQL = "SELECT topic, count(*) AS n, max(offset) AS last FROM records GROUP BY topic ORDER BY topic"


def two_flushes() -> list[list[dict]]:
    return [rows_for("orders", 0, 6) + rows_for("orders", 1, 3, base_offset=10), rows_for("123", 0, 5)]


def expected_rows() -> list[dict]:
    return sorted((r for flush in two_flushes() for r in flush),
                  key=lambda r: (r["topic"], r["partition"], r["offset"]))


def standalone_round_trip(master_url: str, data_dir: str) -> dict:
    """The driver side, in a child process: write two flushes, read them back."""
    sink = SparkSink(data_dir, master=master_url)
    sink.start()
    try:
        for flush in two_flushes():
            sink.write(table_of(flush))
        sc = sink.spark.sparkContext
        return {
            "master": sc.master,
            # executors of this application (the driver is not one); none in local mode
            "executors": sc._jsc.sc().getExecutorIds().size(),
            "partitions": sorted(r[0] for r in sink.spark.sql("SHOW PARTITIONS pipeline.records").collect()),
            "rows_equal": read_back(sink.spark, DEFAULT_DATABASE) == expected_rows(),
            "sql": run_sql(sink.spark, SQL),
        }
    finally:
        sink.stop()


pytestmark = pytest.mark.slow


def test_round_trip_on_a_standalone_cluster(standalone_cluster, tmp_path):
    data_dir = tmp_path / "data"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.persist.test_spark_cluster", standalone_cluster.master_url,
         str(data_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["master"] == standalone_cluster.master_url
    assert result["executors"] >= 1  # the Worker's executor did the writing
    assert result["partitions"] == ["topic=123/date=2023-11-14/hour=22", "topic=orders/date=2023-11-14/hour=22"]
    assert list((data_dir / "tables" / "records" / "topic=orders").rglob("*.parquet"))
    assert result["rows_equal"]
    assert result["sql"] == [["topic", "n", "last"], [["123", 5, 4], ["orders", 9, 12]]]
    # the executor ran in the Worker: its work dir holds this application's logs
    assert list((standalone_cluster.work_dir / "worker").glob("app-*/*/stderr"))


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


if __name__ == "__main__":
    print(json.dumps(standalone_round_trip(sys.argv[1], sys.argv[2])))
