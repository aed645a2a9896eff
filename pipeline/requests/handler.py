"""KafkaApis and the RequestHandler loop: validate, sequence, hand on.

``KafkaApis.handle`` dispatches by api key, as Kafka's KafkaApis does.
ApiVersions, Metadata and InitProducerId are answered at once. Produce is
validated (topic-partition exists, acks legal, every RecordBatch v2 CRC
checked, records counted but not decoded), sequenced (offsets assigned per
topic-partition) and handed to the batching persister *without waiting* for
it: the response is completed from the persister's callback once the flush
holding the records is durable, and the connection's ResponseSequencer puts it
back in request order. So the handler is free for the connection's next
request at once (AutoMQ's pipeline, seed 004).

Offsets are assigned and the appends given to the persister with no ``await``
in between, so the persister's groups hold every partition's offsets in order
whatever the number of handlers.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterator

import trio
from kio.schema.errors import ErrorCode

from pipeline.cluster.membership import Cluster
from pipeline.log.manager import LogManager
from pipeline.observe.structured_logs import log_context
from pipeline.log.batch import PartitionAppend
from pipeline.persist.persister import BatchingPersister, Commit, StorageFailedError
from pipeline.protocol import apis
from pipeline.protocol.apis import BrokerInfo, PartitionResult, ProducePartition
from pipeline.protocol.errors import InvalidRequestError, RecordError
from pipeline.protocol.header import RequestHeader
from pipeline.protocol.records import (RecordsInfo, has_compressed_batch, summarize_records,
                                       validate_records)
from pipeline.requests.catalog import TopicCatalog
from pipeline.network.request_channel import ConnectionHandle, Request, RequestChannel, release_requests
from pipeline.network.request_metrics import RequestMetrics, add_error
from pipeline.log.producer_state import BatchMetadata, RefusedPartitions, UnknownProducers, Verdict
from pipeline.security.acl import CLUSTER_NAME, AclOperation, Authorizer, ResourceType
from pipeline.requests.acl_apis import authorize_request

if TYPE_CHECKING:
    from pipeline.requests.txn_apis import TransactionApis

log = logging.getLogger(__name__)

_SEQUENCE_GAPS = frozenset({ErrorCode.out_of_order_sequence_number.value})
"""What Kafka's sequence rules answer a batch that does not follow the last one (``ProducerStateManager.check``;
a producer with no state here is ``UnknownProducers``' case)."""

API_VERSIONS, METADATA, PRODUCE, INIT_PRODUCER_ID = 18, 3, 0, 22
TRANSACTION_APIS = frozenset({24, 25, 26, 27, 28, 61, 65, 66})
"""AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit, DescribeTransactions, ListTransactions."""
PRE_AUTHENTICATION_APIS = frozenset({API_VERSIONS, 17, 36})
"""What a SASL_* connection is served before it authenticates: ApiVersions, SaslHandshake,
SaslAuthenticate (Kafka SaslServerAuthenticator; pipeline/requests/sasl_apis.py)."""
ApiHandler = Callable[[Request], Awaitable[None]]
"""Serves one api: see ``KafkaApis.register``."""
MIN_PRODUCE_TIMEOUT_MS = 1000
"""Produce timeouts below this (ms) are raised to it: durability takes at least an fsync."""
TIMEOUT_CHECK_INTERVAL_S = 0.1
"""How often produce timeouts are checked while a produce waits (s); the most a timeout is late by."""
ITEMS_PER_CHECKPOINT = 8
"""Queue items a RequestHandler takes that were queued already before it lets other tasks run."""
PlainProduce = tuple[Request, int, float, list[tuple[str, int, bytes, int, int]]]
"""``KafkaApis.plain_produce``: (request, acks, deadline (trio time, s), [(topic, partition,
records, record count, uncompressed bytes)])."""
MERGED_APPEND_MAX_BYTES = 1 << 20
"""Largest append (bytes of records) a produce run merges one topic-partition's requests into:
the size of one large produce request (Kafka's ``message.max.bytes`` default, ~1 MiB), so a fetch
served from the WAL, which returns whole appends, is never larger because of the merge."""


@dataclass(slots=True)
class HandlerStats:
    """Counters since start.

    ``bytes_in`` and ``messages_in`` are per topic: the RecordBatch bytes (as
    sent, compressed or not) and the records handed to the persister, Kafka
    BrokerTopicStats BytesInPerSec and MessagesInPerSec. Duplicates of an
    idempotent producer and refused partitions are not counted.
    """

    requests: int = 0
    produce_requests: int = 0
    records: int = 0
    partition_errors: int = 0
    bytes_in: dict[str, int] = field(default_factory=dict)
    messages_in: dict[str, int] = field(default_factory=dict)


class KafkaApis:
    """The request logic shared by every RequestHandler of a server.

    Args:
        broker: this broker's node id, advertised host/port and cluster id.
        catalog: topics and their partition counts.
        logs: the partitions' logs (``pipeline.log.manager.LogManager``):
            produce sequences against its ``state`` (log end offsets and
            idempotent producer state, recovered at start).
        persister: where sequenced appends go.
        first_producer_id: first id InitProducerId hands out; the server seeds
            it from the wall clock (ms) so ids are not reused across restarts.
            In a cluster of N brokers the k-th id is ``k * N + index`` from k =
            ``first_producer_id`` (``pipeline.cluster.membership.Cluster.producer_id``).
        producer_ids: where ids come from instead (``first_producer_id`` is then unused):
            with a shared metadata database, blocks claimed from it
            (``pipeline.metadata.producer_ids.ProducerIdManager``), unique across hosts.
        yield_before_sequencing: let other handlers run between parsing and
            sequencing a produce, as a preempted pool thread would (set for
            the shared-queue modes).
        request_metrics: where complete responses' error codes are counted
            (the RequestChannel's; a fresh one if None).
        authorizer: the ACLs every api checks (``authorize``); None: no
            authorizer, everything allowed (Kafka's default).
    """

    def __init__(
        self,
        broker: BrokerInfo,
        catalog: TopicCatalog,
        logs: LogManager,
        persister: BatchingPersister,
        first_producer_id: int,
        yield_before_sequencing: bool = False,
        request_metrics: RequestMetrics | None = None,
        authorizer: Authorizer | None = None,
        producer_ids: Iterator[int] | None = None,
    ) -> None:
        self.broker = broker
        self.catalog = catalog
        self.logs = logs
        self.persister = persister
        self.yield_before_sequencing = yield_before_sequencing
        # In a static cluster the ids are interleaved (k * N + this broker's index) so brokers never
        # collide; leadership through the database passes producer_ids (blocks from the database).
        cluster = broker.cluster
        self._producer_ids: Iterator[int] = (
            producer_ids if producer_ids is not None
            else map(cluster.producer_id, itertools.count(first_producer_id))
            if isinstance(cluster, Cluster) and cluster.size > 1
            else itertools.count(first_producer_id))
        self._deadlines: list[tuple[float, int, PendingProduce]] = []
        self._deadline_seq = itertools.count()
        self._deadline_added = trio.Event()
        # Compressed records are inflated (up to MAX_UNCOMPRESSED_BATCH_BYTES)
        # in a worker thread, one at a time: the event loop keeps serving
        # every other connection meanwhile (zlib, lz4 and zstd release the
        # GIL), and the memory bound counts one inflated batch.
        self._inflate_limiter = trio.CapacityLimiter(1)
        # Partitions whose last produce from a connection was refused unwritten: a pipelined batch behind
        # it gets that error again rather than OUT_OF_ORDER_SEQUENCE_NUMBER (RefusedPartitions).
        self._refused = RefusedPartitions()
        self._unknown_producers = UnknownProducers()
        # Sequence gaps after a take-over, refused retriably a few times before Kafka's rule (the same
        # bounded count as UnknownProducers'); see ``_gap_after_take_over``.
        self._take_over_gaps = UnknownProducers()
        self.stats = HandlerStats()
        self.request_metrics = request_metrics if request_metrics is not None else RequestMetrics()
        self._produce_errors = self.request_metrics.errors(PRODUCE)
        self._served: dict[int, ApiHandler] = {}
        self.is_authenticated: Callable[[ConnectionHandle], bool] = lambda connection: False
        """Whether a SASL_* connection completed authentication; no one has until SASL is served
        (``serve_sasl``)."""
        self.authorizer = authorizer
        self.transactions: TransactionApis | None = None
        """The transaction coordinator (``serve_transactions``); None: transactions are not served
        (a cluster of brokers) and their apis are not advertised."""

    def serve_sasl(self, is_authenticated: Callable[[ConnectionHandle], bool]) -> None:
        """SASL is served (``pipeline.requests.sasl_apis.SaslApis.register``): ``is_authenticated``
        says whether a SASL_* connection completed authentication (until then it may send only
        ApiVersions, SaslHandshake and SaslAuthenticate, Kafka's ``SaslServerAuthenticator``)."""
        self.is_authenticated = is_authenticated

    def serve_transactions(self, coordinator: TransactionApis) -> None:
        """Transactions are served by ``coordinator`` (``TransactionApis.register``): transactional
        produce and InitProducerId go to it, and ApiVersions advertises the transaction apis."""
        self.transactions = coordinator

    @property
    def withheld(self) -> frozenset[int]:
        """Api keys ApiVersions leaves out: the transaction apis while no coordinator runs."""
        return frozenset() if self.transactions is not None else TRANSACTION_APIS

    def next_producer_id(self) -> int:
        """A producer id no one has (InitProducerId; see ``first_producer_id``)."""
        return next(self._producer_ids)

    def authorize(self, request: Request, operation: AclOperation, resource_type: ResourceType, name: str,
                  log_denied: bool = True) -> bool:
        """May the request's principal (from its peer host) do ``operation`` on resource ``name``?

        The one check every api uses (Kafka ``AuthHelper.authorize``). With no
        authorizer (``authorizer.class.name`` empty, the default) everything is
        allowed, as in Kafka; denials are logged (``pipeline.requests.acl_apis``).
        """
        if self.authorizer is None:
            return True
        return authorize_request(self.authorizer, request, operation, resource_type, name, log_denied)

    def register(self, api_key: int, handler: "ApiHandler") -> None:
        """Serve ``api_key`` with ``handler`` (the read side, the group coordinator, admin).

        ``handler(request)`` must complete ``request`` on its connection
        exactly once, now or later (``request.connection.complete(request.token,
        payload)``); it may raise InvalidRequestError, which closes the
        connection with the reason. Its version range is
        ``pipeline.protocol.apis.SUPPORTED_VERSIONS`` (checked by ``decode_request``).

        Raises:
            ValueError: ``api_key`` is already served.
        """
        if api_key in self._served or api_key in (PRODUCE, API_VERSIONS, METADATA, INIT_PRODUCER_ID):
            raise ValueError(f"api key {api_key} is already served")
        self._served[api_key] = handler

    async def handle(self, request: Request) -> None:
        """Handle one request; its response is completed on its connection (now or later).

        A request that cannot be parsed closes its connection with the reason.
        """
        self.stats.requests += 1
        header = request.header
        try:
            if (header.api_key not in PRE_AUTHENTICATION_APIS and request.connection.security_protocol.startswith("SASL_")
                    and not self.is_authenticated(request.connection)):
                # Kafka SaslServerAuthenticator: IllegalSaslStateException, the connection is closed.
                raise InvalidRequestError(f"ILLEGAL_SASL_STATE: {apis.api_name(header.api_key)} request "
                                          "before SASL authentication completed")
            if header.api_key == PRODUCE:
                await self._produce(request)
            elif header.api_key == API_VERSIONS:
                payload, software = apis.api_versions_response(
                    header, request.frame, self.request_metrics.errors(API_VERSIONS), self.withheld)
                if software is not None:
                    request.connection.identified(software)
                    log.info("connection %s: client %s %s", request.connection.connection_id, *software)
                request.connection.complete(request.token, payload)
            elif header.api_key == METADATA:
                body = apis.decode_request(header, request.frame)
                request.connection.complete(
                    request.token, apis.metadata_response(header, body,
                                                          self.broker.for_listener(request.connection.listener),
                                                          self.catalog if self.authorizer is None
                                                          else _AuthorizedTopics(self, request),
                                                          self.request_metrics.errors(METADATA))
                )
            elif header.api_key == INIT_PRODUCER_ID:
                await self._init_producer_id(request)
            elif header.api_key in self._served:
                await self._served[header.api_key](request)
            else:
                raise InvalidRequestError(f"api key {header.api_key} ({apis.api_name(header.api_key)}) is not served")
        except InvalidRequestError as exc:
            request.connection.close(
                f"invalid request (api key {header.api_key} v{header.api_version}, "
                f"correlation id {header.correlation_id}): {exc}"
            )
            request.connection.complete(request.token, None)

    @property
    def produce_runs(self) -> bool:
        """Whether handlers take Produce requests through ``plain_produce`` and ``sequence_run``:
        not with ``yield_before_sequencing``, whose ablation needs a scheduling point per request."""
        return not self.yield_before_sequencing

    def runs_allowed(self, connection: ConnectionHandle) -> bool:
        """Whether Produce requests of ``connection`` may go through ``plain_produce`` now: it
        has authenticated (SASL), and ``buffer.memory`` has room (else ``handle`` waits for it).
        Unchanged while nothing awaits, since only ``sequence_run`` adds to the buffer."""
        return ((not connection.security_protocol.startswith("SASL_") or self.is_authenticated(connection))
                and self.persister.has_capacity)

    def plain_produce(self, request: Request, checked: dict[tuple[str, int], bool], writable: dict[str, bool],
                      ) -> PlainProduce | None:
        """A Produce request ``sequence_run`` may take with others, read and checked; None for
        any other request (``handle`` serves it, with its errors). Ask ``runs_allowed`` first.

        Plain: no transactional id, acks 0/1/-1, every partition known, led here and writable,
        its records uncompressed, valid and from a producer that is not idempotent.
        ``checked`` and ``writable`` are the run's memo of partition checks
        (topic-partition -> may be appended to) and TOPIC Write authorizations (topic ->
        allowed): valid only while nothing awaits, so a caller clears them when the run ends.
        Never raises for bad input.
        """
        body = apis.plain_produce_body(request.header, request.frame)
        if body is None:
            return None
        acks, timeout_ms, parts = body
        for part in parts:
            key = part[:2]  # (topic, partition)
            ok = checked.get(key)
            if ok is None:
                topic, partition = key
                if topic not in writable:
                    writable[topic] = self.authorize(request, AclOperation.WRITE, ResourceType.TOPIC, topic)
                ok = checked[key] = self._check_partition(acks, topic, partition, writable[topic]) == 0
            if not ok:
                return None
        deadline = request.received_at + max(timeout_ms, MIN_PRODUCE_TIMEOUT_MS) / 1000.0
        self.stats.requests += 1
        return request, acks, deadline, parts

    def plain_produces(self, requests: list[Request], start: int, checked: dict[tuple[str, int], bool],
                       now: float) -> tuple[list[PlainProduce], int]:
        """``plain_produce`` of ``requests[start:]`` while each is a plain Produce request whose
        partitions are all checked True in ``checked`` (the run's memo), in one C call
        (``apis.plain_produce_run``), each request's ``dequeued_at`` set to ``now``: the
        PlainProduces, and the index of the first request left to ``plain_produce`` or
        ``handle``. Ask ``runs_allowed`` first; the same results as ``plain_produce`` one by one."""
        plains, end = apis.plain_produce_run(requests, start, checked, now, MIN_PRODUCE_TIMEOUT_MS)
        self.stats.requests += len(plains)
        return plains, end

    def sequence_run(self, run: list[PlainProduce]) -> None:
        """Sequence a run of ``plain_produce`` requests, in order, as ``handle`` would one by one.

        Offsets are assigned request by request with no ``await`` in between, and each
        topic-partition's records of consecutive requests become one append (a
        ``PartitionAppend`` holds several batches; at most ``MERGED_APPEND_MAX_BYTES``), all
        handed to the persister in one call: the persister, the WAL index and the table's
        decode then work per append rather than per request. Each request gets the response
        ``handle`` would give it: the same base offsets, completed once its records are durable
        (acks 1/-1, or REQUEST_TIMED_OUT at its timeout) or at once (acks=0). If the WAL has
        failed every partition gets KAFKA_STORAGE_ERROR (acks=0: the connection is closed).
        A persistence failure of acks=0 records is logged once per run.
        """
        state = self.logs.state
        assign = state.offsets.assign
        merged: dict[tuple[str, int], list[Any]] = {}  # topic-partition -> its open merge
        merges: list[list[Any]] = []  # [topic, partition, base, [records], count, uncompressed, bytes]
        bases: list[list[int]] = []
        for _request, _acks, _deadline, parts in run:
            request_bases = []
            for topic, partition, records, count, uncompressed in parts:
                base = assign(topic, partition, count)
                request_bases.append(base)
                m = merged.get((topic, partition))
                if m is None or m[6] + len(records) > MERGED_APPEND_MAX_BYTES:
                    m = merged[(topic, partition)] = [topic, partition, base, [], 0, 0, 0]
                    merges.append(m)
                m[3].append(records)
                m[4] += count
                m[5] += uncompressed
                m[6] += len(records)
            bases.append(request_bases)
        now_ms = int(time.time() * 1000)
        appends = [PartitionAppend(topic, partition, base, parts[0] if len(parts) == 1 else b"".join(parts),
                                   count, now_ms, -1, -1, -1, uncompressed)
                   for topic, partition, base, parts, count, uncompressed, _size in merges]
        stats = self.stats
        stats.produce_requests += len(run)
        try:
            commit: Commit | None = self.persister.append(appends)
        except StorageFailedError:
            commit = None
        else:
            bytes_in, messages_in = stats.bytes_in, stats.messages_in
            for a in appends:
                state.apply(a, ticket=commit)
                stats.records += a.record_count
                bytes_in[a.topic] = bytes_in.get(a.topic, 0) + len(a.records)
                messages_in[a.topic] = messages_in.get(a.topic, 0) + a.record_count
        unacked_logged = False
        lease_current = self._lease_current
        unanswered: list[int] = []  # tokens of acks=0 requests of ``unanswered_on``
        unanswered_on: ConnectionHandle | None = None
        for (request, acks, deadline, parts), request_bases in zip(run, bases):
            connection, token = request.connection, request.token
            if commit is None:
                stats.partition_errors += len(parts)
            if acks == 0:
                if connection is not unanswered_on:
                    if unanswered_on is not None:
                        unanswered_on.complete_without_response(unanswered)
                    unanswered, unanswered_on = [], connection
                unanswered.append(token)
                if commit is None:
                    # As ``_produce``: the connection is closed to tell the client, the errors counted.
                    for _ in parts:
                        add_error(self._produce_errors, ErrorCode.kafka_storage_error.value)
                    connection.close(f"acks=0 produce failed for {len(parts)} partition(s), "
                                     f"first error code {ErrorCode.kafka_storage_error.value}")
                elif not unacked_logged:
                    unacked_logged = True
                    commit.add_callback(functools.partial(
                        _log_unacked_failure, (connection.connection_id, request.header.correlation_id)))
                continue
            if commit is None:
                results = [PartitionResult(topic, partition, ErrorCode.kafka_storage_error.value)
                           for topic, partition, *_ in parts]
            else:
                results = [PartitionResult(p[0], p[1], 0, base_offset=b, log_start_offset=0)
                           for p, b in zip(parts, request_bases)]
            pending = PendingProduce(connection, token, request.header, results, self._produce_errors, lease_current)
            if commit is not None:
                pending.wait_for(commit, list(range(len(results))))
            if not pending.start():
                self._add_deadline(deadline, pending)
        if unanswered_on is not None:
            unanswered_on.complete_without_response(unanswered)

    async def _init_producer_id(self, request: Request) -> None:
        header = request.header
        body = apis.decode_request(header, request.frame)
        if getattr(body, "transactional_id", None) is not None and self.transactions is not None:
            await self.transactions.init_producer_id(request, body, True)
            return
        if getattr(body, "transactional_id", None) is not None:
            # No transaction coordinator runs here (leadership through the database).
            error = ErrorCode.transactional_id_authorization_failed.value
            payload = apis.init_producer_id_response(header, body, -1, -1, error)
        elif not self._may_write_idempotently(request):
            error = ErrorCode.cluster_authorization_failed.value
            payload = apis.init_producer_id_response(header, body, -1, -1, error)
        else:
            error = ErrorCode.none.value
            payload = apis.init_producer_id_response(header, body, next(self._producer_ids), 0)
        add_error(self.request_metrics.errors(INIT_PRODUCER_ID), error)
        request.connection.complete(request.token, payload)

    def _may_write_idempotently(self, request: Request) -> bool:
        """KIP-679 (Kafka ``handleInitProducerIdRequest``): an idempotent producer id needs
        CLUSTER IdempotentWrite, or Write on some topic."""
        if self.authorizer is None or self.authorize(
                request, AclOperation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME, log_denied=False):
            return True
        connection = request.connection
        if self.authorizer.any_resource_allowed(connection.principal, connection.peer_host, AclOperation.WRITE,
                                                ResourceType.TOPIC):
            return True
        return self.authorize(request, AclOperation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME)

    async def _produce(self, request: Request) -> None:
        header = request.header
        view = apis.decode_produce(header, request.frame)
        self.stats.produce_requests += 1
        if self.yield_before_sequencing:
            # A scheduling point between parsing and sequencing, where a thread
            # of Kafka's handler pool could be preempted. With a shared queue
            # and no mute it lets two handlers sequence one connection's
            # requests out of order: the hazard the benchmark's shared-unmuted
            # ablation must expose. A queue with one handler has no such race.
            await trio.lowlevel.checkpoint()
        results: list[PartitionResult] = []
        transactional = False  # records of a transaction: acknowledged at the WAL (pipeline.persist.persister)
        checked: list[tuple[int, ProducePartition, RecordsInfo]] = []
        writable: dict[str, bool] = {}  # topic -> TOPIC Write allowed (Kafka authorizes each topic once)
        # Kafka handleProduceRequest: a transactional produce needs TRANSACTIONAL_ID Write first.
        txn_allowed = view.transactional_id is None or self.authorize(
            request, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, view.transactional_id)
        for part in view.partitions:
            if part.topic not in writable:
                writable[part.topic] = self.authorize(request, AclOperation.WRITE, ResourceType.TOPIC, part.topic)
            error = (self._check_partition(view.acks, part.topic, part.partition, writable[part.topic]) if txn_allowed
                     else ErrorCode.transactional_id_authorization_failed.value)
            if error == ErrorCode.none.value:
                try:
                    # The usual request in one C call; compressed batches are inflated off the event loop.
                    info = summarize_records(part.records) if part.records else None
                    if info is not None:
                        pass
                    elif has_compressed_batch(part.records):
                        info = await trio.to_thread.run_sync(validate_records, part.records, header.api_version,
                                                             limiter=self._inflate_limiter)
                    else:
                        info = validate_records(part.records, header.api_version)
                    if info.is_transactional and self.transactions is None:
                        error = ErrorCode.transactional_id_authorization_failed.value
                    elif info.is_transactional and self.transactions is not None and (
                            error := await self.transactions.verify_produce(
                                view.transactional_id, info.producer_id, info.producer_epoch, part.topic,
                                part.partition)):
                        pass  # not in the producer's ongoing transaction, or fenced
                    else:
                        transactional = transactional or info.is_transactional
                        checked.append((len(results), part, info))
                except RecordError as exc:
                    error = exc.error_code
                    self._log_partition_error(request, part, exc)
            results.append(PartitionResult(part.topic, part.partition, error, log_start_offset=0))

        deadline = request.received_at + max(view.timeout_ms, MIN_PRODUCE_TIMEOUT_MS) / 1000.0
        # has_capacity first: the usual case, without a coroutine per request.
        if checked and not self.persister.has_capacity:
            if await self.persister.wait_for_capacity(deadline):
                # Leadership may have moved while this waited (pipeline.cluster.service): not sequenced here then.
                for index, part, _info in checked:
                    if not self.broker.leads(part.topic, part.partition):
                        results[index] = PartitionResult(part.topic, part.partition,
                                                         ErrorCode.not_leader_or_follower.value)
                checked = [c for c in checked if not results[c[0]].error_code]
            else:
                # Persistence is stalled (Spark down, buffer.memory full): answer
                # within the request's timeout rather than hold it (Kafka
                # REQUEST_TIMED_OUT); nothing of it was sequenced or stored.
                log.warning("connection %s: produce timed out waiting for persister memory (buffer.memory full)",
                            request.connection.connection_id)  # the correlation id is on the line (pipeline.observe.structured_logs)
                for index, part, _info in checked:
                    results[index] = PartitionResult(part.topic, part.partition, ErrorCode.request_timed_out.value,
                                                     error_message="persistence stalled: buffer.memory full")
                checked = []
        # From here to persister.append: no await, so offsets, producer state
        # and the persister's groups all see requests in the same order.
        appends: list[PartitionAppend] = []
        appended: list[int] = []  # result indices of ``appends``
        duplicates: list[tuple[int, BatchMetadata]] = []
        now_ms = int(time.time() * 1000)
        state = self.logs.state
        transactions = self.transactions
        refused, connection_id = self._refused, request.connection.connection_id
        for index, part, info in checked:
            # KIP-890 part 1: the transaction is checked again here, where nothing awaits before the
            # append. An EndTxn may have run during the wait for persister memory above: its marker is
            # written, and a batch appended after it would open a transaction no EndTxn ends.
            if info.is_transactional and transactions is not None and (
                    error := transactions.check_produce(view.transactional_id, info.producer_id,
                                                        info.producer_epoch, part.topic, part.partition)):
                results[index] = PartitionResult(part.topic, part.partition, error)
                continue
            verdict = state.producers.check(info.producer_id, info.producer_epoch, part.topic,
                                           part.partition, info.base_sequence, info.last_sequence)
            after_take_over = (self._gap_after_take_over(info.producer_id, part.topic, part.partition,
                                                         info.base_sequence)
                               if verdict.verdict is Verdict.ERROR and verdict.error_code in _SEQUENCE_GAPS else None)
            if after_take_over:
                log.info("%s-%d: producer %d epoch %d batch of sequences %d-%d leaves a gap after the batches the "
                         "take-over brought: refused (NOT_LEADER_OR_FOLLOWER) while the batches between may still "
                         "come", part.topic, part.partition, info.producer_id, info.producer_epoch,
                         info.base_sequence, info.last_sequence)
                results[index] = PartitionResult(part.topic, part.partition, ErrorCode.not_leader_or_follower.value)
                continue
            if (after_take_over is None and verdict.verdict is Verdict.ERROR
                    and verdict.error_code in _SEQUENCE_GAPS and refused
                    and (earlier := refused.gap_error(connection_id, part.topic, part.partition)) is not None):
                # A batch pipelined behind one refused unwritten: the same answer, so the client retries
                # both in order (RefusedPartitions), not an epoch bump that renumbers what it sent.
                log.info("%s-%d: producer %d epoch %d batch of sequences %d-%d follows one refused on this "
                         "connection: answered %s as it was", part.topic, part.partition, info.producer_id,
                         info.producer_epoch, info.base_sequence, info.last_sequence, ErrorCode(earlier).name.upper())
                results[index] = PartitionResult(part.topic, part.partition, earlier)
                continue
            if verdict.verdict is Verdict.ERROR:
                # As Kafka's ReplicaManager logs a failed append (OutOfOrderSequenceException, ...), with
                # the batches this broker knows of the producer here (epoch, sequences @ base offset).
                known = state.producers.batches(info.producer_id, part.topic, part.partition)
                log.info("%s-%d: producer %d epoch %d batch of sequences %d-%d refused (%s); known here: epoch %s, %s",
                         part.topic, part.partition, info.producer_id, info.producer_epoch, info.base_sequence,
                         info.last_sequence, ErrorCode(verdict.error_code).name.upper(),
                         state.producers.epoch(info.producer_id, part.topic, part.partition),
                         ", ".join(f"{b.first_seq}-{b.last_seq}@{b.base_offset}" for b in known) or "no batch")
                results[index] = PartitionResult(part.topic, part.partition, verdict.error_code)
                continue
            if verdict.unknown_producer:
                # Its earlier batches of the partition are not here: refused a few times, retriably, while
                # they may still come (a leadership move), then accepted as Kafka does (UnknownProducers).
                refuse = self._unknown_producers.refuse(info.producer_id, part.topic, part.partition,
                                                        info.base_sequence)
                log.info("%s-%d: producer %d epoch %d batch of sequences %d-%d, with no state of the producer "
                         "here: %s", part.topic, part.partition, info.producer_id, info.producer_epoch,
                         info.base_sequence, info.last_sequence,
                         "refused (NOT_LEADER_OR_FOLLOWER) while its earlier batches may still come" if refuse
                         else "accepted")
                if refuse:
                    results[index] = PartitionResult(part.topic, part.partition,
                                                     ErrorCode.not_leader_or_follower.value)
                    continue
            elif info.producer_id >= 0:
                self._unknown_producers.appended(info.producer_id, part.topic, part.partition)
                self._take_over_gaps.appended(info.producer_id, part.topic, part.partition)
            if refused:
                refused.accepted(connection_id, part.topic, part.partition)
            if verdict.verdict is Verdict.DUPLICATE:
                assert verdict.duplicate is not None
                duplicates.append((index, verdict.duplicate))
                results[index] = PartitionResult(part.topic, part.partition, 0,
                                                 base_offset=verdict.duplicate.base_offset, log_start_offset=0)
                continue
            base = state.offsets.assign(part.topic, part.partition, info.record_count)
            appends.append(PartitionAppend(part.topic, part.partition, base, part.records or b"",
                                           info.record_count, now_ms, info.producer_id,
                                           info.producer_epoch, info.base_sequence,
                                           info.uncompressed_bytes))
            appended.append(index)
            results[index] = PartitionResult(part.topic, part.partition, 0, base_offset=base, log_start_offset=0)
        commit = None
        if appends:
            try:
                commit = self.persister.append(appends, at_wal=transactional)
            except StorageFailedError:
                for index in appended:
                    r = results[index]
                    results[index] = PartitionResult(r.topic, r.partition, ErrorCode.kafka_storage_error.value)
                appends, appended = [], []
            else:
                for a in appends:
                    state.apply(a, ticket=commit)
                stats = self.stats
                bytes_in, messages_in = stats.bytes_in, stats.messages_in
                for a in appends:
                    stats.records += a.record_count
                    bytes_in[a.topic] = bytes_in.get(a.topic, 0) + len(a.records)
                    messages_in[a.topic] = messages_in.get(a.topic, 0) + a.record_count
        failed = [r for r in results if r.error_code]
        if failed:
            self.stats.partition_errors += len(failed)
            for r in failed:
                refused.refused(connection_id, r.topic, r.partition, r.error_code)

        connection, token = request.connection, request.token
        if view.acks == 0:
            connection.complete(token, None)
            if commit is not None:
                commit.add_callback(functools.partial(_log_unacked_failure, log_context.get()))
            if failed:
                # acks=0 clients never read a response, so Kafka closes the
                # connection to tell them something went wrong (and counts the
                # errors of the response it did not send).
                for r in results:
                    add_error(self._produce_errors, r.error_code)
                connection.close(f"acks=0 produce failed for {len(failed)} partition(s), "
                                 f"first error code {failed[0].error_code}")
            return
        pending = PendingProduce(connection, token, header, results, self._produce_errors, self._lease_current)
        if commit is not None:
            pending.wait_for(commit, appended)
        for index, batch in duplicates:
            if isinstance(batch.ticket, Commit):
                pending.wait_for(batch.ticket, [index])
        if pending.start():
            return
        self._add_deadline(deadline, pending)

    def _add_deadline(self, deadline: float, pending: PendingProduce) -> None:
        """``pending`` times out at ``deadline`` (trio time, s) unless answered before; wakes
        ``run_timeouts`` when nothing was waiting."""
        heapq.heappush(self._deadlines, (deadline, next(self._deadline_seq), pending))
        if len(self._deadlines) == 1:
            self._deadline_added.set()

    async def run_timeouts(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Answer produce requests not durable within their timeout (REQUEST_TIMED_OUT); runs until
        cancelled. Checks every ``TIMEOUT_CHECK_INTERVAL_S`` until the last produce's timeout passed
        (answered or not), then sleeps until the next produce: an idle broker does not wake for it."""
        task_status.started()
        deadlines = self._deadlines
        while True:
            if not deadlines:
                await self._deadline_added.wait()
                self._deadline_added = trio.Event()
            await trio.sleep(TIMEOUT_CHECK_INTERVAL_S)
            now = trio.current_time()
            while deadlines and deadlines[0][0] <= now:
                heapq.heappop(deadlines)[2].time_out()  # nothing for one answered already

    @property
    def _lease_current(self) -> Callable[[], bool] | None:
        """With leadership through the database: whether this broker's membership lease is still
        current (``DynamicCluster.lease_current``, on trio's clock); None: no lease to run out."""
        lease_current = getattr(self.broker.cluster, "lease_current", None)
        if lease_current is None:
            return None
        return lambda: lease_current(trio.current_time())

    @staticmethod
    def _log_partition_error(request: Request, part: ProducePartition, exc: Exception) -> None:
        log.warning("connection %s: %s-%d: %s", request.connection.connection_id, part.topic, part.partition, exc)

    def _check_partition(self, acks: int, topic: str, partition: int, writable: bool = True) -> int:
        if acks not in (0, 1, -1):
            return ErrorCode.invalid_required_acks.value
        if not writable:  # Kafka handleProduceRequest: authorization before existence
            return ErrorCode.topic_authorization_failed.value
        count = self.catalog.partitions(topic)
        if count is None or not 0 <= partition < count:
            return ErrorCode.unknown_topic_or_partition.value
        if not self.broker.leads(topic, partition):
            # Another broker of the cluster leads it: the client refreshes its metadata (Kafka ReplicaManager).
            return ErrorCode.not_leader_or_follower.value
        return ErrorCode.none.value

    def _gap_after_take_over(self, producer_id: int, topic: str, partition: int, first_seq: int) -> bool | None:
        """Whether to refuse, retriably, a batch whose sequence leaves a gap (Kafka's rule:
        OUT_OF_ORDER_SEQUENCE_NUMBER) once more because the producer's last batch known here came with
        the partition's take-over (``LogManager.taken_over_at``), not from an append here; None where
        this rule does not apply (``RefusedPartitions``' may). False: Kafka's answer, at once.

        The failover test's duplicates (session 57): the previous leader refused a producer's batch
        unwritten (NOT_LEADER_OR_FOLLOWER, it had lost the partition) while librdkafka sent the next
        one to the new leader, on another connection, first. Answered OUT_OF_ORDER_SEQUENCE_NUMBER,
        librdkafka bumps its epoch and renumbers, on every partition, what it has not seen acknowledged,
        including batches a paused broker wrote unanswered: written twice. Refused retriably, the client
        retries the partition's batches in order. The same batch refused ``UNKNOWN_PRODUCER_REFUSALS``
        times in a row gets Kafka's answer (the batches between are not coming); a gap behind a batch
        appended here gets it at once. Only where leadership moves (a take-over happened)."""
        start = self.logs.taken_over_at(topic, partition)
        if start is None:
            return None
        known = self.logs.state.producers.batches(producer_id, topic, partition)
        if not known or known[-1].base_offset >= start:
            return None
        return self._take_over_gaps.refuse(producer_id, topic, partition, first_seq)


class _AuthorizedTopics:
    """The catalog as one Metadata request's principal may see it (Kafka ``handleTopicMetadataRequest``).

    A named topic without TOPIC Describe gets TOPIC_AUTHORIZATION_FAILED; all-topics
    listings leave such topics out (not logged: Kafka's ``logIfDenied = false``).
    Auto-creating a missing topic needs CLUSTER Create or TOPIC Create, else
    TOPIC_AUTHORIZATION_FAILED.
    """

    def __init__(self, kafka_apis: KafkaApis, request: Request) -> None:
        self._apis = kafka_apis
        self._request = request

    def describe(self, name: str, auto_create: bool) -> tuple[int, int]:
        authorize, request, catalog = self._apis.authorize, self._request, self._apis.catalog
        if not authorize(request, AclOperation.DESCRIBE, ResourceType.TOPIC, name):
            return ErrorCode.topic_authorization_failed.value, 0
        if (auto_create and catalog.auto_create and catalog.partitions(name) is None
                and not authorize(request, AclOperation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME, log_denied=False)
                and not authorize(request, AclOperation.CREATE, ResourceType.TOPIC, name)):
            return ErrorCode.topic_authorization_failed.value, 0
        return catalog.describe(name, auto_create)

    def all_topics(self) -> dict[str, int]:
        return {name: count for name, count in self._apis.catalog.all_topics().items()
                if self._apis.authorize(self._request, AclOperation.DESCRIBE, ResourceType.TOPIC, name,
                                        log_denied=False)}


def _log_unacked_failure(ids: tuple[str | None, int | None], commit: Commit) -> None:
    """Commit callback (the persister's task): ``ids`` are the request's (connection id, correlation id)."""
    if commit.error is not None:
        log.error("acks=0 records could not be persisted: %s", commit.error,
                  extra={"connection_id": ids[0], "correlation_id": ids[1]})


class PendingProduce:
    """A produce (acks 1/-1) waiting for durability of its records, or its timeout.

    Its response is completed exactly once: when every Commit it waits for has
    resolved (partitions of a failed Commit get KAFKA_STORAGE_ERROR), or at its
    timeout, when partitions not yet durable get REQUEST_TIMED_OUT. Never
    success for a record that is not durable, nor once ``lease_current`` says this
    broker's membership lease may have run out: another broker may lead the
    partition by now. Records durable by then are answered REQUEST_TIMED_OUT, as
    Kafka answers acks=all records appended but not acknowledged in time: "possibly
    persisted" to the client, which retries them with the same sequence numbers (the
    new leader answers a duplicate for those in the table); NOT_LEADER_OR_FOLLOWER
    would tell it "not written" (librdkafka: RD_KAFKA_MSG_STATUS_NOT_PERSISTED),
    which is false for them. Each partition's error code is then counted in
    ``errors`` (Kafka ``ProduceResponse.errorCounts``).
    """

    __slots__ = ("connection", "token", "header", "results", "waiting", "answered", "_durable", "_errors",
                 "_lease_current")

    def __init__(self, connection: ConnectionHandle, token: int, header: RequestHeader, results: list[PartitionResult],
                 errors: dict[int, int] | None = None, lease_current: Callable[[], bool] | None = None) -> None:
        self.connection = connection
        self.token = token
        self.header = header
        self.results = results
        self.waiting = 0
        self.answered = False
        self._durable = [r.error_code != 0 for r in results]  # error results need no wait
        self._errors = errors
        self._lease_current = lease_current

    def wait_for(self, commit: Commit, indices: list[int]) -> None:
        for i in indices:
            self._durable[i] = False
        self.waiting += 1
        commit.add_callback(lambda c: self._on_commit(c, indices))

    def start(self) -> bool:
        """Answer now if nothing needs waiting for; True if answered."""
        if self.waiting == 0:
            self._answer()
        return self.answered

    def _on_commit(self, commit: Commit, indices: list[int]) -> None:
        for i in indices:
            self._durable[i] = True
            if commit.error is not None:
                r = self.results[i]
                self.results[i] = PartitionResult(
                    r.topic, r.partition, ErrorCode.kafka_storage_error.value,
                    error_message=f"records could not be persisted: {commit.error}"[:500])
        self.waiting -= 1
        if self.waiting == 0:
            self._answer()

    def time_out(self) -> None:
        if self.answered:
            return
        for i, durable in enumerate(self._durable):
            if not durable:
                r = self.results[i]
                self.results[i] = PartitionResult(r.topic, r.partition, ErrorCode.request_timed_out.value,
                                                  error_message="records not durable within the request timeout")
        self._answer()

    def _answer(self) -> None:
        if not self.answered:
            self.answered = True
            if self._lease_current is not None and not self._lease_current():
                for i, r in enumerate(self.results):
                    if r.error_code == 0:
                        self.results[i] = PartitionResult(
                            r.topic, r.partition, ErrorCode.request_timed_out.value,
                            error_message="the records are durable, but this broker's membership lease ran out "
                                          "before they were acknowledged: retry them at the partition's leader")
            if self._errors is not None:
                for r in self.results:
                    add_error(self._errors, r.error_code)
            self.connection.complete(self.token, apis.produce_response(self.header, self.results))


class RequestHandler:
    """One handler task: takes requests from its queue and runs KafkaApis on them.

    In multiqueue mode each handler owns one queue; in baseline mode the pool
    shares one. Each request's frame memory goes back to the MemoryPool once
    it is handled. The loop ends when the RequestChannel is closed and drained.

    It stamps each request when it takes it and when it is done with it (the
    next request of a queue item is taken when the previous one is done), and
    adds up the time it waits for its queue (``idle_seconds``; Kafka
    KafkaRequestHandler: the time blocked in ``receiveRequest``, behind
    RequestHandlerAvgIdlePercent).
    """

    def __init__(self, handler_id: int, apis_: KafkaApis, request_channel: RequestChannel) -> None:
        self.handler_id = handler_id
        self._apis = apis_
        self._request_channel = request_channel
        self._queue_index, self._receiver = request_channel.receiver(handler_id)
        # (idle seconds of the waits that ended, perf_counter() when the
        # current wait began or None): one attribute, replaced whole, so the
        # metrics thread never sees half an update.
        self._idle: tuple[float, float | None] = (0.0, None)

    @property
    def idle_seconds(self) -> float:
        """Time spent waiting for the queue to give it work, the current wait included (s).

        Safe to read from another thread (a reading that races the end of a
        wait may be a few microseconds off).
        """
        total, since = self._idle
        if since is not None:
            total += max(0.0, time.perf_counter() - since)
        return total

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        receiver = self._receiver
        perf_counter = time.perf_counter
        async with receiver:
            without_checkpoint = 0
            while True:
                try:
                    if without_checkpoint >= ITEMS_PER_CHECKPOINT:
                        raise trio.WouldBlock
                    requests = receiver.receive_nowait()  # queued already: no scheduling round
                    without_checkpoint += 1
                except trio.WouldBlock:
                    without_checkpoint = 0
                    self._idle = (self._idle[0], perf_counter())
                    try:
                        requests = await receiver.receive()
                    except trio.EndOfChannel:
                        break
                    finally:
                        total, since = self._idle
                        self._idle = (total + max(0.0, perf_counter() - since), None)
                except trio.EndOfChannel:
                    break
                now = trio.current_time()
                self._request_channel.taken(self._queue_index, len(requests))
                if self._apis.produce_runs:
                    await self._handle_runs(requests, now)
                    continue
                for request in requests:
                    request.dequeued_at = now
                    now = await self._handle_one(request)

    async def _handle_one(self, request: Request) -> float:
        """Handle one request; returns when it was done (trio time, s)."""
        # What is logged while handling it carries its ids (pipeline.observe.structured_logs).
        context = log_context.set((request.connection.connection_id, request.header.correlation_id))
        try:
            await self._apis.handle(request)
        except Exception:
            self._failed([request])
        finally:
            now = request.local_done_at = trio.current_time()
            request.release()
            log_context.reset(context)
        return now

    async def _handle_runs(self, requests: list[Request], now: float) -> None:
        """Handle one queue item, Produce requests in runs (``KafkaApis.plain_produce``,
        ``sequence_run``): a run ends at any other request, which is then handled alone."""
        apis_ = self._apis
        run: list[PlainProduce] = []
        checked: dict[tuple[str, int], bool] = {}
        writable: dict[str, bool] = {}
        allowed: bool | None = None  # runs_allowed, asked at the first Produce request
        i, count = 0, len(requests)
        try:
            while i < count:
                if allowed and checked:
                    # The plain Produce requests whose partitions this run has checked, in one C call
                    # (it stops at the first request it leaves: that one goes on below).
                    plains, i = apis_.plain_produces(requests, i, checked, now)
                    run += plains
                    if i >= count:
                        break
                request = requests[i]
                request.dequeued_at = now
                if request.header.api_key == PRODUCE:
                    if allowed is None:
                        allowed = apis_.runs_allowed(request.connection)
                    # None (not plain, or a partition refused): handle() serves it, with its errors.
                    plain = apis_.plain_produce(request, checked, writable) if allowed else None
                    if plain is not None:
                        run.append(plain)
                        i += 1
                        continue
                i += 1
                if run:
                    now = request.dequeued_at = self._end_run(run)
                    run = []
                now = await self._handle_one(request)
                # It may have awaited: leadership, ACLs and buffer.memory may have changed since.
                checked.clear()
                writable.clear()
                allowed = None
        except Exception:
            # Reading a run raises only on a bug (bad input is declined, never raised): no fallback
            # to the one-by-one path, which would hide it; the requests not yet served fail as
            # _handle_one fails one (logged, their connections closed), after the run read so far.
            if run:
                self._end_run(run)
                run = []
            rest = requests[i:]
            self._failed(rest)
            release_requests(rest, trio.current_time())
        if run:
            self._end_run(run)

    def _end_run(self, run: list[PlainProduce]) -> float:
        """Sequence ``run`` (``KafkaApis.sequence_run``); returns when it was done (trio time, s)."""
        requests = [plain[0] for plain in run]
        first = requests[0]
        context = log_context.set((first.connection.connection_id, first.header.correlation_id))
        try:
            self._apis.sequence_run(run)
        except Exception:
            self._failed(requests)
        finally:
            now = trio.current_time()
            release_requests(requests, now)
            log_context.reset(context)
        return now

    def _failed(self, requests: list[Request]) -> None:
        """An unexpected error while handling ``requests``: logged, and their connections closed."""
        log.exception("handler %d: %d request(s) from %s failed", self.handler_id, len(requests),
                      requests[0].connection.connection_id)
        for request in requests:
            request.connection.close("internal error while handling a request")
            try:
                request.connection.complete(request.token, None)
            except Exception:
                pass
