"""The launch reaper (``pipeline.process.lifecycle.launch_reaper``) with real processes, no Spark.

A parent process starts a child (``sleep``, standing in for a JVM that reads nothing of ours
while it launches) inside ``launch_reaper()``:

* the parent is SIGKILLed inside the block: the child is killed within seconds (it would
  otherwise sleep on, reparented);
* the parent leaves the block: the reaper exits and the child lives on (the JVM watches its
  stdin by then); the parent then ends it itself; the same while short-lived children come and
  go inside the block (Spark's launch runs `java -version` and a launcher JVM).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from pipeline.process.lifecycle import REAPER_POLL_S

PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from pipeline.process.lifecycle import launch_reaper
    with launch_reaper():
        child = subprocess.Popen(["sleep", "120"])
        print(child.pid, flush=True)
        if sys.argv[1] == "die":
            time.sleep(120)  # SIGKILLed here, inside the block
        if sys.argv[1] == "churn":  # short-lived children end while the reaper lists them (no reason to reap)
            for _ in range(60):
                subprocess.run(["true"])
                time.sleep(0.02)
    print("released", flush=True)
    sys.stdin.readline()  # the test checks the child, then lets us end it
    child.kill()
""")


def _parent(mode: str) -> tuple[subprocess.Popen[str], psutil.Process]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=os.getcwd())
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    return parent, child


def test_a_parent_killed_inside_the_block_takes_its_children_with_it() -> None:
    parent, child = _parent("die")
    try:
        reapers = [p for p in psutil.Process(parent.pid).children() if "pipeline.process.lifecycle" in " ".join(p.cmdline())]
        assert len(reapers) == 1
        # The child exists (its pid was printed): let the reaper list it (it lists every REAPER_POLL_S;
        # a child started less than that before the parent dies may be missed, as documented).
        time.sleep(5 * REAPER_POLL_S)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        _gone, alive = psutil.wait_procs([child, reapers[0]], timeout=10)
        assert not alive, f"still running after the parent's SIGKILL: {alive}"
    finally:
        if child.is_running():
            child.kill()


@pytest.mark.parametrize("mode", ["live", "churn"])
def test_leaving_the_block_releases_the_reaper_and_kills_nothing(mode: str) -> None:
    parent, child = _parent(mode)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "released"
        reapers = [p for p in psutil.Process(parent.pid).children() if "pipeline.process.lifecycle" in " ".join(p.cmdline())]
        assert reapers == []  # waited for by launch_reaper on the way out
        assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE
        assert parent.stdin is not None
        parent.stdin.write("\n")
        parent.stdin.flush()
        assert parent.wait(10) == 0
    finally:
        if child.is_running():
            child.kill()
        if parent.poll() is None:
            parent.kill()
