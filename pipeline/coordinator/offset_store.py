"""Committed offsets on disk: SQLite at ``DATA_DIR/_pipeline/groups.db`` (blocking calls).

Kafka keeps committed offsets in the ``__consumer_offsets`` log; a single
broker front end needs only a durable key-value table, so this is the
standard library's sqlite3 in WAL journal mode with ``synchronous=FULL``: a
transaction is on disk (the WAL fsynced) when ``write`` returns, and survives
a crash or ``kill -9`` of the process. Group membership is not stored
(members rejoin after a restart); a group's protocol type is, so a group
known only by its offsets still lists as a consumer group.

Every method blocks (file I/O, fsync): call them from one worker thread at a
time (``pipeline.coordinator.service`` does, through ``trio.to_thread``); the
connection is opened with ``check_same_thread=False`` for that.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

STORE_FILE = "groups.db"
"""Its name under ``DATA_DIR/_pipeline``."""

_SCHEMA = """
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
) WITHOUT ROWID;
"""

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


Operation = CommitOffsets | DeleteGroup | DeleteOffsets


class OffsetStore:
    """The SQLite file of committed offsets.

    Raises:
        sqlite3.Error: the file cannot be opened or is not a database.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        if created:
            # The new file's directory entry must be durable too.
            fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def load(self) -> dict[str, tuple[str | None, dict[tuple[str, int], OffsetValue]]]:
        """Every stored group: group id -> (protocol type, {(topic, partition): (offset, epoch, metadata)})."""
        groups: dict[str, tuple[str | None, dict[tuple[str, int], OffsetValue]]] = {}
        for group_id, protocol_type in self._db.execute("SELECT group_id, protocol_type FROM groups"):
            groups[group_id] = (protocol_type, {})
        for group_id, topic, partition, offset, epoch, metadata in self._db.execute(
                "SELECT group_id, topic, partition, committed_offset, leader_epoch, metadata FROM offsets"):
            groups.setdefault(group_id, (None, {}))[1][(topic, partition)] = (offset, epoch, metadata)
        return groups

    def write(self, operations: list[Operation]) -> None:
        """Apply ``operations`` in order in one transaction; durable (fsynced) when it returns.

        Raises:
            sqlite3.Error: nothing of it was stored (the transaction is rolled back).
        """
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for op in operations:
                if isinstance(op, CommitOffsets):
                    db.execute("INSERT INTO groups (group_id, protocol_type) VALUES (?, ?) "
                               "ON CONFLICT (group_id) DO UPDATE SET protocol_type = "
                               "COALESCE(excluded.protocol_type, groups.protocol_type)",
                               (op.group_id, op.protocol_type))
                    db.executemany(
                        "INSERT OR REPLACE INTO offsets VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [(op.group_id, t, p, o, e, m, op.timestamp_ms) for (t, p), (o, e, m) in op.offsets.items()])
                elif isinstance(op, DeleteGroup):
                    db.execute("DELETE FROM offsets WHERE group_id = ?", (op.group_id,))
                    db.execute("DELETE FROM groups WHERE group_id = ?", (op.group_id,))
                else:
                    db.executemany("DELETE FROM offsets WHERE group_id = ? AND topic = ? AND partition = ?",
                                   [(op.group_id, t, p) for t, p in op.partitions])
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._db.close()
