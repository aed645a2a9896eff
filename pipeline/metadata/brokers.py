"""Broker membership with leases in the metadata database (blocking calls).

Kafka's KRaft controller keeps broker registrations (``BrokerRegistration``:
node id, incarnation id, endpoints, epoch) and fences a broker whose
heartbeats stop for ``broker.session.timeout.ms`` (KIP-631). Here the
``brokers`` table of the shared database plays that part, with no controller
needed for it:

- ``register`` writes a broker's row with a new **epoch** (the old one + 1) and
  a lease; it is refused (``DuplicateBrokerError``, Kafka's
  DUPLICATE_BROKER_REGISTRATION) while another incarnation of the same node id
  holds a live lease.
- ``heartbeat`` renews the lease, only for the current epoch and only while the
  lease has not run out; otherwise ``FencedBrokerError``: the broker lost its
  membership (a later registration superseded it, or it was too slow) and must
  stop acting as a member and register again.
- ``live_members`` lists the brokers whose lease has not run out.
- ``fenced`` runs a transaction that holds the broker's row locked and first
  checks its epoch and lease, so a write made on behalf of a broker (a
  controller's decision, a leadership change) never lands after it was fenced.

Lease times are on the database's clock (``Database.now_ms``), one clock for
every host, so the brokers' clocks need not agree.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from pipeline.metadata.database import Cursor, Migration, Target, open_database

__all__ = ("BrokerRegistration", "BrokerRegistry", "DuplicateBrokerError", "FencedBrokerError")

COMPONENT = "brokers"
"""The store's name in ``schema_version``."""

_TABLE = """
CREATE TABLE IF NOT EXISTS brokers (
    node_id INTEGER PRIMARY KEY,
    incarnation_id TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    endpoints TEXT NOT NULL,
    registered_ms BIGINT NOT NULL,
    lease_expiry_ms BIGINT NOT NULL
)"""

MIGRATIONS = (Migration(1, sqlite=_TABLE, postgresql=_TABLE),)

Endpoint = tuple[str, str, int]
"""(listener name, host, port), as ``pipeline.protocol.apis.BrokerInfo.endpoints``."""


class DuplicateBrokerError(RuntimeError):
    """Another incarnation of this node id holds a live lease (Kafka DUPLICATE_BROKER_REGISTRATION)."""


class FencedBrokerError(RuntimeError):
    """The broker's epoch is not the current one, or its lease ran out: it is not a member any more
    (Kafka's fenced broker) until it registers again."""


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """One broker's row: ``lease_expiry_ms`` is on the database's clock (ms since the epoch)."""

    node_id: int
    incarnation_id: uuid.UUID
    epoch: int
    endpoints: tuple[Endpoint, ...]
    registered_ms: int
    lease_expiry_ms: int


class BrokerRegistry:
    """Registrations and leases in ``target`` (a SQLite file or a PostgreSQL URL). See the module docstring.

    Raises (any method): sqlite3.Error, psycopg.Error when the database cannot be reached; the
    constructor ``pipeline.metadata.database.SchemaVersionError`` when its schema is newer than this code.
    """

    def __init__(self, target: Target) -> None:
        self._db = open_database(target)
        self._db.migrate(COMPONENT, MIGRATIONS)
        self.db = self._db
        """The database (stores that write on behalf of a member share it: ``fenced``)."""
        self._for_update = " FOR UPDATE" if self._db.dialect == "postgresql" else ""

    def close(self) -> None:
        self._db.close()

    def register(self, node_id: int, incarnation_id: uuid.UUID, endpoints: Sequence[Endpoint],
                 lease_ms: int) -> int:
        """Make ``node_id`` a member for ``lease_ms`` ms from now; its new epoch (1 the first time).

        Raises:
            ValueError: ``lease_ms`` < 1.
            DuplicateBrokerError: another incarnation of ``node_id`` holds a live lease.
        """
        if lease_ms < 1:
            raise ValueError(f"lease_ms must be >= 1, got {lease_ms}")
        now = self._db.now_ms
        with self._db.transaction() as cur:
            # One statement: two registrations of one node id at once (a new row for both, or the same
            # old row) are ordered by the row's lock, so their epochs differ and a live lease wins.
            row = cur.execute(
                f"INSERT INTO brokers VALUES (?, ?, 1, ?, {now}, {now} + ?) ON CONFLICT (node_id) "
                "DO UPDATE SET incarnation_id = excluded.incarnation_id, epoch = brokers.epoch + 1, "
                "endpoints = excluded.endpoints, registered_ms = excluded.registered_ms, "
                f"lease_expiry_ms = excluded.lease_expiry_ms WHERE brokers.lease_expiry_ms <= {now} "
                "OR brokers.incarnation_id = excluded.incarnation_id RETURNING epoch",
                (node_id, str(incarnation_id), json.dumps([list(e) for e in endpoints]), lease_ms)).fetchone()
            if row is None:
                holder = cur.execute("SELECT incarnation_id FROM brokers WHERE node_id = ?", (node_id,)).fetchone()
                raise DuplicateBrokerError(f"broker {node_id} is registered by incarnation {holder[0]} "
                                           f"with a live lease")
        return int(row[0])

    def heartbeat(self, node_id: int, epoch: int, lease_ms: int) -> int:
        """Renew the lease of ``node_id`` at ``epoch`` for ``lease_ms`` ms from now; the new expiry (ms).

        Raises:
            FencedBrokerError: ``epoch`` is not current or the lease already ran out.
        """
        now = self._db.now_ms
        with self._db.transaction() as cur:
            row = cur.execute(f"UPDATE brokers SET lease_expiry_ms = {now} + ? WHERE node_id = ? AND epoch = ? "
                              f"AND lease_expiry_ms > {now} RETURNING lease_expiry_ms",
                              (lease_ms, node_id, epoch)).fetchone()
        if row is None:
            raise FencedBrokerError(f"broker {node_id} at epoch {epoch} is not a member")
        return int(row[0])

    def unregister(self, node_id: int, epoch: int) -> bool:
        """End the lease of ``node_id`` at ``epoch`` now (a controlled shutdown); False if it was not current."""
        now = self._db.now_ms
        with self._db.transaction() as cur:
            return cur.execute(f"UPDATE brokers SET lease_expiry_ms = {now} - 1 WHERE node_id = ? AND epoch = ?",
                               (node_id, epoch)).rowcount > 0

    def fence(self, node_id: int) -> bool:
        """End the lease of ``node_id`` whatever its epoch (a controller or an operator removing a broker
        that stopped answering); its next heartbeat gets ``FencedBrokerError``. False if unknown."""
        now = self._db.now_ms
        with self._db.transaction() as cur:
            return cur.execute(f"UPDATE brokers SET lease_expiry_ms = {now} - 1 WHERE node_id = ?",
                               (node_id,)).rowcount > 0

    def live_members(self) -> list[BrokerRegistration]:
        """The brokers whose lease has not run out, by node id."""
        with self._db.transaction(write=False) as cur:
            rows = cur.execute(f"SELECT node_id, incarnation_id, epoch, endpoints, registered_ms, lease_expiry_ms "
                               f"FROM brokers WHERE lease_expiry_ms > {self._db.now_ms} ORDER BY node_id").fetchall()
        return [BrokerRegistration(node_id, uuid.UUID(incarnation), epoch,
                                   tuple((str(n), str(h), int(p)) for n, h, p in json.loads(endpoints)),
                                   registered_ms, expiry)
                for node_id, incarnation, epoch, endpoints, registered_ms, expiry in rows]

    def is_member(self, node_id: int, epoch: int) -> bool:
        """Whether ``node_id`` at ``epoch`` is the current, live registration."""
        with self._db.transaction(write=False) as cur:
            return cur.execute(f"SELECT 1 FROM brokers WHERE node_id = ? AND epoch = ? "
                               f"AND lease_expiry_ms > {self._db.now_ms}", (node_id, epoch)).fetchone() is not None

    @contextmanager
    def fenced(self, node_id: int, epoch: int) -> Iterator[Cursor]:
        """A write transaction on behalf of ``node_id`` at ``epoch``: its row is locked (``FOR UPDATE`` on
        PostgreSQL, the write lock on SQLite) and checked first, so no registration, heartbeat or fence
        of it interleaves; the caller's statements run on the yielded cursor and commit with it.

        Raises:
            FencedBrokerError: ``epoch`` is not current or the lease ran out (nothing is written).
        """
        with self._db.transaction() as cur:
            row = cur.execute(f"SELECT 1 FROM brokers WHERE node_id = ? AND epoch = ? AND lease_expiry_ms > "
                              f"{self._db.now_ms}{self._for_update}", (node_id, epoch)).fetchone()
            if row is None:
                raise FencedBrokerError(f"broker {node_id} at epoch {epoch} is not a member")
            yield cur
