"""Membership, the controller and partition leadership through the metadata database (a broker's trio tasks).

With ``pipeline.cluster.leadership = "database"`` a broker does not compute who
leads what from a fixed list (``pipeline.cluster.membership.Cluster``); it takes part in a
cluster whose state is in the shared metadata database (issue 24: an existing
database, no home-made consensus), as KRaft brokers do with their controller
(KIP-500, KIP-631):

1. **Membership.** The broker registers (``pipeline.metadata.brokers``: a new
   broker epoch, a lease of ``broker.session.timeout.ms`` on the database's
   clock) and heartbeats every ``broker.heartbeat.interval.ms``. A broker that is
   fenced (its lease ran out: it was too slow, or the database was unreachable
   for a session) stops serving at once and ends its process with status
   ``FENCED_STATUS``: what it accepted but did not commit may never reach the
   table, and only a new incarnation (its supervisor restarts it) is sure of
   that; the new one registers again.
2. **The controller.** Every member tries to claim the controller row
   (``pipeline.metadata.leadership``) every ``CONTROLLER_INTERVAL_S``; one holds it.
   It assigns every partition (and each ``__consumer_offsets`` partition, which
   names a group's coordinator) to ``preferred_leader`` over the live members
   (``pipeline.cluster.membership.reassign``), so a dead member's partitions move to live
   ones and a member that comes back gets its own back. Each move bumps the
   partition's leader epoch; every write is fenced by the controller epoch.
3. **Leaders.** Every broker polls the store's change version every
   ``METADATA_REFRESH_S`` and follows the rows (``pipeline.cluster.membership.DynamicCluster``):
   - a partition it no longer leads stops being served at once
     (NOT_LEADER_OR_FOLLOWER; a group's requests NOT_COORDINATOR); as its *prior*
     leader it then waits until everything it accepted is in the table
     (``BatchingPersister.sync_table``; a group coordinator: its queued offset
     writes) and **hands off**;
   - a partition it now leads is served once the prior leader handed off or is
     no longer a live member (a dead broker has nothing more to write): its log
     continues at the table's end offset (with ``--ack-on spark`` the table holds
     exactly what was acknowledged), as the partition's commits recorded it in the
     database (``LeadershipStore.table_ends``; the table is read only for a
     partition whose last commit is pending: its writer died within it), and its
     idempotent producers' state is taken
     from the database (written before each table commit,
     ``LeadershipStore.record_producers``), so a producer's retry of a batch the
     table holds is answered as a duplicate; a group coordinator loads the
     groups' committed offsets (COORDINATOR_LOAD_IN_PROGRESS meanwhile). It marks the
     rows it took over serving (``LeadershipStore.serve``) as it starts serving them
     (recorded; Metadata names the row's leader meanwhile, see ``DynamicCluster.leader``).

4. **A dead broker's WAL** (``--ack-on wal``): each incarnation registers its WAL
   directory (``wal_path``, on the shared data directory) before it serves
   anything; the controller claims the WAL of each incarnation that is no longer
   a live member, writes what the table lacks of it (``drain_wal``) and marks it
   drained with its idempotent batches. No partition is taken over while a dead
   WAL is undrained: its acknowledged records may belong to it.

The commit is fenced through the tables' lock (``pipeline.metadata.locks``): a
leader's ``before_table_write`` (fenced by its membership) and its table write
are one hold of the lock (``BatchingPersister(table_lock=...)``), and a new
leader reads the table's end under it too, so the previous leader's commit
lands before that read or not at all; ``_lease_watchdog`` stops a member before
the database can expire it. A holder stalled within a commit past its lease is
fenced by the reader: the stalled broker's staging directory is moved away
first (``Server._fence_dead_writers``, ``SparkGroupSink.fence_staging``), so no
file of its commit lands after the read. Not covered: a commit job a dead
broker submitted to the Spark Connect server (rows Spark appends) runs on there.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from pipeline.cluster.membership import OFFSETS_TOPIC, ClusterBroker, DynamicCluster, offsets_partition, reassign
from pipeline.coordinator.service import GroupCoordinatorService
from pipeline.log.batch import PartitionAppend
from pipeline.log.manager import LogManager
from pipeline.metadata.brokers import BrokerRegistry, DuplicateBrokerError, Endpoint, FencedBrokerError
from pipeline.metadata.database import Target
from pipeline.metadata.leadership import (BrokerWal, Leadership, LeadershipStore, NotControllerError, OpenAppend,
                                          ProducerBatch)
from pipeline.persist.persister import BatchingPersister, StorageFailedError, offset_ranges
from pipeline.requests.txn_apis import TransactionApis

log = logging.getLogger(__name__)


def append_ends(appends: Sequence[PartitionAppend]) -> dict[tuple[str, int], int]:
    """(topic, partition) -> the offset after the last record of ``appends`` on it (``offset_ranges``' ends)."""
    return {key: end for key, (_, end) in offset_ranges(appends).items()}


@dataclass(frozen=True, slots=True)
class CommitEnds:
    """The recorded table ends (``LeadershipStore``'s ``table_ends``), for a table write outside the
    persister (a dead broker's WAL drained, ``drain_wal``): ``recorded(keys)`` the ends commits recorded
    (below one, every record of the partition is in the table; at and above, none), ``begin(appends)``
    before the write (pending ends; raises ``FencedBrokerError`` when the writer is no longer a member),
    ``done(appends)`` after it."""

    recorded: Callable[[Collection[tuple[str, int]]], dict[tuple[str, int], int]]
    begin: Callable[[Sequence[PartitionAppend]], None]
    done: Callable[[Sequence[PartitionAppend]], None]


def producer_batches(appends: Sequence[PartitionAppend]) -> list[ProducerBatch]:
    """The idempotent producers' batches among ``appends`` (producer id and base sequence set)."""
    return [ProducerBatch(a.topic, a.partition, a.producer_id, a.producer_epoch, a.base_sequence,
                          (a.base_sequence + a.record_count - 1) % 2**31, a.base_offset)
            for a in appends if a.producer_id >= 0 and a.base_sequence >= 0]


def open_row(a: PartitionAppend) -> OpenAppend:
    """``a`` as the database keeps an open transaction's append (``LeadershipStore.open_transactions``)."""
    return (a.topic, a.partition, a.base_offset, bytes(a.records), a.record_count, a.log_append_time_ms,
            a.producer_id, a.producer_epoch, a.base_sequence, a.uncompressed_bytes)


METADATA_REFRESH_S = 0.25
"""How often a broker looks for leadership changes (one single-row read, ``change_version``)."""
MEMBERS_REFRESH_S = 1.0
"""How often a broker re-reads the live members and the controller whatever the change version says
(leases run out without a write)."""
CONTROLLER_INTERVAL_S = 0.5
"""How often a member claims or renews the controller row and, as controller, reassigns."""
TRIM_INTERVAL_S = 30.0
"""How often the controller trims the producer states kept in the database."""
LEASE_CHECK_INTERVAL_S = 0.1
"""How often a member checks that its lease may still be current (``_lease_watchdog``)."""


def lease_margin_s(session_ms: int) -> float:
    """How long before its lease may run out (as the database counts it) a broker stops acknowledging and
    fences itself (s): a tenth of the session, at least two watchdog checks. It covers the watchdog's
    check interval, a late-scheduled task, and a local monotonic clock slower than the database's by up
    to 10 % over a session (the assumption the fencing rests on; docs/architecture.md)."""
    return max(2 * LEASE_CHECK_INTERVAL_S, session_ms / 10_000.0)
FENCED_STATUS = 3
"""``pipeline serve``'s exit status when its membership was fenced (its supervisor restarts it)."""


class LeadershipService:
    """A broker's part in a cluster led through the database (see the module docstring).

    Args:
        cluster: the broker's view, kept current here (``BrokerInfo.cluster``).
        target: the metadata database (a PostgreSQL URL, or a SQLite file every broker shares).
        endpoints: (listener, host, port) clients reach this broker at (its registration).
        session_ms, heartbeat_ms: ``broker.session.timeout.ms``, ``broker.heartbeat.interval.ms``.
        logs: the partitions' logs (reset when a partition is taken over).
        end_offsets: blocking; the table's (topic, partition) -> end offset over the rows of the
            topics of the partitions given (read only for partitions whose end no commit recorded;
            it fences the commits of theirs in flight by brokers no longer members first).
        staging_name: where this broker stages a commit's files (``SparkGroupSink.staging_name``),
            recorded with the commit's pending ends so that another broker can fence it.
        topics: the existing topics (name -> partitions), for the controller.
        on_fenced: called when this broker's membership is fenced; default: end the process
            (``os._exit(FENCED_STATUS)``).
        incarnation: this process's incarnation id (its registration's; default: a new one).
        data_dir: the shared data directory (``wal_path`` and other brokers' WALs are relative to it).
        wal_path: with ``--ack-on wal``: this incarnation's WAL directory, relative to ``data_dir``,
            registered before the broker serves anything; None (``--ack-on spark``): the table holds
            everything acknowledged, no WAL is drained and none waited for.
        drain_wal: with ``wal_path``: blocking; writes what the table lacks of the WAL in the directory
            given (a dead broker's), keeping the recorded table ends (``CommitEnds``), and returns the
            appends it held after its checkpoint and, among them, those of transactions it holds no
            marker of (kept in the database for the partitions' next leaders, ``_adopt``).
    """

    def __init__(self, cluster: DynamicCluster, target: Target, endpoints: Sequence[Endpoint], *,
                 session_ms: int, heartbeat_ms: int, logs: LogManager,
                 end_offsets: Callable[[Collection[tuple[str, int]]], dict[tuple[str, int], int]],
                 topics: Callable[[], dict[str, int]],
                 staging_name: Callable[[], str | None] | None = None,
                 on_fenced: Callable[[], None] | None = None, incarnation: uuid.UUID | None = None,
                 data_dir: Path | None = None, wal_path: str | None = None,
                 drain_wal: Callable[[Path, CommitEnds], tuple[Sequence[PartitionAppend],
                                                               Sequence[PartitionAppend]]] | None = None) -> None:
        if wal_path is not None and (data_dir is None or drain_wal is None):
            raise ValueError("wal_path needs data_dir and drain_wal")
        self.cluster = cluster
        self.data_dir = data_dir
        self.wal_path = wal_path
        self.drain_wal = drain_wal
        self.target = target
        self.endpoints = tuple(endpoints)
        self.session_ms = session_ms
        self.heartbeat_ms = heartbeat_ms
        self.logs = logs
        self.end_offsets = end_offsets
        self.staging_name = staging_name
        self.topics = topics
        self.on_fenced = on_fenced or (lambda: os._exit(FENCED_STATUS))
        self.persister: BatchingPersister | None = None
        self.coordinator: GroupCoordinatorService | None = None
        self.transactions: TransactionApis | None = None
        self.store: LeadershipStore | None = None
        self.leases: BrokerRegistry | None = None
        """This broker's registration and heartbeats, on a database connection of their own: a lease
        renewal never queues behind the store's other work (``LeadershipStore`` serializes its calls on
        one connection), nor waits for a thread (its own limiter)."""
        self._lease_limiter = trio.CapacityLimiter(1)
        self.incarnation = incarnation or uuid.uuid4()
        self.epoch: int | None = None
        """This broker's epoch (None: not registered yet)."""
        self.controller_epoch: int | None = None
        """The controller epoch this broker holds (None: it is not the controller)."""
        self._live: set[int] = set()
        self._lease_from: float | None = None
        self._draining = False
        """A ``_drain_task`` runs (one at a time)."""
        """Local time (trio clock, s) the last successful registration or heartbeat was sent."""
        self._undrained: list[BrokerWal] = []
        """Dead brokers' WALs not drained yet (``--ack-on wal``): no partition is taken over meanwhile."""
        self._handing_off: set[tuple[str, int, int]] = set()
        self._loaded_epochs: dict[tuple[str, int], int] = {}  # the leader epoch each loaded partition was taken at
        self.ends_read_from_table = 0
        """Partitions taken over whose end offset was read from the table (no commit recorded it)."""
        self._changed = trio.Event()
        self._leaving = False
        """``unregister`` ended the lease: a heartbeat refused from then on is the clean stop's, not a fence."""
        self._stopping = False
        """``stop_taking_over`` was called: partitions assigned to this broker are left for the others."""
        self._left: set[tuple[str, int]] = set()
        """The partitions left so, as logged."""

    # -- wiring ----------------------------------------------------------------

    def before_table_write(self, appends: Sequence[PartitionAppend]) -> None:
        """``BatchingPersister(before_table_write=...)``: write the commit's idempotent batches and its
        partitions' pending table ends to the database, fenced by this broker's membership (blocking).

        Raises:
            FencedBrokerError: not a member (any more): the commit must not happen.
        """
        store, epoch = self.store, self.epoch
        if store is None or epoch is None:
            raise FencedBrokerError(f"broker {self.cluster.node_id} is not registered")
        store.record_producers(self.cluster.node_id, epoch, producer_batches(appends), append_ends(appends),
                               self.staging_name() if self.staging_name is not None else None)

    def after_table_write(self, appends: Sequence[PartitionAppend]) -> None:
        """``BatchingPersister(after_table_write=...)``: the commit is in the table, its partitions' ends
        are recorded (``LeadershipStore.commit_done``; blocking). A failure is logged: the ends stay
        pending and a take-over reads those partitions' ends from the table."""
        store = self.store
        if store is None or not appends:
            return
        try:
            store.commit_done(append_ends(appends))
        except Exception as exc:  # noqa: BLE001 - the commit stands; only the take-over's shortcut is lost
            log.warning("recording the table's end offsets after a commit failed: %s", exc)

    async def run(self, persister: BatchingPersister | None = None, coordinator: GroupCoordinatorService | None = None,
                  transactions: TransactionApis | None = None,
                  *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open the store, then membership, the controller and the leadership watch until cancelled.

        ``persister``: the broker's (its commits are fenced by ``before_table_write``; a partition taken
        over is loaded only after what it holds is written); ``coordinator``: the group coordinator,
        whose groups load and unload as ``__consumer_offsets`` partitions move here and away;
        ``transactions``: the transaction coordinator, whose transactional ids move with those partitions
        too. They are built after this service (the persister's ``before_table_write`` is this
        service's), so they come here; None in tests of membership alone."""
        self.persister, self.coordinator, self.transactions = persister, coordinator, transactions
        self.store = await trio.to_thread.run_sync(LeadershipStore, self.target)
        try:
            self.leases = await trio.to_thread.run_sync(BrokerRegistry, self.target)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._membership)
                nursery.start_soon(self._lease_watchdog)
                nursery.start_soon(self._controller, nursery)
                nursery.start_soon(self._watch, nursery)
                task_status.started()
        finally:
            store, self.store = self.store, None
            leases, self.leases = self.leases, None
            await trio.to_thread.run_sync(store.close)
            if leases is not None:
                await trio.to_thread.run_sync(leases.close)

    def record_new_partitions(self, topic: str, partitions: range) -> None:
        """New partitions of ``topic`` (created, or added, through the shared topic store just now): their
        table end is 0 (``LeadershipStore.record_new_partitions``), so taking them over reads nothing from
        the table. Blocking. Best effort: without the store (not started, or stopping) or on a database
        error, their first leader reads their end from the table, as for any partition without one."""
        store = self.store
        if store is None:
            return
        try:
            store.record_new_partitions(topic, partitions)
        except Exception as exc:
            log.warning("recording the new partitions %s-%d..%d as empty in the table failed (their leaders "
                        "read the table instead): %s", topic, partitions.start, partitions.stop - 1, exc)

    async def forget_topic(self, topic: str) -> None:
        """A deleted topic's idempotent producer states in the database (``LeadershipStore.forget_topic``):
        a producer writing to the re-created topic is not checked against the old one's sequences."""
        if self.store is not None:
            await trio.to_thread.run_sync(self.store.forget_topic, topic)

    def stop_taking_over(self) -> None:
        """A clean stop has begun (call it before the persister and the group coordinator close): no
        partition is taken over from now on, since this broker's stores are closing and it would not
        serve them; those assigned to it meanwhile move to the others once ``unregister`` ends its
        lease. Its own partitions are still handed off."""
        self._stopping = True

    async def unregister(self) -> None:
        """A controlled shutdown: end this broker's lease now, so its partitions move at once."""
        if self.leases is not None and self.epoch is not None:
            self.cluster.member = False
            self._leaving = True  # the heartbeat then refused (or one in flight) does not end the process
            await trio.to_thread.run_sync(self.leases.unregister, self.cluster.node_id, self.epoch,
                                          limiter=self._lease_limiter)

    # -- membership --------------------------------------------------------------

    async def _membership(self) -> None:
        store, leases = self.store, self.leases
        assert store is not None and leases is not None
        node = self.cluster.node_id
        while True:
            try:
                sent = trio.current_time()
                self.epoch = await trio.to_thread.run_sync(leases.register, node, self.incarnation,
                                                           self.endpoints, self.session_ms,
                                                           limiter=self._lease_limiter)
                self._renewed(sent)
                break
            except DuplicateBrokerError:  # our previous incarnation's lease has not run out yet
                log.info("broker %d: waiting for the previous registration's lease to run out", node)
            except Exception as exc:
                log.warning("broker %d: registering failed: %s", node, exc)
            await trio.sleep(self.heartbeat_ms / 1000.0)
        if self.wal_path is not None:
            while True:  # before anything is served: a WAL that may hold acknowledged records is known
                try:
                    await trio.to_thread.run_sync(store.register_wal, node, self.epoch, str(self.incarnation),
                                                  self.wal_path)
                    break
                except FencedBrokerError:
                    self._fenced("its lease ran out while registering its WAL")
                    return
                except Exception as exc:
                    log.warning("broker %d: registering its WAL failed: %s", node, exc)
                await trio.sleep(self.heartbeat_ms / 1000.0)
            await trio.to_thread.run_sync(self._delete_drained_wals, store)
        self.cluster.member = True
        log.info("broker %d registered at epoch %d (session %d ms)", node, self.epoch, self.session_ms)
        self._changed.set()
        while True:
            await trio.sleep(self.heartbeat_ms / 1000.0)
            try:
                sent = trio.current_time()
                await trio.to_thread.run_sync(leases.heartbeat, node, self.epoch, self.session_ms,
                                              limiter=self._lease_limiter)
                self._renewed(sent)
            except FencedBrokerError:
                if not self._leaving:
                    self._fenced("its lease ran out")
                return
            except Exception as exc:  # the watchdog fences the broker if this lasts a session
                log.warning("broker %d: heartbeat failed: %s", node, exc)

    def _renewed(self, sent: float) -> None:
        """A registration or heartbeat sent at local time ``sent`` (trio's monotonic clock, s) committed:
        the lease lasts until at least ``sent + session_ms`` (the database read its clock later), so this
        broker may acknowledge until ``cluster.lease_until``, that less ``lease_margin_s``."""
        self._lease_from = max(self._lease_from or sent, sent)
        self.cluster.lease_until = self._lease_from + self.session_ms / 1000.0 - lease_margin_s(self.session_ms)

    async def _lease_watchdog(self) -> None:
        """Stop serving before another broker may take this one's partitions over: a lease renewed by
        a request sent at local time t lasts until at least t + ``session_ms``, so once that passed with
        no renewal since, the controller may move them, and (``--ack-on wal``) drain this broker's WAL;
        nothing accepted after that may be acknowledged. So from ``cluster.lease_until`` (a margin
        earlier) no produce is answered with success (``pipeline.requests.handler.PendingProduce``),
        and the broker fences itself at the watchdog's next check. A heartbeat that hangs (the
        database unreachable) is covered too; so is a process paused (SIGSTOP, a frozen VM) past its
        lease: on waking, whichever task runs first finds the lease over."""
        while True:
            await trio.sleep(LEASE_CHECK_INTERVAL_S)
            if self._lease_from is not None and not self._leaving and self.cluster.member \
                    and trio.current_time() >= self.cluster.lease_until:
                self._fenced("no heartbeat reached the database for a session")
                return

    def _delete_drained_wals(self, store: LeadershipStore) -> None:
        """This node's earlier incarnations' WAL directories whose records are all in the table (blocking)."""
        assert self.data_dir is not None
        try:
            for wal in store.drained_wals(self.cluster.node_id):
                if wal.incarnation_id != str(self.incarnation):
                    shutil.rmtree(self.data_dir / wal.path, ignore_errors=True)
                    store.forget_wal(wal.incarnation_id)
        except Exception as exc:  # left for the next incarnation
            log.warning("broker %d: deleting its drained WALs failed: %s", self.cluster.node_id, exc)

    def _fenced(self, why: str) -> None:
        log.error("broker %d at epoch %s is fenced (%s): it stops serving and ends (status %d)",
                  self.cluster.node_id, self.epoch, why, FENCED_STATUS)
        self.cluster.member = False
        self.cluster.loaded.clear()
        self.on_fenced()

    # -- the controller ------------------------------------------------------------

    async def _controller(self, nursery: trio.Nursery) -> None:
        store = self.store
        assert store is not None
        node = self.cluster.node_id
        next_trim = trio.current_time() + TRIM_INTERVAL_S
        while True:
            await trio.sleep(CONTROLLER_INTERVAL_S)
            if not self.cluster.member or self.epoch is None:
                continue
            try:
                held = await trio.to_thread.run_sync(store.claim_controller, node, self.epoch, self.session_ms)
                if held != self.controller_epoch:
                    if held is not None:
                        log.info("broker %d is the controller (controller epoch %d)", node, held)
                    self.controller_epoch = held
                if held is None:
                    continue
                await self._reassign(store, held)
                if self.drain_wal is not None and not self._draining:
                    # In a task of its own: a long drain does not hold up moving other partitions.
                    self._draining = True
                    nursery.start_soon(self._drain_task, store)
                if trio.current_time() >= next_trim:
                    next_trim = trio.current_time() + TRIM_INTERVAL_S
                    await trio.to_thread.run_sync(store.trim_producers)
            except FencedBrokerError:
                continue  # the membership task ends the broker
            except NotControllerError:
                self.controller_epoch = None
            except Exception as exc:
                log.warning("controller: %s", exc)

    async def _reassign(self, store: LeadershipStore, controller_epoch: int) -> None:
        assert self.epoch is not None

        def read() -> tuple[set[int], tuple[int, ...], dict[tuple[str, int], Leadership]]:
            return {m.node_id for m in store.registry.live_members()}, store.members(), store.assignment()

        live, members, current = await trio.to_thread.run_sync(read)
        moves, gone = reassign(self.topics(), tuple(live), current, members)
        if not moves and not gone:
            return
        # A prior leader that is not a live member has nothing more to write: no hand-off to wait for.
        changes = {key: (leader, key not in current or current[key].leader_id not in live)
                   for key, leader in moves.items()}
        await trio.to_thread.run_sync(store.write_assignment, self.cluster.node_id, self.epoch, controller_epoch,
                                      changes, gone)
        moved = sum(1 for key in moves if key in current)
        if moved or gone:
            log.info("controller: %d partition(s) moved, %d assigned, %d removed over live brokers %s", moved,
                     len(moves) - moved, len(gone), sorted(live))

    async def _drain_task(self, store: LeadershipStore) -> None:
        try:
            await self._drain_dead_wals(store)
        except FencedBrokerError:
            pass  # the membership task ends the broker
        except Exception as exc:  # the controller's next pass tries again (the claim is kept)
            log.warning("controller: draining a dead broker's WAL failed: %s", exc)
        finally:
            self._draining = False

    async def _drain_dead_wals(self, store: LeadershipStore) -> None:
        """As the controller: claim each dead broker's WAL not drained yet, write what the table lacks of
        it, and mark it drained with its idempotent batches (``LeadershipStore.wal_drained``)."""
        assert self.drain_wal is not None and self.data_dir is not None and self.epoch is not None
        node, epoch = self.cluster.node_id, self.epoch
        for wal in await trio.to_thread.run_sync(store.dead_wals):
            if not await trio.to_thread.run_sync(store.claim_wal, wal.incarnation_id, node, epoch):
                continue
            started = trio.current_time()
            ends = CommitEnds(store.table_ends, self.before_table_write, self.after_table_write)
            appends, open_appends = await trio.to_thread.run_sync(self.drain_wal, self.data_dir / wal.path, ends)
            if await trio.to_thread.run_sync(store.wal_drained, wal.incarnation_id, node, epoch,
                                             producer_batches(appends), [open_row(a) for a in open_appends]):
                log.info("controller: drained broker %d's WAL (epoch %d, %s): %d records after its checkpoint "
                         "are in the table (%.1f s)%s", wal.node_id, wal.broker_epoch, wal.path,
                         sum(a.record_count for a in appends) - sum(a.record_count for a in open_appends),
                         trio.current_time() - started,
                         f"; {len(open_appends)} append(s) of open transactions are kept for their partitions' "
                         "next leaders" if open_appends else "")
                self._changed.set()

    # -- following the assignment ---------------------------------------------------

    async def _watch(self, nursery: trio.Nursery) -> None:
        store = self.store
        assert store is not None
        seen = -1
        next_members = 0.0
        while True:
            with trio.move_on_after(METADATA_REFRESH_S):
                await self._changed.wait()
            self._changed = trio.Event()
            try:
                version = await trio.to_thread.run_sync(store.change_version)
                if version == seen and trio.current_time() < next_members:
                    continue
                next_members = trio.current_time() + MEMBERS_REFRESH_S

                def read() -> tuple[list[Any], tuple[int, int] | None, dict[tuple[str, int], Leadership],
                                    list[BrokerWal]]:
                    # The dead WALs after the assignment: a move away from a dead broker is written only
                    # once its lease ran out, so a WAL it left undrained is in this read.
                    members, controller, rows = store.registry.live_members(), store.controller(), store.assignment()
                    return members, controller, rows, store.dead_wals() if self.wal_path is not None else []

                members, controller, rows, self._undrained = await trio.to_thread.run_sync(read)
                seen = version
            except Exception as exc:
                log.warning("reading the cluster's leadership failed: %s", exc)
                continue
            self._follow(members, controller, rows, nursery)
            await self._load(rows)

    def _follow(self, members: list[Any], controller: tuple[int, int] | None,
                rows: dict[tuple[str, int], Leadership], nursery: trio.Nursery) -> None:
        cluster, me = self.cluster, self.cluster.node_id
        cluster.members = tuple(ClusterBroker(m.node_id, m.endpoints[0][1], m.endpoints[0][2])
                                for m in members if m.endpoints)
        self._live = {m.node_id for m in members}
        cluster.controller = controller[0] if controller is not None else -1
        cluster.leaders = rows
        # A partition that moved away and back between two reads was led by another broker meanwhile.
        lost = {key for key in cluster.loaded if key not in rows or rows[key].leader_id != me
                or rows[key].leader_epoch != self._loaded_epochs.get(key)}
        if lost:
            cluster.loaded -= lost
            self._unload_groups({key for key in lost if key[0] == OFFSETS_TOPIC})
            log.info("broker %d: %d partition(s) moved to other brokers", me, len(lost))
        for key, row in rows.items():
            handoff = (key[0], key[1], row.leader_epoch)
            if row.prior_id == me and not row.handed_off and handoff not in self._handing_off:
                self._handing_off.add(handoff)
                nursery.start_soon(self._hand_off, key, row)

    async def _hand_off(self, key: tuple[str, int], row: Leadership) -> None:
        """As the prior leader of ``key``: once everything accepted for it is in the table (or, for a
        ``__consumer_offsets`` partition, every queued offset write is durable), let the new leader serve;
        the records of its open transactions, and its log end offset, go to the database with the
        hand-off for the new leader (``_adopt``)."""
        topic, partition = key
        try:
            open_appends: list[PartitionAppend] = []
            end: int | None = None
            if topic == OFFSETS_TOPIC:
                if self.coordinator is not None:
                    await self.coordinator.sync_writes()
            elif self.persister is not None:
                await self.persister.sync_table()
                open_appends = await trio.to_thread.run_sync(self.persister.open_appends, topic, partition)
                end = self.logs.log_end_offset(topic, partition)
            assert self.store is not None
            if await trio.to_thread.run_sync(self.store.hand_off, topic, partition, self.cluster.node_id,
                                             row.leader_epoch, [open_row(a) for a in open_appends],
                                             producer_batches(open_appends), end) and open_appends:
                # The new leader adopts them (``_adopt``): they are not this broker's to write any more.
                assert self.persister is not None
                self.persister.hand_over_open(topic, partition)
                log.info("broker %d: %s-%d handed off with %d append(s) of open transactions", self.cluster.node_id,
                         topic, partition, len(open_appends))
            log.debug("broker %d: %s-%d handed off to broker %d (leader epoch %d)", self.cluster.node_id, topic,
                     partition, row.leader_id, row.leader_epoch)
        except Exception as exc:
            log.warning("handing off %s-%d failed (retried): %s", topic, partition, exc)
            self._handing_off.discard((topic, partition, row.leader_epoch))

    async def _mark_serving(self, partitions: dict[tuple[str, int], int]) -> None:
        """Mark ``partitions`` ((topic, partition) -> leader epoch) served by this broker in the store
        (``LeadershipStore.serve``: Metadata names no leader for a moved partition until then). A failure
        is logged; the next pass marks them again."""
        if not partitions:
            return
        assert self.store is not None
        try:
            await trio.to_thread.run_sync(self.store.serve, self.cluster.node_id, partitions)
        except Exception as exc:
            log.warning("marking %d partition(s) served failed (retried): %s", len(partitions), exc)

    async def _load(self, rows: dict[tuple[str, int], Leadership]) -> None:
        """Take over the partitions this broker leads and may serve now (see the module docstring)."""
        cluster, me = self.cluster, self.cluster.node_id
        if not cluster.member:
            return
        await self._mark_serving({key: row.leader_epoch for key, row in rows.items() if key in cluster.loaded
                                  and row.leader_id == me and not row.serving})  # a failed mark, again
        ready = {key: row for key, row in rows.items() if row.leader_id == me and key not in cluster.loaded
                 and (row.handed_off or row.prior_id not in self._live or row.prior_id < 0)}
        if not ready:
            return
        if self._stopping:
            if ready.keys() - self._left:
                log.info("broker %d is stopping: %d partition(s) assigned to it are left for the other brokers",
                         me, len(ready))
                self._left |= ready.keys()
            return
        if self._undrained:
            # A dead broker's WAL may hold acknowledged records of these partitions that the table lacks.
            ready = {key: row for key, row in ready.items() if key[0] == OFFSETS_TOPIC}
            if not ready:
                return
        # The groups first, on their own: a coordinator's load reads the offset store only, and its groups'
        # members are answered COORDINATOR_LOAD_IN_PROGRESS until it is done (kafkajs restarts a member on
        # each), so it does not wait for the table's end offsets (Kafka's coordinator loads its
        # __consumer_offsets partitions apart from any other partition, GroupCoordinator.onElection).
        groups = {key: row for key, row in ready.items() if key[0] == OFFSETS_TOPIC}
        partitions = {key: row for key, row in ready.items() if key[0] != OFFSETS_TOPIC}
        if groups:
            await self._take(groups, self._load_groups)
        if partitions:
            read_before, started = self.ends_read_from_table, trio.current_time()
            taken = await self._take(partitions, self._load_partitions)
            if taken:
                log.info("broker %d leads %d more partition(s) now, continuing at the table's end offsets "
                         "(%d read from the table, the others as their commits recorded them; %.2f s)", me,
                         len(taken), self.ends_read_from_table - read_before, trio.current_time() - started)

    def _unload_groups(self, keys: set[tuple[str, int]]) -> None:
        """Forget the groups and transactional ids of these ``__consumer_offsets`` partitions (moved
        away, or loaded but moved on before they were served)."""
        numbers = {p for _, p in keys}
        if numbers and self.coordinator is not None:
            self.coordinator.unload_groups(lambda g: offsets_partition(g) in numbers)
        if numbers and self.transactions is not None:
            self.transactions.unload_partitions(numbers)

    async def _load_groups(self, keys: set[tuple[str, int]]) -> None:
        """Load the groups of these ``__consumer_offsets`` partitions into the coordinator (if any), and
        their transactional ids into the transaction coordinator (if any)."""
        numbers = {p for _, p in keys}
        if self.coordinator is not None:
            await self.coordinator.load_groups(lambda g: offsets_partition(g) in numbers)
        if self.transactions is not None:
            await self.transactions.load_partitions({p: int(self.cluster.leaders[(t, p)].leader_epoch) for t, p in keys})

    async def _load_partitions(self, keys: set[tuple[str, int]]) -> None:
        """Continue these partitions' logs at the table's end offsets, with their producers' states.

        Each end is the one its commits recorded (``LeadershipStore.table_ends``); the table is read
        (``end_offsets``) only for the partitions without one: no commit recorded yet, or the last one
        pending (its writer died within it)."""
        store = self.store
        assert store is not None
        ends = await trio.to_thread.run_sync(store.table_ends, keys)
        unknown = keys - ends.keys()
        if unknown:  # the read refreshes what it reads
            read = await trio.to_thread.run_sync(self.end_offsets, unknown)
            settled = await trio.to_thread.run_sync(store.settle_table_ends, {key: read.get(key, 0) for key in unknown})
            for (topic, partition), end in sorted(settled.items()):
                if end > read.get((topic, partition), 0):  # the table lacks rows its commits recorded
                    log.warning("broker %d: %s-%d continues at its recorded table end %d, above the table's rows "
                                "(%d): retention dropped those between, or a commit recorded done did not land",
                                self.cluster.node_id, topic, partition, end, read.get((topic, partition), 0))
            ends |= settled
        self.ends_read_from_table += len(unknown)
        batches = await trio.to_thread.run_sync(store.producers, ends)
        by_partition: dict[tuple[str, int], list[tuple[int, int, int, int, int]]] = {}
        for b in batches:
            by_partition.setdefault((b.topic, b.partition), []).append(
                (b.producer_id, b.producer_epoch, b.first_seq, b.last_seq, b.base_offset))
        for key in keys:
            self.logs.reset_partition(key[0], key[1], ends[key], by_partition.get(key, ()))
            if self.logs.table is not None and ends[key] > 0:
                # Other brokers' commits are in the table: what the reader cached of the partition, and the
                # Spark session's relations of its tables, are stale. The relations are refreshed at the
                # next read from the table (a catalog call per table, seconds on a busy Connect server:
                # not before the partition is served). A new topic's partition (end 0) has nothing to read.
                self.logs.table.invalidate(key[0], key[1])
        await self._adopt(store, keys)

    async def _adopt(self, store: LeadershipStore, keys: set[tuple[str, int]]) -> None:
        """Before serving ``keys``: the records of open transactions kept for them in the database (a dead
        broker's WAL drained, or the prior leader's hand-off: ``LeadershipStore.open_transactions``) go
        into this broker's WAL at their offsets, as a replica's log holds them in Kafka: held out of the
        table until their marker reaches this leader (the persister's transactions), indexed so that
        they are read from the WAL and pin the last stable offset. Their rows go once the WAL has them,
        the delete retried until it is done: a row left behind would be adopted again by a later leader
        after its transaction ended, and pin that leader's last stable offset.

        Raises:
            StorageFailedError: the WAL failed (nothing is served from here on).
            FencedBrokerError: this broker is no longer a member.
        """
        rows = await trio.to_thread.run_sync(store.open_transactions, keys)
        if not rows:
            return
        assert self.persister is not None and self.epoch is not None
        appends = [PartitionAppend(*row) for row in rows]
        commit = self.persister.append(appends, at_wal=True)
        done = trio.Event()
        commit.add_callback(lambda c: done.set())
        await done.wait()
        if commit.error is not None:
            raise StorageFailedError(f"adopting open transactions' records failed: {commit.error}")
        while True:
            try:
                await trio.to_thread.run_sync(store.adopted, self.cluster.node_id, self.epoch, rows)
                break
            except FencedBrokerError:
                raise
            except Exception as exc:  # the database unreachable: no partition is served meanwhile
                log.warning("broker %d: deleting %d adopted open transaction append(s) failed (retried): %s",
                            self.cluster.node_id, len(rows), exc)
                await trio.sleep(self.heartbeat_ms / 1000.0)
        log.info("broker %d adopted %d append(s) of %d open transaction(s) on %d partition(s) from the prior "
                 "leaders", self.cluster.node_id, len(appends), len({a.producer_id for a in appends}),
                 len({(a.topic, a.partition) for a in appends}))

    async def _take(self, ready: dict[tuple[str, int], Leadership],
                    load: Callable[[set[tuple[str, int]]], Awaitable[None]]) -> set[tuple[str, int]]:
        """``load`` the ``ready`` partitions, then serve those still ours at the epoch loaded (the rows may
        have moved meanwhile): marked serving in the store, then in ``cluster.loaded``. The partitions
        taken; none if loading failed (logged; the next pass tries again)."""
        cluster = self.cluster
        try:
            await load(set(ready))
        except Exception as exc:
            log.warning("taking over %d partition(s) failed (retried): %s", len(ready), exc)
            return set()
        current = cluster.leaders
        taken = {key for key, row in ready.items()
                 if current.get(key) is not None and current[key].leader_epoch == row.leader_epoch}
        self._unload_groups({key for key in ready.keys() - taken if key[0] == OFFSETS_TOPIC})
        # Named leader in every broker's Metadata from now on; this broker serves them right after.
        await self._mark_serving({key: ready[key].leader_epoch for key in taken})
        cluster.loaded |= taken
        self._loaded_epochs.update((key, ready[key].leader_epoch) for key in taken)
        self.logs.wake(taken)  # fetches that waited for the take-over
        return taken
