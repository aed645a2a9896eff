"""KafkaChannel: one client connection, with one reader and one writer task.

The reader (Kafka Selector's read path + Processor.processCompletedReceives)
receives bytes, cuts them into frames with ``FrameDecoder``, parses each
request header, registers the request in the connection's
``ResponseSequencer`` and puts it on the RequestChannel. The writer (Kafka's
NetworkSend path) waits for responses whose turn has come and writes every one
that is ready in a single ``send_all``: one system call for many responses is
what lets a trio server go from ~20k to 60-80k frames/s.

Mute (Kafka KafkaChannel.mute / ChannelMuteState): with ``mute_after_request``
the reader stops after each request until its response has been written,
which is how classic Kafka keeps a connection ordered with a shared queue.

A malformed frame closes only this connection, with a logged reason: reading
stops at once, responses to the requests already accepted are still written
(bounded by ``drain_timeout_s``), then the socket closes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from pipeline.network.framing import FrameDecoder, InvalidReceiveError, encode_frame
from pipeline.protocol.errors import InvalidRequestError
from pipeline.protocol.header import parse_request_header
from pipeline.requests.channel import Request
from pipeline.requests.sequencing import ResponseSequencer

if TYPE_CHECKING:
    from pipeline.requests.channel import RequestChannel

log = logging.getLogger(__name__)

RECEIVE_SIZE = 256 * 1024
"""Bytes asked of the socket per read (Kafka's socket.receive.buffer.bytes is 100 KiB)."""


class KafkaChannel:
    """One connection; see the module docstring.

    Args:
        connection_id: Kafka's ``localAddr:localPort-remoteAddr:remotePort-index``.
        stream: the accepted trio stream.
        request_channel: where requests go.
        max_receive_bytes: largest request frame accepted (socket.request.max.bytes).
        mute_after_request: baseline mode: read the next request only after the
            previous one's response has been written.
        drain_timeout_s: how long a closing connection may wait for its
            in-flight responses (seconds).
        ordered_responses: False only for the benchmark's shared-unmuted
            ablation (responses written in completion order).
    """

    def __init__(
        self,
        connection_id: str,
        stream: trio.abc.Stream,
        request_channel: RequestChannel,
        *,
        max_receive_bytes: int,
        mute_after_request: bool = False,
        drain_timeout_s: float = 60.0,
        ordered_responses: bool = True,
    ) -> None:
        self.connection_id = connection_id
        self.client_software: tuple[str, str] | None = None
        self.close_reason: str | None = None
        self._stream = stream
        self._request_channel = request_channel
        self._decoder = FrameDecoder(max_receive_bytes)
        self._sequencer = ResponseSequencer(ordered=ordered_responses)
        self._mute_after_request = mute_after_request
        self._drain_timeout_s = drain_timeout_s
        self._read_scope = trio.CancelScope()
        self._reading_done = trio.Event()
        self._responses = trio.Event()
        self._unmuted = trio.Event()
        self._unmuted.set()
        self._closed = False
        self.requests_received = 0
        self.responses_sent = 0

    # -- called by handlers and the persister -------------------------------

    def complete(self, token: int, payload: bytes | None) -> None:
        """Response of request ``token`` is ready (None: it gets no response)."""
        if self._closed:
            return  # connection gone: nobody to answer
        self._sequencer.complete(token, payload)
        self._responses.set()

    def close(self, reason: str) -> None:
        """Close with a logged reason: stop reading, answer what is in flight, close."""
        if self.close_reason is None:
            self.close_reason = reason
            log.warning("closing connection %s: %s", self.connection_id, reason)
        self.stop_reading()

    def stop_reading(self) -> None:
        """Read no more requests (server shutdown, or ``close``)."""
        self._read_scope.cancel()

    @property
    def muted(self) -> bool:
        return not self._unmuted.is_set()

    @property
    def in_flight(self) -> int:
        """Requests read whose responses are not yet written."""
        return self._sequencer.in_flight

    async def wait_reading_done(self) -> None:
        await self._reading_done.wait()

    # -- the tasks -----------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it is closed; closes the stream."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write_loop, nursery.cancel_scope)
                await self._read_loop()
        finally:
            self._closed = True
            self._reading_done.set()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self._stream)

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
        decoder = self._decoder
        stream = self._stream
        batch_reads = self._request_channel.batches_per_read and not self._mute_after_request
        while True:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data:
                if decoder.buffered_bytes:
                    log.warning(
                        "connection %s: peer closed with a truncated frame (%d bytes buffered)",
                        self.connection_id, decoder.buffered_bytes,
                    )
                return
            decoder.receive_data(data)
            batch: list[Request] = []
            while (frame := decoder.next_frame()) is not None:
                header = parse_request_header(frame)
                token = self._sequencer.register(header.correlation_id)
                self.requests_received += 1
                batch.append(Request(self, header, frame, token, trio.current_time()))
                if not batch_reads:
                    await self._dispatch(batch)
                    batch = []
            if batch:
                await self._dispatch(batch)

    async def _dispatch(self, requests: list[Request]) -> None:
        if self._mute_after_request:
            self._unmuted = trio.Event()
        # Shielded: once registered, a request must reach a handler or its
        # slot would block every later response of this connection.
        with trio.CancelScope(shield=True):
            await self._request_channel.send_requests(requests)
        if self._mute_after_request:
            await self._unmuted.wait()

    async def _write_loop(self, connection_scope: trio.CancelScope) -> None:
        drain_deadline = float("inf")
        try:
            while True:
                ready = self._sequencer.pop_ready()
                if ready:
                    data = b"".join(encode_frame(r.payload) for r in ready if r.payload is not None)
                    if data:
                        await self._stream.send_all(data)
                    self.responses_sent += len(ready)
                    self._unmuted.set()
                    continue
                if self._reading_done.is_set():
                    if self._sequencer.in_flight == 0:
                        break
                    if drain_deadline == float("inf"):
                        drain_deadline = trio.current_time() + self._drain_timeout_s
                self._responses = trio.Event()
                with trio.move_on_at(drain_deadline) as scope:
                    await self._responses.wait()
                if scope.cancelled_caught:
                    log.warning(
                        "connection %s: closing with %d responses unsent after %.0f s",
                        self.connection_id, self._sequencer.in_flight, self._drain_timeout_s,
                    )
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.info("connection %s: write failed: %s", self.connection_id, exc)
        finally:
            connection_scope.cancel()
