"""No process outlives the server, however it ends; stop signals are honoured at any time.

SIGTERM / SIGINT while Spark is still starting: with ``--ack-on spark``,
before it listens, the server exits promptly with code 0, logs why, and
leaves no child behind. With ``--ack-on wal`` (it listens before Spark is up)
the ordered shutdown waits for Spark's start and writes what was acknowledged
to the table, then exits 0: tests/e2e/test_startup.py's second server. tests/e2e/test_startup.py
covers the rest of listening before Spark: produce acknowledged at the WAL,
``kill -9`` during Spark's start, two default servers side by side.

Steps of tests/e2e/test_durability.py cover the rest: after ``kill -9`` of
``pipeline serve`` its decode worker, the multiprocessing resource tracker and
Spark's JVM (with its Python workers) exit by themselves
(pipeline/process/lifecycle.py says how each notices); under SIGTERM with load every
request the server read is answered (success or a Kafka error) before its
connection closes, everything acknowledged is in the table exactly once, and
the server exits 0 in bounded time.
"""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from tests.e2e.server_process import ServerProcess, describe

pytestmark = pytest.mark.slow

CHILDREN_GRACE_S = 15.0
"""How long the children of a killed server may take to notice (s)."""


def test_stop_signal_while_spark_starts_before_listening(tmp_path):
    """With ``--ack-on spark`` Spark starts before the listener: a signal interrupts start-up
    where it is (nothing was acknowledged)."""
    signum, ack_on = signal.SIGTERM, "spark"
    server = ServerProcess(tmp_path / "data", "--ack-on", ack_on).launch()
    try:
        # wait until Spark's JVM exists, then signal: start-up is under way
        deadline = time.monotonic() + 60
        while not any("java" in line for line in describe(server.descendants())):
            assert server.running, server.log_text()
            assert time.monotonic() < deadline, "no JVM after 60 s"
            time.sleep(0.1)
        children = server.descendants()
        server.proc.send_signal(signum)
        started = time.monotonic()
        code = server.proc.wait(30)
        took = time.monotonic() - started
        _gone, alive = psutil.wait_procs(children + server.descendants(), timeout=CHILDREN_GRACE_S)
        leftover = describe(alive)
    finally:
        server.kill()
    log = server.log_text()
    assert code == 0, log
    assert took < 20, f"took {took:.1f} s to stop"
    assert f"received {signal.Signals(signum).name} during start-up" in log, log
    assert "stopped before serving" in log, log
    assert leftover == [], leftover
