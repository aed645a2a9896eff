"""Transaction state on disk: SQLite at ``DATA_DIR/_pipeline/transactions.db``, or PostgreSQL (blocking calls).

Kafka keeps transaction state in the ``__transaction_state`` log and loads it
when a broker becomes its coordinator. Here, as for committed offsets
(``pipeline.coordinator.offset_store``), one SQLite file in WAL journal mode
with ``synchronous=FULL`` (``pipeline.metadata.database``): a ``save`` is on
disk when it returns and survives ``kill -9``; with ``pipeline.metadata.url``
the same tables in that PostgreSQL database. Two tables: each transactional id's metadata, and the offsets a
transaction commits for consumer groups (TxnOffsetCommit), which the group
store gets only when the transaction commits (KIP-98, KIP-447).

Call every method from one worker thread at a time (``pipeline.requests.txn_apis``).
"""

from __future__ import annotations

import json

from pipeline.metadata.database import Migration, Target, open_database
from pipeline.coordinator.transactions import TransactionMetadata, TxnState

STORE_FILE = "transactions.db"
"""Its name under ``DATA_DIR/_pipeline``."""

COMPONENT = "transactions"
"""The store's name in ``schema_version``."""

_TABLES = """
CREATE TABLE IF NOT EXISTS transactions (
    transactional_id TEXT PRIMARY KEY,
    producer_id BIGINT NOT NULL,
    producer_epoch INTEGER NOT NULL,
    last_epoch INTEGER NOT NULL,
    state TEXT NOT NULL,
    timeout_ms INTEGER NOT NULL,
    partitions TEXT NOT NULL,
    groups TEXT NOT NULL,
    start_ms BIGINT NOT NULL,
    update_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS pending_offsets (
    transactional_id TEXT NOT NULL,
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    committed_offset BIGINT NOT NULL,
    leader_epoch INTEGER NOT NULL,
    metadata TEXT,
    PRIMARY KEY (transactional_id, group_id, topic, partition)
)"""

# SQLite's BIGINT is its INTEGER (the same affinity), so one text serves both, SQLite's without rowid.
MIGRATIONS = (Migration(1, sqlite=_TABLES + " WITHOUT ROWID", postgresql=_TABLES),)

PendingOffsets = dict[str, dict[tuple[str, int], tuple[int, int, "str | None"]]]
"""group id -> {(topic, partition): (offset, leader epoch, metadata)}."""


class TransactionStore:
    """The transaction state in ``target``: a SQLite file, or a PostgreSQL URL.

    Raises:
        sqlite3.Error, psycopg.Error: the database cannot be opened or reached, or is not a database.
        pipeline.metadata.database.SchemaVersionError: its schema is newer than this code.
    """

    def __init__(self, target: Target) -> None:
        self._db = open_database(target)
        self._db.migrate(COMPONENT, MIGRATIONS)
        self.path: Target = target if self._db.dialect == "sqlite" else self._db.name
        """The SQLite file, or the URL without its password (for logs)."""

    def load(self) -> tuple[list[TransactionMetadata], dict[str, PendingOffsets]]:
        """Every stored transactional id, and each one's pending offsets."""
        metas = []
        pending: dict[str, PendingOffsets] = {}
        with self._db.transaction(write=False) as cur:
            for (tid, pid, epoch, last_epoch, state, timeout_ms, partitions, groups, start_ms,
                 update_ms) in cur.execute(
                    "SELECT transactional_id, producer_id, producer_epoch, last_epoch, state, timeout_ms, "
                    "partitions, groups, start_ms, update_ms FROM transactions"):
                metas.append(TransactionMetadata(
                    tid, pid, epoch, timeout_ms, TxnState(state), last_epoch,
                    {(t, p) for t, p in json.loads(partitions)}, set(json.loads(groups)), start_ms, update_ms))
            for tid, group, topic, partition, offset, epoch, metadata in cur.execute(
                    "SELECT transactional_id, group_id, topic, partition, committed_offset, leader_epoch, metadata "
                    "FROM pending_offsets"):
                pending.setdefault(tid, {}).setdefault(group, {})[(topic, partition)] = (offset, epoch, metadata)
        return metas, pending

    def save(self, meta: TransactionMetadata, pending: PendingOffsets | None = None,
             clear_pending: bool = False) -> None:
        """Store ``meta``, add ``pending`` offsets, or drop its pending offsets (``clear_pending``),
        in one transaction; durable when it returns.

        Raises:
            sqlite3.Error, psycopg.Error: nothing of it was stored.
        """
        with self._db.transaction() as cur:
            cur.execute(
                "INSERT INTO transactions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (transactional_id) DO UPDATE SET producer_id = excluded.producer_id, "
                "producer_epoch = excluded.producer_epoch, last_epoch = excluded.last_epoch, "
                "state = excluded.state, timeout_ms = excluded.timeout_ms, partitions = excluded.partitions, "
                "groups = excluded.groups, start_ms = excluded.start_ms, update_ms = excluded.update_ms", (
                    meta.transactional_id, meta.producer_id, meta.producer_epoch, meta.last_epoch,
                    meta.state.value, meta.timeout_ms, json.dumps(sorted(meta.partitions)),
                    json.dumps(sorted(meta.groups)), meta.start_ms, meta.update_ms))
            if clear_pending:
                cur.execute("DELETE FROM pending_offsets WHERE transactional_id = ?", (meta.transactional_id,))
            for group, offsets in (pending or {}).items():
                cur.executemany(
                    "INSERT INTO pending_offsets VALUES (?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (transactional_id, group_id, topic, partition) DO UPDATE SET "
                    "committed_offset = excluded.committed_offset, leader_epoch = excluded.leader_epoch, "
                    "metadata = excluded.metadata",
                    [(meta.transactional_id, group, t, p, o, e, m) for (t, p), (o, e, m) in offsets.items()])

    def close(self) -> None:
        self._db.close()
