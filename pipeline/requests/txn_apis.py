"""The transaction coordinator's apis: InitProducerId with a transactional id, AddPartitionsToTxn,
AddOffsetsToTxn, TxnOffsetCommit, EndTxn, DescribeTransactions, ListTransactions (KIP-98, KIP-360,
KIP-447, KIP-664); and the partition leader's DescribeProducers and WriteTxnMarkers, which the admin
tools use to find and abort a hanging transaction (KIP-664: ``kafka-transactions.sh``, kafka-python's
``find_hanging_transactions`` / ``abort_transaction``).

The rules are ``pipeline.coordinator.transactions``'; this module stores each change
(``TransactionStore``, fsynced) before it answers, writes the markers through the
produce path (offsets assigned like any append, ``BatchingPersister.append``, the
high watermark and last stable offset moved by the read side), hands a committed
transaction's offsets to the group coordinator, aborts transactions older than
their timeout, and at start finishes the markers of a transaction a crash left
in PrepareCommit/PrepareAbort. A transaction's end that fails (a marker, the
offsets, the stored state) is retried with a backoff until it succeeds. One transaction's end runs at a time per
transactional id, in its own task, so the RequestHandler goes on meanwhile.

EndTxn is answered once the markers are durable where produce is acknowledged
(the WAL, or the table with ``--ack-on spark``): the transaction's records are
then readable by read-committed consumers, and with ``--ack-on spark`` in the table.

In a cluster (``pipeline serve --brokers N``) every broker runs these apis over one shared store.
A transactional id is coordinated by ``Cluster.coordinator(transactional_id)`` (Kafka: the leader of
its ``__transaction_state`` partition), which FindCoordinator names; the others answer
NOT_COORDINATOR. The coordinator writes the markers of the partitions it leads itself and queues
the rest in the store (``TransactionStore.queue_markers``) for their leaders, as Kafka's coordinator
sends WriteTxnMarkers to them; each broker's ``_carry_out_markers`` appends those of the partitions
it leads and commits or drops the pending offsets of the groups it coordinates, and the
transaction completes once none is queued. A partition leader that does not coordinate a
transactional id verifies its first transactional produce against the stored state (KIP-890 part 1's
AddPartitionsToTxn verification) and keeps a verification guard until that producer's marker; the
TxnOffsetCommit a group's coordinator gets is stored only while the stored transaction is ongoing
(``TransactionStore.add_pending_if_ongoing``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol, TypeVar

import trio
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i64

from pipeline.coordinator import transactions as tx
from pipeline.coordinator.transactions import TransactionCoordinator, TransactionMetadata, TxnState
from pipeline.coordinator.service import GroupCoordinatorService
from pipeline.cluster.membership import OFFSETS_TOPIC, DynamicCluster, offsets_partition
from pipeline.coordinator.txn_store import (STORE_FILE, Fence, NotCoordinatorError, PendingOffsets, QueuedMarker,
                                             TransactionStore)
from pipeline.log.batch import PartitionAppend
from pipeline.log.control import ABORT, COMMIT, build_marker
from pipeline.log.manager import LogManager
from pipeline.network.api_host import ApiHost
from pipeline.network.request_channel import Request
from pipeline.network.request_metrics import add_error
from pipeline.persist.persister import BatchingPersister, Commit, StorageFailedError
from pipeline.metadata.database import Target, is_postgres_url, store_target
from pipeline.protocol import apis
from pipeline.security.acl import CLUSTER_NAME, AclOperation, ResourceType

log = logging.getLogger(__name__)
_T = TypeVar("_T")

INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 22, 24, 25, 26, 28
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66
DESCRIBE_PRODUCERS, WRITE_TXN_MARKERS = 61, 27
TXN_APIS = (ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT, DESCRIBE_TRANSACTIONS,
            LIST_TRANSACTIONS, DESCRIBE_PRODUCERS, WRITE_TXN_MARKERS)
"""What this module serves besides InitProducerId (which KafkaApis hands it for a transactional id)."""
# KIP-588: the first version of each api that may answer PRODUCER_FENCED (older ones: INVALID_PRODUCER_EPOCH).
_FENCED_FROM = {INIT_PRODUCER_ID: 4, ADD_PARTITIONS_TO_TXN: 2, ADD_OFFSETS_TO_TXN: 2, END_TXN: 2, TXN_OFFSET_COMMIT: 3}
ABORT_CHECK_INTERVAL_S = 1.0
"""How often transactions older than their timeout are looked for (s; Kafka
``transaction.abort.timed.out.transaction.cleanup.interval.ms``, 10 s there)."""
RETRY_BACKOFF_MS = 100
"""First wait before completing a transaction again after a failure (ms): Kafka's ``retry.backoff.ms``
default, which its TransactionMarkerChannelManager retries marker writes with."""
RETRY_BACKOFF_MAX_MS = 1000
"""The wait doubles up to this (ms): Kafka's ``retry.backoff.max.ms`` default (KIP-580)."""
MARKER_POLL_S = 0.05
"""In a cluster, how often an idle broker looks for markers queued for it (s)."""
MARKER_POLL_BUSY_S = 0.005
"""How often it looks while it expects some (a transaction another broker coordinates is open on a
partition it leads, or has offsets pending at a group it coordinates, or the last look found some),
and how often a coordinator waiting for its queued markers looks whether they are written (s): the
inter-broker WriteTxnMarkers' latency here. A look is one read of two small tables."""
MARKER_WAIT_LOG_S = 10.0
"""A coordinator that waits this long (s) for a queued marker logs which are still queued (then again)."""
NOT_COORDINATOR, NOT_LEADER = ErrorCode.not_coordinator.value, ErrorCode.not_leader_or_follower.value
TOPIC, GROUP, TRANSACTIONAL_ID = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
WRITE, DESCRIBE, READ = AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.READ


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class TransactionHost(ApiHost, Protocol):
    """What the transaction coordinator needs of the broker's ``KafkaApis`` (``pipeline.requests.handler``)
    beyond ``ApiHost``: the logs' producer state, the persister that writes the markers, producer ids,
    and to be told it serves transactions."""

    @property
    def logs(self) -> LogManager:
        """Every partition's log (producer state: which transactions are open)."""

    @property
    def persister(self) -> BatchingPersister:
        """Where control markers (COMMIT/ABORT) are appended."""

    def next_producer_id(self) -> int:
        """A producer id no one has (InitProducerId)."""

    def serve_transactions(self, coordinator: TransactionApis) -> None:
        """Transactions are served by ``coordinator``."""


class TransactionApis:
    """See the module docstring.

    Args:
        kafka_apis: the server's KafkaApis (catalog, logs, persister, authorizer, producer ids).
        groups: the GroupCoordinatorService (committed transactions' offsets go there).
        store_path: the SQLite file (``DATA_DIR/_pipeline/transactions.db``) or a PostgreSQL URL.
        max_timeout_ms: ``transaction.max.timeout.ms``.
    """

    def __init__(self, kafka_apis: TransactionHost, groups: GroupCoordinatorService, store_path: Target,
                 max_timeout_ms: int = tx.DEFAULT_MAX_TIMEOUT_MS) -> None:
        self.apis = kafka_apis
        self.groups = groups
        self.store_path = store_path if is_postgres_url(store_path) else Path(store_path)
        self.state = TransactionCoordinator(max_timeout_ms)
        self.pending: dict[str, PendingOffsets] = {}
        self._store: TransactionStore | None = None
        self._store_lock = trio.Lock()
        self._locks: dict[str, trio.Lock] = {}
        self._nursery: trio.Nursery | None = None
        self._errors = {key: kafka_apis.request_metrics.errors(key) for key in (INIT_PRODUCER_ID, *TXN_APIS)}
        self._verified: dict[tuple[str, int, int], int] = {}
        """KIP-890 verification guards of this partition leader for transactions another broker
        coordinates: (topic, partition, producer id) -> the epoch verified ongoing in the store;
        removed by that producer's next marker on the partition."""
        self._verifying: dict[tuple[str, int, int], object] = {}
        """Verifications under way (the same keys): a marker meanwhile removes the entry, and the
        verification then fails (Kafka's VerificationGuard)."""
        self._expect = trio.Event()
        """Set when this broker starts expecting queued markers (``_expecting_markers``): wakes the
        idle ``_carry_out_markers``."""
        self.closing = False
        self._owned: dict[int, int] | None = {} if isinstance(kafka_apis.broker.cluster, DynamicCluster) else None
        """With leadership through the database: the ``__consumer_offsets`` partitions whose transactional
        ids (and groups' pending offsets) are loaded here (``load_partitions``), each with the leader epoch
        it was loaded at; None: all are, at start."""
        self._started = trio.Event()

    @classmethod
    def for_data_dir(cls, kafka_apis: TransactionHost, groups: GroupCoordinatorService, data_dir: Path,
                     max_timeout_ms: int,
                     metadata_url: str | None = None) -> "TransactionApis":
        """The apis of a server: state in ``DATA_DIR/_pipeline/transactions.db``, or in the PostgreSQL
        database of ``metadata_url``."""
        return cls(kafka_apis, groups, store_target(metadata_url, data_dir, STORE_FILE), max_timeout_ms)

    def register(self) -> None:
        """Serve the transaction apis on the KafkaApis, and tell the group coordinator about them."""
        for key, handler in ((ADD_PARTITIONS_TO_TXN, self._add_partitions), (ADD_OFFSETS_TO_TXN, self._add_offsets),
                             (END_TXN, self._end_txn), (TXN_OFFSET_COMMIT, self._txn_offset_commit),
                             (DESCRIBE_TRANSACTIONS, self._describe), (LIST_TRANSACTIONS, self._list),
                             (DESCRIBE_PRODUCERS, self._describe_producers),
                             (WRITE_TXN_MARKERS, self._write_txn_markers)):
            self.apis.register(key, handler)
        self.apis.serve_transactions(self)
        self.groups.serve_transactions(self._pending_partitions)

    def _pending_partitions(self, group_id: str) -> set[tuple[str, int]]:
        return {key for offsets in self.pending.values() for key in offsets.get(group_id, {})}

    @property
    def clustered(self) -> bool:
        """Whether other brokers share the store (a cluster of more than one, or leadership through the
        database, whose members come and go)."""
        cluster = self.apis.broker.cluster
        return self._owned is not None or (cluster is not None and cluster.size > 1)

    def coordinates(self, key: str) -> bool:
        """Whether this broker coordinates transactional id (or group id) ``key``: always alone; in a
        cluster ``Cluster.coordinates`` (the rule that places groups places transactional ids too)."""
        cluster = self.apis.broker.cluster
        return cluster is None or cluster.coordinates(key)

    # -- lifecycle -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load the stored state, finish what a crash interrupted, then abort timed-out transactions
        until cancelled. With leadership through the database nothing is loaded here: the transactional
        ids come and go with their ``__consumer_offsets`` partitions (``load_partitions``)."""
        self._store = store = await trio.to_thread.run_sync(TransactionStore, self.store_path)
        try:
            if self._owned is None:
                metas, self.pending = await trio.to_thread.run_sync(store.load, self.coordinates, self.coordinates)
            else:
                metas = []
            for meta in metas:
                self.state.load(meta)
            open_ = sum(1 for m in metas if m.state is TxnState.ONGOING)
            if metas:
                log.info("transaction coordinator: %d transactional ids loaded, %d with an open transaction",
                         len(metas), open_)
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for meta in self.state.preparing():
                    log.info("transaction coordinator: completing %s of %r (producer %d, epoch %d) after a restart",
                             meta.state.value, meta.transactional_id, meta.producer_id, meta.producer_epoch)
                    nursery.start_soon(self._finish_locked, meta)
                if self.clustered:
                    nursery.start_soon(self._carry_out_markers)
                self._started.set()
                task_status.started()
                while True:
                    await trio.sleep(ABORT_CHECK_INTERVAL_S)
                    for meta in self.state.expired(_now_ms()):
                        nursery.start_soon(self._abort_expired, meta)
        finally:
            store.close()

    def close(self) -> None:
        """Stop starting transactions' ends (the server is stopping; what is stored is finished at the next start)."""
        self.closing = True

    # -- coordinators that move (leadership through the database) ------------------------------

    async def load_partitions(self, partitions: dict[int, int]) -> None:
        """This broker now leads these ``__consumer_offsets`` partitions (partition -> leader epoch;
        ``pipeline.cluster.service``,
        before it serves them): load their transactional ids and their groups' pending offsets from the
        store, and finish the transactions a Prepare state was stored for (the previous coordinator
        died or moved within their end), as Kafka's TransactionStateManager loads a
        ``__transaction_state`` partition and its coordinator completes what is pending. Open ones go
        on, or time out here.

        Raises:
            sqlite3.Error, psycopg.Error: the store cannot be read (the take-over is retried).
        """
        await self._started.wait()

        def mine(key: str) -> bool:
            return offsets_partition(key) in partitions

        metas, pending = await self._in_store(lambda store: store.load(mine, mine))
        assert self._owned is not None and self._nursery is not None
        self.unload_partitions(set(partitions))  # what an earlier term here left
        for meta in metas:
            self.state.load(meta)
        for tid, by_group in pending.items():
            self.pending.setdefault(tid, {}).update(by_group)
        self._owned.update(partitions)
        for meta in metas:
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                log.info("transaction coordinator: completing %s of %r (producer %d, epoch %d) taken over",
                         meta.state.value, meta.transactional_id, meta.producer_id, meta.producer_epoch)
                self._nursery.start_soon(self._finish_locked, meta)
        if metas:
            log.info("transaction coordinator: %d transactional id(s) of %d __consumer_offsets partition(s) loaded, "
                     "%d with an open transaction", len(metas), len(partitions),
                     sum(1 for m in metas if m.state is TxnState.ONGOING))

    def unload_partitions(self, partitions: set[int]) -> None:
        """These ``__consumer_offsets`` partitions moved to another broker: forget their transactional
        ids and their groups' pending offsets; an end under way for one of them stops at its next step
        (``_abandoned``), and a write it makes meanwhile is fenced (``TransactionStore``'s ``fence``)."""
        if self._owned is None:
            return
        for p in partitions:
            self._owned.pop(p, None)
        self.state.unload([tid for tid in list(self.state.transactions) if offsets_partition(tid) in partitions])
        for tid in list(self.pending):
            by_group = self.pending[tid]
            for group in [g for g in by_group if offsets_partition(g) in partitions]:
                del by_group[group]
            if not by_group:
                del self.pending[tid]

    def _not_coordinator(self, transactional_id: str) -> i16:
        """The error for a request about ``transactional_id`` that this broker does not coordinate now:
        COORDINATOR_LOAD_IN_PROGRESS while it takes the id's ``__consumer_offsets`` partition over
        (``DynamicCluster.loading``; Kafka's TransactionCoordinator while it loads the id's
        ``__transaction_state`` partition), else NOT_COORDINATOR. Clients retry both."""
        cluster = self.apis.broker.cluster
        if isinstance(cluster, DynamicCluster) and cluster.loading(transactional_id):
            return ErrorCode.coordinator_load_in_progress.value
        return NOT_COORDINATOR

    def _abandoned(self, meta: TransactionMetadata) -> bool:
        """Whether ``meta``'s coordinator moved away from this broker (``unload_partitions``)."""
        return self._owned is not None and offsets_partition(meta.transactional_id) not in self._owned

    def _fence(self, transactional_id: str) -> Fence | None:
        """The fence of this coordinator's writes for ``transactional_id`` (``TransactionStore``): with
        leadership through the database, its ``__consumer_offsets`` partition at the leader epoch it was
        loaded at (-1, which no row has, once it is not loaded here)."""
        if self._owned is None:
            return None
        partition = offsets_partition(transactional_id)
        return OFFSETS_TOPIC, partition, self.apis.broker.node_id, self._owned.get(partition, -1)

    # -- helpers -----------------------------------------------------------------

    def _lock(self, transactional_id: str) -> trio.Lock:
        lock = self._locks.get(transactional_id)
        if lock is None:
            lock = self._locks[transactional_id] = trio.Lock()
        return lock

    async def _save(self, meta: TransactionMetadata, pending: PendingOffsets | None = None,
                    clear_pending: bool | list[str] = False) -> None:
        fence = self._fence(meta.transactional_id)
        await self._in_store(lambda store: store.save(meta, pending, clear_pending, fence))

    async def _stored(self, meta: TransactionMetadata, pending: PendingOffsets | None = None,
                      clear_pending: bool | list[str] = False) -> int:
        """``_save`` for a request: NONE, or NOT_COORDINATOR when the write was fenced (the id's
        ``__consumer_offsets`` partition moved meanwhile: the client finds the new coordinator)."""
        try:
            await self._save(meta, pending, clear_pending)
        except NotCoordinatorError as exc:
            log.info("transaction %r: %s; answered NOT_COORDINATOR", meta.transactional_id, exc)
            return NOT_COORDINATOR
        return tx.NONE

    async def _in_store(self, call: Callable[[TransactionStore], _T]) -> _T:
        """``call(store)`` in a worker thread, one call at a time."""
        store = self._store
        if store is None:
            raise RuntimeError("the transaction coordinator is not running")
        async with self._store_lock:
            return await trio.to_thread.run_sync(call, store)

    async def _done(self, markers: list[QueuedMarker]) -> None:
        await self._in_store(lambda store: store.done(markers))

    def _local_groups(self, transactional_id: str) -> bool | list[str]:
        """What a transaction's end clears of the stored pending offsets: alone all of them; in a
        cluster those of the groups this broker coordinates (the others' coordinators drop theirs)."""
        return list(self.pending.get(transactional_id, {})) if self.clustered else True

    def _fenced(self, api_key: int, version: int) -> int:
        return tx.fenced_error(version, _FENCED_FROM[api_key])

    def _allowed(self, request: Request, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        return bool(self.apis.authorize(request, operation, resource_type, name))

    def _answer(self, request: Request, api_key: int, error: int, **fields: Any) -> None:
        header = request.header
        module = apis.response_module(api_key, header.api_version)
        cls = module.AddOffsetsToTxnResponse if api_key == ADD_OFFSETS_TO_TXN else module.EndTxnResponse
        add_error(self._errors[api_key], error)
        request.connection.complete(request.token, apis.encode(header, apis.make(
            cls, throttle_time=apis.ZERO_MS, error_code=apis.error_code(error), **fields)))

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._nursery is None:
            raise RuntimeError("the transaction coordinator is not running")
        self._nursery.start_soon(fn, *args)

    # -- the partition leader's check of a transactional produce (KIP-890 part 1) --------------

    async def verify_produce(self, transactional_id: str | None, producer_id: int, producer_epoch: int,
                             topic: str, partition: int) -> int:
        """May a transactional batch be appended to ``topic``-``partition``, which this broker leads?
        The coordinator's state when this broker coordinates ``transactional_id`` (or none is named);
        else a verification guard, or the stored state read now (Kafka's leader asks the coordinator,
        AddPartitionsToTxn v4 ``verify_only``): the guard is kept only if no marker of the producer
        reached the partition during the read. Returns NONE or the error
        (``pipeline.coordinator.transactions.produce_error``); NOT_ENOUGH_REPLICAS (retriable) when the
        store cannot be read, as Kafka converts a failed verification's coordinator errors.
        """
        if transactional_id is None or self.coordinates(transactional_id):
            return self.state.check_produce(producer_id, producer_epoch, topic, partition)
        key = (topic, partition, producer_id)
        if self._verified.get(key) == producer_epoch:
            return tx.NONE
        token = self._verifying.setdefault(key, object())
        try:
            meta = await self._in_store(lambda store: store.read(transactional_id))
        except Exception as exc:
            if self._verifying.get(key) is token:
                del self._verifying[key]
            log.warning("%s-%d: verifying producer %d's transaction %r failed (answered NOT_ENOUGH_REPLICAS, "
                        "retriable): %s: %s", topic, partition, producer_id, transactional_id, type(exc).__name__, exc)
            return ErrorCode.not_enough_replicas.value
        except BaseException:
            if self._verifying.get(key) is token:
                del self._verifying[key]
            raise
        error = tx.produce_error(meta, producer_id, producer_epoch, topic, partition)
        if error != tx.NONE:
            return error
        if self._verifying.get(key) is token:
            del self._verifying[key]
            self._verified[key] = producer_epoch
            self._expect.set()
            return tx.NONE
        return tx.NONE if self._verified.get(key) == producer_epoch else tx.INVALID_TXN_STATE

    def check_produce(self, transactional_id: str | None, producer_id: int, producer_epoch: int, topic: str,
                      partition: int) -> int:
        """``verify_produce`` again where the batch is sequenced (no await): the coordinator's state, or
        the guard ``verify_produce`` left (INVALID_TXN_STATE without it: a marker came meanwhile)."""
        if transactional_id is None or self.coordinates(transactional_id):
            return self.state.check_produce(producer_id, producer_epoch, topic, partition)
        return tx.NONE if self._verified.get((topic, partition, producer_id)) == producer_epoch else tx.INVALID_TXN_STATE

    # -- markers -----------------------------------------------------------------

    def _append_markers(self, markers: list[tuple[int, int, bool, str, int]]) -> Commit | None:
        """Append a COMMIT (True) or ABORT marker for each (producer id, epoch, committed, topic,
        partition) of ``markers`` (of partitions led here, topics that exist), as one append; no await,
        so produce sees each marker in sequence. Each producer's verification guard on those
        partitions goes (KIP-890). The append's Commit (None: nothing to append).

        Raises:
            StorageFailedError: the WAL failed; nothing was appended.
        """
        if not markers:
            return None
        state, now = self.apis.logs.state, _now_ms()
        appends = []
        for pid, epoch, committed, topic, partition in markers:
            batch = build_marker(pid, epoch, COMMIT if committed else ABORT, 0, now)
            base = state.offsets.assign(topic, partition, 1)
            appends.append(PartitionAppend(topic, partition, base, batch, 1, now, pid, epoch, -1, len(batch)))
        commit = self.apis.persister.append(appends)
        for a in appends:
            state.apply(a, ticket=commit)
        for pid, _epoch, _committed, topic, partition in markers:
            self._verified.pop((topic, partition, pid), None)
            self._verifying.pop((topic, partition, pid), None)
        return commit

    def _exists(self, topic: str, partition: int) -> bool:
        count = self.apis.catalog.partitions(topic)
        return count is not None and 0 <= partition < count

    def _queued_for_others(self, meta: TransactionMetadata) -> list[QueuedMarker]:
        """The end of ``meta``'s transaction that other brokers carry out: the markers of the partitions
        they lead and the offsets of the groups they coordinate (none alone)."""
        if not self.clustered:
            return []
        committed = meta.state is TxnState.PREPARE_COMMIT
        tid, pid, epoch = meta.transactional_id, meta.producer_id, meta.producer_epoch
        return ([QueuedMarker(tid, pid, epoch, committed, t, p) for t, p in sorted(meta.partitions)
                 if self._exists(t, p) and not self.apis.broker.leads(t, p)]
                + [QueuedMarker(tid, pid, epoch, committed, group_id=g) for g in sorted(meta.groups)
                   if not self.coordinates(g)])

    async def _write_markers(self, meta: TransactionMetadata) -> bool:
        """Append the COMMIT/ABORT marker of ``meta``'s transaction to each of its partitions led here
        (those of deleted topics skipped); True once durable, False if storage failed."""
        committed = meta.state is TxnState.PREPARE_COMMIT
        mine = [(meta.producer_id, meta.producer_epoch, committed, t, p) for t, p in sorted(meta.partitions)
                if self._exists(t, p) and self.apis.broker.leads(t, p)]
        try:
            commit = self._append_markers(mine)
        except StorageFailedError as exc:
            log.error("transaction %r: writing its markers failed: %s", meta.transactional_id, exc)
            return False
        return commit is None or await _wait(commit)

    async def _wait_queued(self, meta: TransactionMetadata) -> bool:
        """Wait until no marker of ``meta``'s transaction is queued for another broker; False when the
        coordinator closes first (the next start queues them again). The caller holds the
        transaction's lock, so the queued offsets of groups coordinated here (a prior coordinator's
        queue, or a group that moved here meanwhile) are carried out here: the marker loop
        (``_carry_out``) skips a transaction whose lock is held, and waiting for it would wait forever.

        Raises:
            StorageFailedError: storing such a group's offsets failed (``_complete`` tries again).
        """
        started = last_log = trio.current_time()
        while True:
            left = await self._in_store(lambda store: store.queued(meta.transactional_id))
            for m in [m for m in left if m.group_id is not None and self.coordinates(m.group_id)]:
                await self._carry_out_group(m)
                left.remove(m)
            if not left:
                return True
            if self.closing or self._abandoned(meta):
                return False
            now = trio.current_time()
            if now - last_log >= MARKER_WAIT_LOG_S:
                last_log = now
                log.warning("transaction %r (producer %d): %.0f s waiting for other brokers to write its end: %s",
                            meta.transactional_id, meta.producer_id, now - started,
                            ", ".join(f"{m.topic}-{m.partition}" if m.group_id is None else f"group {m.group_id}"
                                      for m in left))
            await trio.sleep(MARKER_POLL_BUSY_S)

    async def _carry_out_markers(self) -> None:
        """In a cluster: until cancelled, every ``MARKER_POLL_S`` carry out the queued markers of the
        partitions this broker leads and the queued offsets of the groups it coordinates
        (``_carry_out``); a failure is logged and tried again at the next look."""
        failures, found = 0, False
        while True:
            if failures:
                await trio.sleep(min(RETRY_BACKOFF_MAX_MS / 1000.0, RETRY_BACKOFF_MS / 1000.0 * 2 ** failures))
            elif found or self._expecting_markers():
                await trio.sleep(MARKER_POLL_BUSY_S)
            else:
                with trio.move_on_after(MARKER_POLL_S):
                    await self._expect.wait()
                self._expect = trio.Event()
            try:
                queued = await self._in_store(lambda store: store.queued())
                found = bool(queued)
                await self._carry_out(queued)
                failures = 0
            except Exception as exc:
                failures += 1
                log.warning("transaction markers queued for this broker: carrying them out failed (attempt %d): "
                            "%s: %s", failures, type(exc).__name__, exc)

    async def _carry_out_group(self, m: QueuedMarker) -> None:
        """Commit (or drop) the pending offsets of group ``m.group_id``, coordinated here, that
        transaction ``m`` carries, then delete ``m`` from the queue; the caller holds the transaction's
        lock.

        Raises:
            StorageFailedError: the offsets were not stored (``m`` stays queued).
        """
        assert m.group_id is not None
        offsets = self.pending.get(m.transactional_id, {}).get(m.group_id, {})
        if m.committed and offsets and not await self.groups.commit_offsets(m.group_id, offsets):
            raise StorageFailedError(f"storing the offsets of group {m.group_id!r} failed")
        await self._done([m])
        by_group = self.pending.get(m.transactional_id, {})
        by_group.pop(m.group_id, None)
        if not by_group:
            self.pending.pop(m.transactional_id, None)
        log.info("transaction of %r (producer %d): offsets of group %r %s", m.transactional_id,
                 m.producer_id, m.group_id, "committed" if m.committed else "dropped")

    def _expecting_markers(self) -> bool:
        """Whether another broker's coordinator may soon queue a marker or offsets for this one: a
        transaction it does not coordinate is verified open on a partition led here, or has offsets
        pending at a group coordinated here."""
        return bool(self._verified or self._verifying) or any(not self.coordinates(t) for t in self.pending)

    async def _carry_out(self, queued: list[QueuedMarker]) -> None:
        """Append the markers of ``queued`` for partitions led here (a marker older than the producer's
        epoch on its partition is dropped, as Kafka refuses it: INVALID_PRODUCER_EPOCH; one of a
        deleted topic is dropped), commit (or drop) the pending offsets of the groups coordinated
        here, then delete what was done from the queue."""
        state = self.apis.logs.state
        partitions = [m for m in queued if m.group_id is None and self.apis.broker.leads(m.topic, m.partition)]
        done: list[QueuedMarker] = []
        markers = []
        for m in partitions:
            epoch = state.producers.epoch(m.producer_id, m.topic, m.partition)
            if not self._exists(m.topic, m.partition):
                done.append(m)
            elif epoch is not None and m.producer_epoch < epoch:
                log.warning("transaction %r: a queued marker of epoch %d on %s-%d is older than the producer's "
                            "epoch %d there: dropped", m.transactional_id, m.producer_epoch, m.topic, m.partition,
                            epoch)
                done.append(m)
            else:
                markers.append(m)
        if markers:
            commit = self._append_markers([(m.producer_id, m.producer_epoch, m.committed, m.topic, m.partition)
                                           for m in markers])
            if commit is not None and not await _wait(commit):
                raise StorageFailedError("the markers' append failed")
            done += markers
        for m in queued:
            if m.group_id is None or not self.coordinates(m.group_id):
                continue
            lock = self._lock(m.transactional_id)
            try:
                lock.acquire_nowait()
            except trio.WouldBlock:
                # The transaction's own coordinator, here, holds it while its end waits for this queue
                # (``_wait_queued`` does this group's part itself); any other holder: the next look.
                continue
            try:
                await self._carry_out_group(m)
            finally:
                lock.release()
        if done:
            await self._done(done)
            log.info("transaction markers written for other coordinators: %s", ", ".join(
                f"{'COMMIT' if m.committed else 'ABORT'} of {m.transactional_id!r} on {m.topic}-{m.partition}"
                for m in done))

    async def _finish_locked(self, meta: TransactionMetadata) -> bool:
        async with self._lock(meta.transactional_id):
            return await self._complete(meta)

    async def _complete(self, meta: TransactionMetadata) -> bool:
        """``_finish`` until it succeeds, as Kafka's TransactionMarkerChannelManager retries marker
        writes until they are written (``_retrying``). Meanwhile the transaction stays
        PrepareCommit/PrepareAbort (its producer's other requests get CONCURRENT_TRANSACTIONS, as in
        Kafka); a marker written twice changes nothing. False only when the coordinator closes
        first: the stored Prepare state is finished at the next start."""
        return await self._retrying(meta, "completing it", lambda: self._finish(meta))

    async def _prepare(self, meta: TransactionMetadata, commit: bool, bump_epoch: bool = False) -> bool:
        """Ongoing -> PrepareCommit/PrepareAbort, stored before any marker is written (a restart
        must find the decision its markers carry out), the store's write retried (``_retrying``);
        then ``_complete``. False when the coordinator closes first."""
        self.state.prepare(meta, commit, _now_ms(), bump_epoch=bump_epoch)

        async def store() -> bool:
            await self._save(meta)
            return True

        return (await self._retrying(meta, f"storing its {meta.state.value}", store)
                and await self._complete(meta))

    async def _retrying(self, meta: TransactionMetadata, what: str, attempt: Callable[[], Awaitable[bool]]) -> bool:
        """``attempt()`` until it returns True: a False or an exception (the store's database
        unreachable, e.g.) is logged and tried again after ``RETRY_BACKOFF_MS``, doubling to
        ``RETRY_BACKOFF_MAX_MS``. False when the coordinator is closing."""
        backoff_ms, attempts = RETRY_BACKOFF_MS, 1
        while True:
            try:
                if await attempt():
                    return True
                why = "storage failed"
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"
            if self.closing or self._abandoned(meta):
                return False
            log.warning("transaction %r (producer %d): %s failed (attempt %d), retrying in %d ms: %s",
                        meta.transactional_id, meta.producer_id, what, attempts, backoff_ms, why)
            await trio.sleep(backoff_ms / 1000.0)
            backoff_ms, attempts = min(backoff_ms * 2, RETRY_BACKOFF_MAX_MS), attempts + 1

    async def _finish(self, meta: TransactionMetadata) -> bool:
        """From PrepareCommit/PrepareAbort (stored): markers, the offsets of a commit, then
        CompleteCommit/CompleteAbort (in memory, then stored). One attempt: False if storage failed,
        or an exception from the store; ``_complete`` tries again, from where this one stopped (a
        transaction completed in memory whose stored state failed is only stored again: its markers
        are written, and writing them again would read its state as an abort's)."""
        if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            others = self._queued_for_others(meta)
            if others:
                fence = self._fence(meta.transactional_id)
                await self._in_store(lambda store: store.queue_markers(others, fence))
            if not await self._write_markers(meta):
                return False
            if meta.state is TxnState.PREPARE_COMMIT:
                for group_id, offsets in self.pending.get(meta.transactional_id, {}).items():
                    if not await self.groups.commit_offsets(group_id, offsets):
                        log.error("transaction %r: storing its offsets of group %r failed", meta.transactional_id,
                                  group_id)
                        return False
            if others and not await self._wait_queued(meta):
                return False
            self.state.complete(meta, _now_ms())
        await self._save(meta, clear_pending=self._local_groups(meta.transactional_id))
        self.pending.pop(meta.transactional_id, None)
        log.info("transaction of %r (producer %d, epoch %d) %s", meta.transactional_id, meta.producer_id,
                 meta.producer_epoch, "committed" if meta.state is TxnState.COMPLETE_COMMIT else "aborted")
        return True

    async def _abort_expired(self, meta: TransactionMetadata) -> None:
        async with self._lock(meta.transactional_id):
            if meta.state is not TxnState.ONGOING or self.closing:
                return
            now = _now_ms()
            if not (meta.start_ms >= 0 and now - meta.start_ms > meta.timeout_ms):
                return
            log.warning("transaction of %r (producer %d) timed out after %d ms: aborting it with a new epoch",
                        meta.transactional_id, meta.producer_id, meta.timeout_ms)
            await self._prepare(meta, commit=False, bump_epoch=True)

    # -- InitProducerId ------------------------------------------------------------

    async def init_producer_id(self, request: Request, body: Any, may_write: bool) -> None:
        """InitProducerId with a transactional id (KafkaApis hands it here): answered from a task."""
        self._spawn(self._init_producer_id, request, body, may_write)

    async def _init_producer_id(self, request: Request, body: Any, may_write: bool) -> None:
        header = request.header
        tid = body.transactional_id
        pid, epoch = -1, -1
        error: int = tx.NONE
        if not may_write or not self._allowed(request, WRITE, TRANSACTIONAL_ID, tid):
            error = ErrorCode.transactional_id_authorization_failed.value
        elif not self.coordinates(tid):
            error = self._not_coordinator(tid)
        elif self.closing:
            error = ErrorCode.coordinator_not_available.value
        else:
            async with self._lock(tid):
                decision = self.state.judge_init(
                    tid, int(body.transaction_timeout.total_seconds() * 1000),
                    int(getattr(body, "producer_id", -1)), int(getattr(body, "producer_epoch", -1)),
                    self._fenced(INIT_PRODUCER_ID, header.api_version))
                error = decision.error
                meta = self.state.get(tid)
                if error == tx.NONE and decision.abort_first and meta is not None:
                    # Fence the previous producer: abort its transaction with a new epoch (Kafka
                    # prepareFenceProducerEpoch), then give this one the epoch after.
                    log.info("transaction of %r (producer %d, epoch %d) aborted: a new producer initialised",
                             tid, meta.producer_id, meta.producer_epoch)
                    if not await self._prepare(meta, commit=False, bump_epoch=True):  # closing
                        error = ErrorCode.coordinator_not_available.value
                if error == tx.NONE:
                    new_id = self.apis.next_producer_id() if decision.new_producer_id else None
                    meta = self.state.initialise(tid, int(body.transaction_timeout.total_seconds() * 1000),
                                                 _now_ms(), new_id)
                    error = await self._stored(meta, clear_pending=self._local_groups(tid))
                    if error == tx.NONE:
                        self.pending.pop(tid, None)
                        pid, epoch = meta.producer_id, meta.producer_epoch
        add_error(self._errors[INIT_PRODUCER_ID], error)
        request.connection.complete(request.token, apis.init_producer_id_response(header, body, pid, epoch, error))

    # -- AddPartitionsToTxn ---------------------------------------------------------

    async def _add_partitions(self, request: Request) -> None:
        """AddPartitionsToTxn v0-3 (Kafka handleAddPartitionsToTxnRequest): TRANSACTIONAL_ID Write,
        TOPIC Write per topic; if any partition is refused, the others are OPERATION_NOT_ATTEMPTED."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        tid = body.v3_and_below_transactional_id
        wanted = [(t.name, int(p)) for t in body.v3_and_below_topics for p in t.partitions]
        results: dict[tuple[str, int], int] = {}
        if not self._allowed(request, WRITE, TRANSACTIONAL_ID, tid):
            results = {k: ErrorCode.transactional_id_authorization_failed.value for k in wanted}
        elif not self.coordinates(tid):
            results = {k: self._not_coordinator(tid) for k in wanted}
        else:
            writable = {t: self._allowed(request, WRITE, TOPIC, t) for t in {t for t, _ in wanted}}
            for t, p in wanted:
                count = self.apis.catalog.partitions(t)
                if not writable[t]:
                    results[(t, p)] = ErrorCode.topic_authorization_failed.value
                elif count is None or not 0 <= p < count:
                    results[(t, p)] = ErrorCode.unknown_topic_or_partition.value
            if results:
                for k in wanted:
                    results.setdefault(k, ErrorCode.operation_not_attempted.value)
            else:
                async with self._lock(tid):
                    error, meta = self.state.check(tid, int(body.v3_and_below_producer_id),
                                                   int(body.v3_and_below_producer_epoch),
                                                   self._fenced(ADD_PARTITIONS_TO_TXN, header.api_version))
                    if error == tx.NONE and meta is not None and (
                            meta.state is not TxnState.ONGOING or not set(wanted) <= meta.partitions):
                        self.state.begin_if_needed(meta, _now_ms())
                        meta.partitions.update(wanted)
                        error = await self._stored(meta)
                    results = {k: error for k in wanted}
        module = apis.response_module(ADD_PARTITIONS_TO_TXN, header.api_version)
        by_topic: dict[str, list[Any]] = {}
        for (t, p), e in results.items():
            add_error(self._errors[ADD_PARTITIONS_TO_TXN], e)
            by_topic.setdefault(t, []).append(apis.make(module.AddPartitionsToTxnPartitionResult,
                                                        partition_index=i32(p), partition_error_code=apis.error_code(e)))
        request.connection.complete(request.token, apis.encode(header, apis.make(
            module.AddPartitionsToTxnResponse, throttle_time=apis.ZERO_MS,
            results_by_topic_v3_and_below=tuple(
                apis.make(module.AddPartitionsToTxnTopicResult, name=t, results_by_partition=tuple(ps))
                for t, ps in by_topic.items()))))

    # -- AddOffsetsToTxn, TxnOffsetCommit -------------------------------------------------

    async def _add_offsets(self, request: Request) -> None:
        """AddOffsetsToTxn v0-3: TRANSACTIONAL_ID Write and GROUP Read; the group's offsets of
        TxnOffsetCommit then commit with the transaction."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        tid = body.transactional_id
        error: int
        if not self._allowed(request, WRITE, TRANSACTIONAL_ID, tid):
            error = ErrorCode.transactional_id_authorization_failed.value
        elif not self._allowed(request, READ, GROUP, body.group_id):
            error = ErrorCode.group_authorization_failed.value
        elif not self.coordinates(tid):
            error = self._not_coordinator(tid)
        else:
            async with self._lock(tid):
                error, meta = self.state.check(tid, int(body.producer_id), int(body.producer_epoch),
                                               self._fenced(ADD_OFFSETS_TO_TXN, header.api_version))
                if error == tx.NONE and meta is not None:
                    self.state.begin_if_needed(meta, _now_ms())
                    meta.groups.add(body.group_id)
                    error = await self._stored(meta)
        self._answer(request, ADD_OFFSETS_TO_TXN, error)

    async def _txn_offset_commit(self, request: Request) -> None:
        """TxnOffsetCommit v0-3: the offsets wait with the transaction (stored) and reach the group
        only when it commits; GROUP Read, TOPIC Read per topic. v3's group metadata (KIP-447) is
        checked against the group first (``GroupCoordinator.validate_txn_commit``: a zombie of an
        older generation gets ILLEGAL_GENERATION, as from Kafka's group coordinator), then the
        transaction (``TransactionState.check``). Served by the group's coordinator (else
        NOT_COORDINATOR, as Kafka's); when another broker coordinates the transaction, the offsets are
        stored only if its stored state is ongoing with the group (``add_pending_if_ongoing``)."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        tid, group_id = body.transactional_id, body.group_id
        asked = [(t.name, p) for t in body.topics for p in t.partitions]
        errors: dict[tuple[str, int], int] = {}
        common: int
        if not self._allowed(request, WRITE, TRANSACTIONAL_ID, tid):
            common = ErrorCode.transactional_id_authorization_failed.value
        elif not self.coordinates(group_id):
            common = NOT_COORDINATOR
        else:
            local = self.coordinates(tid)
            fenced = self._fenced(TXN_OFFSET_COMMIT, header.api_version)
            async with self._lock(tid):
                common = self.groups.state.validate_txn_commit(
                    group_id=group_id, generation_id=int(getattr(body, "generation_id", -1)),
                    member_id=getattr(body, "member_id", ""), instance_id=getattr(body, "group_instance_id", None))
                meta = None
                if common == tx.NONE and local:
                    common, meta = self.state.check(tid, int(body.producer_id), int(body.producer_epoch), fenced)
                if common == tx.NONE and meta is not None and (meta.state is not TxnState.ONGOING
                                                               or group_id not in meta.groups):
                    common = tx.INVALID_TXN_STATE
                if common == tx.NONE:
                    readable = {t: self._allowed(request, READ, TOPIC, t) for t in {t for t, _ in asked}}
                    offsets: dict[tuple[str, int], tuple[int, int, str | None]] = {}
                    for t, p in asked:
                        count = self.apis.catalog.partitions(t)
                        if not readable[t]:
                            errors[(t, int(p.partition_index))] = ErrorCode.topic_authorization_failed.value
                        elif count is None or not 0 <= p.partition_index < count:
                            errors[(t, int(p.partition_index))] = ErrorCode.unknown_topic_or_partition.value
                        else:
                            offsets[(t, int(p.partition_index))] = (
                                int(p.committed_offset), int(getattr(p, "committed_leader_epoch", -1)),
                                p.committed_metadata)
                    if offsets and local:
                        assert meta is not None
                        common = await self._stored(meta, {group_id: offsets})
                    elif offsets:
                        pid, epoch = int(body.producer_id), int(body.producer_epoch)
                        common = await self._in_store(lambda store: store.add_pending_if_ongoing(
                            tid, pid, epoch, group_id, offsets, fenced))
                    if offsets and common == tx.NONE:
                        self.pending.setdefault(tid, {}).setdefault(group_id, {}).update(offsets)
                        if not local:
                            self._expect.set()
        header_module = apis.response_module(TXN_OFFSET_COMMIT, header.api_version)
        by_topic: dict[str, list[Any]] = {}
        for t, p in asked:
            e = errors.get((t, int(p.partition_index)), common)
            add_error(self._errors[TXN_OFFSET_COMMIT], e)
            by_topic.setdefault(t, []).append(apis.make(header_module.TxnOffsetCommitResponsePartition,
                                                        partition_index=p.partition_index,
                                                        error_code=apis.error_code(e)))
        request.connection.complete(request.token, apis.encode(header, apis.make(
            header_module.TxnOffsetCommitResponse, throttle_time=apis.ZERO_MS, topics=tuple(
                apis.make(header_module.TxnOffsetCommitResponseTopic, name=t, partitions=tuple(ps))
                for t, ps in by_topic.items()))))

    # -- EndTxn --------------------------------------------------------------------

    async def _end_txn(self, request: Request) -> None:
        """EndTxn v0-3: answered from a task once the markers are durable (see the module docstring)."""
        body = apis.decode_request(request.header, request.frame)
        self._spawn(self._end, request, body)

    async def _end(self, request: Request, body: Any) -> None:
        tid = body.transactional_id
        commit = bool(body.committed)
        if not self._allowed(request, WRITE, TRANSACTIONAL_ID, tid):
            self._answer(request, END_TXN, ErrorCode.transactional_id_authorization_failed.value)
            return
        if not self.coordinates(tid):
            self._answer(request, END_TXN, self._not_coordinator(tid))
            return
        error: int
        async with self._lock(tid):
            error, meta = self.state.check(tid, int(body.producer_id), int(body.producer_epoch),
                                           self._fenced(END_TXN, request.header.api_version))
            if error == tx.NONE and meta is not None:
                error, write = self.state.judge_end(meta, commit)
                if write:
                    if self.closing:
                        error = ErrorCode.coordinator_not_available.value
                    else:
                        if not await self._prepare(meta, commit):  # closing: the next start completes it
                            error = ErrorCode.coordinator_not_available.value
        self._answer(request, END_TXN, error)

    # -- DescribeTransactions, ListTransactions (KIP-664) ---------------------------------

    async def _describe(self, request: Request) -> None:
        header = request.header
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(DESCRIBE_TRANSACTIONS, header.api_version)
        states = []
        for tid in body.transactional_ids:
            meta = self.state.get(tid)
            if not self._allowed(request, DESCRIBE, TRANSACTIONAL_ID, tid):
                error = ErrorCode.transactional_id_authorization_failed.value
            elif not self.coordinates(tid):
                error = self._not_coordinator(tid)
            elif meta is None:
                error = ErrorCode.transactional_id_not_found.value
            else:
                error = tx.NONE
            add_error(self._errors[DESCRIBE_TRANSACTIONS], error)
            by_topic: dict[str, list[int]] = {}
            if meta is not None and error == tx.NONE:
                for t, p in sorted(meta.partitions):
                    by_topic.setdefault(t, []).append(p)
            states.append(apis.make(
                module.TransactionState, error_code=apis.error_code(error), transactional_id=tid,
                transaction_state=meta.state.value if meta is not None and error == tx.NONE else "",
                transaction_timeout=apis.timedelta_ms(meta.timeout_ms if meta is not None and error == tx.NONE else 0),
                # Kafka: the transaction's start (-1 when none is ongoing); an error leaves the
                # schema's default, 0.
                transaction_start_time=apis.datetime_ms(meta.start_ms if meta is not None and error == tx.NONE
                                                         else 0),
                producer_id=i64(meta.producer_id if meta is not None and error == tx.NONE else -1),
                producer_epoch=meta.producer_epoch if meta is not None and error == tx.NONE else -1,
                topics=tuple(apis.make(module.TopicData, topic=t, partitions=tuple(i32(p) for p in ps))
                             for t, ps in by_topic.items())))
        request.connection.complete(request.token, apis.encode(header, apis.make(
            module.DescribeTransactionsResponse, throttle_time=apis.ZERO_MS, transaction_states=tuple(states))))

    async def _list(self, request: Request) -> None:
        """ListTransactions v0-v1: every transaction this coordinator knows, filtered by state, producer id
        and (v1, KIP-994) ``duration_filter`` ms: one that began that long ago or less is left out, as
        Kafka's ``TransactionStateManager.listTransactionStates`` does (``now - start <= filter``; a
        negative filter keeps all). A transaction not ongoing has no start here (-1), so a filter keeps
        it, as Kafka keeps one that never began."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(LIST_TRANSACTIONS, header.api_version)
        known = {s.value for s in TxnState}
        state_filters = set(body.state_filters)
        pid_filters = {int(p) for p in body.producer_id_filters}
        duration_ms = int(getattr(body, "duration_filter", -1))
        now = _now_ms()
        rows = []
        for meta in self.state.transactions.values():
            if state_filters and meta.state.value not in state_filters:
                continue
            if pid_filters and meta.producer_id not in pid_filters:
                continue
            if duration_ms >= 0 and now - meta.start_ms <= duration_ms:
                continue
            if not self.apis.authorize(request, DESCRIBE, TRANSACTIONAL_ID, meta.transactional_id, False):
                continue
            rows.append(apis.make(module.TransactionState, transactional_id=meta.transactional_id,
                                  producer_id=i64(meta.producer_id), transaction_state=meta.state.value))
        add_error(self._errors[LIST_TRANSACTIONS], tx.NONE)
        request.connection.complete(request.token, apis.encode(header, apis.make(
            module.ListTransactionsResponse, throttle_time=apis.ZERO_MS, error_code=apis.error_code(tx.NONE),
            unknown_state_filters=tuple(sorted(state_filters - known)), transaction_states=tuple(rows))))


    # -- the partition leader's side: DescribeProducers, WriteTxnMarkers ------------------------

    async def _describe_producers(self, request: Request) -> None:
        """Each partition's producers with state there (Kafka ``ReplicaManager.activeProducerState``):
        id, epoch, last sequence (-1 when only a marker set its epoch), and the first offset of its
        open transaction (-1 without one). Topic READ, as Kafka's ``KafkaApis.handleDescribeProducersRequest``;
        the last timestamp and coordinator epoch are not kept here and are -1."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(DESCRIBE_PRODUCERS, header.api_version)
        catalog, logs = self.apis.catalog, self.apis.logs
        topics = []
        for t in body.topics:
            allowed = self._allowed(request, READ, TOPIC, t.name)
            count = catalog.partitions(t.name)
            partitions = []
            for p in t.partition_indexes:
                if not allowed:
                    error = ErrorCode.topic_authorization_failed.value
                elif count is None or not 0 <= p < count:
                    error = ErrorCode.unknown_topic_or_partition.value
                elif not self.apis.broker.leads(t.name, p):
                    error = NOT_LEADER
                else:
                    error = tx.NONE
                add_error(self._errors[DESCRIBE_PRODUCERS], error)
                producers = ()
                if error == tx.NONE:
                    ongoing = logs.log(t.name, p).ongoing
                    producers = tuple(apis.make(
                        module.ProducerState, producer_id=i64(pid), producer_epoch=i32(epoch),
                        last_sequence=i32(last_seq), last_timestamp=i64(-1), coordinator_epoch=i32(-1),
                        current_txn_start_offset=i64(ongoing.get(pid, -1)))
                        for pid, epoch, last_seq in logs.state.producers.active(t.name, p))
                partitions.append(apis.make(module.PartitionResponse, partition_index=p,
                                            error_code=apis.error_code(error), error_message=None,
                                            active_producers=producers))
            topics.append(apis.make(module.TopicResponse, name=t.name, partitions=tuple(partitions)))
        request.connection.complete(request.token, apis.encode(header, apis.make(
            module.DescribeProducersResponse, throttle_time=apis.ZERO_MS, topics=tuple(topics))))

    async def _write_txn_markers(self, request: Request) -> None:
        """Append each marker's COMMIT/ABORT to its partitions (Kafka ``KafkaApis.handleWriteTxnMarkersRequest``;
        CLUSTER_ACTION on the cluster). Kafka's coordinators send it to partition leaders; its one
        use from outside is the admin abort of a hanging transaction (``Admin.abortTransaction``,
        coordinator epoch -1): the partition's open transaction of that producer ends, and its last
        stable offset moves on. A marker with an epoch older than the producer's on the partition is
        refused (INVALID_PRODUCER_EPOCH, Kafka ``ProducerAppendInfo.checkProducerEpoch``); answered once
        the markers are durable where produce is acknowledged."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(WRITE_TXN_MARKERS, header.api_version)
        allowed = self._allowed(request, AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME)
        catalog, state = self.apis.catalog, self.apis.logs.state
        results: list[tuple[int, dict[str, dict[int, int]]]] = []
        appends: list[tuple[int, int, bool, str, int]] = []
        written: list[str] = []
        for marker in body.markers:
            errors: dict[str, dict[int, int]] = {}
            for t in marker.topics:
                count = catalog.partitions(t.name)
                for p in t.partition_indexes:
                    epoch = state.producers.epoch(marker.producer_id, t.name, p)
                    if not allowed:
                        error = ErrorCode.cluster_authorization_failed.value
                    elif count is None or not 0 <= p < count:
                        error = ErrorCode.unknown_topic_or_partition.value
                    elif not self.apis.broker.leads(t.name, p):
                        error = NOT_LEADER
                    elif epoch is not None and marker.producer_epoch < epoch:
                        error = ErrorCode.invalid_producer_epoch.value
                    else:
                        error = tx.NONE
                        appends.append((int(marker.producer_id), int(marker.producer_epoch),
                                        bool(marker.transaction_result), t.name, int(p)))
                        written.append(f"{'COMMIT' if marker.transaction_result else 'ABORT'} of producer "
                                       f"{marker.producer_id} (epoch {marker.producer_epoch}) on {t.name}-{p}")
                    errors.setdefault(t.name, {})[p] = error
            results.append((marker.producer_id, errors))
        if appends:
            log.warning("WriteTxnMarkers: %s", ", ".join(written))
            failed = ErrorCode.kafka_storage_error.value
            try:
                commit = self._append_markers(appends)
            except StorageFailedError as exc:
                log.error("WriteTxnMarkers: writing the markers failed: %s", exc)
                ok = False
            else:
                ok = commit is None or await _wait(commit)
            if not ok:
                for _, errors in results:
                    for by_partition in errors.values():
                        for index, code in by_partition.items():
                            if code == tx.NONE:
                                by_partition[index] = failed
        answers = []
        for pid, errors in results:
            for by_partition in errors.values():
                for code in by_partition.values():
                    add_error(self._errors[WRITE_TXN_MARKERS], code)
            answers.append(apis.make(module.WritableTxnMarkerResult, producer_id=i64(pid), topics=tuple(
                apis.make(module.WritableTxnMarkerTopicResult, name=topic, partitions=tuple(
                    apis.make(module.WritableTxnMarkerPartitionResult, partition_index=i32(p),
                              error_code=apis.error_code(error)) for p, error in by_partition.items()))
                for topic, by_partition in errors.items())))
        request.connection.complete(request.token, apis.encode(header, apis.make(
            module.WriteTxnMarkersResponse, markers=tuple(answers))))


async def _wait(commit: Commit) -> bool:
    """Wait for ``commit`` to resolve; True if without error."""
    done = trio.Event()
    commit.add_callback(lambda c: done.set())
    await done.wait()
    return commit.error is None
