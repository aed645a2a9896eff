"""`pipeline serve --metadata-url postgresql://...` keeps its metadata in a real PostgreSQL server.

One server, started for this module: its configuration differs from the shared servers' (the
metadata URL, made per run from the session's PostgreSQL server), so it cannot join them. It
listens before Spark is up (``start(table=False)``) and nothing here needs the table.

Real clients make the metadata: kafka-python's admin creates a topic with a config, an idempotent
confluent-kafka producer gets a producer id (from a block the broker claimed in the database) and is
acknowledged, a confluent-kafka consumer commits offsets, and ``pipeline users add --metadata-url``
adds a SCRAM user from another process. A second "broker" (store instances of its own on the same
database) then reads all of it, and no SQLite store file was made in the data directory.
"""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest

from pipeline.coordinator.offset_store import OffsetStore
from pipeline.metadata.topics import TopicStore
from pipeline.security.users import UserStore
from tests.e2e.server_process import ServerProcess

pytestmark = pytest.mark.slow

TOPIC = "pg-orders"
GROUP = "pg-group"
N = 20


def test_a_server_on_postgresql_stores_topics_producer_ids_offsets_and_users_there(tmp_path, postgres_server):
    from confluent_kafka import Consumer, Producer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic

    url = postgres_server.create_database("e2e")
    server = ServerProcess(tmp_path / "data", "--metadata-url", url, connect_port=False).start(table=False)
    try:
        admin = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=60_000)
        try:
            admin.create_topics([NewTopic(TOPIC, 3, 1, topic_configs={"retention.ms": "600000"})])
        finally:
            admin.close()

        acked: list[tuple[int, int]] = []

        def delivered(err, msg) -> None:
            assert err is None, err
            acked.append((msg.partition(), msg.offset()))

        producer = Producer({"bootstrap.servers": server.bootstrap, "acks": "all", "enable.idempotence": True})
        for i in range(N):
            producer.produce(TOPIC, value=b"pg-%d" % i, partition=i % 3, on_delivery=delivered)
        assert producer.flush(60) == 0
        assert sorted(acked) == sorted((p, o) for p in range(3) for o in range(len(range(p, N, 3))))

        consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": GROUP,
                             "enable.auto.commit": False})
        try:
            committed = consumer.commit(offsets=[TopicPartition(TOPIC, 0, 5), TopicPartition(TOPIC, 2, 3)],
                                        asynchronous=False)
            assert all(tp.error is None for tp in committed)
        finally:
            consumer.close()

        added = subprocess.run([sys.executable, "-m", "pipeline.cli", "users", "add", "alice", "--password-stdin",
                                "--metadata-url", url, "--data-dir", str(tmp_path / "data")],
                               input="pw-alice\n", capture_output=True, text=True, timeout=120)
        assert added.returncode == 0, added.stderr

        # A second broker's view: its own connections to the same database.
        [topic] = TopicStore(url).load()
        assert (topic.name, topic.partitions, dict(topic.configs)) == (TOPIC, 3, {"retention.ms": "600000"})
        assert OffsetStore(url).load()[GROUP][1] == {(TOPIC, 0): (5, -1, ""), (TOPIC, 2): (3, -1, "")}
        assert UserStore(url).verify_plain("alice", "pw-alice")
        with psycopg.connect(url) as db:
            broker_id, next_id = db.execute("SELECT broker_id, next_id FROM producer_id_blocks").fetchone()
        assert broker_id == 0 and next_id > 0  # the idempotent producer's id came from a claimed block
        assert not [p.name for p in (tmp_path / "data" / "_pipeline").glob("*.db")]
    finally:
        assert server.stop() == 0
