"""End to end: topic administration with confluent-kafka's AdminClient.

One real server (``pipeline serve``) and a real admin client create topics
with partitions and configs (refusing compaction and replication), describe
them (list_topics, describe_configs), alter configs
(IncrementalAlterConfigs), add partitions, describe the cluster and delete a
topic; produce to the deleted topic fails. kafka-python's KafkaAdminClient,
deletion emptying a topic's rows, and topics and configs surviving a
``kill -9`` are steps of tests/e2e/test_durability.py.
"""

from __future__ import annotations

import pytest

from tests.e2e.shared_server import LOG_RETENTION_MS
from tests.e2e.server_process import ServerProcess

pytestmark = pytest.mark.slow

ARGS = ("--num-partitions", "1", "--table-commit-interval-ms", "300", "--log-retention-ms", "120000")


def confluent_admin(server: ServerProcess):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": server.bootstrap})


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


def describe_topic_configs(admin, topic: str) -> dict:
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(60)
    return {name: (entry.value, entry.source) for name, entry in configs.items()}


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
