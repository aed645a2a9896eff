"""ACLs on disk: SQLite at ``DATA_DIR/_pipeline/acls.db``, or PostgreSQL.

Kafka keeps ACLs in ZooKeeper or the KRaft metadata log; a broker keeps them
like its topics (``topics.db``) and group offsets (``groups.db``), in
``pipeline.metadata.database``: SQLite with WAL journal and
``synchronous=FULL`` by default, the ``acls`` table of the PostgreSQL database
of ``pipeline.metadata.url`` if set; so a CreateAcls or DeleteAcls answered is
on disk. The methods block (file I/O): the admin
handlers call them through ``trio.to_thread.run_sync``; ``load`` runs at
start, and again whenever ``change_version`` moved (another broker of a
cluster changed the ACLs: ``pipeline.requests.acl_apis.AclApis.refresh``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from pipeline.metadata.database import Database, Migration, Target, is_postgres_url, open_database, redact_url
from pipeline.security.acl import AclBinding, binding

__all__ = ("ACL_STORE_FILE", "AclStore")

ACL_STORE_FILE = "acls.db"
"""The store's file name under ``DATA_DIR/_pipeline``."""

COMPONENT = "acls"
"""The store's name in ``schema_version``."""

_COLUMNS = "resource_type, resource_name, pattern_type, principal, host, operation, permission"

MIGRATIONS = (
    # Listed in insertion order: SQLite's rowid; PostgreSQL has none, so a sequence (seq).
    Migration(1, sqlite="""
CREATE TABLE IF NOT EXISTS acls (
    resource_type INTEGER NOT NULL,
    resource_name TEXT NOT NULL,
    pattern_type INTEGER NOT NULL,
    principal TEXT NOT NULL,
    host TEXT NOT NULL,
    operation INTEGER NOT NULL,
    permission INTEGER NOT NULL,
    PRIMARY KEY (resource_type, resource_name, pattern_type, principal, host, operation, permission)
)
""", postgresql="""
CREATE TABLE IF NOT EXISTS acls (
    seq BIGSERIAL NOT NULL,
    resource_type INTEGER NOT NULL,
    resource_name TEXT NOT NULL,
    pattern_type INTEGER NOT NULL,
    principal TEXT NOT NULL,
    host TEXT NOT NULL,
    operation INTEGER NOT NULL,
    permission INTEGER NOT NULL,
    PRIMARY KEY (resource_type, resource_name, pattern_type, principal, host, operation, permission)
)
"""),
)


def _row(acl: AclBinding) -> tuple[int, str, int, str, str, int, int]:
    return (int(acl.resource_type), acl.resource_name, int(acl.pattern_type), acl.principal, acl.host,
            int(acl.operation), int(acl.permission))


class AclStore:
    """The ACL bindings in ``target`` (a SQLite file or a PostgreSQL URL), opened on first use;
    safe to call from worker threads.

    Raises (any method): sqlite3.Error, psycopg.Error when the database cannot be reached;
    ``pipeline.metadata.database.SchemaVersionError`` when its schema is newer than this code.
    """

    def __init__(self, target: Target) -> None:
        self._target = target
        self.path = redact_url(str(target)) if is_postgres_url(target) else target
        """The SQLite file, or the URL without its password (for logs)."""
        self._lock = threading.Lock()
        self._db: Database | None = None

    def _database(self) -> Database:
        with self._lock:
            if self._db is None:
                db = open_database(self._target)
                try:
                    db.migrate(COMPONENT, MIGRATIONS)
                except BaseException:
                    db.close()
                    raise
                self._db = db
            return self._db

    def load(self) -> list[AclBinding]:
        """Every stored binding, in insertion order."""
        db = self._database()
        order = "rowid" if db.dialect == "sqlite" else "seq"
        with db.transaction(write=False) as cur:
            rows = cur.execute(f"SELECT {_COLUMNS} FROM acls ORDER BY {order}").fetchall()
        return [binding(*row) for row in rows]

    def change_version(self) -> int:
        """A number that differs from an earlier read once any process (another broker, on any host)
        committed an ACL change since (``Database.change_version``: one single-row read)."""
        return self._database().change_version(COMPONENT)

    def add(self, acls: Iterable[AclBinding]) -> None:
        """Store ``acls`` (existing ones are kept as they are) in one transaction."""
        self._apply(f"INSERT INTO acls ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING", acls)

    def remove(self, acls: Iterable[AclBinding]) -> None:
        """Delete ``acls`` in one transaction."""
        self._apply("DELETE FROM acls WHERE resource_type = ? AND resource_name = ? AND pattern_type = ? "
                    "AND principal = ? AND host = ? AND operation = ? AND permission = ?", acls)

    def _apply(self, statement: str, acls: Iterable[AclBinding]) -> None:
        rows = [_row(acl) for acl in acls]
        if not rows:
            return
        db = self._database()
        with db.transaction() as cur:
            cur.executemany(statement, rows)
            db.record_change(cur, COMPONENT)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
