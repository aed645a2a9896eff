"""Typed values: decode Kafka record values (JSON, Avro or Protobuf) into Arrow columns.

A topic may declare a value format (issue 11): ``json`` with a schema (a Spark
DDL string the caller turns into Arrow), or ``avro`` with a writer schema given
in the config, or (issue 32) ``protobuf`` whose table follows its registry subject. Every value of a flush is decoded here into typed columns that
sit next to the raw Kafka-source columns; a value that does not decode is
reported with a one-line reason so the caller can put it in the dead-letter
table. A bad value never raises and never affects its neighbours.

Sans-I/O and Spark-free: it runs in the decode worker process, which has
pyarrow (and fastavro, for Avro topics) but no JVM. Nothing here reads a
clock, a file or a socket.

Cost: the common all-good batch costs one JSON parse (the stdlib's C
scanner) or one fastavro ``schemaless_reader`` call per value, plus a few
pyarrow calls per leaf column (nested lists, structs and maps are shredded into
their leaves and reassembled with ``ListArray``/``StructArray``/
``MapArray.from_arrays``; date, timestamp and decimal strings are checked with
one RE2 match and converted with one Arrow cast per column). Only a leaf whose
bulk conversion fails is walked value by value, to find and name the offending
records; the other columns of a failed record are then nulled with one
``if_else`` per column. The per-value parse dominates: 100k JSON objects of 11
fields (~250 bytes) take about 1.5 s on one core of the 2-core dev machine, of
which ~1 s is the JSON scanner; Avro read by fastavro is bound by it the same
way (~11 s per million 1 KiB records of 16 fields). An Avro record of scalar
fields is read in C instead (``pipeline.table.avro_columns``: ~0.5-1.5 s per
million of those records), and only the values C declines go the Python way.

Sources:
  * Confluent wire format (Schema Registry serdes): magic byte 0, a 4-byte
    big-endian schema id, then the serialised payload.
    https://docs.confluent.io/platform/current/schema-registry/fundamentals/serdes-develop/index.html#wire-format
  * Avro specification 1.11 (binary encoding, unions, named types, logical
    types; "an invalid logical type is ignored and the underlying type used").
    https://avro.apache.org/docs/1.11.1/specification/
  * Spark ``from_json`` (``JacksonParser.makeConverter``, PERMISSIVE mode):
    which JSON token fits which Spark type. Followed here except where noted
    in ``parse_values``; a record Spark would turn into a null field becomes a
    dead letter here instead.
"""

from __future__ import annotations

import base64
import binascii
import copy
import io
import json
import math
import re
import sys
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from itertools import accumulate, chain, repeat
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.table.avro_columns import native_columns, native_ops

if TYPE_CHECKING:
    from fastavro.types import Schema as FastavroSchema

# The Arrow type of Spark's TimestampType as pyspark's to_arrow_schema(timezone="UTC")
# spells it (see pipeline.table.schema): an instant in microseconds.
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
# Spark's TimestampNTZType (Avro local-timestamp-*).
LOCAL_TIMESTAMP_TYPE = pa.timestamp("us")
# Spark's DecimalType.MAX_PRECISION; decimal128 holds exactly that.
MAX_DECIMAL_PRECISION = 38
# Longest error text kept for one record (the dead-letter column is for humans).
MAX_ERROR_CHARS = 500

WIRE_MAGIC = 0
WIRE_HEADER_BYTES = 5

WireFormat = Literal["auto", "confluent", "none"]

_NoneType = type(None)
_INT_RANGES = {
    pa.int8(): (-(2**7), 2**7 - 1),
    pa.int16(): (-(2**15), 2**15 - 1),
    pa.int32(): (-(2**31), 2**31 - 1),
    pa.int64(): (-(2**63), 2**63 - 1),
}
_INT64_MIN, _INT64_MAX = _INT_RANGES[pa.int64()]
_US_PER_S = 1_000_000
_US_PER_DAY = 86_400 * _US_PER_S
# Spark JacksonParser: the strings a FloatType/DoubleType field accepts.
_SPECIAL_FLOATS = {
    "NaN": math.nan,
    "+INF": math.inf,
    "+Infinity": math.inf,
    "Infinity": math.inf,
    "-INF": -math.inf,
    "-Infinity": -math.inf,
}
# The string grammars of the temporal and decimal leaves. Each is used twice: by
# Python's re for one value, and by Arrow's RE2 (pc.match_substring_regex,
# anchored) to screen a whole column before Arrow's own cast, so the bulk path
# never accepts a string the per-value parser rejects (Arrow's casts are more
# lenient in places, e.g. "85E+-1" as a decimal).
_DATE_PATTERN = r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
# Arrow's ISO-8601 cast accepts these forms; the per-value parser also takes
# 7-9 fraction digits (truncated to microseconds).
_TIMESTAMP_PATTERN = (
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
    r"(?:[T ]([0-9]{2})(?::([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{1,9}))?)?)?)?"
    r"(Z|[+-][0-9]{2}(?::?[0-9]{2})?)?"
)
# java.math.BigDecimal's grammar (Spark parses decimal strings with it, commas removed).
_DECIMAL_PATTERN = r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_DATE_RE = re.compile(_DATE_PATTERN, re.ASCII)
_TIMESTAMP_RE = re.compile(_TIMESTAMP_PATTERN, re.ASCII)
_DECIMAL_RE = re.compile(_DECIMAL_PATTERN, re.ASCII)
_DECIMAL_CONTEXT = Context(prec=2 * MAX_DECIMAL_PRECISION + 4)


# --------------------------------------------------------------------------- API


@dataclass(frozen=True)
class ValueFormat:
    """How the values of one topic are decoded.

    Attributes:
        kind: ``"json"`` (one UTF-8 JSON object per value) or ``"avro"`` (one
            Avro binary-encoded record per value, no container file header).
        schema: the typed columns, all nullable (a tombstone or a failed value
            is an all-null row). For json: one column per top-level JSON field,
            matched by exact name. For avro: a subset (any order) of
            ``avro_to_arrow_schema(avro_schema)``'s columns with the same types.
        avro_schema: the parsed Avro writer schema (kind ``"avro"`` only; a JSON
            string is accepted and parsed). Every value is decoded with it: the
            schema id in a wire-format header is reported (``wire_schema_ids``)
            but not looked up, so producers must not evolve the schema without
            the config following.
        wire_format: the Confluent Schema Registry header (magic byte 0, 4-byte
            schema id). ``"auto"``: stripped when the value starts with 0x00 and
            has at least 5 bytes (JSON text never starts with 0x00; an Avro
            record written *without* a registry may, e.g. a null first field of
            a ``["null", T]`` union, a 0 or an empty string, so headerless Avro
            topics should say ``"none"``). ``"confluent"``: the header is
            required; a value without it is an error. ``"none"``: never stripped.
        registry: avro only: where the schema id of a value's wire-format header is looked up
            (``pipeline.registry.lookup.SchemaLookup``: an ``http(s)://`` registry URL, or the
            metadata store of pipeline's own registry). The value is then decoded with that
            writer schema and resolved against ``avro_schema`` as the reader schema (Avro
            schema resolution: a field the writer lacks takes the reader's default; fastavro's
            ``schemaless_reader(writer, reader)``). A record's ``__value_schema_id`` header (a
            GUID or an id, Schema Registry 8.0) names the writer's schema instead, and the value
            is then all payload. An id the registry does not have, a writer
            schema that does not resolve, or a non-Avro one, is that record's error. The
            registry unreachable raises ``RegistryUnavailable`` (the flush is retried, no
            record is judged on it). None: every value is read with ``avro_schema``.
            Kind ``"protobuf"`` needs it: each value is read with its writer's message.
        protobuf_schema: kind ``"protobuf"`` only: the table's Protobuf schema (its registry
            subject's latest version, base64 ``FileDescriptorProto`` or ``.proto`` text); the table is
            its first message and ``schema`` a subset of ``protobuf_to_arrow_schema``'s columns.
        protobuf_references: the schemas ``protobuf_schema`` imports, as (import name, type, text),
            dependencies first (``SchemaLookup.references``); well-known files need none.

    Raises:
        ValueError: unknown kind or wire format, a json schema with a type this
            module does not decode (see ``parse_values``), a NOT NULL field, a
            duplicate field name, a missing or unusable Avro schema, or an avro
            ``schema`` that does not match the Avro schema's columns.

    Picklable (it is sent to the decode worker): the decode plan is rebuilt on
    unpickling.
    """

    kind: Literal["json", "avro", "protobuf"]
    schema: pa.Schema
    avro_schema: dict | None = field(default=None, hash=False)
    wire_format: WireFormat = "auto"
    registry: str | None = None
    protobuf_schema: str | None = None
    protobuf_references: tuple[tuple[str, str, str], ...] = ()
    _protobuf_message: Any = field(default=None, init=False, repr=False, compare=False, hash=False)
    _plan: Any = field(default=None, init=False, repr=False, compare=False, hash=False)
    _fastavro_schema: Any = field(default=None, init=False, repr=False, compare=False, hash=False)
    _native_ops: Any = field(default=None, init=False, repr=False, compare=False, hash=False)
    _avro_columns: Any = field(default=None, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.wire_format not in ("auto", "confluent", "none"):
            raise ValueError(f"wire_format must be auto, confluent or none, not {self.wire_format!r}")
        if not isinstance(self.schema, pa.Schema):
            raise ValueError(f"schema must be a pyarrow.Schema, not {type(self.schema).__name__}")
        _check_names([f.name for f in self.schema], "")
        if self.kind != "protobuf" and self.protobuf_schema is not None:
            raise ValueError("protobuf_schema is only for kind 'protobuf'")
        if self.kind == "json":
            if self.avro_schema is not None:
                raise ValueError("avro_schema is only for kind 'avro'")
            if self.registry is not None:
                raise ValueError("registry is only for kind 'avro'")
            plan = _StructPlan(
                pa.struct(list(self.schema)),
                tuple((f.name, _json_plan(f, f.name)) for f in self.schema),
            )
            object.__setattr__(self, "_plan", plan)
        elif self.kind == "avro":
            avro = _load_avro(self.avro_schema)
            object.__setattr__(self, "avro_schema", avro)
            root = _avro_root_plan(avro)
            by_name = dict(root.fields)
            avro_types = {f.name: f.type for f in root.type}
            for f in self.schema:
                if f.name not in by_name:
                    raise ValueError(f"field {f.name!r}: not a field of the Avro record {avro.get('name')!r}")
                if not f.type.equals(avro_types[f.name]) or not f.nullable:
                    raise ValueError(
                        f"field {f.name!r}: schema says {f.type}{'' if f.nullable else ' NOT NULL'}, "
                        f"the Avro schema gives {avro_types[f.name]} (see avro_to_arrow_schema)"
                    )
            plan = _StructPlan(
                pa.struct(list(self.schema)), tuple((f.name, by_name[f.name]) for f in self.schema)
            )
            object.__setattr__(self, "_plan", plan)
            object.__setattr__(self, "_fastavro_schema", _fastavro_parse(avro))
            object.__setattr__(self, "_avro_columns", pa.schema(list(root.type)))
            object.__setattr__(self, "_native_ops", native_ops(avro, self._avro_columns))
        elif self.kind == "protobuf":
            if self.avro_schema is not None:
                raise ValueError("avro_schema is only for kind 'avro'")
            if self.registry is None:
                raise ValueError("kind 'protobuf' needs a registry (each value is read with its writer's schema)")
            message = _load_protobuf(self.protobuf_schema, self.protobuf_references)
            root = _protobuf_plan(message, "")
            by_name = dict(root.fields)
            for f in self.schema:
                if f.name not in by_name:
                    raise ValueError(f"field {f.name!r}: not a field of the Protobuf message {message.full_name!r}")
                if not f.type.equals(by_name[f.name].type) or not f.nullable:
                    raise ValueError(
                        f"field {f.name!r}: schema says {f.type}{'' if f.nullable else ' NOT NULL'}, "
                        f"the Protobuf schema gives {by_name[f.name].type} (see protobuf_to_arrow_schema)"
                    )
            plan = _StructPlan(pa.struct(list(self.schema)), tuple((f.name, by_name[f.name]) for f in self.schema))
            object.__setattr__(self, "_plan", plan)
            object.__setattr__(self, "_protobuf_message", message)
        else:
            raise ValueError(f"kind must be 'json', 'avro' or 'protobuf', not {self.kind!r}")

    def __reduce__(self) -> tuple[type[ValueFormat], tuple[object, ...]]:
        return (ValueFormat, (self.kind, self.schema, self.avro_schema, self.wire_format, self.registry,
                              self.protobuf_schema, self.protobuf_references))

    @classmethod
    def for_avro(cls, avro_schema: dict | str, wire_format: WireFormat = "auto",
                 registry: str | None = None) -> ValueFormat:
        """An avro format whose columns are every field of ``avro_schema``'s record."""
        avro = _load_avro(avro_schema)
        return cls("avro", avro_to_arrow_schema(avro), avro, wire_format, registry)

    @classmethod
    def for_protobuf(cls, protobuf_schema: str, wire_format: WireFormat, registry: str,
                     references: Sequence[tuple[str, str, str]] = ()) -> ValueFormat:
        """A protobuf format whose columns are every field of ``protobuf_schema``'s first message."""
        return cls("protobuf", protobuf_to_arrow_schema(protobuf_schema, references), None, wire_format, registry,
                   protobuf_schema, tuple(references))


def registry_value_format(schema_type: str, text: str, wire_format: WireFormat, registry: str,
                          references: Sequence[tuple[str, str, str]] = ()) -> ValueFormat:
    """The format of a topic whose table follows a registry subject: ``text`` (of Schema Registry
    type ``schema_type``, with ``references`` resolved: ``SchemaLookup.references``; Protobuf only)
    gives the table's columns; each value is read as its own writer's schema says, looked up in
    ``registry`` (``ValueFormat.registry``).

    Raises:
        ValueError: the schema cannot be a table (named by its path), or the type is not one the
            table side reads.
    """
    if schema_type == "AVRO":
        return ValueFormat.for_avro(text, wire_format, registry)
    if schema_type == "JSON":  # self-describing: read by property name, no writer schema needed
        from pipeline.table.json_schema import json_schema_to_arrow

        return ValueFormat("json", json_schema_to_arrow(text), wire_format=wire_format)
    if schema_type == "PROTOBUF":
        return ValueFormat.for_protobuf(text, wire_format, registry, references)
    raise ValueError(f"a {schema_type} schema cannot be a table")


def split_wire_format(value: bytes) -> tuple[int | None, bytes]:
    """Split a Confluent Schema Registry header off ``value`` if it has one.

    Returns ``(schema_id, payload)`` when ``value`` has at least 5 bytes and
    starts with the magic byte 0 (the id is the next 4 bytes, big-endian,
    signed as Java's ``ByteBuffer.getInt`` reads it), else ``(None, value)``.
    """
    if len(value) >= WIRE_HEADER_BYTES and value[0] == WIRE_MAGIC:
        return int.from_bytes(value[1:WIRE_HEADER_BYTES], "big", signed=True), value[WIRE_HEADER_BYTES:]
    return None, value


def wire_schema_ids(values: pa.Array | pa.ChunkedArray, wire_format: WireFormat = "auto") -> pa.Array:
    """The Schema Registry id of every value as ``parse_values`` sees it.

    Returns a ``pa.int32()`` array of ``len(values)``: the id where the value
    has a header that ``wire_format`` strips, null elsewhere (tombstones,
    headerless values, every value under ``"none"``).
    """
    raw = _binary_pylist(values)
    if wire_format == "none":
        return pa.nulls(len(raw), pa.int32())
    return pa.array(
        [None if v is None else split_wire_format(v)[0] for v in raw], pa.int32()
    )


def avro_to_arrow_schema(avro_schema: dict | str) -> pa.Schema:
    """Arrow schema of the typed columns for an Avro record schema (one column per top-level field).

    Every field is nullable (a tombstone or a failed record is an all-null
    row; Spark's ``from_json`` makes its schema nullable the same way). Type
    mapping (Avro spec 1.11; Spark's ``SchemaConverters.toSqlType`` for the
    Spark side):

    ============================================  ===================================
    Avro                                          Arrow
    ============================================  ===================================
    ``["null", T]``, ``[T, "null"]``, ``[T]``     T (nullable)
    boolean / int / long / float / double         bool / int32 / int64 / float32 / float64
    bytes, fixed                                  binary
    string, enum (the symbol)                     string
    array<T>                                      list<element: T>
    map<T>                                        map<string, T>
    record                                        struct (fields in order)
    int + date                                    date32
    long + timestamp-millis / timestamp-micros    timestamp[us, tz=UTC]
    long + local-timestamp-millis / -micros       timestamp[us] (Spark TimestampNTZ)
    bytes/fixed + decimal(p, s), p <= 38          decimal128(p, s)
    string + uuid                                 string
    other logical types (time-*, duration, ...)   their underlying type
    ============================================  ===================================

    A logical type that is invalid per the spec (e.g. decimal scale > precision,
    date on a long) is ignored and the underlying type used, as the spec says.

    Raises:
        ValueError: the top level is not a record, or a field has a shape
            Arrow/Spark cannot hold, named by its path (``'a.b[]'``): a union
            of two or more non-null types, a bare ``null`` type, a recursive
            type, a record without fields, a fixed of size 0, a decimal with
            precision > 38, an unknown named type.
    """
    return pa.schema(list(_avro_root_plan(_load_avro(avro_schema)).type))


def parse_values(values: pa.Array | pa.ChunkedArray, fmt: ValueFormat,
                 headers: pa.Array | pa.ChunkedArray | None = None) -> tuple[pa.Table, pa.Array]:
    """Decode every value of a binary Arrow array.

    Args:
        values: ``pa.binary()`` or ``pa.large_binary()`` (array or chunked), the
            raw Kafka values of one flush; null is a tombstone.
        fmt: the topic's value format.
        headers: the records' headers (``pipeline.table.schema.HEADERS_ARROW_TYPE``), as long as
            ``values``: with ``fmt.registry``, a ``__value_schema_id`` header names the writer's
            schema (Schema Registry 8.0) and wins over a payload prefix, as Confluent's
            ``dual_schema_id_deserializer`` has it. For json (self-describing: the header is not looked
            up) under wire format ``confluent``, a value with that header needs no prefix.

    Returns:
        ``(typed, errors)``: ``typed`` has ``fmt.schema`` and ``len(values)``
        rows, all-null where the value failed; ``errors`` is a ``pa.string()``
        array of ``len(values)``: null where the value decoded, else a one-line
        reason (``"invalid JSON at char 12: Expecting ',' delimiter"``,
        ``"field 'qty': expected int32, got string \\"7\\""``, ``"Avro decode
        failed: EOFError: ..."``). A field error fails its whole record. A null
        value (Kafka tombstone) is not an error: all-null row, null error.

    JSON (``kind="json"``), Spark ``from_json`` semantics unless noted. The
    value must be a UTF-8 JSON object (a JSON ``null``, array or scalar is an
    error); fields are matched by exact name, missing ones are null, extra ones
    ignored, JSON ``null`` is null. Per Arrow type:

    =====================  ===========================================================
    Arrow                  accepted JSON
    =====================  ===========================================================
    bool                   true / false
    int8/16/32/64          integers in range (``1.0``, ``1e2``, ``"1"`` are errors)
    float32/64             numbers; the strings NaN, Infinity, +Infinity, +INF,
                           -Infinity, -INF
    string                 strings; any other value is kept as its compact JSON text
                           (Spark does the same)
    binary                 base64 strings (RFC 4648, padded; Spark: Jackson
                           getBinaryValue)
    date32                 ``"YYYY-MM-DD"``, years 0000-9999 (narrower than Spark's
                           legacy fallback)
    timestamp[us, UTC]     ISO-8601 ``YYYY-MM-DD[(T| )hh[:mm[:ss[.f{1,9}]]]]`` with
                           ``Z``/``±hh[[:]mm]`` or no offset (= UTC, the server's
                           session time zone); fractions beyond microseconds are
                           truncated; integers are seconds since the epoch
                           (Spark does the same: beware producers sending millis)
    decimal128(p, s)       numbers or decimal strings (``,`` removed), rounded
                           HALF_UP to ``s`` places; more than ``p - s`` integer
                           digits is an error (Spark: ``Decimal.set``)
    list<T>                arrays
    struct<...>            objects (same rules as the top level)
    map<string, T>         objects
    =====================  ===========================================================

    Numbers are parsed exactly when the schema has a decimal column
    (``json`` ``parse_float=Decimal``), else as binary doubles.

    Avro (``kind="avro"``): each payload is read with fastavro's
    ``schemaless_reader`` and ``fmt.avro_schema`` as writer schema; a value
    that fails to decode or has bytes left after the record is an error, and so
    is a decoded value outside its Arrow type (a timestamp-millis beyond
    int64 microseconds, a decimal with more than ``p`` digits).

    Protobuf (``kind="protobuf"``): each value is parsed with its writer's message (the schema its
    wire-format id or ``__value_schema_id`` header names, the message its Confluent message indexes
    name; a value with neither: the table's message) and its fields matched to the columns by name
    (``protobuf_to_arrow_schema``); a field the writer's message lacks is null. An unknown id, a
    non-Protobuf schema, another message than the table's, bytes that do not parse, or a value outside
    its column (a ``uint64`` past int64) is the record's error.

    Raises:
        TypeError: ``values`` is not binary.
        RegistryUnavailable: avro or protobuf with ``fmt.registry``: the registry could not be asked.
    """
    if fmt.kind == "avro" and fmt._native_ops is not None:
        return _parse_avro_native(values, fmt, headers)
    return _parse_values(values, fmt, headers)


def _parse_avro_native(values: pa.Array | pa.ChunkedArray, fmt: ValueFormat,
                       headers: pa.Array | pa.ChunkedArray | None) -> tuple[pa.Table, pa.Array]:
    """``parse_values`` for an Avro format with a C plan (``pipeline.table.avro_columns``): C reads
    every value it can, ``_parse_values`` the ones it declines (a value with a ``__value_schema_id``
    header, a wire-format id whose writer schema is not the table's, anything not exactly a record of
    the plan), which are then put back in their places."""
    if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
        raise TypeError(f"values must be binary, not {values.type}")
    array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if headers is not None and isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    n = len(array)
    ids: tuple[int, ...] | None = None
    skip: bytes | None = None
    if fmt.registry is not None:
        ids = _read_with_table_schema(array, fmt)
        if headers is not None:
            if len(headers) != n:
                raise ValueError(f"{len(headers)} headers for {n} values")
            skip = _naming_a_schema(headers)
    arrays, declined = native_columns(array, fmt._native_ops, fmt._avro_columns, fmt.wire_format, ids, skip)
    by_name = dict(zip(fmt._avro_columns.names, arrays, strict=True))
    typed = pa.Table.from_arrays([by_name[f.name] for f in fmt.schema], schema=fmt.schema)
    if not declined:
        return typed, pa.nulls(n, pa.string())
    taken = pa.array(declined, pa.int64())
    slow, slow_errors = _parse_values(array.take(taken), fmt, headers.take(taken) if headers is not None else None)
    order = list(range(n))
    for j, i in enumerate(declined):
        order[i] = n + j
    order_array = pa.array(order, pa.int64())
    return (pa.concat_tables([typed, slow]).take(order_array),
            pa.concat_arrays([pa.nulls(n, pa.string()), slow_errors]).take(order_array))


def _read_with_table_schema(values: pa.Array, fmt: ValueFormat) -> tuple[int, ...]:
    """The wire-format schema ids among ``values`` whose writer schema is the table's own, so read
    with the plan (every other id's values go to the Python path: resolved, or that record's error).

    Raises:
        RegistryUnavailable: the registry could not be asked."""
    from pipeline.registry.lookup import lookup_for

    assert fmt.registry is not None
    lookup = lookup_for(fmt.registry)
    if fmt.wire_format == "none":
        return ()  # no header is stripped: every value is read with the table's schema
    heads = pc.unique(pc.binary_slice(values, 0, WIRE_HEADER_BYTES)).to_pylist()  # a few distinct ones
    found = sorted({i for i in (split_wire_format(head)[0] for head in heads if head is not None) if i is not None})
    same = []
    for schema_id in found:
        try:
            if _writer_schema(lookup, ("id", schema_id)) == fmt._fastavro_schema:
                same.append(schema_id)
        except _WriterSchemaError:
            pass  # the Python path gives the record its error
    return tuple(same)


def _naming_a_schema(headers: pa.Array) -> bytes | None:
    """One byte per record, 1 where its headers have a ``__value_schema_id`` (the writer schema
    it names is looked up by the Python path); None when no record has one."""
    flat = pc.list_flatten(headers)
    if len(flat) == 0:
        return None
    named = pc.equal(flat.field("key"), VALUE_SCHEMA_ID_HEADER)
    rows = pc.list_parent_indices(headers).filter(pc.fill_null(named, False)).to_pylist()
    if not rows:
        return None
    skip = bytearray(len(headers))
    for row in rows:
        skip[row] = 1
    return bytes(skip)


def _parse_values(values: pa.Array | pa.ChunkedArray, fmt: ValueFormat,
                  headers: pa.Array | pa.ChunkedArray | None) -> tuple[pa.Table, pa.Array]:
    """``parse_values`` in Python: one dict per value, then each column built from them."""
    raw = _binary_pylist(values)
    errors: list[str | None] = [None] * len(raw)
    if fmt.kind == "json":
        # a record whose __value_schema_id header names its schema has no prefix to require
        json_headers = headers.to_pylist() if headers is not None and fmt.wire_format == "confluent" else None
        rows = _decode_json(raw, fmt, errors, json_headers)
    elif fmt.kind == "protobuf":
        record_headers = headers.to_pylist() if headers is not None else None
        if record_headers is not None and len(record_headers) != len(raw):
            raise ValueError(f"{len(record_headers)} headers for {len(raw)} values")
        rows = _decode_protobuf(raw, fmt, errors, record_headers)
    else:
        record_headers = headers.to_pylist() if headers is not None and fmt.registry is not None else None
        if record_headers is not None and len(record_headers) != len(raw):
            raise ValueError(f"{len(record_headers)} headers for {len(raw)} values")
        rows = _decode_avro(raw, fmt, errors, record_headers)
    fields: tuple[tuple[str, Any], ...] = fmt._plan.fields
    columns: list[pa.Array] = [None] * len(fields)
    pending: Sequence[int] = range(len(fields))
    failed = False
    # One pass converts every column; a value that does not fit is recorded
    # and converted as null, so the arrays are right except for the other
    # columns of a failed record, which are nulled below. Only a column that
    # could not be assembled at all (a placeholder) is converted again
    # without the failed records.
    while pending:
        fails = _Fails()
        rebuild: list[int] = []
        for k in pending:
            name, sub = fields[k]
            fails.placeholder = False
            columns[k] = _build(sub, list(map(dict.get, rows, repeat(name))), _top_loc(name), fails)
            if fails.placeholder:
                rebuild.append(k)
        for i, message in fails.items():
            errors[i] = message
            rows[i] = _EMPTY
        failed = failed or bool(fails)
        pending = rebuild
    if failed:  # a record that fails in any column fails as a whole
        keep = pa.array([e is None for e in errors], pa.bool_())
        columns = [pc.if_else(keep, c, pa.scalar(None, c.type)) for c in columns]
    typed = pa.Table.from_arrays(columns, schema=fmt.schema)
    return typed, pa.array(errors, pa.string())


# ------------------------------------------------------------------ decoding


def _binary_pylist(values: pa.Array | pa.ChunkedArray) -> list[bytes | None]:
    if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
        raise TypeError(f"values must be binary, not {values.type}")
    return values.to_pylist()


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _payload(value: bytes, wire_format: WireFormat) -> bytes:
    """The bytes to decode; raises _Mismatch when a required header is missing."""
    if wire_format != "none" and len(value) >= WIRE_HEADER_BYTES and value[0] == WIRE_MAGIC:
        return value[WIRE_HEADER_BYTES:]
    if wire_format == "confluent":
        raise _Mismatch("no Schema Registry header (magic byte 0 + 4-byte schema id)")
    return value


def _decode_json(raw: list[bytes | None], fmt: ValueFormat, errors: list[str | None],
                 headers: list[list[dict] | None] | None = None) -> list[dict]:
    """One dict per value (``_EMPTY`` for a tombstone or a failure, with its error set).

    ``headers``: each record's headers, given under wire format ``confluent``: a record with a
    ``__value_schema_id`` header (Schema Registry 8.0) is all payload, no prefix required. (Under
    ``auto`` such a value, JSON text, has no prefix to strip anyway.)"""
    # Exact numbers only when a decimal column needs them (float parsing is faster).
    decoder = json.JSONDecoder(parse_float=Decimal) if _has_decimal(fmt._plan) else json.JSONDecoder()
    # The C scanner alone handles a value without surrounding whitespace (the
    # common case) ~10% faster than decode(); decode() handles the rest and
    # words every error exactly as json.loads does.
    # typeshed omits JSONDecoder.scan_once, which JSONDecoder.__init__ always sets (json/decoder.py)
    scan, decode = decoder.scan_once, decoder.decode  # type: ignore[attr-defined]
    wire = fmt.wire_format
    rows: list[dict] = []
    append = rows.append
    for i, value in enumerate(raw):
        if value is None:
            append(_EMPTY)
            continue
        try:
            if wire != "none" and not (headers is not None and _names_schema(headers[i])):
                value = _payload(value, wire)
            text = value.decode("utf-8")
            try:
                obj, end = scan(text, 0)
            except StopIteration:
                if text.startswith("\ufeff"):  # json.loads's check, which decode() lacks
                    raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0) from None
                obj, end = decode(text), len(text)
            if end != len(text):
                obj = decode(text)
        except json.JSONDecodeError as e:
            errors[i] = _one_line(f"invalid JSON at char {e.pos}: {e.msg}")
            obj = _EMPTY
        except UnicodeDecodeError as e:
            errors[i] = _one_line(f"invalid UTF-8 at byte {e.start}: {e.reason}")
            obj = _EMPTY
        except RecursionError:
            errors[i] = "invalid JSON: nested too deeply"
            obj = _EMPTY
        except ValueError as e:  # e.g. an integer longer than sys.get_int_max_str_digits()
            errors[i] = _one_line(f"invalid JSON: {e}")
            obj = _EMPTY
        except _Mismatch as e:
            errors[i] = str(e)
            obj = _EMPTY
        else:
            if type(obj) is not dict:
                errors[i] = f"expected a JSON object, got {_describe(obj)}"
                obj = _EMPTY
        append(obj)
    return rows


def _decode_avro(raw: list[bytes | None], fmt: ValueFormat, errors: list[str | None],
                 headers: list[list[dict] | None] | None = None) -> list[dict]:
    """One dict per value (``_EMPTY`` for a tombstone or a failure, with its error set).

    ``headers``: each record's headers (``[{"key": str, "value": bytes}, ...]`` or None), read for
    a ``__value_schema_id`` header only when ``fmt.registry`` is set."""
    from fastavro import schemaless_reader  # imported here so json topics do not need fastavro

    from pipeline.registry.lookup import lookup_for

    schema = fmt._fastavro_schema
    wire = fmt.wire_format
    lookup = lookup_for(fmt.registry) if fmt.registry is not None else None
    plans: dict[SchemaKey, tuple[Any, Any]] = {}  # writer's key -> (writer, reader: None when it is the writer)
    unusable: dict[SchemaKey, _WriterSchemaError] = {}  # writer's key -> why (asked once per call)

    def decode(i: int, value: bytes) -> dict:
        key = None
        if lookup is not None:
            record_headers = headers[i] if headers is not None else None
            key = _header_schema_key(record_headers) if record_headers else None
            if key is not None:  # the header names the writer's schema; the value is all payload
                payload = value
            else:
                payload = _payload(value, wire)
                if len(payload) != len(value):
                    key = ("id", int.from_bytes(value[1:WIRE_HEADER_BYTES], "big", signed=True))
        else:
            payload = _payload(value, wire)
        fo = io.BytesIO(payload)
        writer, reader = schema, None
        if key is not None:  # read with the writer's schema, resolved against the topic's
            plan = plans.get(key)
            if plan is None:
                if key in unusable:
                    raise unusable[key]
                try:
                    found = _writer_schema(lookup, key)
                except _WriterSchemaError as e:
                    unusable[key] = e
                    raise
                plan = plans[key] = (found, None if found == schema else schema)
            writer, reader = plan
        # the writer schema's root is a record (_avro_root_plan), so the message is a dict
        record = cast(dict, schemaless_reader(fo, writer, reader))
        if fo.tell() != len(payload):
            raise _Mismatch(f"Avro decode failed: {len(payload) - fo.tell()} trailing bytes after the "
                            f"record (payload {len(payload)} bytes)")
        return record

    return _decode_each(raw, errors, decode, "Avro")


def _decode_each(raw: list[bytes | None], errors: list[str | None], decode: Callable[[int, bytes], dict],
                 what: str) -> list[dict]:
    """``decode(i, value)`` for each value: one dict per value, ``_EMPTY`` for a tombstone (None) or a
    value whose decode raised (``errors[i]`` set to its one-line reason, :func:`_decode_error`).
    ``RegistryUnavailable`` is not a record's fault: it propagates and the flush is retried."""
    from pipeline.registry.lookup import RegistryUnavailable

    rows: list[dict] = []
    append = rows.append
    for i, value in enumerate(raw):
        if value is None:
            append(_EMPTY)
            continue
        try:
            append(decode(i, value))
        except RegistryUnavailable:
            raise
        except Exception as e:  # noqa: BLE001 - any failure on untrusted bytes is this record's error
            errors[i] = _decode_error(e, what)
            append(_EMPTY)
    return rows


def _decode_error(e: Exception, what: str) -> str:
    """The one-line dead-letter reason of a value that failed to decode (``what``: "Avro", "Protobuf"):
    a missing wire-format header or an unusable writer schema as they say, else ``"<what> decode failed:
    <exception>"``."""
    if isinstance(e, _Mismatch):
        return str(e)
    if isinstance(e, _WriterSchemaError):
        return _one_line(str(e))
    detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    # fastavro names the stream it reads ("cannot read boolean from <_io.BytesIO object at 0x7f..>"):
    # an address says nothing to a reader of the dead letters, and two reads of the value differ by it
    return _one_line(f"{what} decode failed: {_OBJECT_AT.sub('', detail)}")


_OBJECT_AT = re.compile(r" from <[\w.]+ object at 0x[0-9a-fA-F]+>")


SchemaKey = tuple[str, int | str]
"""How a record names its writer's schema: ("id", registry id) or ("guid", GUID text)."""

VALUE_SCHEMA_ID_HEADER = "__value_schema_id"
"""The record header Confluent's serializers (Schema Registry 8.0, ``header_schema_id_serializer``) put
the writer schema's identifier in: magic byte 1 + a 16-byte GUID, or magic byte 0 + a 4-byte id."""


def _names_schema(headers: list[dict] | None) -> bool:
    """Whether a record's headers have a ``__value_schema_id`` header."""
    return bool(headers) and any(h.get("key") == VALUE_SCHEMA_ID_HEADER for h in headers or ())


class _WriterSchemaError(Exception):
    """A value's writer schema is unknown to the registry or unusable (that record's error)."""


def _header_schema_key(headers: list[dict]) -> SchemaKey | None:
    """The writer schema's key from a record's ``__value_schema_id`` header (the last one), None without.

    Raises:
        _WriterSchemaError: the header is there but is neither form, exactly (Confluent
            ``SchemaId.from_bytes``; only a Protobuf value's header carries more, its message indexes).
    """
    found = _schema_id_header(headers)
    if found is None:
        return None
    key, rest = found
    if rest:
        raise _WriterSchemaError(f"header {VALUE_SCHEMA_ID_HEADER} has {len(rest)} bytes after its schema "
                                 f"{key[0]}: neither a GUID (1 + 16 bytes) nor an id (0 + 4 bytes)")
    return key


_WRITER_SCHEMAS: dict[tuple[str, SchemaKey], Any] = {}
"""(registry target, writer's key) -> the parsed fastavro writer schema (ids and GUIDs never change meaning)."""


def _schema_name(key: SchemaKey) -> str:
    """How an error names a writer's schema: ``"schema id 7"`` or ``"schema guid <guid>"``."""
    kind, ident = key
    return f"schema id {ident}" if kind == "id" else f"schema guid {ident}"


def _writer_text(lookup: Any, key: SchemaKey, schema_type: str, what: str) -> tuple[str, str]:
    """The writer's schema text for ``key`` and the name to report it by (``"schema id 7"``).

    Raises:
        _WriterSchemaError: the registry has no such schema, or it is not of ``schema_type``
            ("AVRO", "PROTOBUF"; ``what`` names the topic's values in the message).
        RegistryUnavailable: the registry could not be asked.
    """
    kind, ident = key
    name = _schema_name(key)
    found = lookup.schema(int(ident)) if kind == "id" else lookup.schema_by_guid(str(ident))
    if found is None:
        raise _WriterSchemaError(f"{name} is not in the schema registry")
    found_type, text = found
    if found_type != schema_type:
        raise _WriterSchemaError(f"{name} is a {found_type} schema; the topic's values are {what}")
    return name, text


def _writer_schema(lookup: Any, key: SchemaKey) -> Any:
    """The fastavro schema of registry id or GUID ``key`` (cached per process).

    Raises:
        _WriterSchemaError: no such schema, not an Avro schema, or one fastavro cannot parse.
        RegistryUnavailable: the registry could not be asked.
    """
    cache_key = (lookup.target, key)
    parsed = _WRITER_SCHEMAS.get(cache_key)
    if parsed is not None:
        return parsed
    name, text = _writer_text(lookup, key, "AVRO", "Avro")
    try:
        parsed = _fastavro_parse(_load_avro(text))
    except ValueError as e:
        raise _WriterSchemaError(f"{name}: {e}") from None
    _WRITER_SCHEMAS[cache_key] = parsed
    return parsed


# ------------------------------------------------------------------ protobuf
#
# A protobuf topic's table is the first message of its registry subject's latest version; each value
# is parsed with its writer's message (the schema its id names, the message its indexes name) and
# turned into a dict by field name for the builder, whose leaves (the Avro ones: the Python types
# match) make the Arrow columns. Rules: Confluent's Protobuf serdes (the wire format's message
# indexes, confluent-kafka ``SchemaId.from_bytes``); the mapping: ``protobuf_to_arrow_schema``.

_PB_WRAPPERS = {
    "google.protobuf.DoubleValue": (pa.float64(), float), "google.protobuf.FloatValue": (pa.float32(), float),
    "google.protobuf.Int64Value": (pa.int64(), int), "google.protobuf.UInt64Value": (pa.int64(), int),
    "google.protobuf.Int32Value": (pa.int32(), int), "google.protobuf.UInt32Value": (pa.int64(), int),
    "google.protobuf.BoolValue": (pa.bool_(), bool), "google.protobuf.StringValue": (pa.string(), str),
    "google.protobuf.BytesValue": (pa.binary(), bytes),
}
_PB_TIMESTAMP = "google.protobuf.Timestamp"
_PB_MAX_INDEXES = 100_000  # confluent-kafka SchemaId._read_index_array's bound


def _pb_scalars() -> dict[int, tuple[pa.DataType, type]]:
    from google.protobuf.descriptor import FieldDescriptor as F

    return {
        F.TYPE_INT32: (pa.int32(), int), F.TYPE_SINT32: (pa.int32(), int), F.TYPE_SFIXED32: (pa.int32(), int),
        F.TYPE_INT64: (pa.int64(), int), F.TYPE_SINT64: (pa.int64(), int), F.TYPE_SFIXED64: (pa.int64(), int),
        F.TYPE_UINT32: (pa.int64(), int), F.TYPE_FIXED32: (pa.int64(), int),
        F.TYPE_UINT64: (pa.int64(), int), F.TYPE_FIXED64: (pa.int64(), int),
        F.TYPE_BOOL: (pa.bool_(), bool), F.TYPE_FLOAT: (pa.float32(), float), F.TYPE_DOUBLE: (pa.float64(), float),
        F.TYPE_STRING: (pa.string(), str), F.TYPE_BYTES: (pa.binary(), bytes), F.TYPE_ENUM: (pa.string(), str),
    }


def _load_protobuf(text: str | None, references: Sequence[tuple[str, str, str]] = ()) -> Any:
    """The table's message ``Descriptor``: the first message of Protobuf schema ``text`` (with its
    ``references``, as ``pipeline.registry.compatibility.parse`` takes them).

    Raises:
        ValueError: no schema, not a Protobuf schema (its reason), or a file without messages.
    """
    from pipeline.registry.protobuf_kind import ProtobufKind
    from pipeline.registry.schema_kind import InvalidSchema

    if not text:
        raise ValueError("kind 'protobuf' needs protobuf_schema")
    try:
        parsed = ProtobufKind.parse(text, references)
        return parsed.message([0])
    except InvalidSchema as e:
        raise ValueError(str(e)) from None
    except LookupError:
        raise ValueError("the Protobuf schema has no message") from None


def _protobuf_plan(desc: Any, path: str, defining: frozenset[str] = frozenset()) -> _StructPlan:
    """The struct plan of message ``desc`` (see ``protobuf_to_arrow_schema``). Raises ValueError."""
    where = f"field {path!r}" if path else "the top level"
    if desc.full_name in defining:
        raise ValueError(f"{where}: recursive message {desc.full_name!r} cannot be an Arrow column")
    if not desc.fields:
        raise ValueError(f"{where}: message {desc.full_name!r} has no fields (Parquet cannot store an empty struct)")
    inner = defining | {desc.full_name}
    subs = []
    for fd in desc.fields:
        sub_path = f"{path}.{fd.name}" if path else fd.name
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            key_fd, value_fd = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
            key = _protobuf_field_plan(key_fd, sub_path + "(key)", inner)
            item = _protobuf_field_plan(value_fd, sub_path + "[]", inner)
            plan: Any = _MapPlan(pa.map_(key.type, item.type), key, item)
        else:
            plan = _protobuf_field_plan(fd, sub_path + ("[]" if fd.is_repeated else ""), inner)
            if fd.is_repeated:
                plan = _ListPlan(pa.list_(pa.field("element", plan.type)), plan)
        subs.append((fd.name, plan))
    return _StructPlan(pa.struct([pa.field(name, sub.type) for name, sub in subs]), tuple(subs))


def _protobuf_field_plan(fd: Any, path: str, defining: frozenset[str]) -> Any:
    """The plan of one value of field ``fd`` (an element, for a repeated one)."""
    if fd.message_type is None:
        arrow, python = _pb_scalars()[fd.type]
        return _AvroPlain(arrow, python)
    name = fd.message_type.full_name
    if name == _PB_TIMESTAMP:
        return _AvroTimestamp(TIMESTAMP_TYPE, 1)
    if name in _PB_WRAPPERS:
        return _AvroPlain(*_PB_WRAPPERS[name])
    return _protobuf_plan(fd.message_type, path, defining)


def protobuf_to_arrow_schema(text: str, references: Sequence[tuple[str, str, str]] = ()) -> pa.Schema:
    """Arrow schema of the typed columns for Protobuf schema ``text`` (base64 ``FileDescriptorProto`` or
    ``.proto`` source; ``references``: the files it imports but the well-known ones, as
    ``pipeline.registry.compatibility.parse`` takes them): one column per field of its first message,
    all nullable.

    ==============================================  ====================================
    Protobuf                                        Arrow
    ==============================================  ====================================
    int32, sint32, sfixed32                         int32
    int64, sint64, sfixed64                         int64
    uint32, fixed32                                 int64
    uint64, fixed64                                 int64 (a value past 2^63-1: the record's error)
    bool / float / double                           bool / float32 / float64
    string / bytes                                  string / binary
    enum                                            string (the value's name; an unknown number: its digits)
    message                                         struct (fields in declaration order)
    repeated T                                      list<element: T>
    map<K, V>                                       map<K, V> (K mapped as above)
    google.protobuf.Timestamp                       timestamp[us, tz=UTC] (nanoseconds truncated)
    google.protobuf.{Double,Float,...}Value         the wrapped scalar, null when unset
    ==============================================  ====================================

    Raises:
        ValueError: not a Protobuf schema, no message, a recursive message or one without fields
            (named by its path).
    """
    return pa.schema(list(_protobuf_plan(_load_protobuf(text, references), "").type))


def _pb_converter(desc: Any) -> Callable[[Any], dict]:
    """message -> {field name: Python value as the leaves take it} for messages of ``desc``.

    A field with presence (a message, proto3 ``optional``, a oneof member, proto2) that is unset is
    None; a proto3 scalar without presence is its value (0, "", false when unset: the wire cannot
    tell). Repeated fields are lists, maps dicts."""
    from google.protobuf.descriptor import FieldDescriptor as F

    def value_of(fd: Any) -> Callable[[Any], Any] | None:
        if fd.type == F.TYPE_ENUM:
            names = {v.number: v.name for v in fd.enum_type.values}
            return lambda v: names.get(v, str(v))
        if fd.message_type is None:
            return None  # the Python value as it is
        name = fd.message_type.full_name
        if name == _PB_TIMESTAMP:
            return lambda m: m.seconds * _US_PER_S + m.nanos // 1000
        if name in _PB_WRAPPERS:
            return lambda m: m.value
        return _pb_converter(fd.message_type)

    steps = []
    for fd in desc.fields:
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            conv = value_of(fd.message_type.fields_by_name["value"])
            steps.append((fd.name, "map", False, conv))
        else:
            steps.append((fd.name, "list" if fd.is_repeated else "one", fd.has_presence, value_of(fd)))

    def convert(message: Any) -> dict:
        out: dict[str, Any] = {}
        for name, shape, presence, conv in steps:
            v = getattr(message, name)
            if shape == "one":
                if presence and not message.HasField(name):
                    out[name] = None
                else:
                    out[name] = v if conv is None else conv(v)
            elif shape == "list":
                out[name] = list(v) if conv is None else [conv(x) for x in v]
            else:
                out[name] = dict(v) if conv is None else {k: conv(x) for k, x in v.items()}
        return out

    return convert


def _read_zigzag(data: bytes, pos: int) -> tuple[int, int]:
    """One zigzag varint of ``data`` at ``pos``: (value, next position). Raises _Mismatch."""
    shift = result = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Mismatch("Protobuf message indexes: truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos


def _read_message_indexes(data: bytes, pos: int) -> tuple[list[int], int]:
    """Confluent's message indexes at ``pos``: a zigzag count (0: ``[0]``, the first message) then the
    indexes; (indexes, next position). Raises _Mismatch."""
    count, pos = _read_zigzag(data, pos)
    if count == 0:
        return [0], pos
    if not 0 < count <= _PB_MAX_INDEXES:
        raise _Mismatch(f"Protobuf message indexes: invalid count {count}")
    indexes = []
    for _ in range(count):
        i, pos = _read_zigzag(data, pos)
        indexes.append(i)
    return indexes, pos


def _schema_id_header(headers: list[dict]) -> tuple[SchemaKey, bytes] | None:
    """(the writer's key, the header's bytes after it) from a record's last ``__value_schema_id`` header,
    None without; confluent-kafka's ``header_schema_id_serializer`` puts a Protobuf value's message
    indexes there, after the GUID.

    Raises:
        _WriterSchemaError: the header is neither a GUID (1 + 16 bytes) nor an id (0 + 4 bytes) form.
    """
    found = None
    for h in headers:
        if h.get("key") == VALUE_SCHEMA_ID_HEADER:
            found = h.get("value")
    if found is None:
        return None
    found = bytes(found)
    if len(found) >= 17 and found[0] == 1:
        import uuid

        return ("guid", str(uuid.UUID(bytes=found[1:17]))), found[17:]
    if len(found) >= WIRE_HEADER_BYTES and found[0] == WIRE_MAGIC:
        return ("id", int.from_bytes(found[1:WIRE_HEADER_BYTES], "big", signed=True)), found[WIRE_HEADER_BYTES:]
    raise _WriterSchemaError(f"header {VALUE_SCHEMA_ID_HEADER} holds {len(found)} bytes starting "
                             f"{found[:1].hex() or 'with nothing'}: neither a GUID (1 + 16 bytes) nor an id "
                             "(0 + 4 bytes)")


_PB_WRITERS: dict[tuple[str, SchemaKey], Any] = {}
"""(registry target, writer's key) -> the writer's parsed ``ProtobufSchema`` (ids never change meaning)."""
_PB_MESSAGES: dict[tuple[str, SchemaKey, tuple[int, ...]], tuple[Any, Callable[[Any], dict], str]] = {}
"""(registry target, writer's key, message indexes) -> (message class, converter, message full name)."""


def _pb_writer_message(lookup: Any, key: SchemaKey, indexes: list[int]) -> tuple[Any, Callable[[Any], dict], str]:
    """The writer's message class, its converter and its full name (cached per process).

    Raises:
        _WriterSchemaError: no such schema, not a Protobuf one, not parsable (with its references,
            ``SchemaLookup.references``), or no message at ``indexes``.
        RegistryUnavailable: the registry could not be asked.
    """
    cache_key = (lookup.target, key, tuple(indexes))
    found = _PB_MESSAGES.get(cache_key)
    if found is not None:
        return found
    from google.protobuf.message_factory import GetMessageClass

    from pipeline.registry.protobuf_kind import ProtobufKind
    from pipeline.registry.schema_kind import InvalidSchema

    kind, ident = key
    name = _schema_name(key)
    schema = _PB_WRITERS.get((lookup.target, key))
    if schema is None:
        _, text = _writer_text(lookup, key, "PROTOBUF", "Protobuf")
        try:
            schema = ProtobufKind.parse(text, lookup.references(int(ident) if kind == "id" else str(ident)))
        except InvalidSchema as e:
            raise _WriterSchemaError(f"{name}: {e}") from None
        _PB_WRITERS[(lookup.target, key)] = schema
    try:
        desc = schema.message(indexes)
    except LookupError as e:
        raise _WriterSchemaError(f"{name}: {e}") from None
    found = _PB_MESSAGES[cache_key] = (GetMessageClass(desc), _pb_converter(desc), desc.full_name)
    return found


def _decode_protobuf(raw: list[bytes | None], fmt: ValueFormat, errors: list[str | None],
                     headers: list[list[dict] | None] | None = None) -> list[dict]:
    """One dict per value (``_EMPTY`` for a tombstone or a failure, with its error set).

    Each value names its writer's schema by a ``__value_schema_id`` header (its message indexes after
    the id in the header, as confluent-kafka writes them, or else at the payload's start) or by the
    wire-format prefix (magic 0, 4-byte id, message indexes); a value with neither is read with the
    table's own message. The writer's message must be the table's (same full name)."""
    from google.protobuf.message_factory import GetMessageClass

    from pipeline.registry.lookup import lookup_for

    assert fmt.registry is not None
    lookup = lookup_for(fmt.registry)
    table_message = fmt._protobuf_message
    own = (GetMessageClass(table_message), _pb_converter(table_message), table_message.full_name)
    wire = fmt.wire_format
    unusable: dict[tuple[SchemaKey, tuple[int, ...]], _WriterSchemaError] = {}

    def decode(i: int, value: bytes) -> dict:
        record_headers = headers[i] if headers is not None else None
        in_header = _schema_id_header(record_headers) if record_headers else None
        key: SchemaKey | None = None
        if in_header is not None:
            key, rest = in_header
            if rest:
                indexes, _ = _read_message_indexes(rest, 0)
                payload = value
            else:
                indexes, start = _read_message_indexes(value, 0)
                payload = value[start:]
        else:
            payload = _payload(value, wire)
            if len(payload) != len(value):
                key = ("id", int.from_bytes(value[1:WIRE_HEADER_BYTES], "big", signed=True))
                indexes, start = _read_message_indexes(value, WIRE_HEADER_BYTES)
                payload = value[start:]
        if key is None:
            cls, convert, full_name = own
        else:
            found = unusable.get((key, tuple(indexes)))
            if found is not None:
                raise found
            try:
                cls, convert, full_name = _pb_writer_message(lookup, key, indexes)
            except _WriterSchemaError as e:
                unusable[(key, tuple(indexes))] = e
                raise
        if full_name != table_message.full_name:
            raise _WriterSchemaError(f"the value is a {full_name} message; the table's is "
                                     f"{table_message.full_name}")
        message = cls()
        message.ParseFromString(payload)
        return convert(message)

    return _decode_each(raw, errors, decode, "Protobuf")


# --------------------------------------------------------------- the builder
#
# A plan mirrors the Arrow type: containers (_ListPlan, _StructPlan, _MapPlan)
# and leaves (_Leaf subclasses, one per source encoding and Arrow type). The
# builder shreds a column of Python values into leaves, converts each leaf in
# one pyarrow call when its values have only the Python types the leaf's bulk
# path takes, and otherwise walks the leaf value by value (normalising what is
# legal, recording what is not). A locator maps a position in a leaf back to
# (record index, field path) for the error text.

Locator = Callable[[int], tuple[int, str]]
# The row of a tombstone or a failed record: every field missing. Never mutated.
_EMPTY: dict = {}


class _Fails(dict):
    """Record index -> the first reason it failed, in one conversion pass.

    ``placeholder`` is set when a container had to be returned as nulls because
    a failed value made it impossible to assemble (a null map key).
    """

    placeholder = False


class _Mismatch(Exception):
    """One value does not fit its type; the text says why (one line)."""


@dataclass(frozen=True)
class _ListPlan:
    type: pa.ListType
    item: Any
    expected = "array"


@dataclass(frozen=True)
class _StructPlan:
    type: pa.StructType
    fields: tuple[tuple[str, Any], ...]
    expected = "object"


@dataclass(frozen=True)
class _MapPlan:
    type: pa.MapType
    key: Any
    item: Any
    expected = "object"


def _top_loc(name: str) -> Locator:
    return lambda j: (j, name)


def _field_loc(parent: Locator, name: str) -> Locator:
    def loc(j: int) -> tuple[int, str]:
        record, path = parent(j)
        return record, f"{path}.{name}"

    return loc


def _list_loc(parent: Locator, offsets: list[int]) -> Locator:
    def loc(j: int) -> tuple[int, str]:
        p = bisect_right(offsets, j) - 1
        record, path = parent(p)
        return record, f"{path}[{j - offsets[p]}]"

    return loc


def _map_loc(parent: Locator, offsets: list[int], keys: list, suffix: str = "") -> Locator:
    def loc(j: int) -> tuple[int, str]:
        p = bisect_right(offsets, j) - 1
        record, path = parent(p)
        return record, f"{path}[{json.dumps(keys[j])}]{suffix}"

    return loc


def _fail(fails: _Fails, loc: Locator, j: int, message: str) -> None:
    record, path = loc(j)
    fails.setdefault(record, _one_line(f"field '{path}': {message}"))


def _build(plan: Any, values: list, loc: Locator, fails: _Fails) -> pa.Array:
    """Convert one column (a list of decoded Python values) to an Arrow array of ``plan.type``.

    Values that do not fit are recorded in ``fails`` (record index -> reason)
    and converted as null; the caller nulls their records' rows. A container
    that cannot be assembled because of such a value is returned as nulls with
    ``fails.placeholder`` set (the caller converts that column again).
    ``values`` may be modified.
    """
    kinds = set(map(type, values))
    if isinstance(plan, _Leaf):
        kinds.discard(_NoneType)
        return _build_leaf(plan, values, kinds, loc, fails)
    want = list if isinstance(plan, _ListPlan) else dict
    has_null = _NoneType in kinds
    kinds.discard(_NoneType)
    if kinds - {want}:
        for j, v in enumerate(values):
            if v is not None and type(v) is not want:
                _fail(fails, loc, j, f"expected {plan.expected}, got {_describe(v)}")
                values[j] = None
                has_null = True
    mask = pa.array([v is None for v in values], pa.bool_()) if has_null else None
    try:
        if isinstance(plan, _StructPlan):
            rows = [_EMPTY if v is None else v for v in values] if has_null else values
            children = [
                _build(sub, list(map(dict.get, rows, repeat(name))), _field_loc(loc, name), fails)
                for name, sub in plan.fields
            ]
            return pa.StructArray.from_arrays(children, fields=list(plan.type), mask=mask)
        offsets = list(accumulate((0 if v is None else len(v) for v in values), initial=0))
        offsets_array = pa.array(offsets, pa.int32())
        if isinstance(plan, _ListPlan):
            flat = list(chain.from_iterable(v for v in values if v))
            child = _build(plan.item, flat, _list_loc(loc, offsets), fails)
            return pa.ListArray.from_arrays(offsets_array, child, type=plan.type, mask=mask)
        keys = list(chain.from_iterable(v for v in values if v))
        items = list(chain.from_iterable(v.values() for v in values if v))
        key_array = _build(plan.key, list(keys), _map_loc(loc, offsets, keys, " (key)"), fails)
        item_array = _build(plan.item, items, _map_loc(loc, offsets, keys), fails)
        return pa.MapArray.from_arrays(offsets_array, key_array, item_array, type=plan.type, mask=mask)
    except (pa.ArrowException, ValueError, TypeError):
        if fails:
            fails.placeholder = True
            return pa.nulls(len(values), plan.type)
        raise


def _build_leaf(leaf: _Leaf, values: list, kinds: set, loc: Locator, fails: _Fails) -> pa.Array:
    if not kinds:
        return pa.nulls(len(values), leaf.type)
    if kinds <= leaf.accepts:
        try:
            return leaf.bulk(values, kinds)
        except Exception:  # noqa: BLE001 - any failure: find the culprits value by value
            pass
    scalar = leaf.scalar
    norm: list = []
    append = norm.append
    for j, v in enumerate(values):
        if v is None:
            append(None)
            continue
        try:
            append(scalar(v))
        except _Mismatch as e:
            _fail(fails, loc, j, str(e))
            append(None)
    try:
        return leaf.build(norm)
    except Exception:  # noqa: BLE001 - safety net: the per-value check missed something
        for j, v in enumerate(norm):
            if v is not None:
                try:
                    leaf.build([v])
                except Exception as e:  # noqa: BLE001
                    _fail(fails, loc, j, f"{_describe(values[j])}: {e}")
                    norm[j] = None
        return leaf.build(norm)


def _has_decimal(plan: Any) -> bool:
    if isinstance(plan, _Leaf):
        return isinstance(plan, _JsonDecimal)
    if isinstance(plan, _StructPlan):
        return any(_has_decimal(sub) for _, sub in plan.fields)
    if isinstance(plan, _MapPlan):
        return _has_decimal(plan.item)
    return _has_decimal(plan.item)


def _describe(v: object) -> str:
    """A short, one-line description of a decoded value for an error text."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean " + ("true" if v else "false")
    if isinstance(v, dict):
        return "object"
    if isinstance(v, list):
        return "array"
    if isinstance(v, str):
        text = json.dumps(v)
        return "string " + (text if len(text) <= 40 else text[:36] + '..."')
    if isinstance(v, (int, float, Decimal)):
        text = str(v) if not isinstance(v, float) else json.dumps(v)
        return "number " + (text if len(text) <= 40 else text[:37] + "...")
    if isinstance(v, bytes):
        return f"{len(v)} bytes"
    return type(v).__name__


# ------------------------------------------------------------------- leaves


class _Leaf:
    """One Arrow leaf type fed from one source encoding.

    ``accepts``: the Python types ``bulk`` takes; ``bulk(values, kinds)``
    (``kinds``: the types present) converts in few calls and may raise; ``scalar(v)`` normalises one non-null
    value or raises _Mismatch; ``build(normalised)`` converts what ``scalar``
    returned. ``bulk`` must accept nothing that ``scalar`` rejects, and give
    the same result.
    """

    accepts: frozenset = frozenset()

    def __init__(self, type_: pa.DataType) -> None:
        self.type = type_

    def bulk(self, values: list, kinds: set) -> pa.Array:
        return pa.array(values, self.type)

    def scalar(self, v: object) -> object:  # pragma: no cover - every leaf overrides it
        raise NotImplementedError

    def build(self, norm: list) -> pa.Array:
        return pa.array(norm, self.type)

    def mismatch(self, v: object) -> _Mismatch:
        return _Mismatch(f"expected {self.type}, got {_describe(v)}")


class _JsonBool(_Leaf):
    accepts = frozenset({bool})

    def scalar(self, v):
        if type(v) is bool:
            return v
        raise self.mismatch(v)


class _JsonInt(_Leaf):
    accepts = frozenset({int})

    def __init__(self, type_: pa.DataType) -> None:
        super().__init__(type_)
        self.lo, self.hi = _INT_RANGES[type_]

    def scalar(self, v):
        if type(v) is not int:
            raise self.mismatch(v)
        if not self.lo <= v <= self.hi:
            raise _Mismatch(f"{_describe(v)} out of range for {self.type}")
        return v


class _JsonFloat(_Leaf):
    accepts = frozenset({int, float, Decimal})

    def bulk(self, values, kinds):
        if Decimal in kinds:  # numbers parsed exactly for a decimal column elsewhere
            values = [float(v) if type(v) is Decimal else v for v in values]
        return pa.array(values, self.type)

    def scalar(self, v):
        t = type(v)
        if t is float:
            return v
        if t is int or t is Decimal:
            try:
                return float(v)
            except OverflowError:  # a huge JSON integer: Jackson's doubleValue gives infinity
                return math.inf if v > 0 else -math.inf
        if t is str and v in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[v]
        raise self.mismatch(v)


class _JsonString(_Leaf):
    accepts = frozenset({str})

    def scalar(self, v):
        if type(v) is not str:
            try:
                v = json.dumps(v, ensure_ascii=False, separators=(",", ":"), default=_decimal_to_json)
            except (RecursionError, ValueError) as e:
                raise _Mismatch(f"cannot keep {_describe(v)} as JSON text: {e}") from None
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise _Mismatch("string is not valid Unicode (lone surrogate escape)") from None
        return v


def _decimal_to_json(v: object) -> float:
    if isinstance(v, Decimal):
        return float(v)
    raise TypeError(f"{type(v).__name__} is not JSON")


class _JsonBinary(_Leaf):
    accepts = frozenset()  # always value by value: base64

    def scalar(self, v):
        if type(v) is not str:
            raise self.mismatch(v)
        try:
            return base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError):
            raise _Mismatch(f"{_describe(v)} is not base64") from None


def _strings_matching(values: list, pattern: str) -> pa.Array:
    """``values`` (str or None) as a string array; raises unless every one matches ``pattern``."""
    strings = pa.array(values, pa.string())
    if not pc.all(pc.match_substring_regex(strings, f"^(?:{pattern})$")).as_py():
        raise ValueError("a value outside the grammar")
    return strings


class _JsonDate(_Leaf):
    accepts = frozenset({str})

    def bulk(self, values, kinds):
        return _strings_matching(values, _DATE_PATTERN).cast(pa.date32())

    def scalar(self, v):
        if type(v) is not str:
            raise self.mismatch(v)
        m = _DATE_RE.fullmatch(v)
        if m is None:
            raise _Mismatch(f"{_describe(v)} is not an ISO-8601 date (YYYY-MM-DD)")
        y, mo, d = int(m[1]), int(m[2]), int(m[3])
        if not _valid_date(y, mo, d):
            raise _Mismatch(f"{_describe(v)} is not a valid date")
        return _days_from_civil(y, mo, d)

    def build(self, norm):
        return pa.array(norm, pa.int32()).cast(pa.date32())


class _JsonTimestamp(_Leaf):
    accepts = frozenset({str})

    def bulk(self, values, kinds):
        strings = _strings_matching(values, _TIMESTAMP_PATTERN)
        try:
            return strings.cast(self.type)  # every value has an offset
        except pa.ArrowInvalid:
            # every value without an offset: naive, then labelled UTC (no shift)
            return strings.cast(LOCAL_TIMESTAMP_TYPE).cast(self.type)

    def scalar(self, v):
        t = type(v)
        if t is int:
            us = v * _US_PER_S
            if not _INT64_MIN <= us <= _INT64_MAX:
                raise _Mismatch(f"{_describe(v)} seconds since the epoch is out of range")
            return us
        if t is not str:
            raise self.mismatch(v)
        us = _parse_timestamp(v)
        if us is None:
            raise _Mismatch(f"{_describe(v)} is not an ISO-8601 timestamp")
        return us

    def build(self, norm):
        return pa.array(norm, pa.int64()).cast(self.type)


class _JsonDecimal(_Leaf):
    accepts = frozenset({int, Decimal, str})

    def bulk(self, values, kinds):
        if str not in kinds:
            return pa.array(values, self.type)  # fails when a value needs rounding
        if len(kinds) > 1:
            raise ValueError("numbers and strings: value by value")
        return _strings_matching(values, _DECIMAL_PATTERN).cast(self.type)  # fails on rounding too

    def scalar(self, v):
        t = type(v)
        if t is int:
            d = Decimal(v)
        elif t is Decimal:
            d = v
        elif t is float and math.isfinite(v):
            d = Decimal(repr(v))
        elif t is str:
            text = v.replace(",", "")
            if _DECIMAL_RE.fullmatch(text) is None:
                raise _Mismatch(f"{_describe(v)} is not a decimal number")
            d = Decimal(text)
        else:
            raise self.mismatch(v)
        return _fit_decimal(d, self.type, v)


class _AvroPlain(_Leaf):
    """An Avro primitive fastavro already returns as the right Python type."""

    def __init__(self, type_: pa.DataType, python_type: type) -> None:
        super().__init__(type_)
        self.accepts = frozenset({python_type})
        self.range = _INT_RANGES.get(type_)

    def scalar(self, v):
        if type(v) not in self.accepts:
            raise self.mismatch(v)
        if self.range is not None and not self.range[0] <= v <= self.range[1]:
            raise _Mismatch(f"{v} out of range for {self.type}")
        return v


class _AvroDate(_Leaf):
    accepts = frozenset({int})

    def bulk(self, values, kinds):
        return pa.array(values, pa.int32()).cast(pa.date32())

    def scalar(self, v):
        if type(v) is not int or not -(2**31) <= v < 2**31:
            raise _Mismatch(f"date {v} days out of range")
        return v

    def build(self, norm):
        return pa.array(norm, pa.int32()).cast(pa.date32())


class _AvroTimestamp(_Leaf):
    accepts = frozenset({int})

    def __init__(self, type_: pa.DataType, us_per_unit: int) -> None:
        super().__init__(type_)
        self.us_per_unit = us_per_unit

    def bulk(self, values, kinds):
        array = pa.array(values, pa.int64())
        if self.us_per_unit != 1:
            array = pc.multiply_checked(array, self.us_per_unit)
        return array.cast(self.type)

    def scalar(self, v):
        us = v * self.us_per_unit if type(v) is int else None
        if us is None or not _INT64_MIN <= us <= _INT64_MAX:
            raise _Mismatch(f"timestamp {v} out of range for {self.type}")
        return us

    def build(self, norm):
        return pa.array(norm, pa.int64()).cast(self.type)


class _AvroDecimal(_Leaf):
    accepts = frozenset({bytes})

    def bulk(self, values, kinds):
        """Unscaled values that fit an int64 straight into decimal128's (low, high) words."""
        if sys.byteorder != "little":
            raise ValueError("the word layout below is little-endian")
        unscaled = np.array(
            [0 if v is None else int.from_bytes(v, "big", signed=True) for v in values], dtype=np.int64
        )  # OverflowError past int64: value by value then
        if self.type.precision < 19:
            limit = 10**self.type.precision
            if ((unscaled >= limit) | (unscaled <= -limit)).any():
                raise ValueError("a value has more digits than the precision")
        words = np.empty((len(values), 2), dtype=np.int64)
        words[:, 0] = unscaled
        words[:, 1] = unscaled >> 63  # sign extension into the high word
        validity = None
        if None in values:
            validity = pa.array([v is not None for v in values], pa.bool_()).buffers()[1]
        return pa.Array.from_buffers(self.type, len(values), [validity, pa.py_buffer(words)])

    def scalar(self, v):
        unscaled = int.from_bytes(v, "big", signed=True)
        if abs(unscaled) >= 10**self.type.precision:
            raise _Mismatch(f"unscaled value {unscaled} has more than {self.type.precision} digits")
        return Decimal(unscaled).scaleb(-self.type.scale, _DECIMAL_CONTEXT)


def _fit_decimal(d: Decimal, type_: pa.Decimal128Type, original: object) -> Decimal:
    """Round ``d`` HALF_UP to the type's scale (Spark ``Decimal.set``); raise if it does not fit."""
    p, s = type_.precision, type_.scale
    if not d.is_finite():
        raise _Mismatch(f"{_describe(original)} is not a finite decimal")
    if d and d.adjusted() >= p - s + 1:  # more integer digits than fit, even before rounding
        raise _Mismatch(f"{_describe(original)} does not fit decimal({p}, {s})")
    try:
        q = d.quantize(_QUANTA[s], rounding=ROUND_HALF_UP, context=_DECIMAL_CONTEXT)
    except InvalidOperation:
        raise _Mismatch(f"{_describe(original)} does not fit decimal({p}, {s})") from None
    if q.adjusted() >= p - s and q:  # rounding carried into one digit more (9.995 -> 10.00)
        raise _Mismatch(f"{_describe(original)} does not fit decimal({p}, {s})")
    return q


_QUANTA = [Decimal(1).scaleb(-s) for s in range(MAX_DECIMAL_PRECISION + 1)]


def _is_leap(y: int) -> bool:
    return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)


def _valid_date(y: int, m: int, d: int) -> bool:
    if not 1 <= m <= 12 or d < 1:
        return False
    days = (31, 29 if _is_leap(y) else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)[m - 1]
    return d <= days


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 in the proleptic Gregorian calendar (H. Hinnant's algorithm); year 0 allowed."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _parse_timestamp(text: str) -> int | None:
    """Microseconds since the epoch for an ISO-8601 string (no offset = UTC), or None."""
    m = _TIMESTAMP_RE.fullmatch(text)
    if m is None:
        return None
    y, mo, d = int(m[1]), int(m[2]), int(m[3])
    hh, mi, ss = int(m[4] or 0), int(m[5] or 0), int(m[6] or 0)
    if not _valid_date(y, mo, d) or hh > 23 or mi > 59 or ss > 59:
        return None
    us = _days_from_civil(y, mo, d) * _US_PER_DAY + ((hh * 60 + mi) * 60 + ss) * _US_PER_S
    if m[7]:
        us += int(m[7][:6].ljust(6, "0"))
    zone = m[8]
    if zone and zone != "Z":
        digits = zone[1:].replace(":", "")
        oh, om = int(digits[:2]), int(digits[2:] or 0)
        if oh > 23 or om > 59:
            return None
        offset = (oh * 60 + om) * 60 * _US_PER_S
        us += -offset if zone[0] == "+" else offset
    return us


# ------------------------------------------------------------- json schema


def _json_plan(f: pa.Field, path: str) -> Any:
    if not f.nullable:
        raise ValueError(
            f"field {path!r}: NOT NULL is not supported (a tombstone or a failed record is an all-null row)"
        )
    t = f.type
    if pa.types.is_boolean(t):
        return _JsonBool(t)
    if t in _INT_RANGES:
        return _JsonInt(t)
    if pa.types.is_float32(t) or pa.types.is_float64(t):
        return _JsonFloat(t)
    if pa.types.is_string(t):
        return _JsonString(t)
    if pa.types.is_binary(t):
        return _JsonBinary(t)
    if pa.types.is_date32(t):
        return _JsonDate(t)
    if t == TIMESTAMP_TYPE:
        return _JsonTimestamp(t)
    if pa.types.is_decimal128(t):
        if not 0 <= t.scale <= t.precision:
            raise ValueError(f"field {path!r}: {t} needs 0 <= scale <= precision")
        return _JsonDecimal(t)
    if pa.types.is_list(t):
        return _ListPlan(t, _json_plan(t.value_field, path + "[]"))
    if pa.types.is_struct(t):
        children = [t.field(i) for i in range(t.num_fields)]
        if not children:
            raise ValueError(f"field {path!r}: a struct needs at least one field")
        _check_names([c.name for c in children], path)
        return _StructPlan(t, tuple((c.name, _json_plan(c, f"{path}.{c.name}")) for c in children))
    if pa.types.is_map(t):
        if not pa.types.is_string(t.key_type):
            raise ValueError(f"field {path!r}: JSON object keys are strings; {t} needs map<string, ...>")
        return _MapPlan(t, _JsonString(t.key_type), _json_plan(t.item_field, path + "[]"))
    raise ValueError(
        f"field {path!r}: {t} is not supported in a json value format (bool, int8-64, float32/64, string, "
        f"binary, date32, timestamp[us, tz=UTC], decimal128, list, struct, map<string, T>)"
    )


def _check_names(names: list[str], path: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            where = f"in {path!r}" if path else "at the top level"
            raise ValueError(f"field {name!r} appears twice {where}")
        seen.add(name)


# ------------------------------------------------------------- avro schema

_AVRO_PRIMITIVES = {
    "boolean": (pa.bool_(), bool),
    "int": (pa.int32(), int),
    "long": (pa.int64(), int),
    "float": (pa.float32(), float),
    "double": (pa.float64(), float),
    "bytes": (pa.binary(), bytes),
    "string": (pa.string(), str),
}


def _load_avro(avro_schema: dict | str | None) -> dict:
    if avro_schema is None:
        raise ValueError("kind 'avro' needs avro_schema")
    if isinstance(avro_schema, str):
        try:
            avro_schema = json.loads(avro_schema)
        except ValueError as e:
            raise ValueError(f"avro_schema is not JSON: {e}") from None
    if not isinstance(avro_schema, dict) or avro_schema.get("type") not in ("record", "error"):
        raise ValueError("the top level of an Avro value schema must be a record")
    return copy.deepcopy(avro_schema)


def without_logical_types(schema: Any) -> Any:
    """A copy of the Avro schema ``schema`` (parsed JSON) with every ``logicalType`` removed: the schema
    fastavro reads (and writes) dates, timestamps and decimals with as their raw ints and bytes."""
    if isinstance(schema, dict):
        return {k: without_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [without_logical_types(x) for x in schema]
    return schema


def _fastavro_parse(avro: dict) -> FastavroSchema:
    """The writer schema fastavro reads with: logical types removed, so dates,
    timestamps and decimals arrive as their raw ints and bytes (converted with
    Arrow here, without Python datetime's year 1-9999 limits)."""
    from fastavro import parse_schema

    try:
        return parse_schema(without_logical_types(avro))
    except Exception as e:  # noqa: BLE001 - fastavro's schema errors are not ValueErrors
        raise ValueError(_one_line(f"invalid Avro schema: {type(e).__name__}: {e}")) from None


def _avro_root_plan(avro: dict) -> _StructPlan:
    return _avro_plan(avro, "", {}, set(), "")


def _fullname(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _avro_plan(s: Any, namespace: str, named: dict[str, Any], defining: set[str], path: str) -> Any:
    where = f"field {path!r}" if path else "the top level"
    if isinstance(s, str):
        if s in _AVRO_PRIMITIVES:
            arrow, python = _AVRO_PRIMITIVES[s]
            return _AvroPlain(arrow, python)
        if s == "null":
            raise ValueError(f"{where}: a bare 'null' type has no Arrow column (use [\"null\", T])")
        for full in (_fullname(s, namespace), s):
            if full in defining:
                raise ValueError(f"{where}: recursive type {full!r} cannot be an Arrow column")
            if full in named:
                return named[full]
        raise ValueError(f"{where}: unknown Avro type {s!r}")
    if isinstance(s, list):
        branches = [b for b in s if b != "null" and not (isinstance(b, dict) and b.get("type") == "null")]
        if len(branches) != 1:
            raise ValueError(
                f"{where}: union {json.dumps(s)[:80]} is not supported: only [\"null\", T], [T, \"null\"] "
                f"or [T] map to one Arrow column"
            )
        return _avro_plan(branches[0], namespace, named, defining, path)
    if not isinstance(s, dict):
        raise ValueError(f"{where}: {s!r} is not an Avro schema")
    t = s.get("type")
    if isinstance(t, (dict, list)):
        return _avro_plan(t, namespace, named, defining, path)
    if t in _AVRO_PRIMITIVES:
        return _avro_logical(s, t, where)
    if t in ("record", "error", "enum", "fixed"):
        name = s.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: a {t} needs a name")
        ns = s.get("namespace", namespace) if "." not in name else name.rpartition(".")[0]
        full = _fullname(name, ns or "")
        plan: _Leaf | _StructPlan
        if t == "enum":
            plan = _AvroPlain(pa.string(), str)
        elif t == "fixed":
            if not isinstance(s.get("size"), int) or s["size"] < 1:
                raise ValueError(f"{where}: fixed {full!r} needs a size >= 1")
            plan = _avro_logical(s, "fixed", where)
        else:
            fields = s.get("fields")
            if not isinstance(fields, list) or not fields:
                raise ValueError(f"{where}: record {full!r} has no fields (Parquet cannot store an empty struct)")
            names = [f["name"] for f in fields if isinstance(f, dict) and isinstance(f.get("name"), str) and f["name"]]
            if len(names) != len(fields):
                raise ValueError(f"{where}: record {full!r} has a field without a name")
            _check_names(names, path)
            defining.add(full)
            subs = []
            for f in fields:
                sub_path = f"{path}.{f['name']}" if path else f["name"]
                if "type" not in f:
                    raise ValueError(f"field {sub_path!r}: no type")
                subs.append((f["name"], _avro_plan(f["type"], ns or "", named, defining, sub_path)))
            defining.discard(full)
            struct = pa.struct([pa.field(name, sub.type) for name, sub in subs])
            plan = _StructPlan(struct, tuple(subs))
        named[full] = plan
        return plan
    if t == "array":
        item = _avro_plan(s.get("items"), namespace, named, defining, path + "[]")
        return _ListPlan(pa.list_(pa.field("element", item.type)), item)
    if t == "map":
        item = _avro_plan(s.get("values"), namespace, named, defining, path + "[]")
        return _MapPlan(pa.map_(pa.string(), item.type), _AvroPlain(pa.string(), str), item)
    if isinstance(t, str):
        return _avro_plan(t, namespace, named, defining, path)  # {"type": "com.acme.Name"}
    raise ValueError(f"{where}: {s!r} is not an Avro schema")


def _avro_logical(s: dict, underlying: str, where: str) -> _Leaf:
    logical = s.get("logicalType")
    if underlying == "int" and logical == "date":
        return _AvroDate(pa.date32())
    if underlying == "long" and logical in ("timestamp-millis", "timestamp-micros"):
        return _AvroTimestamp(TIMESTAMP_TYPE, 1000 if logical.endswith("millis") else 1)
    if underlying == "long" and logical in ("local-timestamp-millis", "local-timestamp-micros"):
        return _AvroTimestamp(LOCAL_TIMESTAMP_TYPE, 1000 if logical.endswith("millis") else 1)
    if underlying in ("bytes", "fixed") and logical == "decimal":
        precision, scale = s.get("precision"), s.get("scale", 0)
        if type(precision) is int and type(scale) is int and precision >= 1 and 0 <= scale <= precision:
            if precision > MAX_DECIMAL_PRECISION:
                raise ValueError(f"{where}: decimal precision {precision} > {MAX_DECIMAL_PRECISION} (Spark's maximum)")
            return _AvroDecimal(pa.decimal128(precision, scale))
    if underlying == "fixed":
        return _AvroPlain(pa.binary(), bytes)
    arrow, python = _AVRO_PRIMITIVES[underlying]
    return _AvroPlain(arrow, python)
