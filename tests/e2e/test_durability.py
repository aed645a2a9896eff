"""One durability story: what clients did before a ``kill -9`` is all there after one restart.

One data directory, one server configuration (a config file with typed
topics, a Thrift JDBC port and a 1 s table commit interval), and the tests of
this module are the story's steps, in order (a failed step skips the rest):

1. before the crash (server A): topics created, altered and deleted with
   kafka-python's and confluent-kafka's admin clients; committed offsets of
   groups of both clients, a group deleted; a group consumer committing as it
   reads; rows queried by name over JDBC; then idempotent producers under
   load, typed topics written with good and bad values, and, right after the
   last commit and group deletion were answered, ONE ``kill -9``: the
   server's children (Spark's JVM, the decode worker, the resource tracker)
   exit by themselves;
2. ONE restart (server B) on the same data directory and port: topics,
   partitions and configs are back, deleted topics stay deleted, committed
   offsets and group deletions survived, the consumer resumes from its
   commits, the producers ride through with their retries, recovery replays
   the WAL;
3. a SIGTERM under load: every request read is answered, the server exits 0;
4. ONE read of the tables (another Spark session, by name): every
   acknowledged record once, in order, typed columns and dead letters right,
   the deleted topic's old rows gone; the offsets a next start loads; and a
   changed typed schema refused at the next start.

Users and ACLs surviving a restart are tested in tests/e2e/test_acls.py and
test_sasl.py. ``pipeline.ack.on=spark`` is another configuration: its
``kill -9`` under load is the last test here, on servers of its own.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import psutil
import pytest

from pipeline.cli import STOP_TIMEOUT_S
from tests.e2e import raw_client as rc
from tests.e2e.server_process import ServerProcess, describe, free_port, reap
from tests.e2e.table_reader import read_table, read_tables

pytestmark = pytest.mark.slow

CHILDREN_GRACE_S = 15.0
"""How long the children of a killed server may take to notice (s)."""

PAYMENTS_DDL = "id BIGINT, amount DECIMAL(12,2), at TIMESTAMP, tags ARRAY<STRING>"
SENSOR_SCHEMA = {"type": "record", "name": "Reading", "fields": [
    {"name": "sensor", "type": "string"}, {"name": "celsius", "type": "double"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}
BAD_PAYMENTS = {3: b"{not json", 5: b'{"id": "five"}', 8: b"[1, 2]"}  # malformed, wrong type, not an object
AT = datetime(2026, 11, 23, 10, tzinfo=timezone.utc)

TOPICS_AFTER_RESTART = {"orders": 5, "events": 1, "jobs": 3, "durable": 6, "crash": 2, "jdbc": 1,
                        "payments": 1, "sensors": 1}
"""Every topic the story has when server B starts, with its partitions (``scratch`` was deleted)."""


def config_text(thrift_port: int) -> str:
    return (
        "table.commit.interval.ms = 1000\n"        # waits for a commit stay short
        f"hive.server2.thrift.port = {thrift_port}\n"
        "group.initial.rebalance.delay.ms = 0\n"
        "linger.ms = 100\n"
        '[topic."payments"]\nvalue.format = "json"\n'
        f'value.schema = "{PAYMENTS_DDL}"\n'
        '[topic."sensors"]\nvalue.format = "avro"\nvalue.wire.format = "confluent"\n'
        f"value.schema = '{json.dumps(SENSOR_SCHEMA)}'\n")


@dataclass
class Story:
    """What the steps share: the server of the moment, and what each step left for the later ones."""

    root: Path
    port: int = field(default_factory=free_port)
    thrift: int = field(default_factory=free_port)
    server: ServerProcess | None = None
    failed_step: str | None = None
    clients: list[Any] = field(default_factory=list)      # closed at the end whatever happens
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def config(self) -> Path:
        return self.root / "pipeline.toml"

    def start(self, log_name: str) -> ServerProcess:
        self.server = ServerProcess(self.data_dir, "--config", str(self.config), port=self.port,
                                    log_path=self.root / log_name).start()
        return self.server

    def abort(self) -> None:
        """After a failed step: no server, producer or client is left running."""
        for producer in self.state.get("crash_producers", []):
            producer.stop.set()
        if self.server is not None:
            self.server.kill()
        for client in self.clients:
            with contextlib.suppress(Exception):  # best effort: the step's failure is what matters
                client.close()
        self.clients.clear()


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    story = Story(tmp_path_factory.mktemp("durability"))
    story.config.write_text(config_text(story.thrift))
    # A server of its own (not a shared one): the story kills it and restarts it on its data directory.
    story.start("server-a.log")  # server A: everything before the crash
    try:
        yield story
    finally:
        story.abort()


# -- clients ------------------------------------------------------------------------------------

def kp_admin(server: ServerProcess):
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=120_000)


def confluent_admin(server: ServerProcess):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": server.bootstrap})


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


def committed_end(server: ServerProcess, topic: str, expected: int, partition: int = 0,
                  timeout_s: float = 90.0) -> int:
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


def committed_confluent(bootstrap: str, group: str, topic: str, partitions: int = 6) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return {tp.partition: tp.offset for tp in
                consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)}
    finally:
        consumer.close()


def produce_numbered(bootstrap: str, topic: str, count: int, partitions: int) -> dict[int, tuple[int, int]]:
    """Send ``count`` records round-robin over the partitions (librdkafka defaults); i -> (partition, offset)."""
    import confluent_kafka

    acked: dict[int, tuple[int, int]] = {}
    errors: list = []
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        producer.produce(topic, key=b"k%d" % i, value=b"value-%d" % i, partition=i % partitions,
                         on_delivery=lambda err, msg, i=i: errors.append((i, err)) if err else
                         acked.__setitem__(i, (msg.partition(), msg.offset())))
        producer.poll(0)
    assert producer.flush(120) == 0
    assert errors == []
    return acked


def beeline(port: int, query: str) -> str:
    """``query`` over JDBC (beeline, the Spark Thrift Server the pipeline runs), as csv2 lines."""
    import os
    import subprocess

    import pyspark

    beeline = Path(pyspark.__file__).parent / "bin" / "beeline"
    proc = subprocess.run([str(beeline), "-u", f"jdbc:hive2://127.0.0.1:{port}/pipeline", "--silent=true",
                           "--outputformat=csv2", "-e", query],
                          check=False, capture_output=True, text=True, timeout=180, env={**os.environ})
    assert proc.returncode == 0, proc.stderr[-3000:]
    # csv2 rows; beeline echoes its prompt before the header line
    lines = [line.rsplit("> ", 1)[-1] for line in proc.stdout.splitlines() if line.strip()]
    return "\n".join(lines)


def payment(i: int) -> bytes:
    return json.dumps({"id": i, "amount": f"{i}.25", "at": "2026-11-23T10:00:00Z", "tags": ["a", str(i)],
                       "ignored": True}).encode()


def avro_value(reading: dict, schema_id: int = 7) -> bytes:
    """Confluent wire format: magic 0, schema id, Avro binary."""
    import io
    import struct

    import fastavro

    out = io.BytesIO()
    out.write(b"\0" + struct.pack(">I", schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(SENSOR_SCHEMA), reading)
    return out.getvalue()


class IdempotentProducer(threading.Thread):
    """An idempotent librdkafka producer sending ``n`` records to ``topic`` at a steady pace.

    ``acked``: i -> (partition, offset) of each acknowledged record; it rides
    through a crash and restart of the server with its own retries.
    """

    def __init__(self, name: str, bootstrap: str, topic: str, n: int = 6_000) -> None:
        super().__init__(daemon=True)
        self.name_ = name
        self.bootstrap = bootstrap
        self.topic = topic
        self.n = n
        self.acked: dict[int, tuple[int, int]] = {}
        self.errors: list[tuple[int, str]] = []
        self.sent = 0
        self.stop = threading.Event()  # set only to end a failed test early

    def run(self) -> None:
        import confluent_kafka

        producer = confluent_kafka.Producer({
            "bootstrap.servers": self.bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 180_000,
            "reconnect.backoff.max.ms": 500,
        })

        def on_delivery(err, msg, i):
            if err is None:
                self.acked[i] = (msg.partition(), msg.offset())
            else:
                self.errors.append((i, str(err)))

        deadline = time.monotonic() + 150
        for i in range(self.n):
            if time.monotonic() > deadline or self.stop.is_set():
                break
            while True:
                try:
                    producer.produce(self.topic, key=f"{self.name_}-{i % 11}".encode(),
                                     value=f"{self.name_}:{i}".encode(),
                                     on_delivery=lambda err, msg, i=i: on_delivery(err, msg, i))
                    break
                except BufferError:
                    producer.poll(0.05)
            self.sent += 1
            producer.poll(0)
            if i % 100 == 0:
                time.sleep(0.02)  # a steady load over a few seconds, not one burst
        producer.flush(0 if self.stop.is_set() else 180)


def wait_acked(producers: list[IdempotentProducer], at_least: int, server: ServerProcess) -> int:
    deadline = time.monotonic() + 90
    while sum(len(p.acked) for p in producers) < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
    acked = sum(len(p.acked) for p in producers)
    assert acked >= at_least, server.log_text()
    return acked


def check_crash_rows(rows: list[dict], producers: list[IdempotentProducer], acked_before_crash: int) -> None:
    """Every acknowledged record stored once at its offset; per partition gapless, each producer in order."""
    stored: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    by_partition: dict[int, list[tuple[int, str, int]]] = defaultdict(list)
    for row in rows:
        name, seq = bytes(row["value"]).decode().split(":")
        stored[(name, int(seq))].append((row["partition"], row["offset"]))
        by_partition[row["partition"]].append((row["offset"], name, int(seq)))

    duplicates = {k: v for k, v in stored.items() if len(v) > 1}
    assert not duplicates, f"{len(duplicates)} records stored twice, e.g. {list(duplicates.items())[:3]}"
    for p in producers:
        for i, (partition, offset) in p.acked.items():
            assert stored.get((p.name_, i)) == [(partition, offset)], f"acked record {p.name_}:{i} missing or moved"
    assert sum(len(p.acked) for p in producers) > acked_before_crash
    for partition, items in by_partition.items():
        items.sort()
        assert [o for o, _, _ in items] == list(range(len(items))), f"offset gap in partition {partition}"
        for p in producers:
            seqs = [seq for _, name, seq in items if name == p.name_]
            assert seqs == sorted(seqs), f"{p.name_} out of order in partition {partition}"


# -- 1. before the crash (server A) --------------------------------------------------------------

def test_kafka_python_admin_creates_alters_and_deletes_topics(story):
    from kafka.admin import ConfigResource, ConfigResourceType, NewPartitions, NewTopic
    from kafka.errors import InvalidConfigurationError, InvalidPartitionsError, TopicAlreadyExistsError

    server = story.server
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
        committed_end(server, "events", 2)  # the checkpoint the restart starts from
    finally:
        admin.close()


def test_confluent_admin_creates_topics_with_configs_and_deletes_one(story):
    from confluent_kafka.admin import (AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewTopic,
                                       ResourceType)

    server = story.server
    admin = confluent_admin(server)
    futures = admin.create_topics([NewTopic("jobs", 3), NewTopic("durable", 6, config={"retention.ms": "600000"}),
                                   NewTopic("crash", 2), NewTopic("scratch", 1)], request_timeout=60)
    for topic in ("jobs", "durable", "crash", "scratch"):
        futures[topic].result(60)
    resource = ConfigResource(ResourceType.TOPIC, "jobs", incremental_configs=[
        ConfigEntry("retention.bytes", "1048576", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(60)
    assert describe_topic_configs(admin, "jobs")["retention.bytes"] == (
        "1048576", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    admin.delete_topics(["scratch"], request_timeout=120)["scratch"].result(180)
    topics = {t: len(m.partitions) for t, m in admin.list_topics(timeout=30).topics.items()}
    assert topics == {"orders": 5, "events": 1, "jobs": 3, "durable": 6, "crash": 2}
    assert raw_produce_error(server, "scratch") == 3


def test_groups_of_both_clients_commit_offsets(story):
    from confluent_kafka import Consumer, TopicPartition
    from kafka import KafkaConsumer
    from kafka.structs import OffsetAndMetadata
    from kafka.structs import TopicPartition as KTopicPartition

    server = story.server
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "confluent-group"})
    result = consumer.commit(offsets=[TopicPartition("durable", p, 100 + p) for p in range(6)], asynchronous=False)
    assert all(tp.error is None for tp in result)
    consumer.close()
    for group in ("kp-durable", "kp-survivor"):  # the first is deleted just before the crash
        kp = KafkaConsumer(bootstrap_servers=server.bootstrap, group_id=group, enable_auto_commit=False)
        kp.commit({KTopicPartition("durable", 2): OffsetAndMetadata(7, "", -1)})
        kp.close()
    assert committed_confluent(server.bootstrap, "confluent-group", "durable") == {p: 100 + p for p in range(6)}
    admin = kp_admin(server)
    try:
        for group in ("kp-durable", "kp-survivor"):
            kp_offsets = admin.list_group_offsets({group: None})[group]
            assert {tp.partition: om.offset for tp, om in kp_offsets.items()} == {2: 7}
    finally:
        admin.close()


def test_a_group_consumer_commits_as_it_reads(story):
    import confluent_kafka

    server = story.server
    acked = produce_numbered(server.bootstrap, "jobs", 900, partitions=3)
    config = {"bootstrap.servers": server.bootstrap, "group.id": "workers", "auto.offset.reset": "earliest",
              "enable.auto.commit": False}
    consumer = confluent_kafka.Consumer(config)
    story.clients.append(consumer)
    consumer.subscribe(["jobs"])
    before: list = []
    deadline = time.monotonic() + 120
    while len(before) < 400 and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None or msg.error():
            continue
        before.append((msg.partition(), msg.offset()))
        if len(before) % 50 == 0:
            consumer.commit(asynchronous=False)  # everything read so far
    assert len(before) >= 400
    # the consumer stays open (member of the group) until the crash
    story.state.update(jobs_acked=acked, jobs_config=config, jobs_consumer=consumer, jobs_before=before)


def test_rows_are_queried_by_name_over_jdbc(story):
    from kafka import KafkaProducer

    server = story.server
    producer = KafkaProducer(bootstrap_servers=server.bootstrap, acks="all")
    story.clients.append(producer)
    for i in range(300):
        producer.send("jdbc", key=b"k%d" % (i % 7), value=b"row-%d" % i)
    producer.flush()
    committed_end(server, "jdbc", 300)
    deadline = time.monotonic() + 90
    while True:
        out = beeline(story.thrift, "SELECT count(*) AS n, count(DISTINCT `offset`) AS d FROM records "
                                    "WHERE topic = 'jdbc'")
        if out.splitlines()[-1] == "300,300" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert out.splitlines()[-2:] == ["n,d", "300,300"], out
    assert "records" in beeline(story.thrift, "SHOW TABLES")
    story.state["jdbc_producer"] = producer  # it rides through the crash


def test_kill_9_under_load_right_after_commits_and_typed_writes_and_the_children_exit(story):
    from confluent_kafka import Consumer, TopicPartition
    from kafka import KafkaProducer

    server = story.server
    typed = KafkaProducer(bootstrap_servers=server.bootstrap, acks="all", linger_ms=100)
    story.clients.append(typed)
    for topic in ("payments", "sensors"):  # created (Metadata) now, so the sends below take one round trip
        assert typed.partitions_for(topic) == {0}
    committer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "confluent-group"})
    story.clients.append(committer)
    admin = kp_admin(server)
    story.clients.append(admin)

    producers = [IdempotentProducer(f"p{k}", server.bootstrap, "crash") for k in range(2)]
    story.state["crash_producers"] = producers
    for p in producers:
        p.start()
    acked_before_crash = wait_acked(producers, 1000, server)

    for i in range(10):  # one batch each: good and bad values together, acknowledged (WAL) just before the kill
        typed.send("payments", value=BAD_PAYMENTS.get(i, payment(i)))
        typed.send("sensors", value=avro_value({"sensor": f"s{i}", "celsius": i / 2, "at": AT})
                   if i != 4 else b"\0\0\0\0\7garbage")
    typed.flush()
    assert admin.delete_groups(["kp-durable"]) == {"kp-durable": "OK"}
    committer.commit(offsets=[TopicPartition("durable", 0, 500)], asynchronous=False)

    children = server.descendants()
    names = " ".join(describe(children))  # a short-lived child may already be a zombie
    assert "java" in names and "resource_tracker" in names and "spawn_main" in names, describe(children)
    # kill -9 right after the commit and the deletion were answered, the typed records not yet in the
    # table (a commit takes far longer than this), the producers mid-stream
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(30)
    _gone, alive = psutil.wait_procs(children, timeout=CHILDREN_GRACE_S)
    leftover = describe(alive)
    reap(alive, 0)
    killed = server.kill()  # reaps anything of its process group
    assert leftover == [], f"outlived the server by {CHILDREN_GRACE_S} s: {leftover}"
    assert killed == []
    story.state["acked_before_crash"] = acked_before_crash
    typed.close(timeout=10)
    for client in (committer, admin, story.state["jobs_consumer"]):
        client.close()
    for client in (typed, committer, admin, story.state["jobs_consumer"]):
        story.clients.remove(client)


# -- 2. one restart (server B) -----------------------------------------------------------------------

def test_the_restart_on_the_same_data_dir_and_port_recovers_the_wal(story):
    server = story.start("server-b.log")
    assert server.port == story.port
    # The WAL after the checkpoint goes to the table first once Spark is up (it listened before).
    deadline = time.monotonic() + 120
    while "recovery:" not in server.log_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "recovery:" in server.log_text()


def test_topics_partitions_and_configs_survived_and_deleted_topics_stay_deleted(story):
    from confluent_kafka.admin import ConfigSource
    from kafka.admin import ConfigResource, ConfigResourceType

    server = story.server
    admin = kp_admin(server)
    try:
        assert {t["name"]: len(t["partitions"]) for t in admin.describe_topics()} == TOPICS_AFTER_RESTART
        assert "1048576" in repr(admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "orders")]))
    finally:
        admin.close()
    confluent = confluent_admin(server)
    assert describe_topic_configs(confluent, "durable")["retention.ms"] == (
        "600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert describe_topic_configs(confluent, "jobs")["retention.bytes"] == (
        "1048576", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert "scratch" not in confluent.list_topics(timeout=30).topics
    assert raw_produce_error(server, "scratch") == 3
    assert kp_produce(server, "events", [b"new-2"]) == [2]  # the re-created topic goes on where it was


def test_committed_offsets_and_a_group_deletion_survived(story):
    from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
    from kafka import KafkaConsumer
    from kafka.structs import OffsetAndMetadata
    from kafka.structs import TopicPartition as KTopicPartition

    server = story.server
    assert committed_confluent(server.bootstrap, "confluent-group", "durable") == {
        0: 500, **{p: 100 + p for p in range(1, 6)}}
    kp = KafkaConsumer(bootstrap_servers=server.bootstrap, group_id="kp-durable", enable_auto_commit=False)
    assert kp.committed(KTopicPartition("durable", 2)) is None  # its deletion survived too
    kp.close()
    kadmin = kp_admin(server)
    try:
        kp_offsets = kadmin.list_group_offsets({"kp-survivor": None})["kp-survivor"]
        assert {tp.partition: om.offset for tp, om in kp_offsets.items()} == {2: 7}
    finally:
        kadmin.close()

    # The admin views see a group known only by its offsets.
    admin = confluent_admin(server)
    listed = {g.group_id for g in admin.list_consumer_groups().result(30).valid}
    assert "confluent-group" in listed and "kp-durable" not in listed
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("confluent-group")])
    got = offsets["confluent-group"].result(30)
    assert {tp.partition: tp.offset for tp in got.topic_partitions} == {0: 500, **{p: 100 + p for p in range(1, 6)}}
    admin.delete_consumer_groups(["confluent-group"])["confluent-group"].result(30)
    assert committed_confluent(server.bootstrap, "confluent-group", "durable") == {p: -1001 for p in range(6)}
    assert "confluent-group" not in {g.group_id for g in admin.list_consumer_groups().result(30).valid}

    # Offsets committed now must survive the clean stop at the end (checked on the stopped data directory).
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "after-restart"})
    result = consumer.commit(offsets=[TopicPartition("durable", p, 200 + p) for p in range(6)], asynchronous=False)
    assert all(tp.error is None for tp in result)
    consumer.close()
    kp = KafkaConsumer(bootstrap_servers=server.bootstrap, group_id="kp-after-restart", enable_auto_commit=False)
    kp.commit({KTopicPartition("durable", 2): OffsetAndMetadata(9, "", -1)})
    kp.close()


def test_the_group_consumer_resumes_from_its_committed_offsets(story):
    import confluent_kafka

    acked, before = story.state["jobs_acked"], story.state["jobs_before"]
    committed = len(before)
    consumer = confluent_kafka.Consumer(story.state["jobs_config"])
    try:
        consumer.subscribe(["jobs"])
        after: list = []
        deadline = time.monotonic() + 120
        while len(set(before) | set(after)) < len(acked) and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            after.append((msg.partition(), msg.offset()))
    finally:
        consumer.close()
    # Resumed from the commits: nothing skipped, and nothing before the last commit read again.
    assert set(before) | set(after) == set(acked.values())
    assert not set(before[:committed]) & set(after)


def test_producers_ride_through_the_restart(story):
    from kafka import KafkaProducer

    server = story.server
    producers = story.state["crash_producers"]
    for p in producers:
        p.join(240)
    assert not any(p.is_alive() for p in producers), "producers did not finish"

    jdbc = story.state.pop("jdbc_producer")
    for i in range(300, 400):
        jdbc.send("jdbc", value=b"row-%d" % i)
    jdbc.flush()
    jdbc.close()
    story.clients.remove(jdbc)

    typed = KafkaProducer(bootstrap_servers=server.bootstrap, acks="all")
    typed.send("payments", value=payment(10))
    typed.flush()
    typed.close()


class LoadConnection(threading.Thread):
    """Pipelined acks=-1 produce (up to ``in_flight`` requests ahead) until the server closes."""

    def __init__(self, host: str, port: int, name: str, in_flight: int = 4) -> None:
        super().__init__(daemon=True, name=name)
        self.client = rc.RawClient(host, port, timeout_s=60)
        self.topic = name
        self.in_flight = in_flight
        self.sent: list[list[bytes]] = []
        self.answers: list[tuple[int, int]] = []  # (error code, base offset) per answered request
        self.failure: str | None = None
        self.started = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + 120
        try:
            while time.monotonic() < deadline and len(self.sent) < 50_000:
                while len(self.sent) - len(self.answers) < self.in_flight:
                    values = [f"{self.topic}:{len(self.sent)}:{i}".encode() for i in range(5)]
                    self.client.send(rc.frame(rc.produce(self.topic, values), len(self.sent)))
                    self.sent.append(values)
                cid, body = self.client.read_response()
                if cid != len(self.answers):
                    self.failure = f"response {cid}, expected {len(self.answers)}"
                    return
                part = rc.decode_produce_response(body).responses[0].partition_responses[0]
                self.answers.append((int(part.error_code), int(part.base_offset)))
                if len(self.answers) > 20:
                    self.started.set()
        except (ConnectionError, OSError) as exc:
            self.closed_with = repr(exc)  # expected: the server stopped
        finally:
            self.started.set()
            self.client.close()


# -- 3. SIGTERM under load ----------------------------------------------------------------------------

def test_sigterm_under_load_answers_every_request_read_and_exits_0(story):
    server = story.server
    setup = rc.RawClient(server.host, server.port)
    for i in range(4):
        setup.send(rc.frame(rc.metadata(f"load-{i}"), i))
        setup.read_response()
    setup.close()
    loads = [LoadConnection(server.host, server.port, f"load-{i}") for i in range(4)]
    for load in loads:
        load.start()
    for load in loads:
        assert load.started.wait(60)
    # The ordered shutdown in bounded time: the last table commit, then Spark's stop, which the server
    # itself bounds by STOP_TIMEOUT_S (60 s). 60 s in all was below that bound and failed on a loaded CI
    # machine; stop() fails the test with the log's end, which says the stage that did not end.
    code = server.stop(timeout_s=STOP_TIMEOUT_S + 60)
    for load in loads:
        load.join(30)
        assert not load.is_alive()
    log = server.log_text()
    assert code == 0, log
    assert "responses unsent" not in log, log
    # the resource tracker ignores SIGTERM: it must be left to exit on EOF,
    # not terminated (that cost 10 s and a SIGKILL), see stop_children
    assert not [line for line in log.splitlines() if "stopped child" in line and "resource_tracker" in line], log
    story.state["loads"] = loads


# -- 4. one read ----------------------------------------------------------------------------------------------

def test_one_read_finds_every_acknowledged_record_once_in_order(story):
    """A classic Spark session in another process, on the same metastore, tables by name."""
    events, crash, jdbc, payments, dead, sensors, typed_in_records, load_rows = read_tables(story.data_dir, [
        "SELECT `offset`, value FROM pipeline.records WHERE topic = 'events' ORDER BY `offset`",
        "SELECT `partition`, `offset`, value FROM pipeline.records WHERE topic = 'crash'",
        "SELECT `offset`, value FROM pipeline.records WHERE topic = 'jdbc' ORDER BY `offset`",
        "SELECT `offset`, id, amount, at, tags, value FROM pipeline.payments ORDER BY `offset`",
        "SELECT topic, `partition`, `offset`, value, error FROM pipeline.dead_letters ORDER BY topic, `offset`",
        "SELECT `offset`, sensor, celsius, at FROM pipeline.sensors ORDER BY `offset`",
        "SELECT count(*) AS n FROM pipeline.records WHERE topic IN ('payments', 'sensors')",
        "SELECT topic, `offset`, value FROM pipeline.records WHERE topic LIKE 'load-%'"])

    # the deleted topic's rows went with it; the re-created one's are all there
    assert [(r["offset"], r["value"]) for r in events] == [(0, b"new-0"), (1, b"new-1"), (2, b"new-2")]

    check_crash_rows(crash, story.state["crash_producers"], story.state["acked_before_crash"])

    assert [r["offset"] for r in jdbc] == list(range(400))
    assert [r["value"] for r in jdbc] == [b"row-%d" % i for i in range(400)]

    good = [i for i in range(11) if i not in BAD_PAYMENTS]
    assert [r["offset"] for r in payments] == good
    assert [r["id"] for r in payments] == good
    assert [r["amount"] for r in payments] == [Decimal(f"{i}.25") for i in good]
    assert {r["at"] for r in payments} == {AT}
    assert [r["tags"] for r in payments] == [["a", str(i)] for i in good]
    assert [r["value"] for r in payments] == [payment(i) for i in good]  # the raw bytes stay beside
    assert [(r["topic"], r["offset"]) for r in dead] == [("payments", 3), ("payments", 5), ("payments", 8),
                                                         ("sensors", 4)]
    assert [r["value"] for r in dead[:3]] == [BAD_PAYMENTS[3], BAD_PAYMENTS[5], BAD_PAYMENTS[8]]
    assert "JSON" in dead[0]["error"] and "id" in dead[1]["error"]
    assert all(r["error"] for r in dead)
    assert [(r["offset"], r["sensor"], r["celsius"], r["at"]) for r in sensors] == [
        (i, f"s{i}", i / 2, AT) for i in range(10) if i != 4]
    assert typed_in_records == [{"n": 0}]  # nothing of a typed topic in the records table

    stored: dict[bytes, list[tuple[str, int]]] = defaultdict(list)
    for row in load_rows:
        stored[bytes(row["value"])].append((row["topic"], row["offset"]))
    acked = 0
    for load in story.state["loads"]:
        assert load.failure is None, load.failure
        # answered in order; whatever was answered with success is stored once, at its offset
        for values, (error, base) in zip(load.sent, load.answers):
            if error == 0:
                for i, value in enumerate(values):
                    assert stored.get(value) == [(load.topic, base + i)], value
                acked += len(values)
            else:
                assert error in (6, 7, 56), error  # not leader, timed out, storage error: never stored
        # requests sent but never answered were not read by the server: not stored either
        for values in load.sent[len(load.answers):]:
            assert all(v not in stored for v in values)
    assert acked > 0
    assert len(load_rows) == acked


def test_committed_offsets_survived_the_clean_stop(story):
    """What the next start loads (the coordinator reads nothing else): the file of committed offsets."""
    from pipeline.coordinator.offset_store import STORE_FILE, OffsetStore

    store = OffsetStore(story.data_dir / "_pipeline" / STORE_FILE)
    try:
        groups = store.load()
    finally:
        store.close()
    offsets = {group: {tp: value[0] for tp, value in stored.items()} for group, (_type, stored) in groups.items()}
    assert offsets["after-restart"] == {("durable", p): 200 + p for p in range(6)}
    assert offsets["kp-after-restart"] == {("durable", 2): 9}
    assert offsets["kp-survivor"] == {("durable", 2): 7}  # committed before the crash, after it
    # the resumed consumer's group: what it committed before the crash (it read 400 records, committing
    # every 50, and commits nothing after the restart)
    before = story.state["jobs_before"]
    assert offsets["workers"] == {("jobs", p): max(o for q, o in before if q == p) + 1 for p, _ in before}
    assert "confluent-group" not in offsets and "kp-durable" not in offsets  # both deletions stayed


def test_a_changed_typed_schema_is_refused_at_the_next_start(story):
    # a changed schema for a topic whose table exists is refused at start, naming the topic (exit 2)
    story.config.write_text(story.config.read_text().replace(PAYMENTS_DDL, "id STRING"))
    refused = ServerProcess(story.data_dir, "--config", str(story.config), log_path=story.root / "refused.log")
    with pytest.raises(RuntimeError, match="exited with 2"):
        refused.start()
    assert "topic 'payments': table pipeline.payments has columns" in refused.log_text()


# -- pipeline.ack.on=spark -------------------------------------------------------------------------------------

@pytest.mark.crash
def test_kill_9_under_load_with_ack_on_spark_loses_no_acknowledged_record(tmp_path):
    # Servers of its own: acknowledging only once Spark committed is another configuration than the
    # story's (ack on the WAL), and a crash has to be tested in it too.
    data_dir = tmp_path / "data"
    port = free_port()
    # Compaction too, while the live view's snapshots are taken (issue 33: commits, compaction and a
    # reader together, in both ack modes).
    args = ("--ack-on", "spark", "--num-partitions", "2", "--linger-ms", "100",
            "--table-compaction-interval-ms", "3000", "--table-compaction-min-files", "3")
    server = ServerProcess(data_dir, *args, port=port).start()
    producers = [IdempotentProducer(f"p{k}", server.bootstrap, "crash") for k in range(2)]
    try:
        for p in producers:
            p.start()
        acked_before_crash = wait_acked(producers, 1000, server)
        server.kill()  # SIGKILL mid-stream
        server = ServerProcess(data_dir, *args, port=port, log_path=tmp_path / "restarted-server.log").start()
        # the live view, while the producers go on after the restart: each snapshot holds every
        # record acknowledged before its query once (a commit per linger.ms, a tail between them)
        snapshots = live_snapshots(server, "crash", producers)
        for p in producers:
            p.join(240)
        assert not any(p.is_alive() for p in producers), "producers did not finish"
    finally:
        for p in producers:
            if p.is_alive():
                p.stop.set()
        code = server.stop() if server.running else None
    assert code == 0, server.log_text()
    # The restart recovered (its summary line); WAL records after the checkpoint ("recovery: N WAL
    # records ...") there are only if the kill came between a WAL write and the next commit.
    assert "recovery done in" in server.log_text()
    check_crash_rows(read_table(data_dir, "SELECT `partition`, `offset`, value FROM records"),
                     producers, acked_before_crash)
    assert snapshots, "no live view snapshot"
    assert all(n == distinct for n, distinct, _ in snapshots), f"a record twice in the live view: {snapshots}"
    assert all(missing == 0 for _, _, missing in snapshots), snapshots


def live_snapshots(server: ServerProcess, topic: str, producers: list[IdempotentProducer],
                   ) -> list[tuple[int, int, int]]:
    """Up to three snapshots of ``topic`` through ``pipeline.records_live`` (Spark Connect, by name), 2 s
    apart, while any of ``producers`` runs (at least one): (rows, distinct (partition, offset),
    acknowledged before the query but missing)."""
    from pipeline.persist.spark_sink import build_spark_session

    session = build_spark_session(remote=f"sc://127.0.0.1:{server.connect_port}")
    out: list[tuple[int, int, int]] = []
    try:
        deadline = time.monotonic() + 120
        while (not out or any(p.is_alive() for p in producers)) and len(out) < 3 and time.monotonic() < deadline:
            before = {po for p in producers for po in list(p.acked.values())}
            got = [(r[0], r[1]) for r in session.sql(
                f"SELECT `partition`, `offset` FROM pipeline.records_live WHERE topic = '{topic}'").collect()]
            out.append((len(got), len(set(got)), len(before - set(got))))
            time.sleep(2.0)
    finally:
        session.stop()
    return out
