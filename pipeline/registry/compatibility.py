"""Compatibility levels and checks of the Schema Registry (Confluent's rules).

A level says which earlier versions of a subject a new schema is checked against and
in which direction (Confluent "Schema Evolution and Compatibility"):

- ``BACKWARD`` (the default): the new schema reads data written with the latest version;
  ``BACKWARD_TRANSITIVE``: with every version.
- ``FORWARD``: the latest version reads data written with the new schema;
  ``FORWARD_TRANSITIVE``: every version does.
- ``FULL`` / ``FULL_TRANSITIVE``: both; ``NONE``: no check.

Each schema type is one ``SchemaKind`` (its canonical text, its parser, its reader/writer
check), looked up by its Confluent name in ``kind``. Avro's is here: it is checked with Apache
Avro's own ``ReaderWriterCompatibilityChecker`` (the Python port of Java's
``SchemaCompatibility``, which Confluent's ``AvroSchema.isBackwardCompatible`` uses). Schemas
are parsed with their references resolved: the referenced subjects' schemas are parsed first
into the same set of names.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ("AVRO", "DEFAULT_LEVEL", "LEVELS", "SCHEMA_TYPES", "InvalidSchema", "ParsedSchema", "Reference",
           "SchemaKind", "canonical", "check", "kind", "parse")

AVRO = "AVRO"

Reference = tuple[str, str, str]
"""A resolved reference: (its ``name`` as the referencing schema imports it, e.g. an Avro full
name or a ``.proto`` file name; the referenced schema's type; its text)."""

LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE")
DEFAULT_LEVEL = "BACKWARD"
"""Confluent's default compatibility level (``schema.compatibility.level``)."""


class InvalidSchema(ValueError):
    """The text is not a valid schema of its type, or a reference cannot be resolved (Confluent 42201)."""


@dataclass(frozen=True, slots=True)
class ParsedSchema:
    """A schema parsed with its references (``schema``: the type's own object, e.g. avro's ``Schema``)."""

    schema_type: str
    schema: object


class SchemaKind(Protocol):
    """What the registry needs of one schema type (a module, e.g. ``pipeline.registry.avro_kind``)."""

    def canonical(self, text: str) -> str:
        """The text two registrations of the same schema share. Raises ``InvalidSchema``."""
        ...

    def parse(self, text: str, references: Sequence[Reference]) -> object:
        """The type's own parsed object of ``text`` with ``references`` (dependencies first).
        Raises ``InvalidSchema``."""
        ...

    def can_read(self, reader: object, writer: object) -> list[str]:
        """Why data written with ``writer`` cannot be read with ``reader`` ([] if it can)."""
        ...


class _Avro:
    """Avro (Apache Avro 1.11 ``avro`` package: parser and ``ReaderWriterCompatibilityChecker``)."""

    @staticmethod
    def canonical(text: str) -> str:
        """Compact JSON with sorted object keys (field order, which is in arrays, is kept; so are
        defaults and docs, which Avro's Parsing Canonical Form would drop though they change what a
        reader does)."""
        try:
            return json.dumps(json.loads(text), separators=(",", ":"), sort_keys=True)
        except ValueError as exc:
            raise InvalidSchema(f"Invalid schema: {exc}") from exc

    @staticmethod
    def parse(text: str, references: Sequence[Reference]) -> object:
        import avro.errors
        import avro.name
        import avro.schema

        names = avro.name.Names()
        try:
            for _, ref_type, ref_text in references:
                if ref_type != AVRO:
                    raise InvalidSchema(f"Invalid schema: an Avro schema cannot reference a {ref_type} schema")
                avro.schema.make_avsc_object(json.loads(ref_text), names)
            return avro.schema.make_avsc_object(json.loads(text), names)
        except (avro.errors.AvroException, ValueError, TypeError, AttributeError) as exc:
            raise InvalidSchema(f"Invalid schema: {exc}") from exc

    @staticmethod
    def can_read(reader: object, writer: object) -> list[str]:
        from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

        result = ReaderWriterCompatibilityChecker().get_compatibility(reader, writer)  # type: ignore[arg-type]
        if result.compatibility is SchemaCompatibilityType.compatible:
            return []
        locations = sorted(result.locations)
        return [f"{m} (at {', '.join(locations)})" if locations else m for m in sorted(result.messages)] or [
            "incompatible"]


_KINDS: dict[str, SchemaKind] = {AVRO: _Avro()}
SCHEMA_TYPES = tuple(_KINDS)
"""Schema types this registry parses and checks (Confluent's ``/schemas/types``), each with a
``SchemaKind`` in ``kind``; another type is refused with 42201."""


def kind(schema_type: str) -> SchemaKind:
    """The ``SchemaKind`` of ``schema_type`` (one of ``SCHEMA_TYPES``).

    Raises:
        InvalidSchema: the type is not served (Confluent 42201).
    """
    found = _KINDS.get(schema_type)
    if found is None:
        raise InvalidSchema(f"Invalid schema: schema type {schema_type} is not served by this registry "
                            f"(served: {', '.join(SCHEMA_TYPES)})")
    return found


def canonical(schema_type: str, text: str) -> str:
    """The text two registrations of the same schema share (``SchemaKind.canonical``).

    Raises:
        InvalidSchema: ``text`` is not a schema's text, or ``schema_type`` is not served.
    """
    return kind(schema_type).canonical(text)


def parse(schema_type: str, text: str, references: Sequence[Reference] = ()) -> ParsedSchema:
    """Parse ``text`` of type ``schema_type``; ``references``: every schema it references, directly
    or not, dependencies first.

    Raises:
        InvalidSchema: not a valid schema, or a named type it uses is defined nowhere.
    """
    return ParsedSchema(schema_type, kind(schema_type).parse(text, references))


def _can_read(reader: ParsedSchema, writer: ParsedSchema) -> list[str]:
    """Why ``reader`` cannot read data written with ``writer`` ([] if it can)."""
    if reader.schema_type != writer.schema_type:
        return [f"schema type {reader.schema_type} cannot read {writer.schema_type}"]
    return kind(reader.schema_type).can_read(reader.schema, writer.schema)


def check(level: str, new: ParsedSchema, previous: Sequence[ParsedSchema]) -> list[str]:
    """Whether ``new`` may follow ``previous`` (a subject's live versions, oldest first) under
    ``level``: the reasons it may not, [] if it may.

    Raises:
        ValueError: ``level`` is not one of ``LEVELS``.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown compatibility level {level}")
    if level == "NONE" or not previous:
        return []
    against = previous if level.endswith("_TRANSITIVE") else previous[-1:]
    checks: list[Callable[[ParsedSchema], list[str]]] = []
    if level.startswith(("BACKWARD", "FULL")):
        checks.append(lambda old: _can_read(new, old))
    if level.startswith(("FORWARD", "FULL")):
        checks.append(lambda old: _can_read(old, new))
    reasons: list[str] = []
    for old in reversed(against):
        for one in checks:
            reasons += one(old)
    return reasons
