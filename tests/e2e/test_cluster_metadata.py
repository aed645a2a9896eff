"""Metadata made through one broker of ``pipeline serve --brokers 3`` is served by the other two
within 1 s (issue 24), with the stores on SQLite files and on a real PostgreSQL server.

One cluster per backend (module-scoped, parametrized): the backend is a server-level setting
(``--metadata-url``), so the two cannot be one server, and no shared server runs three brokers.
Both clusters' brokers write through the session's Spark Connect server (``--spark-remote``, a
catalog database of each cluster's own): nothing here writes the table, and the supervisor's own
Connect JVM would add ~30 s per cluster.

Real clients make each change through broker 0 (confluent-kafka's AdminClient and Consumer
bootstrapped on it alone): a topic, an ACL, a SCRAM user, a committed offset. Then every broker
is asked, each on a connection of its own (Kafka requests pinned to one broker, which a client
library does not do), every ~50 ms, until it answers with the change; the time from the
change's acknowledgement to the end of the first request that showed it must be within 1 s,
the issue's bound. Committed offsets are served by the group's coordinator alone, as Kafka
serves them: the other brokers answer OffsetFetch NOT_COORDINATOR and name the coordinator in
FindCoordinator, and an AdminClient bootstrapped on broker 1 or 2 reads the offsets through it.

Leadership is through the database (``--cluster-leadership database``, the multi-host mode; run here
with ``--ack-on spark``, ``--ack-on wal`` is tests/e2e/test_failover.py's and test_live_view.py's): the
controller assigns partitions and group coordinators, and each move
bumps a partition's leader epoch. The last test stops a broker (SIGTERM: a controlled shutdown ends
its lease, its partitions move at once; the supervisor starts it again and it gets them back) and
checks the epochs clients see (KIP-320): Metadata's go up with each move, a Fetch or ListOffsets
naming the old epoch is FENCED_LEADER_EPOCH, and a confluent-kafka consumer group and a kafka-python
consumer (which validates its position with OffsetForLeaderEpoch after each move) read the topic
across both moves, nothing skipped.
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import time
from collections.abc import Callable, Iterator

import pytest
from kio.schema.describe_acls.v3.request import DescribeAclsRequest
from kio.schema.describe_acls.v3.response import DescribeAclsResponse
from kio.schema.describe_user_scram_credentials.v0.request import DescribeUserScramCredentialsRequest, UserName
from kio.schema.describe_user_scram_credentials.v0.response import DescribeUserScramCredentialsResponse
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.fetch.v12.response import FetchResponse
from kio.schema.find_coordinator.v4.response import FindCoordinatorResponse
from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.schema.list_offsets.v7.response import ListOffsetsResponse
from kio.schema.metadata.v9.request import MetadataRequest
from kio.schema.metadata.v9.response import MetadataResponse
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup
from kio.schema.offset_fetch.v8.response import OffsetFetchResponse
from kio.serial import entity_reader
from kio.static.primitive import i8, i32, i64

from pipeline.cluster.membership import OFFSETS_TOPIC, offsets_partition, preferred_leader
from tests.conftest import unique_database
from tests.e2e import raw_client as rc
from tests.e2e.cluster_process import Cluster
from tests.e2e.live_view_load import PacedLoad, assert_each_acknowledged_record_once, live_snapshots
from tests.e2e.table_reader import wait_for_live_view

pytestmark = pytest.mark.slow

BROKERS = 3
BOUND_S = 1.0
"""Issue 24: "Metadata created on one broker ... is seen by the others within 1 s"."""
POLL_S = 0.05
WAIT_S = 60.0
"""How long a broker is asked before the test gives up (the bound is checked on what was measured)."""
NOT_COORDINATOR = 16
FENCED_LEADER_EPOCH = 74


DATABASES: dict[str, str] = {}
"""backend -> the catalog database of that backend's cluster."""


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def cluster(request, tmp_path_factory, connect_server) -> Iterator[tuple[str, Cluster]]:
    """``pipeline serve --brokers 3`` with leadership through the database and an authorizer
    (ANONYMOUS a super user, so the plain clients may create ACLs), its stores on SQLite or in a fresh
    PostgreSQL database."""
    backend = request.param
    # A catalog database of its own: the Connect server's catalog is shared with other tests.
    DATABASES[backend] = unique_database()
    args = ["--spark-remote", connect_server.url, "--table-database", DATABASES[backend],
            "--authorizer-class-name", "pipeline", "--super-users", "User:ANONYMOUS",
            "--cluster-leadership", "database", "--ack-on", "spark", "--linger-ms", "20",
            "--schema-registry-listeners", "http://127.0.0.1:0",
            # compaction while the live view's snapshots are taken (issue 33)
            "--table-compaction-interval-ms", "3000", "--table-compaction-min-files", "3"]
    if backend == "postgresql":
        args += ["--metadata-url", request.getfixturevalue("postgres_server").create_database("cluster")]
    c = Cluster(tmp_path_factory.mktemp(f"cluster-metadata-{backend}") / "data", BROKERS, *args)
    try:
        c.start()
        assert sorted(c.addresses) == list(range(BROKERS))
        _until(lambda: all(len(_ask(c.addresses[n], rc.metadata(), MetadataResponse).brokers) == BROKERS
                           for n in range(BROKERS)), "every broker a live member", c)
        yield backend, c
        assert c.stop() == 0, c.log_text()
    finally:
        c.kill_all()


class Pinned:
    """One connection to one broker, for requests that must be answered by that broker."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.client = rc.RawClient(*address)
        self._correlation = 0

    def call(self, request, response_type):
        self._correlation += 1
        self.client.send(rc.frame(request, self._correlation))
        correlation, body = self.client.read_response()
        assert correlation == self._correlation and body[0] == 0  # flexible response header: no tagged fields
        return entity_reader(response_type)(body, 1)[0]

    def close(self) -> None:
        self.client.close()


def _until(condition: Callable[[], object], what: str, c: Cluster, timeout_s: float = WAIT_S) -> object:
    """``condition()`` every ``POLL_S`` until it is true; its value. A connection refused or reset (a broker
    restarting) counts as not yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = condition()
            if value:
                return value
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s\n{c.log_text()}"
        time.sleep(POLL_S)


def _ask(address: tuple[str, int], request, response_type):
    """One request on a connection of its own to the broker at ``address``."""
    broker = Pinned(address)
    try:
        return broker.call(request, response_type)
    finally:
        broker.close()


@pytest.fixture
def pinned(cluster) -> Iterator[dict[int, Pinned]]:
    _backend, c = cluster
    connections = {node: Pinned(address) for node, address in sorted(c.addresses.items())}
    yield connections
    for connection in connections.values():
        connection.close()


def _admin(c: Cluster, node: int):
    from confluent_kafka.admin import AdminClient

    host, port = c.addresses[node]
    return AdminClient({"bootstrap.servers": f"{host}:{port}"})


def _seen_after(brokers: dict[int, Pinned], acknowledged: float, sees: Callable[[Pinned], bool]) -> dict[int, float]:
    """Ask each broker every ``POLL_S`` until it ``sees`` the change; per broker, the seconds from
    ``acknowledged`` (a ``time.monotonic()``) to the end of the first request that saw it."""
    seen: dict[int, float] = {}
    deadline = acknowledged + WAIT_S
    while len(seen) < len(brokers) and time.monotonic() < deadline:
        for node, broker in brokers.items():
            if node not in seen and sees(broker):
                seen[node] = time.monotonic() - acknowledged
        time.sleep(POLL_S)
    assert len(seen) == len(brokers), f"not seen by brokers {sorted(set(brokers) - set(seen))} in {WAIT_S} s"
    return seen


def _within_bound(what: str, backend: str, seen: dict[int, float]) -> None:
    print(f"{backend}: {what} seen after " + ", ".join(f"broker {n}: {s * 1000:.0f} ms" for n, s in sorted(seen.items())))
    assert max(seen.values()) <= BOUND_S, (what, seen)


def test_a_topic_created_through_broker_0_is_listed_by_every_broker(cluster, pinned):
    from confluent_kafka.admin import NewTopic

    backend, c = cluster
    topic = f"cm-{backend}-topic"
    admin = _admin(c, 0)
    admin.create_topics([NewTopic(topic, 3, 1, config={"retention.ms": "600000"})])[topic].result(60)
    acknowledged = time.monotonic()

    def listed(broker: Pinned) -> bool:  # Metadata for every topic: what the broker has, no lookup by name
        md = broker.call(MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                         include_cluster_authorized_operations=False,
                                         include_topic_authorized_operations=False), MetadataResponse)
        return any(t.name == topic and len(t.partitions) == 3 for t in md.topics)

    _within_bound("topic", backend, _seen_after(pinned, acknowledged, listed))


def test_an_acl_created_through_broker_0_is_described_by_every_broker(cluster, pinned):
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    backend, c = cluster
    topic = f"cm-{backend}-acl"
    acl = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:alice", "*",
                     AclOperation.READ, AclPermissionType.ALLOW)
    admin = _admin(c, 0)
    admin.create_acls([acl])[acl].result(60)
    acknowledged = time.monotonic()

    def described(broker: Pinned) -> bool:
        found = broker.call(DescribeAclsRequest(
            resource_type_filter=i8(2), resource_name_filter=topic, pattern_type_filter=i8(3),  # TOPIC, LITERAL
            principal_filter=None, host_filter=None, operation=i8(1), permission_type=i8(1)),  # ANY, ANY
            DescribeAclsResponse)
        assert int(found.error_code) == 0, found
        return [(r.resource_name, a.principal, a.host, int(a.operation), int(a.permission_type))
                for r in found.resources for a in r.acls] == [(topic, "User:alice", "*", 3, 3)]  # READ, ALLOW

    _within_bound("ACL", backend, _seen_after(pinned, acknowledged, described))


def test_a_scram_user_created_through_broker_0_is_described_by_every_broker(cluster, pinned):
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    backend, c = cluster
    user = f"cm-{backend}-alice"
    admin = _admin(c, 0)
    upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"pw-alice")
    admin.alter_user_scram_credentials([upsert])[user].result(60)
    acknowledged = time.monotonic()

    def described(broker: Pinned) -> bool:
        answer = broker.call(DescribeUserScramCredentialsRequest(users=(UserName(name=user),)),
                             DescribeUserScramCredentialsResponse)
        [result] = answer.results
        return int(result.error_code) == 0 and [(int(i.mechanism), int(i.iterations))
                                                 for i in result.credential_infos] == [(1, 4096)]

    _within_bound("SCRAM user", backend, _seen_after(pinned, acknowledged, described))


def test_an_offset_committed_through_broker_0_is_read_through_every_broker_from_its_coordinator(cluster, pinned):
    from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
    from confluent_kafka.admin import NewTopic

    backend, c = cluster
    topic = f"cm-{backend}-offsets"
    # A group broker 0 coordinates, so the commit is made there: the controller gives the group's
    # __consumer_offsets partition to its preferred leader over the three brokers (pipeline.cluster.membership).
    group = next(g for g in (f"cm-{backend}-group-{i}" for i in range(100))
                 if preferred_leader(OFFSETS_TOPIC, offsets_partition(g), tuple(range(BROKERS))) == 0)
    creator = _admin(c, 0)
    creator.create_topics([NewTopic(topic, 3, 1)])[topic].result(60)
    readers = {node: _admin(c, node) for node in (1, 2)}
    for node, reader in readers.items():  # connected, and the topic known to it, before the commit
        deadline = time.monotonic() + WAIT_S
        while topic not in reader.list_topics(timeout=60).topics:
            assert time.monotonic() < deadline, f"broker {node} does not list {topic}"
            time.sleep(POLL_S)
    host, port = c.addresses[0]
    consumer = Consumer({"bootstrap.servers": f"{host}:{port}", "group.id": group, "enable.auto.commit": False})
    try:
        # The group's __consumer_offsets partition may still be loading on broker 0 (it can have moved
        # there as the brokers joined): Kafka answers COORDINATOR_LOAD_IN_PROGRESS, a retriable error the
        # Java consumer's commitSync retries by itself and librdkafka leaves to the application.
        retried_errors = (KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.NOT_COORDINATOR,
                                 KafkaError.COORDINATOR_NOT_AVAILABLE)
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                committed = consumer.commit(offsets=[TopicPartition(topic, 0, 5), TopicPartition(topic, 2, 3)],
                                            asynchronous=False)
                break
            except KafkaException as exc:
                if exc.args[0].code() not in retried_errors or time.monotonic() > deadline:
                    raise
                time.sleep(POLL_S)
        assert all(tp.error is None for tp in committed)
    finally:
        consumer.close()
    acknowledged = time.monotonic()

    seen: dict[int, float] = {}
    deadline = acknowledged + WAIT_S
    while len(seen) < len(readers) and time.monotonic() < deadline:
        for node, reader in readers.items():
            if node in seen:
                continue
            [future] = reader.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
            offsets = {(tp.topic, tp.partition): tp.offset for tp in future.result(60).topic_partitions}
            if offsets == {(topic, 0): 5, (topic, 2): 3}:
                seen[node] = time.monotonic() - acknowledged
        time.sleep(POLL_S)
    assert len(seen) == len(readers), f"offsets not read through brokers {sorted(set(readers) - set(seen))}"
    _within_bound("committed offsets", backend, seen)

    # Kafka's rule, on every broker: FindCoordinator names broker 0; only broker 0 answers OffsetFetch.
    for node, broker in pinned.items():
        [coordinator] = broker.call(FindCoordinatorRequest(key_type=i8(0), coordinator_keys=(group,)),
                                    FindCoordinatorResponse).coordinators
        assert (int(coordinator.error_code), int(coordinator.node_id)) == (0, 0), node
        [answer] = broker.call(OffsetFetchRequest(groups=(OffsetFetchRequestGroup(group_id=group, topics=None),)),
                               OffsetFetchResponse).groups
        if node == 0:
            assert int(answer.error_code) == 0
            assert {(t.name, int(p.partition_index)): int(p.committed_offset)
                    for t in answer.topics for p in t.partitions} == {(topic, 0): 5, (topic, 2): 3}
        else:
            assert int(answer.error_code) == NOT_COORDINATOR, node


# -- leader epochs (KIP-320) ------------------------------------------------------------------------


REGISTRY_LINE = re.compile(r"^broker (\d+): .*schema registry on (\S+)")


def _registry_urls(c: Cluster) -> dict[int, str]:
    """Each broker's Schema Registry URL, from the newest line it printed."""
    urls: dict[int, str] = {}
    for line in list(c.lines):
        m = REGISTRY_LINE.match(line)
        if m:
            urls[int(m.group(1))] = m.group(2)
    return urls


def test_a_schema_registered_through_broker_0_is_served_by_every_broker(cluster):
    """Issue 32: every broker serves one registry (its schemas in the metadata store): a schema
    registered through broker 0's registry (confluent-kafka's client) is read, looked up and
    checked through the other two."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    backend, c = cluster
    urls = _until(lambda: (lambda u: u if len(u) == BROKERS else None)(_registry_urls(c)),
                  "every broker's registry URL", c)
    v1 = '{"type":"record","name":"Sale","fields":[{"name":"sku","type":"string"}]}'
    v2 = '{"type":"record","name":"Sale","fields":[{"name":"sku","type":"string"},{"name":"qty","type":"int","default":1}]}'
    subject = f"sales-{backend}-value"
    first = SchemaRegistryClient({"url": urls[0]}).register_schema(subject, Schema(v1, "AVRO"))
    for node in (1, 2):
        other = SchemaRegistryClient({"url": urls[node]})
        assert other.get_schema(first).schema_str == v1
        assert other.lookup_schema(subject, Schema(v1, "AVRO")).schema_id == first
    second = SchemaRegistryClient({"url": urls[1]}).register_schema(subject, Schema(v2, "AVRO"))
    latest = SchemaRegistryClient({"url": urls[2]}).get_latest_version(subject)
    assert (latest.version, latest.schema_id) == (2, second) and second != first
    with pytest.raises(SchemaRegistryError) as e:  # checked against what broker 1 registered
        SchemaRegistryClient({"url": urls[2]}).register_schema(
            subject, Schema('{"type":"record","name":"Sale","fields":[{"name":"sku","type":"int"}]}', "AVRO"))
    assert e.value.http_status_code == 409


def test_a_registry_topic_created_through_one_broker_lands_as_columns_from_every_leader(cluster, connect_spark):
    """Issue 32 on a cluster: a topic created through broker 1 with ``value.format=avro`` (a topic config
    in the shared metadata store), its schema registered through broker 2's registry by confluent-kafka's
    serializer, its records produced to three partitions led by different brokers: every broker's table
    side reads the topic config and the writer schema, and the typed table holds every record, no dead
    letters."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from pipeline.table.layout import table_name_for_topic

    backend, c = cluster
    urls = _until(lambda: (lambda u: u if len(u) == BROKERS else None)(_registry_urls(c)),
                  "every broker's registry URL", c)
    topic = f"ledger_{backend}"
    host, port = c.addresses[1]
    admin = AdminClient({"bootstrap.servers": f"{host}:{port}"})  # kept alive until the answer
    admin.create_topics([NewTopic(topic, 3, config={"value.format": "avro"})])[topic].result(30)
    schema = '{"type":"record","name":"Entry","fields":[{"name":"n","type":"long"},{"name":"memo","type":"string"}]}'
    serialize = AvroSerializer(SchemaRegistryClient({"url": urls[2]}), schema)
    ctx = SerializationContext(topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": c.bootstrap(), "enable.idempotence": True})
    for n in range(30):
        producer.produce(topic, serialize({"n": n, "memo": f"m{n}"}, ctx), partition=n % 3)
    # --ack-on spark: each answer waits for its broker's first commit of a new typed table (its
    # take-over, the registry lookup, the table's creation), the brokers' commits one at a time on one
    # Connect server: on CI's loaded machine the last of the three came 66 s after the produce.
    assert producer.flush(180) == 0, c.log_about(topic, "leads", "taking over", "producer id")
    leaders = {leader for leader, _ in _leaders(c.addresses[0], topic).values()}
    table = f"{DATABASES[backend]}.{table_name_for_topic(topic)}"
    deadline = time.monotonic() + 120
    rows: list[tuple] = []
    while len(rows) < 30 and time.monotonic() < deadline:  # each broker commits its partitions' rows
        time.sleep(1)
        if connect_spark.catalog.tableExists(table):
            rows = [tuple(x) for x in connect_spark.sql(f"SELECT partition, n, memo FROM {table}").collect()]
    assert sorted(rows) == sorted((n % 3, n, f"m{n}") for n in range(30))
    dead = f"{DATABASES[backend]}.dead_letters"
    assert not connect_spark.catalog.tableExists(dead) or connect_spark.sql(
        f"SELECT count(*) FROM {dead} WHERE topic = '{topic}'").first()[0] == 0
    assert len(leaders) > 1, leaders  # the rows came through more than one broker's table side


def test_every_live_view_snapshot_holds_each_acknowledged_record_once(cluster, connect_spark):
    """Issue 33 on ``--brokers 3`` with ``--ack-on spark``: two idempotent producers write a
    6-partition topic led by the three brokers, each broker committing its own partitions (a Spark
    commit before each acknowledgement) and publishing its end offsets to the view, compaction
    merging the table's files every 3 s, while a reader
    takes snapshots of ``<database>.records_live`` by name through the Connect server: every
    snapshot holds each record acknowledged before its query once, and none never acknowledged.
    (``--ack-on wal``: tests/e2e/test_live_view.py.)"""
    from confluent_kafka.admin import AdminClient, NewTopic

    backend, c = cluster
    if backend != "sqlite":
        pytest.skip("the view's boundary and tail do not touch the metadata store: the SQLite cluster "
                    "(--brokers 3 on one machine, the issue's case) is enough; ~30 s of make test saved")
    topic = f"live_{backend}"
    admin = AdminClient({"bootstrap.servers": c.bootstrap()})
    admin.create_topics([NewTopic(topic, 6, 1)])[topic].result(30)
    _until(lambda: _agreed(c, list(range(BROKERS)), topic, 6), "the topic's leaders agreed", c)
    wait_for_live_view(connect_spark, database=DATABASES[backend])
    # Each acknowledgement waits for a Spark commit, and the 2-core CI machine runs another test
    # module beside this one: the producers wait up to 180 s for their last ones.
    load = PacedLoad(c.bootstrap(), topic, per_producer=500, flush_s=180.0).start()
    snapshots = live_snapshots(connect_spark, DATABASES[backend], load, count_table=False)
    load.join()
    assert not load.errors, load.errors[:5]
    assert len(load.acked) == load.producers * load.per_producer, (
        f"{len(load.acked)} of {load.producers * load.per_producer} records acknowledged within "
        f"{load.flush_s} s; the cluster's table side:\n{_table_side_lines(c)}")
    assert_each_acknowledged_record_once(snapshots, load)
    [final] = live_snapshots(connect_spark, DATABASES[backend], load, at_least=1, count_table=False)  # after the last ack
    assert final.rows == final.distinct == final.records == len(load.acked) and final.missing == 0, final
    assert len({leader for leader, _ in _leaders(c.addresses[0], topic).values()}) > 1


def _table_side_lines(c: Cluster, last: int = 40) -> str:
    """The last ``last`` lines of the cluster's log about its table side (take-overs, maintenance,
    commits that failed, warnings), each cut to 300 characters: first in a failure's message, where
    a CI report keeps it."""
    marks = ("WARNING", "ERROR", "maintenance", "more partition", "fenc", "controller")
    lines = [line[:300] for line in c.log_text().splitlines() if any(m in line for m in marks)]
    return "\n".join(lines[-last:])


def _leaders(address: tuple[str, int], topic: str) -> dict[int, tuple[int, int]]:
    """Metadata v9 of ``topic`` from the broker at ``address``: partition -> (leader id, leader epoch)."""
    md = _ask(address, rc.metadata(topic), MetadataResponse)
    return {int(p.partition_index): (int(p.leader_id), int(p.leader_epoch))
            for t in md.topics if t.name == topic and int(t.error_code) == 0 for p in t.partitions}


def _fetch(address: tuple[str, int], topic: str, partition: int, current_leader_epoch: int) -> tuple[int, int, int]:
    """Fetch v12 of ``topic``-``partition`` from offset 0 naming ``current_leader_epoch``:
    (error code, the leader id and epoch of ``current_leader``: always -1, -1, as Kafka below v16)."""
    response = _ask(address, FetchRequest(
        replica_id=i32(-1), max_wait=datetime.timedelta(0), min_bytes=i32(1), max_bytes=i32(1 << 20),
        isolation_level=i8(0), session_id=i32(0), session_epoch=i32(-1), forgotten_topics_data=(), rack_id="",
        topics=(FetchTopic(topic=topic, partitions=(FetchPartition(
            partition=i32(partition), current_leader_epoch=i32(current_leader_epoch), fetch_offset=i64(0),
            last_fetched_epoch=i32(-1), log_start_offset=i64(-1), partition_max_bytes=i32(1 << 20)),)),)),
        FetchResponse)
    [p] = response.responses[0].partitions
    return int(p.error_code), int(p.current_leader.leader_id), int(p.current_leader.leader_epoch)


def _list_offset(address: tuple[str, int], topic: str, partition: int, current_leader_epoch: int) -> tuple[int, int]:
    """ListOffsets v7 (latest) of ``topic``-``partition`` naming ``current_leader_epoch``: (error code, leader epoch)."""
    response = _ask(address, ListOffsetsRequest(replica_id=i32(-1), isolation_level=i8(0), topics=(ListOffsetsTopic(
        name=topic, partitions=(ListOffsetsPartition(partition_index=i32(partition),
                                                     current_leader_epoch=i32(current_leader_epoch),
                                                     timestamp=i64(-1)),)),)), ListOffsetsResponse)
    [p] = response.topics[0].partitions
    return int(p.error_code), int(p.leader_epoch)


def _agreed(c: Cluster, nodes: list[int], topic: str, partitions: int) -> dict[int, tuple[int, int]] | None:
    """The leaders and epochs of ``topic`` when every broker of ``nodes`` names the same, every partition has
    a leadership row (epoch 1 or more) and its leader serves it at that epoch; else None. Leader -1: the
    row's leader has not taken it over yet (LEADER_NOT_AVAILABLE)."""
    views = [_leaders(c.addresses[n], topic) for n in nodes]
    if (len(views[0]) != partitions or any(v != views[0] for v in views) or min(e for _, e in views[0].values()) < 1
            or min(leader for leader, _ in views[0].values()) < 0):
        return None
    if any(_fetch(c.addresses[leader], topic, p, epoch)[0] != 0 for p, (leader, epoch) in views[0].items()):
        return None
    return views[0]


def test_leader_epochs_go_up_with_each_move_a_stale_one_is_fenced_and_a_consumer_carries_on(cluster):
    """KIP-320 across two real moves: a broker's controlled shutdown (its partitions move to the others)
    and its return (they move back). Runs last in the module: it restarts a broker of the shared cluster."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import NewTopic

    backend, c = cluster
    topic, partitions, per_round = f"cm-{backend}-epochs", 3, 30
    admin = _admin(c, 0)
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)
    everyone = list(range(BROKERS))
    before = _until(lambda: _agreed(c, everyone, topic, partitions), "partitions led and served", c)
    assert isinstance(before, dict)
    # A new topic's partitions are recorded empty in the table when it is created (TopicCatalog's
    # on_new_partitions): their leaders take them over without reading the table.
    reads = [line for line in c.log_text().splitlines() if "read the table's end offsets" in line and topic in line]
    assert not reads, reads
    victim = next(n for n in (2, 1) if any(leader == n for leader, _ in before.values()))
    moved = sorted(p for p, (leader, _) in before.items() if leader == victim)
    print(f"{backend}: before {before}; stopping broker {victim}, leader of {moved}")

    producer = Producer({"bootstrap.servers": c.bootstrap(), "enable.idempotence": True, "linger.ms": 5})
    consumer = Consumer({"bootstrap.servers": c.bootstrap(), "group.id": f"cm-{backend}-epochs-readers",
                         "auto.offset.reset": "earliest", "enable.auto.commit": True})
    # kafka-python (3.x: KIP-320 position validation) reads the partitions without a group.
    from kafka import KafkaConsumer, TopicPartition

    reader = KafkaConsumer(bootstrap_servers=c.bootstrap().split(","), enable_auto_commit=False,
                           auto_offset_reset="earliest")
    reader.assign([TopicPartition(topic, p) for p in range(partitions)])
    first_delivery: dict[int, list[int]] = {p: [] for p in range(partitions)}
    values: set[bytes] = set()
    read: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}

    def produce_round(n: int) -> None:
        for i in range(n * per_round, (n + 1) * per_round):
            producer.produce(topic, value=b"%d" % i, partition=i % partitions)
        assert producer.flush(180) == 0, c.log_text()

    def consume_until(count: int) -> None:
        deadline = time.monotonic() + 180
        while len(values) < count or sum(map(len, read.values())) < count:
            assert time.monotonic() < deadline, (f"confluent-kafka consumed {len(values)}, kafka-python "
                                                 f"{sum(map(len, read.values()))} of {count}\n{c.log_text()}")
            for msg in consumer.consume(100, 0.2):
                assert msg.error() is None, msg.error()
                if msg.value() not in values:
                    values.add(msg.value())
                    first_delivery[msg.partition()].append(msg.offset())
            for tp, records in reader.poll(timeout_ms=200).items():
                read[tp.partition].extend((r.offset, r.value) for r in records)

    try:
        consumer.subscribe([topic])
        produce_round(0)
        consume_until(per_round)

        # 1. Broker `victim` stops (SIGTERM: its lease ends, its partitions move at once).
        os.kill(c.broker_pid(victim), signal.SIGTERM)
        others = [n for n in everyone if n != victim]

        def moved_away() -> dict[int, tuple[int, int]] | None:
            now = _agreed(c, others, topic, partitions)
            return now if now and all(now[p][0] != victim for p in moved) else None

        during = _until(moved_away, f"broker {victim}'s partitions served elsewhere", c)
        assert isinstance(during, dict)
        print(f"{backend}: while broker {victim} is away {during}")
        for p in range(partitions):
            assert during[p][1] > before[p][1] if p in moved else during[p][1] >= before[p][1], (p, before, during)
        for p in moved:  # a client with the metadata of before the move is told so
            leader, epoch = during[p]
            assert _fetch(c.addresses[leader], topic, p, before[p][1]) == (FENCED_LEADER_EPOCH, -1, -1)
            assert _list_offset(c.addresses[leader], topic, p, before[p][1]) == (FENCED_LEADER_EPOCH, -1)
            assert _list_offset(c.addresses[leader], topic, p, epoch) == (0, epoch)
        produce_round(1)
        consume_until(2 * per_round)

        # 2. The supervisor starts it again; it registers and gets its partitions back.
        c.wait_listening(BROKERS + 1, 400)

        def moved_back() -> dict[int, tuple[int, int]] | None:
            now = _agreed(c, everyone, topic, partitions)
            return now if now and all(now[p][0] == victim for p in moved) else None

        after = _until(moved_back, f"broker {victim}'s partitions back", c, timeout_s=400)
        assert isinstance(after, dict)
        print(f"{backend}: after broker {victim} came back {after}")
        for p in moved:
            assert after[p][1] > during[p][1], (p, during, after)
            assert _fetch(c.addresses[victim], topic, p, during[p][1])[0] == FENCED_LEADER_EPOCH
        produce_round(2)
        consume_until(3 * per_round)
    finally:
        consumer.close()
        reader.close()
        producer.flush(30)

    # Everything produced was read, each partition from offset 0 with no gap.
    assert values == {b"%d" % i for i in range(3 * per_round)}
    for p, offsets in first_delivery.items():
        assert offsets == list(range(3 * per_round // partitions)), (p, offsets)
    assert {v for records in read.values() for _, v in records} == values
    for p, records in read.items():
        assert [o for o, _ in records] == list(range(3 * per_round // partitions)), (p, records)
