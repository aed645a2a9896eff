"""The live view (``pipeline.records_live``) as a Spark user reads it, on ``pipeline serve --brokers 3``
(``--ack-on wal``, commits every second, compaction every 3 s). Elsewhere: one broker with ``--ack-on
wal``, tests/e2e/test_table.py; one broker with ``--ack-on spark`` through a kill -9,
tests/e2e/test_durability.py; a classic session on a shared metastore, tests/e2e/test_metastore.py.
(``--brokers 3 --ack-on spark`` as a second parameter passed too, 39 s: left out of make test for its
time.)

Two idempotent confluent-kafka producers write a 6-partition topic, whose leaders are spread over the
brokers, while commits land and a reader takes snapshots through the Spark Connect server by name:
every snapshot holds each record acknowledged before its query started exactly once, and none that
was never acknowledged. A query for one topic-partition and an offset range plans that range alone
(the reader Spark runs, given the filters Spark pushes). After a clean stop every broker's file
says it stopped (so the last published the view ``stopped``).
"""

from __future__ import annotations

import re
import threading
import time

import pytest

from tests.e2e.cluster_process import Cluster
from tests.e2e.server_process import ServerProcess
from tests.e2e.table_reader import wait_for_live_view

pytestmark = pytest.mark.slow

TOPIC = "live"
PARTITIONS = 6
PER_PRODUCER = 2_000
RATE = 300  # records per second per producer


def _produce(bootstrap: str, first: int, acked: dict[int, tuple[int, int]], errors: list) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})

    def delivered(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked[int(msg.value())] = (msg.partition(), msg.offset())

    started = time.monotonic()
    for i in range(first, first + PER_PRODUCER):
        producer.produce(TOPIC, key=b"k%d" % (i % 50), value=str(i).encode(), on_delivery=delivered)
        producer.poll(0)
        delay = started + (i - first + 1) / RATE - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    producer.flush(60)


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
        acked: dict[int, tuple[int, int]] = {}
        errors: list = []
        producers = [threading.Thread(target=_produce, args=(bootstrap, k * PER_PRODUCER, acked, errors))
                     for k in range(2)]
        for p in producers:
            p.start()
        # rows, distinct, missing, never acknowledged, rows the table alone held just before
        snapshots: list[tuple[int, int, int, int, int]] = []
        while any(p.is_alive() for p in producers) or len(snapshots) < 3:
            in_table = session.sql(f"SELECT count(*) FROM pipeline.records WHERE topic = '{TOPIC}'").collect()[0][0]
            before = set(acked.values())
            rows = session.sql(f"SELECT `partition`, `offset` FROM pipeline.records_live WHERE topic = '{TOPIC}'"
                               ).collect()
            got = [(r[0], r[1]) for r in rows]
            after = set(acked.values())
            snapshots.append((len(got), len(set(got)), len(before - set(got)), len(set(got) - after), in_table))
            time.sleep(0.5)
        for p in producers:
            p.join(60)
        assert not errors, errors[:5]
        assert len(acked) == 2 * PER_PRODUCER
        assert len(snapshots) >= 3, snapshots
        assert all(n == distinct for n, distinct, _, _, _ in snapshots), f"a record twice: {snapshots}"
        assert all(missing == 0 for _, _, missing, _, _ in snapshots), snapshots
        assert all(phantom == 0 for _, _, _, phantom, _ in snapshots), snapshots
        if "spark" not in args:  # acknowledged at the WAL: the view held what the table did not yet
            assert any(n > in_table for n, _, _, _, in_table in snapshots), snapshots

        # Every broker published: the view's boundary names partitions led by each of them, and its
        # tail reads from all three.
        boundary = Boundary.decode(_boundary(session))
        assert {p for t, p in boundary.ends if t == TOPIC} == set(range(PARTITIONS)), boundary.ends
        assert len(boundary.brokers.split(",")) == brokers

        # One topic-partition and an offset range: the reader Spark runs, given the filters Spark pushes
        # and a boundary 40 records back on that partition (the load has stopped, so the published one
        # is at its end), plans that range of that partition alone; Spark returns those offsets.
        partition = 2
        end = max(o for p, o in acked.values() if p == partition) + 1
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
