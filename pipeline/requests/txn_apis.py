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
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol

import trio
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64

from pipeline.coordinator import transactions as tx
from pipeline.coordinator.transactions import TransactionCoordinator, TransactionMetadata, TxnState
from pipeline.coordinator.service import GroupCoordinatorService
from pipeline.coordinator.txn_store import STORE_FILE, PendingOffsets, TransactionStore
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

INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 22, 24, 25, 26, 28
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66
DESCRIBE_PRODUCERS, WRITE_TXN_MARKERS = 61, 27
TXN_APIS = (ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT, DESCRIBE_TRANSACTIONS,
            LIST_TRANSACTIONS, DESCRIBE_PRODUCERS, WRITE_TXN_MARKERS)
"""What this module serves besides InitProducerId (which KafkaApis hands it for a transactional id)."""
# KIP-588: the first version of each api that may answer PRODUCER_FENCED (older ones: INVALID_PRODUCER_EPOCH).
_FENCED_FROM = {INIT_PRODUCER_ID: 4, ADD_PARTITIONS_TO_TXN: 2, ADD_OFFSETS_TO_TXN: 2, END_TXN: 2, TXN_OFFSET_COMMIT: 3}
ABORT_CHECK_INTERVAL_S = 1.0
RETRY_BACKOFF_MS = 100
"""First wait before completing a transaction again after a failure (ms): Kafka's ``retry.backoff.ms``
default, which its TransactionMarkerChannelManager retries marker writes with."""
RETRY_BACKOFF_MAX_MS = 1000
"""The wait doubles up to this (ms): Kafka's ``retry.backoff.max.ms`` default (KIP-580)."""
"""How often transactions older than their timeout are looked for (Kafka
``transaction.abort.timed.out.transaction.cleanup.interval.ms``, 10 s there)."""
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
        self.closing = False

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

    # -- lifecycle -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load the stored state, finish what a crash interrupted, then abort timed-out transactions
        until cancelled."""
        self._store = store = await trio.to_thread.run_sync(TransactionStore, self.store_path)
        try:
            metas, self.pending = await trio.to_thread.run_sync(store.load)
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

    # -- helpers -----------------------------------------------------------------

    def _lock(self, transactional_id: str) -> trio.Lock:
        lock = self._locks.get(transactional_id)
        if lock is None:
            lock = self._locks[transactional_id] = trio.Lock()
        return lock

    async def _save(self, meta: TransactionMetadata, pending: PendingOffsets | None = None,
                    clear_pending: bool = False) -> None:
        assert self._store is not None
        store = self._store
        async with self._store_lock:
            await trio.to_thread.run_sync(store.save, meta, pending, clear_pending)

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

    # -- markers -----------------------------------------------------------------

    async def _write_markers(self, meta: TransactionMetadata) -> bool:
        """Append the COMMIT/ABORT marker of ``meta``'s transaction to each of its partitions
        (those of deleted topics skipped); True once durable, False if storage failed."""
        control = COMMIT if meta.state is TxnState.PREPARE_COMMIT else ABORT
        catalog, state = self.apis.catalog, self.apis.logs.state
        now = _now_ms()
        marker = build_marker(meta.producer_id, meta.producer_epoch, control, 0, now)
        markers = []
        for topic, partition in sorted(meta.partitions):
            count = catalog.partitions(topic)
            if count is None or partition >= count:
                continue
            base = state.offsets.assign(topic, partition, 1)
            markers.append(PartitionAppend(topic, partition, base, marker, 1, now, meta.producer_id,
                                           meta.producer_epoch, -1, len(marker)))
        if not markers:
            return True
        try:
            commit = self.apis.persister.append(markers)
        except StorageFailedError as exc:
            log.error("transaction %r: writing its markers failed: %s", meta.transactional_id, exc)
            return False
        for m in markers:
            state.apply(m, ticket=commit)
        return await _wait(commit)

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
            if self.closing:
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
            if not await self._write_markers(meta):
                return False
            if meta.state is TxnState.PREPARE_COMMIT:
                for group_id, offsets in self.pending.get(meta.transactional_id, {}).items():
                    if not await self.groups.commit_offsets(group_id, offsets):
                        log.error("transaction %r: storing its offsets of group %r failed", meta.transactional_id,
                                  group_id)
                        return False
            self.state.complete(meta, _now_ms())
        await self._save(meta, clear_pending=True)
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
                    await self._save(meta, clear_pending=True)
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
                        await self._save(meta)
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
        else:
            async with self._lock(tid):
                error, meta = self.state.check(tid, int(body.producer_id), int(body.producer_epoch),
                                               self._fenced(ADD_OFFSETS_TO_TXN, header.api_version))
                if error == tx.NONE and meta is not None:
                    self.state.begin_if_needed(meta, _now_ms())
                    meta.groups.add(body.group_id)
                    await self._save(meta)
        self._answer(request, ADD_OFFSETS_TO_TXN, error)

    async def _txn_offset_commit(self, request: Request) -> None:
        """TxnOffsetCommit v0-3: the offsets wait with the transaction (stored) and reach the group
        only when it commits; GROUP Read, TOPIC Read per topic. v3's group metadata (KIP-447) is
        checked against the group first (``GroupCoordinator.validate_txn_commit``: a zombie of an
        older generation gets ILLEGAL_GENERATION, as from Kafka's group coordinator), then the
        transaction (``TransactionState.check``)."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        tid, group_id = body.transactional_id, body.group_id
        asked = [(t.name, p) for t in body.topics for p in t.partitions]
        errors: dict[tuple[str, int], int] = {}
        common: int
        if not self._allowed(request, WRITE, TRANSACTIONAL_ID, tid):
            common = ErrorCode.transactional_id_authorization_failed.value
        elif not self._allowed(request, READ, GROUP, group_id):
            common = ErrorCode.group_authorization_failed.value
        else:
            async with self._lock(tid):
                common = self.groups.state.validate_txn_commit(
                    group_id=group_id, generation_id=int(getattr(body, "generation_id", -1)),
                    member_id=getattr(body, "member_id", ""), instance_id=getattr(body, "group_instance_id", None))
                meta = None
                if common == tx.NONE:
                    common, meta = self.state.check(tid, int(body.producer_id), int(body.producer_epoch),
                                                    self._fenced(TXN_OFFSET_COMMIT, header.api_version))
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
                    if offsets:
                        assert meta is not None
                        await self._save(meta, {group_id: offsets})
                        self.pending.setdefault(tid, {}).setdefault(group_id, {}).update(offsets)
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
        now = _now_ms()
        results: list[tuple[int, dict[str, dict[int, int]]]] = []
        appends: list[PartitionAppend] = []
        written: list[str] = []
        for marker in body.markers:
            control = COMMIT if marker.transaction_result else ABORT
            batch = build_marker(marker.producer_id, marker.producer_epoch, control, 0, now)
            errors: dict[str, dict[int, int]] = {}
            for t in marker.topics:
                count = catalog.partitions(t.name)
                for p in t.partition_indexes:
                    epoch = state.producers.epoch(marker.producer_id, t.name, p)
                    if not allowed:
                        error = ErrorCode.cluster_authorization_failed.value
                    elif count is None or not 0 <= p < count:
                        error = ErrorCode.unknown_topic_or_partition.value
                    elif epoch is not None and marker.producer_epoch < epoch:
                        error = ErrorCode.invalid_producer_epoch.value
                    else:
                        error = tx.NONE
                        base = state.offsets.assign(t.name, p, 1)
                        appends.append(PartitionAppend(t.name, p, base, batch, 1, now, marker.producer_id,
                                                       marker.producer_epoch, -1, len(batch)))
                        written.append(f"{'COMMIT' if control == COMMIT else 'ABORT'} of producer "
                                       f"{marker.producer_id} (epoch {marker.producer_epoch}) on {t.name}-{p}")
                    errors.setdefault(t.name, {})[p] = error
            results.append((marker.producer_id, errors))
        if appends:
            log.warning("WriteTxnMarkers: %s", ", ".join(written))
            failed = ErrorCode.kafka_storage_error.value
            try:
                commit = self.apis.persister.append(appends)
            except StorageFailedError as exc:
                log.error("WriteTxnMarkers: writing the markers failed: %s", exc)
                ok = False
            else:
                for a in appends:
                    state.apply(a, ticket=commit)
                ok = await _wait(commit)
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
