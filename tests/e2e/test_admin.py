"""End to end: topic administration with confluent-kafka's AdminClient and kafka-python's KafkaAdminClient.

One real server (``pipeline serve``) and two real admin clients create
topics with partitions and configs, describe them (list_topics,
describe_topics, describe_configs), alter configs (IncrementalAlterConfigs),
add partitions, describe the cluster and delete topics. Then: produce to a
deleted topic fails; a re-created topic starts at offset 0; everything
survives a kill -9 and a restart (the topic store is SQLite); after a clean
stop the table holds only the re-created topic's rows.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e import raw_client as rc
from tests.e2e.shared_server import LOG_RETENTION_MS
from tests.e2e.server_process import ServerProcess
from tests.e2e.table_reader import read_table

pytestmark = pytest.mark.slow

ARGS = ("--num-partitions", "1", "--table-commit-interval-ms", "300", "--log-retention-ms", "120000")


def confluent_admin(server: ServerProcess):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": server.bootstrap})


def kp_admin(server: ServerProcess):
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=120_000)


def kp_produce(server: ServerProcess, topic: str, values: list[bytes]) -> list[int]:
    """Produce with kafka-python; the offsets."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=server.bootstrap)
    try:
        futures = [producer.send(topic, value=v, partition=0) for v in values]
        producer.flush(60)
        return [f.get(timeout=60).offset for f in futures]
    finally:
        producer.close()


def raw_produce_error(server: ServerProcess, topic: str) -> int:
    """The error code of a raw Produce (no Metadata first, so nothing is auto-created)."""
    raw = rc.RawClient(server.host, server.port)
    try:
        raw.send(rc.frame(rc.produce(topic, [b"raw"]), 1))
        _cid, body = raw.read_response()
    finally:
        raw.close()
    return int(rc.decode_produce_response(body).responses[0].partition_responses[0].error_code)


def produce(server: ServerProcess, topic: str, values: list[bytes]) -> list[tuple[str | None, int]]:
    """Produce with auto-creation off (so a deleted topic is not re-created): (error, offset) per record."""
    from confluent_kafka import Producer

    # librdkafka fails a record for an unknown topic with _UNKNOWN_TOPIC only once
    # topic.metadata.propagation.max.ms has passed (default 30 s), else _MSG_TIMED_OUT.
    producer = Producer({"bootstrap.servers": server.bootstrap, "allow.auto.create.topics": False,
                         "message.timeout.ms": 4000, "topic.metadata.refresh.interval.ms": 500,
                         "topic.metadata.propagation.max.ms": 1000})
    out: list[tuple[str | None, int]] = []
    for v in values:
        producer.produce(topic, value=v, partition=0,
                         on_delivery=lambda err, msg: out.append((None if err is None else err.name(), msg.offset())))
    assert producer.flush(30) == 0
    return out


def committed_end(server: ServerProcess, topic: str, expected: int, partition: int = 0,
                  timeout_s: float = 60.0) -> int:
    """Wait until the checkpoint (saved after each table commit) says the partition ends at ``expected``."""
    path = server.data_dir / "_pipeline" / "checkpoint.json"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ends = {(t, p): o for t, p, o in json.loads(path.read_text())["end_offsets"]}
        except (OSError, ValueError):
            ends = {}
        if ends.get((topic, partition)) == expected:
            return expected
        time.sleep(0.2)
    raise AssertionError(f"{topic}-{partition} never committed to the table up to {expected}")


def describe_topic_configs(admin, topic: str) -> dict:
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(60)
    return {name: (entry.value, entry.source) for name, entry in configs.items()}


def test_kafka_python_admin_manages_topics_that_survive_restarts_and_deletion_empties_them(tmp_path):
    from kafka.admin import ConfigResource, ConfigResourceType, NewPartitions, NewTopic
    from kafka.errors import InvalidConfigurationError, InvalidPartitionsError, TopicAlreadyExistsError

    data_dir = tmp_path / "data"
    server = ServerProcess(data_dir, *ARGS).start()
    try:
        admin = kp_admin(server)
        try:
            admin.create_topics([NewTopic("orders", 3, 1, topic_configs={"retention.ms": "600000"}),
                                 NewTopic("events", 1, 1)])
            with pytest.raises(TopicAlreadyExistsError):
                admin.create_topics([NewTopic("orders", 1, 1)])
            with pytest.raises(InvalidConfigurationError):
                admin.create_topics([NewTopic("compacted", 1, 1, topic_configs={"cleanup.policy": "compact"})])
            assert {t["name"]: len(t["partitions"]) for t in admin.describe_topics(["orders", "events"])} == \
                {"orders": 3, "events": 1}
            admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "orders",
                                                configs={"retention.bytes": "1048576"})])
            described = repr(admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "orders")],
                                                    config_filter="all"))
            assert "600000" in described and "1048576" in described and "cleanup.policy" in described
            admin.create_partitions({"orders": NewPartitions(5)})
            with pytest.raises(InvalidPartitionsError):
                admin.create_partitions({"orders": NewPartitions(2)})
            assert admin.describe_cluster()["cluster_id"] == "pipeline"

            # deletion: the rows go, produce fails, a re-created topic starts at 0
            assert kp_produce(server, "events", [b"old-0", b"old-1", b"old-2"]) == [0, 1, 2]
            committed_end(server, "events", 3)  # in the table before the delete
            admin.delete_topics(["events"], timeout_ms=180_000)
            assert "events" not in admin.list_topics()
            assert raw_produce_error(server, "events") == 3  # UNKNOWN_TOPIC_OR_PARTITION
            admin.create_topics([NewTopic("events", 1, 1)])
            assert kp_produce(server, "events", [b"new-0", b"new-1"]) == [0, 1]
            committed_end(server, "events", 2)  # the checkpoint a restart starts from
        finally:
            admin.close()
    finally:
        killed = server.kill()
    assert killed == []

    # kill -9, restart: topics, partitions and configs are where they were
    server = ServerProcess(data_dir, *ARGS).start()
    try:
        admin = kp_admin(server)
        try:
            assert {t["name"]: len(t["partitions"]) for t in admin.describe_topics()} == {"orders": 5, "events": 1}
            assert "1048576" in repr(admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "orders")]))
        finally:
            admin.close()
        assert kp_produce(server, "events", [b"new-2"]) == [2]
    finally:
        code = server.stop() if server.running else server.proc.returncode
    assert code == 0
    rows = read_table(data_dir, "SELECT offset, value FROM records WHERE topic = 'events' ORDER BY offset")
    assert [(r["offset"], r["value"]) for r in rows] == [(0, b"new-0"), (1, b"new-1"), (2, b"new-2")]


def test_confluent_admin_client(multiqueue_server):
    """On the shared server (its ``--log-retention-ms`` is the broker default seen below), own topic names."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewPartitions,
                                       NewTopic, ResourceType)

    server = multiqueue_server
    orders, events, compacted, replicated = "admin-orders", "admin-events", "admin-compacted", "admin-replicated"
    admin = confluent_admin(server)
    futures = admin.create_topics([
        NewTopic(orders, 3, config={"retention.ms": "600000"}),
        NewTopic(events, 1),
        NewTopic(compacted, 1, config={"cleanup.policy": "compact"}),
        NewTopic(replicated, 1, replication_factor=3),
    ], request_timeout=60)
    futures[orders].result(60)
    futures[events].result(60)
    for name, code in ((compacted, "INVALID_CONFIG"), (replicated, "INVALID_REPLICATION_FACTOR")):
        with pytest.raises(KafkaException) as failed:
            futures[name].result(60)
        assert failed.value.args[0].name() == code
    metadata = admin.list_topics(timeout=30)
    # other tests' topics are on the shared server too: of this test's four names, these two exist
    assert {t: len(m.partitions) for t, m in metadata.topics.items()
            if t.startswith("admin-")} == {orders: 3, events: 1}
    configs = describe_topic_configs(admin, orders)
    assert configs["retention.ms"] == ("600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert configs["retention.bytes"] == ("-1", ConfigSource.DEFAULT_CONFIG.value)

    resource = ConfigResource(ResourceType.TOPIC, orders, incremental_configs=[
        ConfigEntry("retention.bytes", "1048576", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)])
    admin.incremental_alter_configs([resource])[resource].result(60)
    configs = describe_topic_configs(admin, orders)
    assert configs["retention.bytes"] == ("1048576", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert configs["retention.ms"] == (str(LOG_RETENTION_MS),  # the server's --log-retention-ms
                                       ConfigSource.STATIC_BROKER_CONFIG.value)

    admin.create_partitions([NewPartitions(orders, 5)])[orders].result(60)
    cluster = admin.describe_cluster().result(60)
    assert cluster.cluster_id == "pipeline" and cluster.controller.id == 0
    admin.delete_topics([events], request_timeout=120)[events].result(180)
    # librdkafka's own _UNKNOWN_TOPIC, or the broker's UNKNOWN_TOPIC_OR_PARTITION: never stored
    assert [err for err, _ in produce(server, events, [b"lost"])] in (["_UNKNOWN_TOPIC"],
                                                                      ["UNKNOWN_TOPIC_OR_PART"])
    assert server.running
