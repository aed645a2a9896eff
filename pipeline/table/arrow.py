"""Decode sequenced record batches into one Arrow table for one Spark write.

This is the persister's hot loop: every record is read exactly once, by
``pipeline._records.columns`` (C, built with the package), straight into
Arrow's binary layout (one data buffer and int32 offsets per column, a
validity bitmap when there are nulls): no Python object per record. Batch
headers are read and compressed batches inflated here, in Python
(``pipeline.protocol.records.record_batches``: gzip, snappy, lz4, zstd).
Columns that are constant per append (topic, partition) or arithmetic on it
(offset) or constant per batch (timestampType) are not built per record at
all but expanded with numpy / ``take``.

Kafka rules followed (Kafka ``DefaultRecordBatch`` / ``LogValidator``):
  * the offset of record ``i`` of an append, counting across its batches in
    wire order, is ``base_offset + i`` (the broker reassigns offsets; the
    producer's offset deltas are ignored);
  * a batch whose attributes say LogAppendTime (timestampType 1) takes the
    broker's append time for every record; CreateTime (0) keeps the producer's
    per-record timestamp (first timestamp + timestamp delta).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import native
from pipeline.log.batch import PartitionAppend
from pipeline.protocol.errors import CorruptRecordError
from pipeline.protocol.records import InvalidRecordError, record_batches
from pipeline.table.schema import (
    ARROW_SCHEMA,
    HEADER_ARROW_TYPE,
    HEADERS_ARROW_TYPE,
    TIMESTAMP_ARROW_TYPE,
)

CREATE_TIME = 0
LOG_APPEND_TIME = 1


def appends_to_table(appends: Sequence[PartitionAppend]) -> pa.Table:
    """Decode every record of ``appends`` into one table with ``ARROW_SCHEMA``.

    Rows come in input order: the appends in sequence order, and within one
    append its records in wire order.

    Args:
        appends: sequenced appends; each ``records`` holds one or more
            concatenated RecordBatch v2 (uncompressed, gzip, snappy, lz4 or zstd).

    Returns:
        A ``pa.Table`` with schema ``ARROW_SCHEMA`` and one row per record:
        ``timestamp`` is in microseconds (from Kafka's milliseconds),
        ``headers`` is null for a record without headers (as Spark's Kafka
        source has it), else a list of ``{key: str, value: bytes|None}``.
        An empty ``appends`` gives an empty table with that schema.

    Raises:
        ValueError: an append's ``record_count`` differs from the number of
            records decoded from it (e.g. a truncated trailing batch), or a
            batch is not magic 2.
        pipeline.protocol.errors.CorruptRecordError: a record is malformed
            (``pipeline._records.RecordsError``: names the batch and record).
        pipeline.protocol.compression.DecompressionError: a compressed batch
            does not decompress; ``DecompressedTooLargeError``: past
            ``MAX_UNCOMPRESSED_BATCH_BYTES``.
        OverflowError: a column would hold more than 2 GiB (int32 offsets).
        pyarrow.ArrowInvalid: a timestamp (ms) overflows int64 microseconds.
    """
    sections: list[bytes | memoryview] = []
    counts: list[int] = []
    base_ms: list[int] = []  # per batch: its first timestamp, or the append time (LogAppendTime)
    batch_types: list[int] = []
    append_counts: list[int] = []
    for append in appends:
        decoded = 0
        try:
            batches = record_batches(append.records)
        except InvalidRecordError as exc:
            raise ValueError(f"{append.topic}-{append.partition}: {exc}") from None
        for batch in batches:
            sections.append(batch.records)
            counts.append(batch.count)
            ts_type = batch.timestamp_type
            batch_types.append(ts_type)
            base_ms.append(append.log_append_time_ms if ts_type == LOG_APPEND_TIME else batch.first_timestamp)
            decoded += batch.count
        if decoded != append.record_count:
            raise ValueError(
                f"{append.topic}-{append.partition} at base offset "
                f"{append.base_offset}: record_count is {append.record_count} "
                f"but {decoded} records were decoded from "
                f"{len(append.records)} bytes"
            )
        append_counts.append(decoded)

    n = sum(append_counts)
    if n == 0:
        return ARROW_SCHEMA.empty_table()
    try:
        read = native.columns(sections, counts)
    except native.RecordsError as exc:
        message, batch, record = exc.args
        raise CorruptRecordError(f"batch {batch} of the flush, record {record}: {message}") from None

    batch_counts = np.array(counts, dtype=np.int64)
    counts_arr = np.array(append_counts, dtype=np.int64)
    append_index = np.repeat(np.arange(len(appends), dtype=np.int32), counts_arr)
    topic = pa.array([a.topic for a in appends], pa.string()).take(append_index)
    partition = np.array([a.partition for a in appends], dtype=np.int32)[append_index]
    # offset = base_offset of the row's append + the row's index within it
    append_first_row = np.cumsum(counts_arr) - counts_arr
    offset = (
        np.array([a.base_offset for a in appends], dtype=np.int64)
        - append_first_row
    )[append_index] + np.arange(n, dtype=np.int64)
    # CreateTime: the batch's first timestamp + the record's delta; LogAppendTime: the append's time
    types = np.array(batch_types, dtype=np.int32)
    deltas = np.frombuffer(read["timestamp_delta"], dtype=np.int64)
    timestamps_ms = np.repeat(np.array(base_ms, dtype=np.int64), batch_counts) + np.where(
        np.repeat(types == LOG_APPEND_TIME, batch_counts), 0, deltas)
    timestamp = pc.multiply_checked(pa.array(timestamps_ms, pa.int64()), 1000).cast(
        TIMESTAMP_ARROW_TYPE
    )
    timestamp_type = np.repeat(types, batch_counts)

    columns = [
        _binary(read["key"], n),
        _binary(read["value"], n),
        topic,
        pa.array(partition, pa.int32()),
        pa.array(offset, pa.int64()),
        timestamp,
        pa.array(timestamp_type, pa.int32()),
        _headers(read, n),
    ]
    return pa.Table.from_arrays(columns, schema=ARROW_SCHEMA)


_BINARY = pa.binary()


def _binary(column: tuple[bytes, bytes, bytes | None, int], n: int, type_: pa.DataType = _BINARY) -> pa.Array:
    """A binary (or string) array of ``n`` rows from ``pipeline._records``' (data, offsets, validity, nulls)."""
    data, offsets, validity, nulls = column
    return pa.Array.from_buffers(type_, n, [None if validity is None else pa.py_buffer(validity),
                                            pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls)


def _headers(read: dict[str, Any], n: int) -> pa.Array:
    """The ``HEADERS_ARROW_TYPE`` column: null for a record without headers (Spark's Kafka source)."""
    if read["header_offsets"] is None:
        return pa.nulls(n, HEADERS_ARROW_TYPE)
    offsets = np.frombuffer(read["header_offsets"], dtype=np.int32)
    headers = int(offsets[-1])
    structs = pa.StructArray.from_arrays(
        [_binary(read["header_key"], headers, pa.string()), _binary(read["header_value"], headers)],
        fields=list(HEADER_ARROW_TYPE),
    )
    no_headers = pa.array(offsets[1:] == offsets[:-1], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), structs, type=HEADERS_ARROW_TYPE, mask=no_headers)
