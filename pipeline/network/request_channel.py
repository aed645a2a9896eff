"""The RequestChannel: bounded queues between Processors and RequestHandlers.

Two topologies (seed 004):

* ``MultiQueueRequestChannel`` (AutoMQ): N queues, one RequestHandler each. A
  request goes to queue ``crc32(connection_id) % N``, so every request of a
  connection is handled by the same handler, in arrival order, while different
  connections are handled in parallel. The hash is CRC32 of the UTF-8
  connection id: stable across processes and runs, unlike Python's salted
  ``hash``.
* ``SharedRequestChannel`` (classic Kafka): one queue of
  ``queued.max.requests`` shared by a pool of ``num.io.threads`` handlers; any
  handler may take any request, so Kafka mutes a connection after each request
  until its response is sent to keep it ordered.

Every queue is bounded in requests (Kafka ``queued.max.requests``, which
multiqueue splits evenly over its queues): ``send_requests`` waits while a
queue is full, which stops the Processor reading that connection
(backpressure). Bytes are bounded too: every queued frame holds its
allocation from the MemoryPool (``queued.max.request.bytes``) until its
handler is done with it (``Request.release``). A queue item is a list of
requests: the multiqueue channel takes every request cut from one socket read
of a connection as one item (they go to the same handler anyway), which saves
a queue hand-off and a scheduler round per request; the shared channel takes
one request per item, so its handler pool can interleave them as Kafka's can.
"""

from __future__ import annotations

import collections
import math
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, Sequence

import trio

from pipeline.native import check_request_classes
from pipeline.protocol.header import RequestHeader
from pipeline.network.request_metrics import RequestMetrics

if TYPE_CHECKING:
    from pipeline.network.memory_pool import MemoryPool


class ConnectionHandle(Protocol):
    """What a handler may do with the connection a request came from."""

    connection_id: str

    @property
    def client_software(self) -> tuple[str, str] | None:
        """(client_software_name, client_software_version) from ApiVersions v3+ (KIP-511)."""
        ...

    listener: str
    """The listener name the connection came in on (Kafka ``listeners``: ``PLAINTEXT``, ``SASL_SSL``, a custom name)."""
    security_protocol: str
    """PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (Kafka ``listener.security.protocol.map``)."""
    @property
    def principal(self) -> str:
        """Who the client is, Kafka's ``KafkaPrincipal`` as ``type:name``: ``User:ANONYMOUS`` until
        authentication says otherwise (the SASL user, or the mTLS certificate's subject)."""
        ...

    peer_host: str
    """The client's IP address (ACLs match on it)."""

    def complete(self, token: int, payload: bytes | None) -> None:
        """Give the response (without size prefix) of request ``token``; None: no response."""

    def complete_without_response(self, tokens: list[int]) -> None:
        """``complete(token, None)`` for each of ``tokens``, in order (acks=0 produce requests
        handled together: Kafka's ``NoOpResponse``)."""

    def close(self, reason: str) -> None:
        """Stop reading, answer what is in flight, then close the connection."""

    def set_raw_sasl_tokens(self, raw: bool) -> None:
        """The next frames are raw SASL tokens (True: after a SaslHandshake v0, KIP-43) or
        requests again (False: authentication completed); call before completing that answer."""

    def identified(self, software: tuple[str, str]) -> None:
        """The client named itself in ApiVersions v3+: (client_software_name, client_software_version),
        KIP-511 (Kafka keeps it on the channel for metrics and logs)."""

    def authenticated(self, principal: str) -> None:
        """SASL authentication completed as ``principal`` (``User:name``): the requests after it
        are that principal's (Kafka ``KafkaChannel.principal`` after ``SaslServerAuthenticator``)."""


@dataclass(slots=True, eq=False)
class Request:
    """One received request on its way to a RequestHandler.

    Attributes:
        connection: where it came from and where its response goes.
        header: the parsed request header.
        frame: the whole frame body (header + request body).
        token: its place in the connection's ResponseSequencer.
        received_at: trio.current_time() when the Processor read it (s).
        pool_bytes: bytes it holds in ``pool`` until ``release``.
        pool: the MemoryPool its frame was allocated from (None: not pooled).
        dequeued_at, local_done_at, response_at: trio.current_time() (s) when
            a handler took it, when the handler was done with it, and when its
            response was complete; -1 until then. With ``received_at`` and the
            writer's times they make Kafka's request stage times
            (``pipeline.network.request_metrics``).
    """

    connection: ConnectionHandle
    header: RequestHeader
    frame: bytes | bytearray
    token: int
    received_at: float = field(default=0.0)
    pool_bytes: int = 0
    pool: MemoryPool | None = None
    dequeued_at: float = -1.0
    local_done_at: float = -1.0
    response_at: float = -1.0

    def release(self) -> None:
        """Return the frame's memory to the pool and drop the frame (the request
        is done with; its times stay until its response is written). Idempotent.

        Kafka ``RequestChannel.Request.releaseBuffer``.
        """
        if self.pool is not None:
            pool, self.pool = self.pool, None
            pool.release(self.pool_bytes)
        self.frame = b""


# pipeline._frames.cut builds it and pipeline._records.plain_run reads it (by field position and
# attribute name): a field renamed or moved here fails this import rather than the fast path.
check_request_classes(Request, RequestHeader)


def release_requests(requests: Sequence[Request], local_done_at: float | None = None) -> None:
    """``Request.release`` of each of ``requests``, their memory returned to each pool in one
    ``MemoryPool.release`` (one wake-up of muted channels rather than one per request); with
    ``local_done_at`` (s), each request's ``local_done_at`` is set to it too."""
    returned: dict[MemoryPool, int] = {}
    for request in requests:
        if local_done_at is not None:
            request.local_done_at = local_done_at
        pool = request.pool
        if pool is not None:
            request.pool = None
            returned[pool] = returned.get(pool, 0) + request.pool_bytes
        request.frame = b""
    for pool, size in returned.items():
        pool.release(size)


def stable_queue_index(connection_id: str, queues: int) -> int:
    """``crc32(connection_id) % queues``: the queue of a connection, stable across runs."""
    return zlib.crc32(connection_id.encode()) % queues


class _Waiter:
    """A sender waiting for room in a queue: ``admitted`` is set once its ``count`` requests'
    room is taken for it (or the channel is closed)."""

    __slots__ = ("count", "admitted")

    def __init__(self, count: int) -> None:
        self.count = count
        self.admitted = trio.Event()


class RequestChannel:
    """Base: ``send_requests`` from Processors, ``receiver`` for handlers.

    Also holds the request metrics every stage records into (Kafka
    ``RequestChannel.metrics``).
    """

    def __init__(self, capacities: list[int]) -> None:
        self.metrics = RequestMetrics()
        # The trio channels are unbounded; the bound is counted in requests
        # here, since an item may hold several requests.
        pairs = [trio.open_memory_channel[list[Request]](math.inf) for _ in capacities]
        self._senders = [s for s, _ in pairs]
        self._receivers = [r for _, r in pairs]
        self._capacities = list(capacities)
        self._queued = [0] * len(capacities)
        self._waiting: list[collections.deque[_Waiter]] = [collections.deque() for _ in capacities]

    @property
    def queue_count(self) -> int:
        return len(self._senders)

    batches_per_read = False
    """True if all requests of one read may travel as one item (same handler anyway)."""

    def queue_depths(self) -> list[int]:
        """Requests waiting in each queue now (taken by a handler: no longer counted)."""
        return list(self._queued)

    def queue_index(self, connection_id: str) -> int:
        """The queue the requests of connection ``connection_id`` go to (the subclass's routing)."""
        raise NotImplementedError

    def receiver(self, handler_index: int) -> tuple[int, trio.MemoryReceiveChannel[list[Request]]]:
        """(queue index, receive side) RequestHandler ``handler_index`` takes its requests from (the subclass's)."""
        raise NotImplementedError

    async def send_requests(self, requests: list[Request]) -> None:
        """Enqueue requests of ONE connection, in order, as one item.

        Waits while the queue holds its capacity in requests, or while other
        senders wait for it (first come, first served); an item larger than the
        whole capacity goes in once the queue is empty.

        Raises:
            trio.ClosedResourceError: after ``close``.
        """
        index = self.queue_index(requests[0].connection.connection_id)
        queued, count, waiting = self._queued, len(requests), self._waiting[index]
        if waiting or (queued[index] and queued[index] + count > self._capacities[index]):
            waiter = _Waiter(count)
            waiting.append(waiter)
            try:
                await waiter.admitted.wait()
            except BaseException:  # cancelled: give back its place, or its room if it had one
                if waiter.admitted.is_set():
                    queued[index] -= count
                    self._admit(index)
                else:
                    waiting.remove(waiter)
                raise
        else:
            queued[index] += count
        self._senders[index].send_nowait(requests)

    def try_send_requests(self, requests: list[Request]) -> bool:
        """``send_requests`` if it would not wait: True if enqueued, False if the queue is full
        or other senders wait for it (they go first).

        The Processor's usual path (no cancel scope, no checkpoint); the same
        bound as ``send_requests``.

        Raises:
            trio.ClosedResourceError: after ``close``.
        """
        index = self.queue_index(requests[0].connection.connection_id)
        queued = self._queued
        if self._waiting[index] or (queued[index] and queued[index] + len(requests) > self._capacities[index]):
            return False
        queued[index] += len(requests)
        self._senders[index].send_nowait(requests)
        return True

    def taken(self, queue_index: int, count: int) -> None:
        """A handler took ``count`` requests off queue ``queue_index``: room for more."""
        self._queued[queue_index] -= count
        if self._waiting[queue_index]:
            self._admit(queue_index)

    def _admit(self, index: int) -> None:
        """Wake the senders waiting for queue ``index`` that now fit, first come first served,
        each with its room taken for it. Only those: every Processor waiting on a full queue
        woken at each take, to find it full again, cost a task step per request at acks=0."""
        waiting, queued, capacity = self._waiting[index], self._queued, self._capacities[index]
        while waiting and (not queued[index] or queued[index] + waiting[0].count <= capacity):
            waiter = waiting.popleft()
            queued[index] += waiter.count
            waiter.admitted.set()

    def close(self) -> None:
        """No more requests: handlers drain their queues, then their loops end."""
        for s in self._senders:
            s.close()
        for waiting in self._waiting:
            while waiting:
                waiting.popleft().admitted.set()  # a waiting sender finds the queue closed


class MultiQueueRequestChannel(RequestChannel):
    """N queues of ``capacity`` items each, routed by ``crc32(connection_id) % N``."""

    batches_per_read = True

    def __init__(self, queues: int, capacity: int) -> None:
        if queues < 1 or capacity < 1:
            raise ValueError(f"queues and capacity must be >= 1, got {queues}, {capacity}")
        super().__init__([capacity] * queues)

    def queue_index(self, connection_id: str) -> int:
        return stable_queue_index(connection_id, len(self._senders))

    def receiver(self, handler_index: int) -> tuple[int, trio.MemoryReceiveChannel[list[Request]]]:
        """(queue index, queue) owned by RequestHandler ``handler_index`` (one handler per queue)."""
        return handler_index, self._receivers[handler_index]


class SharedRequestChannel(RequestChannel):
    """One queue of ``capacity`` requests (Kafka ``queued.max.requests``) for a handler pool."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        super().__init__([capacity])

    def queue_index(self, connection_id: str) -> int:
        return 0

    def receiver(self, handler_index: int) -> tuple[int, trio.MemoryReceiveChannel[list[Request]]]:
        """(0, a clone of the shared queue's receive side) for pool member ``handler_index``."""
        return 0, self._receivers[0].clone()
