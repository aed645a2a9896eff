"""The rules of one connection, without I/O: framing, memory, muting, timeouts, response order.

``ConnectionState`` is to a KafkaChannel what h11's ``Connection`` is to an
HTTP server: bytes and times go in as arguments, requests and bytes to write
come out, and no socket or clock is touched, so every rule is tested with
plain function calls. The trio layer (``pipeline/network/channel.py``) only
moves bytes and waits.

What it decides, and where each rule comes from:

* **Framing** (Kafka NetworkReceive): a 4-byte size, then the body; negative
  or oversize sizes raise ``InvalidReceiveError``.
* **Memory** (Kafka MemoryPool, KafkaChannel.read): once a frame's size is
  known its body is allocated from the shared ``MemoryPool``; a size the pool
  cannot serve now mutes the connection (``PAUSED``, ``MuteReason.MEMORY``)
  until memory returns; a size larger than the whole pool can never be served
  and raises ``InvalidReceiveError``. The allocation travels with the request
  (``ReceivedFrame.pool_bytes``) and is released by whoever finishes it.
* **In-flight cap** (AutoMQ: 64 per connection; classic Kafka mutes after each
  request, which is a cap of 1): with that many requests read but not yet
  answered on the wire, reading pauses until a response has been sent.
* **Response backlog**: once the responses waiting to be written pass
  ``response_buffer_max_bytes`` (a client that does not read), reading pauses.
* **Timeouts** (``timeout_reason``): a frame not completed within
  ``receive_timeout_ms`` of its first byte while the connection is being read
  (a stalled sender; time spent muted does not count); responses the client
  has not taken for ``send_timeout_ms`` (a client that never reads); no
  activity and nothing owed for ``idle_timeout_ms`` (Kafka
  ``connections.max.idle.ms``, Selector's idle expiry).
* **Response order** (Kafka's per-connection ordering promise): a
  ``ResponseSequencer`` releases responses in request order.
* **Raw SASL tokens** (KIP-43; Kafka ``SaslServerAuthenticator``): after a
  successful SaslHandshake v0 the client's frames are bare SASL tokens, not
  requests, until authentication completes. The SASL handler says when with
  ``raw_sasl_tokens``; such a frame is handed out under
  ``pipeline.protocol.header.RAW_SASL_TOKEN``. What the next frame is depends
  on the answer to the last one, so after a SaslHandshake v0 or a raw token
  reading pauses (``MuteReason.SASL``) until everything read is answered on
  the wire: the handler has switched the mode by then (it switches before it
  completes the answer), and a client only sends its next token after that
  answer anyway. Kafka's authenticator, too, reads one frame at a time.

Times are seconds on any monotonic clock (the caller's), limits are in ms and
bytes, as Kafka's properties are.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from pipeline.network.framing import (
    DEFAULT_MAX_RECEIVE_BYTES,
    FrameDecoder,
    InvalidReceiveError,
    encode_frame,
)
from pipeline.network.memory_pool import MemoryPool
from pipeline.protocol.errors import InvalidRequestError
from pipeline.protocol.header import (FAST_PATH_TABLE, RAW_SASL_TOKEN, SASL_HANDSHAKE_KEY, RequestHeader,
                                      parse_request_header)
from pipeline.network.sequencing import ResponseSequencer
from pipeline.fastinit import Layout, fast_frozen_init, layout
from pipeline.native import FRAME_CUT, cut_frames
from pipeline.network.connection_limits import (DEFAULT_IDLE_TIMEOUT_MS, DEFAULT_MAX_IN_FLIGHT,
                                                DEFAULT_RECEIVE_TIMEOUT_MS, DEFAULT_RESPONSE_BUFFER_MAX_BYTES,
                                                DEFAULT_SEND_TIMEOUT_MS)


class MuteReason(enum.Enum):
    """Why a connection is not being read (Kafka ChannelMuteState, by cause)."""

    MEMORY = "memory"
    """The MemoryPool cannot serve the next frame's size now."""
    IN_FLIGHT = "in-flight"
    """``max_in_flight`` requests are read and not yet answered."""
    RESPONSE_BACKLOG = "response-backlog"
    """Unsent responses exceed ``response_buffer_max_bytes``."""
    SASL = "sasl"
    """A SaslHandshake v0 or a raw SASL token is not answered yet: its answer decides what the
    next frame is (a raw token or a request)."""


class _Sentinel(enum.Enum):
    NEED_DATA = "NEED_DATA"
    PAUSED = "PAUSED"


NEED_DATA: Final = _Sentinel.NEED_DATA
"""``next_request``: read more bytes from the socket, then ask again."""
PAUSED: Final = _Sentinel.PAUSED
"""``next_request``: do not read now; ``mute_reason`` says what to wait for."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Per-connection limits; sizes in bytes, times in ms.

    Attributes:
        max_receive_bytes: largest frame (Kafka ``socket.request.max.bytes``).
        max_in_flight: requests read and not yet answered before reading
            pauses (>= 1; 1 is classic Kafka's mute-until-response).
        response_buffer_max_bytes: unsent response bytes before reading pauses.
        receive_timeout_ms: a frame's first-to-last byte, while being read.
        send_timeout_ms: responses not taken by the client for this long close it.
        idle_timeout_ms: no traffic and nothing owed for this long closes it
            (Kafka ``connections.max.idle.ms``).
    """

    max_receive_bytes: int = DEFAULT_MAX_RECEIVE_BYTES
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    response_buffer_max_bytes: int = DEFAULT_RESPONSE_BUFFER_MAX_BYTES
    receive_timeout_ms: int = DEFAULT_RECEIVE_TIMEOUT_MS
    send_timeout_ms: int = DEFAULT_SEND_TIMEOUT_MS
    idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS

    def __post_init__(self) -> None:
        for name in ("max_receive_bytes", "max_in_flight", "response_buffer_max_bytes",
                     "receive_timeout_ms", "send_timeout_ms", "idle_timeout_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class ReceivedFrame:
    """A whole request frame, read and registered for its response.

    Attributes:
        header: the parsed request header.
        frame: the frame body (header + request body), without the size prefix.
        token: its place in the connection's response order (for ``complete``).
        pool_bytes: bytes allocated for it from the MemoryPool; the receiver
            must ``MemoryPool.release`` them once done with the frame.
    """

    header: RequestHeader
    frame: bytes | bytearray
    token: int
    pool_bytes: int


_HEADER_LAYOUT = layout(RequestHeader)


class ConnectionState:
    """One connection's rules; see the module docstring.

    Reading::

        state.receive_data(chunk, now)             # bytes from the socket
        while isinstance(ev := state.next_request(now), ReceivedFrame):
            dispatch(ev)                           # release ev.pool_bytes later
        # ev is NEED_DATA (read more) or PAUSED (wait, see mute_reason)

    Writing::

        state.complete(token, payload)             # a handler's response, any order
        data = state.data_to_send(now)             # None: nothing; b"": only acks=0 slots
        ...send data...; state.send_done(now)

    Args:
        pool: the server's MemoryPool.
        limits: see ConnectionLimits.
        now: the time the connection was accepted (s).
        ordered: False only for the benchmark's shared-unmuted ablation
            (responses in completion order).
    """

    __slots__ = ("_pool", "limits", "_decoder", "_sequencer", "_allocated", "_frame_started",
                 "_last_activity", "_unsent_bytes", "_sending_bytes", "_sending_count",
                 "_sending_since", "mute_reason", "closed", "sending_tokens", "raw_sasl_tokens",
                 "_sasl_unanswered")

    def __init__(self, pool: MemoryPool, limits: ConnectionLimits, now: float, *, ordered: bool = True) -> None:
        self._pool = pool
        self.limits = limits
        self._decoder = FrameDecoder(limits.max_receive_bytes)
        self._sequencer = ResponseSequencer(ordered=ordered)
        self._allocated: int | None = None  # pool bytes held by the frame being received
        self._frame_started: float | None = None  # first byte of it, or when reading resumed
        self._last_activity = now
        self._unsent_bytes = 0  # completed responses not yet written, incl. the send under way
        self._sending_bytes = 0
        self._sending_count = 0
        self._sending_since: float | None = None
        self.mute_reason: MuteReason | None = None
        """Why the last ``next_request`` returned PAUSED (None: not muted)."""
        self.closed = False
        self.sending_tokens: list[int] = []
        """Tokens of the requests answered by the last ``data_to_send``, in
        writing order (those that get no response included): whose response
        times to record once the data is written."""
        self.raw_sasl_tokens = False
        """The next frames are raw SASL tokens, not requests (KIP-43): set by the SASL handler
        when a SaslHandshake v0 succeeds, cleared when authentication completes, each time
        before it completes that answer."""
        self._sasl_unanswered = False  # a SaslHandshake v0 or raw token read, its answer not yet written

    # -- reading -------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests read whose responses are not yet written (acks=0 ones leave at their turn)."""
        return self._sequencer.in_flight + self._sending_count

    @property
    def buffered_bytes(self) -> int:
        """Received bytes not yet handed out as a request."""
        return self._decoder.buffered_bytes

    @property
    def unsent_bytes(self) -> int:
        """Response bytes completed but not yet written (including a send under way)."""
        return self._unsent_bytes

    def receive_data(self, data: bytes | bytearray | memoryview, now: float) -> None:
        """Bytes read from the socket (any split, any number of frames)."""
        if not data:
            return
        if self._frame_started is None and self._decoder.buffered_bytes == 0:
            self._frame_started = now
        self._decoder.receive_data(data)
        self._last_activity = now

    def receive_buffer(self) -> memoryview | None:
        """Where the next read may go straight into the frame being received (``FrameDecoder.receive_buffer``);
        None: read and pass the bytes to ``receive_data``."""
        return self._decoder.receive_buffer()

    def received_into(self, n: int, now: float) -> None:
        """``n`` bytes were read into ``receive_buffer()`` (``FrameDecoder.received_into``)."""
        self._decoder.received_into(n)
        self._last_activity = now

    def next_request(self, now: float) -> ReceivedFrame | _Sentinel:
        """The next whole request, NEED_DATA, or PAUSED.

        Raises:
            InvalidReceiveError: negative size, size over ``max_receive_bytes``,
                or over the whole MemoryPool's capacity; the connection must close.
            InvalidRequestError: the request header cannot be parsed; close.
        """
        if self._sasl_unanswered:
            if self.in_flight:
                return self._pause(MuteReason.SASL)
            self._sasl_unanswered = False
        if self.in_flight >= self.limits.max_in_flight:
            return self._pause(MuteReason.IN_FLIGHT)
        if self._unsent_bytes > self.limits.response_buffer_max_bytes:
            return self._pause(MuteReason.RESPONSE_BACKLOG)
        size = self._decoder.next_size()
        if size is None:
            self._resume(now)
            return NEED_DATA
        if self._allocated is None:
            if size > self._pool.capacity:
                raise InvalidReceiveError(
                    f"invalid receive: frame size {size} bytes is larger than the whole memory pool "
                    f"(queued.max.request.bytes {self._pool.capacity})", size)
            if not self._pool.try_allocate(size):
                return self._pause(MuteReason.MEMORY)
            self._allocated = size
        self._resume(now)
        frame = self._decoder.next_frame(size)
        if frame is None:
            return NEED_DATA
        pool_bytes, self._allocated = self._allocated, None
        self._frame_started = now if self._decoder.buffered_bytes else None
        self._last_activity = now
        if self.raw_sasl_tokens:
            header = RAW_SASL_TOKEN
            self._sasl_unanswered = True
        else:
            try:
                header = parse_request_header(frame)
            except InvalidRequestError:
                self._pool.release(pool_bytes)
                raise
            if header.api_key == SASL_HANDSHAKE_KEY and header.api_version == 0:
                self._sasl_unanswered = True
        FRAME_CUT.python += 1
        return ReceivedFrame(header, frame, self._sequencer.register(header.correlation_id), pool_bytes)

    def take_requests(self, now: float, make: Layout, owner: object) -> list:
        """Every whole request already received that ``next_request`` would return in a row with
        no special case, built by ``make`` (``pipeline.fastinit.layout`` of a slotted dataclass
        whose first fields are: owner, header, frame, token, received at, pool bytes, pool), in
        one C call (``pipeline.native.cut_frames``); [] when there is none. Each is registered and holds
        its frame's bytes of the MemoryPool, as ``next_request``'s would; call ``next_request``
        after it for the next frame, which may need the Python path (incomplete, too large, no
        room in the pool, in-flight or response limits, SASL, a header the fast path leaves).

        Tokens, pool bytes, pauses and errors are exactly ``next_request``'s, one frame at a time.
        """
        room = self.limits.max_in_flight - self.in_flight
        if (room <= 0 or self._allocated is not None or self._sasl_unanswered or self.raw_sasl_tokens
                or self._unsent_bytes > self.limits.response_buffer_max_bytes):
            return []
        decoder = self._decoder
        at = decoder.whole_frames()
        if at is None:
            return []
        pool = self._pool
        requests, position, used, correlation_ids = cut_frames(
            at[0], at[1], room, pool.available, decoder.max_receive_bytes, FAST_PATH_TABLE, _HEADER_LAYOUT, make,
            owner, self._sequencer.next_token, now, pool)
        if not requests:
            return requests
        if not pool.try_allocate(used):  # pragma: no cover - cut stays within pool.available
            raise AssertionError(f"{used} bytes cut from a pool with {pool.available} available")
        decoder.skip_to(position)
        self._sequencer.register_all(correlation_ids)
        self.mute_reason = None
        self._frame_started = now if decoder.buffered_bytes else None
        self._last_activity = now
        return requests

    def _pause(self, reason: MuteReason) -> _Sentinel:
        self.mute_reason = reason
        return PAUSED

    def _resume(self, now: float) -> None:
        if self.mute_reason is not None:
            self.mute_reason = None
            if self._decoder.buffered_bytes:
                self._frame_started = now  # time spent muted is not the sender's

    # -- writing -------------------------------------------------------------

    def complete(self, token: int, payload: bytes | None) -> None:
        """Response (without size prefix) of request ``token``; None: it gets no response.

        Raises:
            SequencingError: ``token`` is not in flight.
        """
        self._sequencer.complete(token, payload)
        if payload is not None:
            self._unsent_bytes += len(payload) + 4

    def complete_unanswered(self, tokens: list[int]) -> None:
        """``complete(token, None)`` for each of ``tokens``, in order: they get no response.

        Raises:
            SequencingError: a token is not in flight (the tokens before it are complete).
        """
        self._sequencer.complete_unanswered(tokens)

    def pop_unanswered(self) -> list[int]:
        """Free the slots of the requests next in line that get no response (acks=0), up to the
        first one with a response or not yet complete; their tokens, in order
        (``ResponseSequencer.pop_unanswered``). Nothing is written for them, so they need not
        wait for the writer; ``data_to_send`` still returns what is left."""
        return self._sequencer.pop_unanswered()

    @property
    def response_ready(self) -> bool:
        """Whether ``data_to_send`` would return something now."""
        return self._sequencer.has_ready()

    def data_to_send(self, now: float) -> bytes | None:
        """Frames of every response whose turn has come, joined for one write.

        Returns None when no response is ready; b"" when the ready ones all
        get no response (their slots are freed at once). Call ``send_done``
        once non-empty data has been written; only one send at a time.
        ``sending_tokens`` then names the requests the data answers.
        """
        tokens, payloads = self._sequencer.pop_ready_payloads()
        if not tokens:
            return None
        self.sending_tokens = tokens
        if not payloads:
            return b""
        frames = [encode_frame(payload) for payload in payloads]
        data = b"".join(frames)
        self._sending_bytes = len(data)
        self._sending_count = len(frames)
        self._sending_since = now
        return data

    def send_done(self, now: float) -> None:
        """The data of the last ``data_to_send`` has been written to the socket."""
        self._unsent_bytes -= self._sending_bytes
        self._sending_bytes = self._sending_count = 0
        self._sending_since = None
        self._last_activity = now

    # -- time and end ----------------------------------------------------------

    def timeout_reason(self, now: float) -> str | None:
        """Why the connection must be closed now because of a timeout, or None."""
        limits = self.limits
        if self._sending_since is not None and now - self._sending_since >= limits.send_timeout_ms / 1000:
            return (f"client did not read its responses for {limits.send_timeout_ms} ms "
                    f"({self._unsent_bytes} bytes unsent)")
        buffered = self._decoder.buffered_bytes
        if (buffered and self.mute_reason is None and self._frame_started is not None
                and now - self._frame_started >= limits.receive_timeout_ms / 1000):
            size = self._allocated if self._allocated is not None else "?"
            return (f"request frame not completed within {limits.receive_timeout_ms} ms "
                    f"({buffered} bytes received, frame size {size})")
        if (not buffered and self.in_flight == 0 and self._unsent_bytes == 0
                and now - self._last_activity >= limits.idle_timeout_ms / 1000):
            return f"idle for {limits.idle_timeout_ms} ms (connections.max.idle.ms)"
        return None

    def close(self) -> None:
        """The connection is gone: return the memory of a frame still being received. Idempotent."""
        if not self.closed:
            self.closed = True
            if self._allocated is not None:
                self._pool.release(self._allocated)
                self._allocated = None
