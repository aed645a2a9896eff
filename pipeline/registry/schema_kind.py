"""What the registry needs of one schema type (Avro, Protobuf, JSON Schema): ``SchemaKind``.

Sans-I/O: a kind parses and compares schema texts; the store and the REST API are elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol

__all__ = ("InvalidSchema", "Reference", "SchemaKind", "canonical_json", "load_json_schema")


class InvalidSchema(ValueError):
    """The text is not a valid schema of its type, or a reference cannot be resolved (Confluent 42201)."""


Reference = tuple[str, str, str]
"""A resolved reference: (its ``name`` as the referencing schema imports it, e.g. an Avro full
name or a ``.proto`` file name; the referenced schema's type; its text)."""


class SchemaKind(Protocol):
    """What the registry needs of one schema type (a module, e.g. ``pipeline.registry.avro_kind``).

    A kind may also have ``formatted(parsed, fmt) -> str | None``: its parsed schema in a format of
    Confluent's ``format`` query parameter (Protobuf's ``serialized``), None for a format it does not
    have (``compatibility.formatted``)."""

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


def canonical_json(text: str) -> str:
    """Compact JSON with sorted object keys: the canonical text of a schema written in JSON (Avro, JSON
    Schema). Array order (Avro's fields) is kept, and so are defaults and docs, which Avro's Parsing
    Canonical Form would drop though they change what a reader does.

    Raises:
        InvalidSchema: ``text`` is not JSON.
    """
    try:
        return json.dumps(json.loads(text), separators=(",", ":"), sort_keys=True)
    except ValueError as exc:
        raise InvalidSchema(f"Invalid schema: {exc}") from exc


def load_json_schema(text: str) -> dict | bool:
    """A JSON Schema's text as its object (or a boolean schema).

    Raises:
        InvalidSchema: not JSON, or neither an object nor a boolean.
    """
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise InvalidSchema(f"Invalid schema: {exc}") from None
    if not isinstance(schema, dict | bool):
        raise InvalidSchema(f"Invalid schema: a JSON schema is an object or a boolean, not {type(schema).__name__}")
    return schema
