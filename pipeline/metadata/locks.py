"""Named shared/exclusive locks in the metadata database, held under a lease (blocking calls).

The brokers of a cluster change one set of tables (``pipeline.persist.group_sink``:
commits of staged files, Spark appends, compaction, a deleted topic's rows). With
leadership through the database they may run on several hosts, where an ``flock``
on the data directory is only as good as the shared filesystem's lock support
(issue 24: "an fcntl lock does not reach another host"). A ``LeaseLock`` is held in
the shared database instead, with no consensus of our own: one row per holder names
its mode and a lease on the database's clock (one clock for every host), renewed by
the holder while it holds the lock. A holder that dies stops renewing, and its hold
is gone once its lease ran out; one that cannot renew (the database unreachable for
a lease) logs it, since the table change it guards may then overlap another holder's.

Modes, as a readers-writer lock: any number of **shared** holders at once (brokers
committing their own partitions' staged files, which do not conflict), or one
**exclusive** holder (compaction, retention, a Spark append, a take-over's fence and
read). An exclusive waiter records its intent, and no new shared hold starts while
a live intent exists, so a stream of overlapping commits cannot starve maintenance
(writer preference). The attempts of one lock are serialized by its row in
``locks`` (an upsert: SQLite's ``BEGIN IMMEDIATE``, a row lock on PostgreSQL), so two
waiters never both see the lock free.

Within one process, holders queue on a local lock first: the database sees one
holder per process (``holder``), so threads of one broker exclude each other too.
A thread that holds the lock may take it again (the outermost hold releases it); an
exclusive hold inside a shared one is refused (an upgrade could deadlock two holders).
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

_HOLDERS = """
CREATE TABLE IF NOT EXISTS lock_holders (
    name TEXT NOT NULL,
    holder TEXT NOT NULL,
    mode TEXT NOT NULL,
    lease_expiry_ms BIGINT NOT NULL,
    PRIMARY KEY (name, holder)
)"""
# ``locks`` keeps one row per lock name: what serializes the attempts (its holder column is no longer
# read). ``lock_holders``: one row per holder, mode 's' (shared), 'x' (exclusive) or 'w' (waiting for
# an exclusive hold: no new shared hold starts meanwhile), each under its own lease.

MIGRATIONS = (Migration(1, sqlite=_SCHEMA, postgresql=_SCHEMA),
              Migration(2, sqlite=_HOLDERS, postgresql=_HOLDERS))

SHARED, EXCLUSIVE, WAITING = "s", "x", "w"
"""``lock_holders.mode`` values."""

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
        self._shared = False  # the mode of that thread's outermost hold

    def close(self) -> None:
        self._db.close()

    def try_acquire(self, shared: bool = False) -> bool:
        """Take the lock if this holder may now (renewed if it has it already): shared when no other
        holder holds it exclusively or waits to; exclusive when no other holder holds it at all. A
        refused exclusive attempt records this holder's intent (mode ``w``, under the lease), so
        that shared holds wait for it; ``release`` removes it."""
        if not self._may_take(shared):
            return False
        now = self._db.now_ms  # an SQL expression: the database's clock
        with self._db.transaction() as cur:
            # The lock's own row first: an upsert, so concurrent attempts of this name run one at a time.
            cur.execute("INSERT INTO locks VALUES (?, '', 0) ON CONFLICT (name) DO UPDATE SET "
                        "lease_expiry_ms = locks.lease_expiry_ms", (self.name,))
            cur.execute(f"DELETE FROM lock_holders WHERE name = ? AND lease_expiry_ms <= {now}", (self.name,))
            rows = cur.execute("SELECT holder, mode FROM lock_holders WHERE name = ?", (self.name,)).fetchall()
            own = {mode for holder, mode in rows if holder == self.holder}
            others = {mode for holder, mode in rows if holder != self.holder}
            if shared and own & {SHARED, EXCLUSIVE}:  # held already: renewed, in its mode
                mode, granted = own.pop(), True
            elif shared:
                mode, granted = SHARED, not others & {EXCLUSIVE, WAITING}
            else:
                granted = not others & {SHARED, EXCLUSIVE}
                mode = EXCLUSIVE if granted else WAITING
            if granted or mode == WAITING:
                cur.execute(f"INSERT INTO lock_holders VALUES (?, ?, ?, {now} + ?) ON CONFLICT (name, holder) "
                            "DO UPDATE SET mode = excluded.mode, lease_expiry_ms = excluded.lease_expiry_ms",
                            (self.name, self.holder, mode, self.lease_ms))
            return granted

    def _may_take(self, shared: bool) -> bool:
        """A read, no write: False when the lock is not this holder's to take now and, for an
        exclusive attempt, its intent stands for more than half a lease still; else ``try_acquire``
        decides in a write transaction. So a waiter's polls commit nothing: a commit is an fsync
        (SQLite's ``synchronous=FULL``, PostgreSQL's WAL flush), and one per ``POLL_S`` per waiter
        (every broker's commits waiting out another's compaction) kept the disk busy."""
        now = self._db.now_ms
        with self._db.transaction(write=False) as cur:
            rows = cur.execute(f"SELECT holder, mode, lease_expiry_ms - {now} FROM lock_holders "
                               f"WHERE name = ? AND lease_expiry_ms > {now}", (self.name,)).fetchall()
        own = {mode: left for holder, mode, left in rows if holder == self.holder}
        others = {mode for holder, mode, _ in rows if holder != self.holder}
        if shared:
            return SHARED in own or EXCLUSIVE in own or not others & {EXCLUSIVE, WAITING}
        if not others & {SHARED, EXCLUSIVE}:
            return True
        return WAITING not in own or own[WAITING] < self.lease_ms / 2  # record or refresh the intent

    def renew(self) -> bool:
        """Extend this holder's lease; False when it does not hold the lock (any more)."""
        now = self._db.now_ms
        with self._db.transaction() as cur:
            return cur.execute(f"UPDATE lock_holders SET lease_expiry_ms = {now} + ? WHERE name = ? AND holder = ? "
                               f"AND mode <> '{WAITING}' AND lease_expiry_ms > {now}",
                               (self.lease_ms, self.name, self.holder)).rowcount > 0

    def release(self) -> None:
        """Free this holder's hold (or intent) of the lock."""
        with self._db.transaction() as cur:
            cur.execute("DELETE FROM lock_holders WHERE name = ? AND holder = ?", (self.name, self.holder))

    @contextmanager
    def hold(self, shared: bool = False) -> Iterator[None]:
        """Hold the lock for the block, ``shared`` or exclusive: wait for it (every ``POLL_S``), renew
        its lease every ``renew_ms`` from a thread while the block runs, release it after. A renewal
        that finds the lease lost is logged as an error (the block is not interrupted: a table
        change under way cannot be taken back). Re-entrant within a thread (an inner hold has the
        outer one's mode).

        Raises:
            RuntimeError: an exclusive hold asked for inside a shared one of this thread.
        """
        with self._local:
            self._depth += 1
            if self._depth > 1:
                try:
                    if self._shared and not shared:
                        raise RuntimeError(f"lock {self.name}: an exclusive hold inside a shared one")
                    yield
                finally:
                    self._depth -= 1
                return
            try:
                try:
                    while not self.try_acquire(shared):
                        time.sleep(POLL_S)
                except BaseException:
                    self.release()  # an intent left behind would hold shared holders back for a lease
                    raise
                self._shared = shared
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
