"""A JSON Schema as a table's columns: ``json_schema_to_arrow``.

A topic whose values follow a registry subject of type JSON (Confluent's JSON Schema serializer)
gets one column per property of the schema's top-level object; ``pipeline.table.values`` then reads
each JSON value into them by property name (``ValueFormat("json", ...)``), so a value written with
an older version of the schema reads null in a column a newer version added.

Pure and Spark-free (pyarrow, and ``referencing`` for ``$ref``); nothing here reads a file or a
socket.

Sources: JSON Schema draft-07 / 2020-12 Validation (``type``, ``format`` ``date`` and
``date-time`` after RFC 3339, ``enum``, ``const``, ``items``, ``properties``,
``additionalProperties``, ``anyOf``/``oneOf``); Confluent's ``JsonSchemaData`` maps the same
shapes to Connect's types (``["null", T]`` and an ``anyOf``/``oneOf`` with a ``null`` member to an
optional T, an object with only ``additionalProperties`` to a map).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from referencing._core import Resolver

__all__ = ("json_schema_to_arrow",)

_SCALARS = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}
_STRING_FORMATS = {"date": pa.date32(), "date-time": pa.timestamp("us", tz="UTC")}
"""``format`` -> the column type (``date-time``: ``pipeline.table.values.TIMESTAMP_TYPE``, Spark's
TimestampType; spelled out here because ``values`` imports this module)."""
_MAX_REF_CHAIN = 64


def json_schema_to_arrow(schema: dict | bool | str) -> pa.Schema:
    """The typed columns of a JSON Schema (a decoded document or its text): one per property of the
    top-level object, in the schema's order, all nullable (a value may lack a property; a tombstone
    or a failed value is an all-null row).

    ==================================================  ==============================================
    JSON Schema                                         Arrow
    ==================================================  ==============================================
    ``string``; ``enum``/``const`` of strings           string
    ``string`` + ``format: date``                       date32
    ``string`` + ``format: date-time``                  timestamp[us, tz=UTC]
    ``integer`` / ``number`` / ``boolean``              int64 / float64 / bool
    ``array`` + ``items: T``                            list<element: T>
    ``object`` + ``properties``                         struct (the properties, in order)
    ``object`` + only an ``additionalProperties: T``    map<string, T>
    ``[T, "null"]``, ``anyOf``/``oneOf`` [T, null]      T (nullable)
    ``anyOf``/``oneOf``/``allOf`` of one schema         that schema
    ``{}`` / ``true`` (any JSON)                        string (the value's compact JSON text)
    ``$ref`` (``#/definitions/..``, ``#/$defs/..``)     what it points at
    ==================================================  ==============================================

    Without ``type``, ``properties`` means an object, ``items`` an array.

    Raises:
        ValueError: the top level is not an object with properties, or a property has a shape a
            table cannot hold, named by its path (``'a.b[]'``): a union of two or more non-null
            types, a bare ``null`` or ``false``, an array without one ``items`` schema, an object
            with neither properties nor an ``additionalProperties`` schema, an ``enum`` of
            non-strings without a ``type``, a ``$ref`` that is not local or resolves to nothing, a
            recursive schema.
    """
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT7

    from pipeline.registry.schema_kind import load_json_schema

    if isinstance(schema, str):
        schema = load_json_schema(schema)  # InvalidSchema is a ValueError
    elif not isinstance(schema, dict | bool):
        raise ValueError(f"a JSON schema is an object or a boolean, not {type(schema).__name__}")
    root = Resource.from_contents(schema, default_specification=DRAFT7)
    resolver = Registry().with_resource("", root).resolver(base_uri="")
    top, resolver = _resolve(schema, resolver, "the top level", ())
    if not isinstance(top, dict) or _kind(top, "the top level") != "object" or not top.get("properties"):
        raise ValueError("the top level must be an object with properties (one column each)")
    return pa.schema(_fields(top, resolver, "", (id(top),)))


def _fields(schema: dict, resolver: Resolver, prefix: str, seen: tuple[int, ...]) -> list[pa.Field]:
    properties = schema.get("properties") or {}
    if not isinstance(properties, dict):
        raise ValueError(f"{prefix or 'the top level'}: properties is not an object")
    return [pa.field(name, _type(sub, resolver, f"{prefix}.{name}" if prefix else name, seen), nullable=True)
            for name, sub in properties.items()]


def _resolve(schema: Any, resolver: Resolver, path: str, seen: tuple[int, ...]) -> tuple[Any, Resolver]:
    """``schema`` with its ``$ref`` s followed (local ones only: the table side has no references)."""
    from referencing.exceptions import Unresolvable

    for _ in range(_MAX_REF_CHAIN):
        if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
            return schema, resolver
        ref = schema["$ref"]
        if not ref.startswith("#"):
            raise ValueError(f"{path}: $ref {ref!r} is not local (a referenced subject's schema cannot be a column)")
        try:
            resolved = resolver.lookup(ref)
        except Unresolvable:
            raise ValueError(f"{path}: $ref {ref!r} resolves to nothing") from None
        schema, resolver = resolved.contents, resolved.resolver
    raise ValueError(f"{path}: a $ref chain that does not end")


def _kind(schema: dict, path: str) -> str | None:
    """The one non-null type of ``schema`` (``type``, or inferred), None for any JSON."""
    types = schema.get("type")
    if isinstance(types, list):
        rest = [t for t in types if t != "null"]
        if len(rest) > 1:
            raise ValueError(f"{path}: a union of {', '.join(map(str, rest))} cannot be one column")
        if not rest:
            raise ValueError(f"{path}: type null alone cannot be a column")
        return str(rest[0])
    if isinstance(types, str):
        if types == "null":
            raise ValueError(f"{path}: type null alone cannot be a column")
        return types
    if "properties" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        if all(isinstance(v, str) or v is None for v in values):
            return "string"
        raise ValueError(f"{path}: an enum of non-strings needs a type")
    return None


def _type(schema: Any, resolver: Resolver, path: str, seen: tuple[int, ...]) -> pa.DataType:
    schema, resolver = _resolve(schema, resolver, path, seen)
    if schema is True:
        return pa.string()
    if not isinstance(schema, dict):
        raise ValueError(f"{path}: {json.dumps(schema)} admits no value")
    if id(schema) in seen:
        raise ValueError(f"{path}: a recursive schema cannot be a column")
    seen = (*seen, id(schema))
    for criterion in ("anyOf", "oneOf", "allOf"):
        members = schema.get(criterion)
        if isinstance(members, list):
            resolved = [_resolve(m, resolver, path, seen) for m in members]
            rest = [(m, r) for m, r in resolved if not (isinstance(m, dict) and m.get("type") == "null")]
            if len(rest) != 1 or (criterion == "allOf" and len(members) != 1):
                raise ValueError(f"{path}: {criterion} of {len(rest)} non-null schemas cannot be one column")
            return _type(rest[0][0], rest[0][1], path, seen)
    kind = _kind(schema, path)
    if kind is None:
        return pa.string()  # any JSON: values.py keeps a non-string as its compact JSON text
    if kind == "string":
        return _STRING_FORMATS.get(str(schema.get("format")), pa.string())
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":
        items = schema.get("items")
        if not isinstance(items, dict | bool) or "prefixItems" in schema:
            raise ValueError(f"{path}: an array needs one items schema (a tuple cannot be a list column)")
        return pa.list_(pa.field("element", _type(items, resolver, f"{path}[]", seen), nullable=True))
    if kind == "object":
        if schema.get("properties"):
            return pa.struct(_fields(schema, resolver, path, seen))
        values = schema.get("additionalProperties")
        if isinstance(values, dict):
            return pa.map_(pa.string(), _type(values, resolver, f"{path}{{}}", seen))
        raise ValueError(f"{path}: an object needs properties or an additionalProperties schema")
    raise ValueError(f"{path}: unknown type {kind!r}")
