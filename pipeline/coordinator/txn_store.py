"""Transaction state on disk: SQLite at ``DATA_DIR/_pipeline/transactions.db``, or PostgreSQL (blocking calls).

Kafka keeps transaction state in the ``__transaction_state`` log and loads it
when a broker becomes its coordinator. Here, as for committed offsets
(``pipeline.coordinator.offset_store``), one SQLite file in WAL journal mode
with ``synchronous=FULL`` (``pipeline.metadata.database``): a ``save`` is on
disk when it returns and survives ``kill -9``; with ``pipeline.metadata.url``
the same tables in that PostgreSQL database. Two tables: each transactional id's metadata, and the offsets a
transaction commits for consumer groups (TxnOffsetCommit), which the group
store gets only when the transaction commits (KIP-98, KIP-447).

In a cluster every broker opens the same store, and two more tables carry a transaction's end
to the brokers that did not coordinate it (Kafka sends them WriteTxnMarkers,
``TransactionMarkerChannelManager``): ``txn_markers``, a COMMIT/ABORT marker each partition's
leader must append, and ``txn_group_markers``, the offsets of a group its coordinator must commit
or drop. The transaction's coordinator queues them once its Prepare state is stored; the
partition's leader (the group's coordinator) carries each out and deletes its row; the
coordinator completes the transaction when none of its rows is left.

Call every method from one worker thread at a time (``pipeline.requests.txn_apis``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

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

_MARKER_TABLES = """
CREATE TABLE IF NOT EXISTS txn_markers (
    transactional_id TEXT NOT NULL,
    producer_id BIGINT NOT NULL,
    producer_epoch INTEGER NOT NULL,
    committed INTEGER NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    PRIMARY KEY (transactional_id, topic, partition)
);
CREATE TABLE IF NOT EXISTS txn_group_markers (
    transactional_id TEXT NOT NULL,
    producer_id BIGINT NOT NULL,
    producer_epoch INTEGER NOT NULL,
    committed INTEGER NOT NULL,
    group_id TEXT NOT NULL,
    PRIMARY KEY (transactional_id, group_id)
)"""

# SQLite's BIGINT is its INTEGER (the same affinity), so one text serves both, SQLite's without rowid.
MIGRATIONS = (Migration(1, sqlite=_TABLES + " WITHOUT ROWID", postgresql=_TABLES),
              Migration(2, sqlite=";".join(table + " WITHOUT ROWID" for table in _MARKER_TABLES.split(";")),
                        postgresql=_MARKER_TABLES))

PendingOffsets = dict[str, dict[tuple[str, int], tuple[int, int, "str | None"]]]
"""group id -> {(topic, partition): (offset, leader epoch, metadata)}."""


@dataclass(frozen=True, slots=True)
class QueuedMarker:
    """A transaction's end that a broker other than its coordinator carries out: a COMMIT/ABORT
    marker for ``topic``-``partition`` (``group_id`` None), or the pending offsets of ``group_id`` to
    commit or drop (``topic`` "", ``partition`` -1)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool
    topic: str = ""
    partition: int = -1
    group_id: str | None = None


Fence = tuple[str, int, int, int]
"""(``__consumer_offsets``, partition, leader id, leader epoch): with leadership through the database, a
coordinator's write stands only while that broker still leads that partition at that epoch (Kafka fences
a coordinator's ``__transaction_state`` appends by the partition's leader epoch)."""


class NotCoordinatorError(RuntimeError):
    """A coordinator's write was fenced: its ``__consumer_offsets`` partition moved (Kafka NOT_COORDINATOR)."""


_COLUMNS = ("transactional_id, producer_id, producer_epoch, state, timeout_ms, partitions, groups, "
            "start_ms, update_ms, last_epoch")


def _metadata(row: tuple) -> TransactionMetadata:
    tid, pid, epoch, state, timeout_ms, partitions, groups, start_ms, update_ms, last_epoch = row
    return TransactionMetadata(tid, pid, epoch, timeout_ms, TxnState(state), last_epoch,
                               {(t, p) for t, p in json.loads(partitions)}, set(json.loads(groups)), start_ms,
                               update_ms)


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

    def load(self, coordinates: Callable[[str], bool] = lambda tid: True,
             coordinates_group: Callable[[str], bool] = lambda group: True
             ) -> tuple[list[TransactionMetadata], dict[str, PendingOffsets]]:
        """The stored transactional ids ``coordinates`` accepts (in a cluster: those this broker
        coordinates), and the pending offsets of the groups ``coordinates_group`` accepts
        (transactional id -> group -> offsets)."""
        pending: dict[str, PendingOffsets] = {}
        with self._db.transaction(write=False) as cur:
            metas = [_metadata(row) for row in cur.execute(f"SELECT {_COLUMNS} FROM transactions")
                     if coordinates(row[0])]
            for tid, group, topic, partition, offset, epoch, metadata in cur.execute(
                    "SELECT transactional_id, group_id, topic, partition, committed_offset, leader_epoch, metadata "
                    "FROM pending_offsets"):
                if coordinates_group(group):
                    pending.setdefault(tid, {}).setdefault(group, {})[(topic, partition)] = (offset, epoch, metadata)
        return metas, pending

    def read(self, transactional_id: str) -> TransactionMetadata | None:
        """One transactional id's stored metadata (a broker that does not coordinate it verifies a
        produce or TxnOffsetCommit against it), or None."""
        with self._db.transaction(write=False) as cur:
            row = cur.execute(f"SELECT {_COLUMNS} FROM transactions WHERE transactional_id = ?",
                              (transactional_id,)).fetchone()
        return None if row is None else _metadata(row)

    def add_pending_if_ongoing(self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str,
                               offsets: dict[tuple[str, int], tuple[int, int, str | None]], fenced: int) -> int:
        """TxnOffsetCommit at a group coordinator that does not coordinate ``transactional_id``:
        store ``offsets`` as the group's pending offsets only if the stored transaction is the
        producer's (``producer_id``, ``producer_epoch``), Ongoing and has ``group_id`` (AddOffsetsToTxn);
        one database transaction with the stored state's row locked, so that the coordinator's Prepare
        state (and with it the group's marker) comes after this write or this write sees it.
        Returns NONE, or the error (INVALID_PRODUCER_ID_MAPPING, ``fenced`` for another epoch,
        CONCURRENT_TRANSACTIONS while it ends, INVALID_TXN_STATE).

        Raises:
            sqlite3.Error, psycopg.Error: nothing was stored.
        """
        lock = " FOR SHARE" if self._db.dialect == "postgresql" else ""
        with self._db.transaction() as cur:
            row = cur.execute(f"SELECT {_COLUMNS} FROM transactions WHERE transactional_id = ?{lock}",
                              (transactional_id,)).fetchone()
            meta = None if row is None else _metadata(row)
            if meta is None or meta.producer_id != producer_id:
                return ErrorCode.invalid_producer_id_mapping.value
            if meta.producer_epoch != producer_epoch:
                return fenced
            if meta.state.preparing:
                return ErrorCode.concurrent_transactions.value
            if meta.state is not TxnState.ONGOING or group_id not in meta.groups:
                return ErrorCode.invalid_txn_state.value
            self._add_pending(cur, transactional_id, {group_id: offsets})
        return ErrorCode.none.value

    @staticmethod
    def _add_pending(cur: object, transactional_id: str, pending: PendingOffsets) -> None:
        for group, offsets in pending.items():
            cur.executemany(  # type: ignore[attr-defined]
                "INSERT INTO pending_offsets VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (transactional_id, group_id, topic, partition) DO UPDATE SET "
                "committed_offset = excluded.committed_offset, leader_epoch = excluded.leader_epoch, "
                "metadata = excluded.metadata",
                [(transactional_id, group, t, p, o, e, m) for (t, p), (o, e, m) in offsets.items()])

    def _check(self, cur: object, fence: Fence | None) -> None:
        """Raise NotCoordinatorError unless ``fence``'s leader leads its partition at its epoch (the row
        locked until the transaction ends, ``FOR SHARE`` on PostgreSQL: the controller's move of it waits).
        Needs the leadership tables in this database (``pipeline.metadata.leadership``)."""
        if fence is None:
            return
        topic, partition, leader_id, leader_epoch = fence
        lock = " FOR SHARE" if self._db.dialect == "postgresql" else ""
        row = cur.execute(  # type: ignore[attr-defined]
            f"SELECT leader_id, leader_epoch FROM partition_leaders WHERE topic = ? AND partition = ?{lock}",
            (topic, partition)).fetchone()
        if row is None or (int(row[0]), int(row[1])) != (leader_id, leader_epoch):
            raise NotCoordinatorError(f"broker {leader_id} no longer leads {topic}-{partition} at leader epoch "
                                      f"{leader_epoch} (now: {tuple(row) if row else None})")

    def save(self, meta: TransactionMetadata, pending: PendingOffsets | None = None,
             clear_pending: bool | Iterable[str] = False, fence: Fence | None = None) -> None:
        """Store ``meta``, add ``pending`` offsets, or drop its pending offsets (``clear_pending``: all
        of them, or those of the groups it names), in one transaction; durable when it returns.
        ``fence``: only while that broker leads that partition at that epoch (``Fence``).

        Raises:
            sqlite3.Error, psycopg.Error: nothing of it was stored.
            NotCoordinatorError: ``fence`` failed; nothing was stored.
        """
        with self._db.transaction() as cur:
            self._check(cur, fence)
            cur.execute(
                "INSERT INTO transactions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (transactional_id) DO UPDATE SET producer_id = excluded.producer_id, "
                "producer_epoch = excluded.producer_epoch, last_epoch = excluded.last_epoch, "
                "state = excluded.state, timeout_ms = excluded.timeout_ms, partitions = excluded.partitions, "
                "groups = excluded.groups, start_ms = excluded.start_ms, update_ms = excluded.update_ms", (
                    meta.transactional_id, meta.producer_id, meta.producer_epoch, meta.last_epoch,
                    meta.state.value, meta.timeout_ms, json.dumps(sorted(meta.partitions)),
                    json.dumps(sorted(meta.groups)), meta.start_ms, meta.update_ms))
            if clear_pending is True:
                cur.execute("DELETE FROM pending_offsets WHERE transactional_id = ?", (meta.transactional_id,))
            elif clear_pending:
                cur.executemany("DELETE FROM pending_offsets WHERE transactional_id = ? AND group_id = ?",
                                [(meta.transactional_id, g) for g in clear_pending])
            self._add_pending(cur, meta.transactional_id, pending or {})

    # -- the transaction's end on other brokers ----------------------------------------

    def queue_markers(self, markers: Iterable[QueuedMarker], fence: Fence | None = None) -> None:
        """Queue ``markers`` for the brokers that carry them out (a queued one again: replaced);
        ``fence`` as ``save``'s.

        Raises:
            sqlite3.Error, psycopg.Error: none was queued.
            NotCoordinatorError: ``fence`` failed; none was queued.
        """
        markers = list(markers)
        with self._db.transaction() as cur:
            self._check(cur, fence)
            cur.executemany(
                "INSERT INTO txn_markers VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (transactional_id, topic, partition) "
                "DO UPDATE SET producer_id = excluded.producer_id, producer_epoch = excluded.producer_epoch, "
                "committed = excluded.committed",
                [(m.transactional_id, m.producer_id, m.producer_epoch, int(m.committed), m.topic, m.partition)
                 for m in markers if m.group_id is None])
            cur.executemany(
                "INSERT INTO txn_group_markers VALUES (?, ?, ?, ?, ?) ON CONFLICT (transactional_id, group_id) "
                "DO UPDATE SET producer_id = excluded.producer_id, producer_epoch = excluded.producer_epoch, "
                "committed = excluded.committed",
                [(m.transactional_id, m.producer_id, m.producer_epoch, int(m.committed), m.group_id)
                 for m in markers if m.group_id is not None])

    def queued(self, transactional_id: str | None = None) -> list[QueuedMarker]:
        """The queued markers (of ``transactional_id`` only, when given)."""
        where, args = ("", ()) if transactional_id is None else (" WHERE transactional_id = ?", (transactional_id,))
        with self._db.transaction(write=False) as cur:
            out = [QueuedMarker(tid, pid, epoch, bool(committed), topic, partition)
                   for tid, pid, epoch, committed, topic, partition in cur.execute(
                       "SELECT transactional_id, producer_id, producer_epoch, committed, topic, partition "
                       f"FROM txn_markers{where}", args)]
            out += [QueuedMarker(tid, pid, epoch, bool(committed), group_id=group)
                    for tid, pid, epoch, committed, group in cur.execute(
                        "SELECT transactional_id, producer_id, producer_epoch, committed, group_id "
                        f"FROM txn_group_markers{where}", args)]
        return out

    def done(self, markers: Iterable[QueuedMarker]) -> None:
        """``markers`` are carried out: their rows go (a group's with its pending offsets), each only if
        still queued for the same producer epoch and result.

        Raises:
            sqlite3.Error, psycopg.Error: nothing was deleted.
        """
        markers = list(markers)
        with self._db.transaction() as cur:
            cur.executemany(
                "DELETE FROM txn_markers WHERE transactional_id = ? AND topic = ? AND partition = ? "
                "AND producer_epoch = ? AND committed = ?",
                [(m.transactional_id, m.topic, m.partition, m.producer_epoch, int(m.committed))
                 for m in markers if m.group_id is None])
            groups = [(m.transactional_id, m.group_id, m.producer_epoch, int(m.committed))
                      for m in markers if m.group_id is not None]
            cur.executemany(
                "DELETE FROM txn_group_markers WHERE transactional_id = ? AND group_id = ? "
                "AND producer_epoch = ? AND committed = ?", groups)
            cur.executemany("DELETE FROM pending_offsets WHERE transactional_id = ? AND group_id = ?",
                            [(tid, group) for tid, group, _e, _c in groups])

    def close(self) -> None:
        self._db.close()
