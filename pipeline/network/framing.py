"""Size-prefixed framing of a Kafka TCP byte stream, without I/O.

Kafka frames every request and response as a 4-byte big-endian signed size
followed by that many bytes (Kafka NetworkReceive / NetworkSend). TCP delivers
a byte stream, so one read may hold several frames (coalesced) or a fraction
of one (split, down to a single byte). ``FrameDecoder`` takes bytes as they
arrive and hands out whole frames; it never touches a socket or a clock, so it
is tested with plain function calls (the h11 style).

Extraction is linear in the bytes received: the buffer is consumed by moving a
read position and compacting at most once per ``receive_data`` call, never by
re-slicing the remainder after every frame. When a read starts on a frame
boundary (nothing left over from the last one, the usual case) its bytes
are not copied into the buffer at all: each frame is one ``bytes`` slice of
the read (a frame costs one copy, not two). A frame of ``LARGE_FRAME_BYTES`` or
more is read into a buffer of its declared size, allocated once its size
prefix is known (Kafka NetworkReceive allocates the body from the MemoryPool
the same way), so it is never held twice: peak memory per connection is the
frame plus one read. While such a body fills, ``receive_buffer`` lends its
unfilled part, so a plain socket can ``recv_into`` it: the bytes then cross
from the kernel into the frame with no copy in Python at all.
"""

from __future__ import annotations

import struct
from typing import Final

SIZE_PREFIX: Final = struct.Struct(">i")
"""The frame size prefix: 4 bytes, big-endian, signed (Kafka NetworkReceive)."""

DEFAULT_MAX_RECEIVE_BYTES: Final = 100 * 1024 * 1024
"""Kafka's default ``socket.request.max.bytes``: 104857600 bytes (100 MiB)."""


LARGE_FRAME_BYTES: Final = 64 * 1024
"""Frames of at least this many bytes that span reads get their own buffer of exactly their size.

64 KiB: below the channel's read size (100 KiB), so a frame that fits one read
is sliced out of it, and every frame that needs several reads (librdkafka's
produce requests reach ``batch.size``, 1,000,000 bytes) is received once into
its own buffer instead of being appended to a growing one and copied out
(issue 13: those two copies were ~20 % of the event loop's samples with 1 KiB
records)."""


class InvalidReceiveError(Exception):
    """A size prefix that no valid frame can have; the connection must be closed.

    Raised for a negative size, or a size above the decoder's
    ``max_receive_bytes`` (Kafka NetworkReceive.readFrom throws
    InvalidReceiveException for both). ``size`` holds the offending value.
    Once raised, the decoder is poisoned: further calls raise again.
    """

    def __init__(self, message: str, size: int) -> None:
        super().__init__(message)
        self.size = size


class FrameDecoder:
    """Cuts a byte stream into frames: ``receive_data`` in, ``next_frame`` out.

    Usage::

        decoder.receive_data(chunk)          # any number of bytes, any split
        while (frame := decoder.next_frame()) is not None:
            handle(frame)                   # bytes of one frame body

    Args:
        max_receive_bytes: largest accepted frame body, in bytes (Kafka
            ``socket.request.max.bytes``). A size of 0 is a valid empty frame.

    Raises:
        InvalidReceiveError: from ``next_size``/``next_frame`` when the next
            size prefix is negative or larger than ``max_receive_bytes``. The
            bytes of the invalid frame are never buffered beyond what was
            already received.

    Frames are ``bytes``, except those of ``LARGE_FRAME_BYTES`` or more, which
    are handed out as the ``bytearray`` they were received into (no copy).
    """

    __slots__ = ("_buf", "_pos", "_max", "_error", "_body", "_filled")

    def __init__(self, max_receive_bytes: int = DEFAULT_MAX_RECEIVE_BYTES) -> None:
        if max_receive_bytes < 0:
            raise ValueError(f"max_receive_bytes must be >= 0, got {max_receive_bytes}")
        self._buf: bytes | bytearray = bytearray()
        """Received bytes from ``_pos`` on: the last read's own ``bytes`` while
        nothing was left over before it, else a growable ``bytearray``."""
        self._pos = 0
        self._max = max_receive_bytes
        self._error: InvalidReceiveError | None = None
        self._body: bytearray | None = None  # the large frame being received
        self._filled = 0

    @property
    def max_receive_bytes(self) -> int:
        """The largest accepted frame body (bytes)."""
        return self._max

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet handed out as frames (size prefixes included)."""
        body = SIZE_PREFIX.size + self._filled if self._body is not None else 0
        return body + len(self._buf) - self._pos

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes read from the stream (any length, including 0)."""
        if self._body is not None:
            taken = min(len(data), len(self._body) - self._filled)
            self._body[self._filled : self._filled + taken] = data[:taken]
            self._filled += taken
            data = data[taken:]
            if not data:
                return
        buf = self._buf
        if self._pos >= len(buf) and isinstance(data, bytes):
            # Nothing left over (the usual case): frames are sliced straight
            # out of the read's own bytes, one copy each, no buffer copy.
            self._buf, self._pos = data, 0
            return
        if isinstance(buf, bytes):
            # A partial frame stays from the last read: from here on a
            # growable buffer (one copy of the leftover).
            self._buf = bytearray(memoryview(buf)[self._pos:])
            self._pos = 0
        elif self._pos:
            # Compact once per read, not once per frame: keeps total work
            # linear in bytes received however many frames a read holds.
            del buf[: self._pos]
            self._pos = 0
        self._buf += data

    def receive_buffer(self) -> memoryview | None:
        """The unfilled part of the large frame being received, to read into; None if there is none.

        Bytes written into it count once ``received_into(n)`` is called; the
        view must not be kept after that.
        """
        if self._body is None:
            return None
        return memoryview(self._body)[self._filled:]

    def received_into(self, n: int) -> None:
        """``n`` bytes (0 < n <= len(receive_buffer())) were written at the start of ``receive_buffer()``.

        Raises:
            ValueError: no large frame is being received, or ``n`` is out of range.
        """
        if self._body is None or not 0 < n <= len(self._body) - self._filled:
            raise ValueError(f"received_into({n}) outside the frame being received")
        self._filled += n

    def whole_frames(self) -> tuple[bytes | bytearray, int] | None:
        """``(buffer, position)``: where the received bytes not yet handed out start, for a caller
        that cuts the whole frames there itself (``pipeline._frames.cut``) and then calls
        ``skip_to``; None while a large frame is being received or after an invalid size (use
        ``next_frame``). The buffer must not be kept past ``receive_data``."""
        if self._body is not None or self._error is not None:
            return None
        return self._buf, self._pos

    def skip_to(self, position: int) -> None:
        """The frames before ``position`` (from ``whole_frames``) were handed out.

        Raises:
            ValueError: ``position`` before the current one or past the buffered bytes.
        """
        if not self._pos <= position <= len(self._buf):
            raise ValueError(f"skip_to({position}) outside {self._pos}..{len(self._buf)}")
        self._pos = position

    def next_size(self) -> int | None:
        """Declared body size of the next frame (bytes), or None until its prefix is in.

        Raises:
            InvalidReceiveError: see the class docstring (Kafka NetworkReceive.readFrom).
        """
        if self._error is not None:
            raise self._error
        if self._body is not None:
            return len(self._body)
        if len(self._buf) - self._pos < SIZE_PREFIX.size:
            return None
        (size,) = SIZE_PREFIX.unpack_from(self._buf, self._pos)
        if size < 0:
            self._error = InvalidReceiveError(f"invalid receive: negative frame size {size}", size)
            raise self._error
        if size > self._max:
            self._error = InvalidReceiveError(
                f"invalid receive: frame size {size} bytes is larger than "
                f"socket.request.max.bytes {self._max}",
                size,
            )
            raise self._error
        return size

    def next_frame(self, size: int | None = None) -> bytes | bytearray | None:
        """Return the next complete frame body, or None if more bytes are needed.

        ``size``: what ``next_size()`` just returned, if the caller asked (not asked again).

        Raises:
            InvalidReceiveError: see the class docstring.
        """
        if size is None:
            size = self.next_size()
            if size is None:
                return None
        if self._body is not None:
            if self._filled < len(self._body):
                return None
            body, self._body, self._filled = self._body, None, 0
            return body
        buf, pos = self._buf, self._pos
        end = pos + SIZE_PREFIX.size + size
        if len(buf) < end:
            if size >= LARGE_FRAME_BYTES:
                # Move what arrived of it into a buffer of its own size; the
                # rest is written straight there by receive_data.
                body = bytearray(size)
                with memoryview(buf) as view:
                    part = view[pos + SIZE_PREFIX.size :]
                    body[: len(part)] = part
                    self._filled = len(part)
                    del part
                self._body = body
                self._buf = bytearray()
                self._pos = 0
            return None
        if isinstance(buf, bytes):
            frame = buf[pos + SIZE_PREFIX.size : end]  # bytes slice: one copy
        else:
            with memoryview(buf) as view:  # one copy, released before the next resize
                frame = bytes(view[pos + SIZE_PREFIX.size : end])
        self._pos = end
        return frame


def encode_frame(body: bytes) -> bytes:
    """Prefix ``body`` with its 4-byte big-endian size (Kafka NetworkSend).

    Returns one bytes object so several encoded frames can be joined and
    written with a single gathered ``send_all``.
    """
    return SIZE_PREFIX.pack(len(body)) + body
