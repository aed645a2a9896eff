"""No process outlives the server, however it ends; stop signals are honoured at any time.

SIGTERM / SIGINT while Spark is still starting (a launch each): with
``--ack-on spark``, before it listens, the server exits promptly with code 0,
logs why, and leaves no child behind; with ``--ack-on wal`` (it listens
before Spark is up) the ordered shutdown waits for Spark's start and writes
what was acknowledged to the table, then exits 0. tests/e2e/test_startup.py
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

from pipeline.persist.persister import STOP_WAITS_FOR_TABLE_S
from tests.e2e.server_process import ServerProcess, describe
from tests.e2e.table_reader import read_table

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


CTRL_C_RECORDS = 3_000


def test_ctrl_c_right_after_listening_leaves_every_acknowledged_record_in_the_table(tmp_path):
    """With ``--ack-on wal`` (the default) the server listens before Spark is up. Ctrl-C (SIGINT)
    just after ``listening on``, once 3,000 records are acknowledged at the WAL: the ordered
    shutdown waits for Spark's start (``STOP_WAITS_FOR_TABLE_S``), writes them, exits 0, and the
    table read by name holds the 3,000 (issue 34)."""
    from confluent_kafka import Producer

    server = ServerProcess(tmp_path / "data", connect_port=False).launch()
    try:
        server.wait_for("listening on")
        listening = time.monotonic()
        acked: list[tuple[int, int]] = []

        def delivered(err, msg) -> None:
            assert err is None, err
            acked.append((msg.partition(), msg.offset()))

        producer = Producer({"bootstrap.servers": server.bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 5})
        for i in range(CTRL_C_RECORDS):
            producer.produce("ctrl-c", value=b"c-%d" % i, on_delivery=delivered)
        assert producer.flush(60) == 0 and len(acked) == CTRL_C_RECORDS
        del producer  # librdkafka's client ends here, not reconnecting to the stopped server
        assert "table side ready" not in server.log_text()  # Spark still starting
        server.proc.send_signal(signal.SIGINT)
        print(f"Ctrl-C {time.monotonic() - listening:.2f} s after listening, {CTRL_C_RECORDS} acknowledged")
        code = server.proc.wait(STOP_WAITS_FOR_TABLE_S + 30)
    finally:
        server.kill()
    log = server.log_text()
    assert code == 0, log[-3000:]
    assert "SIGINT received: shutting down" in log and "stopping before Spark is up: waiting up to" in log, log[-3000:]
    assert "table side ready" in log and "stay in the WAL" not in log, log[-3000:]
    rows = read_table(server.data_dir, "SELECT `partition`, `offset`, value FROM records WHERE topic = 'ctrl-c'")
    assert sorted((r["partition"], r["offset"]) for r in rows) == sorted(acked)  # each once
    assert sorted(r["value"] for r in rows) == sorted(b"c-%d" % i for i in range(CTRL_C_RECORDS))

