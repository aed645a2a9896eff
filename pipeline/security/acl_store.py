"""ACLs on disk: SQLite at ``DATA_DIR/_pipeline/acls.db``.

Kafka keeps ACLs in ZooKeeper or the KRaft metadata log; a single broker
keeps them in SQLite like its topics (``topics.db``) and group offsets
(``groups.db``): WAL journal, ``synchronous=FULL``, so a CreateAcls or
DeleteAcls answered is on disk. The methods block (file I/O): the admin
handlers call them through ``trio.to_thread.run_sync``; ``load`` runs once
at start.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

from pipeline.security.acl import AclBinding, binding

__all__ = ("ACL_STORE_FILE", "AclStore")

ACL_STORE_FILE = "acls.db"
"""The store's file name under ``DATA_DIR/_pipeline``."""

_SCHEMA = """
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
"""


def _row(acl: AclBinding) -> tuple[int, str, int, str, str, int, int]:
    return (int(acl.resource_type), acl.resource_name, int(acl.pattern_type), acl.principal, acl.host,
            int(acl.operation), int(acl.permission))


class AclStore:
    """The ACL bindings in one SQLite file; safe to call from worker threads (one at a time, a lock)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute(_SCHEMA)
            self._db = db
        return self._db

    def load(self) -> list[AclBinding]:
        """Every stored binding, in insertion order."""
        with self._lock:
            rows = self._connection().execute(
                "SELECT resource_type, resource_name, pattern_type, principal, host, operation, permission "
                "FROM acls ORDER BY rowid").fetchall()
        return [binding(*row) for row in rows]

    def add(self, acls: Iterable[AclBinding]) -> None:
        """Store ``acls`` (existing ones are kept as they are) in one transaction."""
        self._apply("INSERT OR IGNORE INTO acls VALUES (?, ?, ?, ?, ?, ?, ?)", acls)

    def remove(self, acls: Iterable[AclBinding]) -> None:
        """Delete ``acls`` in one transaction."""
        self._apply("DELETE FROM acls WHERE resource_type = ? AND resource_name = ? AND pattern_type = ? "
                    "AND principal = ? AND host = ? AND operation = ? AND permission = ?", acls)

    def _apply(self, statement: str, acls: Iterable[AclBinding]) -> None:
        rows = [_row(acl) for acl in acls]
        if not rows:
            return
        with self._lock:
            db = self._connection()
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(statement, rows)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
