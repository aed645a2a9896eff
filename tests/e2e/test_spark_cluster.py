"""The producers end-to-end test, with Spark beyond the embedded ``local[*]``.

``tests/e2e/test_producers.py``'s test (confluent-kafka and kafka-python,
10,000 records each, exactly once, at the acknowledged offsets, gapless and in
order), run unchanged against ``pipeline serve --spark-master spark://...``
(a standalone Master + Worker) and ``pipeline serve --spark-remote sc://...``
(a Spark Connect server): its ``ServerProcess`` is swapped for one that adds
the flag, and ``--ack-on spark``, so that every acknowledgement waits for a
write through the cluster (~16 flushes) rather than the WAL (the default,
where Spark sees only a few flushes). Multiqueue mode only; the modes do
not touch Spark differently.
"""

from __future__ import annotations

import pytest

from tests.e2e import test_producers
from tests.e2e.server_process import ServerProcess

pytestmark = pytest.mark.slow

MODE = "multiqueue"
ACK_ON_SPARK = ("--ack-on", "spark")


def server_process_with(*extra_args: str, started: list[ServerProcess]) -> type[ServerProcess]:
    """``ServerProcess`` that appends ``extra_args`` to every server it runs, recording each in ``started``."""

    class WithSpark(ServerProcess):
        def __init__(self, data_dir, *args: str, log_path=None) -> None:
            super().__init__(data_dir, *args, *extra_args, log_path=log_path)
            started.append(self)

    return WithSpark


def test_real_producers_through_a_standalone_cluster(standalone_cluster, monkeypatch, tmp_path):
    apps = standalone_cluster.work_dir / "worker"
    apps_before = set(apps.glob("app-*"))
    started: list[ServerProcess] = []
    monkeypatch.setattr(test_producers, "ServerProcess", server_process_with(
        "--spark-master", standalone_cluster.master_url, *ACK_ON_SPARK, started=started))

    test_producers.test_real_producers_land_in_the_table_exactly_once_in_order(MODE, tmp_path)

    assert len(started) == 1
    # the server's Spark application got an executor on the Worker
    assert len(set(apps.glob("app-*")) - apps_before) == 1


def test_real_producers_through_spark_connect(connect_server, connect_spark, monkeypatch, tmp_path):
    started: list[ServerProcess] = []
    monkeypatch.setattr(test_producers, "ServerProcess", server_process_with(
        "--spark-remote", connect_server.url, *ACK_ON_SPARK, started=started))

    # read back through Connect as well: the table is in the Connect server's catalog

    def read_through_connect(data_dir, query):
        connect_spark.catalog.setCurrentDatabase("pipeline")
        return connect_spark.sql(query).toArrow().to_pylist()

    monkeypatch.setattr(test_producers, "read_table", read_through_connect)
    test_producers.test_real_producers_land_in_the_table_exactly_once_in_order(MODE, tmp_path)

    assert len(started) == 1
    assert connect_server.url in started[0].log_text()  # "starting Spark (sc://...)"
