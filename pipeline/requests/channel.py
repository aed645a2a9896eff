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

Queues are trio memory channels: ``send`` waits when a queue is full, which
stops the Processor reading that connection (backpressure), and
``statistics()`` gives queue depth. A queue item is a list of requests: the
multiqueue channel takes every request cut from one socket read of a
connection as one item (they go to the same handler anyway), which saves a
queue hand-off and a scheduler round per request; the shared channel takes
one request per item, so its handler pool can interleave them as Kafka's can.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Protocol

import trio

from pipeline.protocol.header import RequestHeader


class ConnectionHandle(Protocol):
    """What a handler may do with the connection a request came from."""

    connection_id: str
    client_software: tuple[str, str] | None
    """(client_software_name, client_software_version) from ApiVersions v3+ (KIP-511)."""

    def complete(self, token: int, payload: bytes | None) -> None:
        """Give the response (without size prefix) of request ``token``; None: no response."""

    def close(self, reason: str) -> None:
        """Stop reading, answer what is in flight, then close the connection."""


@dataclass(slots=True, eq=False)
class Request:
    """One received request on its way to a RequestHandler.

    Attributes:
        connection: where it came from and where its response goes.
        header: the parsed request header.
        frame: the whole frame body (header + request body), bytes.
        token: its place in the connection's ResponseSequencer.
        received_at: trio.current_time() when the Processor read it (s).
    """

    connection: ConnectionHandle
    header: RequestHeader
    frame: bytes
    token: int
    received_at: float = field(default=0.0)


def stable_queue_index(connection_id: str, queues: int) -> int:
    """``crc32(connection_id) % queues``: the queue of a connection, stable across runs."""
    return zlib.crc32(connection_id.encode()) % queues


class RequestChannel:
    """Base: ``send_requests`` from Processors, ``receiver`` for handlers."""

    def __init__(self, capacities: list[int]) -> None:
        pairs = [trio.open_memory_channel[list[Request]](cap) for cap in capacities]
        self._senders = [s for s, _ in pairs]
        self._receivers = [r for _, r in pairs]

    @property
    def queue_count(self) -> int:
        return len(self._senders)

    batches_per_read = False
    """True if all requests of one read may travel as one item (same handler anyway)."""

    def queue_depths(self) -> list[int]:
        """Items (request lists) waiting in each queue now."""
        return [s.statistics().current_buffer_used for s in self._senders]

    def queue_index(self, connection_id: str) -> int:
        raise NotImplementedError

    async def send_requests(self, requests: list[Request]) -> None:
        """Enqueue requests of ONE connection, in order, as one item; waits while the queue is full.

        Raises:
            trio.ClosedResourceError: after ``close``.
        """
        await self._senders[self.queue_index(requests[0].connection.connection_id)].send(requests)

    def close(self) -> None:
        """No more requests: handlers drain their queues, then their loops end."""
        for s in self._senders:
            s.close()


class MultiQueueRequestChannel(RequestChannel):
    """N queues of ``capacity`` items each, routed by ``crc32(connection_id) % N``."""

    batches_per_read = True

    def __init__(self, queues: int, capacity: int) -> None:
        if queues < 1 or capacity < 1:
            raise ValueError(f"queues and capacity must be >= 1, got {queues}, {capacity}")
        super().__init__([capacity] * queues)

    def queue_index(self, connection_id: str) -> int:
        return stable_queue_index(connection_id, len(self._senders))

    def receiver(self, handler_index: int) -> trio.MemoryReceiveChannel[list[Request]]:
        """The queue owned by RequestHandler ``handler_index`` (one handler per queue)."""
        return self._receivers[handler_index]


class SharedRequestChannel(RequestChannel):
    """One queue of ``capacity`` requests (Kafka ``queued.max.requests``) for a handler pool."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        super().__init__([capacity])

    def queue_index(self, connection_id: str) -> int:
        return 0

    def receiver(self, handler_index: int) -> trio.MemoryReceiveChannel[list[Request]]:
        """A clone of the shared queue's receive side for pool member ``handler_index``."""
        return self._receivers[0].clone()
