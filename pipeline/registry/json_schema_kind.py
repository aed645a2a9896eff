"""JSON Schema in the registry (Confluent schema type ``JSON``): validity by the ``jsonschema``
library, compatibility by Confluent's rules.

Validity: the text is a JSON object (or ``true``/``false``) that its dialect's metaschema accepts
(``jsonschema.validators.validator_for(schema, default=Draft7Validator).check_schema``; draft-07 when
there is no ``$schema``, as Confluent's ``JsonSchema`` has it), and whose every ``$ref`` resolves:
locally (``#/definitions/x``, ``#/$defs/x``), or to a referenced subject's schema by the reference's
``name`` (``"$ref": "address.json"`` with ``"references": [{"name": "address.json", ...}]``),
resolved with ``referencing``, the library ``jsonschema`` resolves with.

Compatibility (``can_read``) follows Confluent's ``json-schema-provider`` ``diff`` package
(``SchemaDiff``, ``ObjectSchemaDiff``, ``ArraySchemaDiff``, ...; Schema Registry 8.x, read, not
copied): the writer's schema is the *original*, the reader's the *update*; each difference between
them has a type, and the reader can read the writer's data when every difference is one of
``COMPATIBLE_CHANGES`` (Confluent's ``COMPATIBLE_CHANGES_STRICT``, its default policy). A schema is
first seen as Confluent's parser (Everit) sees it: ``true``/``{}`` accepts anything, ``false``
nothing; ``type: [a, b]`` is an ``anyOf``; keywords of several kinds (``type: string`` with
``enum``, ``properties`` with ``allOf``) are an ``allOf`` of one part per kind; without ``type`` the
kind follows the keywords (``properties`` -> object, ``items`` -> array, ``minLength`` -> string,
``minimum`` -> number); ``$ref`` is replaced by what it points at. Covered:

- type changed (incompatible), ``integer`` -> ``number`` extended (compatible; the reverse is not),
  anything -> ``{}`` (compatible); a type made a member of an ``anyOf``/``oneOf`` (compatible), a
  member of an ``allOf`` dropped (compatible);
- ``anyOf``/``oneOf``/``allOf``: criterion changed, members added or removed, members paired by a
  maximum matching of compatible pairs (Confluent's ``CombinedSchemaDiff``); ``not`` (reversed);
- objects: a property added to a closed (``additionalProperties: false``) content model (compatible
  when optional or required with a default), to an open one (incompatible, except the ``{}``
  schema; Confluent's strict policy), to a partially open one (``additionalProperties`` or
  ``patternProperties`` schema: compatible when that schema's values are the property's);
  a property removed from an open model (compatible), from a closed one (incompatible, unless its
  schema was ``false``), from a partially open one (compatible when covered); ``required`` added
  (incompatible unless with a default) or removed; ``additionalProperties`` and
  ``unevaluatedProperties`` added, removed, narrowed, extended; ``dependencies`` (arrays and
  schemas); ``minProperties``/``maxProperties``;
- arrays: ``items`` (one schema, or a tuple with ``additionalItems``/``unevaluatedItems`` as the
  content model, same rules as properties), ``minItems``/``maxItems``, ``uniqueItems``,
  ``minContains``/``maxContains``;
- strings: ``minLength``/``maxLength``, ``pattern`` added, removed, changed; numbers: ``minimum``,
  ``maximum``, ``exclusiveMinimum``/``exclusiveMaximum`` (numeric form), ``multipleOf``;
  ``enum`` extended (compatible), narrowed or changed; ``const`` changed.
- ``id``/``title``/``description``/``default`` changes are compatible.

Not covered: Confluent's lenient policy (``COMPATIBLE_CHANGES_LENIENT``); recursive schemas are
compared once per (writer, reader) pair on the path and a pair met again is taken as compatible
(Confluent iterates that assumption to a fixpoint); ``prefixItems`` (2020-12) is read as the tuple
form of ``items``, with ``items`` beside it as ``additionalItems``; ``format``, ``contains``'s
schema, ``propertyNames``, ``if``/``then``/``else`` and draft-04's boolean
``exclusiveMinimum``/``exclusiveMaximum`` are not compared (nor are they by Confluent's diff, except
the last); ``connect.type: bytes`` on both sides is taken as the same type, as Confluent does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from typing import TYPE_CHECKING, Any

from pipeline.registry.schema_kind import InvalidSchema, Reference, canonical_json, load_json_schema

if TYPE_CHECKING:
    from referencing import Registry
    from referencing._core import Resolver

__all__ = ("COMPATIBLE_CHANGES", "JSON", "JsonSchemaKind", "ParsedJsonSchema", "differences")

JSON = "JSON"

COMPATIBLE_CHANGES = frozenset({
    "ID_CHANGED", "DESCRIPTION_CHANGED", "TITLE_CHANGED", "DEFAULT_CHANGED", "SCHEMA_REMOVED", "TYPE_EXTENDED",
    "MAX_LENGTH_INCREASED", "MAX_LENGTH_REMOVED", "MIN_LENGTH_DECREASED", "MIN_LENGTH_REMOVED", "PATTERN_REMOVED",
    "MAXIMUM_INCREASED", "MAXIMUM_REMOVED", "MINIMUM_DECREASED", "MINIMUM_REMOVED",
    "EXCLUSIVE_MAXIMUM_INCREASED", "EXCLUSIVE_MAXIMUM_REMOVED", "EXCLUSIVE_MINIMUM_DECREASED",
    "EXCLUSIVE_MINIMUM_REMOVED", "MULTIPLE_OF_REDUCED", "MULTIPLE_OF_REMOVED",
    "REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED", "REQUIRED_ATTRIBUTE_REMOVED", "DEPENDENCY_ARRAY_NARROWED",
    "DEPENDENCY_ARRAY_REMOVED", "DEPENDENCY_SCHEMA_REMOVED", "MAX_PROPERTIES_INCREASED", "MAX_PROPERTIES_REMOVED",
    "MIN_PROPERTIES_DECREASED", "MIN_PROPERTIES_REMOVED", "ADDITIONAL_PROPERTIES_ADDED",
    "ADDITIONAL_PROPERTIES_EXTENDED", "UNEVALUATED_PROPERTIES_ADDED", "UNEVALUATED_PROPERTIES_EXTENDED",
    "PROPERTY_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL",
    "REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_UNOPEN_CONTENT_MODEL", "OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL",
    "PROPERTY_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL", "PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL",
    "PROPERTY_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
    "PROPERTY_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
    "MAX_ITEMS_INCREASED", "MAX_ITEMS_REMOVED", "MIN_ITEMS_DECREASED", "MIN_ITEMS_REMOVED",
    "MAX_CONTAINS_INCREASED", "MAX_CONTAINS_REMOVED", "MIN_CONTAINS_DECREASED", "MIN_CONTAINS_REMOVED",
    "UNIQUE_ITEMS_REMOVED", "ADDITIONAL_ITEMS_ADDED", "ADDITIONAL_ITEMS_EXTENDED", "UNEVALUATED_ITEMS_ADDED",
    "UNEVALUATED_ITEMS_EXTENDED", "ITEM_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL",
    "ITEM_ADDED_TO_CLOSED_CONTENT_MODEL", "ITEM_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL",
    "ITEM_REMOVED_FROM_OPEN_CONTENT_MODEL", "ITEM_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
    "ITEM_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
    "ENUM_ARRAY_EXTENDED", "COMBINED_TYPE_EXTENDED", "PRODUCT_TYPE_NARROWED", "SUM_TYPE_EXTENDED",
    "NOT_TYPE_NARROWED",
})
"""The difference types a reader tolerates (Confluent ``SchemaDiff.COMPATIBLE_CHANGES_STRICT``); any
other difference (``TYPE_CHANGED``, ``REQUIRED_ATTRIBUTE_ADDED``, ...) makes the pair incompatible."""

_MAX_REF_CHAIN = 64
"""``$ref`` hops followed to reach a schema (a longer chain is taken as a loop: invalid)."""

# Without "type", the keywords that make a schema of each kind (as Everit's SchemaLoader infers it).
_KIND_KEYWORDS = {
    "object": ("properties", "patternProperties", "additionalProperties", "required", "minProperties",
               "maxProperties", "dependencies", "dependentRequired", "dependentSchemas", "propertyNames",
               "unevaluatedProperties"),
    "array": ("items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains",
              "minContains", "maxContains", "unevaluatedItems"),
    "string": ("minLength", "maxLength", "pattern"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
}
_TYPES = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean", "null": "null",
          "object": "object", "array": "array"}
_NOT_SCHEMAS = frozenset({"enum", "const", "default", "examples"})
"""Keywords whose values are data, not schemas (a ``$ref`` in them is not a reference)."""
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "definitions", "$defs", "dependencies",
                          "dependentSchemas"})
"""Keywords whose values map names to schemas."""


@dataclass(frozen=True)
class ParsedJsonSchema:
    """A checked JSON Schema: its decoded document and the resolver of its ``$ref`` s (local and the
    references' names)."""

    schema: dict | bool
    resolver: Resolver = field(repr=False, compare=False)


class JsonSchemaKind:
    """JSON Schema (Confluent ``JSON``): ``jsonschema`` checks it, ``referencing`` resolves it, the
    compatibility check is Confluent's (module docstring)."""

    canonical = staticmethod(canonical_json)  # Confluent's JsonSchema.canonicalString, with its own key order

    @staticmethod
    def parse(text: str, references: Sequence[Reference]) -> ParsedJsonSchema:
        """Check ``text`` and make its resolver; ``references`` are registered under their names (and,
        when the schema has an ``$id``, under their names relative to it).

        Raises:
            InvalidSchema: not JSON, not a schema its metaschema accepts, a reference that is not JSON
                Schema, or a ``$ref`` that resolves to nothing.
        """
        from jsonschema import Draft7Validator, validators
        from jsonschema.exceptions import SchemaError
        from referencing import Registry, Resource
        from referencing.jsonschema import DRAFT7

        schema = _load(text)
        try:
            validators.validator_for(schema, default=Draft7Validator).check_schema(schema)
        except SchemaError as exc:
            raise InvalidSchema(f"Invalid schema: {exc.message} (at {_pointer(exc.absolute_path)})") from None
        root = Resource.from_contents(schema, default_specification=DRAFT7)
        base = root.id() or ""
        registry: Registry = Registry()
        for name, ref_type, ref_text in references:
            if ref_type != JSON:
                raise InvalidSchema(f"Invalid schema: a JSON schema cannot reference a {ref_type} schema ({name})")
            resource = Resource.from_contents(_load(ref_text), default_specification=DRAFT7)
            registry = registry.with_resource(name, resource)
            if base:
                from urllib.parse import urljoin

                registry = registry.with_resource(urljoin(base, name), resource)
        registry = registry.with_resource(base, root)
        resolver = registry.resolver(base_uri=base)
        _check_refs(schema, resolver)
        return ParsedJsonSchema(schema, resolver)

    @staticmethod
    def can_read(reader: object, writer: object) -> list[str]:
        assert isinstance(reader, ParsedJsonSchema) and isinstance(writer, ParsedJsonSchema)
        return [f"{kind} at {path}" for kind, path in differences(writer, reader) if kind not in COMPATIBLE_CHANGES]


def differences(original: ParsedJsonSchema, update: ParsedJsonSchema) -> list[tuple[str, str]]:
    """Every difference from ``original`` (the writer's schema) to ``update`` (the reader's), as
    (Confluent ``Difference.Type`` name, JSON pointer of where, e.g. ``'#/properties/sensor'``).
    The update reads the original's data when all are in ``COMPATIBLE_CHANGES``."""
    ctx = _Context()
    ctx.compare(_node(original.schema, original.resolver), _node(update.schema, update.resolver))
    return ctx.found


# --------------------------------------------------------------------------- parsing


_load = load_json_schema


def _pointer(path: Iterator[Any] | Sequence[Any]) -> str:
    return "#/" + "/".join(str(p) for p in path)


def _check_refs(schema: object, resolver: Resolver) -> None:
    """Resolve every ``$ref`` under ``schema``, each against the base URI of where it is (``$id`` s
    nested in ``schema`` move it).

    Raises:
        InvalidSchema: a ``$ref`` resolves to nothing.
    """
    from referencing.exceptions import Unresolvable

    if isinstance(schema, list):
        for item in schema:
            _check_refs(item, resolver)
        return
    if not isinstance(schema, dict):
        return
    if isinstance(schema.get("$id"), str):
        from referencing.jsonschema import DRAFT7

        resolver = resolver.in_subresource(DRAFT7.create_resource(schema))
    if isinstance(schema.get("$ref"), str):
        try:
            resolver.lookup(schema["$ref"])
        except Unresolvable:
            raise InvalidSchema(f"Invalid schema: $ref {schema['$ref']!r} resolves to nothing") from None
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            for sub in value.values():  # its keys are names ("enum" may be a property), its values schemas
                _check_refs(sub, resolver)
        elif key not in _NOT_SCHEMAS:
            _check_refs(value, resolver)


# --------------------------------------------------------------------------- the model


@dataclass(eq=False)
class _Node:
    """One schema as Confluent's parser sees it (module docstring): ``kind`` is ``empty`` (``true``,
    ``{}``), ``false``, ``null``, ``boolean``, ``string``, ``number`` (``integer``: ``number`` with
    ``integer``), ``object``, ``array``, ``enum``, ``const``, ``not`` or ``combined`` (``criterion``
    ``allOf``/``anyOf``/``oneOf`` over ``members``). ``keywords``: the schema object it was read from
    (a part of an ``allOf`` made of several kinds shares it with its siblings)."""

    kind: str
    keywords: dict
    resolver: Resolver = field(repr=False)
    integer: bool = False
    criterion: str = ""
    members: Callable[[], list[_Node]] | None = field(default=None, repr=False)
    raw_members: list[object] = field(default_factory=list, repr=False)

    @property
    def key(self) -> tuple[int, str, str, bool]:
        return (id(self.keywords), self.kind, self.criterion, self.integer)

    def sub(self, schema: object) -> _Node:
        return _node(schema, self.resolver)

    def get(self, name: str) -> Any:
        return self.keywords.get(name)


def _node(schema: object, resolver: Resolver) -> _Node:
    """The ``_Node`` of ``schema`` (its ``$ref`` s followed)."""
    for _ in range(_MAX_REF_CHAIN):
        if isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
            resolved = resolver.lookup(schema["$ref"])
            schema, resolver = resolved.contents, resolved.resolver
        else:
            break
    else:
        raise InvalidSchema("Invalid schema: a $ref chain that does not end")
    if schema is True or schema is False:
        return _Node("empty" if schema else "false", {}, resolver)
    if not isinstance(schema, dict):
        raise InvalidSchema(f"Invalid schema: {json.dumps(schema)} is not a schema")
    if isinstance(schema.get("$id"), str):
        from referencing.jsonschema import DRAFT7

        resolver = resolver.in_subresource(DRAFT7.create_resource(schema))
    parts: list[_Node] = []
    types = schema.get("type")
    if isinstance(types, list):
        typed = [_typed(t, schema, resolver) for t in types]
        parts.append(_combined("anyOf", schema, resolver, lambda: typed, list(types)))
    elif isinstance(types, str):
        parts.append(_typed(types, schema, resolver))
    else:
        parts += [_Node(kind, schema, resolver) for kind, words in _KIND_KEYWORDS.items()
                  if any(w in schema for w in words)]
    if "enum" in schema:
        parts.append(_Node("enum", schema, resolver))
    if "const" in schema:
        parts.append(_Node("const", schema, resolver))
    if "not" in schema:
        parts.append(_Node("not", schema, resolver))
    for criterion in ("allOf", "anyOf", "oneOf"):
        members = schema.get(criterion)
        if isinstance(members, list):
            parts.append(_combined(criterion, schema, resolver, partial(_nodes, members, resolver), members))
    if not parts:
        return _Node("empty", schema, resolver)
    if len(parts) == 1:
        return parts[0]
    return _combined("allOf", schema, resolver, lambda: parts, [p.kind for p in parts])


def _nodes(schemas: list[object], resolver: Resolver) -> list[_Node]:
    return [_node(s, resolver) for s in schemas]


def _typed(type_name: object, schema: dict, resolver: Resolver) -> _Node:
    kind = _TYPES.get(type_name) if isinstance(type_name, str) else None
    if kind is None:
        raise InvalidSchema(f"Invalid schema: unknown type {type_name!r}")
    return _Node(kind, schema, resolver, integer=type_name == "integer")


def _combined(criterion: str, schema: dict, resolver: Resolver, members: Callable[[], list[_Node]],
              raw: list[object]) -> _Node:
    return _Node("combined", schema, resolver, criterion=criterion, members=members, raw_members=raw)


def _has_default(schema: object) -> bool:
    return isinstance(schema, dict) and "default" in schema


def _schema_or_none(node: _Node, value: object) -> _Node | None:
    return None if value is None else node.sub(value)


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# --------------------------------------------------------------------------- the diff


class _Context:
    """Collects (difference type, path); ``compare`` is Confluent's ``SchemaDiff.compare``."""

    def __init__(self, path: tuple[str, ...] = (), stack: set | None = None) -> None:
        self.found: list[tuple[str, str]] = []
        self.path = list(path)
        self.stack: set = set() if stack is None else stack

    def add(self, kind: str, *where: str) -> None:
        self.found.append((kind, "#/" + "/".join([*self.path, *where])))

    def sub(self) -> _Context:
        return _Context(tuple(self.path), self.stack)

    def merge(self, other: _Context) -> None:
        self.found += other.found

    @property
    def compatible(self) -> bool:
        return all(kind in COMPATIBLE_CHANGES for kind, _ in self.found)

    @contextmanager
    def at(self, *where: str) -> Iterator[None]:
        self.path += where
        try:
            yield
        finally:
            del self.path[len(self.path) - len(where):]

    def compare(self, original: _Node | None, update: _Node | None) -> None:
        if original is None and update is None:
            return
        if original is None:
            self.add("SCHEMA_ADDED")
            return
        if update is None:
            self.add("SCHEMA_REMOVED")
            return
        pair = (original.key, update.key)
        if pair in self.stack:  # a recursive schema met again on this path: taken as compatible
            return
        self.stack.add(pair)
        try:
            self._compare_types(original, update)
        finally:
            self.stack.discard(pair)

    def _compare_types(self, original: _Node, update: _Node) -> None:
        if original.kind != "combined" and update.kind == "combined":
            assert update.members is not None
            members = update.members()
            if len(members) == 1:
                if self._absorbed(original, members[0]):
                    return
            elif update.criterion in ("anyOf", "oneOf"):
                for member in members:
                    if self._absorbed(original, member, "SUM_TYPE_EXTENDED"):
                        return
        elif original.kind == "combined" and update.kind != "combined":
            assert original.members is not None
            members = original.members()
            if len(members) == 1:
                if self._absorbed(members[0], update):
                    return
            elif original.criterion == "allOf":
                for member in members:
                    if self._absorbed(member, update, "PRODUCT_TYPE_NARROWED"):
                        return
        if original.kind != update.kind:
            if original.kind == "false" or update.kind == "empty":
                return
            if original.get("connect.type") == "bytes" == update.get("connect.type"):
                return
            self.add("TYPE_CHANGED")
            return
        for word, kind in (("$id", "ID_CHANGED"), ("title", "TITLE_CHANGED"),
                           ("description", "DESCRIPTION_CHANGED"), ("default", "DEFAULT_CHANGED")):
            if original.get(word) != update.get(word):
                self.add(kind)
        compare = getattr(self, f"_{original.kind}", None)
        if compare is not None:
            compare(original, update)

    def _absorbed(self, original: _Node, update: _Node, extra: str = "") -> bool:
        sub = self.sub()
        sub.compare(original, update)
        if not sub.compatible:
            return False
        self.merge(sub)
        if extra:
            self.add(extra)
        return True

    def _bound(self, word: str, name: str, original: object, update: object, *, exact: bool = False) -> None:
        """``<NAME>_ADDED``/``_REMOVED``/``_INCREASED``/``_DECREASED`` for a numeric keyword."""
        if not isinstance(original, int | float) or isinstance(original, bool):
            original = None
        if not isinstance(update, int | float) or isinstance(update, bool):
            update = None
        if original == update:
            return
        if original is None:
            self.add(f"{name}_ADDED", word)
        elif update is None:
            self.add(f"{name}_REMOVED", word)
        elif original < update:
            self.add(f"{name}_INCREASED", word)
        else:
            self.add(f"{name}_DECREASED", word)

    # -- per kind

    def _string(self, original: _Node, update: _Node) -> None:
        self._bound("maxLength", "MAX_LENGTH", original.get("maxLength"), update.get("maxLength"))
        self._bound("minLength", "MIN_LENGTH", original.get("minLength"), update.get("minLength"))
        before, after = original.get("pattern"), update.get("pattern")
        if before is None and after is not None:
            self.add("PATTERN_ADDED", "pattern")
        elif before is not None and after is None:
            self.add("PATTERN_REMOVED", "pattern")
        elif before != after:
            self.add("PATTERN_CHANGED", "pattern")

    def _number(self, original: _Node, update: _Node) -> None:
        for word, name in (("maximum", "MAXIMUM"), ("minimum", "MINIMUM"),
                           ("exclusiveMaximum", "EXCLUSIVE_MAXIMUM"), ("exclusiveMinimum", "EXCLUSIVE_MINIMUM")):
            self._bound(word, name, original.get(word), update.get(word))
        before, after = _fraction(original.get("multipleOf")), _fraction(update.get("multipleOf"))
        if before != after:
            if before is None:
                self.add("MULTIPLE_OF_ADDED", "multipleOf")
            elif after is None:
                self.add("MULTIPLE_OF_REMOVED", "multipleOf")
            elif before and (after / before).denominator == 1:
                self.add("MULTIPLE_OF_EXPANDED", "multipleOf")
            elif after and (before / after).denominator == 1:
                self.add("MULTIPLE_OF_REDUCED", "multipleOf")
            else:
                self.add("MULTIPLE_OF_CHANGED", "multipleOf")
        if original.integer != update.integer:
            self.add("TYPE_EXTENDED" if original.integer else "TYPE_NARROWED")

    def _enum(self, original: _Node, update: _Node) -> None:
        before = {_canonical(v) for v in original.get("enum") or ()}
        after = {_canonical(v) for v in update.get("enum") or ()}
        if before != after:
            self.add("ENUM_ARRAY_EXTENDED" if after >= before else
                     "ENUM_ARRAY_NARROWED" if after <= before else "ENUM_ARRAY_CHANGED", "enum")

    def _const(self, original: _Node, update: _Node) -> None:
        if _canonical(original.get("const")) != _canonical(update.get("const")):
            self.add("ENUM_ARRAY_CHANGED", "const")

    def _not(self, original: _Node, update: _Node) -> None:
        with self.at("not"):
            sub = self.sub()
            sub.compare(update.sub(update.get("not")), original.sub(original.get("not")))  # reversed
            self.add("NOT_TYPE_NARROWED" if sub.compatible else "NOT_TYPE_EXTENDED")

    def _combined(self, original: _Node, update: _Node) -> None:
        before, after = original.criterion, update.criterion
        assert original.members is not None and update.members is not None
        originals, updates = _distinct(original), _distinct(update)
        if before != after:
            single = (len(original.raw_members) == 1, len(update.raw_members) == 1)
            if (after == "anyOf" or all(single) or (single[0] and after == "oneOf")
                    or (single[1] and before == "allOf")):
                self.add("COMBINED_TYPE_EXTENDED")
            else:
                self.add("COMBINED_TYPE_CHANGED")
                return
        if len(originals) < len(updates):
            self.add("PRODUCT_TYPE_EXTENDED" if after == "allOf" else "SUM_TYPE_EXTENDED")
        elif len(originals) > len(updates):
            self.add("SUM_TYPE_NARROWED" if before in ("anyOf", "oneOf") else "PRODUCT_TYPE_NARROWED")
        edges: dict[int, dict[int, list[tuple[str, str]]]] = {}
        for i, o in enumerate(originals):
            with self.at(f"{before}", str(i)):
                for j, u in enumerate(updates):
                    sub = self.sub()
                    sub.compare(o, u)
                    if sub.compatible:
                        edges.setdefault(i, {})[j] = sub.found
        matching = _maximum_matching({i: list(js) for i, js in edges.items()})
        for j, i in sorted(matching.items()):
            self.found += edges[i][j]
        if len(matching) < min(len(originals), len(updates)):
            self.add("COMBINED_TYPE_SUBSCHEMAS_CHANGED")

    def _object(self, original: _Node, update: _Node) -> None:
        o_props: dict = original.get("properties") or {}
        u_props: dict = update.get("properties") or {}
        o_required = set(original.get("required") or ())
        u_required = set(update.get("required") or ())
        with self.at("required"):
            for name in o_props:
                if name in u_props and (name in o_required) != (name in u_required):
                    if name in o_required:
                        self.add("REQUIRED_ATTRIBUTE_REMOVED", name)
                    else:
                        self.add("REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED" if _has_default(u_props[name])
                                 else "REQUIRED_ATTRIBUTE_ADDED", name)
        with self.at("properties"):
            for name in sorted(set(o_props) | set(u_props)):
                with self.at(name):
                    self._property(original, update, name, o_props, u_props, u_required)
        with self.at("dependencies"):
            self._dependencies(original, update)
        with self.at("additionalProperties"):
            self._additional(original, update, "additionalProperties", "ADDITIONAL_PROPERTIES")
        self._unevaluated(original, update, "unevaluatedProperties", "UNEVALUATED_PROPERTIES")
        self._bound("maxProperties", "MAX_PROPERTIES", original.get("maxProperties"), update.get("maxProperties"))
        self._bound("minProperties", "MIN_PROPERTIES", original.get("minProperties"), update.get("minProperties"))

    def _property(self, original: _Node, update: _Node, name: str, o_props: dict, u_props: dict,
                  u_required: set) -> None:
        if name not in u_props:
            was = original.sub(o_props[name])
            if _open(update, "additionalProperties", "unevaluatedProperties"):
                self.add("PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL")
                return
            covering = _partial_properties(update, name)
            if covering is not None:
                sub = self.sub()
                sub.compare(was, covering)
                self.merge(sub)
                self.add("PROPERTY_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" if sub.compatible
                         else "PROPERTY_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL")
            elif was.kind == "false":
                self.add("PROPERTY_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL")
            else:
                self.add("PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL")
            return
        now = update.sub(u_props[name])
        if name in o_props:
            self.compare(original.sub(o_props[name]), now)
            return
        required, default = name in u_required, _has_default(u_props[name])
        if _open(original, "additionalProperties", "unevaluatedProperties"):
            if now.kind == "empty":
                self.add("PROPERTY_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL")
            elif required:
                self.add("REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_OPEN_CONTENT_MODEL" if default
                         else "REQUIRED_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL")
            else:
                self.add("OPTIONAL_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL")
            return
        covering = _partial_properties(original, name)
        if covering is not None:
            sub = self.sub()
            sub.compare(covering, now)
            self.merge(sub)
            self.add("PROPERTY_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" if sub.compatible
                     else "PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL")
        if required:
            self.add("REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_UNOPEN_CONTENT_MODEL" if default
                     else "REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL")
        else:
            self.add("OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL")

    def _dependencies(self, original: _Node, update: _Node) -> None:
        o_arrays, o_schemas = _dependencies(original)
        u_arrays, u_schemas = _dependencies(update)
        for name in sorted(set(o_arrays) | set(u_arrays)):
            before, after = o_arrays.get(name), u_arrays.get(name)
            if after is None:
                self.add("DEPENDENCY_ARRAY_REMOVED", name)
            elif before is None:
                self.add("DEPENDENCY_ARRAY_ADDED", name)
            elif before != after:
                self.add("DEPENDENCY_ARRAY_EXTENDED" if after >= before else
                         "DEPENDENCY_ARRAY_NARROWED" if after <= before else "DEPENDENCY_ARRAY_CHANGED", name)
        for name in sorted(set(o_schemas) | set(u_schemas)):
            if name not in u_schemas:
                self.add("DEPENDENCY_SCHEMA_REMOVED", name)
            elif name not in o_schemas:
                self.add("DEPENDENCY_SCHEMA_ADDED", name)
            else:
                with self.at(name):
                    self.compare(original.sub(o_schemas[name]), update.sub(u_schemas[name]))

    def _additional(self, original: _Node, update: _Node, word: str, name: str) -> None:
        """additionalProperties / additionalItems: allowed at all, then their schemas."""
        o_allows, u_allows = original.get(word) is not False, update.get(word) is not False
        o_schema, u_schema = _additional_schema(original, word), _additional_schema(update, word)
        if o_allows != u_allows:
            self.add(f"{name}_ADDED" if u_allows else f"{name}_REMOVED")
        elif o_schema is None and u_schema is not None:
            self.add(f"{name}_NARROWED")
        elif u_schema is None and o_schema is not None:
            self.add(f"{name}_EXTENDED")
        else:
            self.compare(o_schema, u_schema)

    def _unevaluated(self, original: _Node, update: _Node, word: str, name: str) -> None:
        before, after = original.get(word), update.get(word)
        if before is None and after is None:
            return
        with self.at(word):
            if before is None:
                self.add(f"{name}_REMOVED" if _is_false(after) else f"{name}_NARROWED")
            elif after is None:
                self.add(f"{name}_ADDED" if _is_false(before) else f"{name}_EXTENDED")
            elif _is_false(before) and not _is_false(after):
                self.add(f"{name}_ADDED")
            elif not _is_false(before) and _is_false(after):
                self.add(f"{name}_REMOVED")
            elif _is_empty(before) and not _is_empty(after):
                self.add(f"{name}_NARROWED")
            elif not _is_empty(before) and _is_empty(after):
                self.add(f"{name}_EXTENDED")
            else:
                self.compare(original.sub(before), update.sub(after))

    def _array(self, original: _Node, update: _Node) -> None:
        with self.at("items"):
            self.compare(_schema_or_none(original, _all_items(original)), _schema_or_none(update, _all_items(update)))
        self._items(original, update)
        with self.at("additionalItems"):
            self._additional(original, update, _additional_items_word(original), "ADDITIONAL_ITEMS")
        self._unevaluated(original, update, "unevaluatedItems", "UNEVALUATED_ITEMS")
        self._bound("maxItems", "MAX_ITEMS", original.get("maxItems"), update.get("maxItems"))
        self._bound("minItems", "MIN_ITEMS", original.get("minItems"), update.get("minItems"))
        if bool(original.get("uniqueItems")) != bool(update.get("uniqueItems")):
            self.add("UNIQUE_ITEMS_REMOVED" if original.get("uniqueItems") else "UNIQUE_ITEMS_ADDED", "uniqueItems")
        self._bound("maxContains", "MAX_CONTAINS", original.get("maxContains"), update.get("maxContains"))
        self._bound("minContains", "MIN_CONTAINS", original.get("minContains"), update.get("minContains"))

    def _items(self, original: _Node, update: _Node) -> None:
        """The tuple form: position by position, then the positions only one side has."""
        before, after = _item_list(original), _item_list(update)
        for index in range(max(len(before), len(after))):
            with self.at("items", str(index)):
                if index < len(before) and index < len(after):
                    self.compare(original.sub(before[index]), update.sub(after[index]))
                elif index < len(before):
                    was = original.sub(before[index])
                    if _open(update, _additional_items_word(update), "unevaluatedItems"):
                        self.add("ITEM_REMOVED_FROM_OPEN_CONTENT_MODEL")
                    elif (covering := _partial_items(update)) is not None:
                        sub = self.sub()
                        sub.compare(was, covering)
                        self.merge(sub)
                        self.add("ITEM_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" if sub.compatible
                                 else "ITEM_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL")
                    else:
                        self.add("ITEM_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL" if was.kind == "false"
                                 else "ITEM_REMOVED_FROM_CLOSED_CONTENT_MODEL")
                else:
                    now = update.sub(after[index])
                    if _open(original, _additional_items_word(original), "unevaluatedItems"):
                        self.add("ITEM_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL" if now.kind == "empty"
                                 else "ITEM_ADDED_TO_OPEN_CONTENT_MODEL")
                    elif (covering := _partial_items(original)) is not None:
                        sub = self.sub()
                        sub.compare(covering, now)
                        self.merge(sub)
                        self.add("ITEM_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" if sub.compatible
                                 else "ITEM_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL")
                    else:
                        self.add("ITEM_ADDED_TO_CLOSED_CONTENT_MODEL")


# --------------------------------------------------------------------------- content models


def _is_false(value: object) -> bool:
    return value is False


def _is_empty(value: object) -> bool:
    return value is True or value == {}


def _fraction(value: object) -> Fraction | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return Fraction(str(value))


def _additional_schema(node: _Node, word: str) -> _Node | None:
    """The schema of ``additionalProperties``/``additionalItems`` when it is one (not a boolean)."""
    value = node.get(word)
    return node.sub(value) if isinstance(value, dict) else None


def _open(node: _Node, additional: str, unevaluated: str) -> bool:
    """Fully open: anything more is allowed (``additional*`` absent or true, no pattern properties,
    ``unevaluated*`` absent or true) (Confluent ``isOpenContentModel``)."""
    if node.get(additional) is False or isinstance(node.get(additional), dict):
        return False
    if additional == "additionalProperties" and node.get("patternProperties"):
        return False
    uneval = node.get(unevaluated)
    return uneval is None or _is_empty(uneval)


def _partial_properties(node: _Node, name: str) -> _Node | None:
    """The schema a property ``name`` not in ``properties`` must match, when the model is partially
    open: a matching ``patternProperties`` schema, the ``additionalProperties`` schema, or the
    ``unevaluatedProperties`` schema (Confluent ``schemaFromPartiallyOpenContentModel``)."""
    for pattern, schema in (node.get("patternProperties") or {}).items():
        if re.search(pattern, name):
            return node.sub(schema)
    return _partial(node, "additionalProperties", "unevaluatedProperties")


def _partial_items(node: _Node) -> _Node | None:
    return _partial(node, _additional_items_word(node), "unevaluatedItems")


def _partial(node: _Node, additional: str, unevaluated: str) -> _Node | None:
    found = _additional_schema(node, additional)
    if found is not None:
        return found
    uneval = node.get(unevaluated)
    if node.get(additional) is not False and uneval is not None and not _is_false(uneval) and not _is_empty(uneval):
        return node.sub(uneval)
    return None


def _item_list(node: _Node) -> list:
    """The tuple form's schemas: ``prefixItems`` (2020-12), else ``items`` when it is a list."""
    prefix = node.get("prefixItems")
    if isinstance(prefix, list):
        return prefix
    items = node.get("items")
    return items if isinstance(items, list) else []


def _all_items(node: _Node) -> object:
    """The one schema every item matches (``items`` as a schema; with ``prefixItems`` it is the
    additional items' schema instead)."""
    items = node.get("items")
    return None if isinstance(items, list) or isinstance(node.get("prefixItems"), list) else items


def _additional_items_word(node: _Node) -> str:
    return "items" if isinstance(node.get("prefixItems"), list) else "additionalItems"


def _dependencies(node: _Node) -> tuple[dict[str, frozenset[str]], dict[str, object]]:
    """(property -> the properties it requires, property -> the schema it requires), from
    ``dependencies`` and 2019-09's ``dependentRequired``/``dependentSchemas``."""
    arrays: dict[str, frozenset[str]] = {}
    schemas: dict[str, object] = {}
    for word in ("dependencies", "dependentRequired", "dependentSchemas"):
        for name, value in (node.get(word) or {}).items():
            if isinstance(value, list):
                arrays[name] = frozenset(value)
            else:
                schemas[name] = value
    return arrays, schemas


def _distinct(node: _Node) -> list[_Node]:
    """A combined schema's members, duplicates (the same canonical text) once."""
    assert node.members is not None
    seen: set[str] = set()
    out: list[_Node] = []
    for raw, member in zip(node.raw_members, node.members(), strict=True):
        text = _canonical(raw) if not isinstance(raw, str) else f"part:{raw}:{len(out)}"
        if text not in seen:
            seen.add(text)
            out.append(member)
    return out


def _maximum_matching(edges: dict[int, list[int]]) -> dict[int, int]:
    """A maximum matching of a bipartite graph (left -> its right neighbours), as right -> left:
    Kuhn's augmenting paths (the members of a combined schema are few)."""
    match: dict[int, int] = {}

    def augment(left: int, seen: set[int]) -> bool:
        for right in edges.get(left, ()):
            if right in seen:
                continue
            seen.add(right)
            if right not in match or augment(match[right], seen):
                match[right] = left
                return True
        return False

    for left in edges:
        augment(left, set())
    return match
