"""The compatibility matrix's transaction column, and the admin tools' abort of a hanging transaction, against a
cluster (issue 35): ``--brokers 3`` on one machine.

One ``pipeline serve --brokers 3`` for the module (``tests/e2e/cluster_process.Cluster``: the
supervisor and three brokers, each with a PLAINTEXT listener alone, writing through the session's
Spark Connect server; leadership static, from the broker list). Every client of ``tests/compat/envs.CLIENTS`` that has a
transactional producer (those with a ``"transactions"`` entry in ``test_matrix.EXPECTED_LIMITATIONS``
have none and are left out) runs its family's driver from its cached environment, the same
drivers as ``tests/compat/test_matrix.py``, ``PARALLEL`` at a time, asked for the
``transactions`` capability alone: a transactional producer commits 3 records and aborts 2
(kcat: commits only, ``COMMIT_ONLY``) on partition 0 of ``compat-cluster-<client>-transactions``,
then a ``read_committed`` consumer reads the partition. Each driver is bootstrapped on broker 0
only, so it must follow Metadata and FindCoordinator to the other brokers: the transaction
coordinator and the partition's leader are, by construction, two different brokers (below). The
driver input's SASL_SSL fields are dummies: the drivers read them only for ``scram-tls`` (kafkajs
reads the CA file as it starts, so it is an empty file).

A cell is ✅ only when the driver reports success and ``test_matrix.check`` agrees, reading the
partition from its leader (the broker Metadata names, a raw Fetch there): a ``read_committed``
read sees exactly the committed records, a ``read_uncommitted`` one the aborted too, every batch
transactional. The test fails listing every client whose cell is not ✅, with its reason.

Coordinator and leader apart: the topic is created before the drivers run (a Metadata request to
broker 0 that auto-creates it with one partition, as a client's first Metadata would), and its
partition-0 leader is read from that answer. The static cluster places partition ``p`` of ``t`` on
the broker at index ``(crc32(t) + p) % N`` of the brokers sorted by id and a coordinator key ``k``
at ``crc32(k) % N`` (``pipeline/cluster/membership.py``), so each client's transactional id is the
first ``compat-cluster-<client>-<k>``, ``k = 0, 1, ...``, whose ``crc32 % 3`` differs from its
topic's ``crc32 % 3``: the EndTxn's coordinator then has to write the markers to a partition
another broker leads. FindCoordinator (key type 1) is asked of every broker for every transactional
id; for the confluent-kafka clients every broker must name the same coordinator, a broker of the
cluster. Which broker coordinated and which led is in the printed table (``-s``), informative: a
coordinator that turns out to be the leader (a server placing transactional ids by another rule)
fails nothing.
"""

from __future__ import annotations

import itertools
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.find_coordinator.v4.response import FindCoordinatorResponse
from kio.schema.metadata.v9.response import MetadataResponse
from kio.serial import entity_reader
from kio.static.primitive import i8
from kio.static.protocol import Entity

from tests.compat import envs
from tests.compat.driver_common import CAPABILITIES
from tests.compat.test_matrix import (
    EXPECTED_LIMITATIONS,
    PARALLEL,
    TIMEOUT_S,
    Cell,
    build_envs,
    checked,
    driver_input_file,
    run_driver,
)
from tests.conftest import unique_database
from tests.e2e import raw_client as rc
from tests.e2e.cluster_process import Cluster

pytestmark = pytest.mark.slow

BROKERS = 3
BOOTSTRAP = 0  # the node id of the one broker each driver is given
CAPABILITY = "transactions"
TRANSACTION_KEY_TYPE = 1
UNUSED_SASL_SSL = "127.0.0.1:1"  # no such listener: the drivers connect to it only for scram-tls, not asked for
R = TypeVar("R", bound=Entity)
CLIENTS = tuple(c for c in envs.CLIENTS if (c.key, CAPABILITY) not in EXPECTED_LIMITATIONS)


def cluster_topic(client: envs.Client, capability: str = CAPABILITY) -> str:
    """``compat-cluster-<client>-<capability>``: apart from the single-server matrix's ``compat-<client>-...``."""
    return f"compat-cluster-{client.key}-{capability}"


def static_index(key: str, partition: int = 0) -> int:
    """The index, among the brokers sorted by id, the static cluster gives a partition's leadership
    (``key`` a topic) or a coordinator (``key`` a group or transactional id, ``partition`` 0)."""
    return (zlib.crc32(key.encode()) + partition) % BROKERS


def transactional_id(client: envs.Client) -> str:
    """The first ``compat-cluster-<client>-<k>`` coordinated, by the static rule, by a broker that
    does not lead partition 0 of the client's topic."""
    leader = static_index(cluster_topic(client))
    return next(tid for k in itertools.count()
                if static_index(tid := f"compat-cluster-{client.key}-{k}") != leader)


@dataclass(frozen=True)
class Broker:
    """A broker as Metadata names it (``test_matrix.Endpoint``: what ``check`` reads from)."""

    node_id: int
    host: str
    port: int


@dataclass
class Found:
    """What FindCoordinator answered for one transactional id, broker by broker."""

    answers: dict[int, tuple[str, str, int]]  # asked node -> (error name or "", error message or "", node named)

    def agreed(self) -> int | None:
        """The coordinator every broker named without an error, else ``None``."""
        said = set(self.answers.values())
        if len(said) == 1 and (only := said.pop())[0] == "":
            return only[2]
        return None

    def describe(self, messages: bool = False) -> str:
        """The coordinator's node id, or what the brokers answered instead (each different answer once)."""
        if (node := self.agreed()) is not None:
            return str(node)
        return " / ".join(sorted({(f"{error}: {message}" if messages else error) if error else f"node {node}"
                                  for error, message, node in self.answers.values()}))


class ClusterInputs:
    """The drivers' inputs (``test_matrix.DriverInputs``): the transactions capability alone,
    bootstrapped on broker ``BOOTSTRAP``, the SASL_SSL fields dummies."""

    def __init__(self, tmp: Path, bootstrap: tuple[str, int]) -> None:
        self.tmp = tmp
        self.bootstrap = f"{bootstrap[0]}:{bootstrap[1]}"
        self.unused_ca = tmp / "unused-ca.pem"  # kafkajs reads it as it starts; nothing connects with it
        self.unused_ca.write_text("")

    def driver_input(self, client: envs.Client) -> Path:
        return driver_input_file(self.tmp / f"{client.key}.json", client, plaintext=self.bootstrap,
                                 sasl_ssl=UNUSED_SASL_SSL, ca=self.unused_ca,
                                 topics={c: cluster_topic(client, c) for c in CAPABILITIES},
                                 group=f"compat-cluster-{client.key}", transactional_id=transactional_id(client),
                                 capabilities=(CAPABILITY,), user="unused", password="unused")


def ask(address: tuple[str, int], request: Any, response_type: type[R]) -> R:
    """One request on a connection of its own to the broker at ``address``; its (flexible) response."""
    client = rc.RawClient(*address, timeout_s=30)
    try:
        client.send(rc.frame(request, 1, client_id="compat-cluster"))
        correlation, body = client.read_response()
    finally:
        client.close()
    assert correlation == 1 and body[0] == 0  # response header v1: no tagged fields
    return entity_reader(response_type)(body, 1)[0]


def create_and_lead(cluster: Cluster, topic: str) -> Broker:
    """Auto-create ``topic`` through broker ``BOOTSTRAP`` (Metadata v9, as a client's first Metadata
    does) and return partition 0's leader as that answer names it."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        md = ask(cluster.addresses[BOOTSTRAP], rc.metadata(topic), MetadataResponse)
        brokers = {int(b.node_id): Broker(int(b.node_id), b.host, int(b.port)) for b in md.brokers}
        (described,) = md.topics
        leaders = {int(p.partition_index): int(p.leader_id) for p in described.partitions}
        if int(described.error_code) == 0 and leaders.get(0, -1) in brokers:
            assert len(brokers) == BROKERS, f"Metadata lists {sorted(brokers)}"
            return brokers[leaders[0]]
        assert time.monotonic() < deadline, f"{topic}: no leader of partition 0 in {md}"
        time.sleep(0.2)


def find_coordinators(cluster: Cluster, keys: list[str]) -> dict[str, Found]:
    """FindCoordinator v4 (key type 1: transactional ids) for every key, asked of every broker."""
    found = {key: Found({}) for key in keys}
    for node, address in sorted(cluster.addresses.items()):
        response = ask(address, FindCoordinatorRequest(key_type=i8(TRANSACTION_KEY_TYPE),
                                                       coordinator_keys=tuple(keys)), FindCoordinatorResponse)
        for c in response.coordinators:
            error = "" if int(c.error_code) == 0 else c.error_code.name.upper()
            found[c.key].answers[node] = (error, c.error_message or "", int(c.node_id))
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, connect_server):
    """``pipeline serve --brokers 3``, PLAINTEXT only, writing through the session's Spark Connect
    server (a catalog database of its own; the supervisor's own Connect JVM would add ~25 s); its
    stop at the end must be clean."""
    build_envs()
    # group.initial.rebalance.delay.ms=0: a read-back's group (kafkajs) has one member, as in test_matrix
    c = Cluster(tmp_path_factory.mktemp("compat-cluster") / "data", BROKERS, "--group-initial-rebalance-delay-ms", "0",
                "--spark-remote", connect_server.url, "--table-database", unique_database())
    try:
        c.start()
        assert sorted(c.addresses) == list(range(BROKERS)), c.lines
        yield c
        assert c.stop() == 0, c.log_text()
    finally:
        c.kill_all()


def table(rows: list[list[str]]) -> str:
    header = ["client", "version", "transactional id", "coordinator (rule)", "leader (rule)", "transactions"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows])


def outcome(cell: Cell) -> str:
    if cell.ok:
        return "ok" + (f" ({cell.reason})" if cell.reason else "")
    return f"FAILED: {cell.reason}"[:160]


def test_transactions_column_against_three_brokers(cluster, tmp_path):
    leaders = {client: create_and_lead(cluster, cluster_topic(client)) for client in CLIENTS}
    tids = {client: transactional_id(client) for client in CLIENTS}
    found = find_coordinators(cluster, list(tids.values()))
    inputs = ClusterInputs(tmp_path, cluster.addresses[BOOTSTRAP])
    with ThreadPoolExecutor(PARALLEL) as pool:
        outcomes = dict(zip(CLIENTS, pool.map(lambda c: run_driver(inputs, c), CLIENTS)))

    rows, failures = [], []
    for client, (lines, stderr) in outcomes.items():
        version = lines.get("version", {}).get("detail", f"? ({stderr.strip()[-200:]})")
        said = lines.get(CAPABILITY)
        leader, tid = leaders[client], tids[client]
        cell = checked(leader, client, CAPABILITY, said, stderr, cluster_topic(client))
        rows.append([client.name, version, tid, f"{found[tid].describe()} ({static_index(tid)})",
                     f"{leader.node_id} ({static_index(cluster_topic(client))})", outcome(cell)])
        if not version.startswith(client.version):
            failures.append(f"{client.key}: the environment runs {version}")
        coordinator = "" if found[tid].agreed() in cluster.addresses else \
            f"FindCoordinator (key type 1) for {tid} names no one coordinator: {found[tid].describe(messages=True)}"
        if not cell.ok:
            failures.append(f"{client.key} transactions: {cell.reason}" + (f" [{coordinator}]" if coordinator else "")
                            + f" {(said or {}).get('trace', '')[-600:]}")
        elif client.family == "confluent" and coordinator:
            failures.append(f"{client.key}: {coordinator}")
    print(f"\nthe transaction column against pipeline serve --brokers {BROKERS} (bootstrap: broker {BOOTSTRAP}, "
          f"{cluster.addresses[BOOTSTRAP][0]}:{cluster.addresses[BOOTSTRAP][1]}); coordinator and leader are "
          "node ids, the static rule's in parentheses\n" + table(rows))
    assert failures == [], "\n".join(failures)


def test_a_hanging_transaction_is_found_and_aborted_with_the_admin_client_on_the_cluster(cluster):
    """The operator's tools on a cluster (issue 35): ``tests/e2e/test_transaction_admin.py``'s story
    bootstrapped on broker 0, with a transactional id another broker coordinates than the one that
    leads the topic's partition: kafka-python's ListTransactions asks every broker,
    DescribeTransactions the coordinator, DescribeProducers and the abort's WriteTxnMarkers the leader."""
    from tests.e2e.test_transaction_admin import find_and_abort

    topic = f"compat-cluster-hanging-{time.time_ns() % 1_000_000}"
    tid = next(t for k in itertools.count() if static_index(t := f"{topic}-{k}") != static_index(topic))
    find_and_abort("%s:%d" % cluster.addresses[BOOTSTRAP], topic, tid)
