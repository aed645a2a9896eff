"""Producer ids in blocks claimed from the metadata database, so brokers on any host never share one.

Kafka's controller hands out producer ids in blocks of 1000
(``ProducerIdManager``, ``ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE``, KIP-730):
a broker serves InitProducerId from its current block and asks for the next
one when it is used up. Here the block comes from the database itself: one row
holds the next unclaimed id, and a claim is one ``UPDATE ... RETURNING`` that
moves it on, atomic under the row's lock (PostgreSQL) or the write lock
(SQLite), so two brokers never get overlapping blocks and a restarted broker
never reuses its old block's ids.

The first block starts at the database clock's wall-clock ms when the table is
created, as the single-machine broker seeds its ids (``pipeline.server``), so
ids handed out before the switch to a shared database are not handed out again.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from pipeline.metadata.database import Migration, Target, open_database

__all__ = ("PRODUCER_ID_BLOCK_SIZE", "ProducerIdBlock", "ProducerIdManager", "ProducerIdStore")

PRODUCER_ID_BLOCK_SIZE = 1000
"""Ids per claimed block (Kafka ``ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE``)."""

COMPONENT = "producer_ids"
"""The store's name in ``schema_version``."""

MIGRATIONS = (
    Migration(1, sqlite="""
CREATE TABLE IF NOT EXISTS producer_id_blocks (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    next_id INTEGER NOT NULL,
    broker_id INTEGER,
    claimed_ms INTEGER
);
INSERT INTO producer_id_blocks (singleton, next_id)
    VALUES (1, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)) ON CONFLICT DO NOTHING
""", postgresql="""
CREATE TABLE IF NOT EXISTS producer_id_blocks (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    next_id BIGINT NOT NULL,
    broker_id INTEGER,
    claimed_ms BIGINT
);
INSERT INTO producer_id_blocks (singleton, next_id)
    VALUES (1, CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)) ON CONFLICT DO NOTHING
"""),
)


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    """Ids ``first`` .. ``first + size - 1``, claimed by broker ``broker_id`` (Kafka ``ProducerIdsBlock``)."""

    broker_id: int
    first: int
    size: int

    @property
    def last(self) -> int:
        return self.first + self.size - 1


class ProducerIdStore:
    """The ``producer_id_blocks`` row of ``target`` (a SQLite file or a PostgreSQL URL). Blocking calls.

    Raises (constructor): sqlite3.Error, psycopg.Error when the database cannot be reached;
    ``pipeline.metadata.database.SchemaVersionError`` when its schema is newer than this code.
    """

    def __init__(self, target: Target) -> None:
        self._db = open_database(target)
        self._db.migrate(COMPONENT, MIGRATIONS)

    def claim(self, broker_id: int, size: int = PRODUCER_ID_BLOCK_SIZE) -> ProducerIdBlock:
        """Claim the next ``size`` ids for ``broker_id``: no other claim, from any broker, overlaps them.

        Raises:
            ValueError: ``size`` < 1.
            sqlite3.Error, psycopg.Error: nothing was claimed.
        """
        if size < 1:
            raise ValueError(f"block size must be >= 1, got {size}")
        with self._db.transaction() as cur:
            row = cur.execute(f"UPDATE producer_id_blocks SET next_id = next_id + ?, broker_id = ?, "
                              f"claimed_ms = {self._db.now_ms} WHERE singleton = 1 RETURNING next_id",
                              (size, broker_id)).fetchone()
        return ProducerIdBlock(broker_id, int(row[0]) - size, size)

    def close(self) -> None:
        self._db.close()


class ProducerIdManager:
    """An iterator of producer ids for one broker, a block at a time from a ``ProducerIdStore``.

    ``next()`` is thread-safe; it blocks (one database round trip) only when a block is used up,
    once every ``block_size`` ids.

    Raises (``next``): sqlite3.Error, psycopg.Error when a new block cannot be claimed.
    """

    def __init__(self, store: ProducerIdStore, broker_id: int, block_size: int = PRODUCER_ID_BLOCK_SIZE) -> None:
        self.store = store
        self.broker_id = broker_id
        self.block_size = block_size
        self.block: ProducerIdBlock | None = None
        """The block ids are served from now (None before the first ``next``)."""
        self._next = 0
        self._lock = threading.Lock()

    def __iter__(self) -> "ProducerIdManager":
        return self

    def __next__(self) -> int:
        with self._lock:
            if self.block is None or self._next > self.block.last:
                self.block = self.store.claim(self.broker_id, self.block_size)
                self._next = self.block.first
            pid = self._next
            self._next += 1
            return pid
