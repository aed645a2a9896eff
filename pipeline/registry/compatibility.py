"""Compatibility levels and checks of the Schema Registry (Confluent's rules).

A level says which earlier versions of a subject a new schema is checked against and
in which direction (Confluent "Schema Evolution and Compatibility"):

- ``BACKWARD`` (the default): the new schema reads data written with the latest version;
  ``BACKWARD_TRANSITIVE``: with every version.
- ``FORWARD``: the latest version reads data written with the new schema;
  ``FORWARD_TRANSITIVE``: every version does.
- ``FULL`` / ``FULL_TRANSITIVE``: both; ``NONE``: no check.

Each schema type is one ``SchemaKind`` (``pipeline.registry.schema_kind``: its canonical text,
its parser, its reader/writer check) in a module of its own (``avro_kind``, ``json_schema_kind``,
``protobuf_kind``), looked up by its
Confluent name in ``kind``. Schemas are parsed with their references resolved: the referenced
subjects' schemas are given first, dependencies before dependents.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipeline.registry.avro_kind import AVRO, AvroKind
from pipeline.registry.json_schema_kind import JSON, JsonSchemaKind
from pipeline.registry.protobuf_kind import PROTOBUF, ProtobufKind
from pipeline.registry.schema_kind import InvalidSchema, Reference, SchemaKind

__all__ = ("AVRO", "DEFAULT_LEVEL", "LEVELS", "PROTOBUF", "SCHEMA_TYPES", "InvalidSchema", "ParsedSchema",
           "Reference", "SchemaKind", "canonical", "check", "formatted", "kind", "parse")

LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE")
DEFAULT_LEVEL = "BACKWARD"
"""Confluent's default compatibility level (``schema.compatibility.level``)."""


@dataclass(frozen=True, slots=True)
class ParsedSchema:
    """A schema parsed with its references (``schema``: the type's own object, e.g. avro's ``Schema``)."""

    schema_type: str
    schema: object


_KINDS: dict[str, SchemaKind] = {AVRO: AvroKind(), JSON: JsonSchemaKind(), PROTOBUF: ProtobufKind()}
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


def formatted(parsed: ParsedSchema, fmt: str) -> str | None:
    """``parsed`` in format ``fmt`` (``GET /schemas/ids/{id}?format=``: Protobuf's ``serialized``), None
    when its kind has no such format (Confluent then answers the registered text)."""
    to_format = getattr(kind(parsed.schema_type), "formatted", None)
    return None if to_format is None else to_format(parsed.schema, fmt)


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
