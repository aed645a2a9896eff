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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from kio.schema.describe_acls.v3.request import DescribeAclsRequest
from kio.schema.describe_acls.v3.response import DescribeAclsResponse
from kio.schema.describe_user_scram_credentials.v0.request import DescribeUserScramCredentialsRequest, UserName
from kio.schema.describe_user_scram_credentials.v0.response import DescribeUserScramCredentialsResponse
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.find_coordinator.v4.response import FindCoordinatorResponse
from kio.schema.metadata.v9.request import MetadataRequest
from kio.schema.metadata.v9.response import MetadataResponse
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup
from kio.schema.offset_fetch.v8.response import OffsetFetchResponse
from kio.serial import entity_reader
from kio.static.primitive import i8

from pipeline.cluster import Cluster as Placement, ClusterBroker
from tests.conftest import unique_database
from tests.e2e import raw_client as rc
from tests.e2e.cluster_process import Cluster

pytestmark = pytest.mark.slow

BROKERS = 3
BOUND_S = 1.0
"""Issue 24: "Metadata created on one broker ... is seen by the others within 1 s"."""
POLL_S = 0.05
WAIT_S = 60.0
"""How long a broker is asked before the test gives up (the bound is checked on what was measured)."""
NOT_COORDINATOR = 16


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def cluster(request, tmp_path_factory, connect_server) -> Iterator[tuple[str, Cluster]]:
    """``pipeline serve --brokers 3`` with an authorizer (ANONYMOUS a super user, so the plain
    clients may create ACLs), its stores on SQLite or in a fresh PostgreSQL database."""
    backend = request.param
    # A catalog database of its own: the Connect server's catalog is shared with other tests.
    args = ["--spark-remote", connect_server.url, "--table-database", unique_database(),
            "--authorizer-class-name", "pipeline", "--super-users", "User:ANONYMOUS"]
    if backend == "postgresql":
        args += ["--metadata-url", request.getfixturevalue("postgres_server").create_database("cluster")]
    c = Cluster(tmp_path_factory.mktemp(f"cluster-metadata-{backend}") / "data", BROKERS, *args)
    try:
        c.start()
        assert sorted(c.addresses) == list(range(BROKERS))
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
    from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import NewTopic

    backend, c = cluster
    topic = f"cm-{backend}-offsets"
    placement = Placement(tuple(ClusterBroker(n, h, p) for n, (h, p) in sorted(c.addresses.items())), 0)
    # A group broker 0 coordinates (pipeline.cluster: crc32 of the id), so the commit is made there.
    group = next(g for g in (f"cm-{backend}-group-{i}" for i in range(100)) if placement.coordinator(g) == 0)
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
        committed = consumer.commit(offsets=[TopicPartition(topic, 0, 5), TopicPartition(topic, 2, 3)],
                                    asynchronous=False)
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
