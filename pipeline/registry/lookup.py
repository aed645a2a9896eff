"""Schemas by id for the table side: from pipeline's own registry store or an external registry.

The decode worker reads a registry-framed value (magic byte 0, 4-byte schema id:
Confluent's wire format) with the schema its producer wrote it with, which only the
registry knows. ``SchemaLookup`` answers "which schema is id N" from either:

- the metadata store of pipeline's own registry (a SQLite file or a PostgreSQL URL,
  ``pipeline.registry.store``), read directly: no HTTP hop on the broker's own host;
- an external Confluent-compatible registry (Confluent, Karapace, Apicurio's ccompat API,
  Redpanda) at an ``http(s)://`` URL: ``GET /schemas/ids/{id}``, or ``GET /schemas/guids/{guid}``
  for a GUID (Schema Registry 8.0) (Confluent's API reference);
  ``user:password@`` in the URL is sent as HTTP basic authentication.

Ids never change what they name, so a schema found is cached for the process's life; an id
not found is asked again next time (it may be registered meanwhile on another broker).
Blocking (database or HTTP I/O); made to be pickled into the decode worker (only the
target travels).
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from pipeline.registry.store import SchemaStore

__all__ = ("RegistryUnavailable", "SchemaLookup", "lookup_for")


class RegistryUnavailable(RuntimeError):
    """The registry could not be asked (unreachable, an HTTP error other than 404, a database error):
    the caller retries later; no record is judged on it."""


class SchemaLookup:
    """id -> (schema type, schema text) from ``target``: an ``http(s)://`` registry URL, or the
    metadata store of pipeline's registry (a SQLite file path or a ``postgresql://`` URL)."""

    def __init__(self, target: str, timeout_s: float = 10.0) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self._found: dict[int | str, tuple[str, str]] = {}
        self._references: dict[int | str, tuple[tuple[str, str, str], ...]] = {}
        self._store: SchemaStore | None = None  # opened on first use (this object is pickled to decode workers)
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[type["SchemaLookup"], tuple[str, float]]:
        return (SchemaLookup, (self.target, self.timeout_s))

    @property
    def is_http(self) -> bool:
        return urlsplit(self.target).scheme in ("http", "https")

    def schema(self, schema_id: int) -> tuple[str, str] | None:
        """(type, text) of schema ``schema_id`` (type AVRO, PROTOBUF or JSON), None if the registry
        has no such id.

        Raises:
            RegistryUnavailable: the registry could not be asked.
        """
        return self._cached(schema_id)

    def schema_by_guid(self, guid: str) -> tuple[str, str] | None:
        """(type, text) of the schema with GUID ``guid`` (Schema Registry 8.0), None if there is none.

        Raises:
            RegistryUnavailable: the registry could not be asked.
        """
        return self._cached(guid.lower())

    def _cached(self, key: int | str) -> tuple[str, str] | None:
        found = self._found.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._http(key) if self.is_http else self._from_store(key)
        if found is not None:
            self._found[key] = found
        return found

    def references(self, key: int | str) -> tuple[tuple[str, str, str], ...]:
        """Every schema that schema ``key`` (an id, or a GUID's text) references, directly or not, as
        (name, type, text), dependencies first, as ``pipeline.registry.compatibility.parse`` takes them;
        () for an unknown key or none (cached: a registered schema's references never change).

        Raises:
            RegistryUnavailable: the registry could not be asked.
        """
        key = key.lower() if isinstance(key, str) else key
        found = self._references.get(key)
        if found is None:
            with self._lock:
                if self.is_http:
                    body = self._get(f"schemas/ids/{key}" if isinstance(key, int) else f"schemas/guids/{key}")
                    direct = [] if body is None else list(body.get("references") or ())
                else:
                    record = self._store_call(lambda store: store.schema(key) if isinstance(key, int)
                                              else store.schema_by_guid(key))
                    direct = [] if record is None else [r.to_json() for r in record.references]
                found = tuple(self._resolve(direct, frozenset()))
            self._references[key] = found
        return found

    def _resolve(self, direct: list[dict[str, Any]], seen: frozenset[tuple[str, int]]
                 ) -> list[tuple[str, str, str]]:
        """(name, type, text) of ``direct`` ({"name", "subject", "version"}) and what they reference,
        dependencies first; a reference not found or a cycle is left out (the parse then names it)."""
        from urllib.parse import quote

        out: list[tuple[str, str, str]] = []
        for ref in direct:
            subject, version = str(ref["subject"]), int(ref["version"])
            if (subject, version) in seen:
                continue
            if self.is_http:
                body = self._get(f"subjects/{quote(subject, safe='')}/versions/{version}?deleted=true")
                if body is None:
                    continue
                text, schema_type, nested = str(body["schema"]), str(body.get("schemaType") or "AVRO"), list(
                    body.get("references") or ())
            else:
                versions = self._store_call(lambda store, s=subject: store.versions(s, deleted=True))
                match = next((v for v in versions if v.version == version), None)
                if match is None:
                    continue
                text, schema_type = match.record.schema, match.record.schema_type
                nested = [r.to_json() for r in match.record.references]
            out += self._resolve(nested, seen | {(subject, version)})
            out.append((str(ref["name"]), schema_type, text))
        return out

    def _store_call(self, read: Any) -> Any:
        """``read(store)`` on the metadata store (opened once), under the lock the caller holds.

        Raises:
            RegistryUnavailable: the store could not be read.
        """
        from pipeline.registry.store import SchemaStore

        try:
            if self._store is None:
                self._store = SchemaStore(self.target)
            return read(self._store)
        except Exception as exc:  # sqlite3.Error, psycopg.Error
            self.close_quietly()
            raise RegistryUnavailable(f"the schema registry's store could not be read: {exc}") from exc

    def latest(self, subject: str) -> tuple[int, str, str] | None:
        """(id, type, text) of ``subject``'s latest live version, None if it has none. Not cached:
        a new version may be registered at any time (through any broker).

        Raises:
            RegistryUnavailable: the registry could not be asked.
        """
        with self._lock:
            if self.is_http:
                from urllib.parse import quote

                body = self._get(f"subjects/{quote(subject, safe='')}/versions/latest")
                if body is None:
                    return None
                return int(body["id"]), str(body.get("schemaType") or "AVRO"), str(body["schema"])
            from pipeline.registry.store import SchemaStore

            try:
                if self._store is None:
                    self._store = SchemaStore(self.target)
                versions = self._store.versions(subject)
            except Exception as exc:  # sqlite3.Error, psycopg.Error
                self.close_quietly()
                raise RegistryUnavailable(f"the schema registry's store could not be read: {exc}") from exc
        if not versions:
            return None
        record = versions[-1].record
        return record.id, record.schema_type, record.schema

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    def _from_store(self, key: int | str) -> tuple[str, str] | None:
        from pipeline.registry.store import SchemaStore

        try:
            if self._store is None:
                self._store = SchemaStore(self.target)
            record = self._store.schema(key) if isinstance(key, int) else self._store.schema_by_guid(key)
        except Exception as exc:  # sqlite3.Error, psycopg.Error, a schema newer than this code
            self.close_quietly()
            raise RegistryUnavailable(f"the schema registry's store could not be read: {exc}") from exc
        return None if record is None else (record.schema_type, record.schema)

    def close_quietly(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - it failed already; the next lookup opens it again
            self._store = None

    def _http(self, key: int | str) -> tuple[str, str] | None:
        body = self._get(f"schemas/ids/{key}" if isinstance(key, int) else f"schemas/guids/{key}")
        return None if body is None else (str(body.get("schemaType") or "AVRO"), str(body["schema"]))

    def _get(self, path: str) -> Any:
        """The decoded JSON of ``GET {target}/{path}``; None on 404.

        Raises:
            RegistryUnavailable: any other answer, or none.
        """
        parts = urlsplit(self.target)
        headers = {"Accept": "application/vnd.schemaregistry.v1+json"}
        if parts.username is not None:
            creds = f"{parts.username}:{parts.password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(creds).decode()
            netloc = parts.hostname or ""
            if parts.port:
                netloc += f":{parts.port}"
            parts = parts._replace(netloc=netloc)
        base = urlunsplit(parts).rstrip("/")
        request = urllib.request.Request(f"{base}/{path}", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise RegistryUnavailable(f"the schema registry answered HTTP {exc.code} for {path}") from exc
        except (OSError, ValueError) as exc:
            raise RegistryUnavailable(f"the schema registry could not be asked for {path}: {exc}") from exc


_LOOKUPS: dict[str, SchemaLookup] = {}


def lookup_for(target: str) -> SchemaLookup:
    """The process's one ``SchemaLookup`` of ``target`` (its cache shared by every flush)."""
    lookup = _LOOKUPS.get(target)
    if lookup is None:
        lookup = _LOOKUPS[target] = SchemaLookup(target)
    return lookup
