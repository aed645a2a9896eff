"""Committed offsets on disk: SQLite at ``DATA_DIR/_pipeline/groups.db``, or PostgreSQL (blocking calls).

Kafka keeps committed offsets in the ``__consumer_offsets`` log; a broker
front end needs only a durable key-value table (``pipeline.metadata.database``):
by default the standard library's sqlite3 in WAL journal mode with
``synchronous=FULL``, so a transaction is on disk (the WAL fsynced) when
``write`` returns and survives a crash or ``kill -9`` of the process; with
``pipeline.metadata.url`` the ``groups`` and ``offsets`` tables of that
PostgreSQL database, committed (flushed by PostgreSQL) when ``write`` returns. A group's protocol type
is stored, so a group known only by its offsets still lists as a consumer group, and so is its last
Stable generation's membership (``StoreMembership``, JSON of
``pipeline.coordinator.coordinator.GroupMembership``: Kafka's group metadata record), so the
members carry on with their ids when another broker becomes their coordinator.

Every method blocks (file or network I/O, fsync): call them from a worker
thread (``pipeline.coordinator.service`` does, through ``trio.to_thread``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.metadata.database import Migration, Target, open_database

STORE_FILE = "groups.db"
"""Its name under ``DATA_DIR/_pipeline``."""

COMPONENT = "groups"
"""The store's name in ``schema_version``."""

MIGRATIONS = (
    Migration(1, sqlite="""
CREATE TABLE IF NOT EXISTS groups (
    group_id TEXT PRIMARY KEY,
    protocol_type TEXT
);
CREATE TABLE IF NOT EXISTS offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    committed_offset INTEGER NOT NULL,
    leader_epoch INTEGER NOT NULL,
    metadata TEXT,
    commit_timestamp_ms INTEGER NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
) WITHOUT ROWID
""", postgresql="""
CREATE TABLE IF NOT EXISTS groups (
    group_id TEXT PRIMARY KEY,
    protocol_type TEXT
);
CREATE TABLE IF NOT EXISTS offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    committed_offset BIGINT NOT NULL,
    leader_epoch INTEGER NOT NULL,
    metadata TEXT,
    commit_timestamp_ms BIGINT NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
)
"""),
    Migration(2, sqlite="ALTER TABLE groups ADD COLUMN membership TEXT",
              postgresql="ALTER TABLE groups ADD COLUMN IF NOT EXISTS membership TEXT"),
)

OffsetValue = tuple[int, int, "str | None"]
"""(committed offset, leader epoch, metadata)."""


@dataclass(frozen=True, slots=True)
class CommitOffsets:
    """Store these offsets of a group (Kafka OffsetCommit); ``timestamp_ms`` is wall-clock ms."""

    group_id: str
    protocol_type: str | None
    offsets: dict[tuple[str, int], OffsetValue]
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class DeleteGroup:
    """Remove a group and all its offsets (Kafka DeleteGroups)."""

    group_id: str


@dataclass(frozen=True, slots=True)
class DeleteOffsets:
    """Remove some offsets of a group (Kafka OffsetDelete, KIP-496)."""

    group_id: str
    partitions: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class StoreMembership:
    """Store a group's membership (a Stable generation, JSON text), or forget it (None: Empty)."""

    group_id: str
    protocol_type: str | None
    membership: str | None


Operation = CommitOffsets | DeleteGroup | DeleteOffsets | StoreMembership


class OffsetStore:
    """The committed offsets in ``target``: a SQLite file, or a PostgreSQL URL.

    Raises:
        sqlite3.Error, psycopg.Error: the database cannot be opened or reached, or is not a database.
        pipeline.metadata.database.SchemaVersionError: its schema is newer than this code.
    """

    def __init__(self, target: Target) -> None:
        self._db = open_database(target)
        self._db.migrate(COMPONENT, MIGRATIONS)
        self.path: Target = target if self._db.dialect == "sqlite" else self._db.name
        """The SQLite file, or the URL without its password (for logs)."""

    def load(self) -> dict[str, tuple[str | None, dict[tuple[str, int], OffsetValue]]]:
        """Every stored group: group id -> (protocol type, {(topic, partition): (offset, epoch, metadata)})."""
        groups: dict[str, tuple[str | None, dict[tuple[str, int], OffsetValue]]] = {}
        with self._db.transaction(write=False) as cur:
            for group_id, protocol_type in cur.execute("SELECT group_id, protocol_type FROM groups"):
                groups[group_id] = (protocol_type, {})
            for group_id, topic, partition, offset, epoch, metadata in cur.execute(
                    "SELECT group_id, topic, partition, committed_offset, leader_epoch, metadata FROM offsets"):
                groups.setdefault(group_id, (None, {}))[1][(topic, partition)] = (offset, epoch, metadata)
        return groups

    def memberships(self) -> dict[str, str]:
        """Every stored membership: group id -> JSON text (``StoreMembership``)."""
        with self._db.transaction(write=False) as cur:
            return {g: m for g, m in cur.execute("SELECT group_id, membership FROM groups "
                                                  "WHERE membership IS NOT NULL")}

    def write(self, operations: list[Operation]) -> None:
        """Apply ``operations`` in order in one transaction; durable (fsynced) when it returns.

        Raises:
            sqlite3.Error, psycopg.Error: nothing of it was stored (the transaction is rolled back).
        """
        with self._db.transaction() as cur:
            for op in operations:
                if isinstance(op, CommitOffsets):
                    cur.execute("INSERT INTO groups (group_id, protocol_type) VALUES (?, ?) "
                                "ON CONFLICT (group_id) DO UPDATE SET protocol_type = "
                                "COALESCE(excluded.protocol_type, groups.protocol_type)",
                                (op.group_id, op.protocol_type))
                    cur.executemany(
                        "INSERT INTO offsets VALUES (?, ?, ?, ?, ?, ?, ?) "
                        "ON CONFLICT (group_id, topic, partition) DO UPDATE SET "
                        "committed_offset = excluded.committed_offset, leader_epoch = excluded.leader_epoch, "
                        "metadata = excluded.metadata, commit_timestamp_ms = excluded.commit_timestamp_ms",
                        [(op.group_id, t, p, o, e, m, op.timestamp_ms) for (t, p), (o, e, m) in op.offsets.items()])
                elif isinstance(op, StoreMembership):
                    cur.execute("INSERT INTO groups (group_id, protocol_type, membership) VALUES (?, ?, ?) "
                                "ON CONFLICT (group_id) DO UPDATE SET membership = excluded.membership, "
                                "protocol_type = COALESCE(excluded.protocol_type, groups.protocol_type)",
                                (op.group_id, op.protocol_type, op.membership))
                elif isinstance(op, DeleteGroup):
                    cur.execute("DELETE FROM offsets WHERE group_id = ?", (op.group_id,))
                    cur.execute("DELETE FROM groups WHERE group_id = ?", (op.group_id,))
                else:
                    cur.executemany("DELETE FROM offsets WHERE group_id = ? AND topic = ? AND partition = ?",
                                    [(op.group_id, t, p) for t, p in op.partitions])

    def close(self) -> None:
        self._db.close()
