"""The C path of Avro values into Arrow columns (``pipeline/_avro.c``, ``pipeline.table.avro_columns``)
against the Python path (fastavro, then the column builder): generated schemas and records, every
value mutated, random bytes, every wire format, registry-framed flushes that mix writers, and the Arrow
shapes a flush comes in. Same typed rows, same dead-letter reasons, always; and the C path is taken."""

from __future__ import annotations

import io
import json
import math
import random
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import native
from pipeline.bench import avro_values
from pipeline.registry.service import SchemaRegistry
from pipeline.registry.store import SchemaStore
from pipeline.table.avro_columns import native_ops
from pipeline.table.values import ValueFormat, _parse_values, avro_to_arrow_schema, parse_values, without_logical_types

SCALARS = ["boolean", "int", "long", "float", "double", "bytes", "string",
           {"type": "int", "logicalType": "date"}, {"type": "long", "logicalType": "timestamp-millis"},
           {"type": "long", "logicalType": "timestamp-micros"}, {"type": "long", "logicalType": "local-timestamp-millis"},
           {"type": "string", "logicalType": "uuid"}, {"type": "int", "logicalType": "time-millis"}]


def _base(t: Any) -> str:
    return t if isinstance(t, str) else t["type"] if isinstance(t["type"], str) else "named"


def _value(t: Any, rng: random.Random) -> Any:
    """A Python value fastavro writes for type ``t`` (logical types as their raw ints), sometimes at the edges."""
    if isinstance(t, list):
        if "null" in t and rng.random() < 0.3:
            return None
        return _value(next(b for b in t if b != "null"), rng)
    base = _base(t)
    if isinstance(t, dict) and t.get("type") == "enum":
        return rng.choice(t["symbols"])
    if isinstance(t, dict) and t.get("type") == "fixed":
        return bytes(rng.randrange(256) for _ in range(t["size"]))
    if base == "boolean":
        return rng.random() < 0.5
    if base == "int":
        return rng.choice([0, -1, 1, 2**31 - 1, -(2**31), rng.randrange(-(2**31), 2**31)])
    if base == "long":
        edge = [0, -1, 2**63 - 1, -(2**63), 2**53 + 1, rng.randrange(-(2**63), 2**63)]
        if isinstance(t, dict) and t.get("logicalType", "").endswith("millis"):
            edge += [2**63 // 1000, -(2**63) // 1000 - 1, rng.randrange(-(2**40), 2**40)]  # the edges of us
        return rng.choice(edge)
    if base in ("float", "double"):
        return rng.choice([0.0, -0.0, 1.5, math.inf, -math.inf, rng.uniform(-1e30, 1e30), 3.4e38])
    if base == "bytes":
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 9)))
    if base == "string":
        return rng.choice(["", "a", "naïve", "日本", "🎉x", "z" * rng.randrange(0, 70)])
    raise AssertionError(t)


def _schema(draw: st.DrawFn) -> dict:
    fields = []
    named: list[dict] = []
    for i in range(draw(st.integers(1, 8))):
        choice = draw(st.integers(0, len(SCALARS) + 1))
        if choice < len(SCALARS):
            t: Any = SCALARS[choice]
        elif choice == len(SCALARS):
            t = {"type": "enum", "name": f"E{i}", "symbols": draw(st.lists(st.sampled_from(
                ["RED", "GREEN", "BLUE", "X", "Y_1"]), min_size=1, max_size=5, unique=True))}
            named.append(t)
        else:
            t = {"type": "fixed", "name": f"F{i}", "size": draw(st.integers(1, 17))}
            named.append(t)
        union = draw(st.sampled_from(["plain", "null-first", "null-last", "single"]))
        if union == "null-first":
            t = ["null", t]
        elif union == "null-last":
            t = [t, "null"]
        elif union == "single":
            t = [t]
        fields.append({"name": f"f{i}", "type": t})
    return {"type": "record", "name": "R", "namespace": "test.gen", "fields": fields}


@st.composite
def schemas_and_values(draw: st.DrawFn) -> tuple[dict, list[bytes | None]]:
    schema = _schema(draw)
    rng = random.Random(draw(st.integers(0, 2**32)))
    writer = fastavro.parse_schema(without_logical_types(schema))  # raw logical values, as read
    values: list[bytes | None] = []
    for _ in range(draw(st.integers(1, 30))):
        if rng.random() < 0.05:
            values.append(None)
            continue
        out = io.BytesIO()
        fastavro.schemaless_writer(out, writer, {f["name"]: _value(f["type"], rng) for f in schema["fields"]})
        values.append(out.getvalue())
    return schema, values


def _comparable(table: pa.Table) -> list[dict]:
    """Rows with dates and timestamps as their ints (Python's datetime stops at year 9999) and NaN
    spelled out (NaN != NaN; a NaN's payload bits are not compared)."""
    storage = {pa.types.is_timestamp: pa.int64(), pa.types.is_date32: pa.int32()}
    columns = []
    for column in table.columns:
        to = next((t for test, t in storage.items() if test(column.type)), None)
        columns.append(column.cast(to) if to is not None else column)
    plain = pa.Table.from_arrays(columns, names=table.column_names)
    return [{k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
            for row in plain.to_pylist()]


def both_paths(values: pa.Array | pa.ChunkedArray, fmt: ValueFormat, headers: pa.Array | None = None,
               ) -> tuple[pa.Table, list[str | None]]:
    """``parse_values`` (C where it can) and the Python path alone on the same values: the same."""
    native.reset_counts()
    typed, errors = parse_values(values, fmt, headers)
    slow, slow_errors = _parse_values(values, fmt, headers)
    assert typed.schema == slow.schema == fmt.schema
    assert _comparable(typed) == _comparable(slow)
    assert errors.to_pylist() == slow_errors.to_pylist()
    return typed, errors.to_pylist()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schemas_and_values())
def test_generated_schemas_and_records_read_as_the_python_path(case):
    schema, values = case
    fmt = ValueFormat.for_avro(schema, wire_format="none")
    assert fmt._native_ops is not None  # every generated schema has a C plan
    _, errors = both_paths(pa.array(values, pa.binary()), fmt)
    decoded = sum(v is not None and e is None for v, e in zip(values, errors, strict=True))
    assert native.AVRO_COLUMNS.native >= decoded - sum(e is not None for e in errors)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schemas_and_values(), st.data())
def test_every_value_mutated_reads_as_the_python_path(case, data):
    schema, values = case
    mutated: list[bytes | None] = []
    for v in values:
        if v is None:
            mutated.append(None)
            continue
        b = bytearray(v)
        how = data.draw(st.sampled_from(["flip", "cut", "append", "insert", "same"]))
        at = data.draw(st.integers(0, max(len(b) - 1, 0)))
        if how == "flip" and b:
            b[at] ^= data.draw(st.integers(1, 255))
        elif how == "cut":
            del b[at:]
        elif how == "append":
            b += data.draw(st.binary(min_size=1, max_size=4))
        elif how == "insert":
            b[at:at] = data.draw(st.binary(min_size=1, max_size=3))
        mutated.append(bytes(b))
    both_paths(pa.array(mutated, pa.binary()), ValueFormat.for_avro(schema, wire_format="none"))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=60)), min_size=1, max_size=40),
       st.sampled_from(["auto", "confluent", "none"]))
def test_random_bytes_read_as_the_python_path(values, wire):
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "a", "type": ["null", "string"]}, {"name": "b", "type": "long"},
        {"name": "c", "type": {"type": "enum", "name": "E", "symbols": ["X", "Y"]}}, {"name": "d", "type": "boolean"},
        {"name": "e", "type": {"type": "long", "logicalType": "timestamp-millis"}}, {"name": "f", "type": "int"}]}
    both_paths(pa.array(values, pa.binary()), ValueFormat.for_avro(schema, wire_format=wire))


def _page_views(n: int, seed: int = 3) -> list[bytes]:
    rng = random.Random(seed)
    writer = fastavro.parse_schema(avro_values.AVRO_SCHEMA)
    out = []
    for _ in range(n):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, writer, avro_values.sample_record(rng))
        out.append(buf.getvalue())
    return out


@pytest.mark.parametrize("wire", ["auto", "confluent", "none"])
def test_each_wire_format_strips_or_requires_the_header_as_the_python_path(wire):
    plain = _page_views(4)
    framed = [b"\x00\x00\x00\x00\x07" + v for v in plain]
    values = pa.array([*plain, *framed, None, b"\x00\x00\x00"], pa.binary())
    _, errors = both_paths(values, ValueFormat.for_avro(avro_values.AVRO_SCHEMA, wire_format=wire))
    if wire == "confluent":  # the headerless ones are errors, the framed ones read
        assert all(e is not None for e in errors[:4]) and errors[4:9] == [None] * 5
    elif wire == "none":  # the framed ones have 5 bytes the record does not: errors
        assert errors[:4] == [None] * 4 and all(e is not None for e in errors[4:8])


def test_the_fast_path_reads_every_value_of_the_bench_records_and_a_table_of_some_columns():
    values = pa.array(_page_views(50), pa.binary())
    native.reset_counts()
    fmt = ValueFormat.for_avro(avro_values.AVRO_SCHEMA, wire_format="none")
    typed, errors = parse_values(values, fmt)
    assert native.counts()["avro columns"] == (50, 0)  # no value left the C path
    assert errors.null_count == 50
    columns = avro_to_arrow_schema(avro_values.AVRO_SCHEMA)
    some = pa.schema([columns.field("payload"), columns.field("quantity"), columns.field("event_time")])
    part = ValueFormat("avro", some, avro_values.AVRO_SCHEMA, "none")
    sub, _ = both_paths(values, part)
    assert sub.to_pylist() == typed.select(["payload", "quantity", "event_time"]).to_pylist()


def test_chunked_sliced_and_large_binary_arrays_read_as_the_python_path():
    raw = [*_page_views(9), None]
    fmt = ValueFormat.for_avro(avro_values.AVRO_SCHEMA, wire_format="none")
    whole, _ = both_paths(pa.array(raw, pa.binary()), fmt)
    for values in (pa.chunked_array([pa.array(raw[:4], pa.binary()), pa.array(raw[4:], pa.binary())]),
                   pa.array(raw, pa.large_binary())):
        typed, _ = both_paths(values, fmt)
        assert typed.to_pylist() == whole.to_pylist()
    sliced, _ = both_paths(pa.array(raw, pa.binary()).slice(3, 5), fmt)
    assert sliced.to_pylist() == whole.slice(3, 5).to_pylist()


@pytest.mark.parametrize("field_type", [
    {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}]},
    {"type": "array", "items": "int"},
    {"type": "map", "values": "string"},
    {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
    ["null", "string", "long"],
])
def test_a_schema_the_c_path_does_not_read_has_no_plan_and_reads_in_python(field_type):
    schema = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": field_type}]}
    if isinstance(field_type, list):  # a multi-type union has no Arrow column either
        with pytest.raises(ValueError, match="union"):
            ValueFormat.for_avro(schema)
        return
    fmt = ValueFormat.for_avro(schema)
    assert fmt._native_ops is None
    assert native_ops(fmt.avro_schema, avro_to_arrow_schema(schema)) is None


V1 = {"type": "record", "name": "User", "namespace": "shop", "fields": [{"name": "name", "type": "string"}]}
V2 = {"type": "record", "name": "User", "namespace": "shop",
      "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int", "default": -1}]}


def test_a_registry_flush_reads_the_tables_own_writer_in_c_and_every_other_in_python(tmp_path):
    """Values of the table's own schema (by id) go through C; an older writer's (resolved), an id the
    registry lacks, and a value whose ``__value_schema_id`` header names its schema go to Python; the
    rows and reasons are the Python path's, in their places."""
    store = SchemaStore(str(tmp_path / "registry.db"))
    try:
        registry = SchemaRegistry(store)
        v1, v2 = (registry.register("users-value", {"schema": json.dumps(s)})["id"] for s in (V1, V2))

        def framed(schema_id: int, schema: dict, record: dict) -> bytes:
            out = io.BytesIO()
            fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
            return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()

        own = [framed(v2, V2, {"name": f"u{i}", "age": i}) for i in range(5)]
        values = pa.array([own[0], framed(v1, V1, {"name": "old"}), own[1], framed(999, V2, {"name": "x", "age": 1}),
                           own[2], own[3], own[4], None], pa.binary())
        header = [{"key": "__value_schema_id", "value": b"\x00" + v2.to_bytes(4, "big")}]
        trace = [{"key": "traceparent", "value": b"00-abc"}]
        from pipeline.table.schema import HEADERS_ARROW_TYPE

        headers = pa.array([None, None, trace, None, None, header, None, None], HEADERS_ARROW_TYPE)
        fmt = ValueFormat.for_avro(V2, registry=str(tmp_path / "registry.db"))
        typed, errors = both_paths(values, fmt, headers)
        native.reset_counts()
        parse_values(values, fmt, headers)
        # own[0..4] by id, except own[3], whose header names the schema (read as all payload: an error
        # here, since its value still has the prefix); the v1 value, id 999: Python
        assert native.counts()["avro columns"] == (5, 3)  # the tombstone counts as C's
        assert typed.column("name").to_pylist()[:3] == ["u0", "old", "u1"]
        assert typed.column("age").to_pylist()[:3] == [0, -1, 1]
        assert "schema id 999 is not in the schema registry" in errors[3]
    finally:
        store.close()
