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

import itertools
import logging
import time
from dataclasses import dataclass

import trio
from kio.schema.errors import ErrorCode

from pipeline.persist.batch import PartitionAppend
from pipeline.persist.persister import BatchingPersister
from pipeline.protocol import apis
from pipeline.protocol.apis import BrokerInfo, PartitionResult
from pipeline.protocol.errors import (
    CorruptRecordError,
    InvalidRequestError,
    UnsupportedRecordVersionError,
)
from pipeline.protocol.header import RequestHeader
from pipeline.protocol.records import validate_records
from pipeline.requests.catalog import TopicCatalog
from pipeline.requests.channel import Request
from pipeline.requests.sequencing import OffsetSequencer

log = logging.getLogger(__name__)

API_VERSIONS, METADATA, PRODUCE, INIT_PRODUCER_ID = 18, 3, 0, 22


@dataclass(slots=True)
class HandlerStats:
    """Counters since start."""

    requests: int = 0
    produce_requests: int = 0
    records: int = 0
    partition_errors: int = 0


class KafkaApis:
    """The request logic shared by every RequestHandler of a server.

    Args:
        broker: this broker's node id, advertised host/port and cluster id.
        catalog: topics and their partition counts.
        offsets: the server's OffsetSequencer.
        persister: where sequenced appends go.
        first_producer_id: first id InitProducerId hands out; the server seeds
            it from the wall clock (ms) so ids are not reused across restarts.
    """

    def __init__(
        self,
        broker: BrokerInfo,
        catalog: TopicCatalog,
        offsets: OffsetSequencer,
        persister: BatchingPersister,
        first_producer_id: int,
    ) -> None:
        self.broker = broker
        self.catalog = catalog
        self.offsets = offsets
        self.persister = persister
        self._producer_ids = itertools.count(first_producer_id)
        self.stats = HandlerStats()

    async def handle(self, request: Request) -> None:
        """Handle one request; its response is completed on its connection (now or later).

        A request that cannot be parsed closes its connection with the reason.
        """
        self.stats.requests += 1
        header = request.header
        try:
            if header.api_key == PRODUCE:
                await self._produce(request)
            elif header.api_key == API_VERSIONS:
                payload, software = apis.api_versions_response(header, request.frame)
                if software is not None:
                    request.connection.client_software = software
                    log.info("connection %s: client %s %s", request.connection.connection_id, *software)
                request.connection.complete(request.token, payload)
            elif header.api_key == METADATA:
                body = apis.decode_request(header, request.frame)
                request.connection.complete(
                    request.token, apis.metadata_response(header, body, self.broker, self.catalog)
                )
            elif header.api_key == INIT_PRODUCER_ID:
                self._init_producer_id(request)
            else:
                raise InvalidRequestError(f"api key {header.api_key} is not served")
        except InvalidRequestError as exc:
            request.connection.close(
                f"invalid request (api key {header.api_key} v{header.api_version}, "
                f"correlation id {header.correlation_id}): {exc}"
            )
            request.connection.complete(request.token, None)

    def _init_producer_id(self, request: Request) -> None:
        header = request.header
        body = apis.decode_request(header, request.frame)
        if getattr(body, "transactional_id", None) is not None:
            # Transactions need a coordinator this front end does not have.
            payload = apis.init_producer_id_response(
                header, body, -1, -1, ErrorCode.transactional_id_authorization_failed.value
            )
        else:
            payload = apis.init_producer_id_response(header, body, next(self._producer_ids), 0)
        request.connection.complete(request.token, payload)

    async def _produce(self, request: Request) -> None:
        header = request.header
        view = apis.produce_view(apis.decode_request(header, request.frame))
        self.stats.produce_requests += 1
        # A scheduling point between parsing and sequencing, where a thread of
        # Kafka's handler pool could be preempted. Harmless with one handler
        # per queue or with mute; with a shared queue and no mute it lets two
        # handlers sequence one connection's requests out of order, which is
        # the hazard the benchmark's shared-unmuted ablation must expose.
        await trio.lowlevel.checkpoint()
        results: list[PartitionResult] = []
        valid: list[tuple[int, str, int, bytes, int]] = []  # (result index, topic, partition, records, count)
        for part in view.partitions:
            error = self._check_partition(view, part.topic, part.partition)
            count = 0
            if error == ErrorCode.none.value:
                try:
                    info = validate_records(part.records)
                    count = info.record_count
                    if info.is_transactional:
                        error = ErrorCode.transactional_id_authorization_failed.value
                except CorruptRecordError as exc:
                    error = ErrorCode.corrupt_message.value
                    log.warning("connection %s: %s-%d: %s", request.connection.connection_id,
                                part.topic, part.partition, exc)
                except UnsupportedRecordVersionError as exc:
                    error = ErrorCode.unsupported_for_message_format.value
                    log.warning("connection %s: %s-%d: %s", request.connection.connection_id,
                                part.topic, part.partition, exc)
            if error == ErrorCode.none.value:
                valid.append((len(results), part.topic, part.partition, part.records or b"", count))
                results.append(PartitionResult(part.topic, part.partition, 0, log_start_offset=0))
            else:
                self.stats.partition_errors += 1
                results.append(PartitionResult(part.topic, part.partition, error))

        appends: list[PartitionAppend] = []
        if valid:
            await self.persister.wait_for_capacity()
            # From here to persister.append: no await (keeps offsets in order).
            now_ms = int(time.time() * 1000)
            for index, topic, partition, records, count in valid:
                base = self.offsets.assign(topic, partition, count)
                appends.append(PartitionAppend(topic, partition, base, records, count, now_ms))
                results[index] = PartitionResult(topic, partition, 0, base_offset=base, log_start_offset=0)
                self.stats.records += count

        connection, token = request.connection, request.token
        if view.acks == 0:
            if appends:
                self.persister.append(appends, _log_unacked_failure)
            connection.complete(token, None)
            failed = [r for r in results if r.error_code]
            if failed:
                # acks=0 clients never read a response, so Kafka closes the
                # connection to tell them something went wrong.
                connection.close(f"acks=0 produce failed for {len(failed)} partition(s), "
                                 f"first error code {failed[0].error_code}")
            return
        if not appends:
            connection.complete(token, apis.produce_response(header, results))
            return

        def on_durable(error: BaseException | None) -> None:
            final = results
            if error is not None:
                final = [
                    r if r.error_code else PartitionResult(
                        r.topic, r.partition, ErrorCode.kafka_storage_error.value,
                        error_message=f"records could not be persisted: {error}"[:500],
                    )
                    for r in results
                ]
            connection.complete(token, apis.produce_response(header, final))

        self.persister.append(appends, on_durable)

    def _check_partition(self, view: apis.ProduceRequestView, topic: str, partition: int) -> int:
        if view.acks not in (0, 1, -1):
            return ErrorCode.invalid_required_acks.value
        count = self.catalog.partitions(topic)
        if count is None or not 0 <= partition < count:
            return ErrorCode.unknown_topic_or_partition.value
        return ErrorCode.none.value


def _log_unacked_failure(error: BaseException | None) -> None:
    if error is not None:
        log.error("acks=0 records could not be persisted: %s", error)


class RequestHandler:
    """One handler task: takes requests from its queue and runs KafkaApis on them.

    In multiqueue mode each handler owns one queue; in baseline mode the pool
    shares one. The loop ends when the RequestChannel is closed and drained.
    """

    def __init__(self, handler_id: int, apis_: KafkaApis, receiver: trio.MemoryReceiveChannel[Request]) -> None:
        self.handler_id = handler_id
        self._apis = apis_
        self._receiver = receiver
        self.handled = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with self._receiver:
            async for request in self._receiver:
                try:
                    await self._apis.handle(request)
                except Exception:
                    log.exception("handler %d: request from %s failed", self.handler_id,
                                  request.connection.connection_id)
                    request.connection.close("internal error while handling a request")
                    try:
                        request.connection.complete(request.token, None)
                    except Exception:
                        pass
                self.handled += 1
