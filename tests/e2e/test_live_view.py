"""The live view (``pipeline.records_live``) as a Spark user reads it, on ``pipeline serve --brokers 3``
(``--ack-on wal``, commits every second, compaction every 3 s). Elsewhere: one broker with ``--ack-on
wal``, tests/e2e/test_table.py; one broker with ``--ack-on spark`` through a kill -9,
tests/e2e/test_durability.py; ``--brokers 3 --ack-on spark`` (leadership through the database), on the
cluster tests/e2e/test_cluster_metadata.py already runs; a classic session on a shared metastore,
tests/e2e/test_metastore.py.

Two idempotent confluent-kafka producers write a 6-partition topic, whose leaders are spread over the
brokers, while commits land and a reader takes snapshots through the Spark Connect server by name:
every snapshot holds each record acknowledged before its query started exactly once, and none that
was never acknowledged. A query for one topic-partition and an offset range plans that range alone
(the reader Spark runs, given the filters Spark pushes). After a clean stop every broker's file
says it stopped (so the last published the view ``stopped``).
"""

from __future__ import annotations

import re

import pytest

from tests.e2e.cluster_process import Cluster
from tests.e2e.server_process import ServerProcess
from tests.e2e.live_view_load import PacedLoad, assert_each_acknowledged_record_once, live_snapshots
from tests.e2e.table_reader import wait_for_live_view

pytestmark = pytest.mark.slow

TOPIC = "live"
PARTITIONS = 6


def _boundary(session) -> str:
    ddl = session.sql("SHOW CREATE TABLE pipeline.records_live").collect()[0][0]
    return re.search(r"`_boundary` = '(.*)'", ddl).group(1).replace("\\'", "'")


WAL_COMMITS = ("--table-commit-interval-ms", "1000", "--table-compaction-interval-ms", "3000",
               "--table-compaction-min-files", "3")


@pytest.mark.parametrize("brokers, args", [pytest.param(3, WAL_COMMITS, id="3-brokers-ack-on-wal")])
def test_every_snapshot_holds_each_acknowledged_record_once(tmp_path, brokers, args):
    from confluent_kafka.admin import AdminClient, NewTopic
    from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, LessThan

    from pipeline.persist.spark_sink import build_spark_session
    from pipeline.table.live import Boundary, TailPartition
    from pipeline.table.live_source import LiveTailReader

    cluster = Cluster(tmp_path / "data", brokers, *args) if brokers > 1 else None
    server = ServerProcess(tmp_path / "data", *args) if brokers == 1 else None
    session = None
    try:  # started inside: a start that fails still leaves nothing running (finally)
        if cluster is not None:
            cluster.start()
            bootstrap, connect_port = cluster.bootstrap(), cluster.connect_port
        else:
            assert server is not None
            server.start()
            bootstrap, connect_port = server.bootstrap, server.connect_port
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
            future.result(60)
        session = build_spark_session(remote=f"sc://127.0.0.1:{connect_port}")
        wait_for_live_view(session)
        load = PacedLoad(bootstrap, TOPIC).start()
        snapshots = live_snapshots(session, "pipeline", load)
        load.join()
        assert not load.errors, load.errors[:5]
        assert len(load.acked) == load.producers * load.per_producer
        assert_each_acknowledged_record_once(snapshots, load)
        if "spark" not in args:  # acknowledged at the WAL: the view held what the table did not yet
            assert any(s.rows > s.in_table for s in snapshots), snapshots
        acked = load.acked

        # Every broker published: the view's boundary names partitions led by each of them, and its
        # tail reads from all three.
        boundary = Boundary.decode(_boundary(session))
        assert {p for t, p in boundary.ends if t == TOPIC} == set(range(PARTITIONS)), boundary.ends
        assert len(boundary.brokers.split(",")) == brokers

        # One topic-partition and an offset range: the reader Spark runs, given the filters Spark pushes
        # and a boundary 40 records back on that partition (the load has stopped, so the published one
        # is at its end), plans that range of that partition alone; Spark returns those offsets.
        partition = 2
        end = max(o for p, o in acked.values() if p == partition and o is not None) + 1
        lo, hi = end - 30, end - 10
        earlier = Boundary({**boundary.ends, (TOPIC, partition): end - 40}, brokers=boundary.brokers)
        reader = LiveTailReader({})
        list(reader.pushFilters([EqualTo(("_boundary",), earlier.encode()), EqualTo(("topic",), TOPIC),
                                 EqualTo(("partition",), partition), GreaterThanOrEqual(("offset",), lo),
                                 LessThan(("offset",), hi)]))
        assert [p.value for p in reader.partitions()] == [TailPartition(TOPIC, partition, lo, hi)]
        assert sum(b.num_rows for b in reader.read(reader.partitions()[0])) == hi - lo
        rows = session.sql(f"SELECT `offset` FROM pipeline.records_live WHERE topic = '{TOPIC}' AND "
                           f"`partition` = {partition} AND `offset` >= {lo} AND `offset` < {hi}").collect()
        assert sorted(r[0] for r in rows) == list(range(lo, hi))
        session.stop()
        session = None

        if cluster is not None:
            assert cluster.stop() == 0, cluster.log_text()
        elif server is not None:
            assert server.stop() == 0, server.log_text()
        # Every broker stopped cleanly and said so in its file: the last one published the view
        # `stopped` (the view is the table alone then; a stopped view read without brokers, through
        # `pipeline sql` after a stop: tests/docs, test_sql_after_stop; its rows: test_spark_sink).
        import json

        files = list((tmp_path / "data" / "_pipeline" / "live").glob("*.json"))
        assert len(files) == brokers and all(json.loads(f.read_text())["stopped"] for f in files), files
    finally:
        if session is not None:
            session.stop()
        if cluster is not None:
            cluster.kill_all()
        elif server is not None and server.running:
            server.stop()
