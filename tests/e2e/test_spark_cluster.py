"""The producers end-to-end test, with Spark beyond the embedded ``local[*]``.

``tests/e2e/test_producers.py``'s check (confluent-kafka and kafka-python, exactly once, at the
acknowledged offsets, gapless and in order; 2,000 records each here against the shared servers'
10,000: the point is the writes through the cluster, and a server of its own already spends most of
the test starting), run against ``pipeline serve --spark-master spark://...`` (a standalone Master +
Worker) and ``pipeline serve --spark-remote sc://...`` (a Spark Connect server), each with ``--ack-on
spark``, so that every acknowledgement waits for a write through the cluster rather than the WAL
(the default, where Spark sees only a few flushes). Each is a server of its own: the Spark master or
remote is a server-level setting. Multiqueue mode only; the modes do not touch Spark differently.
"""

from __future__ import annotations

import pytest

from tests.e2e import test_producers
from tests.e2e.server_process import ServerProcess

pytestmark = pytest.mark.slow

ACK_ON_SPARK = ("--ack-on", "spark")
RECORDS = 2_000
"""Records each producer sends."""


def run_and_stop(server: ServerProcess, label: str, **read) -> None:
    """``test_producers.produce_and_check`` on ``server`` (started here), then a clean stop (exit 0)."""
    server.start()
    try:
        test_producers.produce_and_check(server, label, n=RECORDS, **read)
    finally:
        code = server.stop() if server.running else server.proc.returncode
    assert code == 0, server.log_text()


def test_real_producers_through_a_standalone_cluster(standalone_cluster, tmp_path):
    apps = standalone_cluster.work_dir / "worker"
    apps_before = set(apps.glob("app-*"))
    run_and_stop(ServerProcess(tmp_path / "data", "--spark-master", standalone_cluster.master_url, *ACK_ON_SPARK),
                 "standalone")
    # the server's Spark application got an executor on the Worker, and the executor ran there (its
    # log is in the Worker's work dir)
    new_apps = set(apps.glob("app-*")) - apps_before
    assert len(new_apps) == 1
    assert list(new_apps.pop().glob("*/stderr"))


def test_real_producers_through_spark_connect(connect_server, connect_spark, tmp_path):
    server = ServerProcess(tmp_path / "data", "--spark-remote", connect_server.url, *ACK_ON_SPARK)

    # read back through Connect as well: the table is in the Connect server's catalog
    def read_through_connect(data_dir, query):
        connect_spark.catalog.setCurrentDatabase("pipeline")
        return connect_spark.sql(query).toArrow().to_pylist()

    run_and_stop(server, "connect", read=read_through_connect)
    assert connect_server.url in server.log_text()  # "starting Spark (sc://...)"
