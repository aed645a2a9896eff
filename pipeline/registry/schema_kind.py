"""What the registry needs of one schema type (Avro, Protobuf, JSON Schema): ``SchemaKind``.

Sans-I/O: a kind parses and compares schema texts; the store and the REST API are elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ("InvalidSchema", "Reference", "SchemaKind")


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
