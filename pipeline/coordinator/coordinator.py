"""The classic group protocol's rules: Kafka's GroupCoordinator, sans-I/O.

``GroupCoordinator`` holds every group and decides what each JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, DescribeGroups, ListGroups,
DeleteGroups and OffsetDelete answers. It reads no clock and touches no
socket: every call takes ``now_ms`` (milliseconds on the caller's monotonic
clock). JoinGroup and SyncGroup may be answered later (Kafka parks them in
its join purgatory); the caller passes an opaque ``waiter`` token with each
and gets back a list of ``(waiter, result)`` replies to send now, from that
call or from a later one: ``tick(now_ms)`` runs the timers (join phase end,
session timeouts, KIP-394 ids, pending SyncGroups) and ``next_deadline_ms()``
says when ``tick`` is next needed. Every waiter is answered exactly once.

Committed offsets live in each group (``Group.offsets``) but only what is
already durable: the caller validates a commit with ``validate_commit``,
makes it durable, then calls ``apply_commit`` (likewise ``delete_group`` /
``apply_delete`` and ``apply_offset_delete``).

Membership survives a coordinator move as Kafka's group metadata records make
it survive: each time a group becomes Stable (a new generation with its
assignments) or Empty, its ``membership`` (``GroupMembership``) goes to
``membership_changes`` for the caller to store, and ``load`` restores a
stored Stable generation, its members' sessions starting anew, so they carry
on heartbeating with their member ids and generation at the new coordinator.

Rules follow Kafka 2.8-3.x ``core/src/main/scala/kafka/coordinator/group/GroupCoordinator.scala``;
each method names the function it follows. Differences: the group metadata
is stored when a generation is Stable, not also while it rebalances (a move
in mid-rebalance restores the last Stable generation: its members rejoin),
no ``group.max.size``, and a JoinGroup or SyncGroup a
member replaces by a newer one is answered REBALANCE_IN_PROGRESS instead of
being dropped (Kafka's purgatory forgets it; a connection here owes every
request an answer).
"""

from __future__ import annotations

import base64
import io
import logging
import uuid
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

from kafka.protocol.old.consumer_protocol import ConsumerProtocolMemberMetadata_v0
from kio.schema.errors import ErrorCode

from pipeline.coordinator.metadata import Group, GroupState, Member

log = logging.getLogger(__name__)

NONE = ErrorCode.none.value
UNKNOWN_TOPIC_OR_PARTITION = ErrorCode.unknown_topic_or_partition.value
COORDINATOR_NOT_AVAILABLE = ErrorCode.coordinator_not_available.value
NOT_COORDINATOR = ErrorCode.not_coordinator.value
ILLEGAL_GENERATION = ErrorCode.illegal_generation.value
INCONSISTENT_GROUP_PROTOCOL = ErrorCode.inconsistent_group_protocol.value
INVALID_GROUP_ID = ErrorCode.invalid_group_id.value
UNKNOWN_MEMBER_ID = ErrorCode.unknown_member_id.value
INVALID_SESSION_TIMEOUT = ErrorCode.invalid_session_timeout.value
REBALANCE_IN_PROGRESS = ErrorCode.rebalance_in_progress.value
NON_EMPTY_GROUP = ErrorCode.non_empty_group.value
GROUP_ID_NOT_FOUND = ErrorCode.group_id_not_found.value
MEMBER_ID_REQUIRED = ErrorCode.member_id_required.value
FENCED_INSTANCE_ID = ErrorCode.fenced_instance_id.value
GROUP_SUBSCRIBED_TO_TOPIC = ErrorCode.group_subscribed_to_topic.value

NEW_MEMBER_JOIN_TIMEOUT_MS = 300_000
"""A new member's first JoinGroup is answered UNKNOWN_MEMBER_ID if the join phase
has not ended by then (ms; Kafka GroupCoordinator.NewMemberJoinTimeoutMs)."""

CONSUMER_PROTOCOL_TYPE = "consumer"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Broker settings of the coordinator (Kafka GroupConfig), all ms.

    Attributes:
        initial_rebalance_delay_ms: ``group.initial.rebalance.delay.ms``: an empty
            group's first join phase waits this long for more members (Kafka InitialDelayedJoin).
        min_session_timeout_ms, max_session_timeout_ms: ``group.min/max.session.timeout.ms``:
            the range a member's ``session.timeout.ms`` must be in (else INVALID_SESSION_TIMEOUT).
        new_member_join_timeout_ms: see NEW_MEMBER_JOIN_TIMEOUT_MS.
    """

    initial_rebalance_delay_ms: int = 3000
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS


@dataclass(frozen=True, slots=True)
class JoinResult:
    """What a JoinGroup answers (Kafka JoinGroupResult).

    ``members`` ((member id, instance id, metadata), ...) is filled for the leader only.
    """

    error: int
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What a SyncGroup answers (Kafka SyncGroupResult)."""

    error: int
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


Reply = tuple[Hashable, "JoinResult | SyncResult"]
"""(waiter given with the JoinGroup/SyncGroup, its answer)."""


@dataclass(frozen=True, slots=True)
class MemberSummary:
    """One member as DescribeGroups shows it (Kafka MemberSummary)."""

    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """One group as DescribeGroups shows it (Kafka GroupSummary); unknown groups are "Dead"."""

    error: int
    state: str
    protocol_type: str
    protocol_name: str
    members: tuple[MemberSummary, ...]


def subscribed_topics(protocol_type: str | None, metadata: bytes) -> set[str] | None:
    """Topics of a consumer's subscription metadata (Kafka ConsumerProtocolSubscription, any
    version: they all start with version and topics), None if not a readable consumer subscription."""
    if protocol_type != CONSUMER_PROTOCOL_TYPE:
        return None
    try:
        return set(ConsumerProtocolMemberMetadata_v0.decode(io.BytesIO(metadata)).topics)
    except Exception:  # noqa: BLE001 - any client's bytes; unreadable means "unknown"
        return None


@dataclass(frozen=True, slots=True)
class StoredMember:
    """A member as a group's stored membership keeps it (Kafka's MemberMetadata value record)."""

    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMembership:
    """A Stable generation of a group, as stored (Kafka's GroupMetadata value record): what a new
    coordinator needs for its members to carry on with their member ids and generation."""

    generation_id: int
    protocol_type: str
    protocol_name: str
    leader_id: str
    members: tuple[StoredMember, ...]

    def to_json(self) -> dict:
        """A JSON-able dict (bytes as base64)."""
        return {"generation_id": self.generation_id, "protocol_type": self.protocol_type,
                "protocol_name": self.protocol_name, "leader_id": self.leader_id,
                "members": [{"member_id": m.member_id, "instance_id": m.instance_id, "client_id": m.client_id,
                             "client_host": m.client_host, "session_timeout_ms": m.session_timeout_ms,
                             "rebalance_timeout_ms": m.rebalance_timeout_ms,
                             "protocols": [[n, base64.b64encode(d).decode()] for n, d in m.protocols],
                             "assignment": base64.b64encode(m.assignment).decode()} for m in self.members]}

    @classmethod
    def from_json(cls, data: dict) -> GroupMembership:
        """Raises KeyError, TypeError, ValueError (binascii.Error) for a dict ``to_json`` did not make."""
        return cls(int(data["generation_id"]), str(data["protocol_type"]), str(data["protocol_name"]),
                   str(data["leader_id"]), tuple(
                       StoredMember(str(m["member_id"]), m["instance_id"], str(m["client_id"]), str(m["client_host"]),
                                    int(m["session_timeout_ms"]), int(m["rebalance_timeout_ms"]),
                                    tuple((str(n), base64.b64decode(d)) for n, d in m["protocols"]),
                                    base64.b64decode(m["assignment"])) for m in data["members"]))


def _new_member_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4()}"


class GroupCoordinator:
    """All groups of this broker and the protocol's rules (see the module docstring).

    Args:
        config: see GroupConfig.
        new_member_id: makes a member id from a client id or group.instance.id
            (Kafka GroupMetadata.generateMemberId: ``prefix-uuid``); tests pass a counter.
    """

    def __init__(self, config: GroupConfig | None = None,
                 new_member_id: Callable[[str], str] = _new_member_id) -> None:
        self.config = config or GroupConfig()
        self.groups: dict[str, Group] = {}
        self._new_member_id = new_member_id
        self.closed = False
        self.membership_changes: dict[str, GroupMembership | None] = {}
        """Groups whose stored membership is to change since the caller last took them
        (``take_membership_changes``): the new Stable generation, or None (Empty: nothing to keep)."""

    # ------------------------------------------------------------------ loading

    def load(self, group_id: str, protocol_type: str | None,
             offsets: dict[tuple[str, int], tuple[int, int, str | None]],
             membership: GroupMembership | None = None, now_ms: float = 0.0) -> None:
        """Restore a group known from the offset store (Kafka GroupMetadataManager.loadGroup): with its
        durable offsets, and, given its stored ``membership``, Stable at that generation with those
        members, each one's session starting at ``now_ms``; else Empty, generation 0."""
        group = self.groups.setdefault(group_id, Group(group_id))
        group.protocol_type = group.protocol_type or protocol_type
        group.offsets.update(offsets)
        if membership is None or not membership.members or group.members:
            return
        group.generation_id = membership.generation_id
        group.protocol_type = membership.protocol_type
        group.protocol_name = membership.protocol_name
        for m in membership.members:
            group.add(Member(m.member_id, m.instance_id, m.client_id, m.client_host, m.session_timeout_ms,
                             m.rebalance_timeout_ms, membership.protocol_type, list(m.protocols), m.assignment,
                             heartbeat_deadline_ms=now_ms + m.session_timeout_ms))
        group.leader_id = membership.leader_id if membership.leader_id in group.members else group.leader_id
        group.state = GroupState.STABLE  # as Kafka's loadGroup: the stored generation, not a transition
        log.info("group %s: loaded Stable at generation %d with %d members", group_id, group.generation_id,
                 len(group.members))

    def take_membership_changes(self) -> dict[str, GroupMembership | None]:
        """The stored memberships to change (``membership_changes``), emptied."""
        changes, self.membership_changes = self.membership_changes, {}
        return changes

    def _membership_changed(self, group: Group) -> None:
        """``group`` became Stable or Empty: what to store of its membership now."""
        if group.state is not GroupState.STABLE or group.protocol_type is None or group.protocol_name is None \
                or group.leader_id is None:
            self.membership_changes[group.group_id] = None
            return
        self.membership_changes[group.group_id] = GroupMembership(
            group.generation_id, group.protocol_type, group.protocol_name, group.leader_id,
            tuple(StoredMember(m.member_id, m.instance_id, m.client_id, m.client_host, m.session_timeout_ms,
                               m.rebalance_timeout_ms, tuple(m.protocols), m.assignment)
                  for m in group.members.values()))

    # ------------------------------------------------------------------ JoinGroup

    def join(self, waiter: Hashable, now_ms: float, *, group_id: str, member_id: str,
             instance_id: str | None, client_id: str, client_host: str, protocol_type: str,
             protocols: list[tuple[str, bytes]], session_timeout_ms: int, rebalance_timeout_ms: int,
             require_known_member_id: bool) -> list[Reply]:
        """A JoinGroup (Kafka GroupCoordinator.handleJoinGroup).

        ``require_known_member_id`` is JoinGroup v4+ without a group.instance.id
        (KIP-394): a member without an id first gets one with MEMBER_ID_REQUIRED.
        ``rebalance_timeout_ms`` of a v0 request is its session timeout.
        ``waiter`` is answered in the returned replies now, or by a later call.
        """
        replies: list[Reply] = []
        if self.closed:
            return [(waiter, JoinResult(COORDINATOR_NOT_AVAILABLE, member_id))]
        if not group_id:
            return [(waiter, JoinResult(INVALID_GROUP_ID, member_id))]
        c = self.config
        if not c.min_session_timeout_ms <= session_timeout_ms <= c.max_session_timeout_ms:
            return [(waiter, JoinResult(INVALID_SESSION_TIMEOUT, member_id))]
        unknown = member_id == ""
        group = self.groups.get(group_id)
        if group is None:
            if not unknown:
                return [(waiter, JoinResult(UNKNOWN_MEMBER_ID, member_id))]
            group = self.groups[group_id] = Group(group_id)
        args = (group, waiter, now_ms, member_id, instance_id, client_id, client_host, protocol_type,
                protocols, session_timeout_ms, rebalance_timeout_ms, replies)
        if unknown:
            self._join_unknown(*args, require_known_member_id)
        else:
            self._join_current(*args)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group, now_ms, replies)
        if group.state is GroupState.EMPTY and group.generation_id == 0 and group.is_empty_of_everything:
            del self.groups[group_id]  # a refused first join leaves nothing behind
        return replies

    def _join_unknown(self, group: Group, waiter: Hashable, now_ms: float, member_id: str,
                      instance_id: str | None, client_id: str, client_host: str, protocol_type: str,
                      protocols: list[tuple[str, bytes]], session_timeout_ms: int, rebalance_timeout_ms: int,
                      replies: list[Reply], require_known_member_id: bool) -> None:
        """Kafka GroupCoordinator.doUnknownJoinGroup (+ doStaticNewMemberJoinGroup, doDynamicNewMemberJoinGroup)."""
        if group.state is GroupState.DEAD:
            replies.append((waiter, JoinResult(COORDINATOR_NOT_AVAILABLE, member_id)))
            return
        if not group.supports_protocols(protocol_type, protocols):
            replies.append((waiter, JoinResult(INCONSISTENT_GROUP_PROTOCOL, member_id)))
            return
        new_id = self._new_member_id(instance_id if instance_id is not None else client_id)
        if instance_id is not None:
            old_id = group.static_members.get(instance_id)
            if old_id is not None:
                self._update_static_member_and_rebalance(group, old_id, new_id, waiter, now_ms, protocols,
                                                         session_timeout_ms, rebalance_timeout_ms, replies)
                return
        elif require_known_member_id:
            # KIP-394: hand out an id and wait for the member to come back with it.
            group.pending_members[new_id] = now_ms + session_timeout_ms
            replies.append((waiter, JoinResult(MEMBER_ID_REQUIRED, new_id)))
            return
        self._add_member_and_rebalance(group, waiter, now_ms, new_id, instance_id, client_id, client_host,
                                       protocol_type, protocols, session_timeout_ms, rebalance_timeout_ms, replies)

    def _join_current(self, group: Group, waiter: Hashable, now_ms: float, member_id: str,
                      instance_id: str | None, client_id: str, client_host: str, protocol_type: str,
                      protocols: list[tuple[str, bytes]], session_timeout_ms: int, rebalance_timeout_ms: int,
                      replies: list[Reply]) -> None:
        """Kafka GroupCoordinator.doCurrentMemberJoinGroup."""
        if group.state is GroupState.DEAD:
            replies.append((waiter, JoinResult(COORDINATOR_NOT_AVAILABLE, member_id)))
            return
        if not group.supports_protocols(protocol_type, protocols):
            replies.append((waiter, JoinResult(INCONSISTENT_GROUP_PROTOCOL, member_id)))
            return
        if member_id in group.pending_members:
            # The KIP-394 second join: the member is accepted now.
            del group.pending_members[member_id]
            self._add_member_and_rebalance(group, waiter, now_ms, member_id, instance_id, client_id, client_host,
                                           protocol_type, protocols, session_timeout_ms, rebalance_timeout_ms,
                                           replies)
            return
        if group.static_member_fenced(member_id, instance_id):
            replies.append((waiter, JoinResult(FENCED_INSTANCE_ID, member_id)))
            return
        if member_id not in group.members or (instance_id is not None and instance_id not in group.static_members):
            replies.append((waiter, JoinResult(UNKNOWN_MEMBER_ID, member_id)))
            return
        member = group.members[member_id]
        state = group.state
        if state is GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, waiter, now_ms, protocols, session_timeout_ms,
                                              rebalance_timeout_ms, replies)
        elif state is GroupState.COMPLETING_REBALANCE:
            if member.matches(protocols):
                # It lost the answer to its join: the current generation again.
                replies.append((waiter, self._join_result(group, member, with_members=group.is_leader(member_id))))
            else:
                self._update_member_and_rebalance(group, member, waiter, now_ms, protocols, session_timeout_ms,
                                                  rebalance_timeout_ms, replies)
        elif state is GroupState.STABLE:
            if group.is_leader(member_id) or not member.matches(protocols):
                # A leader's join forces a rebalance (e.g. the topics' partitions changed).
                self._update_member_and_rebalance(group, member, waiter, now_ms, protocols, session_timeout_ms,
                                                  rebalance_timeout_ms, replies)
            else:
                replies.append((waiter, self._join_result(group, member, with_members=False)))
        else:  # Empty with a member id it never gave: let the member reset and rejoin
            replies.append((waiter, JoinResult(UNKNOWN_MEMBER_ID, member_id)))

    def _join_result(self, group: Group, member: Member, *, with_members: bool, leader_id: str | None = None) -> JoinResult:
        return JoinResult(
            NONE, member.member_id, group.generation_id, group.protocol_type, group.protocol_name,
            leader_id if leader_id is not None else (group.leader_id or ""),
            tuple(group.member_metadata()) if with_members else (),
        )

    def _add_member_and_rebalance(self, group: Group, waiter: Hashable, now_ms: float, member_id: str,
                                  instance_id: str | None, client_id: str, client_host: str, protocol_type: str,
                                  protocols: list[tuple[str, bytes]], session_timeout_ms: int,
                                  rebalance_timeout_ms: int, replies: list[Reply]) -> None:
        """Kafka GroupCoordinator.addMemberAndRebalance.

        A new member cannot heartbeat before it has an answer, so its first join
        expires after ``new_member_join_timeout_ms`` instead of the session timeout.
        """
        member = Member(member_id, instance_id, client_id, client_host, session_timeout_ms, rebalance_timeout_ms,
                        protocol_type, list(protocols), join_waiter=waiter, is_new=True,
                        heartbeat_deadline_ms=now_ms + self.config.new_member_join_timeout_ms)
        if group.state is GroupState.PREPARING_REBALANCE and group.generation_id == 0:
            group.new_member_added = True  # the initial delay may be extended (InitialDelayedJoin)
        group.add(member)
        self._maybe_prepare_rebalance(group, now_ms, replies)

    def _update_member_and_rebalance(self, group: Group, member: Member, waiter: Hashable, now_ms: float,
                                     protocols: list[tuple[str, bytes]], session_timeout_ms: int,
                                     rebalance_timeout_ms: int, replies: list[Reply]) -> None:
        """Kafka GroupCoordinator.updateMemberAndRebalance (GroupMetadata.updateMember)."""
        member.protocols = list(protocols)
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        if member.join_waiter is not None and member.join_waiter is not waiter:
            replies.append((member.join_waiter, JoinResult(REBALANCE_IN_PROGRESS, member.member_id)))
        member.join_waiter = waiter
        self._maybe_prepare_rebalance(group, now_ms, replies)

    def _update_static_member_and_rebalance(self, group: Group, old_id: str, new_id: str, waiter: Hashable,
                                            now_ms: float, protocols: list[tuple[str, bytes]],
                                            session_timeout_ms: int, rebalance_timeout_ms: int,
                                            replies: list[Reply]) -> None:
        """A known group.instance.id rejoins without its member id (KIP-345; Kafka
        GroupCoordinator.updateStaticMemberAndRebalance, GroupMetadata.replaceStaticMember).

        The old member id is fenced (its pending answers get FENCED_INSTANCE_ID) and the
        member keeps its assignment under the new id. A Stable group whose protocol
        choice does not change is not rebalanced: the member gets the current
        generation with the *old* leader id, so a returning leader does not
        assign (Kafka's reasoning: a Stable group would not pass on a new assignment).
        """
        current_leader = group.leader_id
        member = group.members.pop(old_id)
        if member.join_waiter is not None:
            replies.append((member.join_waiter, JoinResult(FENCED_INSTANCE_ID, old_id)))
            member.join_waiter = None
        if member.sync_waiter is not None:
            replies.append((member.sync_waiter, SyncResult(FENCED_INSTANCE_ID)))
            member.sync_waiter = None
        member.member_id = new_id
        group.members[new_id] = member
        assert member.instance_id is not None
        group.static_members[member.instance_id] = new_id
        if group.leader_id == old_id:
            group.leader_id = new_id
        if old_id in group.pending_sync:
            group.pending_sync.discard(old_id)
            group.pending_sync.add(new_id)
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        member.protocols = list(protocols)
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.join_waiter = waiter
        if group.state is GroupState.STABLE:
            if group.protocol_name == group.select_protocol():
                member.join_waiter = None
                replies.append((waiter, self._join_result(group, member, with_members=False,
                                                          leader_id=current_leader or "")))
            else:
                self._maybe_prepare_rebalance(group, now_ms, replies)
        elif group.state is GroupState.COMPLETING_REBALANCE:
            self._maybe_prepare_rebalance(group, now_ms, replies)
        # PreparingRebalance: it simply waits for the join phase to end.

    def _maybe_prepare_rebalance(self, group: Group, now_ms: float, replies: list[Reply]) -> None:
        """Kafka GroupCoordinator.maybePrepareRebalance (GroupMetadata.canRebalance)."""
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY):
            self._prepare_rebalance(group, now_ms, replies)

    def _prepare_rebalance(self, group: Group, now_ms: float, replies: list[Reply]) -> None:
        """Kafka GroupCoordinator.prepareRebalance: start a join phase.

        Members awaiting SyncGroup are told REBALANCE_IN_PROGRESS. An empty group's
        first join phase is Kafka's InitialDelayedJoin (``initial_rebalance_delay_ms``,
        extended while members keep arriving, up to the rebalance timeout); any
        other is DelayedJoin: it ends when every member has rejoined or after the
        longest rebalance timeout of the members.
        """
        if group.state is GroupState.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment_error(group, REBALANCE_IN_PROGRESS, replies)
        group.sync_deadline_ms = None
        group.pending_sync.clear()
        if group.state is GroupState.EMPTY:
            delay = self.config.initial_rebalance_delay_ms
            group.initial_join = True
            group.new_member_added = False
            group.initial_remaining_ms = max(group.rebalance_timeout_ms() - delay, 0)
            group.join_deadline_ms = now_ms + delay
        else:
            group.initial_join = False
            group.join_deadline_ms = now_ms + group.rebalance_timeout_ms()
        group.transition_to(GroupState.PREPARING_REBALANCE)

    def _reset_and_propagate_assignment_error(self, group: Group, error: int, replies: list[Reply]) -> None:
        """Kafka GroupCoordinator.resetAndPropagateAssignmentError."""
        for member in group.members.values():
            member.assignment = b""
            if member.sync_waiter is not None:
                replies.append((member.sync_waiter, SyncResult(error)))
                member.sync_waiter = None

    def _try_complete_join(self, group: Group, now_ms: float, replies: list[Reply]) -> None:
        """Kafka DelayedJoin.tryComplete: end the join phase once every member has rejoined
        (InitialDelayedJoin never ends early)."""
        if (group.state is GroupState.PREPARING_REBALANCE and not group.initial_join
                and group.has_all_members_joined()):
            self._complete_join(group, now_ms, replies)

    def _expire_join(self, group: Group, now_ms: float, replies: list[Reply]) -> None:
        """The join phase's deadline passed (Kafka InitialDelayedJoin.onComplete, DelayedJoin.onExpiration)."""
        if group.initial_join and group.new_member_added and group.initial_remaining_ms > 0:
            group.new_member_added = False
            delay = min(self.config.initial_rebalance_delay_ms, group.initial_remaining_ms)
            group.initial_remaining_ms = max(group.initial_remaining_ms - delay, 0)
            group.join_deadline_ms = now_ms + delay
            return
        self._complete_join(group, now_ms, replies)

    def _complete_join(self, group: Group, now_ms: float, replies: list[Reply]) -> None:
        """Kafka GroupCoordinator.onCompleteJoin: the next generation.

        Dynamic members that did not rejoin are removed (static ones stay, KIP-345);
        the generation id goes up; with members the group chooses a protocol, keeps
        or elects a leader among those who rejoined, answers every pending JoinGroup
        (the leader gets every member's metadata) and waits for SyncGroups; without
        members it is Empty.
        """
        group.join_deadline_ms = None
        group.initial_join = False
        for member in [m for m in group.members.values() if m.join_waiter is None and m.instance_id is None]:
            self._drop_member(group, member, replies)
        if group.state is GroupState.DEAD:
            return
        if group.members and not group.maybe_elect_new_joined_leader():
            # Only static members that have not rejoined: wait for their session
            # timeouts to remove them (Kafka schedules another DelayedJoin).
            group.join_deadline_ms = now_ms + group.rebalance_timeout_ms()
            return
        group.generation_id += 1
        group.pending_sync.clear()
        if not group.members:
            group.protocol_name = None
            group.transition_to(GroupState.EMPTY)
            self._membership_changed(group)
            log.info("group %s: generation %d is empty", group.group_id, group.generation_id)
            return
        group.protocol_name = group.select_protocol()
        group.transition_to(GroupState.COMPLETING_REBALANCE)
        # Kafka GroupCoordinator's "Stabilized group ... generation ... with N members", at the join's end.
        log.info("group %s: generation %d with %d members (protocol %s), leader %s", group.group_id,
                 group.generation_id, len(group.members), group.protocol_name, group.leader_id)
        for member in group.members.values():
            if member.join_waiter is not None:
                replies.append((member.join_waiter,
                                self._join_result(group, member, with_members=group.is_leader(member.member_id))))
                member.join_waiter = None
            member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
            member.is_new = False
            group.pending_sync.add(member.member_id)
        group.sync_deadline_ms = now_ms + group.rebalance_timeout_ms()

    def _drop_member(self, group: Group, member: Member, replies: list[Reply]) -> None:
        """Remove a member, answering what it waits for with UNKNOWN_MEMBER_ID (so a live
        client rejoins; Kafka removeMemberAndUpdateGroup's maybeInvokeJoinCallback)."""
        _answer_waiters(member, UNKNOWN_MEMBER_ID, replies)
        group.remove(member.member_id)

    def _remove_member_and_update_group(self, group: Group, member: Member, now_ms: float,
                                        replies: list[Reply]) -> None:
        """Kafka GroupCoordinator.removeMemberAndUpdateGroup (LeaveGroup, session timeout)."""
        self._drop_member(group, member, replies)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, now_ms, replies)
        elif group.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group, now_ms, replies)

    # ------------------------------------------------------------------ SyncGroup

    def sync(self, waiter: Hashable, now_ms: float, *, group_id: str, generation_id: int, member_id: str,
             instance_id: str | None, protocol_type: str | None, protocol_name: str | None,
             assignments: dict[str, bytes]) -> list[Reply]:
        """A SyncGroup (Kafka GroupCoordinator.handleSyncGroup / doSyncGroup).

        In CompletingRebalance every member waits until the leader's SyncGroup
        brings the assignments (members it leaves out get empty bytes); then the
        group is Stable and all are answered. In Stable a member gets its
        assignment at once. ``protocol_type``/``protocol_name`` (v5+) must match the group's.
        """
        replies: list[Reply] = []
        if self.closed:
            return [(waiter, SyncResult(COORDINATOR_NOT_AVAILABLE))]
        if not group_id:
            return [(waiter, SyncResult(INVALID_GROUP_ID))]
        group = self.groups.get(group_id)
        if group is None:
            return [(waiter, SyncResult(UNKNOWN_MEMBER_ID))]
        error = self._check_member(group, generation_id, member_id, instance_id)
        if error == NONE and ((protocol_type is not None and protocol_type != group.protocol_type)
                              or (protocol_name is not None and protocol_name != group.protocol_name)):
            error = INCONSISTENT_GROUP_PROTOCOL
        if error != NONE:
            return [(waiter, SyncResult(error))]
        member = group.members[member_id]
        if group.state is GroupState.EMPTY:
            return [(waiter, SyncResult(UNKNOWN_MEMBER_ID))]
        if group.state is GroupState.PREPARING_REBALANCE:
            return [(waiter, SyncResult(REBALANCE_IN_PROGRESS))]
        self._remove_pending_sync(group, member_id)
        if group.state is GroupState.STABLE:
            member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
            return [(waiter, SyncResult(NONE, group.protocol_type, group.protocol_name, member.assignment))]
        # CompletingRebalance
        if member.sync_waiter is not None and member.sync_waiter is not waiter:
            replies.append((member.sync_waiter, SyncResult(REBALANCE_IN_PROGRESS)))
        member.sync_waiter = waiter
        if group.is_leader(member_id):
            for mid, m in group.members.items():
                m.assignment = assignments.get(mid, b"")
            group.transition_to(GroupState.STABLE)
            self._membership_changed(group)
            for m in group.members.values():  # Kafka setAndPropagateAssignment
                if m.sync_waiter is not None:
                    replies.append((m.sync_waiter, SyncResult(NONE, group.protocol_type, group.protocol_name,
                                                              m.assignment)))
                    m.sync_waiter = None
                    m.heartbeat_deadline_ms = now_ms + m.session_timeout_ms
        return replies

    def _remove_pending_sync(self, group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            group.sync_deadline_ms = None

    def _check_member(self, group: Group, generation_id: int, member_id: str, instance_id: str | None) -> int:
        """The checks SyncGroup and Heartbeat share, in Kafka's order."""
        if group.state is GroupState.DEAD:
            return COORDINATOR_NOT_AVAILABLE
        if group.static_member_fenced(member_id, instance_id):
            return FENCED_INSTANCE_ID
        if member_id not in group.members:
            return UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return ILLEGAL_GENERATION
        return NONE

    # ------------------------------------------------------------------ Heartbeat, LeaveGroup

    def heartbeat(self, now_ms: float, *, group_id: str, generation_id: int, member_id: str,
                  instance_id: str | None) -> int:
        """A Heartbeat; returns its error code (Kafka GroupCoordinator.handleHeartbeat).

        A member's session is renewed by a heartbeat of its current generation in
        any state but Empty; in PreparingRebalance the answer REBALANCE_IN_PROGRESS
        tells it to rejoin.
        """
        if self.closed:
            return COORDINATOR_NOT_AVAILABLE
        if not group_id:
            return INVALID_GROUP_ID
        group = self.groups.get(group_id)
        if group is None:
            return UNKNOWN_MEMBER_ID
        error = self._check_member(group, generation_id, member_id, instance_id)
        if error != NONE:
            return error
        if group.state is GroupState.EMPTY:
            return UNKNOWN_MEMBER_ID
        member = group.members[member_id]
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        if group.state is GroupState.PREPARING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        return NONE

    def leave(self, now_ms: float, group_id: str,
              members: list[tuple[str, str | None]]) -> tuple[int, list[int], list[Reply]]:
        """A LeaveGroup of ``members`` ((member id, instance id), ...; v3+ may name several, KIP-345).

        Returns (top-level error, error per member in order, replies). Kafka
        GroupCoordinator.handleLeaveGroup: an unknown group answers each member
        UNKNOWN_MEMBER_ID; a static member may leave by instance id alone.
        """
        replies: list[Reply] = []
        if self.closed:
            return COORDINATOR_NOT_AVAILABLE, [], replies
        if not group_id:
            return INVALID_GROUP_ID, [], replies
        group = self.groups.get(group_id)
        if group is None:
            return NONE, [UNKNOWN_MEMBER_ID] * len(members), replies
        if group.state is GroupState.DEAD:
            return COORDINATOR_NOT_AVAILABLE, [], replies
        errors: list[int] = []
        for member_id, instance_id in members:
            if member_id and group.static_member_fenced(member_id, instance_id):
                errors.append(FENCED_INSTANCE_ID)
            elif member_id in group.pending_members:
                del group.pending_members[member_id]
                self._try_complete_join(group, now_ms, replies)
                errors.append(NONE)
            elif member_id not in group.members and (instance_id is None or instance_id not in group.static_members):
                errors.append(UNKNOWN_MEMBER_ID)
            else:
                if instance_id is not None and instance_id in group.static_members:
                    member = group.members[group.static_members[instance_id]]
                else:
                    member = group.members[member_id]
                self._remove_member_and_update_group(group, member, now_ms, replies)
                errors.append(NONE)
        return NONE, errors, replies

    # ------------------------------------------------------------------ timers

    def next_deadline_ms(self) -> float | None:
        """The earliest time (ms) ``tick`` has something to do, None if nothing is scheduled."""
        deadlines = []
        for group in self.groups.values():
            if group.join_deadline_ms is not None:
                deadlines.append(group.join_deadline_ms)
            if group.sync_deadline_ms is not None:
                deadlines.append(group.sync_deadline_ms)
            deadlines.extend(group.pending_members.values())
            deadlines.extend(m.heartbeat_deadline_ms for m in group.members.values()
                             if m.heartbeat_deadline_ms is not None)
        return min(deadlines, default=None)

    def tick(self, now_ms: float) -> list[Reply]:
        """Run every timer due at ``now_ms``: end join phases (Kafka DelayedJoin/InitialDelayedJoin),
        expire KIP-394 ids (removePendingMemberAndUpdateGroup), remove members that missed
        their SyncGroup (Kafka onExpirePendingSync) or their session (onExpireHeartbeat)."""
        replies: list[Reply] = []
        for group in list(self.groups.values()):
            # A loop: an initial delay extended by 0 ms (delay 0) is due again at once.
            while group.join_deadline_ms is not None and group.join_deadline_ms <= now_ms:
                self._expire_join(group, now_ms, replies)
            for member_id, deadline in list(group.pending_members.items()):
                if deadline <= now_ms:
                    del group.pending_members[member_id]
                    self._try_complete_join(group, now_ms, replies)
            if group.sync_deadline_ms is not None and group.sync_deadline_ms <= now_ms:
                group.sync_deadline_ms = None
                if group.pending_sync and group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
                    for member_id in list(group.pending_sync):
                        member = group.members.get(member_id)
                        if member is not None:
                            self._drop_member(group, member, replies)
                    self._prepare_rebalance(group, now_ms, replies)
                    self._try_complete_join(group, now_ms, replies)
            for member in list(group.members.values()):
                heartbeat_deadline = member.heartbeat_deadline_ms
                if heartbeat_deadline is None or heartbeat_deadline > now_ms \
                        or group.members.get(member.member_id) is not member:
                    continue
                if not member.is_new and (member.join_waiter is not None or member.sync_waiter is not None):
                    # Awaiting a rebalance counts as a heartbeat (Kafka hasSatisfiedHeartbeat);
                    # the session restarts when it is answered.
                    member.heartbeat_deadline_ms = None
                else:
                    log.info("group %s: member %s removed: no heartbeat for its session (%d ms)",
                             group.group_id, member.member_id, member.session_timeout_ms)
                    self._remove_member_and_update_group(group, member, now_ms, replies)
        return replies

    def close(self) -> list[Reply]:
        """Answer every pending JoinGroup and SyncGroup NOT_COORDINATOR and refuse what follows
        (the broker stops: Kafka GroupCoordinator.onResignation answers its purgatory so)."""
        self.closed = True
        replies: list[Reply] = []
        for group in self.groups.values():
            _not_coordinator(group, replies)
        return replies

    def unload(self, group_ids: list[str]) -> list[Reply]:
        """Another broker coordinates these groups now (Kafka GroupMetadataManager.removeGroupsForPartition):
        their pending JoinGroup and SyncGroup answer NOT_COORDINATOR and their state is dropped (a later
        ``load`` takes their committed offsets from the store again)."""
        replies: list[Reply] = []
        for group_id in group_ids:
            group = self.groups.pop(group_id, None)
            if group is not None:
                _not_coordinator(group, replies)
        return replies

    # ------------------------------------------------------------------ offsets

    def validate_commit(self, now_ms: float, *, group_id: str, generation_id: int, member_id: str,
                        instance_id: str | None) -> int:
        """May this OffsetCommit be written? (Kafka GroupCoordinator.handleCommitOffsets / doCommitOffsets).

        A commit with generation < 0 to an Empty or unknown group is a "simple"
        consumer's (offsets only, no membership). Otherwise the member and the
        generation must be current, and not during CompletingRebalance; a valid
        commit also renews the member's session.
        """
        if self.closed:
            return COORDINATOR_NOT_AVAILABLE
        group = self.groups.get(group_id)
        if group is None:
            return NONE if generation_id < 0 else ILLEGAL_GENERATION
        if group.state is GroupState.DEAD:
            return COORDINATOR_NOT_AVAILABLE
        if group.static_member_fenced(member_id, instance_id):
            return FENCED_INSTANCE_ID
        if generation_id < 0 and group.state is GroupState.EMPTY:
            return NONE
        if member_id not in group.members:
            return UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return ILLEGAL_GENERATION
        if group.state is GroupState.COMPLETING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        member = group.members[member_id]
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        return NONE

    def validate_txn_commit(self, *, group_id: str, generation_id: int, member_id: str,
                            instance_id: str | None) -> int:
        """May a transaction add offsets of ``group_id`` (TxnOffsetCommit)? KIP-447: a producer that
        sends its consumer's group metadata (v3) is fenced like a consumer's OffsetCommit, so a zombie
        whose group rebalanced since (Kafka's ``consumer_group_metadata`` from an older generation)
        cannot commit. Kafka GroupCoordinator.validateOffsetCommit with ``isTransactional``:

        - a request naming no member (generation < 0, no member id, no instance id: v0-2, or a
          producer outside any group) is not checked;
        - otherwise the member must be current (FENCED_INSTANCE_ID: another member id holds its
          ``group_instance_id``; UNKNOWN_MEMBER_ID: not in the group, or the group is unknown) and
          the generation the group's (ILLEGAL_GENERATION).

        Unlike OffsetCommit it is not refused during CompletingRebalance and renews no session.
        """
        if self.closed:
            return COORDINATOR_NOT_AVAILABLE
        group = self.groups.get(group_id)
        if group is not None and group.state is GroupState.DEAD:
            return COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and not member_id and instance_id is None:
            return NONE
        if group is None or (instance_id is not None and instance_id not in group.static_members):
            return UNKNOWN_MEMBER_ID  # an unknown group: Kafka adds it Empty first, no member is current in it
        return self._check_member(group, generation_id, member_id, instance_id)

    def protocol_type(self, group_id: str) -> str | None:
        group = self.groups.get(group_id)
        return group.protocol_type if group is not None else None

    def apply_commit(self, group_id: str, offsets: dict[tuple[str, int], tuple[int, int, str | None]],
                     protocol_type: str | None = None) -> None:
        """Offsets now durable: visible to OffsetFetch (creates an Empty group if needed)."""
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        group.offsets.update(offsets)
        if group.protocol_type is None:
            group.protocol_type = protocol_type

    def fetch_offsets(self, group_id: str, partitions: Iterable[tuple[str, int]] | None
                      ) -> list[tuple[str, int, int, int, str | None]]:
        """(topic, partition, offset, leader epoch, metadata) for ``partitions`` (None: every
        committed one). Nothing committed: offset -1, epoch -1, metadata "" (Kafka
        GroupMetadataManager.getOffsets, INVALID_OFFSET)."""
        group = self.groups.get(group_id)
        offsets = group.offsets if group is not None and group.state is not GroupState.DEAD else {}
        if partitions is None:
            return [(t, p, *offsets[(t, p)]) for t, p in sorted(offsets)]
        result = []
        for t, p in partitions:
            if (t, p) in offsets:
                result.append((t, p, *offsets[(t, p)]))
            else:
                result.append((t, p, -1, -1, ""))
        return result

    def delete_group(self, group_id: str) -> int:
        """Start deleting a group (Kafka GroupCoordinator.handleDeleteGroups): only an
        Empty group can be; it is Dead from now on. The caller removes its offsets
        durably, then calls ``apply_delete`` (or ``undo_delete`` if that failed)."""
        if self.closed:
            return COORDINATOR_NOT_AVAILABLE
        group = self.groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            return GROUP_ID_NOT_FOUND
        if group.state is not GroupState.EMPTY:
            return NON_EMPTY_GROUP
        group.transition_to(GroupState.DEAD)
        return NONE

    def apply_delete(self, group_id: str) -> None:
        """The group's offsets are durably gone: forget it."""
        group = self.groups.get(group_id)
        if group is not None and group.state is GroupState.DEAD:
            del self.groups[group_id]

    def undo_delete(self, group_id: str) -> None:
        """Deleting failed: the group is Empty again, with its offsets."""
        group = self.groups.get(group_id)
        if group is not None and group.state is GroupState.DEAD:
            group.state = GroupState.EMPTY

    def check_offset_delete(self, group_id: str, topics: Iterable[str]) -> tuple[int, set[str]]:
        """May offsets of ``topics`` be deleted? (KIP-496, Kafka GroupCoordinator.handleDeleteOffsets).

        Returns (group error, topics that may not: the group is a consumer group
        with members subscribed to them, GROUP_SUBSCRIBED_TO_TOPIC). A non-empty
        group whose subscriptions cannot be read is NON_EMPTY_GROUP.
        """
        if self.closed:
            return COORDINATOR_NOT_AVAILABLE, set()
        if not group_id:
            return INVALID_GROUP_ID, set()
        group = self.groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            return GROUP_ID_NOT_FOUND, set()
        if group.state is GroupState.EMPTY:
            return NONE, set()
        if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return NON_EMPTY_GROUP, set()
        subscribed: set[str] = set()
        for member in group.members.values():
            for _name, metadata in member.protocols:
                topics_of = subscribed_topics(group.protocol_type, metadata)
                if topics_of is None:
                    return NON_EMPTY_GROUP, set()
                subscribed |= topics_of
        return NONE, subscribed & set(topics)

    def apply_offset_delete(self, group_id: str, partitions: Iterable[tuple[str, int]]) -> None:
        """Those offsets are durably gone."""
        group = self.groups.get(group_id)
        if group is not None:
            for tp in partitions:
                group.offsets.pop(tp, None)

    # ------------------------------------------------------------------ admin views

    def describe(self, group_id: str) -> GroupSummary:
        """Kafka GroupCoordinator.handleDescribeGroup / GroupMetadata.summary: members'
        metadata and assignments only when Stable; an unknown group is "Dead", no error."""
        if self.closed:
            return GroupSummary(COORDINATOR_NOT_AVAILABLE, GroupState.DEAD.value, "", "", ())
        group = self.groups.get(group_id)
        if group is None:
            return GroupSummary(NONE, GroupState.DEAD.value, "", "", ())
        stable = group.state is GroupState.STABLE
        members = tuple(
            MemberSummary(m.member_id, m.instance_id, m.client_id, m.client_host,
                          m.metadata(group.protocol_name) if stable and group.protocol_name else b"",
                          m.assignment if stable else b"")
            for m in group.members.values())
        return GroupSummary(NONE, group.state.value, group.protocol_type or "",
                            (group.protocol_name or "") if stable else "", members)

    def list_groups(self, states: Iterable[str] = ()) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every group, only those in ``states`` if any
        are given (case-insensitive, as Kafka's ConsumerGroupState.parse); Kafka
        GroupCoordinator.handleListGroups."""
        wanted = {s.lower() for s in states}
        return [(g.group_id, g.protocol_type or "", g.state.value) for g in self.groups.values()
                if g.state is not GroupState.DEAD and (not wanted or g.state.value.lower() in wanted)]


def _not_coordinator(group: Group, replies: list[Reply]) -> None:
    """Answer the group's pending JoinGroup and SyncGroup NOT_COORDINATOR (into ``replies``)."""
    for member in group.members.values():
        _answer_waiters(member, NOT_COORDINATOR, replies)


def _answer_waiters(member: Member, error: int, replies: list[Reply]) -> None:
    """Answer the member's pending JoinGroup and SyncGroup with ``error`` (into ``replies``)."""
    if member.join_waiter is not None:
        replies.append((member.join_waiter, JoinResult(error, member.member_id)))
        member.join_waiter = None
    if member.sync_waiter is not None:
        replies.append((member.sync_waiter, SyncResult(error)))
        member.sync_waiter = None
