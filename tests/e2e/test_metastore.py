"""An external Hive metastore (``hive.metastore.uris``) shared with a classic Spark session in
another process while the server runs, against a real server, real clients and real Spark; that
session reads the live view (``pipeline.records_live``) by name, acknowledged records at once."""

from __future__ import annotations

import time

import pytest

from tests.e2e.server_process import ServerProcess
from tests.e2e.table_reader import read_table, read_tables

pytestmark = pytest.mark.slow


def test_an_external_metastore_is_shared_with_a_classic_session_while_the_server_runs(tmp_path):
    from kafka import KafkaProducer

    from pipeline.persist.spark_cluster import MetastoreServer

    data_dir = tmp_path / "data"
    # A server of its own: hive.metastore.uris is a server-level setting (the shared servers use
    # the embedded metastore in their data directory).
    with MetastoreServer(tmp_path / "metastore") as metastore:
        server = ServerProcess(data_dir, "--metastore-uris", metastore.uris, "--table-commit-interval-ms", "500",
                               "--spark-connect-port", "0").start()
        try:
            producer = KafkaProducer(bootstrap_servers=server.bootstrap, acks="all")
            for i in range(50):
                producer.send("shared", value=b"v%d" % i)
            producer.flush()
            producer.close()
            # a classic Spark application of its own (another process, another JVM), by name, server running:
            # the live view holds the 50 acknowledged records at its first query (its tail comes from the
            # broker through the pipeline_live data source, in that session's own Python workers)
            live, in_order, rows = read_tables(data_dir, [
                "SELECT count(*) AS n, count(DISTINCT offset) AS d FROM pipeline.records_live WHERE topic = 'shared'",
                "SELECT offset FROM pipeline.records_live WHERE topic = 'shared' ORDER BY offset",
                "SELECT count(*) AS n FROM pipeline.records WHERE topic = 'shared'"],
                metastore_uris=metastore.uris)
            assert live == [{"n": 50, "d": 50}]
            assert [r["offset"] for r in in_order] == list(range(50))
            # the table alone, once a commit (every 500 ms) took them
            deadline = time.monotonic() + 90
            while rows != [{"n": 50}] and time.monotonic() < deadline:
                # each read starts a Spark JVM in a subprocess (metastore_uris): let the next 500 ms
                # commit come first instead of starting them back to back
                time.sleep(0.5)
                rows = read_table(data_dir, "SELECT count(*) AS n FROM pipeline.records WHERE topic = 'shared'",
                                  metastore_uris=metastore.uris)
            assert rows == [{"n": 50}]
            assert server.running
            # nothing went to an embedded metastore in the data directory
            assert not (data_dir / "_pipeline" / "metastore_db").exists()
        finally:
            code = server.stop() if server.running else None
        assert code == 0, server.log_text()
