"""The topic store: topics and their config overrides in SQLite, beside the WAL.

Kafka keeps topics in its metadata log (KRaft) or ZooKeeper; a front end
with one broker needs a small durable table, so SQLite through the standard
library: ``DATA_DIR/_pipeline/topics.db``, WAL journal mode with
``synchronous=FULL`` so every committed change survives a power cut (one
fsync of the -wal file per commit, ~1-5 ms). A change is one transaction.

Every method blocks (file I/O); the admin apis call them through
``trio.to_thread.run_sync``. One connection guarded by a lock serves every
thread.

Data dirs from before the store hold their topics only in the checkpoint
(``pipeline.log.checkpoint.Checkpoint.topics``): ``import_legacy`` takes them
once, the first time the store is opened, and records that it did, so a topic
deleted later is never brought back from an old checkpoint.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

FILE = "topics.db"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    name        TEXT PRIMARY KEY,
    partitions  INTEGER NOT NULL CHECK (partitions >= 1),
    topic_id    TEXT NOT NULL,
    created_ms  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS topic_configs (
    topic  TEXT NOT NULL REFERENCES topics (name) ON DELETE CASCADE,
    name   TEXT NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (topic, name)
);
CREATE TABLE IF NOT EXISTS meta (
    key    TEXT PRIMARY KEY,
    value  TEXT NOT NULL
);
"""


class TopicExistsError(ValueError):
    """A topic of that name is already stored."""


class NoSuchTopicError(LookupError):
    """No topic of that name is stored."""


@dataclass(frozen=True, slots=True)
class StoredTopic:
    """One topic as stored.

    Attributes:
        name: the topic name (Kafka ``Topic.validate`` rules, checked by the caller).
        partitions: partition count (>= 1).
        topic_id: Kafka's topic id (KIP-516).
        created_ms: creation time, wall-clock ms since the epoch.
        configs: topic config overrides, name -> value as Kafka sends them (strings).
    """

    name: str
    partitions: int
    topic_id: uuid.UUID
    created_ms: int
    configs: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


class TopicStore:
    """Topics and config overrides in ``path`` (SQLite). See the module docstring.

    Raises (constructor):
        sqlite3.DatabaseError: the file is not a database, or its schema is newer than this code.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"{self.path}: schema version {version} is newer than {SCHEMA_VERSION}")
        if version == 0:
            self._db.executescript(f"BEGIN;{_SCHEMA}PRAGMA user_version={SCHEMA_VERSION};COMMIT;")

    def _transaction(self) -> "_Locked":
        """The connection, held by this thread for the ``with`` block."""
        return _Locked(self._lock, self._db)

    def close(self) -> None:
        with self._transaction() as db:
            db.close()

    # -- reads -------------------------------------------------------------------

    def load(self) -> list[StoredTopic]:
        """Every stored topic with its config overrides, by name."""
        with self._transaction() as db:
            rows = db.execute("SELECT name, partitions, topic_id, created_ms FROM topics ORDER BY name").fetchall()
            configs: dict[str, dict[str, str]] = {}
            for topic, name, value in db.execute("SELECT topic, name, value FROM topic_configs ORDER BY topic, name"):
                configs.setdefault(topic, {})[name] = value
        return [StoredTopic(name, partitions, uuid.UUID(topic_id), created_ms,
                            MappingProxyType(configs.get(name, {})))
                for name, partitions, topic_id, created_ms in rows]

    def data_version(self) -> int:
        """SQLite's ``PRAGMA data_version``: changes whenever another connection (another
        broker process of a cluster) committed a change since the last call. Cheap (no I/O
        beyond the shared-memory index)."""
        with self._transaction() as db:
            return db.execute("PRAGMA data_version").fetchone()[0]

    @property
    def legacy_imported(self) -> bool:
        """True once ``import_legacy`` has run on this store (or the store was created by it)."""
        with self._transaction() as db:
            return db.execute("SELECT 1 FROM meta WHERE key = 'legacy_imported'").fetchone() is not None

    # -- writes (one transaction each) -------------------------------------------

    def import_legacy(self, topics: list[StoredTopic]) -> None:
        """Store ``topics`` that are not stored yet and mark the import done (idempotent)."""
        with self._transaction() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                for t in topics:
                    db.execute("INSERT OR IGNORE INTO topics VALUES (?, ?, ?, ?)",
                               (t.name, t.partitions, str(t.topic_id), t.created_ms))
                db.execute("INSERT OR REPLACE INTO meta VALUES ('legacy_imported', '1')")
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def insert(self, topic: StoredTopic) -> None:
        """Store a new topic and its configs.

        Raises:
            TopicExistsError: ``topic.name`` is stored already.
        """
        with self._transaction() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                try:
                    db.execute("INSERT INTO topics VALUES (?, ?, ?, ?)",
                               (topic.name, topic.partitions, str(topic.topic_id), topic.created_ms))
                except sqlite3.IntegrityError:
                    raise TopicExistsError(f"Topic '{topic.name}' already exists.") from None
                db.executemany("INSERT INTO topic_configs VALUES (?, ?, ?)",
                               [(topic.name, k, v) for k, v in topic.configs.items()])
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def set_partitions(self, name: str, partitions: int) -> None:
        """Change a topic's partition count.

        Raises:
            NoSuchTopicError: not stored.
        """
        with self._transaction() as db:
            if db.execute("UPDATE topics SET partitions = ? WHERE name = ?", (partitions, name)).rowcount == 0:
                raise NoSuchTopicError(name)

    def set_configs(self, name: str, configs: Mapping[str, str]) -> None:
        """Replace all of a topic's config overrides with ``configs``.

        Raises:
            NoSuchTopicError: not stored.
        """
        with self._transaction() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                if db.execute("SELECT 1 FROM topics WHERE name = ?", (name,)).fetchone() is None:
                    raise NoSuchTopicError(name)
                db.execute("DELETE FROM topic_configs WHERE topic = ?", (name,))
                db.executemany("INSERT INTO topic_configs VALUES (?, ?, ?)",
                               [(name, k, v) for k, v in configs.items()])
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def delete(self, name: str) -> bool:
        """Forget a topic and its configs; False if it was not stored."""
        with self._transaction() as db:
            return db.execute("DELETE FROM topics WHERE name = ?", (name,)).rowcount > 0


class _Locked:
    __slots__ = ("_lock", "_db")

    def __init__(self, lock: threading.Lock, db: sqlite3.Connection) -> None:
        self._lock, self._db = lock, db

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        return self._db

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
