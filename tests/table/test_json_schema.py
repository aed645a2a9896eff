"""A JSON Schema as a table's columns (``pipeline.table.json_schema``), and a registry topic of type
JSON read with it: values written by confluent-kafka's ``JSONSerializer`` against pipeline's registry,
with the schema id as a payload prefix and in a ``__value_schema_id`` header."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.registry.service import SchemaRegistry
from pipeline.registry.store import SchemaStore
from pipeline.table.json_schema import json_schema_to_arrow
from pipeline.table.values import TIMESTAMP_TYPE, ValueFormat, parse_values, registry_value_format
from tests.registry.test_http import running


def columns(**properties: object) -> pa.Schema:
    return json_schema_to_arrow({"type": "object", "properties": properties})


def test_the_mapping():
    schema = json_schema_to_arrow({
        "type": "object",
        "properties": {
            "s": {"type": "string"}, "day": {"type": "string", "format": "date"},
            "at": {"type": "string", "format": "date-time"}, "email": {"type": "string", "format": "email"},
            "n": {"type": "integer"}, "x": {"type": "number"}, "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}},
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
            "maybe": {"type": ["null", "integer"]}, "either": {"oneOf": [{"type": "null"}, {"type": "string"}]},
            "any_of": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}, "color": {"enum": ["red", "blue"]},
            "ref": {"$ref": "#/definitions/point"}, "ref2019": {"$ref": "#/$defs/n"},
            "anything": {}, "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
        },
        "definitions": {"point": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        "$defs": {"n": {"type": "number"}},
        "additionalProperties": False,
    })
    point = pa.struct([pa.field("x", pa.int64())])
    assert schema == pa.schema([
        ("s", pa.string()), ("day", pa.date32()), ("at", TIMESTAMP_TYPE), ("email", pa.string()),
        ("n", pa.int64()), ("x", pa.float64()), ("ok", pa.bool_()),
        ("tags", pa.list_(pa.field("element", pa.string()))),
        ("where", pa.struct([("lat", pa.float64()), ("lon", pa.float64())])),
        ("counts", pa.map_(pa.string(), pa.int64())),
        ("maybe", pa.int64()), ("either", pa.string()), ("any_of", pa.bool_()), ("color", pa.string()),
        ("ref", point), ("ref2019", pa.float64()), ("anything", pa.string()),
        ("matrix", pa.list_(pa.field("element", pa.list_(pa.field("element", pa.float64()))))),
    ])
    assert all(f.nullable for f in schema)
    assert json_schema_to_arrow('{"properties": {"a": {"items": {"type": "integer"}}}}') == pa.schema(
        [("a", pa.list_(pa.field("element", pa.int64())))])  # kinds inferred without "type"


def mapping_rows() -> list[tuple[str, str]]:
    """docs/table.md's "JSON Schema types as columns" rows: (a JSON Schema of the first cell, the Spark type)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "table.md").read_text()
    start = text.index("### JSON Schema types as columns")
    section = text[start:text.index("\n#", start)]
    rows = []
    for line in section.splitlines():
        cells = line.split(" | ")
        if line.startswith("| `") and len(cells) == 2:
            spark = re.fullmatch(r"`(.+?)`( \(.*\))? \|", cells[1])
            assert spark, line
            rows += [(schema, spark.group(1)) for schema in re.findall(r"`(.+?)`", cells[0]) if schema[0] == "{"]
    assert len(rows) >= 15, rows
    return rows


@pytest.mark.parametrize("schema, spark", mapping_rows())
def test_each_row_of_the_docs_mapping_table(schema, spark):
    from pyspark.sql.pandas.types import from_arrow_type

    defs = {"definitions": {"X": {"type": "integer"}}, "$defs": {"X": {"type": "integer"}}}
    columns = json_schema_to_arrow({"type": "object", "properties": {"f": json.loads(schema)}, **defs})
    found = from_arrow_type(columns.field("f").type).simpleString()
    assert found == spark
    assert columns.field("f").nullable


@pytest.mark.parametrize("schema, why", [
    ({"type": "array", "items": {"type": "string"}}, "the top level must be an object"),
    ({"type": "object"}, "the top level must be an object with properties"),
    ({"type": "object", "properties": {"a": {"type": ["string", "integer"]}}}, "a: a union of string, integer"),
    ({"type": "object", "properties": {"a": {"type": "null"}}}, "a: type null alone"),
    ({"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}},
     "a: oneOf of 2 non-null schemas"),
    ({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "array"}}}}},
     "a.b: an array needs one items schema"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "object"}}}},
     r"a\[\]: an object needs properties or an additionalProperties schema"),
    ({"type": "object", "properties": {"a": {"enum": [1, 2]}}}, "a: an enum of non-strings needs a type"),
    ({"type": "object", "properties": {"a": {"$ref": "other.json"}}}, "a: \\$ref 'other.json' is not local"),
    ({"type": "object", "properties": {"a": {"$ref": "#/definitions/nope"}}}, "a: \\$ref '#/definitions/nope' resolves"),
    ({"type": "object", "properties": {"a": False}}, "a: false admits no value"),
    ({"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}},
     r"kids\[\]: a recursive schema"),
])
def test_shapes_a_table_cannot_hold_are_named(schema, why):
    with pytest.raises(ValueError, match=why):
        json_schema_to_arrow(schema)


V1 = {"type": "object", "properties": {"sensor": {"type": "string"}}, "additionalProperties": False}
V2 = {"type": "object", "properties": {"sensor": {"type": "string"}, "celsius": {"type": "number"},
                                       "at": {"type": "string", "format": "date-time"}},
      "additionalProperties": False}


def test_registry_value_format_reads_json_by_property_name():
    fmt = registry_value_format("JSON", json.dumps(V2), "auto", "unused: json needs no writer schema")
    fmt = pickle.loads(pickle.dumps(fmt))  # as the decode worker gets it
    assert fmt.kind == "json" and fmt.schema == columns(**V2["properties"])
    values = pa.array([b'{"sensor": "s-1"}', b'{"sensor": "s-2", "celsius": 21.5, "at": "2026-11-28T10:00:00Z"}',
                       None, b'{"sensor": "s-4", "celsius": "warm"}'], pa.binary())
    typed, errors = parse_values(values, fmt)
    rows = typed.to_pylist()
    assert [r["sensor"] for r in rows] == ["s-1", "s-2", None, None]  # a v1 value: null in v2's columns
    assert [r["celsius"] for r in rows] == [None, 21.5, None, None]
    assert rows[1]["at"].isoformat() == "2026-11-28T10:00:00+00:00"
    assert errors.to_pylist()[:3] == [None, None, None] and "celsius" in errors.to_pylist()[3]


def test_values_written_by_confluent_kafkas_json_serializer(tmp_path):
    """confluent-kafka's JSONSerializer registers v1 and v2 in pipeline's registry and frames values with
    the id as a prefix (magic 0 + 4 bytes) or in a ``__value_schema_id`` header (Schema Registry 8.0,
    ``header_schema_id_serializer``); both decode with the latest version's columns, the v1 value null
    in the column v2 added, under wire formats auto and confluent."""
    from confluent_kafka.schema_registry import SchemaRegistryClient, header_schema_id_serializer
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from pipeline.registry.http import RegistryListener
    from pipeline.table.schema import HEADERS_ARROW_TYPE

    store = SchemaStore(tmp_path / "registry.db")
    try:
        with running(SchemaRegistry(store), RegistryListener("127.0.0.1", 0)) as url:
            client = SchemaRegistryClient({"url": url})
            prefixed = JSONSerializer(json.dumps(V1), client)(
                {"sensor": "s-1"}, SerializationContext("readings", MessageField.VALUE))
            header_ctx = SerializationContext("readings", MessageField.VALUE, headers=[])
            in_header = JSONSerializer(json.dumps(V2), client, conf={
                "schema.id.serializer": header_schema_id_serializer})(
                {"sensor": "s-2", "celsius": 21.5}, header_ctx)
            [(key, header)] = header_ctx.headers
            latest = client.get_latest_version("readings-value")
        assert prefixed[0] == 0 and json.loads(prefixed[5:]) == {"sensor": "s-1"}
        assert key == "__value_schema_id" and header[0] == 1 and json.loads(in_header)["sensor"] == "s-2"
        assert latest.version == 2 and latest.schema.schema_type == "JSON"
        values = pa.array([prefixed, in_header], pa.binary())
        headers = pa.array([None, [{"key": key, "value": header}]], HEADERS_ARROW_TYPE)
        for wire in ("auto", "confluent"):
            fmt = registry_value_format("JSON", latest.schema.schema_str, wire, url)
            typed, errors = parse_values(values, fmt, headers)
            assert errors.to_pylist() == [None, None], wire
            assert typed.to_pylist() == [{"sensor": "s-1", "celsius": None, "at": None},
                                         {"sensor": "s-2", "celsius": 21.5, "at": None}], wire
        typed, errors = parse_values(values, ValueFormat("json", fmt.schema, wire_format="confluent"))
        assert errors.to_pylist()[1].startswith("no Schema Registry header")  # without its header
    finally:
        store.close()
