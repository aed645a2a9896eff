"""The topic store: topics and their config overrides, in SQLite beside the WAL or in PostgreSQL.

Kafka keeps topics in its metadata log (KRaft) or ZooKeeper; a front end
needs a small durable table (``pipeline.metadata.database``): by default
SQLite through the standard library, ``DATA_DIR/_pipeline/topics.db``, WAL
journal mode with ``synchronous=FULL`` so every committed change survives a
power cut (one fsync of the -wal file per commit, ~1-5 ms); with
``pipeline.metadata.url`` the ``topics`` tables of that PostgreSQL database,
shared by brokers on several hosts. A change is one transaction.

Every method blocks (file or network I/O); the admin apis call them through
``trio.to_thread.run_sync``. One connection guarded by a lock serves every
thread.

Data dirs from before the store hold their topics only in the checkpoint
(``pipeline.log.checkpoint.Checkpoint.topics``): ``import_legacy`` takes them
once, the first time the store is opened, and records that it did, so a topic
deleted later is never brought back from an old checkpoint.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from pipeline.metadata.database import Cursor, Migration, Target, open_database

FILE = "topics.db"
COMPONENT = "topics"
"""The store's name in ``schema_version``."""

MIGRATIONS = (
    # Version 1 is the schema SQLite files had before schema_version (PRAGMA user_version 1): IF NOT
    # EXISTS makes it a no-op on them. Its topic_changes counter on PostgreSQL gave way in version 2 to
    # the change version every store has (Database.record_change), on both backends.
    Migration(1, sqlite="""
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
)
""", postgresql="""
CREATE TABLE IF NOT EXISTS topics (
    name        TEXT PRIMARY KEY,
    partitions  INTEGER NOT NULL CHECK (partitions >= 1),
    topic_id    TEXT NOT NULL,
    created_ms  BIGINT NOT NULL
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
CREATE TABLE IF NOT EXISTS topic_changes (
    singleton  INTEGER PRIMARY KEY CHECK (singleton = 1),
    version    BIGINT NOT NULL
);
INSERT INTO topic_changes VALUES (1, 0) ON CONFLICT DO NOTHING
"""),
    Migration(2, sqlite="", postgresql="DROP TABLE IF EXISTS topic_changes"),
)


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
    """Topics and config overrides in ``target``: a SQLite file, or a PostgreSQL URL (see the
    module docstring).

    Raises (constructor):
        sqlite3.Error, psycopg.Error: the database cannot be opened or reached.
        pipeline.metadata.database.SchemaVersionError: its schema is newer than this code.
    """

    def __init__(self, target: Target) -> None:
        self._db = open_database(target)
        self._db.migrate(COMPONENT, MIGRATIONS)
        self._pg = self._db.dialect == "postgresql"
        self.path: Target = self._db.name if self._pg else target
        """The SQLite file, or the URL without its password (for logs)."""

    def close(self) -> None:
        self._db.close()

    def _changed(self, cur: Cursor) -> None:
        """Count the change in the writing transaction (``change_version``)."""
        self._db.record_change(cur, COMPONENT)

    # -- reads -------------------------------------------------------------------

    def load(self) -> list[StoredTopic]:
        """Every stored topic with its config overrides, by name."""
        with self._db.transaction(write=False) as cur:
            rows = cur.execute("SELECT name, partitions, topic_id, created_ms FROM topics ORDER BY name").fetchall()
            configs: dict[str, dict[str, str]] = {}
            for topic, name, value in cur.execute("SELECT topic, name, value FROM topic_configs "
                                                  "ORDER BY topic, name"):
                configs.setdefault(topic, {})[name] = value
        return [StoredTopic(name, partitions, uuid.UUID(topic_id), created_ms,
                            MappingProxyType(configs.get(name, {})))
                for name, partitions, topic_id, created_ms in rows]

    def change_version(self) -> int:
        """A number that differs from an earlier read once any process (another broker of a cluster,
        on any host) committed a change to the topics since (``Database.change_version``: one
        single-row read)."""
        return self._db.change_version(COMPONENT)

    @property
    def legacy_imported(self) -> bool:
        """True once ``import_legacy`` has run on this store (or the store was created by it)."""
        with self._db.transaction(write=False) as cur:
            return cur.execute("SELECT 1 FROM meta WHERE key = 'legacy_imported'").fetchone() is not None

    # -- writes (one transaction each) -------------------------------------------

    def import_legacy(self, topics: list[StoredTopic]) -> None:
        """Store ``topics`` that are not stored yet and mark the import done (idempotent)."""
        with self._db.transaction() as cur:
            cur.executemany("INSERT INTO topics VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                            [(t.name, t.partitions, str(t.topic_id), t.created_ms) for t in topics])
            cur.execute("INSERT INTO meta VALUES ('legacy_imported', '1') ON CONFLICT DO NOTHING")
            self._changed(cur)

    def insert(self, topic: StoredTopic) -> None:
        """Store a new topic and its configs.

        Raises:
            TopicExistsError: ``topic.name`` is stored already.
        """
        with self._db.transaction() as cur:
            if cur.execute("INSERT INTO topics VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                           (topic.name, topic.partitions, str(topic.topic_id), topic.created_ms)).rowcount == 0:
                raise TopicExistsError(f"Topic '{topic.name}' already exists.")
            cur.executemany("INSERT INTO topic_configs VALUES (?, ?, ?)",
                            [(topic.name, k, v) for k, v in topic.configs.items()])
            self._changed(cur)

    def set_partitions(self, name: str, partitions: int) -> None:
        """Change a topic's partition count.

        Raises:
            NoSuchTopicError: not stored.
        """
        with self._db.transaction() as cur:
            if cur.execute("UPDATE topics SET partitions = ? WHERE name = ?", (partitions, name)).rowcount == 0:
                raise NoSuchTopicError(name)
            self._changed(cur)

    def set_configs(self, name: str, configs: Mapping[str, str]) -> None:
        """Replace all of a topic's config overrides with ``configs``.

        Raises:
            NoSuchTopicError: not stored.
        """
        with self._db.transaction() as cur:
            if cur.execute("SELECT 1 FROM topics WHERE name = ?", (name,)).fetchone() is None:
                raise NoSuchTopicError(name)
            cur.execute("DELETE FROM topic_configs WHERE topic = ?", (name,))
            cur.executemany("INSERT INTO topic_configs VALUES (?, ?, ?)", [(name, k, v) for k, v in configs.items()])
            self._changed(cur)

    def delete(self, name: str) -> bool:
        """Forget a topic and its configs; False if it was not stored."""
        with self._db.transaction() as cur:
            deleted = cur.execute("DELETE FROM topics WHERE name = ?", (name,)).rowcount > 0
            if deleted:
                self._changed(cur)
            return deleted
