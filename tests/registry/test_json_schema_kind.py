"""JSON Schema subjects (``pipeline.registry.json_schema_kind``): validity, references, and
Confluent's compatibility rules (the writer's schema the original, the reader's the update), then
the same through the registry's operations over a real store."""

from __future__ import annotations

import json

import pytest

from pipeline.registry import compatibility
from pipeline.registry.json_schema_kind import COMPATIBLE_CHANGES, JsonSchemaKind, differences
from pipeline.registry.schema_kind import InvalidSchema
from pipeline.registry.service import RegistryError, SchemaRegistry
from pipeline.registry.store import SchemaStore

KIND = JsonSchemaKind()


def parse(schema: object, references=()):
    return KIND.parse(json.dumps(schema), references)


def obj(closed: bool | None = None, required=(), **properties: object) -> dict:
    """An object schema of ``properties``; ``closed``: additionalProperties false (True), true (False)."""
    out: dict = {"type": "object", "properties": properties}
    if closed is not None:
        out["additionalProperties"] = not closed
    if required:
        out["required"] = list(required)
    return out


S, INT, N = {"type": "string"}, {"type": "integer"}, {"type": "number"}

# (writer, reader, the reader reads the writer's data, the differences' types)
CASES = {
    "optional property added, closed model": (obj(True, sensor=S), obj(True, sensor=S, celsius=N), True,
                                              ["OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL"]),
    "optional property added, open model (strict policy)": (obj(sensor=S), obj(sensor=S, celsius=N), False,
                                                            ["OPTIONAL_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL"]),
    "{} property added, open model": (obj(sensor=S), obj(sensor=S, extra={}), True,
                                      ["PROPERTY_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL"]),
    "required property added, closed": (obj(True, a=S), obj(True, ["b"], a=S, b=S), False,
                                        ["REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL"]),
    "required property with a default added, closed": (
        obj(True, a=S), obj(True, ["b"], a=S, b={"type": "string", "default": "x"}), True,
        ["REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_UNOPEN_CONTENT_MODEL"]),
    "property removed, open reader": (obj(a=S, b=S), obj(a=S), True, ["PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL"]),
    "property removed, closed reader": (obj(True, a=S, b=S), obj(True, a=S), False,
                                        ["PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL"]),
    "property added, covered by additionalProperties' schema": (
        {**obj(a=S), "additionalProperties": S}, {**obj(a=S, b=S), "additionalProperties": S}, True,
        ["OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL",
         "PROPERTY_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL"]),
    "property added, not covered by patternProperties' schema": (
        {**obj(True, a=S), "patternProperties": {"^n_": INT}}, {**obj(True, a=S, n_x=S), "patternProperties": {"^n_": INT}},
        False, ["OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL", "PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
                "TYPE_CHANGED"]),
    "property's type changed": (obj(True, a=S), obj(True, a=INT), False, ["TYPE_CHANGED"]),
    "integer -> number": (obj(a=INT), obj(a=N), True, ["TYPE_EXTENDED"]),
    "number -> integer": (obj(a=N), obj(a=INT), False, ["TYPE_NARROWED"]),
    "made nullable (type list)": (obj(a=S), obj(a={"type": ["null", "string"]}), True, ["SUM_TYPE_EXTENDED"]),
    "made nullable (oneOf)": (obj(a=S), obj(a={"oneOf": [{"type": "null"}, S]}), True, ["SUM_TYPE_EXTENDED"]),
    "nullable made required": (obj(a={"type": ["null", "string"]}), obj(a=S), False, ["TYPE_CHANGED"]),
    "required removed": (obj(required=["a"], a=S), obj(a=S), True, ["REQUIRED_ATTRIBUTE_REMOVED"]),
    "required added": (obj(a=S), obj(required=["a"], a=S), False, ["REQUIRED_ATTRIBUTE_ADDED"]),
    "additionalProperties false -> absent": (obj(True, a=S), obj(a=S), True, ["ADDITIONAL_PROPERTIES_ADDED"]),
    "additionalProperties true -> false": (obj(False, a=S), obj(True, a=S), False, ["ADDITIONAL_PROPERTIES_REMOVED"]),
    "enum extended": ({"enum": ["a"]}, {"enum": ["a", "b"]}, True, ["ENUM_ARRAY_EXTENDED"]),
    "enum narrowed": ({"enum": ["a", "b"]}, {"enum": ["a"]}, False, ["ENUM_ARRAY_NARROWED"]),
    "string enum dropped": ({"type": "string", "enum": ["a"]}, S, True, ["PRODUCT_TYPE_NARROWED"]),
    "maxLength decreased": ({"type": "string", "maxLength": 9}, {"type": "string", "maxLength": 5}, False,
                            ["MAX_LENGTH_DECREASED"]),
    "maximum increased, minimum added": ({"type": "number", "maximum": 5}, {"type": "number", "maximum": 9, "minimum": 0},
                                         False, ["MAXIMUM_INCREASED", "MINIMUM_ADDED"]),
    "multipleOf reduced": ({"type": "number", "multipleOf": 0.5}, {"type": "number", "multipleOf": 0.25}, True,
                           ["MULTIPLE_OF_REDUCED"]),
    "array items' type changed": ({"type": "array", "items": S}, {"type": "array", "items": INT}, False, ["TYPE_CHANGED"]),
    "array items given": ({"type": "array"}, {"type": "array", "items": S}, False, ["SCHEMA_ADDED"]),
    "array items dropped, maxItems increased": ({"type": "array", "items": S, "maxItems": 2},
                                                {"type": "array", "maxItems": 3}, True,
                                                ["MAX_ITEMS_INCREASED", "SCHEMA_REMOVED"]),
    "tuple item added, closed": ({"type": "array", "items": [S], "additionalItems": False},
                                 {"type": "array", "items": [S, INT], "additionalItems": False}, True,
                                 ["ITEM_ADDED_TO_CLOSED_CONTENT_MODEL"]),
    "nested object: property removed from a closed one": (
        obj(True, at=obj(True, city=S, zip=S)), obj(True, at=obj(True, city=S)), False,
        ["PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL"]),
    "anyOf member removed": ({"anyOf": [S, INT]}, {"anyOf": [S]}, False, ["SUM_TYPE_NARROWED"]),
    "oneOf -> anyOf": ({"oneOf": [S, INT]}, {"anyOf": [INT, S]}, True, ["COMBINED_TYPE_EXTENDED"]),
    "anything -> {}": (obj(True, a=S), {}, True, []),
    "{} -> a type": ({}, S, False, ["TYPE_CHANGED"]),
    "title and description": ({"title": "a", **S}, {"title": "b", "description": "d", **S}, True,
                              ["DESCRIPTION_CHANGED", "TITLE_CHANGED"]),
    "moved behind a local $ref": (obj(True, a=S), {**obj(True, a={"$ref": "#/$defs/s"}), "$defs": {"s": S}}, True, []),
    "not: narrowed": ({"not": N}, {"not": INT}, True, ["NOT_TYPE_NARROWED"]),
}


@pytest.mark.parametrize("name", CASES)
def test_compatibility_rules(name):
    writer, reader, readable, kinds = CASES[name]
    found = differences(parse(writer), parse(reader))
    assert sorted(k for k, _ in found) == sorted(kinds)
    assert (KIND.can_read(parse(reader), parse(writer)) == []) is readable
    assert all(k in COMPATIBLE_CHANGES for k in kinds) is readable


def test_incompatibilities_name_their_place():
    reasons = KIND.can_read(parse(obj(True, at=obj(True, city=INT))), parse(obj(True, at=obj(True, city=S))))
    assert reasons == ["TYPE_CHANGED at #/properties/at/properties/city"]


def test_recursive_schemas_end():
    tree = {"type": "object", "properties": {"name": S, "children": {"type": "array", "items": {"$ref": "#"}}}}
    changed = json.loads(json.dumps(tree).replace('"string"', '"integer"'))
    assert KIND.can_read(parse(tree), parse(tree)) == []
    assert KIND.can_read(parse(changed), parse(tree)) == ["TYPE_CHANGED at #/properties/name"]


@pytest.mark.parametrize("text, why", [
    ("nope", "Expecting value"),
    ("[1]", "an object or a boolean"),
    ('{"type": "strin"}', "is not valid"),
    ('{"minLength": -1}', "minLength"),
    ('{"pattern": "("}', "regex"),
    ('{"properties": {"a": {"$ref": "#/definitions/missing"}}}', "'#/definitions/missing' resolves to nothing"),
    ('{"$ref": "address.json"}', "'address.json' resolves to nothing"),
    ('{"properties": {"enum": {"$ref": "#/$defs/gone"}}}', "'#/\\$defs/gone' resolves to nothing"),  # a property
])
def test_invalid_schemas(text, why):
    with pytest.raises(InvalidSchema, match=why):
        KIND.parse(text, [])


def test_references_by_name():
    address = obj(True, city=S)
    order = obj(True, to={"$ref": "address.json"})
    refs = [("address.json", "JSON", json.dumps(address))]
    parsed = parse(order, refs)
    changed = [("address.json", "JSON", json.dumps(obj(True, city=INT)))]
    assert KIND.can_read(parse(order, changed), parsed) == ["TYPE_CHANGED at #/properties/to/properties/city"]
    with_id = {"$id": "https://example.com/schemas/order.json", **order}
    parse(with_id, refs)  # the name is also resolved relative to the schema's $id
    with pytest.raises(InvalidSchema, match="cannot reference a AVRO schema"):
        parse(order, [("address.json", "AVRO", '"string"')])


def test_canonical_is_compact_with_sorted_keys():
    assert KIND.canonical('{"type": "object",\n "properties": {"b": {}, "a": {}}}') == (
        '{"properties":{"a":{},"b":{}},"type":"object"}')
    assert "JSON" in compatibility.SCHEMA_TYPES


V1 = obj(True, sensor=S)
V2 = obj(True, sensor=S, celsius={"type": "number"})
V3 = obj(True, sensor=INT, celsius={"type": "number"})


def test_registry_evolves_a_json_subject(tmp_path):
    """The producer's flow through the registry's operations: v1, v2 (an optional property, BACKWARD),
    v3 (a type change) refused with 409; references to another JSON subject; FULL refuses v2."""
    store = SchemaStore(tmp_path / "registry.db")
    try:
        registry = SchemaRegistry(store)
        body = lambda schema, **extra: {"schema": json.dumps(schema), "schemaType": "JSON", **extra}  # noqa: E731
        first = registry.register("readings-value", body(V1))["id"]
        assert registry.register("readings-value", {"schema": json.dumps(V1, indent=2), "schemaType": "JSON"})[
            "id"] == first  # the same schema, another spelling
        registry.register("readings-value", body(V2))
        assert registry.versions("readings-value") == [1, 2]
        assert registry.version("readings-value", "latest")["schemaType"] == "JSON"
        with pytest.raises(RegistryError) as e:
            registry.register("readings-value", body(V3))
        assert (e.value.error_code, e.value.status) == (409, 409)
        with pytest.raises(RegistryError) as e:
            registry.register("readings-value", body({"type": "strin"}))
        assert (e.value.error_code, e.value.status) == (42201, 422)

        registry.register("address", body(obj(True, city=S)))
        order = body(obj(True, to={"$ref": "address.json"}),
                     references=[{"name": "address.json", "subject": "address", "version": 1}])
        order_id = registry.register("orders-value", order)["id"]
        assert registry.referenced_by("address", 1) == [order_id]
        with pytest.raises(RegistryError) as e:
            registry.register("orders-value", body(obj(True, to={"$ref": "address.json"})))
        assert (e.value.error_code, e.value.status) == (42201, 422)

        registry.register("strict-value", body(V1))
        registry.set_config("strict-value", {"compatibility": "FULL"})
        with pytest.raises(RegistryError) as e:  # v1 cannot read v2's data: celsius is not in its closed model
            registry.register("strict-value", body(V2))
        assert e.value.status == 409
    finally:
        store.close()
