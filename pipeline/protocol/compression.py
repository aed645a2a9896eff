"""Decompress a RecordBatch's records with a ceiling on the output size.

A compressed batch of a few KiB can claim gigabytes (a "zip bomb"): gzip
reaches ~1000:1, zstd and lz4 far more. Kafka's own decompression streams
records one by one; the readers this project uses (aiokafka's, and the
codecs behind it) inflate the whole batch at once, so the size must be known
to be bounded *before* that. Each codec here stops producing output past
``limit`` bytes, with the codec library's own streaming interface:

* gzip (codec 1): :func:`zlib.decompressobj` with ``max_length``; one gzip
  member and nothing after it;
* snappy (codec 2): Kafka's xerial framing (snappy-java's
  ``SnappyOutputStream``: a 16-byte header, then big-endian int32 block
  lengths) or one raw block, told apart exactly as aiokafka's and kafka-python's
  ``snappy_decode`` do (the consumers' decoders): xerial only when the whole 16-byte v1
  header (magic, version 1, compatible version 1) is there and data follows
  it; every raw block starts with its uncompressed
  length (a uvarint), summed before anything is inflated, then
  ``cramjam.snappy.decompress_raw``;
* lz4 (codec 3): the LZ4 frame format, ``lz4.frame.LZ4FrameDecompressor``
  with ``max_length``; one frame and nothing after it;
* zstd (codec 4): ``zstandard``'s ``stream_reader`` read to ``limit + 1``
  bytes, then (once bounded) ``decompressobj`` per frame, which notices a
  frame cut short.

Codec ids are Kafka's (``CompressionType``).
"""

from __future__ import annotations

import struct
import zlib

import cramjam
import lz4.frame
import zstandard

__all__ = ("DecompressionError", "DecompressedTooLargeError", "decompress_bounded")

GZIP, SNAPPY, LZ4, ZSTD = 1, 2, 3, 4
# magic (8 bytes), version int32 = 1, compatible-version int32 = 1
_XERIAL_V1_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
_XERIAL_HEADER_BYTES = len(_XERIAL_V1_HEADER)
_BLOCK_LENGTH = struct.Struct(">i")


class DecompressionError(ValueError):
    """The compressed bytes are not valid for their codec."""


class DecompressedTooLargeError(ValueError):
    """The records would inflate past ``limit`` bytes; ``size`` is what was
    seen (at least ``limit + 1``; exact for snappy, which declares it)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"decompress to at least {size} bytes, more than the limit of {limit} bytes")
        self.size = size
        self.limit = limit


def decompress_bounded(codec: int, data: bytes | memoryview, limit: int) -> bytes:
    """The decompressed ``data`` of Kafka codec ``codec`` (1-4), at most ``limit`` bytes.

    :raises DecompressedTooLargeError: the output would exceed ``limit``
        bytes (decompression stops there: at most ``limit + 1`` bytes, or
        nothing for snappy, are ever allocated).
    :raises DecompressionError: corrupt or truncated compressed data, or a
        codec id outside 1-4.
    """
    try:
        if codec == GZIP:
            return _gzip(data, limit)
        if codec == SNAPPY:
            return _snappy(memoryview(data), limit)
        if codec == LZ4:
            return _lz4(data, limit)
        if codec == ZSTD:
            return _zstd(data, limit)
    except (DecompressedTooLargeError, DecompressionError):
        raise
    except MemoryError:
        raise
    except Exception as exc:  # zlib.error, RuntimeError (lz4), ZstdError, cramjam's DecompressionError
        raise DecompressionError(f"{type(exc).__name__}: {exc}") from None
    raise DecompressionError(f"unknown compression codec {codec}")


def _gzip(data: bytes | memoryview, limit: int) -> bytes:
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)  # gzip wrapper only, as Kafka writes it
    out = inflater.decompress(data, limit + 1)
    if len(out) > limit:
        raise DecompressedTooLargeError(len(out), limit)
    if not inflater.eof:
        raise DecompressionError("gzip stream ends early")
    if inflater.unused_data:
        # Python's gzip module (aiokafka's and kafka-python's consumers) reads
        # on past the first member: junk there fails it, a second member adds
        # bytes no record accounts for. Refused here, before it is acknowledged.
        raise DecompressionError(f"{len(inflater.unused_data)} bytes after the gzip stream")
    return out


def _uvarint(view: memoryview, pos: int) -> int:
    value = shift = 0
    while True:
        if pos >= len(view) or shift > 35:
            raise DecompressionError("bad snappy block length")
        byte = view[pos]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        pos += 1
        shift += 7


def _snappy(view: memoryview, limit: int) -> bytes:
    # Consumers decode these bytes again (aiokafka's and kafka-python's
    # _detect_xerial_stream want the exact v1 header *and* more than 16
    # bytes; anything else is one raw block there), so it must be here too;
    # the persister decodes with this function. A header with another version
    # read as xerial passed validation and then failed every flush that held
    # it, when the persister still used aiokafka (fuzzing, issue 8).
    if len(view) <= _XERIAL_HEADER_BYTES or bytes(view[:_XERIAL_HEADER_BYTES]) != _XERIAL_V1_HEADER:
        blocks = [view]
    else:
        blocks = []
        pos = _XERIAL_HEADER_BYTES
        while pos < len(view):
            if pos + 4 > len(view):
                raise DecompressionError("xerial snappy block length cut short")
            (length,) = _BLOCK_LENGTH.unpack_from(view, pos)
            pos += 4
            if length < 0 or pos + length > len(view):
                raise DecompressionError(f"xerial snappy block of {length} bytes runs past the data")
            blocks.append(view[pos : pos + length])
            pos += length
    total = sum(_uvarint(block, 0) for block in blocks)
    if total > limit:
        raise DecompressedTooLargeError(total, limit)
    return b"".join(bytes(cramjam.snappy.decompress_raw(block)) for block in blocks)


def _lz4(data: bytes | memoryview, limit: int) -> bytes:
    inflater = lz4.frame.LZ4FrameDecompressor()
    out = inflater.decompress(bytes(data), max_length=limit + 1)
    if len(out) > limit:
        raise DecompressedTooLargeError(len(out), limit)
    if not inflater.eof:
        raise DecompressionError("lz4 frame ends early")
    if inflater.unused_data:
        # As for gzip: the persister's lz4 (cramjam) decodes concatenated
        # frames and fails on junk, so only one frame, and nothing after it.
        raise DecompressionError(f"{len(inflater.unused_data)} bytes after the lz4 frame")
    return out


def _zstd(data: bytes | memoryview, limit: int) -> bytes:
    data = bytes(data)
    decompressor = zstandard.ZstdDecompressor()
    # Bound first: a frame need not declare its content size.
    with decompressor.stream_reader(data, read_across_frames=True) as reader:
        size = len(reader.read(limit + 1))
    if size > limit:
        raise DecompressedTooLargeError(size, limit)
    # Then inflate frame by frame (at most ``limit`` bytes, known now),
    # refusing a frame that ends early, which stream_reader lets pass.
    parts = []
    while data:
        inflater = decompressor.decompressobj()
        parts.append(inflater.decompress(data))
        if not inflater.eof:
            raise DecompressionError("zstd frame ends early")
        data = inflater.unused_data
    return b"".join(parts)
