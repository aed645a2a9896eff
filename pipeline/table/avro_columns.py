"""Avro record values into Arrow columns in C (``pipeline/_avro.c`` through ``pipeline.native``).

The fast path of ``pipeline.table.values.parse_values`` for kind ``"avro"``: a record schema whose
fields are all scalars (``NATIVE_KINDS``, each optionally in a union with null) gets a plan
(``native_ops``), and a flush's values are read by C straight into Arrow buffers
(``native_columns``), with no Python object per value. A schema with a nested record, an array, a
map, a decimal or a multi-branch union has no plan, and its values are all read by fastavro.

Sans-I/O: schemas and Arrow arrays in, Arrow arrays out.

Sources: Avro specification 1.11 (binary encoding: zigzag varints, length-prefixed bytes and
strings, unions as a branch index, enums as a symbol index; named types and namespaces),
https://avro.apache.org/docs/1.11.1/specification/ ; Arrow's columnar format (validity bitmaps,
int32 offsets), https://arrow.apache.org/docs/format/Columnar.html .
"""

from __future__ import annotations

from typing import Any, Final, Literal

import pyarrow as pa

from pipeline import native

Ops = tuple[tuple[int, int, int, int, Any], ...]
"""One (kind, union branch count or 0, null branch or -1, value branch, extra) per record field, in
the record's order (``_avro.columns``' plan)."""

_PRIMITIVES: Final = {"boolean": "boolean", "int": "int", "long": "long", "float": "float", "double": "double",
                      "bytes": "bytes", "string": "string"}
_LOGICAL: Final[dict[tuple[str, Any], str]] = {("int", "date"): "date",
                   ("long", "timestamp-millis"): "timestamp_millis", ("long", "local-timestamp-millis"): "timestamp_millis",
                   ("long", "timestamp-micros"): "timestamp_micros", ("long", "local-timestamp-micros"): "timestamp_micros"}
_ARROW: Final[dict[str, Any]] = {
    "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(), "double": pa.float64(),
    "bytes": pa.binary(), "string": pa.string(), "fixed": pa.binary(), "enum": pa.string(), "date": pa.date32(),
    "timestamp_millis": "timestamp[us]", "timestamp_micros": "timestamp[us]",
}
"""Each kind's Arrow type as ``pipeline.table.values.avro_to_arrow_schema`` gives it (a timestamp's
zone, UTC or none, is the schema's)."""
NATIVE_KINDS: Final = frozenset(_ARROW)
"""The Avro field types the C path reads (with their logical types)."""

_WIRE: Final = {"none": 0, "auto": 1, "confluent": 2}


class _NoPlan(Exception):
    """The schema has a field the C path does not read."""


def native_ops(avro: dict, columns: pa.Schema) -> Ops | None:
    """The C plan of the Avro record ``avro`` (a parsed schema with a record at its root), whose
    columns are ``columns`` (``avro_to_arrow_schema(avro)``, every field in order); None when a field
    is not a scalar the C path reads (``NATIVE_KINDS``) or not in a union of it with null.

    A logical type the Avro specification says to ignore is ignored as ``avro_to_arrow_schema``
    does (its underlying type is read); a decimal has no plan (its column is built in Python)."""
    named: dict[str, Any] = {}
    root_name = avro.get("name", "")
    namespace = avro.get("namespace", "") if "." not in root_name else root_name.rpartition(".")[0]
    fields = avro.get("fields")
    if not isinstance(fields, list) or len(fields) != len(columns):
        return None
    ops = []
    try:
        for f, column in zip(fields, columns, strict=True):
            op, kind = _field_op(f["type"], namespace or "", named)
            expected = _ARROW[kind]
            actual = column.type
            if (expected == "timestamp[us]" and not (pa.types.is_timestamp(actual) and actual.unit == "us")) or (
                    expected != "timestamp[us]" and actual != expected):
                return None
            ops.append(op)
    except _NoPlan:
        return None
    return tuple(ops)


def _field_op(s: Any, namespace: str, named: dict[str, Any]) -> tuple[tuple[int, int, int, int, Any], str]:
    if isinstance(s, list):
        nulls = [i for i, b in enumerate(s) if b == "null" or (isinstance(b, dict) and b.get("type") == "null")]
        values = [i for i in range(len(s)) if i not in nulls]
        if len(values) != 1 or len(nulls) > 1:
            raise _NoPlan
        (kind, _, _, _, extra), name = _field_op(s[values[0]], namespace, named)
        return (kind, len(s), nulls[0] if nulls else -1, values[0], extra), name
    return _scalar_op(s, namespace, named)


def _scalar_op(s: Any, namespace: str, named: dict[str, Any]) -> tuple[tuple[int, int, int, int, Any], str]:
    if isinstance(s, str):
        if s in _PRIMITIVES:
            return _op(_PRIMITIVES[s]), _PRIMITIVES[s]
        for full in (f"{namespace}.{s}" if namespace and "." not in s else s, s):
            if full in named:
                return named[full]
        raise _NoPlan
    if not isinstance(s, dict):
        raise _NoPlan
    t = s.get("type")
    if isinstance(t, (dict, list)):
        if isinstance(t, list):
            raise _NoPlan  # {"type": [union]} inside a union's branch
        return _scalar_op(t, namespace, named)
    if t in _PRIMITIVES:
        logical = s.get("logicalType")
        if logical == "decimal":
            raise _NoPlan
        kind = _LOGICAL.get((t, logical), _PRIMITIVES[t])
        return _op(kind), kind
    if t in ("enum", "fixed"):
        name = s.get("name")
        if not isinstance(name, str) or s.get("logicalType") == "decimal":
            raise _NoPlan
        ns = s.get("namespace", namespace) if "." not in name else name.rpartition(".")[0]
        full = f"{ns}.{name}" if ns and "." not in name else name
        if t == "enum":
            symbols = s.get("symbols")
            if not isinstance(symbols, list) or not symbols or not all(isinstance(x, str) for x in symbols):
                raise _NoPlan
            found: tuple[tuple[int, int, int, int, Any], str] = (
                _op("enum", tuple(x.encode() for x in symbols)), "enum")
        else:
            size = s.get("size")
            if type(size) is not int or size < 1:
                raise _NoPlan
            found = _op("fixed", size), "fixed"
        named[full] = found
        return found
    if isinstance(t, str) and t not in ("record", "error", "array", "map", "null"):
        return _scalar_op(t, namespace, named)  # {"type": "com.acme.Name"}
    raise _NoPlan


def _op(kind: str, extra: Any = None) -> tuple[int, int, int, int, Any]:
    return native.AVRO_KINDS[kind], 0, -1, 0, extra


def native_columns(values: pa.Array, ops: Ops, columns: pa.Schema,
                   wire_format: Literal["auto", "confluent", "none"], ids: tuple[int, ...] | None,
                   skip: bytes | None) -> tuple[list[pa.Array], list[int]]:
    """Read every value of ``values`` (``pa.binary()`` or ``pa.large_binary()``, not chunked) with
    the plan ``ops`` into one array per field of ``columns``, and the indexes of the values the C
    path declined, ascending (null rows in those arrays; their reasons are the Python path's).

    ``wire_format`` as ``ValueFormat``'s; ``ids``: the wire-format schema ids read with this plan
    (None: any); ``skip``: ``len(values)`` bytes, nonzero for a value to decline.

    Raises:
        OverflowError: a column's values past 2 GiB (int32 offsets); ValueError: a malformed array.
    """
    validity, offsets, data = values.buffers()
    built, declined = native.avro_columns(ops, len(values), validity, offsets, data, values.offset,
                                          pa.types.is_large_binary(values.type), _WIRE[wire_format], ids, skip)
    arrays = []
    for (bits, value_offsets, data_bytes), column in zip(built, columns, strict=True):
        buffers = [pa.py_buffer(bits)] + ([pa.py_buffer(value_offsets)] if value_offsets is not None else [])
        arrays.append(pa.Array.from_buffers(column.type, len(values), [*buffers, pa.py_buffer(data_bytes)]))
    return arrays, declined
