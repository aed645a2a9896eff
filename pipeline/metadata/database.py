"""One metadata database, SQLite or PostgreSQL, behind one small interface (blocking calls).

Kafka keeps its metadata in KRaft's replicated log; brokers here keep it in an
existing database instead of a home-made consensus (issue 24):

- **SQLite** (the single-machine default): one file per store under
  ``DATA_DIR/_pipeline`` (``topics.db``, ``groups.db``, ...), WAL journal with
  ``synchronous=FULL``, so a committed transaction is fsynced before the call
  returns. Processes on the same host share a file through SQLite's locks.
- **PostgreSQL** (``pipeline.metadata.url = "postgresql://user@host:port/db"``,
  through psycopg 3): every store's tables in that one database, shared by
  brokers on any host. A commit returns once PostgreSQL has flushed its WAL
  (``synchronous_commit`` on, its default).

A store writes its SQL once, in the subset both speak: ``?`` placeholders (turned
into psycopg's ``%s``), ``INSERT ... ON CONFLICT``, ``RETURNING``; only its schema
(``Migration``) is written per dialect. Schemas are versioned per store in a
``schema_version`` table (component, version) and migrated when a store opens:
in one transaction, under ``BEGIN IMMEDIATE`` on SQLite and a transaction-scoped
advisory lock on PostgreSQL, so brokers starting together migrate once and never
see half a schema; a migration already applied is skipped (idempotent).

A broker that keeps a store's contents in memory (the topic catalog, the ACLs of
the authorizer) learns that another broker changed them from the store's
**change version**: one row per store in a ``metadata_changes`` table
(component, version), made beside ``schema_version``, that a store's writing
transaction bumps with ``record_change`` (so the bump commits or rolls back with
the change) and a broker polls with ``change_version`` (one single-row read),
reloading only when it moved. The same on both backends: no LISTEN/NOTIFY, no
file-system watch, nothing but a committed row (Kafka's brokers follow the
metadata log's offset the same way, KIP-500).

Every method blocks (file or network I/O): callers in trio run them through
``trio.to_thread.run_sync``. One connection per ``Database``, held by one thread
at a time (a lock), serves every thread.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

__all__ = ("Database", "Dialect", "Migration", "SchemaVersionError", "Target", "is_postgres_url", "open_database",
           "redact_url", "store_target")

Dialect = Literal["sqlite", "postgresql"]
Target = str | os.PathLike[str]
"""A SQLite file's path, or a ``postgresql://`` (or ``postgres://``) URL."""

_PG_SCHEMES = ("postgresql", "postgres")
_MIGRATION_LOCK = 0x706970656C696E65  # "pipeline": the advisory lock key every broker migrates under
_PG_NOW_MS = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"

PG_IDLE_IN_TRANSACTION_TIMEOUT_MS = 2000
"""PostgreSQL ends a session of ours that stays idle inside a transaction this long (its
``idle_in_transaction_session_timeout``), rolling the transaction back and releasing its row locks.
Our transactions run their statements back to back, so only a stalled process (SIGSTOP, a long
pause, a frozen VM) is idle in one: without this, a broker stopped between two statements of a
commit's transaction held its rows locked until it woke, and every broker waiting for them (a
take-over settling the partition's end, the controller fencing it) stopped heartbeating and fenced
itself (seen in tests/e2e/test_failover.py). ``pipeline.config`` refuses a ``broker.session.timeout.ms``
not above this plus ``broker.heartbeat.interval.ms`` with a PostgreSQL metadata database, so a waiter's
heartbeats resume within its session (the tests: 5000 ms, heartbeats every 1000 ms). The stalled
process finds its connection closed when it wakes: its transaction fails and commits nothing."""
_SQLITE_NOW_MS = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"


class SchemaVersionError(RuntimeError):
    """The database holds a schema newer than this code knows (a newer broker migrated it)."""


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema step of a store: ``version`` (1, 2, ...) and its statements per dialect
    (separated by ``;``, none inside a statement)."""

    version: int
    sqlite: str
    postgresql: str


def is_postgres_url(target: Target) -> bool:
    """Whether ``target`` names a PostgreSQL database rather than a SQLite file."""
    return isinstance(target, str) and urlsplit(target).scheme in _PG_SCHEMES


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for logs and ``config show``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def store_target(metadata_url: str | None, data_dir: Target, file: str) -> Target:
    """Where a store of a server keeps its data: the PostgreSQL database of ``metadata_url`` when
    one is configured, else ``DATA_DIR/_pipeline/<file>``."""
    return metadata_url if metadata_url else Path(data_dir) / "_pipeline" / file


def open_database(target: Target, *, wal: bool = True, timeout_s: float = 10.0) -> "Database":
    """The database ``target`` names: a ``postgresql://`` URL, else a SQLite file (created with its folder).

    Args:
        wal: SQLite only: WAL journal (False keeps SQLite's rollback journal).
        timeout_s: how long to wait for a lock (SQLite) or a connection (PostgreSQL).

    Raises:
        sqlite3.Error, psycopg.Error: the database cannot be opened or reached.
    """
    if is_postgres_url(target):
        return _Postgres(str(target), timeout_s)
    return _Sqlite(Path(target), wal, timeout_s)


class Cursor:
    """What a transaction hands its caller: ``execute`` with ``?`` placeholders, then sqlite3's
    and psycopg's common cursor methods (``fetchone``, ``fetchall``, iteration, ``rowcount``)."""

    __slots__ = ("_cursor", "_pg")

    def __init__(self, cursor: Any, pg: bool) -> None:
        self._cursor, self._pg = cursor, pg

    def execute(self, sql: str, params: Sequence[Any] = ()) -> "Cursor":
        """Run ``sql`` (no ``?`` nor ``%`` inside its literals: ``?`` are the placeholders)."""
        if self._pg:
            self._cursor.execute(sql.replace("?", "%s"), tuple(params) or None)
        else:
            self._cursor.execute(sql, tuple(params))
        return self

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self._cursor.executemany(sql.replace("?", "%s") if self._pg else sql, [tuple(r) for r in rows])

    def fetchone(self) -> Any:
        return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        return list(self._cursor.fetchall())

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor.fetchall())

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)


class Database:
    """A metadata database (see the module docstring). Made by ``open_database``.

    Attributes:
        dialect: ``"sqlite"`` or ``"postgresql"``.
        name: the file's path or the URL without its password (for logs).
        now_ms: an SQL expression for the database's wall clock in ms since the epoch:
            leases are timed on the database's clock, one clock for every host.
    """

    dialect: Dialect
    name: str
    now_ms: str

    def transaction(self, write: bool = True) -> Any:
        """A context manager: one transaction, committed when the block ends (durable then), rolled
        back when it raises; yields a ``Cursor``. ``write=False`` for reads (no write lock on SQLite)."""
        raise NotImplementedError

    def record_change(self, cur: Cursor, component: str) -> None:
        """Bump ``component``'s change version inside the writing transaction ``cur``: other brokers'
        ``change_version`` sees it move once that transaction commits, and never if it rolls back.
        Writers of one component queue on its row (its lock) until they commit: for stores that
        change rarely (topics, ACLs), not for one written per request."""
        cur.execute("UPDATE metadata_changes SET version = version + 1 WHERE component = ?", (component,))

    def change_version(self, component: str) -> int:
        """``component``'s change version: a number that differs from an earlier read once a
        transaction that changed the store (``record_change``) committed since, from any process
        or host. One single-row read.

        Raises:
            sqlite3.Error, psycopg.Error: the database cannot be read.
        """
        with self.transaction(write=False) as cur:
            row = cur.execute("SELECT version FROM metadata_changes WHERE component = ?", (component,)).fetchone()
        return 0 if row is None else int(row[0])

    def close(self) -> None:
        raise NotImplementedError

    def migrate(self, component: str, migrations: Sequence[Migration]) -> int:
        """Apply ``component``'s migrations newer than the stored version, in order, in one
        transaction under the migration lock; the version now stored. ``component``'s change
        version row (``record_change``) is made too, at 0, if missing.

        Raises:
            SchemaVersionError: the stored version is newer than the last of ``migrations``.
        """
        latest = max(m.version for m in migrations)
        with self._migration() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS schema_version ("
                        "component TEXT PRIMARY KEY, version INTEGER NOT NULL)")
            row = cur.execute("SELECT version FROM schema_version WHERE component = ?", (component,)).fetchone()
            current = 0 if row is None else int(row[0])
            if current > latest:
                raise SchemaVersionError(f"{self.name}: schema of {component} is at version {current}, "
                                         f"newer than this code's {latest}")
            for migration in sorted(migrations, key=lambda m: m.version):
                if migration.version <= current:
                    continue
                script = migration.sqlite if self.dialect == "sqlite" else migration.postgresql
                for statement in script.split(";"):
                    if statement.strip():
                        cur.execute(statement)
                current = migration.version
            cur.execute("INSERT INTO schema_version (component, version) VALUES (?, ?) "
                        "ON CONFLICT (component) DO UPDATE SET version = excluded.version", (component, current))
            cur.execute("CREATE TABLE IF NOT EXISTS metadata_changes ("
                        "component TEXT PRIMARY KEY, version BIGINT NOT NULL)")
            cur.execute("INSERT INTO metadata_changes (component, version) VALUES (?, 0) "
                        "ON CONFLICT (component) DO NOTHING", (component,))
        return current

    def _migration(self) -> Any:
        return self.transaction()


class _Sqlite(Database):
    dialect: Dialect = "sqlite"
    now_ms = _SQLITE_NOW_MS

    def __init__(self, path: Path, wal: bool, timeout_s: float) -> None:
        self.path = path
        self.name = str(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        created = not path.exists()
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = sqlite3.connect(path, timeout=timeout_s, isolation_level=None,
                                                              check_same_thread=False)
        if wal:
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        if created:
            # The new file's directory entry must be durable too.
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    @contextmanager
    def transaction(self, write: bool = True) -> Iterator[Cursor]:
        with self._lock:
            db = self._db
            if db is None:
                raise sqlite3.ProgrammingError(f"{self.name}: closed")
            db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield Cursor(db.cursor(), pg=False)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


class _Postgres(Database):
    dialect: Dialect = "postgresql"
    now_ms = _PG_NOW_MS

    def __init__(self, url: str, timeout_s: float) -> None:
        import psycopg

        self._psycopg = psycopg
        self.url = url
        self.name = redact_url(url)
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._closed = False
        self._conn: Any = None
        with self._lock:
            self._connection()  # fail now, not on the first request, when the database cannot be reached

    def _connection(self) -> Any:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            # autocommit: transactions are explicit (conn.transaction()), none is left open between calls.
            self._conn = conn = self._psycopg.connect(
                self.url, autocommit=True, connect_timeout=max(1, int(self._timeout_s)),
                options=f"-c idle_in_transaction_session_timeout={PG_IDLE_IN_TRANSACTION_TIMEOUT_MS}")
        return conn

    @contextmanager
    def transaction(self, write: bool = True) -> Iterator[Cursor]:
        with self._lock:
            if self._closed:
                raise self._psycopg.InterfaceError(f"{self.name}: closed")
            conn = self._connection()
            with conn.transaction(), conn.cursor() as cur:
                yield Cursor(cur, pg=True)

    @contextmanager
    def _migration(self) -> Iterator[Cursor]:
        with self.transaction() as cur:
            # Brokers starting together: one migrates, the others wait here, then find it done.
            cur.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
            yield cur

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None
