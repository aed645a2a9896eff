"""In-process harness for the trio layer: memory streams instead of sockets, a scripted request consumer.

No socket, no thread, no Spark: a connection is a pair of trio memory streams
(``trio.testing.memory_stream_one_way_pair``, or ``lockstep_stream_one_way_pair``
for a server-to-client direction whose ``send_all`` blocks until the client
reads), served by the real ``KafkaChannel`` / ``Processor`` / ``RequestChannel``.
Run under pytest-trio's ``autojump_clock``, every timeout is virtual time.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio
import trio.testing

from pipeline.network.channel import KafkaChannel, MemoryWaiters
from pipeline.network.connection_quotas import ConnectionQuotas
from pipeline.network.connection_state import ConnectionLimits, ConnectionState
from pipeline.network.listeners import PLAINTEXT_LISTENER, Listener
from pipeline.network.memory_pool import MemoryPool
from pipeline.network.processor import Processor
from pipeline.network.request_channel import MultiQueueRequestChannel, Request, RequestChannel
from tests.e2e import raw_client as rc

_ports = itertools.count(40000)


def request_frame(correlation_id: int) -> bytes:
    """A whole framed request (size prefix included): an ApiVersions v3."""
    return rc.frame(rc.api_versions(), correlation_id)


def echo_payload(request: Request) -> bytes:
    """A response (without size prefix) naming the request it answers: correlation id + b"ok"."""
    return struct.pack(">i", request.header.correlation_id) + b"ok"


class FakeSocket:
    """What ``processor.connection_id`` asks of ``stream.socket``."""

    def __init__(self, local: tuple[str, int], remote: tuple[str, int]) -> None:
        self.local, self.remote = local, remote

    def getsockname(self) -> tuple[str, int]:
        return self.local

    def getpeername(self) -> tuple[str, int]:
        return self.remote


class MemorySocketStream(trio.abc.HalfCloseableStream):
    """The server end of an in-memory connection, shaped like ``trio.SocketStream`` for the Processor."""

    def __init__(self, send_stream: trio.abc.SendStream, receive_stream: trio.abc.ReceiveStream,
                 remote: tuple[str, int]) -> None:
        self.send_stream = send_stream
        self.receive_stream = receive_stream
        self.socket = FakeSocket(("127.0.0.1", 9092), remote)

    def setsockopt(self, *args: object) -> None:
        pass

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.send_stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.send_stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.send_stream.aclose()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self.receive_stream.receive_some(max_bytes)

    async def aclose(self) -> None:
        try:
            await self.send_stream.aclose()
        finally:
            await self.receive_stream.aclose()


class Client:
    """The client end: sends bytes, and a reader task (``run``) collects response frames."""

    def __init__(self, stream: trio.abc.Stream, remote: tuple[str, int]) -> None:
        self.stream = stream
        self.remote = remote
        self.responses: list[tuple[int, bytes]] = []
        """(correlation id, payload after the correlation id), in arrival order."""
        self.arrived_at: list[float] = []
        """trio.current_time() of each response."""
        self.eof = False
        self._changed = trio.Event()

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def run(self) -> None:
        """Read response frames until the server closes the connection."""
        buf = bytearray()
        try:
            while True:
                while len(buf) >= 4:
                    (size,) = struct.unpack_from(">i", buf)
                    if len(buf) < 4 + size:
                        break
                    payload = bytes(buf[4:4 + size])
                    del buf[:4 + size]
                    self.responses.append((struct.unpack_from(">i", payload)[0], payload[4:]))
                    self.arrived_at.append(trio.current_time())
                    self._notify()
                data = await self.stream.receive_some(65536)
                if not data:
                    break
                buf += data
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self.eof = True
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._changed.wait()

    async def wait_responses(self, count: int) -> list[tuple[int, bytes]]:
        await self.wait_until(lambda: len(self.responses) >= count or self.eof)
        return self.responses

    @property
    def correlation_ids(self) -> list[int]:
        return [cid for cid, _ in self.responses]


def stream_pair(*, lockstep_responses: bool = False) -> tuple[Client, MemorySocketStream]:
    """(client, server stream) of one in-memory connection.

    Args:
        lockstep_responses: the server's ``send_all`` blocks until the client
            reads (a client that never reads leaves the server's write hanging,
            as a full socket buffer would).
    """
    c2s_send, c2s_receive = trio.testing.memory_stream_one_way_pair()
    if lockstep_responses:
        s2c_send, s2c_receive = trio.testing.lockstep_stream_one_way_pair()
    else:
        s2c_send, s2c_receive = trio.testing.memory_stream_one_way_pair()
    remote = ("10.0.0.1", next(_ports))
    client = Client(trio.StapledStream(c2s_send, s2c_receive), remote)
    return client, MemorySocketStream(s2c_send, c2s_receive, remote)


class ScriptedHandlers:
    """Take requests off a RequestChannel as RequestHandlers do, and answer them as the test says.

    With ``auto_answer`` every request is answered (``echo_payload``) and its
    memory released as soon as it is taken; otherwise the test calls ``answer``.
    """

    def __init__(self, request_channel: RequestChannel, auto_answer: bool = True) -> None:
        self.request_channel = request_channel
        self.auto_answer = auto_answer
        self.items: list[tuple[int, int, list[Request]]] = []
        """(handler index, queue index, requests of one queue item), in the order taken."""
        self._changed = trio.Event()

    @property
    def requests(self) -> list[Request]:
        return [r for _, _, item in self.items for r in item]

    def correlation_ids(self, connection_id: str | None = None) -> list[int]:
        return [r.header.correlation_id for r in self.requests
                if connection_id is None or r.connection.connection_id == connection_id]

    async def run(self, handler_index: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        queue_index, receiver = self.request_channel.receiver(handler_index)  # type: ignore[attr-defined]
        task_status.started()
        async for requests in receiver:
            self.request_channel.taken(queue_index, len(requests))
            self.items.append((handler_index, queue_index, requests))
            if self.auto_answer:
                for request in requests:
                    self.answer(request)
            changed, self._changed = self._changed, trio.Event()
            changed.set()

    @staticmethod
    def answer(request: Request, payload: bytes | None = b"echo") -> None:
        """Complete ``request`` (``b"echo"``: with ``echo_payload``) and release its memory."""
        request.connection.complete(request.token, echo_payload(request) if payload == b"echo" else payload)
        request.release()

    async def wait_requests(self, count: int) -> list[Request]:
        while len(self.requests) < count:
            await self._changed.wait()
        return self.requests


class Harness:
    """One Processor, one RequestChannel, scripted handlers, one MemoryPool; connections over memory streams."""

    def __init__(self, nursery: trio.Nursery, processor: Processor, request_channel: RequestChannel,
                 handlers: ScriptedHandlers, pool: MemoryPool, limits: ConnectionLimits,
                 quotas: ConnectionQuotas) -> None:
        self.nursery = nursery
        self.processor = processor
        self.request_channel = request_channel
        self.handlers = handlers
        self.pool = pool
        self.limits = limits
        self.quotas = quotas
        self.channels: dict[tuple[str, int], KafkaChannel] = {}
        """By the client's (address, port)."""

    async def connect(self, *, lockstep_responses: bool = False, read: bool = True,
                      listener: Listener = PLAINTEXT_LISTENER) -> tuple[Client, KafkaChannel]:
        """A new connection handed to the Processor; returns once its KafkaChannel is serving.

        Args:
            lockstep_responses: see ``stream_pair``.
            read: start the client's reader task (False: a client that never reads).
            listener: the listener it arrived on (no TLS: ``ssl_context`` must be None).
        """
        client, server_stream = stream_pair(lockstep_responses=lockstep_responses)
        assert self.quotas.try_acquire(client.remote[0]) is None
        await self.processor.accept(server_stream, client.remote[0], listener)  # type: ignore[arg-type]
        while client.remote not in self.channels:
            await trio.testing.wait_all_tasks_blocked()
        if read:
            self.nursery.start_soon(client.run)
        return client, self.channels[client.remote]

    async def wait_closed(self, channel: KafkaChannel) -> None:
        """Until the Processor has dropped ``channel`` (its stream is closed, its memory returned)."""
        while channel in self.processor.channels:
            await trio.sleep(0.01)


@asynccontextmanager
async def serving(
    *,
    pool_bytes: int = 1 << 20,
    request_channel: RequestChannel | None = None,
    handler_count: int = 1,
    auto_answer: bool = True,
    ordered: bool = True,
    **limits: int,
) -> AsyncIterator[Harness]:
    """A Processor serving in-memory connections, wired as ``Server.serve`` wires the real one."""
    pool = MemoryPool(pool_bytes)
    memory = MemoryWaiters(pool)
    connection_limits = ConnectionLimits(**limits)
    request_channel = request_channel or MultiQueueRequestChannel(1, 100)
    handlers = ScriptedHandlers(request_channel, auto_answer=auto_answer)
    quotas = ConnectionQuotas()
    channels: dict[tuple[str, int], KafkaChannel] = {}

    def channel_factory(connection_id: str, stream: MemorySocketStream, listener: Listener,
                        principal: str) -> KafkaChannel:
        state = ConnectionState(pool, connection_limits, trio.current_time(), ordered=ordered)
        channel = KafkaChannel(connection_id, stream, request_channel, state, memory, listener=listener.name,
                               security_protocol=listener.security_protocol, principal=principal)
        channels[stream.socket.remote] = channel
        return channel

    processor = Processor(0, channel_factory, quotas)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        harness = Harness(nursery, processor, request_channel, handlers, pool, connection_limits, quotas)
        harness.channels = channels
        await nursery.start(processor.run)
        for i in range(handler_count):
            await nursery.start(handlers.run, i)
        yield harness
        nursery.cancel_scope.cancel()
