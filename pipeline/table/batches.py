"""Kafka RecordBatch v2 bytes built from Arrow columns, vectorised: the encoder of table reads.

A consumer reading offsets that only the tables hold gets them re-encoded
from rows (``pipeline.table.reader``). kafka-python's ``DefaultRecordBatchBuilder``
does that one record at a time in Python (17-40 us a record here); this
module builds the same bytes with whole-column operations: every varint of
a column at once (numpy), each record's bytes joined in Arrow's C++
(``binary_join_element_wise``: length, attributes, timestamp and offset
deltas, key, value, headers), one CRC32C per batch (the ``crc32c``
library). No Python object per record; the cost is a few dozen numpy and
Arrow calls per fetch plus one copy of the bytes.

The bytes are exactly kafka-python's for the same records
(tests/table/test_batches.py compares them): Kafka ``DefaultRecord``
(length, attributes 0, timestamp delta, offset delta, key and value with
-1 for null, headers with -1 for a null value; zigzag varints as Kafka's
``ByteUtils.writeVarint``/``writeVarlong``) inside a ``DefaultRecordBatch``
header (magic 2, partition leader epoch 0, producer id/epoch and base
sequence -1, not transactional, first timestamp = the first record's,
max timestamp = the largest, last offset delta = the last record's). The
base offset is the first record's offset, so offset deltas give each record
its original offset.

Batches: a batch ends where the timestamp type changes, and for
LogAppendTime where the timestamp does (every record of a LogAppendTime
batch has the batch's max timestamp, Kafka ``DefaultRecordBatch``).
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from crc32c import crc32c
from kafka.codec import gzip_encode, lz4_encode, snappy_encode, zstd_encode

HEADER = struct.Struct(">qiibIhiqqqhii")
"""The 61-byte RecordBatch v2 header (Kafka ``DefaultRecordBatch``; kafka-python's ``HEADER_STRUCT``)."""
HEADER_BYTES = HEADER.size
_CRC_FROM = 21
"""The CRC covers the header from ``attributes`` (byte 21) to the end of the batch."""
_LENGTH_FROM = 12
"""``batchLength`` counts the bytes after itself (baseOffset 8 + batchLength 4)."""
_TIMESTAMP_TYPE_BIT = 0x08
LOG_APPEND_TIME = 1

CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = 0, 1, 2, 3, 4
_COMPRESS = {CODEC_GZIP: gzip_encode, CODEC_SNAPPY: snappy_encode, CODEC_LZ4: lz4_encode, CODEC_ZSTD: zstd_encode}

_MIN_RECORD_BYTES = 7
"""The smallest record: length, attributes, two deltas, null key, null value, no headers (1 byte each)."""
# Python bytes, which Arrow's compute functions take as binary scalars: a ``pa.scalar`` built here,
# at import, loaded pandas (pyarrow looks for pandas objects in what it converts), ~0.5 s before
# a server listened.
_EMPTY = b""
_ZERO_BYTE = b"\x00"


def encode_batches(offsets: np.ndarray, timestamps_ms: np.ndarray, types: np.ndarray, keys: pa.Array,
                   values: pa.Array, headers: pa.Array, max_bytes: int, *, max_records: int | None = None,
                   min_one: bool = True, codec: int = CODEC_NONE) -> tuple[bytes, int]:
    """RecordBatches of the first records that fit in ``max_bytes``.

    Args:
        offsets: int64 (n,), ascending; each record's offset.
        timestamps_ms: int64 (n,), ms since the epoch (-1: no timestamp).
        types: int (n,), the timestamp type, 0 CreateTime, 1 LogAppendTime.
        keys, values: binary (n,) Arrow arrays; null is Kafka's null.
        headers: Arrow list<struct<key: string, value: binary>> (n,); null
            or empty: no headers; a header value may be null.
        max_bytes: bound on the bytes returned (uncompressed size, whole
            records only).
        max_records: at most this many records (None: no bound).
        min_one: return the first record even if it alone exceeds
            ``max_bytes`` (Kafka ``minOneMessage``, KIP-74).
        codec: Kafka compression type id (0 none .. 4 zstd); a batch that
            does not shrink is sent uncompressed (kafka-python's rule).

    Returns:
        (concatenated batches, records in them); (b"", 0) when nothing fits.

    Raises:
        ValueError: the arrays' lengths differ or ``codec`` is unknown.
    """
    n = len(offsets)
    if not (len(timestamps_ms) == len(types) == len(keys) == len(values) == len(headers) == n):
        raise ValueError("offsets, timestamps_ms, types, keys, values and headers must have one length")
    if codec != CODEC_NONE and codec not in _COMPRESS:
        raise ValueError(f"unknown codec {codec}")
    if max_records is not None:
        n = min(n, max_records)
    if n == 0:
        return b"", 0
    key_len = _lengths(keys, n)
    value_len = _lengths(values, n)
    # A first cut without varints: no more records than could fit at their smallest.
    rough = np.cumsum(_MIN_RECORD_BYTES + np.maximum(key_len, 0) + np.maximum(value_len, 0)) + HEADER_BYTES
    n = max(1, min(n, int(np.searchsorted(rough, max_bytes, side="right"))))
    offsets = np.asarray(offsets[:n], np.int64)
    ts = np.asarray(timestamps_ms[:n], np.int64)
    types = np.asarray(types[:n], np.int64)
    key_len, value_len = key_len[:n], value_len[:n]

    # Batches: runs of one timestamp type (and, for LogAppendTime, one timestamp).
    starts = np.ones(n, bool)
    starts[1:] = (types[1:] != types[:-1]) | ((types[1:] == LOG_APPEND_TIME) & (ts[1:] != ts[:-1]))
    first = np.maximum.accumulate(np.where(starts, np.arange(n), 0))  # index of each record's batch start
    ts_var, ts_w = _varints(ts - ts[first])
    off_var, off_w = _varints(offsets - offsets[first])
    key_var, key_w = _varints(key_len)
    value_var, value_w = _varints(value_len)
    suffix, suffix_len = _headers(headers, n)
    body = 1 + ts_w + off_w + key_w + np.maximum(key_len, 0) + value_w + np.maximum(value_len, 0) + suffix_len
    len_var, len_w = _varints(body)
    record_bytes = len_w + body
    batch_no = np.cumsum(starts) - 1
    total = np.cumsum(record_bytes) + HEADER_BYTES * (batch_no + 1)
    count = int(np.searchsorted(total, max_bytes, side="right"))
    if count == 0:
        if not min_one:
            return b"", 0
        count = 1

    joined = pc.binary_join_element_wise(
        len_var[:count], _ZERO_BYTE, ts_var[:count], off_var[:count], key_var[:count], keys[:count],
        value_var[:count], values[:count], suffix[:count], _EMPTY, null_handling="replace", null_replacement=b"")
    data = joined.buffers()[2]
    ends = np.cumsum(record_bytes[:count])
    batch_starts = np.flatnonzero(starts[:count])
    batch_ends = np.append(batch_starts[1:], count)
    parts: list[bytes | memoryview] = []
    view = memoryview(data) if data is not None else memoryview(b"")
    for s, e in zip(batch_starts.tolist(), batch_ends.tolist()):
        lo = int(ends[s - 1]) if s else 0
        records = view[lo:int(ends[e - 1])]
        attributes = _TIMESTAMP_TYPE_BIT if types[s] == LOG_APPEND_TIME else 0
        if codec != CODEC_NONE:
            compressed = _COMPRESS[codec](bytes(records))
            if len(compressed) < len(records):
                records, attributes = memoryview(compressed), attributes | codec
        first_ts = int(ts[s])
        header = HEADER.pack(int(offsets[s]), HEADER_BYTES - _LENGTH_FROM + len(records), 0, 2, 0, attributes,
                             int(offsets[e - 1] - offsets[s]), first_ts, int(ts[s:e].max()), -1, -1, -1, e - s)
        crc = crc32c(records, crc32c(header[_CRC_FROM:]))
        parts += (header[:17], crc.to_bytes(4, "big"), header[_CRC_FROM:], records)
    return b"".join(parts), count


def _lengths(column: pa.Array, n: int) -> np.ndarray:
    """int64 (n,): each element's byte length, -1 for null (Kafka's null length)."""
    column = column.slice(0, n)
    return pc.binary_length(column).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)


def _varints(values: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """Each int64 as a zigzag varint (Kafka ``ByteUtils.writeVarlong``; an int32 encodes the same):
    a binary array of one varint per element, and their widths in bytes (int64)."""
    z = ((values << 1) ^ (values >> 63)).view(np.uint64)
    n = len(z)
    widths = np.ones(n, np.int64)
    rest = z >> np.uint64(7)
    while rest.any():  # at most 9 rounds: 64 bits in 7-bit groups
        widths += rest != 0
        rest >>= np.uint64(7)
    width = int(widths.max()) if n else 1
    if width == 1:
        data = z.astype(np.uint8)
    else:
        matrix = np.empty((n, width), np.uint8)
        for j in range(width):
            group = ((z >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8)
            matrix[:, j] = group | ((widths > j + 1).astype(np.uint8) << 7)
        data = matrix[np.arange(width) < widths[:, None]]
    ends = np.empty(n + 1, np.int32)
    ends[0] = 0
    np.cumsum(widths, out=ends[1:])
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(ends), pa.py_buffer(data)]), widths


def _headers(headers: pa.Array, n: int) -> tuple[pa.Array, np.ndarray]:
    """Each record's header section (count varint, then key length, key, value length, value per
    header) as a binary array, and its byte lengths (int64)."""
    headers = headers.slice(0, n)
    counts = pc.list_value_length(headers).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    count_var, count_w = _varints(counts)
    if not counts.any():
        return count_var, count_w
    flat = headers.flatten()  # the non-null lists' elements, in record order
    hkeys = flat.field("key").cast(pa.binary())
    hvalues = flat.field("value")
    hkey_len, hvalue_len = _lengths(hkeys, len(flat)), _lengths(hvalues, len(flat))
    kv, kw = _varints(hkey_len)
    vv, vw = _varints(hvalue_len)
    each = pc.binary_join_element_wise(kv, hkeys, vv, hvalues, _EMPTY, null_handling="replace",
                                       null_replacement=b"")
    each_bytes = kw + np.maximum(hkey_len, 0) + vw + np.maximum(hvalue_len, 0)
    # One record's headers are consecutive in ``each``: its bytes from the first one's start.
    header_ends = np.concatenate(([0], np.cumsum(each_bytes)))
    ends = header_ends[np.concatenate(([0], np.cumsum(counts)))].astype(np.int32)
    data = each.buffers()[2] or pa.py_buffer(b"")
    grouped = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(ends), data])
    sections = pc.binary_join_element_wise(count_var, grouped, _EMPTY)
    return sections, count_w + (ends[1:] - ends[:-1]).astype(np.int64)
