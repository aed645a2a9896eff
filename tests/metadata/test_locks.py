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
