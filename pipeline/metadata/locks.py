"""Named exclusive locks in the metadata database, held under a lease (blocking calls).

The brokers of a cluster change one set of tables (``pipeline.persist.group_sink``:
appends, compaction, a deleted topic's rows). With leadership through the database
they may run on several hosts, where an ``flock`` on the data directory is only as
good as the shared filesystem's lock support (issue 24: "an fcntl lock does not
reach another host"). A ``LeaseLock`` is held in the shared database instead, with
no consensus of our own: one row per lock names its holder and a lease on the
database's clock (one clock for every host), renewed by the holder while it holds
the lock. A holder that dies stops renewing, and the lock is free once its lease ran
out; one that cannot renew (the database unreachable for a lease) logs it, since
the table change it guards may then overlap another holder's.

Within one process, holders queue on a local lock first: the database sees one
holder per process (``holder``), so threads of one broker exclude each other too.
A thread that holds the lock may take it again (the outermost hold releases it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pipeline.metadata.database import Migration, Target, open_database

__all__ = ("COMPONENT", "LeaseLock")

log = logging.getLogger(__name__)

COMPONENT = "locks"
"""The store's name in ``schema_version``."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS locks (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    lease_expiry_ms BIGINT NOT NULL
)"""

MIGRATIONS = (Migration(1, sqlite=_SCHEMA, postgresql=_SCHEMA),)

POLL_S = 0.02
"""How often a waiting holder tries the lock again (s)."""


class LeaseLock:
    """The lock ``name`` in the metadata database ``target`` (a PostgreSQL URL or a SQLite file every
    holder shares), taken as ``holder`` (unique per process, e.g. ``"broker-1/<incarnation>"``).

    Args:
        lease_ms: how long the lock stays held after its holder's last renewal (ms): how long others
            wait for a holder that died with it.
        renew_ms: how often a holder renews its lease while it holds the lock (ms); below ``lease_ms``.

    Raises (any method): sqlite3.Error, psycopg.Error when the database cannot be reached.
    """

    def __init__(self, target: Target, name: str, holder: str, *, lease_ms: int, renew_ms: int) -> None:
        if not 0 < renew_ms < lease_ms:
            raise ValueError(f"renew_ms ({renew_ms}) must be in (0, lease_ms = {lease_ms})")
        self.name, self.holder = name, holder
        self.lease_ms, self.renew_ms = lease_ms, renew_ms
        self._db = open_database(target)
        self._db.migrate(COMPONENT, MIGRATIONS)
        self._local = threading.RLock()
        self._depth = 0  # holds by the thread that has ``_local``

    def close(self) -> None:
        self._db.close()

    def try_acquire(self) -> bool:
        """Take the lock if it is free, its lease ran out, or this holder has it (then renewed)."""
        now = self._db.now_ms
        with self._db.transaction() as cur:
            return cur.execute(
                f"INSERT INTO locks VALUES (?, ?, {now} + ?) ON CONFLICT (name) DO UPDATE SET "
                "holder = excluded.holder, lease_expiry_ms = excluded.lease_expiry_ms "
                f"WHERE locks.holder = excluded.holder OR locks.lease_expiry_ms <= {now} RETURNING 1",
                (self.name, self.holder, self.lease_ms)).fetchone() is not None

    def renew(self) -> bool:
        """Extend this holder's lease; False when it does not hold the lock (any more)."""
        now = self._db.now_ms
        with self._db.transaction() as cur:
            return cur.execute(f"UPDATE locks SET lease_expiry_ms = {now} + ? WHERE name = ? AND holder = ? "
                               f"AND lease_expiry_ms > {now}", (self.lease_ms, self.name, self.holder)).rowcount > 0

    def release(self) -> None:
        """Free the lock if this holder has it."""
        with self._db.transaction() as cur:
            cur.execute("DELETE FROM locks WHERE name = ? AND holder = ?", (self.name, self.holder))

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the lock for the block: wait for it (every ``POLL_S``), renew its lease every
        ``renew_ms`` from a thread while the block runs, release it after. A renewal that finds the
        lease lost is logged as an error (the block is not interrupted: a table change under way
        cannot be taken back). Re-entrant within a thread."""
        with self._local:
            self._depth += 1
            if self._depth > 1:
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            try:
                while not self.try_acquire():
                    time.sleep(POLL_S)
                stop = threading.Event()
                renewer = threading.Thread(target=self._renew_until, args=(stop,), daemon=True,
                                           name=f"lease-lock-{self.name}")
                renewer.start()
                try:
                    yield
                finally:
                    stop.set()
                    renewer.join()
                    self.release()
            finally:
                self._depth -= 1

    def _renew_until(self, stop: threading.Event) -> None:
        while not stop.wait(self.renew_ms / 1000.0):
            try:
                if not self.renew():
                    log.error("lock %s: the lease of %s ran out while held: another holder may have taken it",
                              self.name, self.holder)
                    return
            except Exception as exc:  # retried at the next renewal, within the lease
                log.warning("lock %s: renewing the lease failed: %s", self.name, exc)
