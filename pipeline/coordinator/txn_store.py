"""Transaction state on disk: SQLite at ``DATA_DIR/_pipeline/transactions.db`` (blocking calls).

Kafka keeps transaction state in the ``__transaction_state`` log and loads it
when a broker becomes its coordinator. Here, as for committed offsets
(``pipeline.coordinator.offset_store``), one SQLite file in WAL journal mode
with ``synchronous=FULL``: a ``save`` is on disk when it returns and survives
``kill -9``. Two tables: each transactional id's metadata, and the offsets a
transaction commits for consumer groups (TxnOffsetCommit), which the group
store gets only when the transaction commits (KIP-98, KIP-447).

Call every method from one worker thread at a time (``pipeline.requests.txn_apis``).
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from pipeline.coordinator.transactions import TransactionMetadata, TxnState

STORE_FILE = "transactions.db"
"""Its name under ``DATA_DIR/_pipeline``."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS transactions (
    transactional_id TEXT PRIMARY KEY,
    producer_id INTEGER NOT NULL,
    producer_epoch INTEGER NOT NULL,
    last_epoch INTEGER NOT NULL,
    state TEXT NOT NULL,
    timeout_ms INTEGER NOT NULL,
    partitions TEXT NOT NULL,
    groups TEXT NOT NULL,
    start_ms INTEGER NOT NULL,
    update_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS pending_offsets (
    transactional_id TEXT NOT NULL,
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    committed_offset INTEGER NOT NULL,
    leader_epoch INTEGER NOT NULL,
    metadata TEXT,
    PRIMARY KEY (transactional_id, group_id, topic, partition)
) WITHOUT ROWID;
"""

PendingOffsets = dict[str, dict[tuple[str, int], tuple[int, int, "str | None"]]]
"""group id -> {(topic, partition): (offset, leader epoch, metadata)}."""


class TransactionStore:
    """The SQLite file of transaction state.

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
            fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def load(self) -> tuple[list[TransactionMetadata], dict[str, PendingOffsets]]:
        """Every stored transactional id, and each one's pending offsets."""
        metas = []
        for (tid, pid, epoch, last_epoch, state, timeout_ms, partitions, groups, start_ms,
             update_ms) in self._db.execute("SELECT * FROM transactions"):
            metas.append(TransactionMetadata(
                tid, pid, epoch, timeout_ms, TxnState(state), last_epoch,
                {(t, p) for t, p in json.loads(partitions)}, set(json.loads(groups)), start_ms, update_ms))
        pending: dict[str, PendingOffsets] = {}
        for tid, group, topic, partition, offset, epoch, metadata in self._db.execute(
                "SELECT * FROM pending_offsets"):
            pending.setdefault(tid, {}).setdefault(group, {})[(topic, partition)] = (offset, epoch, metadata)
        return metas, pending

    def save(self, meta: TransactionMetadata, pending: PendingOffsets | None = None,
             clear_pending: bool = False) -> None:
        """Store ``meta``, add ``pending`` offsets, or drop its pending offsets (``clear_pending``),
        in one transaction; durable when it returns.

        Raises:
            sqlite3.Error: nothing of it was stored.
        """
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("INSERT OR REPLACE INTO transactions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (
                meta.transactional_id, meta.producer_id, meta.producer_epoch, meta.last_epoch, meta.state.value,
                meta.timeout_ms, json.dumps(sorted(meta.partitions)), json.dumps(sorted(meta.groups)),
                meta.start_ms, meta.update_ms))
            if clear_pending:
                db.execute("DELETE FROM pending_offsets WHERE transactional_id = ?", (meta.transactional_id,))
            for group, offsets in (pending or {}).items():
                db.executemany("INSERT OR REPLACE INTO pending_offsets VALUES (?, ?, ?, ?, ?, ?, ?)", [
                    (meta.transactional_id, group, t, p, o, e, m) for (t, p), (o, e, m) in offsets.items()])
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._db.close()
