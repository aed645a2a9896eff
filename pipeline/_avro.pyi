"""Types of ``pipeline._avro`` (C, ``pipeline/_avro.c``): see its docstrings."""

from typing import Any

K_BOOLEAN: int
K_INT: int
K_LONG: int
K_FLOAT: int
K_DOUBLE: int
K_BYTES: int
K_STRING: int
K_FIXED: int
K_ENUM: int
K_DATE: int
K_TIMESTAMP_MILLIS: int
K_TIMESTAMP_MICROS: int

def columns(ops: tuple[tuple[int, int, int, int, Any], ...], count: int, validity: Any, offsets: Any, data: Any,
            offset: int, large: bool, wire: int, ids: tuple[int, ...] | None, skip: Any, /
            ) -> tuple[list[tuple[bytes, bytes | None, bytes]], list[int]]:
    """One column's Arrow buffers (validity, int32 offsets or None, data) per op, and the indexes of
    the values it declined (null rows, read by the caller's Python path)."""
