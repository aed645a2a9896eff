"""One consumer group's members and state: Kafka's GroupMetadata and MemberMetadata (sans-I/O).

This module only holds state and its bookkeeping (protocol vote, leader,
static-member map, counts); the rules that move a group between states are in
``pipeline.coordinator.coordinator``. Times are milliseconds on the caller's
monotonic clock.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Hashable


class GroupState(str, enum.Enum):
    """Kafka GroupState (core/src/main/scala/kafka/coordinator/group/GroupMetadata.scala).

    Valid transitions (Kafka ``validPreviousStates``):
    Empty -> PreparingRebalance; PreparingRebalance -> CompletingRebalance or Empty;
    CompletingRebalance -> Stable or PreparingRebalance; Stable -> PreparingRebalance;
    any -> Dead (the group is deleted).
    """

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset({GroupState.EMPTY, GroupState.STABLE,
                                               GroupState.COMPLETING_REBALANCE}),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.DEAD: frozenset(GroupState),
}
"""Kafka GroupState.validPreviousStates; ``Group.transition_to`` asserts them."""


@dataclass(eq=False)
class Member:
    """A member of a group (Kafka MemberMetadata).

    Attributes:
        member_id: given by the coordinator (``client_id-uuid``; static: ``instance_id-uuid``).
        instance_id: ``group.instance.id`` of a static member (KIP-345), else None.
        client_id, client_host: from the request header and the connection (DescribeGroups).
        session_timeout_ms: no heartbeat for this long (ms) and the member is removed.
        rebalance_timeout_ms: how long (ms) a rebalance waits for this member to rejoin.
        protocol_type: e.g. "consumer".
        protocols: (name, metadata) in the member's order of preference.
        assignment: what the leader's SyncGroup gave it (bytes, opaque to us).
        join_waiter, sync_waiter: the pending JoinGroup / SyncGroup answer (opaque token), or None.
        heartbeat_deadline_ms: when it expires unless it heartbeats; None while it
            need not (awaiting a JoinGroup or SyncGroup answer, Kafka MemberMetadata.hasSatisfiedHeartbeat).
        is_new: joined and not yet through a completed join (Kafka ``isNew``): it can
            expire while awaiting its first JoinGroup answer (after NEW_MEMBER_JOIN_TIMEOUT_MS).
    """

    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_waiter: Hashable | None = None
    sync_waiter: Hashable | None = None
    heartbeat_deadline_ms: float | None = None
    is_new: bool = False

    def metadata(self, protocol: str) -> bytes:
        """The member's metadata for ``protocol`` (Kafka MemberMetadata.metadata).

        Raises:
            KeyError: the member does not support ``protocol``.
        """
        for name, data in self.protocols:
            if name == protocol:
                return data
        raise KeyError(protocol)

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        """Same protocols, same order, same metadata (Kafka MemberMetadata.matches)."""
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str:
        """Its most preferred protocol among ``candidates`` (Kafka MemberMetadata.vote).

        Raises:
            ValueError: it supports none of them.
        """
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError("member does not support any of the candidate protocols")


@dataclass(eq=False)
class Group:
    """One group (Kafka GroupMetadata).

    Attributes:
        group_id: its name.
        state: see GroupState.
        generation_id: incremented by every completed join (0: never rebalanced).
        protocol_type: of its members (None while it has none and never had; kept from offsets' store).
        protocol_name: chosen by the last completed join (None when Empty).
        leader_id: member id of the leader (None when no members).
        members: member id -> Member, in join order (the leader falls to the oldest).
        static_members: group.instance.id -> member id (KIP-345).
        pending_members: member id -> expiry (ms) of ids handed out with MEMBER_ID_REQUIRED
            that have not joined yet (KIP-394).
        pending_sync: members of the current generation that have not sent SyncGroup
            (Kafka ``pendingSyncMembers``); they are removed at ``sync_deadline_ms``.
        join_deadline_ms: when the current rebalance's join phase ends at the latest (None: none running).
        initial_join: the running join phase is Kafka's InitialDelayedJoin (empty group's first).
        initial_remaining_ms: what InitialDelayedJoin may still extend by (ms).
        new_member_added: a member joined during the initial delay (Kafka ``newMemberAdded``).
        sync_deadline_ms: when pending_sync members are removed (None: no pending sync).
        offsets: (topic, partition) -> (offset, leader epoch, metadata), committed and durable.
    """

    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)
    pending_members: dict[str, float] = field(default_factory=dict)
    pending_sync: set[str] = field(default_factory=set)
    join_deadline_ms: float | None = None
    initial_join: bool = False
    initial_remaining_ms: int = 0
    new_member_added: bool = False
    sync_deadline_ms: float | None = None
    offsets: dict[tuple[str, int], tuple[int, int, str | None]] = field(default_factory=dict)

    def transition_to(self, state: GroupState) -> None:
        """Kafka GroupMetadata.transitionTo.

        Raises:
            AssertionError: not a valid transition (a bug in the coordinator).
        """
        assert self.state in VALID_PREVIOUS_STATES[state], f"group {self.group_id}: {self.state} -> {state}"
        self.state = state

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def add(self, member: Member) -> None:
        """Kafka GroupMetadata.add: the first member sets the protocol type and is leader."""
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> Member | None:
        """Kafka GroupMetadata.remove: drop the member, its static id; a new leader if it led."""
        member = self.members.pop(member_id, None)
        if member is not None and member.instance_id is not None:
            if self.static_members.get(member.instance_id) == member_id:
                del self.static_members[member.instance_id]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_members.pop(member_id, None)
        self.pending_sync.discard(member_id)
        return member

    def static_member_fenced(self, member_id: str, instance_id: str | None) -> bool:
        """Another member id holds ``instance_id`` (Kafka GroupMetadata.isStaticMemberFenced, KIP-345)."""
        if instance_id is None or instance_id not in self.static_members:
            return False
        return self.static_members[instance_id] != member_id

    def supports_protocols(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """Kafka GroupMetadata.supportsProtocols.

        An empty group takes any non-empty type and list; otherwise the type must be
        the group's and one of the protocols must be supported by every member.
        """
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        if protocol_type != self.protocol_type:
            return False
        counts = self.supported_protocol_counts()
        return any(counts.get(name, 0) == len(self.members) for name, _ in protocols)

    def supported_protocol_counts(self) -> Counter[str]:
        """Protocol name -> members supporting it (Kafka ``supportedProtocols``)."""
        counts: Counter[str] = Counter()
        for member in self.members.values():
            counts.update({name for name, _ in member.protocols})
        return counts

    def select_protocol(self) -> str:
        """The protocol of the next generation (Kafka GroupMetadata.selectProtocol).

        Candidates are the protocols every member supports; each member votes for
        its most preferred candidate and the most votes win. Kafka leaves ties to
        hash order; here a tie goes to the candidate the oldest member prefers most.

        Raises:
            ValueError: no members, or no protocol all of them support.
        """
        if not self.members:
            raise ValueError("cannot select a protocol for a group without members")
        counts = self.supported_protocol_counts()
        candidates = {name for name, n in counts.items() if n == len(self.members)}
        if not candidates:
            raise ValueError("no protocol is supported by all members")
        votes = Counter(member.vote(candidates) for member in self.members.values())
        best = max(votes.values())
        oldest = next(iter(self.members.values()))
        return next(name for name, _ in oldest.protocols if votes.get(name) == best)

    def awaiting_join(self) -> int:
        """Members with a JoinGroup waiting (Kafka ``numMembersAwaitingJoin``)."""
        return sum(1 for m in self.members.values() if m.join_waiter is not None)

    def has_all_members_joined(self) -> bool:
        """Kafka GroupMetadata.hasAllMembersJoined: every member rejoined, no KIP-394 id outstanding."""
        return len(self.members) == self.awaiting_join() and not self.pending_members

    def rebalance_timeout_ms(self) -> int:
        """The longest rebalance timeout of its members (Kafka GroupMetadata.rebalanceTimeoutMs), ms."""
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def maybe_elect_new_joined_leader(self) -> bool:
        """If the leader has not rejoined, make a member that has the leader (Kafka maybeElectNewJoinedLeader).

        Returns False when the group has a leader but no member awaits a join.
        """
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.join_waiter is not None:
            return True
        for member_id, member in self.members.items():
            if member.join_waiter is not None:
                self.leader_id = member_id
                return True
        return False

    def member_metadata(self) -> list[tuple[str, str | None, bytes]]:
        """(member id, instance id, metadata for the chosen protocol) of every member, for the leader."""
        assert self.protocol_name is not None
        return [(m.member_id, m.instance_id, m.metadata(self.protocol_name)) for m in self.members.values()]

    @property
    def is_empty_of_everything(self) -> bool:
        """No members, no offsets, no outstanding ids: nothing is lost by forgetting it."""
        return not self.members and not self.offsets and not self.pending_members
