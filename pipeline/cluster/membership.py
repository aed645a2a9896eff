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

import math
import zlib
from dataclasses import dataclass
from typing import Any

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

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The leader epoch of ``topic``-``partition`` (KIP-320): always 0, leaders never move here."""
        return 0

    def taking_over(self, topic: str, partition: int) -> bool:
        """Whether this broker is made leader of ``topic``-``partition`` but does not serve it yet:
        never, leaders never move here."""
        return False

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


# -- leadership through the metadata database (pipeline.cluster.leadership = database) ----------------

OFFSETS_TOPIC = "__consumer_offsets"
"""The partitions that say which broker coordinates which groups (Kafka's internal topic of that name)."""
OFFSETS_PARTITIONS = 50
"""Its partitions (Kafka ``offsets.topic.num.partitions``); group ``g`` is on ``crc32(g) % 50``."""


def offsets_partition(group_id: str) -> int:
    """The ``__consumer_offsets`` partition of group ``group_id`` (Kafka: ``abs(hash(g)) % 50``)."""
    return zlib.crc32(group_id.encode()) % OFFSETS_PARTITIONS


def preferred_leader(topic: str, partition: int, members: tuple[int, ...]) -> int:
    """The leader today's static rule gives ``topic``-``partition`` over ``members`` (node ids, sorted):
    ``members[(crc32(topic) + partition) % len(members)]``.

    Raises:
        ValueError: no members.
    """
    if not members:
        raise ValueError("no members to lead")
    return members[(zlib.crc32(topic.encode()) + partition) % len(members)]


def reassign(topics: dict[str, int], live: tuple[int, ...], current: dict[tuple[str, int], Any],
             members: tuple[int, ...] = ()) -> tuple[dict[tuple[str, int], int], list[tuple[str, int]]]:
    """What the controller changes: (partition -> its new leader, partitions to forget).

    Every partition of ``topics`` (name -> partitions; ``__consumer_offsets`` is added) is led by its
    preferred leader, ``preferred_leader`` over every registered broker (``members``, live or not; the
    live ones when not given), when that one is live (Kafka's preferred replica), else by
    ``preferred_leader`` over the ``live`` members: only a dead member's partitions move, spread over
    the others, and a member that comes back gets its own back (leadership rebalances). ``current``:
    (topic, partition) -> anything with a ``leader_id`` (``pipeline.metadata.leadership.Leadership``);
    partitions in it of topics no longer in ``topics`` are forgotten. No live member: no change.
    """
    if not live:
        return {}, []
    live = tuple(sorted(live))
    everyone = tuple(sorted(set(members) | set(live)))
    wanted = {**topics, OFFSETS_TOPIC: OFFSETS_PARTITIONS}
    moves: dict[tuple[str, int], int] = {}
    for topic, count in wanted.items():
        for p in range(count):
            leader = preferred_leader(topic, p, everyone)
            if leader not in live:
                leader = preferred_leader(topic, p, live)
            row = current.get((topic, p))
            if row is None or row.leader_id != leader:
                moves[(topic, p)] = leader
    gone = [key for key in current if key[1] >= wanted.get(key[0], 0)]
    return moves, sorted(gone)


class DynamicCluster:
    """A broker's view of a cluster whose membership and leadership are in the metadata database
    (``pipeline.cluster.service`` keeps it current); sans-I/O, with ``Cluster``'s interface.

    A partition is served here (``leads``) only once this broker is a live member, the partition's
    row names it leader, and it has loaded the partition (``loaded``: offsets from the table's end,
    producer state from the database). A partition without a row yet (a new topic, before the
    controller's next pass) is reported at ``preferred_leader`` over the live members.
    """

    def __init__(self, node_id: int, host: str = "", port: int = 0) -> None:
        self.node_id = node_id
        self.me = ClusterBroker(node_id, host, port)
        self.members: tuple[ClusterBroker, ...] = ()
        """The live members (their registrations' first endpoints), by id."""
        self.member = False
        """This broker holds a live registration."""
        self.controller: int = -1
        """The node id of the live controller (-1: none known)."""
        self.leaders: dict[tuple[str, int], Any] = {}
        """(topic, partition) -> ``Leadership`` row."""
        self.loaded: set[tuple[str, int]] = set()
        """Partitions (``__consumer_offsets``'s too) this broker has loaded and serves."""
        self.lease_until = math.inf
        """Until when (trio's monotonic clock, s) this broker's membership lease is surely current, with
        a margin (``pipeline.cluster.service.lease_margin_s``): past it nothing is acknowledged."""

    def lease_current(self, now: float) -> bool:
        """Whether at ``now`` (trio's monotonic clock, s) this broker may still acknowledge."""
        return now < self.lease_until

    @property
    def brokers(self) -> tuple[ClusterBroker, ...]:
        """The live members, this broker always among them (clients reach it through Metadata)."""
        if any(b.node_id == self.node_id for b in self.members):
            return self.members
        return tuple(sorted((*self.members, self.me), key=lambda b: b.node_id))

    @property
    def size(self) -> int:
        return len(self.brokers)

    @property
    def controller_id(self) -> int:
        return self.controller if self.controller >= 0 else self.brokers[0].node_id

    def leader(self, topic: str, partition: int) -> int:
        """Node id of the leader of ``topic``-``partition`` as Metadata names it: its row's
        (``assigned_leader``), whether that broker serves it yet or not.

        Kafka names a new leader only once it leads. Named earlier, the new leader is asked before
        it has taken the partition over (``taking_over``): its fetches wait for the take-over
        (``pipeline.log.fetch``) rather than answer NOT_LEADER_OR_FOLLOWER, on which kafkajs 2.2.4
        rejoins its group (``ConsumerGroup.recoverFromFetch``). The moment it serves is recorded
        (``LeadershipStore.serve``) but Metadata does not use it; a partition whose leader is not a
        live member is LEADER_NOT_AVAILABLE (``pipeline.protocol.apis.metadata_response``)."""
        return self.assigned_leader(topic, partition)

    def assigned_leader(self, topic: str, partition: int) -> int:
        """Node id of the broker the controller made leader of ``topic``-``partition`` (its row's, see
        the class docstring), whether it serves it yet or not."""
        row = self.leaders.get((topic, partition))
        if row is not None:
            return int(row.leader_id)
        return preferred_leader(topic, partition, tuple(b.node_id for b in self.brokers))

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The leader epoch of ``topic``-``partition`` (KIP-320): its row's (1 the first time, +1 per move);
        0 for a partition without a row yet (a new topic before the controller's pass), below any row's."""
        row = self.leaders.get((topic, partition))
        return int(row.leader_epoch) if row is not None else 0

    def leads(self, topic: str, partition: int) -> bool:
        """Whether this broker serves ``topic``-``partition`` now."""
        return (self.member and (topic, partition) in self.loaded
                and self.assigned_leader(topic, partition) == self.node_id)

    def taking_over(self, topic: str, partition: int) -> bool:
        """Whether the controller made this broker leader of ``topic``-``partition`` and it is taking
        it over (waiting for the prior leader's hand-off, reading the table's end offset), not serving
        it yet: a fetch waits for it (``pipeline.log.fetch``)."""
        return (self.member and (topic, partition) not in self.loaded
                and self.assigned_leader(topic, partition) == self.node_id)

    def coordinator(self, group_id: str) -> int:
        """Node id of the coordinator of ``group_id``: the leader of its ``__consumer_offsets`` partition,
        named while it loads the group (it answers COORDINATOR_LOAD_IN_PROGRESS meanwhile, as Kafka's)."""
        return self.assigned_leader(OFFSETS_TOPIC, offsets_partition(group_id))

    def coordinates(self, group_id: str) -> bool:
        """Whether this broker coordinates ``group_id`` now (its groups' offsets loaded)."""
        return self.leads(OFFSETS_TOPIC, offsets_partition(group_id))

    def loading(self, group_id: str) -> bool:
        """This broker is the group's coordinator but has not loaded its offsets yet
        (Kafka COORDINATOR_LOAD_IN_PROGRESS)."""
        return (self.member and self.coordinator(group_id) == self.node_id
                and (OFFSETS_TOPIC, offsets_partition(group_id)) not in self.loaded)

    def broker(self, node_id: int) -> ClusterBroker:
        """The live member with ``node_id``.

        Raises:
            KeyError: no such live member.
        """
        for b in self.brokers:
            if b.node_id == node_id:
                return b
        raise KeyError(node_id)
