"""The registry's schemas, subject versions, compatibility levels and modes in the metadata database.

Confluent's Schema Registry keeps these in a compacted Kafka topic (``_schemas``) and
Karapace does the same; here they are rows of the metadata database every broker
already shares (``pipeline.metadata.database``): SQLite's ``DATA_DIR/_pipeline/registry.db``
on one machine, PostgreSQL's tables across hosts. So a schema registered through one
broker is read through any other, with no replication of our own.

- ``registry_schemas``: one row per distinct schema (type, canonical text, references),
  with its global id and its GUID (Confluent 8's second identifier, which serializers may
  put in a record header instead of the id). Ids are never reused; the same schema
  registered under several subjects keeps one id (Confluent's behaviour).
- ``registry_versions``: (subject, version) -> schema id, with a soft-delete flag.
- ``registry_config`` / ``registry_mode``: per subject, ``''`` for the global default.
- ``registry_ids``: one row with the next id; a writing transaction locks it first
  (``UPDATE``), which serialises registrations across brokers on both databases.

Every method blocks (database I/O); callers in trio run them in a worker thread.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.metadata.database import Cursor, Migration, Target, open_database, store_target

__all__ = ("GLOBAL", "REGISTRY_FILE", "Reference", "SchemaRecord", "SchemaStore", "SubjectVersion")

REGISTRY_FILE = "registry.db"
"""The store's SQLite file under ``DATA_DIR/_pipeline`` (one machine)."""

COMPONENT = "schema_registry"
"""The store's name in ``schema_version``."""

GLOBAL = ""
"""The subject key of the global compatibility level and mode."""

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS registry_schemas (
    id {big} PRIMARY KEY,
    guid TEXT NOT NULL UNIQUE,
    schema_type TEXT NOT NULL,
    schema TEXT NOT NULL,
    refs TEXT NOT NULL,
    fingerprint TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS registry_versions (
    subject TEXT NOT NULL,
    version INTEGER NOT NULL,
    schema_id {big} NOT NULL REFERENCES registry_schemas (id),
    deleted INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (subject, version)
);
CREATE INDEX IF NOT EXISTS registry_versions_by_id ON registry_versions (schema_id);
CREATE TABLE IF NOT EXISTS registry_config (subject TEXT PRIMARY KEY, compatibility TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS registry_mode (subject TEXT PRIMARY KEY, mode TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS registry_ids (singleton INTEGER PRIMARY KEY CHECK (singleton = 1), next_id {big} NOT NULL);
INSERT INTO registry_ids (singleton, next_id) VALUES (1, 1) ON CONFLICT DO NOTHING
"""
"""The tables, the same on both databases but for the id columns' type (``{big}``)."""

MIGRATIONS = (
    Migration(1, sqlite=_SCHEMA_V1.format(big="INTEGER"), postgresql=_SCHEMA_V1.format(big="BIGINT")),
)


@dataclass(frozen=True, slots=True)
class Reference:
    """A schema's reference to another subject's version (Confluent ``SchemaReference``): the
    referenced type's ``name`` as the schema uses it, and where it is registered."""

    name: str
    subject: str
    version: int

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "subject": self.subject, "version": self.version}


@dataclass(frozen=True, slots=True)
class SchemaRecord:
    """A registered schema: its global ``id`` and ``guid`` (a UUID's text), ``schema_type`` (AVRO,
    PROTOBUF, JSON) and text as registered, and its references."""

    id: int
    guid: str
    schema_type: str
    schema: str
    references: tuple[Reference, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class SubjectVersion:
    """One version of a subject: ``version`` (1, 2, ...) of ``subject`` is schema ``record``."""

    subject: str
    version: int
    record: SchemaRecord
    deleted: bool = False


def fingerprint(schema_type: str, canonical: str, references: tuple[Reference, ...]) -> str:
    """What makes two registrations the same schema (one id): the type, the canonical text and
    the references, as a SHA-256 hex digest (a fixed-size key: PostgreSQL's btree index cannot
    hold a long schema text)."""
    refs = json.dumps([r.to_json() for r in references], sort_keys=True)
    return hashlib.sha256(f"{schema_type}\0{canonical}\0{refs}".encode()).hexdigest()


def _refs(text: str) -> tuple[Reference, ...]:
    return tuple(Reference(r["name"], r["subject"], int(r["version"])) for r in json.loads(text))


def _record(row: tuple) -> SchemaRecord:
    return SchemaRecord(int(row[0]), row[1], row[2], row[3], _refs(row[4]))


_SCHEMA_COLUMNS = "id, guid, schema_type, schema, refs"
_SELECT_VERSION = ("SELECT v.subject, v.version, v.deleted, s.id, s.guid, s.schema_type, s.schema, s.refs "
                   "FROM registry_versions v JOIN registry_schemas s ON s.id = v.schema_id ")


def _version(row: tuple) -> SubjectVersion:
    return SubjectVersion(row[0], int(row[1]), _record(row[3:]), bool(row[2]))


class SchemaStore:
    """The registry's rows in ``target`` (a SQLite file or a PostgreSQL URL).

    Raises (constructor): sqlite3.Error, psycopg.Error when the database cannot be reached;
    ``pipeline.metadata.database.SchemaVersionError`` when its schema is newer than this code.
    Every method raises sqlite3.Error or psycopg.Error when the database cannot be read or written.
    """

    def __init__(self, target: Target) -> None:
        self._db = open_database(target)
        self._db.migrate(COMPONENT, MIGRATIONS)
        self.name = self._db.name

    @classmethod
    def for_data_dir(cls, data_dir: Path | str, metadata_url: str | None = None) -> "SchemaStore":
        """A server's store: ``DATA_DIR/_pipeline/registry.db``, or the database of ``metadata_url``."""
        return cls(store_target(metadata_url, data_dir, REGISTRY_FILE))

    def close(self) -> None:
        self._db.close()

    # -- reads

    def schema(self, schema_id: int) -> SchemaRecord | None:
        """The schema with global id ``schema_id``, None if there is none."""
        with self._db.transaction(write=False) as cur:
            row = cur.execute(f"SELECT {_SCHEMA_COLUMNS} FROM registry_schemas WHERE id = ?", (schema_id,)).fetchone()
        return None if row is None else _record(row)

    def schema_by_guid(self, guid: str) -> SchemaRecord | None:
        """The schema with GUID ``guid`` (a UUID's text, any case), None if there is none."""
        with self._db.transaction(write=False) as cur:
            row = cur.execute(f"SELECT {_SCHEMA_COLUMNS} FROM registry_schemas WHERE guid = ?",
                              (guid.lower(),)).fetchone()
        return None if row is None else _record(row)

    def schema_id(self, fp: str) -> int | None:
        """The id of the schema with fingerprint ``fp`` (``fingerprint``), None if never registered."""
        with self._db.transaction(write=False) as cur:
            row = cur.execute("SELECT id FROM registry_schemas WHERE fingerprint = ?", (fp,)).fetchone()
        return None if row is None else int(row[0])

    def subjects(self, deleted: bool = False) -> list[str]:
        """Subjects with a live version (and soft-deleted ones too with ``deleted``), sorted."""
        where = "" if deleted else " WHERE deleted = 0"
        with self._db.transaction(write=False) as cur:
            rows = cur.execute(f"SELECT DISTINCT subject FROM registry_versions{where} ORDER BY subject").fetchall()
        return [r[0] for r in rows]

    def versions(self, subject: str, deleted: bool = False) -> list[SubjectVersion]:
        """``subject``'s versions, oldest first (soft-deleted ones too with ``deleted``)."""
        where = "WHERE v.subject = ?" + ("" if deleted else " AND v.deleted = 0")
        with self._db.transaction(write=False) as cur:
            rows = cur.execute(_SELECT_VERSION + where + " ORDER BY v.version", (subject,)).fetchall()
        return [_version(r) for r in rows]

    def uses(self, schema_id: int) -> list[tuple[str, int]]:
        """(subject, version) of every live version that is schema ``schema_id``."""
        with self._db.transaction(write=False) as cur:
            rows = cur.execute("SELECT subject, version FROM registry_versions WHERE schema_id = ? AND deleted = 0 "
                               "ORDER BY subject, version", (schema_id,)).fetchall()
        return [(r[0], int(r[1])) for r in rows]

    def referenced_by(self, subject: str, version: int) -> list[int]:
        """Ids of the schemas whose references name ``subject`` version ``version``."""
        with self._db.transaction(write=False) as cur:
            rows = cur.execute("SELECT id, refs FROM registry_schemas WHERE refs <> '[]' ORDER BY id").fetchall()
        return [int(i) for i, refs in rows
                if any(r.subject == subject and r.version == version for r in _refs(refs))]

    def setting(self, table: str, subject: str) -> str | None:
        """The compatibility level (``table`` "config") or mode ("mode") set for ``subject``
        (``GLOBAL`` for the default), None if none is set."""
        column = _SETTINGS[table]
        with self._db.transaction(write=False) as cur:
            row = cur.execute(f"SELECT {column} FROM registry_{table} WHERE subject = ?", (subject,)).fetchone()
        return None if row is None else str(row[0])

    # -- writes

    @contextmanager
    def registration(self) -> Iterator["Registration"]:
        """One registration as a transaction: the id counter's row is locked first, so
        registrations from every broker are serialised and see each other's rows."""
        with self._db.transaction() as cur:
            cur.execute("UPDATE registry_ids SET next_id = next_id WHERE singleton = 1")
            yield Registration(cur)

    def set_setting(self, table: str, subject: str, value: str | None) -> str | None:
        """Set (``value``) or remove (None) the compatibility level or mode of ``subject``;
        returns the one set before, None if none was."""
        column = _SETTINGS[table]
        with self._db.transaction() as cur:
            row = cur.execute(f"SELECT {column} FROM registry_{table} WHERE subject = ?", (subject,)).fetchone()
            if value is None:
                cur.execute(f"DELETE FROM registry_{table} WHERE subject = ?", (subject,))
            else:
                cur.execute(f"INSERT INTO registry_{table} (subject, {column}) VALUES (?, ?) "
                            f"ON CONFLICT (subject) DO UPDATE SET {column} = excluded.{column}", (subject, value))
        return None if row is None else str(row[0])

    def soft_delete(self, subject: str, version: int | None = None) -> list[int]:
        """Mark ``subject``'s live versions (or only ``version``) deleted; the versions marked."""
        with self._db.transaction() as cur:
            extra, params = ("", (subject,)) if version is None else (" AND version = ?", (subject, version))
            rows = cur.execute(f"SELECT version FROM registry_versions WHERE subject = ? AND deleted = 0{extra} "
                               "ORDER BY version", params).fetchall()
            cur.execute(f"UPDATE registry_versions SET deleted = 1 WHERE subject = ? AND deleted = 0{extra}", params)
        return [int(r[0]) for r in rows]

    def hard_delete(self, subject: str, version: int | None = None) -> list[int]:
        """Remove ``subject``'s soft-deleted versions (or only ``version``, if soft-deleted); the
        versions removed. The schemas themselves stay: their ids are never reused."""
        with self._db.transaction() as cur:
            extra, params = ("", (subject,)) if version is None else (" AND version = ?", (subject, version))
            rows = cur.execute(f"SELECT version FROM registry_versions WHERE subject = ? AND deleted = 1{extra} "
                               "ORDER BY version", params).fetchall()
            cur.execute(f"DELETE FROM registry_versions WHERE subject = ? AND deleted = 1{extra}", params)
        return [int(r[0]) for r in rows]


_SETTINGS = {"config": "compatibility", "mode": "mode"}


class Registration:
    """The writes of one registration (``SchemaStore.registration``), inside its transaction."""

    def __init__(self, cur: Cursor) -> None:
        self._cur = cur

    def versions(self, subject: str) -> list[SubjectVersion]:
        """``subject``'s versions, soft-deleted ones included, oldest first (read in this transaction)."""
        rows = self._cur.execute(_SELECT_VERSION + "WHERE v.subject = ? ORDER BY v.version", (subject,)).fetchall()
        return [_version(r) for r in rows]

    def schema_id(self, schema_type: str, schema: str, fp: str, references: tuple[Reference, ...]
                  ) -> tuple[int, str]:
        """(id, guid) of the schema with fingerprint ``fp``: the existing one's, else a new id and a
        random GUID (UUID 4) for ``schema`` (kept as given)."""
        row = self._cur.execute("SELECT id, guid FROM registry_schemas WHERE fingerprint = ?", (fp,)).fetchone()
        if row is not None:
            return int(row[0]), str(row[1])
        new_id = int(self._cur.execute("UPDATE registry_ids SET next_id = next_id + 1 WHERE singleton = 1 "
                                       "RETURNING next_id - 1").fetchone()[0])
        guid = str(uuid.uuid4())
        refs = json.dumps([r.to_json() for r in references])
        self._cur.execute("INSERT INTO registry_schemas (id, guid, schema_type, schema, refs, fingerprint) "
                          "VALUES (?, ?, ?, ?, ?, ?)", (new_id, guid, schema_type, schema, refs, fp))
        return new_id, guid

    def add_version(self, subject: str, schema_id: int) -> int:
        """Make ``schema_id`` the next version of ``subject`` (after every version it ever had,
        soft-deleted ones included, as Confluent numbers them); the new version."""
        row = self._cur.execute("SELECT MAX(version) FROM registry_versions WHERE subject = ?", (subject,)).fetchone()
        version = (int(row[0]) if row is not None and row[0] is not None else 0) + 1
        self._cur.execute("INSERT INTO registry_versions (subject, version, schema_id) VALUES (?, ?, ?)",
                          (subject, version, schema_id))
        return version
