"""Decode sequenced record batches into one Arrow table for one Spark write.

This is the persister's hot loop: every record is decoded exactly once here
(aiokafka's RecordBatch v2 reader, a C extension about 10x faster than
kafka-python's pure-Python one on the same bytes; it also undoes
compression with gzip, snappy, lz4 and zstd), and
its fields go straight into per-column Python lists, turned into Arrow arrays
once per flush. Columns that are constant per append (topic, partition) or
arithmetic on it (offset) or constant per batch (timestampType) are not built
per record at all but expanded with numpy / ``take``.

Kafka rules followed (Kafka ``DefaultRecordBatch`` / ``LogValidator``):
  * the offset of record ``i`` of an append, counting across its batches in
    wire order, is ``base_offset + i`` (the broker reassigns offsets; the
    producer's offset deltas are ignored);
  * a batch whose attributes say LogAppendTime (timestampType 1) takes the
    broker's append time for every record; CreateTime (0) keeps the producer's
    per-record timestamp (first timestamp + timestamp delta).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any
from itertools import accumulate, chain, repeat

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from aiokafka.record.default_records import DefaultRecordBatch
from aiokafka.record.memory_records import MemoryRecords

from pipeline.log.batch import PartitionAppend
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
            concatenated RecordBatch v2 (any codec ``kafka.codec`` can decode).

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
        aiokafka.errors.CorruptRecordException: the record bytes are malformed.
        aiokafka.errors.UnsupportedCodecError: the batch's codec library is
            not installed.
        pyarrow.ArrowInvalid: a timestamp (ms) overflows int64 microseconds.
    """
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    timestamps_ms: list[int] = []
    headers: list[list[tuple[str, bytes | None]]] = []
    append_counts: list[int] = []
    batch_types: list[int] = []
    batch_counts: list[int] = []

    key_append = keys.append
    value_append = values.append
    ts_append = timestamps_ms.append
    header_append = headers.append

    for append in appends:
        append_start = len(keys)
        for batch in _batches(append.records):
            if not isinstance(batch, DefaultRecordBatch):
                raise ValueError(
                    f"{append.topic}-{append.partition}: legacy record batch (magic 0 or 1), "
                    f"only RecordBatch v2 (magic 2) is supported"
                )
            batch_start = len(keys)
            ts_type = batch.timestamp_type
            if ts_type == LOG_APPEND_TIME:
                for record in batch:
                    key_append(record.key)
                    value_append(record.value)
                    header_append(record.headers)
                timestamps_ms.extend(
                    repeat(append.log_append_time_ms, len(keys) - batch_start)
                )
            else:
                for record in batch:
                    key_append(record.key)
                    value_append(record.value)
                    ts_append(record.timestamp)
                    header_append(record.headers)
            batch_types.append(ts_type)
            batch_counts.append(len(keys) - batch_start)
        decoded = len(keys) - append_start
        if decoded != append.record_count:
            raise ValueError(
                f"{append.topic}-{append.partition} at base offset "
                f"{append.base_offset}: record_count is {append.record_count} "
                f"but {decoded} records were decoded from "
                f"{len(append.records)} bytes"
            )
        append_counts.append(decoded)

    n = len(keys)
    if n == 0:
        return ARROW_SCHEMA.empty_table()

    counts = np.array(append_counts, dtype=np.int64)
    append_index = np.repeat(np.arange(len(appends), dtype=np.int32), counts)
    topic = pa.array([a.topic for a in appends], pa.string()).take(append_index)
    partition = np.array([a.partition for a in appends], dtype=np.int32)[append_index]
    # offset = base_offset of the row's append + the row's index within it
    append_first_row = np.cumsum(counts) - counts
    offset = (
        np.array([a.base_offset for a in appends], dtype=np.int64)
        - append_first_row
    )[append_index] + np.arange(n, dtype=np.int64)
    timestamp = pc.multiply_checked(pa.array(timestamps_ms, pa.int64()), 1000).cast(
        TIMESTAMP_ARROW_TYPE
    )
    timestamp_type = np.repeat(np.array(batch_types, dtype=np.int32), batch_counts)

    columns = [
        binary_array(keys),
        binary_array(values),
        topic,
        pa.array(partition, pa.int32()),
        pa.array(offset, pa.int64()),
        timestamp,
        pa.array(timestamp_type, pa.int32()),
        _headers_array(headers),
    ]
    return pa.Table.from_arrays(columns, schema=ARROW_SCHEMA)


MAX_BINARY_ARRAY_BYTES = 2**31 - 1
"""The most data one ``pa.binary()`` array holds (its offsets are int32)."""


def binary_array(items: list[bytes | None], max_bytes: int = MAX_BINARY_ARRAY_BYTES) -> pa.Array:
    """One ``pa.binary()`` array of ``items`` (None: null), built from one joined buffer and an
    offsets array: ``pa.array(items, pa.binary())`` grows its data buffer item by item, which cost
    0.2-0.9 s per 100 MB of 1 KiB values in the decode worker (most of it re-faulting the pages of
    each reallocation), against ~0.1 s here. Items holding more than ``max_bytes`` in all (the
    int32 offsets would overflow) go through ``pa.array``, which chunks them.

    Raises:
        TypeError: an item is neither bytes nor None.
    """
    n = len(items)
    nulls = items.count(None)
    if nulls == n:
        return pa.nulls(n, pa.binary())
    validity = None
    if nulls:
        present = np.fromiter((item is not None for item in items), dtype=np.bool_, count=n)
        validity = pa.py_buffer(np.packbits(present, bitorder="little"))
    data_items: list[bytes] = [b"" if item is None else item for item in items] if nulls else items  # type: ignore[assignment]
    lengths = np.fromiter(map(len, data_items), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > max_bytes:
        return pa.array(items, pa.binary())
    data = b"".join(data_items)  # TypeError for an item that is not bytes-like
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets.astype(np.int32)),
                                                  pa.py_buffer(data)], null_count=nulls)


def _batches(records: bytes) -> Iterator[Any]:
    """The RecordBatches (aiokafka's, untyped) of one partition's records, in wire order."""
    memory = MemoryRecords(records)
    while (batch := memory.next_batch()) is not None:
        yield batch


def _headers_array(headers: list[list[tuple[str, bytes | None]]]) -> pa.Array:
    """One ``HEADERS_ARROW_TYPE`` array from per-record header lists; [] -> null."""
    if not any(headers):
        return pa.nulls(len(headers), HEADERS_ARROW_TYPE)
    flat = list(chain.from_iterable(headers))
    header_keys = [h[0] for h in flat]
    header_values = [h[1] for h in flat]
    offsets = pa.array(list(accumulate(map(len, headers), initial=0)), pa.int32())
    structs = pa.StructArray.from_arrays(
        [pa.array(header_keys, pa.string()), pa.array(header_values, pa.binary())],
        fields=list(HEADER_ARROW_TYPE),
    )
    no_headers = pa.array([not h for h in headers], pa.bool_())
    return pa.ListArray.from_arrays(
        offsets, structs, type=HEADERS_ARROW_TYPE, mask=no_headers
    )
