"""KafkaChannel: one client connection, with one reader and one writer task.

The rules (framing, MemoryPool allocation, muting, in-flight cap, response
backlog, timeouts, response order) live in the sans-I/O ``ConnectionState``;
this layer only moves bytes and waits, in the shape of hypercorn's trio
worker:

* the reader (Kafka Selector's read path + Processor.processCompletedReceives)
  feeds socket bytes to the state, puts every request it hands out on the
  RequestChannel, and when the state says PAUSED (Kafka's mute) waits for
  what the mute reason names: memory returned to the pool, or a response
  written;
* the writer (Kafka's NetworkSend path) writes every response whose turn has
  come in a single ``send_all``: one system call for many responses is what
  lets a trio server go from ~20k to 60-80k frames/s.

Each request is stamped as it passes (read, response complete, response taken
by the writer, written; its handler stamps the rest), and once its response
is written its stage times go to the RequestChannel's ``RequestMetrics``
(Kafka: ``updateRequestMetrics`` after the Processor's send completes).

A malformed frame closes only this connection, with a logged reason: reading
stops at once, responses to the requests already accepted are still written
(bounded by ``drain_timeout_s``), then the socket closes. A timeout (stalled
sender, client not reading, idle) aborts the connection at once.

Closing after we stopped reading (shutdown, a bad frame) is a *lingering
close*: closing a TCP socket with unread bytes in its receive buffer sends
RST, and a peer that gets RST may discard the responses it has not read yet.
So the writer's last act is a FIN (``send_eof``), then whatever the peer
still sends is read and dropped until it closes too, for at most
``CLOSE_LINGER_S`` (what HTTP servers call lingering close, e.g. Apache's
``lingering_close``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from pipeline.network.connection_state import (
    NEED_DATA,
    ConnectionState,
    MuteReason,
    ReceivedFrame,
)
from pipeline.network.framing import InvalidReceiveError
from pipeline.protocol.errors import InvalidRequestError
from pipeline.network.request_channel import Request
from pipeline.protocol.header import RAW_SASL_TOKEN
from pipeline.fastinit import layout

if TYPE_CHECKING:
    from pipeline.network.memory_pool import MemoryPool
    from pipeline.network.request_channel import RequestChannel

log = logging.getLogger(__name__)

RECEIVE_SIZE = 100 * 1024
"""Bytes asked of the socket per read (Kafka's ``socket.receive.buffer.bytes`` default, 100 KiB).

It bounds what a connection may hold beyond its MemoryPool allocation: one read.
"""


_REQUEST_LAYOUT = layout(Request)
"""Builds the Requests of ``ConnectionState.take_requests`` (in C)."""

CLOSE_LINGER_S = 2.0
"""How long a closing connection drains the peer's unread bytes after its FIN (seconds)."""


class MemoryWaiters:
    """Wakes channels muted for memory whenever the MemoryPool gets bytes back (trio side of the pool)."""

    def __init__(self, pool: MemoryPool) -> None:
        self.pool = pool
        self._released = trio.Event()
        self._waiting = 0
        pool.add_release_listener(self._notify)

    def _notify(self) -> None:
        # Every handled request releases its frame: only wake (and replace
        # the Event) when a muted channel is actually waiting.
        if self._waiting:
            released, self._released = self._released, trio.Event()
            released.set()

    async def wait(self) -> None:
        """Until the next release."""
        self._waiting += 1
        try:
            await self._released.wait()
        finally:
            self._waiting -= 1


ANONYMOUS = "User:ANONYMOUS"
"""Kafka's KafkaPrincipal.ANONYMOUS: the principal of an unauthenticated connection."""


def _peer_host(connection_id: str) -> str:
    """The remote address of a ``local-remote-index`` connection id ("" if it has another shape)."""
    parts = connection_id.rsplit("-", 2)
    return parts[1].rsplit(":", 1)[0] if len(parts) == 3 else ""


class KafkaChannel:
    """One connection; see the module docstring.

    Args:
        connection_id: Kafka's ``localAddr:localPort-remoteAddr:remotePort-index``.
        stream: the accepted trio stream.
        request_channel: where requests go.
        state: the connection's rules (owns the frame decoder and response order).
        memory: wake-ups for memory returned to the state's MemoryPool.
        listener: the listener name it came in on (Kafka ``listeners``).
        security_protocol: that listener's (Kafka ``listener.security.protocol.map``).
        principal: who the client is before any SASL exchange: ``ANONYMOUS``, or an mTLS
            certificate's subject.
        drain_timeout_s: how long a closing connection may wait for its
            in-flight responses (seconds).
    """

    def __init__(
        self,
        connection_id: str,
        stream: trio.abc.Stream,
        request_channel: RequestChannel,
        state: ConnectionState,
        memory: MemoryWaiters,
        *,
        listener: str = "PLAINTEXT",
        security_protocol: str = "PLAINTEXT",
        principal: str = ANONYMOUS,
        drain_timeout_s: float = 60.0,
    ) -> None:
        self.connection_id = connection_id
        self.client_software: tuple[str, str] | None = None
        self.listener = listener
        self.security_protocol = security_protocol
        self.principal = principal
        self.peer_host = _peer_host(connection_id)
        self.close_reason: str | None = None
        self.state = state
        self._stream = stream
        self._request_channel = request_channel
        self._memory = memory
        self._drain_timeout_s = drain_timeout_s
        self._read_scope = trio.CancelScope()
        self._connection_scope: trio.CancelScope | None = None
        self._aborted = False
        self._stopped_reading_first = False  # we stopped reading while the peer may still be sending
        self._reading_done = trio.Event()
        self._responses = trio.Event()
        self._sent = trio.Event()
        self._requests: dict[int, Request] = {}  # token -> request, until its response is written
        self._metrics = request_channel.metrics

    # -- called by handlers, the persister and the Processor -------------------

    def complete(self, token: int, payload: bytes | None) -> None:
        """Response of request ``token`` is ready (None: it gets no response)."""
        if self.state.closed:
            return  # connection gone: nobody to answer
        self.state.complete(token, payload)
        request = self._requests.get(token)
        if request is not None:
            request.response_at = trio.current_time()
        self._responses.set()

    def complete_without_response(self, tokens: list[int]) -> None:
        """``complete(token, None)`` for each of ``tokens``, in order, with one clock reading.

        The slots of those whose turn has come are freed here (their stage times recorded, a
        reader paused for the in-flight cap woken): there is nothing to write for them, so the
        writer is woken only if a response is ready after them (or the connection is
        draining), not once per handled batch of acks=0 requests.
        """
        state = self.state
        if state.closed:
            return
        requests = self._requests
        now = trio.current_time()
        state.complete_unanswered(tokens)
        for token in tokens:
            request = requests.get(token)
            if request is not None:
                request.response_at = now
        freed = state.pop_unanswered()
        if freed:
            self._record_sent(freed, now, now)
            self._sent.set()
        if state.response_ready or self._reading_done.is_set():
            self._responses.set()

    def set_raw_sasl_tokens(self, raw: bool) -> None:
        """The next frames are raw SASL tokens (True, after a SaslHandshake v0) or requests again
        (``ConnectionState.raw_sasl_tokens``)."""
        self.state.raw_sasl_tokens = raw

    def identified(self, software: tuple[str, str]) -> None:
        """The client's (name, version) from ApiVersions v3+ (``ConnectionHandle.identified``, KIP-511)."""
        self.client_software = software

    def authenticated(self, principal: str) -> None:
        """SASL authentication completed as ``principal`` (``ConnectionHandle.authenticated``)."""
        self.principal = principal

    def close(self, reason: str) -> None:
        """Close with a logged reason: stop reading, answer what is in flight, close."""
        if self.close_reason is None:
            self.close_reason = reason
            log.warning("closing connection %s: %s", self.connection_id, reason,
                        extra={"connection_id": self.connection_id})
        self.stop_reading()

    def abort(self, reason: str) -> None:
        """Close at once with a logged reason, dropping unsent responses (timeouts)."""
        if self.close_reason is None:
            self.close_reason = reason
            # The Processor's reaper calls this outside the connection's tasks.
            log.warning("closing connection %s: %s", self.connection_id, reason,
                        extra={"connection_id": self.connection_id})
        self._aborted = True
        self.stop_reading()
        if self._connection_scope is not None:
            self._connection_scope.cancel()

    def stop_reading(self) -> None:
        """Read no more requests (server shutdown, or ``close``)."""
        if not self._reading_done.is_set():
            self._stopped_reading_first = True
        self._read_scope.cancel()

    @property
    def muted(self) -> bool:
        """Not being read now (Kafka KafkaChannel.isMuted)."""
        return self.state.mute_reason is not None

    async def wait_reading_done(self) -> None:
        await self._reading_done.wait()

    # -- the tasks -----------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it is closed; closes the stream and returns its memory."""
        try:
            async with trio.open_nursery() as nursery:
                self._connection_scope = nursery.cancel_scope
                if self._aborted:
                    nursery.cancel_scope.cancel()
                nursery.start_soon(self._write_loop, nursery.cancel_scope)
                await self._read_loop()
        finally:
            self.state.close()
            self._reading_done.set()
            with trio.CancelScope(shield=True):
                if self._stopped_reading_first and not self._aborted:
                    await self._linger()
                await trio.aclose_forcefully(self._stream)

    async def _linger(self) -> None:
        """FIN, then read and drop until the peer closes, at most ``CLOSE_LINGER_S``."""
        if not isinstance(self._stream, trio.abc.HalfCloseableStream):
            return
        with trio.move_on_after(CLOSE_LINGER_S):
            try:
                await self._stream.send_eof()
                while await self._stream.receive_some(RECEIVE_SIZE):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError, OSError):
                pass

    async def _read_loop(self) -> None:
        try:
            with self._read_scope:
                await self._read_requests()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.info("connection %s: read failed: %s", self.connection_id, exc)
        except InvalidReceiveError as exc:
            self.close(str(exc))
        except InvalidRequestError as exc:
            self.close(f"invalid request: {exc}")
        finally:
            self._reading_done.set()
            self._responses.set()  # let the writer notice

    async def _read_requests(self) -> None:
        state = self.state
        stream = self._stream
        pool = self._memory.pool
        batch_reads = self._request_channel.batches_per_read
        requests = self._requests
        # A plain TCP stream's socket, read with recv_into for large frames (TLS goes through its stream).
        sock = stream.socket if isinstance(stream, trio.SocketStream) else None
        while True:
            now = trio.current_time()
            batch: list[Request] = []
            try:
                while True:
                    if batch_reads:  # the plain frames of the read in one C call
                        taken = state.take_requests(now, _REQUEST_LAYOUT, self)
                        for request in taken:
                            requests[request.token] = request
                        batch += taken
                    if not isinstance(event := state.next_request(now), ReceivedFrame):
                        break
                    request = Request(self, event.header, event.frame, event.token, now, event.pool_bytes, pool)
                    requests[event.token] = request
                    batch.append(request)
                    if not batch_reads:
                        await self._dispatch(batch)
                        batch = []
                        now = trio.current_time()
            except (InvalidReceiveError, InvalidRequestError):
                # A malformed frame after good ones of the same read: those
                # are registered for a response and hold pool memory, so they
                # go to a handler like any accepted request (dropped here,
                # their memory would never return and the close would wait
                # for responses that never come).
                if batch:
                    await self._dispatch(batch)
                raise
            if batch:
                await self._dispatch(batch)
                continue  # the state may have moved while we waited: ask again
            if event is NEED_DATA:
                if sock is not None and (into := state.receive_buffer()) is not None:
                    # The rest of a large frame: straight from the kernel into it.
                    with into:
                        n = await sock.recv_into(into)
                    if not n:
                        log.warning("connection %s: peer closed with a truncated frame (%d bytes buffered)",
                                    self.connection_id, state.buffered_bytes)
                        return
                    state.received_into(n, trio.current_time())
                    continue
                data = await stream.receive_some(RECEIVE_SIZE)
                if not data:
                    if state.buffered_bytes:
                        log.warning("connection %s: peer closed with a truncated frame (%d bytes buffered)",
                                    self.connection_id, state.buffered_bytes)
                    return
                state.receive_data(data, trio.current_time())
            elif state.mute_reason is MuteReason.MEMORY:
                await self._memory.wait()
            else:  # in-flight cap, response backlog or a SASL answer due: wait for the writer
                self._sent = trio.Event()
                await self._sent.wait()

    async def _dispatch(self, requests: list[Request]) -> None:
        try:
            if self._request_channel.try_send_requests(requests):
                return  # room in the queue: no wait, so nothing to shield
            # Shielded: once registered, a request must reach a handler or its
            # slot would block every later response of this connection, and its
            # memory would never return to the pool.
            with trio.CancelScope(shield=True):
                await self._request_channel.send_requests(requests)
        except trio.ClosedResourceError:  # server stopping: nobody will handle them
            for request in requests:
                request.release()
            raise

    def _record_sent(self, tokens: list[int], taken: float, sent: float) -> None:
        """The responses of ``tokens`` were taken at ``taken`` and written at ``sent`` (s)."""
        record = self._metrics.record
        requests = self._requests
        # Requests of one read handled in one run share their api and times: recorded at once.
        same: tuple[int, int, float, float, float, float] | None = None
        count = 0
        for token in tokens:
            request = requests.pop(token, None)
            if request is not None and (header := request.header) is not RAW_SASL_TOKEN:
                times = (header.api_key, header.api_version, request.received_at, request.dequeued_at,
                         request.local_done_at, request.response_at)
                if times == same:
                    count += 1
                    continue
                if same is not None:
                    record(*same, taken, sent, count)
                same, count = times, 1
        if same is not None:
            record(*same, taken, sent, count)

    async def _write_loop(self, connection_scope: trio.CancelScope) -> None:
        state = self.state
        drain_deadline = float("inf")
        try:
            while True:
                taken = trio.current_time()
                data = state.data_to_send(taken)
                if data is not None:
                    sent = taken
                    if data:
                        await self._stream.send_all(data)
                        sent = trio.current_time()
                        state.send_done(sent)
                    self._record_sent(state.sending_tokens, taken, sent)
                    self._sent.set()  # a reader paused for the in-flight cap may go on
                    continue
                if self._reading_done.is_set():
                    if state.in_flight == 0:
                        break
                    if drain_deadline == float("inf"):
                        drain_deadline = trio.current_time() + self._drain_timeout_s
                self._responses = trio.Event()
                if drain_deadline == float("inf"):
                    # Still reading: no deadline, so no cancel scope per wait (one per response
                    # written, ~3 % of the event loop at acks=0). The reader's end sets the event.
                    await self._responses.wait()
                    continue
                with trio.move_on_at(drain_deadline) as scope:
                    await self._responses.wait()
                if scope.cancelled_caught:
                    log.warning(
                        "connection %s: closing with %d responses unsent after %.0f s",
                        self.connection_id, state.in_flight, self._drain_timeout_s,
                    )
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.info("connection %s: write failed: %s", self.connection_id, exc)
        finally:
            connection_scope.cancel()
