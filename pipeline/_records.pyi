"""Types of ``pipeline._records`` (C, ``pipeline/_records.c``): see its docstrings."""

from typing import Any

class RecordsError(ValueError):
    """A malformed record: ``args`` are (message, batch index, record index)."""

def scan(records: bytes | bytearray | memoryview, count: int, /) -> tuple[int, int | None, int | None]:
    """(count, smallest timestamp delta, largest) of one batch's ``count`` records; None, None for 0 records."""

def columns(batches: list[bytes | memoryview], counts: list[int], /) -> dict[str, Any]:
    """The records of ``batches`` as Arrow column buffers (keys: rows, timestamp_delta, key, value,
    header_offsets, header_key, header_value)."""
