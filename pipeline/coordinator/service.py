"""The group coordinator on trio: api handlers, the timer task, the offset writer.

``GroupCoordinatorService`` wires the sans-I/O ``GroupCoordinator`` to the
request path:

* its handlers (``register`` puts them on ``KafkaApis``) decode a request,
  ask the coordinator, and complete the response on the connection; JoinGroup
  and SyncGroup are *delayed*: their answer is completed later, from another
  request's handler or from the timer task, while the connection's other
  requests go on (the connection's ResponseSequencer keeps response order);
* ``run`` is one task in the server's nursery: it loads the committed offsets
  (SQLite, ``pipeline.coordinator.offset_store``), runs the coordinator's timers
  (``tick`` at ``next_deadline_ms``) and the offset writer;
* the offset writer is the only user of the store: it takes every commit,
  group deletion and offset deletion queued while the previous write ran,
  writes them in one transaction in a worker thread (one fsync), then applies
  them to the coordinator and answers them. So an OffsetCommit is answered only
  once durable, and the event loop never waits for an fsync.

``close`` (server shutdown, after the handlers have drained): pending
JoinGroup/SyncGroup answers go out NOT_COORDINATOR, queued writes finish and
are answered, then ``run`` returns.

Authorization (issue 9) goes through ``KafkaApis.authorize``, with Kafka's
rules (``KafkaApis.handleJoinGroupRequest`` and its siblings): the member apis
and OffsetFetch need GROUP Read, OffsetCommit GROUP Read and TOPIC Read,
DescribeGroups and FindCoordinator GROUP Describe, DeleteGroups GROUP Delete,
OffsetDelete GROUP Delete and TOPIC Read; ListGroups lists the groups the
principal may Describe (all of them with CLUSTER Describe). With no authorizer
every check passes.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from kio.static.primitive import i32, i64

from pipeline.coordinator import coordinator as gc
from pipeline.coordinator.coordinator import (GroupConfig, GroupCoordinator, GroupMembership, JoinResult, Reply,
                                                SyncResult)
from pipeline.coordinator.offset_store import (
    STORE_FILE,
    CommitOffsets,
    DeleteGroup,
    DeleteOffsets,
    Operation,
    OffsetStore,
    StoreMembership,
)
from pipeline.metadata.database import Target, is_postgres_url, store_target
from pipeline.protocol import apis
from pipeline.protocol.apis import (
    DELETE_GROUPS,
    DESCRIBE_GROUPS,
    FIND_COORDINATOR,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    OFFSET_COMMIT,
    OFFSET_DELETE,
    OFFSET_FETCH,
    SYNC_GROUP,
)
from pipeline.network.api_host import ApiHost
from pipeline.network.request_channel import Request
from pipeline.network.request_metrics import add_error
from pipeline.security.acl import CLUSTER_NAME, AclOperation, ResourceType

log = logging.getLogger(__name__)

OFFSET_METADATA_MAX_BYTES = 4096
"""Longest committed metadata string (bytes of UTF-8; Kafka ``offset.metadata.max.bytes``)."""
WRITE_QUEUE_SIZE = 1024
"""Offset writes waiting for the writer; a full queue makes OffsetCommit handlers wait (backpressure)."""
WRITE_BATCH_MAX = 512
"""Most queued writes taken into one transaction."""
INVALID_REQUEST = 42
COORDINATOR_LOAD_IN_PROGRESS = 14
OFFSET_METADATA_TOO_LARGE = 12
UNSTABLE_OFFSET_COMMIT = 88
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
TRANSACTIONAL_ID = ResourceType.TRANSACTIONAL_ID
GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE = 0, 1
TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED = 29, 30
READ, DESCRIBE, DELETE = AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE
GROUP, TOPIC = ResourceType.GROUP, ResourceType.TOPIC


def _ms(value: datetime.timedelta) -> int:
    return round(value.total_seconds() * 1000)


def client_host(connection_id: str) -> str:
    """The client's address as Kafka shows it in DescribeGroups ("/127.0.0.1") from a
    connection id ``local:port-remote:port-index``."""
    parts = connection_id.split("-")
    if len(parts) >= 2 and ":" in parts[1]:
        return "/" + parts[1].rsplit(":", 1)[0]
    return ""


@dataclass(eq=False, slots=True)
class _Waiter:
    """A JoinGroup or SyncGroup waiting for its answer: what is needed to build and send it."""

    request: Request
    group_id: str = ""


@dataclass(slots=True)
class _Write:
    operations: list[Operation]
    on_done: Callable[[bool], None]
    """Called with True once durable (False: the write failed, nothing stored)."""


class GroupCoordinatorService:
    """The coordinator's handlers, timers and offset writer (see the module docstring).

    Args:
        apis_: the server's KafkaApis (its ``broker``, ``catalog`` and ``request_metrics`` are used).
        config: see GroupConfig.
        store_path: the SQLite file (``DATA_DIR/_pipeline/groups.db``) or a PostgreSQL URL.
        coordinator: the state machine (tests pass one with predictable member ids).
    """

    def __init__(self, apis_: ApiHost, config: GroupConfig, store_path: Target,
                 coordinator: GroupCoordinator | None = None) -> None:
        self.apis = apis_
        self.state = coordinator or GroupCoordinator(config)
        self.store_path = store_path if is_postgres_url(store_path) else Path(store_path)
        self._store: OffsetStore | None = None
        self._syncs_to_store: dict[str, list[tuple[_Waiter, SyncResult]]] = {}
        """Successful SyncGroup answers waiting for their group's membership to be stored (``_deliver``)."""
        self._early_loads: list[Callable[[str], bool]] = []
        """``load_groups`` calls made before ``run`` opened the store: ``run`` loads their groups."""
        self._wakeup = trio.Event()
        self._writes_send, self._writes_receive = trio.open_memory_channel[_Write](WRITE_QUEUE_SIZE)
        self._memberships_changed = trio.Event()  # the coordinator has memberships to store
        self._closed = trio.Event()
        self._closing = False
        self._errors = {key: apis_.request_metrics.errors(key) for key in (
            FIND_COORDINATOR, JOIN_GROUP, SYNC_GROUP, HEARTBEAT, LEAVE_GROUP, OFFSET_COMMIT, OFFSET_FETCH,
            DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS, OFFSET_DELETE)}
        self.writes = 0
        """Transactions written (each one fsync)."""
        self.pending_transactional: Callable[[str], set[tuple[str, int]]] = lambda group_id: set()
        """The partitions of a group with offsets an open transaction commits (TxnOffsetCommit);
        from the transaction coordinator (``serve_transactions``)."""
        self.transactions_served = False
        """FindCoordinator for transactional ids answers this broker (the transaction coordinator is on)."""

    def serve_transactions(self, pending_transactional: Callable[[str], set[tuple[str, int]]]) -> None:
        """The transaction coordinator is on (``pipeline.requests.txn_apis.TransactionApis.register``):
        FindCoordinator answers for transactional ids, and OffsetFetch with ``require_stable`` asks
        ``pending_transactional(group_id)`` which partitions an open transaction commits offsets of
        (KIP-447: those answer UNSTABLE_OFFSET_COMMIT)."""
        self.transactions_served = True
        self.pending_transactional = pending_transactional

    @classmethod
    def for_data_dir(cls, apis_: ApiHost, config: GroupConfig, data_dir: Path,
                     metadata_url: str | None = None) -> "GroupCoordinatorService":
        """The service of a server: offsets in ``DATA_DIR/_pipeline/groups.db``, or in the PostgreSQL
        database of ``metadata_url``."""
        return cls(apis_, config, store_target(metadata_url, data_dir, STORE_FILE))

    def register(self) -> None:
        """Serve the group apis on ``self.apis`` (KafkaApis.register)."""
        for key, handler in ((FIND_COORDINATOR, self._find_coordinator), (JOIN_GROUP, self._join_group),
                             (SYNC_GROUP, self._sync_group), (HEARTBEAT, self._heartbeat),
                             (LEAVE_GROUP, self._leave_group), (OFFSET_COMMIT, self._offset_commit),
                             (OFFSET_FETCH, self._offset_fetch), (DESCRIBE_GROUPS, self._describe_groups),
                             (LIST_GROUPS, self._list_groups), (DELETE_GROUPS, self._delete_groups),
                             (OFFSET_DELETE, self._offset_delete)):
            self.apis.register(key, handler)

    # ------------------------------------------------------------------ lifecycle

    @staticmethod
    def _now_ms() -> float:
        return trio.current_time() * 1000.0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load the groups this broker coordinates (alone: every group; in a cluster those of the
        ``__consumer_offsets`` partitions it leads already, the others come with ``load_groups``), then
        run the timers and the writer until ``close``. A group another broker coordinates is not
        loaded: its members heartbeat there, and here their sessions would run out and this
        broker would store the group Empty over the coordinator's membership (one shared store)."""
        self._store = store = await trio.to_thread.run_sync(OffsetStore, self.store_path)
        try:
            loaded, memberships = await trio.to_thread.run_sync(self._read_groups, store)
            mine = [g for g in loaded if self._coordinates(g) or any(accepts(g) for accepts in self._early_loads)]
            for group_id in mine:
                protocol_type, offsets = loaded[group_id]
                self.state.load(group_id, protocol_type, offsets, memberships.get(group_id), self._now_ms())
            if mine:
                log.info("group coordinator: %d groups with committed offsets loaded", len(mine))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer)
                nursery.start_soon(self._membership_writer)
                task_status.started()
                await self._timers()
        finally:
            store.close()
            self._closed.set()

    @staticmethod
    def _read_groups(store: OffsetStore) -> tuple[dict[str, Any], dict[str, GroupMembership]]:
        """Every stored group (``OffsetStore.load``) and stored membership (blocking); a membership that
        does not parse is logged and left out (its members rejoin)."""
        memberships: dict[str, GroupMembership] = {}
        for group_id, text in store.memberships().items():
            try:
                memberships[group_id] = GroupMembership.from_json(json.loads(text))
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("group coordinator: the stored membership of group %s is unreadable (%s): its "
                            "members rejoin", group_id, exc)
        return store.load(), memberships

    async def _membership_writer(self) -> None:
        """Store what the coordinator says changed of its groups' memberships (in the offsets' write
        order), until ``close``. A membership stored late or not at all only costs a rejoin after a move."""
        while not self._closing:
            await self._memberships_changed.wait()
            self._memberships_changed = trio.Event()
            await self._queue_membership_changes()

    async def _queue_membership_changes(self) -> None:
        """Queue the memberships the coordinator says changed (``take_membership_changes``) for the
        writer; the SyncGroup answers that wait for them go out once written (or the write failed:
        then the members carry on, and a coordinator taking the group over has the previous one)."""
        changes = self.state.take_membership_changes()
        if not changes:
            return
        held = [item for g in changes for item in self._syncs_to_store.pop(g, ())]

        def stored(ok: bool) -> None:
            if not ok and not self._closing:
                log.warning("group coordinator: storing the membership of %s failed", ", ".join(changes))
            for waiter, result in held:
                self._answer(waiter, result)

        if self._closing:
            stored(False)
            return
        await self._write([StoreMembership(g, m.protocol_type if m is not None else None,
                                           json.dumps(m.to_json()) if m is not None else None)
                           for g, m in changes.items()], stored)

    async def _timers(self) -> None:
        while not self._closing:
            deadline = self.state.next_deadline_ms()
            with trio.move_on_at(math.inf if deadline is None else deadline / 1000.0):
                await self._wakeup.wait()
            self._wakeup = trio.Event()
            if not self._closing:
                self._deliver(self.state.tick(self._now_ms()))

    def _poke(self) -> None:
        """The coordinator's deadlines may have changed: let the timer task look again."""
        self._wakeup.set()

    def close(self) -> None:
        """Answer every pending JoinGroup/SyncGroup (NOT_COORDINATOR), stop taking writes;
        ``run`` returns once the queued writes are done and answered. Idempotent."""
        if self._closing:
            return
        self._closing = True
        self._deliver(self.state.close())
        self._writes_send.close()
        self._memberships_changed.set()
        self._poke()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def _writer(self) -> None:
        store = self._store
        assert store is not None
        async with self._writes_receive:
            async for first in self._writes_receive:
                batch = [first]
                while len(batch) < WRITE_BATCH_MAX:
                    try:
                        batch.append(self._writes_receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                operations = [op for w in batch for op in w.operations]
                try:
                    await trio.to_thread.run_sync(store.write, operations)
                    ok = True
                    self.writes += 1
                except Exception:
                    log.exception("group coordinator: writing %d offset operations to %s failed",
                                  len(operations), store.path)
                    ok = False
                for w in batch:
                    w.on_done(ok)

    async def commit_offsets(self, group_id: str, offsets: dict[tuple[str, int], tuple[int, int, str | None]]
                             ) -> bool:
        """Store a committed transaction's offsets of ``group_id`` (KIP-98: they become the group's at
        the COMMIT marker) and make them visible; True once durable, False if the write failed."""
        done = trio.Event()
        result = [False]

        def on_done(ok: bool) -> None:
            if ok:
                self.state.apply_commit(group_id, offsets, self.state.protocol_type(group_id))
            result[0] = ok
            done.set()

        await self._write([CommitOffsets(group_id, self.state.protocol_type(group_id), offsets,
                                         time.time_ns() // 1_000_000)], on_done)
        await done.wait()
        return result[0]

    async def _write(self, operations: list[Operation], on_done: Callable[[bool], None]) -> None:
        if self._closing:
            on_done(False)
            return
        await self._writes_send.send(_Write(operations, on_done))

    # ------------------------------------------------------------------ delayed answers

    def _deliver(self, replies: list[Reply]) -> None:
        """Send the answers, except a successful SyncGroup of a group whose new membership is still to
        be stored: that one waits for the write (``_queue_membership_changes``), as Kafka's
        doSyncGroup answers once the group metadata is appended, so a generation a member was told
        of is the one a coordinator taking the group over loads."""
        unstored = self.state.membership_changes
        for waiter, result in replies:
            assert isinstance(waiter, _Waiter)
            if isinstance(result, SyncResult) and result.error == gc.NONE and waiter.group_id in unstored:
                self._syncs_to_store.setdefault(waiter.group_id, []).append((waiter, result))
            else:
                self._answer(waiter, result)
        if replies:
            self._poke()
        if self.state.membership_changes:
            self._memberships_changed.set()

    def _answer(self, waiter: _Waiter, result: JoinResult | SyncResult) -> None:
        request = waiter.request
        if isinstance(result, JoinResult):
            payload = self._join_response(request, result)
        else:
            payload = self._sync_response(request, result)
        request.connection.complete(request.token, payload)

    def _join_response(self, request: Request, r: JoinResult) -> bytes:
        header = request.header
        version = header.api_version
        mod = apis.response_module(JOIN_GROUP, version)
        add_error(self._errors[JOIN_GROUP], r.error)
        members = tuple(apis.make(mod.JoinGroupResponseMember, member_id=mid, group_instance_id=iid, metadata=md)
                        for mid, iid, md in r.members)
        protocol_name = r.protocol_name
        if protocol_name is None and version < 7:
            protocol_name = ""  # nullable from v7
        body = apis.make(mod.JoinGroupResponse, throttle_time=apis.ZERO_MS, error_code=apis.error_code(r.error),
                         generation_id=i32(r.generation_id), protocol_type=r.protocol_type,
                         protocol_name=protocol_name, leader=r.leader_id, skip_assignment=False,
                         member_id=r.member_id, members=members)
        return apis.encode(header, body)

    def _sync_response(self, request: Request, r: SyncResult) -> bytes:
        header = request.header
        mod = apis.response_module(SYNC_GROUP, header.api_version)
        add_error(self._errors[SYNC_GROUP], r.error)
        body = apis.make(mod.SyncGroupResponse, throttle_time=apis.ZERO_MS, error_code=apis.error_code(r.error),
                         protocol_type=r.protocol_type, protocol_name=r.protocol_name, assignment=r.assignment)
        return apis.encode(header, body)

    # ------------------------------------------------------------------ authorization

    def _coordinates(self, group_id: str) -> bool:
        """Whether this broker coordinates ``group_id`` (always, alone; in a cluster
        ``Cluster.coordinator``). Group requests for a group another broker coordinates
        answer NOT_COORDINATOR, so the client asks FindCoordinator again (Kafka)."""
        cluster = self.apis.broker.cluster
        return cluster is None or cluster.coordinates(group_id)

    def _not_coordinating(self, group_id: str) -> int:
        """The error for a group this broker does not serve now: COORDINATOR_LOAD_IN_PROGRESS while it
        loads the group's offsets after becoming its coordinator (the client retries here), else
        NOT_COORDINATOR (Kafka GroupCoordinator.validateGroupStatus)."""
        loading = getattr(self.apis.broker.cluster, "loading", None)
        return COORDINATOR_LOAD_IN_PROGRESS if loading is not None and loading(group_id) else gc.NOT_COORDINATOR

    async def load_groups(self, in_partition: Callable[[str], bool]) -> int:
        """This broker now coordinates the groups ``in_partition`` accepts (``pipeline.cluster.service``):
        their state is dropped and their committed offsets and last Stable membership read from the
        store again (Kafka GroupMetadataManager.loadGroupsForPartition); the groups loaded."""
        self._deliver(self.state.unload([g for g in list(self.state.groups) if in_partition(g)]))
        store = self._store
        if store is None:  # not running yet: ``run`` loads them
            self._early_loads.append(in_partition)
            return 0
        loaded, memberships = await trio.to_thread.run_sync(self._read_groups, store)
        count = 0
        for group_id, (protocol_type, offsets) in loaded.items():
            if in_partition(group_id):
                self.state.load(group_id, protocol_type, offsets, memberships.get(group_id), self._now_ms())
                count += 1
        self._poke()  # the loaded members' sessions: the timers look at their deadlines
        return count

    async def sync_writes(self) -> None:
        """Return once every offset write queued before this call, and every membership change made
        before it, is durable or failed (a barrier: what a coordinator handing its groups to another
        broker waits for, so the new coordinator reads the latest generation; a change the membership
        writer had not taken yet is queued here first)."""
        await self._queue_membership_changes()
        done = trio.Event()
        await self._write([], lambda ok: done.set())
        await done.wait()

    def unload_groups(self, in_partition: Callable[[str], bool]) -> None:
        """Another broker coordinates the groups ``in_partition`` accepts now: their pending JoinGroup and
        SyncGroup answer NOT_COORDINATOR and their state goes (Kafka GroupCoordinator.onResignation)."""
        self._deliver(self.state.unload([g for g in list(self.state.groups) if in_partition(g)]))

    def _allowed(self, request: Request, operation: AclOperation, resource_type: ResourceType, name: str,
                 log_denied: bool = True) -> bool:
        """``KafkaApis.authorize`` (True for everything when no authorizer is configured)."""
        return self.apis.authorize(request, operation, resource_type, name, log_denied)

    def _readable_topics(self, request: Request, topics: Any) -> dict[str, bool]:
        """topic -> TOPIC Read allowed, each topic checked once (Kafka ``authHelper.filterByAuthorized``)."""
        return {name: self._allowed(request, READ, TOPIC, name) for name in dict.fromkeys(t.name for t in topics)}

    # ------------------------------------------------------------------ handlers

    @staticmethod
    def _coordinator_of(broker: Any, key: str) -> tuple[str, int, str | None, int, str, int]:
        """FindCoordinator's answer for group or transactional id ``key``: this broker alone, else
        ``Cluster.coordinator(key)`` (transactional ids are placed as groups are; Kafka places them
        by their own ``__transaction_state`` partitions)."""
        node = broker.node_id if broker.cluster is None else broker.cluster.coordinator(key)
        try:
            return (key, gc.NONE, None, node, *broker.address_of(node))
        except KeyError:  # its broker is not a live member (moving to another one)
            return (key, gc.COORDINATOR_NOT_AVAILABLE, "the coordinator is moving", -1, "", -1)

    async def _find_coordinator(self, request: Request) -> None:
        """FindCoordinator v0-4: the coordinator of a group or transactional id (``_coordinator_of``;
        COORDINATOR_NOT_AVAILABLE for a transactional id where transactions are not served);
        another key type is INVALID_REQUEST (Kafka KafkaApis.handleFindCoordinatorRequest).
        A group key needs GROUP Describe, else GROUP_AUTHORIZATION_FAILED (per key from v4)."""
        header = request.header
        version = header.api_version
        body = apis.decode_request(header, request.frame)
        mod = apis.response_module(FIND_COORDINATOR, version)
        key_type = int(getattr(body, "key_type", GROUP_KEY_TYPE))
        keys = list(body.coordinator_keys) if version >= 4 else [body.key]
        broker = self.apis.broker.for_listener(request.connection.listener)
        found: list[tuple[str, int, str | None, int, str, int]] = []  # key, error, message, node, host, port
        for key in keys:
            if key_type == GROUP_KEY_TYPE and not self._allowed(request, DESCRIBE, GROUP, key):
                found.append((key, GROUP_AUTHORIZATION_FAILED, None, -1, "", -1))
            elif key_type == GROUP_KEY_TYPE and not self._closing:
                found.append(self._coordinator_of(broker, key))
            elif key_type == GROUP_KEY_TYPE:
                found.append((key, gc.COORDINATOR_NOT_AVAILABLE, "the broker is shutting down", -1, "", -1))
            elif key_type == TRANSACTION_KEY_TYPE and not self.transactions_served:
                found.append((key, gc.COORDINATOR_NOT_AVAILABLE, "transactions are not served by this cluster",
                              -1, "", -1))
            elif key_type == TRANSACTION_KEY_TYPE and not self._allowed(request, DESCRIBE, TRANSACTIONAL_ID, key):
                found.append((key, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None, -1, "", -1))
            elif key_type == TRANSACTION_KEY_TYPE and not self._closing:
                found.append(self._coordinator_of(broker, key))
            elif key_type == TRANSACTION_KEY_TYPE:
                found.append((key, gc.COORDINATOR_NOT_AVAILABLE, "the broker is shutting down", -1, "", -1))
            else:
                found.append((key, INVALID_REQUEST, f"unknown coordinator key type {key_type}", -1, "", -1))
        for f in found:
            add_error(self._errors[FIND_COORDINATOR], f[1])
        if version >= 4:
            coordinators = tuple(apis.make(mod.Coordinator, key=k, node_id=i32(n), host=h, port=i32(p),
                                           error_code=apis.error_code(e), error_message=m)
                                 for k, e, m, n, h, p in found)
            response = apis.make(mod.FindCoordinatorResponse, throttle_time=apis.ZERO_MS, coordinators=coordinators)
        else:
            _k, e, m, n, h, p = found[0]
            response = apis.make(mod.FindCoordinatorResponse, throttle_time=apis.ZERO_MS,
                                 error_code=apis.error_code(e), error_message=m, node_id=i32(n), host=h,
                                 port=i32(p))
        request.connection.complete(request.token, apis.encode(header, response))

    async def _join_group(self, request: Request) -> None:
        """JoinGroup; GROUP Read, else GROUP_AUTHORIZATION_FAILED with the request's member id
        (Kafka KafkaApis.handleJoinGroupRequest)."""
        header = request.header
        version = header.api_version
        body = apis.decode_request(header, request.frame)
        if not self._allowed(request, READ, GROUP, body.group_id):
            request.connection.complete(request.token, self._join_response(
                request, JoinResult(GROUP_AUTHORIZATION_FAILED, member_id=body.member_id)))
            return
        if not self._coordinates(body.group_id):
            request.connection.complete(request.token, self._join_response(
                request, JoinResult(self._not_coordinating(body.group_id), member_id=body.member_id)))
            return
        session_ms = _ms(body.session_timeout)
        instance_id = getattr(body, "group_instance_id", None)
        waiter = _Waiter(request)
        replies = self.state.join(
            waiter, self._now_ms(), group_id=body.group_id, member_id=body.member_id, instance_id=instance_id,
            client_id=header.client_id or "", client_host=client_host(request.connection.connection_id),
            protocol_type=body.protocol_type, protocols=[(p.name, p.metadata) for p in body.protocols],
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=_ms(body.rebalance_timeout) if version >= 1 else session_ms,
            require_known_member_id=version >= 4 and instance_id is None)
        self._deliver(replies)
        self._poke()

    async def _sync_group(self, request: Request) -> None:
        """SyncGroup; GROUP Read, else GROUP_AUTHORIZATION_FAILED (Kafka KafkaApis.handleSyncGroupRequest)."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        if not self._allowed(request, READ, GROUP, body.group_id):
            request.connection.complete(request.token, self._sync_response(
                request, SyncResult(GROUP_AUTHORIZATION_FAILED)))
            return
        if not self._coordinates(body.group_id):
            request.connection.complete(request.token, self._sync_response(request, SyncResult(self._not_coordinating(body.group_id))))
            return
        replies = self.state.sync(
            _Waiter(request, body.group_id), self._now_ms(), group_id=body.group_id, generation_id=int(body.generation_id),
            member_id=body.member_id, instance_id=getattr(body, "group_instance_id", None),
            protocol_type=getattr(body, "protocol_type", None), protocol_name=getattr(body, "protocol_name", None),
            assignments={a.member_id: a.assignment for a in body.assignments})
        self._deliver(replies)
        self._poke()

    async def _heartbeat(self, request: Request) -> None:
        """Heartbeat; GROUP Read, else GROUP_AUTHORIZATION_FAILED (Kafka KafkaApis.handleHeartbeatRequest)."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        if not self._allowed(request, READ, GROUP, body.group_id):
            error = GROUP_AUTHORIZATION_FAILED
        elif not self._coordinates(body.group_id):
            error = self._not_coordinating(body.group_id)
        else:
            error = self.state.heartbeat(self._now_ms(), group_id=body.group_id,
                                         generation_id=int(body.generation_id), member_id=body.member_id,
                                         instance_id=getattr(body, "group_instance_id", None))
            self._poke()
        add_error(self._errors[HEARTBEAT], error)
        mod = apis.response_module(HEARTBEAT, header.api_version)
        response = apis.make(mod.HeartbeatResponse, throttle_time=apis.ZERO_MS, error_code=apis.error_code(error))
        request.connection.complete(request.token, apis.encode(header, response))

    async def _leave_group(self, request: Request) -> None:
        """LeaveGroup v0-5; v3+ may remove several members (KIP-345). Before v3 a member's
        error is the response's error (Kafka LeaveGroupResponse). GROUP Read, else
        GROUP_AUTHORIZATION_FAILED and no members (Kafka KafkaApis.handleLeaveGroupRequest)."""
        header = request.header
        version = header.api_version
        body = apis.decode_request(header, request.frame)
        leaving: list[tuple[str, str | None]]
        if version >= 3:
            leaving = [(m.member_id, m.group_instance_id) for m in body.members]
        else:
            leaving = [(body.member_id, None)]
        member_errors: list[int]
        if not self._allowed(request, READ, GROUP, body.group_id):
            error, member_errors, leaving = GROUP_AUTHORIZATION_FAILED, [], []
        elif not self._coordinates(body.group_id):
            error, member_errors, leaving = self._not_coordinating(body.group_id), [], []
        else:
            error, member_errors, replies = self.state.leave(self._now_ms(), body.group_id, leaving)
            self._deliver(replies)
            self._poke()
        mod = apis.response_module(LEAVE_GROUP, version)
        if version >= 3:
            members = tuple(apis.make(mod.MemberResponse, member_id=mid, group_instance_id=iid,
                                      error_code=apis.error_code(e))
                            for (mid, iid), e in zip(leaving, member_errors))
            for e in member_errors:
                add_error(self._errors[LEAVE_GROUP], e)
            response = apis.make(mod.LeaveGroupResponse, throttle_time=apis.ZERO_MS,
                                 error_code=apis.error_code(error), members=members)
        else:
            if error == gc.NONE and member_errors:
                error = member_errors[0]
            response = apis.make(mod.LeaveGroupResponse, throttle_time=apis.ZERO_MS,
                                 error_code=apis.error_code(error))
        add_error(self._errors[LEAVE_GROUP], error)
        request.connection.complete(request.token, apis.encode(header, response))

    def _partition_exists(self, topic: str, partition: int) -> bool:
        count = self.apis.catalog.partitions(topic)
        return count is not None and 0 <= partition < count

    async def _offset_commit(self, request: Request) -> None:
        """OffsetCommit v2-8 (Kafka KafkaApis.handleOffsetCommitRequest, GroupCoordinator.handleCommitOffsets):
        unknown topic-partitions are UNKNOWN_TOPIC_OR_PARTITION, metadata over
        OFFSET_METADATA_MAX_BYTES is OFFSET_METADATA_TOO_LARGE, the group's verdict applies to
        the rest; the valid offsets are answered once durable.

        Authorization first (Kafka handleOffsetCommitRequest): without GROUP Read every
        partition is GROUP_AUTHORIZATION_FAILED; a topic without TOPIC Read has its
        partitions TOPIC_AUTHORIZATION_FAILED."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        group_id = body.group_id
        results: list[tuple[str, int, int]] = []  # (topic, partition, error); -1: to write
        to_write: dict[tuple[str, int], tuple[int, int, str | None]] = {}
        if not self._allowed(request, READ, GROUP, group_id):
            request.connection.complete(request.token, self._offset_commit_response(request, [
                (t.name, int(p.partition_index), GROUP_AUTHORIZATION_FAILED) for t in body.topics
                for p in t.partitions]))
            return
        if not self._coordinates(group_id):
            request.connection.complete(request.token, self._offset_commit_response(request, [
                (t.name, int(p.partition_index), self._not_coordinating(group_id)) for t in body.topics for p in t.partitions]))
            return
        readable = self._readable_topics(request, body.topics)
        group_error = self.state.validate_commit(
            self._now_ms(), group_id=group_id, generation_id=int(body.generation_id_or_member_epoch),
            member_id=body.member_id, instance_id=getattr(body, "group_instance_id", None))
        self._poke()
        for topic in body.topics:
            for part in topic.partitions:
                p = int(part.partition_index)
                metadata = part.committed_metadata
                if not readable[topic.name]:
                    error = TOPIC_AUTHORIZATION_FAILED
                elif not self._partition_exists(topic.name, p):
                    error = gc.UNKNOWN_TOPIC_OR_PARTITION
                elif group_error != gc.NONE:
                    error = group_error
                elif metadata is not None and len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                    error = OFFSET_METADATA_TOO_LARGE
                else:
                    error = -1
                    to_write[(topic.name, p)] = (int(part.committed_offset),
                                                 int(getattr(part, "committed_leader_epoch", -1)), metadata)
                results.append((topic.name, p, error))

        def answer(ok: bool) -> None:
            if ok and to_write:
                self.state.apply_commit(group_id, to_write, protocol_type)
            final = [(t, p, e if e != -1 else (gc.NONE if ok else gc.COORDINATOR_NOT_AVAILABLE))
                     for t, p, e in results]
            request.connection.complete(request.token, self._offset_commit_response(request, final))

        protocol_type = self.state.protocol_type(group_id)
        if to_write:
            await self._write([CommitOffsets(group_id, protocol_type, to_write, time.time_ns() // 1_000_000)], answer)
        else:
            answer(True)

    def _offset_commit_response(self, request: Request, results: list[tuple[str, int, int]]) -> bytes:
        header = request.header
        mod = apis.response_module(OFFSET_COMMIT, header.api_version)
        by_topic: dict[str, list[Any]] = {}
        for t, p, e in results:
            add_error(self._errors[OFFSET_COMMIT], e)
            by_topic.setdefault(t, []).append(
                apis.make(mod.OffsetCommitResponsePartition, partition_index=i32(p), error_code=apis.error_code(e)))
        topics = tuple(apis.make(mod.OffsetCommitResponseTopic, name=t, partitions=tuple(ps))
                       for t, ps in by_topic.items())
        return apis.encode(header, apis.make(mod.OffsetCommitResponse, throttle_time=apis.ZERO_MS, topics=topics))

    async def _offset_fetch(self, request: Request) -> None:
        """OffsetFetch v1-8: committed offsets, -1 where nothing is committed; null topics (v2+)
        means every committed partition; v8 asks for several groups (KIP-709).

        Kafka handleOffsetFetchRequest: a group without GROUP Read is
        GROUP_AUTHORIZATION_FAILED (per group in v8); asked partitions of a topic
        without TOPIC Describe are TOPIC_AUTHORIZATION_FAILED, and "every committed
        partition" leaves such topics out."""
        header = request.header
        version = header.api_version
        body = apis.decode_request(header, request.frame)
        mod = apis.response_module(OFFSET_FETCH, version)
        if version >= 8:
            asked = [(g.group_id, g.topics) for g in body.groups]
        else:
            asked = [(body.group_id, body.topics)]
        # (group id, error, [(topic, partition, offset, leader epoch, metadata, error), ...]), ...
        groups: list[tuple[str, int, list[tuple[str, int, int, int, str | None, int]]]] = []
        describable: dict[str, bool] = {}

        def may_describe(topic: str, log_denied: bool) -> bool:
            if topic not in describable:
                describable[topic] = self._allowed(request, DESCRIBE, TOPIC, topic, log_denied)
            return describable[topic]

        for group_id, topics in asked:
            if not self._allowed(request, READ, GROUP, group_id):
                groups.append((group_id, GROUP_AUTHORIZATION_FAILED, []))
                continue
            if self._closing:
                groups.append((group_id, gc.COORDINATOR_NOT_AVAILABLE, []))
                continue
            if not self._coordinates(group_id):
                groups.append((group_id, self._not_coordinating(group_id), []))
                continue
            partitions = None if topics is None else [(t.name, int(p)) for t in topics for p in t.partition_indexes]
            # KIP-447: a consumer asking for stable offsets (read_committed) waits while an open
            # transaction commits offsets of the partition: UNSTABLE_OFFSET_COMMIT, it retries.
            unstable = self.pending_transactional(group_id) if getattr(body, "require_stable", False) else set()
            rows: list[tuple[str, int, int, int, str | None, int]] = [
                (t, p, -1, -1, None, UNSTABLE_OFFSET_COMMIT) if (t, p) in unstable else (t, p, o, e, m, gc.NONE)
                for t, p, o, e, m in self.state.fetch_offsets(group_id, partitions)]
            if topics is None:
                rows = [r for r in rows if may_describe(r[0], False)]
            else:
                rows = [r if may_describe(r[0], True) else (r[0], r[1], -1, -1, None, TOPIC_AUTHORIZATION_FAILED)
                        for r in rows]
            groups.append((group_id, gc.NONE, rows))
        plural = "s" if version >= 8 else ""  # kio's v8 names: OffsetFetchResponsePartitions, ...Topics
        partition_cls = getattr(mod, f"OffsetFetchResponsePartition{plural}")
        topic_cls = getattr(mod, f"OffsetFetchResponseTopic{plural}")
        built = []
        for group_id, error, rows in groups:
            add_error(self._errors[OFFSET_FETCH], error)
            by_topic: dict[str, list[Any]] = {}
            for t, p, offset, epoch, metadata, partition_error in rows:
                by_topic.setdefault(t, []).append(apis.make(
                    partition_cls, partition_index=i32(p), committed_offset=i64(offset),
                    committed_leader_epoch=i32(epoch), metadata=metadata,
                    error_code=apis.error_code(partition_error)))
            topics_built = tuple(apis.make(topic_cls, name=t, partitions=tuple(ps)) for t, ps in by_topic.items())
            built.append((group_id, error, topics_built))
        if version >= 8:
            response = apis.make(mod.OffsetFetchResponse, throttle_time=apis.ZERO_MS, groups=tuple(
                apis.make(mod.OffsetFetchResponseGroup, group_id=g, topics=ts, error_code=apis.error_code(e))
                for g, e, ts in built))
        else:
            _g, e, ts = built[0]
            response = apis.make(mod.OffsetFetchResponse, throttle_time=apis.ZERO_MS, topics=ts,
                                 error_code=apis.error_code(e))
        request.connection.complete(request.token, apis.encode(header, response))

    async def _describe_groups(self, request: Request) -> None:
        """DescribeGroups; a group without GROUP Describe is GROUP_AUTHORIZATION_FAILED, with an
        empty summary (Kafka KafkaApis.handleDescribeGroupsRequest)."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        mod = apis.response_module(DESCRIBE_GROUPS, header.api_version)
        groups = []
        for group_id in body.groups:
            if not self._coordinates(group_id):
                s = gc.GroupSummary(self._not_coordinating(group_id), "", "", "", ())
            elif self._allowed(request, DESCRIBE, GROUP, group_id):
                s = self.state.describe(group_id)
            else:
                s = gc.GroupSummary(GROUP_AUTHORIZATION_FAILED, "", "", "", ())
            add_error(self._errors[DESCRIBE_GROUPS], s.error)
            members = tuple(apis.make(mod.DescribedGroupMember, member_id=m.member_id,
                                      group_instance_id=m.instance_id, client_id=m.client_id,
                                      client_host=m.client_host, member_metadata=m.metadata,
                                      member_assignment=m.assignment) for m in s.members)
            groups.append(apis.make(mod.DescribedGroup, error_code=apis.error_code(s.error), group_id=group_id,
                                    group_state=s.state, protocol_type=s.protocol_type,
                                    protocol_data=s.protocol_name, members=members))
        response = apis.make(mod.DescribeGroupsResponse, throttle_time=apis.ZERO_MS, groups=tuple(groups))
        request.connection.complete(request.token, apis.encode(header, response))

    async def _list_groups(self, request: Request) -> None:
        """ListGroups: every group with CLUSTER Describe, else only the groups the principal may
        Describe, without logging the others (Kafka KafkaApis.handleListGroupsRequest)."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        mod = apis.response_module(LIST_GROUPS, header.api_version)
        error = gc.COORDINATOR_NOT_AVAILABLE if self._closing else gc.NONE
        listed = [] if self._closing else [g for g in self.state.list_groups(getattr(body, "states_filter", ()))
                                           if self._coordinates(g[0])]
        if listed and not self._allowed(request, DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME, log_denied=False):
            listed = [g for g in listed if self._allowed(request, DESCRIBE, GROUP, g[0], log_denied=False)]
        add_error(self._errors[LIST_GROUPS], error)
        groups = tuple(apis.make(mod.ListedGroup, group_id=g, protocol_type=pt, group_state=st)
                       for g, pt, st in listed)
        response = apis.make(mod.ListGroupsResponse, throttle_time=apis.ZERO_MS, error_code=apis.error_code(error),
                             groups=groups)
        request.connection.complete(request.token, apis.encode(header, response))

    async def _delete_groups(self, request: Request) -> None:
        """DeleteGroups v0-2 (Kafka GroupCoordinator.handleDeleteGroups): Empty groups lose
        their offsets durably before the answer; others are NON_EMPTY_GROUP or GROUP_ID_NOT_FOUND.
        A group without GROUP Delete is GROUP_AUTHORIZATION_FAILED (Kafka KafkaApis.handleDeleteGroupsRequest)."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        mod = apis.response_module(DELETE_GROUPS, header.api_version)
        results = [(g, GROUP_AUTHORIZATION_FAILED if not self._allowed(request, DELETE, GROUP, g)
                    else self._not_coordinating(g) if not self._coordinates(g) else self.state.delete_group(g))
                   for g in body.groups_names]
        deleting = [g for g, e in results if e == gc.NONE]

        def answer(ok: bool) -> None:
            final = []
            for g, e in results:
                if g in deleting:
                    if ok:
                        self.state.apply_delete(g)
                    else:
                        self.state.undo_delete(g)
                        e = gc.COORDINATOR_NOT_AVAILABLE
                final.append((g, e))
                add_error(self._errors[DELETE_GROUPS], e)
            response = apis.make(mod.DeleteGroupsResponse, throttle_time=apis.ZERO_MS, results=tuple(
                apis.make(mod.DeletableGroupResult, group_id=g, error_code=apis.error_code(e)) for g, e in final))
            request.connection.complete(request.token, apis.encode(header, response))

        if deleting:
            await self._write([DeleteGroup(g) for g in dict.fromkeys(deleting)], answer)
        else:
            answer(True)

    async def _offset_delete(self, request: Request) -> None:
        """OffsetDelete v0 (KIP-496, Kafka GroupCoordinator.handleDeleteOffsets): a group error
        answers alone; topics a live consumer group subscribes to are GROUP_SUBSCRIBED_TO_TOPIC.
        Kafka KafkaApis.handleOffsetDeleteRequest: GROUP Delete, else GROUP_AUTHORIZATION_FAILED
        alone; a topic without TOPIC Read has its partitions TOPIC_AUTHORIZATION_FAILED."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        mod = apis.response_module(OFFSET_DELETE, header.api_version)
        group_id = body.group_id
        subscribed: set[str]
        readable: dict[str, bool]
        if not self._allowed(request, DELETE, GROUP, group_id):
            group_error, subscribed, readable = GROUP_AUTHORIZATION_FAILED, set(), {}
        elif not self._coordinates(group_id):
            group_error, subscribed, readable = self._not_coordinating(group_id), set(), {}
        else:
            readable = self._readable_topics(request, body.topics)
            group_error, subscribed = self.state.check_offset_delete(
                group_id, [t.name for t in body.topics if readable[t.name]])
        results: list[tuple[str, int, int]] = []
        to_delete: list[tuple[str, int]] = []
        if group_error == gc.NONE:
            for topic in body.topics:
                for part in topic.partitions:
                    p = int(part.partition_index)
                    if not readable[topic.name]:
                        results.append((topic.name, p, TOPIC_AUTHORIZATION_FAILED))
                    elif not self._partition_exists(topic.name, p):
                        results.append((topic.name, p, gc.UNKNOWN_TOPIC_OR_PARTITION))
                    elif topic.name in subscribed:
                        results.append((topic.name, p, gc.GROUP_SUBSCRIBED_TO_TOPIC))
                    else:
                        results.append((topic.name, p, -1))
                        to_delete.append((topic.name, p))

        def answer(ok: bool) -> None:
            if ok and to_delete:
                self.state.apply_offset_delete(group_id, to_delete)
            top = group_error if group_error != gc.NONE or ok else gc.COORDINATOR_NOT_AVAILABLE
            add_error(self._errors[OFFSET_DELETE], top)
            by_topic: dict[str, list[Any]] = {}
            if top == gc.NONE:
                for t, p, e in results:
                    e = gc.NONE if e == -1 else e
                    add_error(self._errors[OFFSET_DELETE], e)
                    by_topic.setdefault(t, []).append(apis.make(mod.OffsetDeleteResponsePartition,
                                                                partition_index=i32(p), error_code=apis.error_code(e)))
            response = apis.make(mod.OffsetDeleteResponse, error_code=apis.error_code(top),
                                 throttle_time=apis.ZERO_MS, topics=tuple(
                                     apis.make(mod.OffsetDeleteResponseTopic, name=t, partitions=tuple(ps))
                                     for t, ps in by_topic.items()))
            request.connection.complete(request.token, apis.encode(header, response))

        if to_delete:
            await self._write([DeleteOffsets(group_id, tuple(to_delete))], answer)
        else:
            answer(True)
