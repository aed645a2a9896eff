"""``pipeline.persist.group_sink.table_lock``: the ``flock`` the brokers of ``pipeline serve --brokers N``
hold around table changes, shared for commits of staged files and exclusive for everything else
(issue 34: the brokers' commits overlap). Threads stand in for brokers: each ``table_lock`` opens its
own file descriptions, so the kernel treats them as separate holders, as it does processes."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from pipeline.persist.group_sink import table_lock


def flock_waiters(path: Path) -> int:
    """Holders blocked in ``flock`` on ``path``: the ``->`` lines of ``/proc/locks`` for its inode."""
    inode = os.stat(path).st_ino
    with open("/proc/locks") as f:
        return sum(1 for line in f if "->" in line and "FLOCK" in line and f":{inode} " in line)


def _until(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


class Holder(threading.Thread):
    """Takes ``table_lock(path, shared)``, records when it got it, holds it until ``release`` is set."""

    def __init__(self, path: Path, shared: bool, order: list[str], name: str) -> None:
        super().__init__(daemon=True)
        self.path, self.shared, self.order, self.label = path, shared, order, name
        self.holding, self.release = threading.Event(), threading.Event()

    def run(self) -> None:
        with table_lock(self.path, self.shared):
            self.order.append(self.label)
            self.holding.set()
            self.release.wait(60)


def test_shared_holds_overlap_and_an_exclusive_one_waits_for_them(tmp_path):
    path = tmp_path / "table.lock"
    order: list[str] = []
    a, b = Holder(path, True, order, "a"), Holder(path, True, order, "b")
    a.start()
    assert a.holding.wait(10)
    b.start()
    assert b.holding.wait(10), "a second shared hold waited for the first"
    x = Holder(path, False, order, "x")
    x.start()
    _until(lambda: flock_waiters(path) == 1, "the exclusive hold did not wait")
    a.release.set()
    a.join(10)
    time.sleep(0.1)
    assert not x.holding.is_set()  # b still holds it
    b.release.set()
    assert x.holding.wait(10)
    x.release.set()
    x.join(10)
    assert order == ["a", "b", "x"]


def test_a_waiting_exclusive_hold_goes_before_new_shared_ones(tmp_path):
    """Linux lets a new shared flock in while an exclusive one waits; the gate file makes the
    exclusive hold next, so overlapping commits cannot starve compaction."""
    path = tmp_path / "table.lock"
    order: list[str] = []
    a = Holder(path, True, order, "a")
    a.start()
    assert a.holding.wait(10)
    x = Holder(path, False, order, "x")
    x.start()
    _until(lambda: flock_waiters(path) == 1, "the exclusive hold did not wait")
    b = Holder(path, True, order, "b")
    b.start()
    _until(lambda: flock_waiters(Path(f"{path}.gate")) == 1, "the new shared hold did not wait at the gate")
    assert not b.holding.is_set()
    a.release.set()
    assert x.holding.wait(10)
    assert not b.holding.is_set()
    x.release.set()
    assert b.holding.wait(10)
    b.release.set()
    for t in (a, x, b):
        t.join(10)
    assert order == ["a", "x", "b"]
