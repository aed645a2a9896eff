"""The Schema Registry's REST operations, free of HTTP (Confluent Schema Registry API reference).

Each method takes what a request carries (path parts, query flags, the decoded JSON body)
and returns the JSON-able answer, or raises ``RegistryError`` with Confluent's
``error_code`` (its first three digits are the HTTP status: 40401 -> 404). The methods
block (the store's database I/O): the HTTP layer runs them in a worker thread.

Confluent's behaviour kept here, and where it comes from:
- one global id (and GUID, Confluent 8) per distinct schema; registering a schema a subject already has returns
  its id without a new version or a check (``POST /subjects/{subject}/versions``);
- versions count on after deletes (soft-deleted ones included); a permanent delete
  needs a soft delete first (40405);
- a new version is checked against the subject's live versions under its compatibility
  level (the subject's, else the global one, else ``BACKWARD``); refused: 409;
- modes READWRITE, READONLY and READONLY_OVERRIDE; a write in a read-only mode: 42205.
  IMPORT (registering with given ids) is not served: 42204.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pipeline.registry import compatibility
from pipeline.registry.compatibility import DEFAULT_LEVEL, LEVELS, InvalidSchema, ParsedSchema
from pipeline.registry.store import GLOBAL, Reference, SchemaRecord, SchemaStore, SubjectVersion, fingerprint

__all__ = ("MODES", "RegistryError", "SchemaRegistry")

MODES = ("READWRITE", "READONLY", "READONLY_OVERRIDE")
"""The modes served (Confluent ``/mode``); IMPORT is refused."""

_MAX_VERSION = 2**31 - 1


class RegistryError(Exception):
    """A refused request: Confluent's ``error_code`` and ``message`` (``{"error_code": .., "message": ..}``)."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message

    @property
    def status(self) -> int:
        """The HTTP status: the error code's first three digits (Confluent's ``RestException``)."""
        code = self.error_code
        while code >= 1000:
            code //= 10
        return code

    def to_json(self) -> dict[str, object]:
        return {"error_code": self.error_code, "message": self.message}


def _subject_not_found(subject: str) -> RegistryError:
    return RegistryError(40401, f"Subject '{subject}' not found.")


def _version_not_found(subject: str, version: object) -> RegistryError:
    return RegistryError(40402, f"Version {version} not found.")


def _schema_not_found(detail: str = "Schema not found") -> RegistryError:
    return RegistryError(40403, detail)


def _invalid(message: str) -> RegistryError:
    return RegistryError(42201, message)


class SchemaRegistry:
    """Confluent's REST operations over a ``SchemaStore``.

    ``schema_by_id`` answers from memory once an id was read (ids never change what they name);
    everything else reads the store, so several brokers over one database agree.
    """

    def __init__(self, store: SchemaStore) -> None:
        self.store = store
        self._by_id: dict[int, SchemaRecord] = {}

    # -- schemas by id

    def record(self, schema_id: int) -> SchemaRecord:
        """The schema with id ``schema_id`` (cached). Raises ``RegistryError`` 40403."""
        record = self._by_id.get(schema_id)
        if record is None:
            record = self.store.schema(schema_id)
            if record is None:
                raise _schema_not_found()
            self._by_id[schema_id] = record
        return record

    def schema_by_id(self, schema_id: int, fmt: str | None = None) -> dict[str, object]:
        """``GET /schemas/ids/{id}[?format=fmt]``."""
        record = self.record(schema_id)
        return self._formatted(_schema_json(record), record, fmt)

    def schema_by_guid(self, guid: str, fmt: str | None = None) -> dict[str, object]:
        """``GET /schemas/guids/{guid}[?format=fmt]`` (Confluent 8). Raises 40403."""
        record = self.store.schema_by_guid(guid)
        if record is None:
            raise _schema_not_found()
        return self._formatted(_schema_json(record), record, fmt)

    def schema_versions(self, schema_id: int) -> list[dict[str, object]]:
        """``GET /schemas/ids/{id}/versions``: the (subject, version) pairs that are this schema."""
        self.record(schema_id)
        return [{"subject": s, "version": v} for s, v in self.store.uses(schema_id)]

    def schema_types(self) -> list[str]:
        """``GET /schemas/types``."""
        return list(compatibility.SCHEMA_TYPES)

    # -- subjects

    def subjects(self, deleted: bool = False) -> list[str]:
        """``GET /subjects``."""
        return self.store.subjects(deleted)

    def versions(self, subject: str, deleted: bool = False) -> list[int]:
        """``GET /subjects/{subject}/versions``. Raises 40401."""
        versions = self.store.versions(subject, deleted)
        if not versions:
            raise _subject_not_found(subject)
        return [v.version for v in versions]

    def version(self, subject: str, version: str | int, deleted: bool = False,
                fmt: str | None = None) -> dict[str, object]:
        """``GET /subjects/{subject}/versions/{version}[?format=fmt]`` (``latest`` or -1: the newest
        live one). Raises 40401, 40402, 42202."""
        v = self._version(subject, version, deleted)
        return self._formatted(_version_json(v), v.record, fmt)

    def referenced_by(self, subject: str, version: str | int) -> list[int]:
        """``GET /subjects/{subject}/versions/{version}/referencedby``: ids of the schemas that reference it."""
        v = self._version(subject, version)
        return self.store.referenced_by(subject, v.version)

    def register(self, subject: str, body: Mapping[str, Any]) -> dict[str, object]:
        """``POST /subjects/{subject}/versions``: the schema's id, registering it as the subject's
        next version if it is not one of its live versions already.

        Raises:
            RegistryError: 42201 invalid schema or reference, 409 incompatible, 42205 read-only mode,
                42204 an id or version given (IMPORT mode is not served).
        """
        if body.get("id") is not None or body.get("version") is not None:
            raise RegistryError(42204, "Registering a schema with a given id or version needs IMPORT mode, "
                                       "which this registry does not serve")
        self._writable(subject)
        schema_type, text, references = self._request_schema(body)
        parsed = self._parse(schema_type, text, references)
        fp = fingerprint(schema_type, compatibility.canonical(schema_type, text), references)
        level = self.compatibility_level(subject)
        with self.store.registration() as reg:
            history = reg.versions(subject)
            live = [v for v in history if not v.deleted]
            existing = next((v for v in live if _fingerprint(v.record) == fp), None)
            if existing is not None:
                return {"id": existing.record.id, "guid": existing.record.guid}
            # references read in this transaction: the store's own reads would wait for it to end
            reasons = compatibility.check(level, parsed, [self._parse_record(v.record, reg.versions) for v in live])
            if reasons:
                raise RegistryError(409, f"Schema being registered is incompatible with an earlier schema for "
                                         f"subject \"{subject}\", details: {reasons}")
            schema_id, guid = reg.schema_id(schema_type, text, fp, references)
            reg.add_version(subject, schema_id)
        return {"id": schema_id, "guid": guid}

    def lookup(self, subject: str, body: Mapping[str, Any], deleted: bool = False,
               fmt: str | None = None) -> dict[str, object]:
        """``POST /subjects/{subject}``: the version of ``subject`` that is this schema.
        Raises 40401 (no such subject), 40403 (not one of its versions), 42201."""
        schema_type, text, references = self._request_schema(body)
        self._parse(schema_type, text, references)
        fp = fingerprint(schema_type, compatibility.canonical(schema_type, text), references)
        versions = self.store.versions(subject, deleted)
        if not versions:
            raise _subject_not_found(subject)
        for v in reversed(versions):
            if _fingerprint(v.record) == fp:
                return self._formatted(_version_json(v), v.record, fmt)
        raise _schema_not_found()

    def delete_subject(self, subject: str, permanent: bool = False) -> list[int]:
        """``DELETE /subjects/{subject}``: the versions deleted. Raises 40401, 40405 (permanent
        delete of a subject not soft-deleted first), 42205."""
        self._writable(subject)
        every = self.store.versions(subject, deleted=True)
        if not every:
            raise _subject_not_found(subject)
        if permanent:
            if any(not v.deleted for v in every):
                raise RegistryError(40405, f"Subject '{subject}' was not deleted first before being permanently "
                                           "deleted")
            return self.store.hard_delete(subject)
        live = self.store.soft_delete(subject)
        if not live:
            raise RegistryError(40404, f"Subject '{subject}' was soft deleted.Set permanent=true to delete "
                                       "permanently")
        return live

    def delete_version(self, subject: str, version: str | int, permanent: bool = False) -> int:
        """``DELETE /subjects/{subject}/versions/{version}``: the version deleted. Raises 40401,
        40402, 40406 (not soft-deleted first), 40407 (already soft-deleted), 42202, 42205."""
        self._writable(subject)
        v = self._version(subject, version, deleted=True)
        if permanent:
            if not v.deleted:
                raise RegistryError(40407, f"Subject '{subject}' Version {v.version} was not deleted first "
                                           "before being permanently deleted")
            self.store.hard_delete(subject, v.version)
        else:
            if v.deleted:
                raise RegistryError(40406, f"Subject '{subject}' Version {v.version} was soft deleted.Set "
                                           "permanent=true to delete permanently")
            self.store.soft_delete(subject, v.version)
        return v.version

    # -- compatibility

    def test_compatibility(self, subject: str, version: str | int | None, body: Mapping[str, Any],
                           verbose: bool = False) -> dict[str, object]:
        """``POST /compatibility/subjects/{subject}/versions/{version}`` (``version`` None: the
        ``.../versions`` form, against what the subject's level checks). Raises 40401, 40402, 42201."""
        schema_type, text, references = self._request_schema(body)
        parsed = self._parse(schema_type, text, references)
        level = self.compatibility_level(subject)
        if version is None:
            live = self.store.versions(subject)
            reasons = compatibility.check(level, parsed, [self._parse_record(v.record) for v in live])
        else:
            old = self._version(subject, version)
            plain = level.removesuffix("_TRANSITIVE")
            reasons = compatibility.check(plain, parsed, [self._parse_record(old.record)])
        answer: dict[str, object] = {"is_compatible": not reasons}
        if verbose:
            answer["messages"] = reasons
        return answer

    def compatibility_level(self, subject: str | None) -> str:
        """The level that applies to ``subject``: its own, else the global one, else ``BACKWARD``."""
        if subject:
            own = self.store.setting("config", subject)
            if own is not None:
                return own
        return self.store.setting("config", GLOBAL) or DEFAULT_LEVEL

    def get_config(self, subject: str | None, default_to_global: bool = False) -> dict[str, object]:
        """``GET /config`` and ``GET /config/{subject}``. Raises 40408 (no level set for the subject)."""
        if subject is None or default_to_global:
            return {"compatibilityLevel": self.compatibility_level(subject)}
        own = self.store.setting("config", subject)
        if own is None:
            raise RegistryError(40408, f"Subject '{subject}' does not have subject-level compatibility "
                                       "configured")
        return {"compatibilityLevel": own}

    def set_config(self, subject: str | None, body: Mapping[str, Any]) -> dict[str, object]:
        """``PUT /config[/{subject}]`` with ``{"compatibility": LEVEL}``. Raises 42203."""
        level = body.get("compatibility") or body.get("compatibilityLevel")
        if not isinstance(level, str) or level.upper() not in LEVELS:
            raise RegistryError(42203, f"Invalid compatibility level. Valid values are {', '.join(LEVELS)}")
        self.store.set_setting("config", subject or GLOBAL, level.upper())
        return {"compatibility": level.upper()}

    def delete_config(self, subject: str | None) -> dict[str, object]:
        """``DELETE /config[/{subject}]``: the level removed (the global one falls back to ``BACKWARD``).
        Raises 40401 (a subject without versions)."""
        if subject and not self.store.versions(subject, deleted=True):
            raise _subject_not_found(subject)
        before = self.store.set_setting("config", subject or GLOBAL, None)
        return {"compatibilityLevel": before or DEFAULT_LEVEL}

    # -- modes

    def mode(self, subject: str | None) -> str:
        """The mode that applies to ``subject``: its own, else the global one, else READWRITE."""
        if subject:
            own = self.store.setting("mode", subject)
            if own is not None:
                return own
        return self.store.setting("mode", GLOBAL) or "READWRITE"

    def get_mode(self, subject: str | None, default_to_global: bool = False) -> dict[str, object]:
        """``GET /mode[/{subject}]``. Raises 40409 (no mode set for the subject)."""
        if subject is None or default_to_global:
            return {"mode": self.mode(subject)}
        own = self.store.setting("mode", subject)
        if own is None:
            raise RegistryError(40409, f"Subject '{subject}' does not have subject-level mode configured")
        return {"mode": own}

    def set_mode(self, subject: str | None, body: Mapping[str, Any]) -> dict[str, object]:
        """``PUT /mode[/{subject}]`` with ``{"mode": MODE}``. Raises 42204."""
        mode = body.get("mode")
        if not isinstance(mode, str) or mode.upper() not in MODES:
            raise RegistryError(42204, f"Invalid mode. Valid values are {', '.join(MODES)} (IMPORT is not served)")
        self.store.set_setting("mode", subject or GLOBAL, mode.upper())
        return {"mode": mode.upper()}

    def delete_mode(self, subject: str) -> dict[str, object]:
        """``DELETE /mode/{subject}``: the mode removed. Raises 40409."""
        before = self.store.set_setting("mode", subject, None)
        if before is None:
            raise RegistryError(40409, f"Subject '{subject}' does not have subject-level mode configured")
        return {"mode": before}

    # -- helpers

    def _writable(self, subject: str) -> None:
        if self.mode(subject) != "READWRITE":
            raise RegistryError(42205, f"Subject {subject} is in read-only mode")

    def _version(self, subject: str, version: str | int, deleted: bool = False,
                 read: Callable[[str], list[SubjectVersion]] | None = None) -> SubjectVersion:
        """``read``: a subject's versions, soft-deleted ones included, in a transaction under way
        (``Registration.versions``); None: the store's."""
        number = _version_number(version)
        if read is None:
            versions = self.store.versions(subject, deleted)
        else:
            versions = [v for v in read(subject) if deleted or not v.deleted]
        if not versions:
            raise _subject_not_found(subject)
        if number == -1:
            live = [v for v in versions if not v.deleted]
            if not live:
                raise _version_not_found(subject, version)
            return live[-1]
        for v in versions:
            if v.version == number:
                return v
        raise _version_not_found(subject, version)

    def _request_schema(self, body: Mapping[str, Any]) -> tuple[str, str, tuple[Reference, ...]]:
        text = body.get("schema")
        if not isinstance(text, str) or not text.strip():
            raise _invalid("Invalid schema: the request has no \"schema\" string")
        schema_type = body.get("schemaType") or compatibility.AVRO
        try:
            references = tuple(Reference(str(r["name"]), str(r["subject"]), int(r["version"]))
                               for r in body.get("references") or ())
        except (KeyError, TypeError, ValueError) as exc:
            raise _invalid(f"Invalid schema: bad reference: {exc}") from exc
        return str(schema_type).upper(), text, references

    def _resolved(self, references: tuple[Reference, ...], seen: frozenset[tuple[str, int]] = frozenset(),
                  read: Callable[[str], list[SubjectVersion]] | None = None) -> list[compatibility.Reference]:
        """(name, type, text) of every schema ``references`` reach, dependencies first."""
        out: list[compatibility.Reference] = []
        for ref in references:
            key = (ref.subject, ref.version)
            if key in seen:
                raise _invalid(f"Invalid schema: reference cycle through {ref.subject} version {ref.version}")
            try:
                target = self._version(ref.subject, ref.version, read=read)
            except RegistryError as exc:
                raise _invalid(f"Invalid schema: reference {ref.name} ({ref.subject} version {ref.version}): "
                               f"{exc.message}") from exc
            out += self._resolved(target.record.references, seen | {key}, read)
            out.append((ref.name, target.record.schema_type, target.record.schema))
        return out

    def _parse(self, schema_type: str, text: str, references: tuple[Reference, ...],
               read: Callable[[str], list[SubjectVersion]] | None = None) -> ParsedSchema:
        try:
            return compatibility.parse(schema_type, text, self._resolved(references, read=read))
        except InvalidSchema as exc:
            raise _invalid(str(exc)) from exc

    def _parse_record(self, record: SchemaRecord,
                      read: Callable[[str], list[SubjectVersion]] | None = None) -> ParsedSchema:
        return self._parse(record.schema_type, record.schema, record.references, read)

    def _formatted(self, answer: dict[str, object], record: SchemaRecord, fmt: str | None) -> dict[str, object]:
        """``answer`` with its schema in format ``fmt`` (Confluent's ``format`` parameter: Protobuf's
        ``serialized``, the base64 ``FileDescriptorProto`` whatever form was registered); a format the
        schema's type does not have leaves the registered text, as Confluent does."""
        if fmt:
            text = compatibility.formatted(self._parse_record(record), fmt)
            if text is not None:
                answer["schema"] = text
        return answer


def _fingerprint(record: SchemaRecord) -> str:
    return fingerprint(record.schema_type, compatibility.canonical(record.schema_type, record.schema),
                       record.references)


def _version_number(version: str | int) -> int:
    """``latest`` -> -1, else the version as an int in 1..2^31-1 (or -1). Raises 42202."""
    if isinstance(version, str) and version.lower() == "latest":
        return -1
    try:
        number = int(version)
    except (TypeError, ValueError):
        number = 0
    if number == -1 or 1 <= number <= _MAX_VERSION:
        return number
    raise RegistryError(42202, f"The specified version '{version}' is not a valid version id. Allowed values are "
                               "between [1, 2^31-1] and the string \"latest\"")


def _schema_json(record: SchemaRecord) -> dict[str, object]:
    out: dict[str, object] = {"schema": record.schema}
    if record.schema_type != compatibility.AVRO:  # Confluent leaves AVRO, the default, out
        out["schemaType"] = record.schema_type
    if record.references:
        out["references"] = [r.to_json() for r in record.references]
    return out


def _version_json(v: SubjectVersion) -> dict[str, object]:
    return {"subject": v.subject, "version": v.version, "id": v.record.id, "guid": v.record.guid,
            **_schema_json(v.record)}
