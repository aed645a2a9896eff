"""``pipeline.bench.processes.sample_tree``: the CPU of a server's process tree, read at the start
and the end of a bench window."""

from __future__ import annotations

import subprocess
import sys

from pipeline.bench.processes import sample_tree

# A parent that, on each line it reads, runs a child burning 0.5 s of CPU to its end (reaped by
# subprocess.run), then says so.
PARENT = """
import subprocess, sys
burn = "import time\\nwhile time.process_time() < 0.5: pass"
for _ in sys.stdin:
    subprocess.run([sys.executable, "-c", burn], check=True)
    print("done", flush=True)
"""


def test_the_cpu_of_a_descendant_that_ended_within_the_window_is_kept():
    """A bench window measured -0.17 s of server CPU: a process of the tree that ended between its two
    samples took its CPU with it. The kernel adds a reaped child's CPU to its parent's children times,
    which the sample counts, so the tree's figure never goes down."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert parent.stdin is not None and parent.stdout is not None
        before = sample_tree(parent.pid).cpu_s
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.stdout.readline() == "done\n"
        after = sample_tree(parent.pid).cpu_s
        assert after - before >= 0.45, (before, after)
    finally:
        parent.kill()
        parent.wait(10)
