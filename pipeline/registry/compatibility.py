"""Compatibility levels and checks of the Schema Registry (Confluent's rules).

A level says which earlier versions of a subject a new schema is checked against and
in which direction (Confluent "Schema Evolution and Compatibility"):

- ``BACKWARD`` (the default): the new schema reads data written with the latest version;
  ``BACKWARD_TRANSITIVE``: with every version.
- ``FORWARD``: the latest version reads data written with the new schema;
  ``FORWARD_TRANSITIVE``: every version does.
- ``FULL`` / ``FULL_TRANSITIVE``: both; ``NONE``: no check.

Avro is checked with Apache Avro's own ``ReaderWriterCompatibilityChecker`` (the Python
port of Java's ``SchemaCompatibility``, which Confluent's ``AvroSchema.isBackwardCompatible``
uses). Schemas are parsed with their references resolved: the referenced subjects'
schemas are parsed first into the same set of names.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ("AVRO", "DEFAULT_LEVEL", "LEVELS", "SCHEMA_TYPES", "InvalidSchema", "ParsedSchema", "canonical",
           "check", "parse")

AVRO = "AVRO"
SCHEMA_TYPES = (AVRO,)
"""Schema types this registry parses and checks (Confluent's ``/schemas/types``). PROTOBUF and
JSON are refused with 42201 until their checks are built."""

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


def canonical(schema_type: str, text: str) -> str:
    """The text two registrations of the same schema share: compact JSON with sorted object keys
    (field order, which is in arrays, is kept; so are defaults and docs, which
    Avro's Parsing Canonical Form would drop though they change what a reader does).

    Raises:
        InvalidSchema: ``text`` is not JSON, or ``schema_type`` is not served.
    """
    _check_type(schema_type)
    try:
        return json.dumps(json.loads(text), separators=(",", ":"), sort_keys=True)
    except ValueError as exc:
        raise InvalidSchema(f"Invalid schema: {exc}") from exc


def parse(schema_type: str, text: str, references: Sequence[tuple[str, str]] = ()) -> ParsedSchema:
    """Parse ``text`` of type ``schema_type``; ``references``: (type, text) of every schema it
    references, directly or not, dependencies first.

    Raises:
        InvalidSchema: not a valid schema, or a named type it uses is defined nowhere.
    """
    _check_type(schema_type)
    import avro.errors
    import avro.name
    import avro.schema

    names = avro.name.Names()
    try:
        for ref_type, ref_text in references:
            if ref_type != AVRO:
                raise InvalidSchema(f"Invalid schema: an Avro schema cannot reference a {ref_type} schema")
            avro.schema.make_avsc_object(json.loads(ref_text), names)
        return ParsedSchema(AVRO, avro.schema.make_avsc_object(json.loads(text), names))
    except (avro.errors.AvroException, ValueError, TypeError, AttributeError) as exc:
        raise InvalidSchema(f"Invalid schema: {exc}") from exc


def _check_type(schema_type: str) -> None:
    if schema_type not in SCHEMA_TYPES:
        raise InvalidSchema(f"Invalid schema: schema type {schema_type} is not served by this registry "
                            f"(served: {', '.join(SCHEMA_TYPES)})")


def _can_read(reader: ParsedSchema, writer: ParsedSchema) -> list[str]:
    """Why ``reader`` cannot read data written with ``writer`` ([] if it can)."""
    if reader.schema_type != writer.schema_type:
        return [f"schema type {reader.schema_type} cannot read {writer.schema_type}"]
    from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

    result = ReaderWriterCompatibilityChecker().get_compatibility(reader.schema, writer.schema)  # type: ignore[arg-type]
    if result.compatibility is SchemaCompatibilityType.compatible:
        return []
    locations = sorted(result.locations)
    return [f"{m} (at {', '.join(locations)})" if locations else m for m in sorted(result.messages)] or [
        "incompatible"]


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
