"""The live view (``pipeline.records_live``) on ``pipeline serve --brokers 3``, as a Spark user reads it.

Two idempotent confluent-kafka producers write a 6-partition topic, whose leaders are spread over the
three brokers, while commits land (``--ack-on spark``: one every ``linger.ms``) and a reader takes
snapshots through the cluster's Spark Connect server by name: every snapshot holds each record
acknowledged before its query started exactly once, and none that was never acknowledged. A query
for one topic-partition and an offset range plans that range alone (the reader Spark runs, given
the filters Spark pushes). After a clean stop of every broker the view says ``stopped``: it equals
the table, and reads without any broker. (One broker with ``--ack-on wal``, commits every second
and compaction: tests/e2e/test_table.py; a classic session on a shared metastore:
tests/e2e/test_metastore.py.)
"""

from __future__ import annotations

import re
import threading
import time

import pytest

from tests.e2e.cluster_process import Cluster

pytestmark = pytest.mark.slow

TOPIC = "live"
PARTITIONS = 6
PER_PRODUCER = 3_000
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


def test_every_snapshot_holds_each_acknowledged_record_once_across_three_brokers(tmp_path):
    from confluent_kafka.admin import AdminClient, NewTopic
    from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, LessThan

    from pipeline.persist.spark_sink import build_spark_session
    from pipeline.table.live import Boundary, TailPartition
    from pipeline.table.live_source import LiveTailReader

    cluster = Cluster(tmp_path / "data", 3, "--ack-on", "spark").start()
    session = None
    try:
        bootstrap = cluster.bootstrap()
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
            future.result(60)
        session = build_spark_session(remote=f"sc://127.0.0.1:{cluster.connect_port}")
        acked: dict[int, tuple[int, int]] = {}
        errors: list = []
        producers = [threading.Thread(target=_produce, args=(bootstrap, k * PER_PRODUCER, acked, errors))
                     for k in range(2)]
        for p in producers:
            p.start()
        snapshots: list[tuple[int, int, int, int]] = []  # rows, distinct, missing, never acknowledged
        while any(p.is_alive() for p in producers) or len(snapshots) < 3:
            before = set(acked.values())
            rows = session.sql(f"SELECT `partition`, `offset` FROM pipeline.records_live WHERE topic = '{TOPIC}'"
                               ).collect()
            got = [(r[0], r[1]) for r in rows]
            after = set(acked.values())
            snapshots.append((len(got), len(set(got)), len(before - set(got)), len(set(got) - after)))
        for p in producers:
            p.join(60)
        assert not errors, errors[:5]
        assert len(acked) == 2 * PER_PRODUCER
        assert len(snapshots) >= 3, snapshots
        assert all(n == distinct for n, distinct, _, _ in snapshots), f"a record twice: {snapshots}"
        assert all(missing == 0 for _, _, missing, _ in snapshots), snapshots
        assert all(phantom == 0 for _, _, _, phantom in snapshots), snapshots

        # Every broker published: the view's boundary names partitions led by each of them, and its
        # tail reads from all three.
        boundary = Boundary.decode(_boundary(session))
        assert {p for t, p in boundary.ends if t == TOPIC} == set(range(PARTITIONS)), boundary.ends
        assert len(boundary.brokers.split(",")) == 3

        # One topic-partition and an offset range: the reader Spark runs plans that range alone, and
        # the rows Spark returns are those offsets.
        partition, lo = 2, boundary.ends[(TOPIC, 2)] - 5
        reader = LiveTailReader({})
        list(reader.pushFilters([EqualTo(("_boundary",), boundary.encode()), EqualTo(("topic",), TOPIC),
                                 EqualTo(("partition",), partition), GreaterThanOrEqual(("offset",), lo),
                                 LessThan(("offset",), lo + 10)]))
        end = max(o for p, o in acked.values() if p == partition) + 1
        assert [p.value for p in reader.partitions()] == [
            TailPartition(TOPIC, partition, boundary.ends[(TOPIC, partition)], min(lo + 10, end))]
        rows = session.sql(f"SELECT `offset` FROM pipeline.records_live WHERE topic = '{TOPIC}' AND "
                           f"`partition` = {partition} AND `offset` >= {lo} AND `offset` < {lo + 10}").collect()
        assert sorted(r[0] for r in rows) == list(range(lo, min(lo + 10, end)))
        session.stop()
        session = None

        assert cluster.stop() == 0, cluster.log_text()
        # Every broker stopped cleanly: the view is the table alone, read with no broker running.
        from pipeline.process.datadir import table_session

        spark = table_session(tmp_path / "data")
        try:
            assert Boundary.decode(_boundary(spark)).stopped
            rows = spark.sql(f"SELECT `partition`, `offset` FROM pipeline.records_live WHERE topic = '{TOPIC}'"
                             ).collect()
        finally:
            spark.stop()
        assert sorted((r[0], r[1]) for r in rows) == sorted(acked.values())
    finally:
        if session is not None:
            session.stop()
        cluster.kill_all()
