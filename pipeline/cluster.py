"""Several brokers: static membership, partition leadership and group coordinators (sans-I/O).

A cluster is configured the way Kafka configures its controller quorum
(``controller.quorum.voters``): every broker is told every broker's id and
advertised address, ``pipeline.cluster.brokers = "0@127.0.0.1:9092,1@127.0.0.1:9093"``,
plus its own ``node.id``. Nothing is elected: who leads a partition and who
coordinates a group are pure functions of the broker list, so every broker
(and every restart) computes the same answer without talking to the others.

* the leader of partition ``p`` of ``topic`` is the broker at index
  ``(crc32(topic) + p) % N`` of the brokers sorted by id: a topic's partitions
  go round-robin over the brokers from a start the topic's name picks (like
  Kafka's replica assignment), so they are spread evenly;
* the coordinator of group ``g`` is the broker at index ``crc32(g) % N``
  (Kafka: the leader of partition ``abs(hash(g)) % 50`` of
  ``__consumer_offsets``);
* producer ids are interleaved: broker ``i`` of ``N`` hands out ids
  ``k * N + i``, so two brokers never give the same id.

``crc32`` (zlib), never Python's ``hash``, which is randomised per process.

Without ``pipeline.cluster.brokers`` the broker is a cluster of one, leader
and coordinator of everything, exactly as before.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from pipeline.network.listeners import parse_host_port


@dataclass(frozen=True, slots=True)
class ClusterBroker:
    """One member of the cluster: its ``node.id`` and the address clients reach it at."""

    node_id: int
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.node_id}@{self.host}:{self.port}"


def parse_brokers(text: str) -> tuple[ClusterBroker, ...]:
    """``ID@HOST:PORT[,ID@HOST:PORT...]`` -> the brokers sorted by id.

    Raises:
        ValueError: a malformed entry, a port out of range, or an id or address given twice.
    """
    out: list[ClusterBroker] = []
    for entry in (e.strip() for e in text.split(",")):
        node, at, address = entry.partition("@")
        if not at or not node.strip().isdigit():
            raise ValueError(f"expected ID@HOST:PORT, got {entry!r}")
        host, port = parse_host_port(address, entry, "ID@HOST:PORT")
        if port == 0:
            raise ValueError(f"port out of range in {entry!r}")
        out.append(ClusterBroker(int(node), host, port))
    ids = [b.node_id for b in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"a node id is given twice in {text!r}")
    addresses = [(b.host, b.port) for b in out]
    if len(set(addresses)) != len(addresses):
        raise ValueError(f"an address is given twice in {text!r}")
    return tuple(sorted(out, key=lambda b: b.node_id))


def format_brokers(brokers: tuple[ClusterBroker, ...]) -> str:
    """The inverse of :func:`parse_brokers`."""
    return ",".join(str(b) for b in brokers)


@dataclass(frozen=True, slots=True)
class Cluster:
    """Every broker (sorted by id) and which one this is.

    Raises (constructor):
        ValueError: no brokers, or ``node_id`` is not among them.
    """

    brokers: tuple[ClusterBroker, ...]
    node_id: int

    def __post_init__(self) -> None:
        if not self.brokers:
            raise ValueError("a cluster needs at least one broker")
        if self.node_id not in {b.node_id for b in self.brokers}:
            raise ValueError(f"node.id {self.node_id} is not in the cluster's brokers "
                             f"{format_brokers(self.brokers)}")
        if list(self.brokers) != sorted(self.brokers, key=lambda b: b.node_id):
            object.__setattr__(self, "brokers", tuple(sorted(self.brokers, key=lambda b: b.node_id)))

    @classmethod
    def single(cls, node_id: int, host: str = "", port: int = 0) -> "Cluster":
        """A cluster of one: this broker leads and coordinates everything."""
        return cls((ClusterBroker(node_id, host, port),), node_id)

    @property
    def size(self) -> int:
        return len(self.brokers)

    @property
    def index(self) -> int:
        """This broker's position in ``brokers``."""
        return next(i for i, b in enumerate(self.brokers) if b.node_id == self.node_id)

    @property
    def controller_id(self) -> int:
        """The broker Metadata and DescribeCluster name as controller: the lowest id."""
        return self.brokers[0].node_id

    def leader(self, topic: str, partition: int) -> int:
        """Node id of the leader of ``topic``-``partition``."""
        n = len(self.brokers)
        if n == 1:
            return self.brokers[0].node_id
        return self.brokers[(zlib.crc32(topic.encode()) + partition) % n].node_id

    def leads(self, topic: str, partition: int) -> bool:
        """Whether this broker leads ``topic``-``partition``."""
        return len(self.brokers) == 1 or self.leader(topic, partition) == self.node_id

    def coordinator(self, group_id: str) -> int:
        """Node id of the coordinator of group ``group_id``."""
        n = len(self.brokers)
        if n == 1:
            return self.brokers[0].node_id
        return self.brokers[zlib.crc32(group_id.encode()) % n].node_id

    def coordinates(self, group_id: str) -> bool:
        """Whether this broker coordinates group ``group_id``."""
        return len(self.brokers) == 1 or self.coordinator(group_id) == self.node_id

    def broker(self, node_id: int) -> ClusterBroker:
        """The member with ``node_id``.

        Raises:
            KeyError: no such member.
        """
        for b in self.brokers:
            if b.node_id == node_id:
                return b
        raise KeyError(node_id)

    def producer_id(self, k: int) -> int:
        """The ``k``-th producer id of this broker: ``k * N + index``, disjoint across brokers."""
        return k * len(self.brokers) + self.index
