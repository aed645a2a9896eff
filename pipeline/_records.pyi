"""Types of ``pipeline._records`` (C, ``pipeline/_records.c``): see its docstrings."""

from typing import Any

class RecordsError(ValueError):
    """A malformed record: ``args`` are (message, batch index, record index)."""

def scan(records: bytes | bytearray | memoryview, count: int, /) -> tuple[int, int | None, int | None]:
    """(count, smallest timestamp delta, largest) of one batch's ``count`` records; None, None for 0 records."""

def columns(batches: list[bytes | memoryview], counts: list[int], /) -> dict[str, Any]:
    """The records of ``batches`` as Arrow column buffers (keys: rows, timestamp_delta, key, value,
    header_offsets, header_key, header_value)."""

def summarize(records: bytes | bytearray | memoryview, min_timestamp_ms: int, max_timestamp_ms: int, /
              ) -> tuple[int, int, int, int, int, int, bool, int, int] | None:
    """RecordsInfo's fields for valid uncompressed batches, else None (``validate_records`` decides)."""

def produce_body(frame: bytes | bytearray, pos: int, flexible: bool, /
                 ) -> tuple[int, int, str | None, list[tuple[str, int, bytes | None]]] | None:
    """(acks, timeout_ms, transactional_id, [(topic, partition, records)]) of a Produce v3-v11 body, or None."""

def max_timestamp(records: bytes | bytearray | memoryview, /) -> int:
    """The largest batch maxTimestamp (ms) of the batches, -1 if none; ValueError on a bad length."""

def plain_produce(frame: bytes | bytearray, pos: int, flexible: bool, min_timestamp_ms: int, max_timestamp_ms: int, /
                  ) -> tuple[int, int, list[tuple[str, int, bytes, int, int]]] | None:
    """(acks, timeout_ms, [(topic, partition, records, record_count, uncompressed_bytes)]) of a plain Produce
    body (see the C docstring), or None."""

def plain_run(requests: list[Any], start: int, checked: dict[tuple[str, int], bool], now: float,
              min_timeout_ms: int, min_timestamp_ms: int, max_timestamp_ms: int, produce_key: int,
              first_version: int, last_version: int, first_flexible_version: int, /,
              ) -> tuple[list[tuple[Any, int, float, list[tuple[str, int, bytes, int, int]]]], int]:
    """(request, acks, deadline, parts) of each plain Produce request from ``start`` on whose partitions are
    all checked True, and the index it stopped at (see the C docstring)."""

PLAIN_RUN_READS: tuple[tuple[str, ...], tuple[str, ...]]
"""The attribute names ``plain_run`` reads: (of a request, of its header)."""
