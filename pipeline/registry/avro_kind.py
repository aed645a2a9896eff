"""Avro schemas in the registry: Apache Avro's own parser and ``ReaderWriterCompatibilityChecker``
(the Python port of Java's ``SchemaCompatibility``, which Confluent's ``AvroSchema.isBackwardCompatible``
uses). References are Avro named types: each referenced schema is parsed first into the same set of names.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pipeline.registry.schema_kind import InvalidSchema, Reference, canonical_json

__all__ = ("AVRO", "AvroKind")

AVRO = "AVRO"


class AvroKind:
    """Avro (Apache Avro 1.11 ``avro`` package: parser and ``ReaderWriterCompatibilityChecker``)."""

    canonical = staticmethod(canonical_json)

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
