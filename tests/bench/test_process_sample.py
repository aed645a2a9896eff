"""``pipeline.bench.processes.sample_tree`` and ``cpu_since``: the CPU of a server's process tree, read
at the start and the end of a bench window."""

from __future__ import annotations

import subprocess
import sys

from pipeline.bench.processes import cpu_since, sample_tree

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
        before = sample_tree(parent.pid)
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.stdout.readline() == "done\n"
        after = sample_tree(parent.pid)
        assert cpu_since(before, after) >= 0.45, (before, after)
    finally:
        parent.kill()
        parent.wait(10)


# The parent starts a middle process, which starts a child that burns 0.5 s of CPU and waits; on a line
# the middle process ends without waiting for the child, which leaves the parent's tree (init, or a
# subreaper, waits for it) and takes the CPU it used with it. Each script is a file of tmp_path.
CHILD = """
import sys, time
while time.process_time() < 0.5:
    pass
print("burnt", flush=True)
sys.stdin.read()
"""
MIDDLE = """
import subprocess, sys
child = subprocess.Popen([sys.executable, sys.argv[1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
sys.stdin.readline()
"""
TOP = """
import subprocess, sys
middle = subprocess.Popen([sys.executable, sys.argv[1], sys.argv[2]], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
print(middle.stdout.readline().strip(), flush=True)
sys.stdin.readline()
middle.stdin.write("end\\n")
middle.stdin.flush()
middle.wait()
print("ended", flush=True)
sys.stdin.readline()
"""


def test_a_window_never_goes_below_zero_when_a_descendant_leaves_the_tree(tmp_path):
    """bench-smoke failed CI twice with a negative server CPU (-0.17 s, -0.12 s): a descendant whose
    parent ended first leaves the tree, and the tree's summed CPU went down by what it had used. Each
    process's growth, never the sums' difference, is what a window counts."""
    import os
    import signal

    scripts = {}
    for name, text in (("child", CHILD), ("middle", MIDDLE), ("top", TOP)):
        scripts[name] = tmp_path / f"{name}.py"
        scripts[name].write_text(text)
    parent = subprocess.Popen([sys.executable, str(scripts["top"]), str(scripts["middle"]), str(scripts["child"])],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    orphan = None
    try:
        assert parent.stdin is not None and parent.stdout is not None
        orphan = int(parent.stdout.readline())
        before = sample_tree(parent.pid)
        assert before.by_pid.get(orphan, 0.0) >= 0.45, before  # the child's CPU is in the tree now
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.stdout.readline() == "ended\n"
        after = sample_tree(parent.pid)
        assert orphan not in after.by_pid, after
        assert after.cpu_s < before.cpu_s  # the sums' difference: what the bench used to report
        assert 0.0 <= cpu_since(before, after) < 0.45, (before, after)
    finally:
        parent.kill()
        parent.wait(10)
        if orphan is not None:
            try:
                os.kill(orphan, signal.SIGKILL)
            except ProcessLookupError:
                pass
