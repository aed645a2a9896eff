"""Fetch and ListOffsets: the read side of the Kafka protocol.

**Fetch** (Kafka KafkaApis.handleFetchRequest / ReplicaManager.fetchMessages):
each partition is read from its ``fetch_offset`` through the LogManager
(recent offsets from the write-ahead log, older ones from the table), at most
``partition_max_bytes`` per partition and ``max_bytes`` per response, but
always the first batch of the first partition with data, whatever its size
(KIP-74). Only offsets below the high watermark (durable) are served. If
fewer than ``min_bytes`` are available the fetch waits up to ``max_wait_ms``
for appends to make the high watermark move (Kafka's DelayedFetch in the
fetch purgatory): it is woken by the appends, never by polling. The wait
happens in a task of its own, so the RequestHandler goes on with its queue
at once; the connection's ResponseSequencer keeps responses in request order.

Fetch sessions (KIP-227) are not kept: every response carries session id 0,
which tells a client to keep sending full fetch requests (librdkafka does
anyway); a fetch naming a session gets FETCH_SESSION_ID_NOT_FOUND.
Every partition's last stable offset is in the response (KIP-98). A
read-committed fetch (``isolation_level`` 1) is served only below it, with the
aborted transactions among the records read listed, so the consumer drops
their records; a read-uncommitted one reads up to the high watermark.

**ListOffsets** (KafkaApis.handleListOffsetRequest): earliest (-2), latest
(-1: the high watermark, the last stable offset for ``isolation_level`` 1),
max timestamp (-3, KIP-734) and by timestamp.

**Leader epochs** (KIP-320): a partition this broker leads is served only to a
request whose ``current_leader_epoch`` (Fetch v9+, ListOffsets v4+) is -1 or the
partition's leader epoch (``BrokerInfo.leader_epoch``: 0 unless leadership is
through the database); see :func:`leader_epoch_error`. A found offset is
answered with the partition's current leader epoch (ListOffsets
``leader_epoch``: no epoch is kept per record batch). Fetch's ``current_leader``
(v12+) stays empty, as Kafka leaves it below v16 (KIP-951 fills it from v16,
with the leader's address in ``node_endpoints``): kafka-python 3.x follows a
hint at v12 and then fails its poll (UnknownBrokerIdError) when the broker it
names is not in its metadata yet, as after a broker's return.

**OffsetForLeaderEpoch** (KafkaApis.handleOffsetForLeaderEpochRequest,
Partition.lastOffsetForLeaderEpoch): a consumer whose partition's leader epoch
went up asks where the epoch of its position ended, to detect a log truncated
under it (KIP-320). No history of epochs is kept here, and no served offset is
ever truncated (only offsets below the high watermark are served, and it moves
only over what is durable: the WAL, or the table with ``--ack-on spark``; a
moved partition continues at the table's end). So an epoch up to the current
one is answered as ending at the log end offset, at or past any position a
consumer reached: never a truncation. A newer epoch than the leader's is
answered undefined (-1, -1), as Kafka does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from pipeline.log.manager import LogManager, OffsetOutOfRange
from pipeline.protocol import apis
from pipeline.protocol.apis import FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH
from pipeline.network.api_host import ApiHost, PartitionCounts
from pipeline.network.request_channel import Request
from pipeline.network.request_metrics import RequestMetrics
from pipeline.network.request_metrics import add_error
from pipeline.security.acl import AclOperation, ResourceType

log = logging.getLogger(__name__)

MAX_WAIT_MS_LIMIT = 30_000
"""A fetch waits at most this long (ms), whatever it asks: the client's request.timeout.ms is 30 s."""
TAKEOVER_WAIT_MS = 500
"""A ListOffsets of a partition this broker is taking over waits at most this long (ms) for the
take-over, then answers NOT_LEADER_OR_FOLLOWER (Kafka's default fetch.max.wait.ms). Short: kafkajs
heartbeats from its fetch loop, which waits for the answer (a 5 s wait had a member leave its group
by session timeout), and each NOT_LEADER_OR_FOLLOWER costs it a rejoin, so a take-over of a few
seconds costs a few rejoins instead of a thousand."""

READ_COMMITTED = 1
"""Fetch/ListOffsets ``isolation_level`` of a read-committed consumer (KIP-98; 0 is read uncommitted)."""
_NO_SESSION = 0
_INITIAL_EPOCH, _FINAL_EPOCH = 0, -1
NO_LEADER_EPOCH = -1
"""A request's ``current_leader_epoch`` that asks for no check (Kafka RecordBatch.NO_PARTITION_LEADER_EPOCH)."""


def leader_epoch_error(current_leader_epoch: int, leader_epoch: int) -> int:
    """The error code for a request naming ``current_leader_epoch`` of a partition this broker leads at
    ``leader_epoch`` (Kafka ``Partition.checkCurrentLeaderEpoch``, KIP-320): 0 when the request asks for
    no check (-1) or names the leader's epoch; FENCED_LEADER_EPOCH (74) when it names an older one (the
    client's metadata is stale: it refreshes and retries); UNKNOWN_LEADER_EPOCH (75) when it names a newer
    one (this broker has not seen the move yet: the client retries)."""
    if current_leader_epoch == NO_LEADER_EPOCH or current_leader_epoch == leader_epoch:
        return ErrorCode.none.value
    if current_leader_epoch < leader_epoch:
        return ErrorCode.fenced_leader_epoch.value
    return ErrorCode.unknown_leader_epoch.value


@dataclass(slots=True)
class _PartitionFetch:
    topic: str
    partition: int
    offset: int
    max_bytes: int
    current_leader_epoch: int = NO_LEADER_EPOCH
    error: int = 0
    records: bytes = b""
    high_watermark: int = -1
    log_start_offset: int = -1
    last_stable_offset: int = -1
    aborted: list[tuple[int, int]] | None = None


def _internal_error(request: Request, what: str) -> None:
    """In the ``except`` of a request served in a task of its own: the error logged with its
    traceback, the connection closed with the reason, the request answered with nothing."""
    log.exception("%s failed", what)
    request.connection.close(f"internal error while serving a {what}")
    try:
        request.connection.complete(request.token, None)
    except Exception:
        pass


class FetchApis:
    """Serves Fetch and ListOffsets from a LogManager.

    Args:
        logs: the partitions' logs.
        catalog: topics and partition counts (``partitions(name) -> int | None``).
        apis_: the KafkaApis whose request metrics count errors.
    """

    def __init__(self, logs: LogManager, catalog: PartitionCounts, request_metrics: RequestMetrics) -> None:
        self.logs = logs
        self.catalog = catalog
        self._fetch_errors = request_metrics.errors(FETCH)
        self._list_errors = request_metrics.errors(LIST_OFFSETS)
        self._epoch_errors = request_metrics.errors(OFFSET_FOR_LEADER_EPOCH)
        self._nursery: trio.Nursery | None = None
        self.fetches = 0
        self.delayed_fetches = 0
        self._authorize: Callable[[Request, AclOperation, ResourceType, str], bool] = (
            lambda request, operation, resource_type, name: True)
        self._leads: Callable[[str, int], bool] = lambda topic, partition: True
        self._taking_over: Callable[[str, int], bool] = lambda topic, partition: False
        self._leader_epoch: Callable[[str, int], int] = lambda topic, partition: 0

    def register(self, kafka_apis: ApiHost) -> None:
        # KafkaApis.authorize: Fetch needs TOPIC Read, ListOffsets TOPIC Describe (TOPIC_AUTHORIZATION_FAILED).
        self._authorize = kafka_apis.authorize
        # In a cluster only a partition's leader serves it (others: NOT_LEADER_OR_FOLLOWER).
        self._leads = kafka_apis.broker.leads
        # A partition this broker is taking over: a fetch waits for it rather than answer at once.
        self._taking_over = kafka_apis.broker.taking_over
        # Their leader epochs (KIP-320), checked against the request's and named in ListOffsets.
        self._leader_epoch = kafka_apis.broker.leader_epoch
        kafka_apis.register(FETCH, self.fetch)
        kafka_apis.register(LIST_OFFSETS, self.list_offsets)
        kafka_apis.register(OFFSET_FOR_LEADER_EPOCH, self.offset_for_leader_epoch)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the tasks of fetches being served; runs until cancelled (waiting fetches end then)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # -- Fetch -------------------------------------------------------------------

    async def fetch(self, request: Request) -> None:
        header = request.header
        body = apis.decode_request(header, request.frame)
        if getattr(body, "replica_id", -1) >= 0:
            # Follower fetches: this broker has no replicas.
            self._answer_fetch(request, body, [], ErrorCode.unknown_server_error.value)
            return
        session_id = getattr(body, "session_id", _NO_SESSION)
        session_epoch = getattr(body, "session_epoch", _FINAL_EPOCH)
        if session_id != _NO_SESSION:
            self._answer_fetch(request, body, [], ErrorCode.fetch_session_id_not_found.value)
            return
        if session_epoch not in (_INITIAL_EPOCH, _FINAL_EPOCH):
            self._answer_fetch(request, body, [], ErrorCode.invalid_fetch_session_epoch.value)
            return
        wanted = []
        for topic in body.topics:
            for p in topic.partitions:
                wanted.append(_PartitionFetch(topic.topic, int(p.partition), int(p.fetch_offset),
                                              max(0, int(p.partition_max_bytes)),
                                              int(getattr(p, "current_leader_epoch", NO_LEADER_EPOCH))))
        read_committed = int(getattr(body, "isolation_level", 0)) == READ_COMMITTED
        max_bytes = int(getattr(body, "max_bytes", 2**31 - 1))
        max_wait_ms = min(max(0, body.max_wait.total_seconds() * 1000.0), MAX_WAIT_MS_LIMIT)
        self.fetches += 1
        deadline = trio.current_time() + max_wait_ms / 1000.0
        if self._nursery is None:
            await self._serve(request, body, wanted, max_bytes, int(body.min_bytes), deadline, read_committed)
        else:
            self._nursery.start_soon(self._serve, request, body, wanted, max_bytes, int(body.min_bytes), deadline,
                                     read_committed)

    async def _serve(self, request: Request, body: Any, wanted: list[_PartitionFetch], max_bytes: int,
                     min_bytes: int, deadline: float, read_committed: bool = False) -> None:
        try:
            readable = {t: self._authorize(request, AclOperation.READ, ResourceType.TOPIC, t)
                        for t in {p.topic for p in wanted}}
            # Partitions this broker was made leader of and is taking over wait like a fetch with no
            # data yet (until taken over, or the fetch's max wait: then NOT_LEADER_OR_FOLLOWER): Kafka
            # names a new leader only once it leads, and answering NOT_LEADER_OR_FOLLOWER at once made
            # kafkajs rejoin its group on each answer, hundreds of rebalances while a take-over lasts.
            taking_over: list[_PartitionFetch] = []
            for p in wanted:  # errors that do not change while waiting
                count = self.catalog.partitions(p.topic)
                if not readable[p.topic]:
                    p.error = ErrorCode.topic_authorization_failed.value
                elif count is None or not 0 <= p.partition < count:
                    p.error = ErrorCode.unknown_topic_or_partition.value
                elif not self._leads(p.topic, p.partition):
                    p.error = ErrorCode.not_leader_or_follower.value
                    if self._taking_over(p.topic, p.partition):
                        taking_over.append(p)
                else:
                    p.error = leader_epoch_error(p.current_leader_epoch, self._leader_epoch(p.topic, p.partition))
            live = [p for p in wanted if not p.error]
            keys = [(p.topic, p.partition) for p in live + taking_over]
            event = None
            while True:
                if taking_over:
                    still = []
                    for p in taking_over:
                        if self._leads(p.topic, p.partition):
                            p.error = leader_epoch_error(p.current_leader_epoch,
                                                         self._leader_epoch(p.topic, p.partition))
                            if not p.error:
                                live.append(p)
                        elif self._taking_over(p.topic, p.partition):
                            still.append(p)
                    taking_over = still
                available = 0
                out_of_range = False
                for p in live:
                    end = max(self.logs.log_end_offset(p.topic, p.partition),
                              self.logs.log(p.topic, p.partition).high_watermark)
                    if p.offset < 0 or p.offset > end:
                        out_of_range = True
                    available += self.logs.available_bytes(p.topic, p.partition, p.offset,
                                                           min(p.max_bytes, max(min_bytes, 1) - available),
                                                           read_committed)
                if (out_of_range or available >= max(min_bytes, 1) or trio.current_time() >= deadline
                        or not (live or taking_over) or self.logs.closing):
                    break
                if event is not None:
                    self.logs.unwatch(keys, event)
                else:
                    self.delayed_fetches += 1
                event = trio.Event()
                self.logs.watch(keys, event)
                with trio.move_on_at(deadline):
                    await event.wait()
            if event is not None:
                self.logs.unwatch(keys, event)
            if trio.current_time() >= deadline or self.logs.closing:
                taking_over = []  # NOT_LEADER_OR_FOLLOWER: the client asks its metadata again
            taking_over = [p for p in taking_over if p.offset >= 0]  # else NOT_LEADER_OR_FOLLOWER too
            for p in taking_over:
                # Answered early (another partition's data): no data and no error for one still being
                # taken over, its high watermark the offset asked for ("nothing after it yet").
                p.error, p.high_watermark, p.last_stable_offset = 0, p.offset, p.offset
            not_read = {id(p) for p in taking_over}
            budget = max_bytes
            got_data = False
            for p in wanted:
                if p.error or id(p) in not_read:
                    continue
                plog = self.logs.log(p.topic, p.partition)
                p.high_watermark, p.log_start_offset = plog.high_watermark, plog.log_start_offset
                p.last_stable_offset = plog.last_stable_offset
                limit = min(p.max_bytes, budget)
                if limit <= 0 and got_data:
                    continue
                try:
                    # The first partition with data gets at least one batch
                    # whatever its size; the others only what fits (KIP-74).
                    result = await self.logs.read(p.topic, p.partition, p.offset, limit, min_one=not got_data,
                                                  read_committed=read_committed)
                except OffsetOutOfRange:
                    p.error = ErrorCode.offset_out_of_range.value
                    continue
                except Exception as exc:  # an unreadable table or WAL: this partition only
                    log.warning("fetch of %s-%d at offset %d failed: %s", p.topic, p.partition, p.offset,
                                str(exc).splitlines()[0] if str(exc) else repr(exc))
                    p.error = ErrorCode.kafka_storage_error.value
                    continue
                p.records = result.records
                p.high_watermark, p.log_start_offset = result.high_watermark, result.log_start_offset
                p.last_stable_offset, p.aborted = result.last_stable_offset, result.aborted
                budget -= len(result.records)
                got_data = got_data or bool(result.records)
            self._answer_fetch(request, body, wanted, ErrorCode.none.value)
        except Exception:
            _internal_error(request, "fetch")

    def _answer_fetch(self, request: Request, body: Any, parts: list[_PartitionFetch], error: int) -> None:
        header = request.header
        module = apis.response_module(FETCH, header.api_version)
        by_topic: dict[str, list[Any]] = {}
        for p in parts:
            add_error(self._fetch_errors, p.error)
            by_topic.setdefault(p.topic, []).append(apis.make(
                module.PartitionData,
                partition_index=p.partition,
                error_code=apis.error_code(p.error),
                high_watermark=p.high_watermark,
                last_stable_offset=p.last_stable_offset if p.last_stable_offset >= 0 else p.high_watermark,
                log_start_offset=p.log_start_offset,
                aborted_transactions=None if p.aborted is None else tuple(
                    apis.make(module.AbortedTransaction, producer_id=pid, first_offset=first)
                    for pid, first in p.aborted),
                preferred_read_replica=-1,
                records=p.records,
            ))
        if not parts:
            add_error(self._fetch_errors, error)
        response = apis.make(
            module.FetchResponse,
            throttle_time=apis.ZERO_MS,
            error_code=apis.error_code(error),
            session_id=_NO_SESSION,
            responses=tuple(
                apis.make(module.FetchableTopicResponse, topic=topic, partitions=tuple(partitions))
                for topic, partitions in by_topic.items()
            ),
        )
        request.connection.complete(request.token, apis.encode(header, response))

    # -- ListOffsets -------------------------------------------------------------

    async def list_offsets(self, request: Request) -> None:
        """Answer ListOffsets. One naming a partition this broker is taking over waits for the
        take-over (at most ``TAKEOVER_WAIT_MS``, in a task of its own: the handler goes on) rather
        than answer NOT_LEADER_OR_FOLLOWER at once: kafkajs rejoins its group on each such answer,
        up to 1,447 times in one failover."""
        body = apis.decode_request(request.header, request.frame)
        keys = [(topic.name, int(p.partition_index)) for topic in body.topics for p in topic.partitions
                if 0 <= int(p.partition_index) < (self.catalog.partitions(topic.name) or 0)
                and self._taking_over(topic.name, int(p.partition_index))]
        if keys and self._nursery is not None:
            self._nursery.start_soon(self._list_offsets_after_takeover, request, body, keys)
            return
        await self._answer_list_offsets(request, body)

    async def _list_offsets_after_takeover(self, request: Request, body: Any, keys: list[tuple[str, int]]) -> None:
        deadline = trio.current_time() + TAKEOVER_WAIT_MS / 1000.0
        try:
            while (any(self._taking_over(topic, partition) for topic, partition in keys)
                   and trio.current_time() < deadline and not self.logs.closing):
                event = trio.Event()
                self.logs.watch(keys, event)  # woken by the take-over (LogManager.wake)
                try:
                    with trio.move_on_at(deadline):
                        await event.wait()
                finally:
                    self.logs.unwatch(keys, event)
            await self._answer_list_offsets(request, body)
        except Exception:
            _internal_error(request, "list offsets request")

    async def _answer_list_offsets(self, request: Request, body: Any) -> None:
        header = request.header
        module = apis.response_module(LIST_OFFSETS, header.api_version)
        read_committed = int(getattr(body, "isolation_level", 0)) == READ_COMMITTED
        topics = []
        for topic in body.topics:
            partitions = []
            count = self.catalog.partitions(topic.name)
            describable = self._authorize(request, AclOperation.DESCRIBE, ResourceType.TOPIC, topic.name)
            for p in topic.partitions:
                offset, timestamp, error = -1, -1, int(ErrorCode.none.value)
                if not describable:
                    error = ErrorCode.topic_authorization_failed.value
                elif count is None or not 0 <= p.partition_index < count:
                    error = ErrorCode.unknown_topic_or_partition.value
                elif not self._leads(topic.name, int(p.partition_index)):
                    error = ErrorCode.not_leader_or_follower.value
                else:
                    error = leader_epoch_error(int(getattr(p, "current_leader_epoch", NO_LEADER_EPOCH)),
                                               self._leader_epoch(topic.name, int(p.partition_index)))
                if error == ErrorCode.none.value:
                    try:
                        offset, timestamp = await self.logs.offset_for(topic.name, int(p.partition_index),
                                                                       int(p.timestamp), read_committed)
                    except Exception as exc:
                        log.warning("ListOffsets of %s-%d failed: %s", topic.name, p.partition_index, exc)
                        error = ErrorCode.kafka_storage_error.value
                add_error(self._list_errors, error)
                partitions.append(apis.make(
                    module.ListOffsetsPartitionResponse,
                    partition_index=p.partition_index,
                    error_code=apis.error_code(error),
                    timestamp=timestamp,
                    offset=offset,
                    leader_epoch=(self._leader_epoch(topic.name, int(p.partition_index))
                                  if error == 0 and offset >= 0 else NO_LEADER_EPOCH),
                ))
            topics.append(apis.make(module.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(partitions)))
        response = apis.make(module.ListOffsetsResponse, throttle_time=apis.ZERO_MS, topics=tuple(topics))
        request.connection.complete(request.token, apis.encode(header, response))

    # -- OffsetForLeaderEpoch ----------------------------------------------------

    async def offset_for_leader_epoch(self, request: Request) -> None:
        """Answer OffsetForLeaderEpoch (see the module docstring): per partition, TOPIC Describe
        (TOPIC_AUTHORIZATION_FAILED), an existing partition (UNKNOWN_TOPIC_OR_PARTITION) this broker
        serves (NOT_LEADER_OR_FOLLOWER), ``current_leader_epoch`` checked (:func:`leader_epoch_error`);
        then (``leader_epoch``, log end offset), or (-1, -1) for an epoch newer than the leader's."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(OFFSET_FOR_LEADER_EPOCH, header.api_version)
        topics = []
        for topic in body.topics:
            count = self.catalog.partitions(topic.topic)
            describable = self._authorize(request, AclOperation.DESCRIBE, ResourceType.TOPIC, topic.topic)
            partitions = []
            for p in topic.partitions:
                partition, asked = int(p.partition), int(p.leader_epoch)
                epoch, end_offset, error = NO_LEADER_EPOCH, -1, int(ErrorCode.none.value)
                if not describable:
                    error = ErrorCode.topic_authorization_failed.value
                elif count is None or not 0 <= partition < count:
                    error = ErrorCode.unknown_topic_or_partition.value
                elif not self._leads(topic.topic, partition):
                    error = ErrorCode.not_leader_or_follower.value
                else:
                    current = self._leader_epoch(topic.topic, partition)
                    error = leader_epoch_error(int(p.current_leader_epoch), current)
                    if error == ErrorCode.none.value and 0 <= asked <= current:
                        epoch = asked
                        end_offset = max(self.logs.log_end_offset(topic.topic, partition),
                                         self.logs.log(topic.topic, partition).high_watermark)
                add_error(self._epoch_errors, error)
                partitions.append(apis.make(module.EpochEndOffset, error_code=apis.error_code(error),
                                            partition=partition, leader_epoch=epoch, end_offset=end_offset))
            topics.append(apis.make(module.OffsetForLeaderTopicResult, topic=topic.topic,
                                    partitions=tuple(partitions)))
        response = apis.make(module.OffsetForLeaderEpochResponse, throttle_time=apis.ZERO_MS, topics=tuple(topics))
        request.connection.complete(request.token, apis.encode(header, response))
