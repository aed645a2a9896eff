"""pipeline.table.values: JSON and Avro record values into typed Arrow columns.

Pure unit tests (no Spark, no network): bytes in, a typed table and an error
column out.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import pickle
import time
from decimal import Decimal

import fastavro
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.table.values import (
    TIMESTAMP_TYPE,
    ValueFormat,
    avro_to_arrow_schema,
    parse_values,
    split_wire_format,
    wire_schema_ids,
)

UTC = dt.timezone.utc


def binary(values: list[bytes | None]) -> pa.Array:
    return pa.array(values, pa.binary())


def js(obj: object) -> bytes:
    return json.dumps(obj).encode()


def wire(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


def assert_all_null(row: dict) -> None:
    assert all(v is None for v in row.values()), row


# ---------------------------------------------------------------- json

ORDERS = pa.schema(
    [
        ("id", pa.int64()),
        ("qty", pa.int32()),
        ("price", pa.decimal128(10, 2)),
        ("item", pa.string()),
        ("at", TIMESTAMP_TYPE),
        ("day", pa.date32()),
        ("paid", pa.bool_()),
        ("weight", pa.float64()),
        ("tags", pa.list_(pa.field("element", pa.string()))),
        ("ship", pa.struct([("zip", pa.string()), ("floor", pa.int8())])),
        ("attrs", pa.map_(pa.string(), pa.int64())),
    ]
)
ORDERS_JSON = ValueFormat("json", ORDERS)


def good_order(i: int) -> dict:
    return {
        "id": i,
        "qty": i * 2,
        "price": "12.34",
        "item": f"item-{i}",
        "at": "2024-03-01T10:00:00.5+01:00",
        "day": "2024-02-29",
        "paid": i % 2 == 0,
        "weight": 1.25,
        "tags": ["a", "b"],
        "ship": {"zip": "1000", "floor": 3},
        "attrs": {"x": 1},
        "ignored": {"extra": [1, 2, 3]},
    }


def test_json_good_and_bad_in_one_batch():
    bad = [
        b'{"id": 1,, "qty": 2}',  # malformed text
        b"[1, 2, 3]",  # not an object
        js({"id": 3, "qty": "7"}),  # wrong type
        js({"id": 4, "qty": 3_000_000_000}),  # out of range for int32
        js({"id": 5, "at": "yesterday"}),  # not a timestamp
    ]
    values = [js(good_order(0)), bad[0], js(good_order(1)), bad[1], bad[2], js(good_order(2)), bad[3], bad[4]]
    typed, errors = parse_values(binary(values), ORDERS_JSON)

    assert typed.schema == ORDERS
    assert typed.num_rows == len(values) == len(errors)
    errs = errors.to_pylist()
    assert errs[0] is errs[2] is errs[5] is None
    assert errs[1] == "invalid JSON at char 9: Expecting property name enclosed in double quotes"
    assert errs[3] == "expected a JSON object, got array"
    assert errs[4] == "field 'qty': expected int32, got string \"7\""
    assert errs[6] == "field 'qty': number 3000000000 out of range for int32"
    assert errs[7] == "field 'at': string \"yesterday\" is not an ISO-8601 timestamp"

    rows = typed.to_pylist()
    for i in (1, 3, 4, 6, 7):
        assert_all_null(rows[i])  # the whole record, also the fields that were fine ("id")
    assert rows[0] == {
        "id": 0,
        "qty": 0,
        "price": Decimal("12.34"),
        "item": "item-0",
        "at": dt.datetime(2024, 3, 1, 9, 0, 0, 500000, tzinfo=UTC),
        "day": dt.date(2024, 2, 29),
        "paid": True,
        "weight": 1.25,
        "tags": ["a", "b"],
        "ship": {"zip": "1000", "floor": 3},
        "attrs": [("x", 1)],
    }
    assert [r["id"] for r in (rows[2], rows[5])] == [1, 2]


def test_json_tombstone_is_a_null_row_not_an_error():
    typed, errors = parse_values(binary([None, js({"id": 1}), None]), ORDERS_JSON)
    assert errors.to_pylist() == [None, None, None]
    rows = typed.to_pylist()
    assert_all_null(rows[0])
    assert_all_null(rows[2])
    assert rows[1]["id"] == 1 and rows[1]["qty"] is None  # missing fields are null


def test_json_empty_batch_and_input_types():
    typed, errors = parse_values(pa.array([], pa.binary()), ORDERS_JSON)
    assert typed.schema == ORDERS and typed.num_rows == 0 and len(errors) == 0
    chunked = pa.chunked_array([[js({"id": 1})], [js({"id": 2})]], pa.large_binary())
    typed, errors = parse_values(chunked, ORDERS_JSON)
    assert typed.column("id").to_pylist() == [1, 2] and errors.null_count == 2
    with pytest.raises(TypeError, match="binary"):
        parse_values(pa.array(["{}"]), ORDERS_JSON)


def one(schema_type: pa.DataType, value: object, raw: bytes | None = None) -> tuple[object, str | None]:
    """Parse {"v": value} against a one-column schema; (the value, the error)."""
    fmt = ValueFormat("json", pa.schema([("v", schema_type)]))
    typed, errors = parse_values(binary([raw if raw is not None else js({"v": value})]), fmt)
    return typed.column("v")[0].as_py(), errors[0].as_py()


@pytest.mark.parametrize(
    "schema_type, value, expected",
    [
        (pa.bool_(), False, False),
        (pa.int8(), -128, -128),
        (pa.int16(), 32767, 32767),
        (pa.int64(), -(2**63), -(2**63)),
        (pa.float32(), 3, 3.0),
        (pa.float64(), "-Infinity", float("-inf")),
        (pa.float64(), "+INF", float("inf")),
        (pa.string(), "héllo", "héllo"),
        # Spark from_json keeps any other JSON value of a string field as its JSON text
        (pa.string(), {"a": [1, True, None]}, '{"a":[1,true,null]}'),
        (pa.string(), 12, "12"),
        (pa.binary(), base64.b64encode(b"\x00\xff").decode(), b"\x00\xff"),
        (pa.date32(), "0001-01-01", dt.date(1, 1, 1)),
        (TIMESTAMP_TYPE, "2024-01-01T00:00:00Z", dt.datetime(2024, 1, 1, tzinfo=UTC)),
        (TIMESTAMP_TYPE, "2024-01-01 05:30:00+05:30", dt.datetime(2024, 1, 1, tzinfo=UTC)),
        (TIMESTAMP_TYPE, "2024-01-01T01:02:03-0100", dt.datetime(2024, 1, 1, 2, 2, 3, tzinfo=UTC)),
        (TIMESTAMP_TYPE, "2024-01-01T01:02:03.123456789Z", dt.datetime(2024, 1, 1, 1, 2, 3, 123456, tzinfo=UTC)),
        (TIMESTAMP_TYPE, "2024-01-01T01:02", dt.datetime(2024, 1, 1, 1, 2, tzinfo=UTC)),  # no offset: UTC
        (TIMESTAMP_TYPE, "2024-01-01", dt.datetime(2024, 1, 1, tzinfo=UTC)),
        (TIMESTAMP_TYPE, 1_700_000_000, dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),  # seconds, as Spark
        (pa.decimal128(5, 2), "1.005", Decimal("1.01")),  # HALF_UP, as Spark's Decimal.set
        (pa.decimal128(5, 2), "-1.005", Decimal("-1.01")),
        (pa.decimal128(6, 2), "1,234.5", Decimal("1234.50")),  # Spark's decimal parser drops commas
        (pa.decimal128(5, 2), 7, Decimal("7.00")),
        (pa.decimal128(5, 2), "1e2", Decimal("100.00")),
        (pa.list_(pa.int32()), [1, None, 3], [1, None, 3]),
        (pa.map_(pa.string(), pa.string()), {"b": "1", "a": None}, [("b", "1"), ("a", None)]),
        (pa.struct([("a", pa.int32())]), {}, {"a": None}),
        (pa.struct([("a", pa.int32())]), None, None),
    ],
)
def test_json_accepts(schema_type, value, expected):
    assert one(schema_type, value) == (expected, None)


def test_json_exact_numbers_for_decimals():
    # 20 significant digits: exact only because a decimal column switches on Decimal parsing.
    raw = b'{"v": 123456789012345678.91, "f": 0.1}'
    fmt = ValueFormat("json", pa.schema([("v", pa.decimal128(20, 2)), ("f", pa.float64())]))
    typed, errors = parse_values(binary([raw]), fmt)
    assert errors[0].as_py() is None
    assert typed.to_pylist() == [{"v": Decimal("123456789012345678.91"), "f": 0.1}]
    rounds_over = one(pa.decimal128(5, 2), None, b'{"v": 999.995}')
    assert rounds_over == (None, "field 'v': number 999.995 does not fit decimal(5, 2)")


@pytest.mark.parametrize(
    "schema_type, value, message",
    [
        (pa.int32(), True, "expected int32, got boolean true"),
        (pa.int64(), 1.0, "expected int64, got number 1.0"),  # Spark: a float token never fits an integer
        (pa.int64(), 1.5, "expected int64, got number 1.5"),
        (pa.int64(), "1", 'expected int64, got string "1"'),
        (pa.int8(), 128, "number 128 out of range for int8"),
        (pa.int64(), 2**63, f"number {2**63} out of range for int64"),
        (pa.float64(), True, "expected double, got boolean true"),
        (pa.float64(), "1.5", 'expected double, got string "1.5"'),
        (pa.bool_(), 1, "expected bool, got number 1"),
        (pa.bool_(), "true", 'expected bool, got string "true"'),
        (pa.binary(), "not base64!", 'string "not base64!" is not base64'),
        (pa.binary(), 5, "expected binary, got number 5"),
        (pa.date32(), "2023-02-29", 'string "2023-02-29" is not a valid date'),
        (pa.date32(), "2024-1-1", 'string "2024-1-1" is not an ISO-8601 date (YYYY-MM-DD)'),
        (pa.date32(), 19000, "expected date32[day], got number 19000"),
        (TIMESTAMP_TYPE, "2024-13-01T00:00:00Z", 'string "2024-13-01T00:00:00Z" is not an ISO-8601 timestamp'),
        (TIMESTAMP_TYPE, "2024-01-01T24:00:00Z", 'string "2024-01-01T24:00:00Z" is not an ISO-8601 timestamp'),
        (TIMESTAMP_TYPE, "01/02/2024 10:00", 'string "01/02/2024 10:00" is not an ISO-8601 timestamp'),
        (TIMESTAMP_TYPE, 1.5, "expected timestamp[us, tz=UTC], got number 1.5"),
        (TIMESTAMP_TYPE, 10**13, "number 10000000000000 seconds since the epoch is out of range"),
        (pa.decimal128(5, 2), "12345", 'string "12345" does not fit decimal(5, 2)'),
        (pa.decimal128(5, 2), "1_000", 'string "1_000" is not a decimal number'),
        (pa.decimal128(5, 2), "NaN", 'string "NaN" is not a decimal number'),
        (pa.decimal128(5, 2), True, "expected decimal128(5, 2), got boolean true"),
        (pa.list_(pa.string()), "ab", 'expected array, got string "ab"'),
        (pa.list_(pa.int32()), {"a": 1}, "expected array, got object"),
        (pa.struct([("a", pa.int32())]), [1], "expected object, got array"),
        (pa.map_(pa.string(), pa.int32()), [["k", 1]], "expected object, got array"),
    ],
)
def test_json_rejects(schema_type, value, message):
    assert one(schema_type, value) == (None, f"field 'v': {message}")


def test_json_nested_errors_name_the_path():
    schema = pa.schema(
        [
            ("items", pa.list_(pa.struct([("sku", pa.string()), ("qty", pa.int32())]))),
            ("prices", pa.map_(pa.string(), pa.list_(pa.float64()))),
        ]
    )
    fmt = ValueFormat("json", schema)
    values = [
        js({"items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": "two"}]}),
        js({"items": [], "prices": {"eur": [1.5, 2], "usd": [1, "x"]}}),
        js({"items": [None, {"qty": 5}], "prices": {}}),
    ]
    typed, errors = parse_values(binary(values), fmt)
    assert errors.to_pylist() == [
        "field 'items[1].qty': expected int32, got string \"two\"",
        "field 'prices[\"usd\"][1]': expected double, got string \"x\"",
        None,
    ]
    assert typed.to_pylist()[2] == {"items": [None, {"sku": None, "qty": 5}], "prices": []}


def test_json_value_level_errors():
    schema = pa.schema([("s", pa.string())])
    fmt = ValueFormat("json", schema)
    bom = b"\xef\xbb\xbf"
    values = [b"\xff{}", b"null", b"42", b"", b"[" * 100_000, b"1" * 5000, bom + b'{"s": "x"}', b'{"s": "\\ud800"}']
    typed, errors = parse_values(binary(values), fmt)
    errs = errors.to_pylist()
    assert errs[0] == "invalid UTF-8 at byte 0: invalid start byte"
    assert errs[1] == "expected a JSON object, got null"
    assert errs[2] == "expected a JSON object, got number 42"
    assert errs[3] == "invalid JSON at char 0: Expecting value"
    assert errs[4] == "invalid JSON: nested too deeply"
    assert errs[5].startswith("invalid JSON: Exceeds the limit (4300 digits)")
    assert errs[6].startswith("invalid JSON at char 0: Unexpected UTF-8 BOM")
    assert errs[7] == "field 's': string is not valid Unicode (lone surrogate escape)"
    assert typed.column("s").null_count == len(values)


def test_json_wire_format_header_is_stripped():
    schema = pa.schema([("id", pa.int64())])
    values = [wire(42, js({"id": 1})), js({"id": 2}), None, wire(7, b"{oops")]
    typed, errors = parse_values(binary(values), ValueFormat("json", schema))
    assert typed.column("id").to_pylist() == [1, 2, None, None]
    assert errors.to_pylist()[:3] == [None, None, None]
    assert errors[3].as_py() == "invalid JSON at char 1: Expecting property name enclosed in double quotes"
    assert wire_schema_ids(binary(values)).to_pylist() == [42, None, None, 7]
    assert wire_schema_ids(binary(values), "none").to_pylist() == [None] * 4
    assert split_wire_format(wire(2**31 + 1, b"x")) == (-(2**31) + 1, b"x")  # signed, as Java reads it
    assert split_wire_format(b"\x00abc") == (None, b"\x00abc")  # shorter than a header

    typed, errors = parse_values(binary(values), ValueFormat("json", schema, wire_format="confluent"))
    assert typed.column("id").to_pylist() == [1, None, None, None]
    assert errors[1].as_py() == "no Schema Registry header (magic byte 0 + 4-byte schema id)"

    typed, errors = parse_values(binary(values[:1]), ValueFormat("json", schema, wire_format="none"))
    assert errors[0].as_py().startswith("invalid JSON at char 0")


@pytest.mark.parametrize(
    "schema, message",
    [
        (pa.schema([("a", pa.large_string())]), "field 'a': large_string is not supported"),
        (pa.schema([("a", pa.uint8())]), "field 'a': uint8 is not supported"),
        (pa.schema([("a", pa.timestamp("ms", tz="UTC"))]), r"field 'a': timestamp\[ms, tz=UTC\] is not supported"),
        (pa.schema([("a", pa.struct([("b", pa.time64("us"))]))]), "field 'a.b': time64"),
        (pa.schema([("a", pa.list_(pa.float16()))]), r"field 'a\[\]': halffloat"),
        (pa.schema([("a", pa.map_(pa.int32(), pa.int32()))]), "JSON object keys are strings"),
        (pa.schema([pa.field("a", pa.int32(), nullable=False)]), "field 'a': NOT NULL is not supported"),
        (pa.schema([("a", pa.int32()), ("a", pa.string())]), "field 'a' appears twice at the top level"),
        (pa.schema([("a", pa.struct([]))]), "a struct needs at least one field"),
    ],
)
def test_json_format_rejects_unsupported_schemas(schema, message):
    with pytest.raises(ValueError, match=message):
        ValueFormat("json", schema)


def test_value_format_validation_and_pickling():
    with pytest.raises(ValueError, match="kind must be"):
        ValueFormat("xml", ORDERS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wire_format"):
        ValueFormat("json", ORDERS, wire_format="magic")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only for kind 'avro'"):
        ValueFormat("json", ORDERS, avro_schema=AVRO_ORDER)
    with pytest.raises(ValueError, match="needs avro_schema"):
        ValueFormat("avro", ORDERS)
    # pickled to the decode worker: equal, hashable, and it still decodes
    copy = pickle.loads(pickle.dumps(ORDERS_JSON))
    assert copy == ORDERS_JSON and hash(copy) == hash(ORDERS_JSON)
    assert parse_values(binary([js({"id": 9})]), copy)[0].column("id").to_pylist() == [9]
    avro = ValueFormat.for_avro(AVRO_ORDER)
    avro_copy = pickle.loads(pickle.dumps(avro))
    assert avro_copy == avro and hash(avro_copy) == hash(avro)
    value = avro_bytes(AVRO_ORDER, AVRO_GOOD)
    assert parse_values(binary([value]), avro_copy)[1].to_pylist() == [None]


def test_large_batch():
    values = [js(good_order(i)) for i in range(100_000)]
    values[500] = b"{broken"
    values[70_000] = js({"id": 1, "qty": 1.5})
    start = time.perf_counter()
    typed, errors = parse_values(binary(values), ORDERS_JSON)
    elapsed = time.perf_counter() - start
    print(f"\n100k JSON values in {elapsed:.2f} s")
    assert errors.null_count == 100_000 - 2
    assert typed.column("id").null_count == 2
    assert typed.column("id")[99_999].as_py() == 99_999


# ---------------------------------------------------------------- avro

AVRO_ADDRESS = {
    "type": "record",
    "name": "Address",
    "fields": [
        {"name": "zip", "type": "string"},
        {"name": "floor", "type": ["null", "int"], "default": None},
    ],
}

AVRO_ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "com.acme",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "qty", "type": "int"},
        {"name": "paid", "type": "boolean"},
        {"name": "ratio", "type": "float"},
        {"name": "weight", "type": "double"},
        {"name": "item", "type": "string"},
        {"name": "blob", "type": "bytes"},
        {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}},
        {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {"name": "note", "type": ["null", "string"]},
        {"name": "rank", "type": ["long", "null"]},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": ["null", "double"]}},
        {"name": "ship", "type": AVRO_ADDRESS},
        {"name": "bill", "type": ["null", "Address"]},  # a named type used again
        {"name": "history", "type": {"type": "array", "items": "com.acme.Address"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {
            "name": "big",
            "type": {"type": "fixed", "name": "Big", "size": 16, "logicalType": "decimal", "precision": 38, "scale": 4},
        },
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "elapsed", "type": {"type": "long", "logicalType": "time-micros"}},
    ],
}

AVRO_GOOD = {
    "id": 1,
    "qty": -7,
    "paid": True,
    "ratio": 0.5,
    "weight": 2.25,
    "item": "héllo",
    "blob": b"\x00\x01",
    "digest": b"abcd",
    "color": "GREEN",
    "note": None,
    "rank": 3,
    "tags": ["a", "b"],
    "attrs": {"x": 1.5, "y": None},
    "ship": {"zip": "1000", "floor": 2},
    "bill": None,
    "history": [{"zip": "2000", "floor": None}],
    "day": dt.date(1969, 12, 31),
    "at_ms": dt.datetime(2024, 1, 1, 1, 2, 3, 456000, tzinfo=UTC),
    "at_us": dt.datetime(1900, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
    "local": dt.datetime(2024, 1, 1, 12, 0),
    "price": Decimal("-12.34"),
    "big": Decimal("12345678901234567890123456789012.3456"),
    "uid": "12345678-1234-5678-1234-567812345678",
    "elapsed": 5_000_000,
}


def avro_bytes(schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def record(*fields: dict, name: str = "R") -> dict:
    return {"type": "record", "name": name, "fields": list(fields)}


def test_avro_to_arrow_schema_maps_every_type():
    address = pa.struct([("zip", pa.string()), ("floor", pa.int32())])
    assert avro_to_arrow_schema(AVRO_ORDER) == pa.schema(
        [
            ("id", pa.int64()),
            ("qty", pa.int32()),
            ("paid", pa.bool_()),
            ("ratio", pa.float32()),
            ("weight", pa.float64()),
            ("item", pa.string()),
            ("blob", pa.binary()),
            ("digest", pa.binary()),
            ("color", pa.string()),
            ("note", pa.string()),
            ("rank", pa.int64()),
            ("tags", pa.list_(pa.field("element", pa.string()))),
            ("attrs", pa.map_(pa.string(), pa.float64())),
            ("ship", address),
            ("bill", address),
            ("history", pa.list_(pa.field("element", address))),
            ("day", pa.date32()),
            ("at_ms", TIMESTAMP_TYPE),
            ("at_us", TIMESTAMP_TYPE),
            ("local", pa.timestamp("us")),
            ("price", pa.decimal128(10, 2)),
            ("big", pa.decimal128(38, 4)),
            ("uid", pa.string()),
            ("elapsed", pa.int64()),  # time-micros: no Spark type, the underlying long
        ]
    )
    assert avro_to_arrow_schema(json.dumps(AVRO_ADDRESS)) == pa.schema([("zip", pa.string()), ("floor", pa.int32())])


def test_avro_round_trip_of_every_type():
    fmt = ValueFormat.for_avro(AVRO_ORDER)
    other = dict(AVRO_GOOD, id=2, note="n", rank=None, tags=[], attrs={}, bill={"zip": "3", "floor": None})
    values = [avro_bytes(AVRO_ORDER, AVRO_GOOD), None, avro_bytes(AVRO_ORDER, other)]
    typed, errors = parse_values(binary(values), fmt)
    assert errors.to_pylist() == [None, None, None]
    rows = typed.to_pylist()
    expected = dict(AVRO_GOOD, attrs=[("x", 1.5), ("y", None)])
    assert rows[0] == expected
    assert_all_null(rows[1])
    assert rows[2] == dict(other, attrs=[])
    # the columns are exactly what Spark gets: a tz-aware instant in microseconds
    assert typed.column("at_ms").cast(pa.int64())[0].as_py() == 1704070923456000


def test_avro_bad_values_do_not_affect_neighbours():
    fmt = ValueFormat.for_avro(AVRO_ORDER)
    good = avro_bytes(AVRO_ORDER, AVRO_GOOD)
    values = [good, good[:-1], good, b"\x01\x02\x03", good + b"\x00\x00", b"", good[:10], good]
    typed, errors = parse_values(binary(values), fmt)
    errs = errors.to_pylist()
    assert [e is None for e in errs] == [True, False, True, False, False, False, False, True]
    assert all(e.startswith("Avro decode failed: ") for e in errs if e is not None)
    assert errs[4] == f"Avro decode failed: 2 trailing bytes after the record (payload {len(good) + 2} bytes)"
    rows = typed.to_pylist()
    for i, e in enumerate(errs):
        if e is None:
            assert rows[i]["id"] == 1 and rows[i]["big"] == AVRO_GOOD["big"]
        else:
            assert_all_null(rows[i])


def test_avro_values_outside_the_arrow_type_are_errors():
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2}},
        ],
    }
    raw = record({"name": "at", "type": "long"}, {"name": "price", "type": "bytes"})
    fmt = ValueFormat.for_avro(schema)
    values = [
        avro_bytes(raw, {"at": 2**62, "price": (123).to_bytes(1, "big")}),  # ms beyond int64 microseconds
        avro_bytes(raw, {"at": 0, "price": (12345).to_bytes(2, "big")}),  # 5 digits in decimal(4, 2)
        avro_bytes(raw, {"at": -1, "price": (-9999).to_bytes(2, "big", signed=True)}),
    ]
    typed, errors = parse_values(binary(values), fmt)
    assert errors.to_pylist() == [
        f"field 'at': timestamp {2**62} out of range for timestamp[us, tz=UTC]",
        "field 'price': unscaled value 12345 has more than 4 digits",
        None,
    ]
    just_before_1970 = dt.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
    assert typed.to_pylist()[2] == {"at": just_before_1970, "price": Decimal("-99.99")}


def test_avro_wire_format():
    fmt = ValueFormat.for_avro(AVRO_ADDRESS)
    payload = avro_bytes(AVRO_ADDRESS, {"zip": "z", "floor": 1})
    values = [wire(12, payload), payload, wire(13, payload[:-1])]
    typed, errors = parse_values(binary(values), fmt)
    assert typed.column("zip").to_pylist() == ["z", "z", None]
    assert errors[0].as_py() is None and errors[1].as_py() is None
    assert errors[2].as_py().startswith("Avro decode failed")
    assert wire_schema_ids(binary(values)).to_pylist() == [12, None, 13]

    # A headerless record may start with 0x00 (here: the empty string ""):
    # "auto" would take 5 bytes for a header, "none" reads it whole.
    starts_with_zero = avro_bytes(AVRO_ADDRESS, {"zip": "", "floor": 123456})
    assert starts_with_zero[0] == 0 and len(starts_with_zero) >= 5
    typed, errors = parse_values(binary([starts_with_zero]), ValueFormat.for_avro(AVRO_ADDRESS, wire_format="none"))
    assert typed.to_pylist() == [{"zip": "", "floor": 123456}] and errors[0].as_py() is None
    typed, errors = parse_values(binary([payload]), ValueFormat.for_avro(AVRO_ADDRESS, wire_format="confluent"))
    assert errors[0].as_py() == "no Schema Registry header (magic byte 0 + 4-byte schema id)"


def test_avro_format_with_a_subset_of_columns():
    fmt = ValueFormat("avro", pa.schema([("item", pa.string()), ("id", pa.int64())]), AVRO_ORDER)
    typed, errors = parse_values(binary([avro_bytes(AVRO_ORDER, AVRO_GOOD)]), fmt)
    assert typed.to_pylist() == [{"item": "héllo", "id": 1}] and errors[0].as_py() is None
    with pytest.raises(ValueError, match="field 'id': schema says int32"):
        ValueFormat("avro", pa.schema([("id", pa.int32())]), AVRO_ORDER)
    with pytest.raises(ValueError, match="field 'nope': not a field"):
        ValueFormat("avro", pa.schema([("nope", pa.int32())]), AVRO_ORDER)


@pytest.mark.parametrize(
    "schema, message",
    [
        ({"type": "array", "items": "int"}, "the top level of an Avro value schema must be a record"),
        ("not json", "avro_schema is not JSON"),
        (
            record({"name": "u", "type": ["int", "string"]}),
            r"field 'u': union \[\"int\", \"string\"\] is not supported",
        ),
        (
            record({"name": "ship", "type": record({"name": "kind", "type": ["null", "int", "string"]}, name="S")}),
            "field 'ship.kind': union",
        ),
        (record({"name": "xs", "type": {"type": "array", "items": ["long", "double"]}}), r"field 'xs\[\]': union"),
        (record({"name": "n", "type": "null"}), "field 'n': a bare 'null' type"),
        (record({"name": "next", "type": ["null", "R"]}), "field 'next': recursive type 'R'"),
        (record({"name": "e", "type": record(name="E")}), "field 'e': record 'E' has no fields"),
        (record({"name": "f", "type": {"type": "fixed", "name": "F", "size": 0}}), "field 'f': fixed 'F' needs a size"),
        (
            record({"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 39}}),
            "field 'd': decimal precision 39 > 38",
        ),
        (record({"name": "x", "type": "Nope"}), "field 'x': unknown Avro type 'Nope'"),
        (record({"name": "a", "type": "int"}, {"name": "a", "type": "int"}), "field 'a' appears twice"),
    ],
)
def test_avro_to_arrow_schema_errors_name_the_field(schema, message):
    with pytest.raises(ValueError, match=message):
        avro_to_arrow_schema(schema)


def test_avro_invalid_logical_types_fall_back_to_the_underlying_type():
    schema = record(
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 2, "scale": 3}},
        {"name": "day", "type": {"type": "long", "logicalType": "date"}},
        {"name": "x", "type": {"type": "string", "logicalType": "no-such-type"}},
    )
    assert avro_to_arrow_schema(schema) == pa.schema([("d", pa.binary()), ("day", pa.int64()), ("x", pa.string())])
    fmt = ValueFormat.for_avro(schema)
    plain = record({"name": "d", "type": "bytes"}, {"name": "day", "type": "long"}, {"name": "x", "type": "string"})
    typed, errors = parse_values(binary([avro_bytes(plain, {"d": b"\x01", "day": 5, "x": "s"})]), fmt)
    assert typed.to_pylist() == [{"d": b"\x01", "day": 5, "x": "s"}] and errors[0].as_py() is None


# ------------------------------------------------------- property tests

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NAMES = st.text("abcdefgh", min_size=1, max_size=4)

LEAF_TYPES = [
    pa.bool_(),
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.float32(),
    pa.float64(),
    pa.string(),
    pa.binary(),
    pa.date32(),
    TIMESTAMP_TYPE,
    pa.decimal128(5, 2),
    pa.decimal128(38, 10),
]


def struct_of(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.dictionaries(NAMES, children, min_size=1, max_size=3).map(lambda d: pa.struct(list(d.items())))


arrow_types = st.recursive(
    st.sampled_from(LEAF_TYPES),
    lambda children: st.one_of(
        children.map(pa.list_),
        children.map(lambda t: pa.map_(pa.string(), t)),
        struct_of(children),
    ),
    max_leaves=6,
)
schemas = st.dictionaries(NAMES, arrow_types, min_size=1, max_size=4).map(lambda d: pa.schema(list(d.items())))


class Number(Decimal):
    """A decimal the test encoder writes as a JSON number rather than a string."""


def encode(v: object) -> str:
    if isinstance(v, Number):
        return str(v)
    if isinstance(v, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{encode(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(encode(x) for x in v) + "]"
    return json.dumps(v)


utc_offsets = st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))


def timestamp_text(instant: dt.datetime, offset: dt.timezone, style: int) -> str:
    local = instant.astimezone(offset)
    if style == 0:
        return local.isoformat()  # 2024-01-01T10:00:00.123456+05:30
    if style == 1:
        return instant.isoformat().replace("+00:00", "Z")
    if style == 2:
        return instant.replace(tzinfo=None).isoformat(sep=" ")  # no offset: UTC
    return local.isoformat(timespec="minutes")[:16] + local.strftime("%z")  # 2024-01-01T10:00+0530


def json_values(t: pa.DataType) -> st.SearchStrategy:
    """Strategy of (JSON-ready value, expected Python value of the Arrow column)."""
    if pa.types.is_boolean(t):
        return st.booleans().map(lambda v: (v, v))
    if pa.types.is_integer(t):
        bits = t.bit_width
        return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1).map(lambda v: (v, v))
    if pa.types.is_float32(t):
        return st.floats(width=32, allow_nan=False).map(lambda v: (v, v))
    if pa.types.is_float64(t):
        return st.floats(allow_nan=False).map(lambda v: (v, v))
    if pa.types.is_string(t):
        return st.text(max_size=8).map(lambda v: (v, v))
    if pa.types.is_binary(t):
        return st.binary(max_size=8).map(lambda v: (base64.b64encode(v).decode(), v))
    if pa.types.is_date32(t):
        return st.dates().map(lambda d: (d.isoformat(), d))
    if pa.types.is_timestamp(t):
        instants = st.datetimes(dt.datetime(2, 1, 1), dt.datetime(9998, 12, 31), timezones=st.just(UTC))
        return st.tuples(instants, utc_offsets, st.integers(0, 3)).map(
            lambda a: (
                timestamp_text(a[0] if a[2] != 3 else a[0].replace(second=0, microsecond=0), a[1], a[2]),
                a[0] if a[2] != 3 else a[0].replace(second=0, microsecond=0),
            )
        )
    if pa.types.is_decimal(t):
        # From the unscaled integer, through the constructor, which is exact: decimal arithmetic (what
        # st.decimals draws with) rounds to the context's 28 digits, beyond decimal(38, s)'s bounds.
        unscaled = st.integers(-(10**t.precision - 1), 10**t.precision - 1)
        decimals = unscaled.map(lambda i, scale=t.scale: Decimal(f"{i}e-{scale}"))
        return st.tuples(decimals, st.booleans()).map(lambda a: (Number(a[0]) if a[1] else str(a[0]), a[0]))
    if pa.types.is_list(t):
        return st.lists(nullable(t.value_type), max_size=3).map(lambda xs: ([x for x, _ in xs], [e for _, e in xs]))
    if pa.types.is_map(t):
        return st.dictionaries(st.text(max_size=3), nullable(t.item_type), max_size=3).map(
            lambda d: ({k: x for k, (x, _) in d.items()}, [(k, e) for k, (_, e) in d.items()])
        )
    if pa.types.is_struct(t):
        return object_values([t.field(i) for i in range(t.num_fields)])
    raise AssertionError(t)


def nullable(t: pa.DataType) -> st.SearchStrategy:
    return st.one_of(st.just((None, None)), json_values(t))


def object_values(fields: list[pa.Field]) -> st.SearchStrategy:
    """A JSON object for ``fields``: some fields missing, some extra ones ignored."""

    def assemble(parts):
        present, extra = parts
        obj = {"~" + k: v for k, v in extra.items()}  # never a schema name (NAMES has no "~")
        expected = {}
        for f, (keep, (value, exp)) in zip(fields, present):
            if keep:
                obj[f.name] = value
            expected[f.name] = exp if keep else None
        return obj, expected

    present = st.tuples(*(st.tuples(st.booleans(), nullable(f.type)) for f in fields))
    extra = st.dictionaries(st.text(max_size=3), st.integers() | st.text(max_size=3), max_size=2)
    return st.tuples(present, extra).map(assemble)


def poison(t: pa.DataType) -> object:
    """A JSON value no leaf of ``t`` accepts, reaching every leaf (forces the value-by-value path)."""
    if pa.types.is_list(t):
        return [poison(t.value_type)]
    if pa.types.is_map(t):
        return {"k": poison(t.item_type)}
    if pa.types.is_struct(t):
        return {t.field(i).name: poison(t.field(i).type) for i in range(t.num_fields)}
    if pa.types.is_string(t):
        return "\ud800"  # a lone surrogate: not valid Unicode
    if pa.types.is_boolean(t):
        return 1
    return "not a value"


@st.composite
def schema_and_objects(draw):
    schema = draw(schemas)
    objects = draw(st.lists(object_values(list(schema)), min_size=1, max_size=5))
    return schema, objects


@SETTINGS
@given(schema_and_objects())
def test_property_json_objects_matching_the_schema_come_back_unchanged(case):
    schema, objects = case
    fmt = ValueFormat("json", schema)
    values = [encode(obj).encode() for obj, _ in objects]
    typed, errors = parse_values(binary(values), fmt)
    assert errors.to_pylist() == [None] * len(values)
    assert typed.to_pylist() == [expected for _, expected in objects]

    # The same values converted one by one (a poisoned record makes every leaf's bulk
    # conversion fail) give the same result: the fast path and the slow path agree.
    poisoned = json.dumps({f.name: poison(f.type) for f in schema}).encode()
    typed2, errors2 = parse_values(binary(values + [poisoned]), fmt)
    assert errors2[len(values)].as_py() is not None
    assert errors2.to_pylist()[:-1] == [None] * len(values)
    assert typed2.slice(0, len(values)).to_pylist() == typed.to_pylist()


json_documents = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(NAMES | st.text(max_size=2), children, max_size=3),
    max_leaves=8,
)


@SETTINGS
@given(st.data())
def test_property_json_never_raises(data):
    schema = data.draw(schemas)
    fmt = ValueFormat("json", schema, wire_format=data.draw(st.sampled_from(["auto", "confluent", "none"])))
    values = data.draw(
        st.lists(
            st.none()
            | st.binary(max_size=30)
            | json_documents.map(lambda d: json.dumps(d).encode())
            | st.tuples(st.integers(0, 2**32 - 1), json_documents).map(lambda a: wire(a[0], json.dumps(a[1]).encode())),
            max_size=8,
        )
    )
    typed, errors = parse_values(binary(values), fmt)
    assert typed.num_rows == len(errors) == len(values)
    for value, row, error in zip(values, typed.to_pylist(), errors.to_pylist()):
        if value is None:
            assert error is None
        if value is None or error is not None:
            assert_all_null(row)
        assert error is None or "\n" not in error


@SETTINGS
@given(st.lists(st.none() | st.binary(max_size=60), max_size=8), st.sampled_from(["auto", "none"]))
def test_property_avro_never_raises(values, wire_format):
    good = avro_bytes(AVRO_ORDER, AVRO_GOOD)
    values = values + [good]
    typed, errors = parse_values(binary(values), ValueFormat.for_avro(AVRO_ORDER, wire_format=wire_format))
    assert errors[len(values) - 1].as_py() is None
    assert typed.to_pylist()[-1]["id"] == 1
    for value, row, error in zip(values, typed.to_pylist(), errors.to_pylist()):
        if value is None or error is not None:
            assert_all_null(row)


# Mostly well-formed strings (so the bulk cast succeeds often), some near misses.
valid_timestamps = st.from_regex(
    r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"
    r"([T ]([01][0-9]|2[0-3])(:[0-5][0-9](:[0-5][0-9](\.[0-9]{1,9})?)?)?)?"
    r"(Z|[+-]([01][0-9]|2[0-3])(:?[0-5][0-9])?)?",
    fullmatch=True,
)
near_timestamps = st.from_regex(
    r"[0-9]{4}-[01][0-9]-[0-3][0-9]"
    r"([T ][0-2][0-9](:[0-6][0-9](:[0-6][0-9](\.[0-9]{1,9})?)?)?)?(Z|[+-][0-2][0-9](:?[0-6][0-9])?)?",
    fullmatch=True,
)
valid_dates = st.dates().map(dt.date.isoformat)
near_dates = st.from_regex(r"[0-9]{4}-[01][0-9]-[0-3][0-9]", fullmatch=True)
near_decimals = st.from_regex(r"[+-]?([0-9]{1,6}\.?[0-9]{0,3}|\.[0-9]{1,3})([eE][+-]?[0-9])?", fullmatch=True)


@pytest.mark.parametrize(
    "column_type, strings",
    [
        (TIMESTAMP_TYPE, valid_timestamps | near_timestamps),
        (pa.date32(), valid_dates | near_dates),
        (pa.decimal128(7, 2), near_decimals),
    ],
    ids=["timestamp", "date", "decimal"],
)
@SETTINGS
@given(data=st.data())
def test_property_bulk_casts_and_value_by_value_parsing_agree(column_type, strings, data):
    """Arrow's string cast (one call per column) and the per-value parser give the same values and errors."""
    fmt = ValueFormat("json", pa.schema([("v", column_type)]))
    values = [js({"v": v}) for v in data.draw(st.lists(strings, min_size=1, max_size=4))]
    typed, errors = parse_values(binary(values), fmt)
    typed2, errors2 = parse_values(binary(values + [js({"v": "x"})]), fmt)  # "x": value by value
    assert errors2[len(values)].as_py() is not None
    assert as_numbers(typed2.slice(0, len(values))) == as_numbers(typed)
    assert errors2.to_pylist()[:-1] == errors.to_pylist()


def as_numbers(table: pa.Table) -> list:
    """The column with timestamps and dates as integers (year 0 is valid Arrow but no Python datetime)."""
    column = table.column("v")
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    elif pa.types.is_date32(column.type):
        column = column.cast(pa.int32())
    return column.to_pylist()
