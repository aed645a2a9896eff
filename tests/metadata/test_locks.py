"""``pipeline.metadata.locks.LeaseLock`` on both backends (``metadata_target``): one holder at a time
across processes and threads, a lease renewed while held, and a holder killed with the lock held
replaced once its lease ran out (the brokers' table lock with leadership through the database)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from pipeline.metadata.locks import LeaseLock

LEASE_MS, RENEW_MS = 3000, 200


def _lock(target, holder: str) -> LeaseLock:
    return LeaseLock(target, "table", holder, lease_ms=LEASE_MS, renew_ms=RENEW_MS)


def test_one_holder_at_a_time_and_a_held_lease_is_renewed(metadata_target):
    target = metadata_target("cluster.db")
    a, b = _lock(target, "broker-0/a"), _lock(target, "broker-1/b")
    try:
        with a.hold():
            assert not b.try_acquire()
            time.sleep(LEASE_MS / 1000 + 0.5)  # longer than the lease: renewed meanwhile
            assert not b.try_acquire()
        assert b.try_acquire()
        assert not a.try_acquire()
        b.release()
        assert a.try_acquire()
        a.release()
    finally:
        a.close()
        b.close()


def test_a_thread_holding_the_lock_takes_it_again_and_the_outermost_hold_releases_it(metadata_target):
    target = metadata_target("cluster.db")
    a, b = _lock(target, "broker-0/a"), _lock(target, "broker-1/b")
    try:
        with a.hold():
            with a.hold():
                assert not b.try_acquire()
            assert not b.try_acquire()  # the inner hold did not release it
        assert b.try_acquire()
        b.release()
    finally:
        a.close()
        b.close()


def test_threads_of_one_holder_queue_on_it(metadata_target):
    lock = _lock(metadata_target("cluster.db"), "broker-0/a")
    inside: list[int] = []
    overlaps: list[int] = []

    def change(i: int) -> None:
        for _ in range(5):
            with lock.hold():
                inside.append(i)
                if len(inside) > 1:
                    overlaps.append(i)
                time.sleep(0.01)
                inside.remove(i)

    threads = [threading.Thread(target=change, args=(i,)) for i in range(3)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert overlaps == []
    finally:
        lock.close()


def test_a_holder_killed_with_the_lock_is_replaced_once_its_lease_ran_out(metadata_target):
    target = metadata_target("cluster.db")
    script = textwrap.dedent(f"""
        import sys, time
        from pipeline.metadata.locks import LeaseLock
        lock = LeaseLock({str(target)!r}, "table", "broker-0/dying", lease_ms={LEASE_MS}, renew_ms={RENEW_MS})
        with lock.hold():
            print("held", flush=True)
            time.sleep(120)
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    other = _lock(target, "broker-1/b")
    try:
        assert holder.stdout.readline().strip() == "held"
        time.sleep(RENEW_MS / 1000 * 3)  # a few renewals
        assert not other.try_acquire()
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
        killed = time.monotonic()
        assert not other.try_acquire()  # its lease still runs
        deadline = killed + 60
        while not other.try_acquire():
            assert time.monotonic() < deadline, "the dead holder's lease never ran out"
            time.sleep(0.05)
        assert time.monotonic() - killed > RENEW_MS / 1000  # not at once: after the lease
        other.release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        other.close()


def test_shared_holders_overlap_and_an_exclusive_one_waits_for_them(metadata_target):
    target = metadata_target("cluster.db")
    a, b, c = _lock(target, "broker-0/a"), _lock(target, "broker-1/b"), _lock(target, "broker-2/c")
    try:
        with a.hold(shared=True):
            assert b.try_acquire(shared=True)  # two brokers' commits at once
            assert not c.try_acquire()  # compaction waits for both, and says so...
            assert b.try_acquire(shared=True)  # b renews its own shared hold
            b.release()
            assert not c.try_acquire()  # ...a still holds it
        assert c.try_acquire()
        assert not a.try_acquire(shared=True)  # no shared hold under an exclusive one
        c.release()
        assert a.try_acquire(shared=True)
        a.release()
    finally:
        for lock in (a, b, c):
            lock.close()


def test_an_exclusive_waiter_holds_new_shared_holders_back(metadata_target):
    """Writer preference: once an exclusive hold waits, no new shared hold starts, so overlapping
    commits cannot starve compaction; the waiter's intent goes with its release."""
    target = metadata_target("cluster.db")
    a, b, c = _lock(target, "broker-0/a"), _lock(target, "broker-1/b"), _lock(target, "broker-2/c")
    try:
        assert a.try_acquire(shared=True)
        assert not c.try_acquire()  # waits, its intent recorded
        assert not b.try_acquire(shared=True)  # a new commit waits behind it
        a.release()
        assert c.try_acquire()
        c.release()
        assert b.try_acquire(shared=True)
        b.release()
        assert a.try_acquire(shared=True)
        assert not c.try_acquire()
        c.release()  # an intent left by a refused attempt is gone with the release
        assert b.try_acquire(shared=True)
        b.release()
    finally:
        for lock in (a, b, c):
            lock.close()


def test_an_exclusive_hold_inside_a_shared_one_is_refused(metadata_target):
    lock = _lock(metadata_target("cluster.db"), "broker-0/a")
    try:
        with lock.hold(shared=True):
            with lock.hold(shared=True):
                pass
            with pytest.raises(RuntimeError, match="exclusive hold inside a shared one"):
                with lock.hold():
                    pass
        with lock.hold():
            with lock.hold(shared=True):  # inside an exclusive hold, anything goes
                pass
    finally:
        lock.close()


def test_a_waiting_exclusive_holder_gets_the_lock_while_shared_holds_keep_coming(metadata_target):
    """Threads of three brokers: two commit in overlapping shared holds without pause, the third
    asks for an exclusive hold meanwhile and gets it within a few holds."""
    target = metadata_target("cluster.db")
    locks = [_lock(target, f"broker-{i}/x") for i in range(3)]
    stop = threading.Event()
    inside: list[str] = []
    seen_overlap = threading.Event()

    def commits(lock: LeaseLock, name: str) -> None:
        while not stop.is_set():
            with lock.hold(shared=True):
                inside.append(name)
                if len(set(inside)) > 1:
                    seen_overlap.set()
                time.sleep(0.05)
                inside.remove(name)

    threads = [threading.Thread(target=commits, args=(locks[i], str(i))) for i in range(2)]
    try:
        for t in threads:
            t.start()
        assert seen_overlap.wait(30), "two shared holders never overlapped"
        started = time.monotonic()
        with locks[2].hold():
            assert inside == []
        assert time.monotonic() - started < 10
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for lock in locks:
            lock.close()


def test_refused_attempts_commit_nothing_until_an_intent_needs_renewing(tmp_path):
    """A waiter polls every ``POLL_S``; a commit is an fsync (``synchronous=FULL``), so a refused attempt
    only reads: an exclusive waiter writes its intent once and again only once half its lease has
    passed, and a shared attempt refused for that intent writes nothing. SQLite's ``data_version``,
    read on a connection of its own, changes with every commit of another connection."""
    import sqlite3

    target = tmp_path / "cluster.db"
    a, b, c = (_lock(target, f"broker-{i}/{name}") for i, name in enumerate("abc"))
    watcher = sqlite3.connect(target)
    try:
        assert a.try_acquire(shared=True)
        assert not b.try_acquire()  # b's intent: one commit
        version = watcher.execute("PRAGMA data_version").fetchone()[0]
        for _ in range(20):
            assert not b.try_acquire()
            assert not c.try_acquire(shared=True)  # held back by b's intent
        assert watcher.execute("PRAGMA data_version").fetchone()[0] == version
        time.sleep(LEASE_MS / 2000 + 0.2)  # past half of b's lease: its next poll renews the intent
        assert not b.try_acquire()
        assert watcher.execute("PRAGMA data_version").fetchone()[0] != version
        a.release()
        assert b.try_acquire()  # granted: a commit
        b.release()
    finally:
        watcher.close()
        for lock in (a, b, c):
            lock.close()


def test_a_holder_stalled_inside_a_transaction_loses_its_row_locks_on_postgresql(postgres_server):
    """A broker stopped (SIGSTOP) between two statements of a transaction keeps its row locks while its
    session lives. PostgreSQL ends a session idle inside a transaction after
    ``PG_IDLE_IN_TRANSACTION_TIMEOUT_MS`` (``pipeline.metadata.database``), so another holder's
    attempt on the same lock goes through after about that long instead of waiting for the stalled one
    to wake; the stalled one's transaction then fails and writes nothing."""
    import psycopg

    from pipeline.metadata.database import PG_IDLE_IN_TRANSACTION_TIMEOUT_MS, open_database

    url = postgres_server.create_database()
    a, b = _lock(url, "broker-0/a"), _lock(url, "broker-1/b")
    stalled = open_database(url)
    try:
        assert a.try_acquire()
        a.release()
        with pytest.raises(psycopg.Error):  # IdleInTransactionSessionTimeout at its commit
            with stalled.transaction() as cur:  # the lock's row locked, then a stall
                cur.execute("UPDATE locks SET lease_expiry_ms = lease_expiry_ms WHERE name = 'table'")
                started = time.monotonic()
                assert b.try_acquire()  # waits for the row until the stalled session is ended
                waited = time.monotonic() - started
        assert PG_IDLE_IN_TRANSACTION_TIMEOUT_MS / 1000 - 0.5 < waited < PG_IDLE_IN_TRANSACTION_TIMEOUT_MS / 1000 + 5
        b.release()
    finally:
        stalled.close()
        a.close()
        b.close()
