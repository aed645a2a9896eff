"""Listening before Spark is up (issue 23), with real servers, real clients and real Spark.

One story on two data directories, every server with the defaults (``--ack-on wal``, no
``--spark-connect-port``: each picks a free one and publishes it in ``endpoints.json``):

1. server A listens before its Spark is up; a confluent-kafka producer (acks=all) is
   acknowledged while the table side is still starting; then ``kill -9`` during Spark's
   start, and none of its children outlives it;
2. a second default server B, then A restarted, run side by side (their own data dirs and
   listeners) and both reach "table side ready" with different Spark Connect endpoints;
   B gets Ctrl-C (SIGINT) right after ``listening on``, once 3,000 records are acknowledged at
   its WAL: its ordered shutdown waits for Spark's start, writes them and exits 0 (issue 34);
3. A's table holds every record acknowledged before the kill, exactly once (the WAL backlog
   written once Spark came up), read by name through A's own endpoint, as ``pipeline sql`` reads it;
   B's table, read by name after its stop, holds its 3,000;
4. A stops with exit code 0.

Server starts: A, A again (the restart is the point), B (the second server, and the stop during
its start-up, are the point).
"""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from pipeline.persist.persister import STOP_WAITS_FOR_TABLE_S
from tests.e2e.server_process import TABLE_READY, ServerProcess, describe
from tests.e2e.table_reader import read_table, read_table_until

pytestmark = [pytest.mark.slow, pytest.mark.crash]  # make fault-test runs it (pyproject's crash marker)

N = 200
CTRL_C_RECORDS = 3_000
CHILDREN_GRACE_S = 15.0
"""How long the killed server's children get to end (s). The decode worker dies with it at once
(PR_SET_PDEATHSIG); a JVM killed half-way through its launch, which reads nothing of ours until
its gateway is up, is killed by the launch reaper (pipeline.process.lifecycle.launch_reaper) within
~0.2 s. Before the reaper it ended only once its gateway was up: over 15 s on a CI runner at
load 17."""


def produce(bootstrap: str, topic: str, n: int, prefix: bytes = b"early") -> list[tuple[int, int]]:
    """``n`` records (``<prefix>-<i>``) with acks=all; (partition, offset) of each acknowledged one."""
    from confluent_kafka import Producer

    acked: list[tuple[int, int]] = []

    def delivered(err, msg) -> None:
        assert err is None, err
        acked.append((msg.partition(), msg.offset()))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    for i in range(n):
        producer.produce(topic, value=b"%s-%d" % (prefix, i), on_delivery=delivered)
    assert producer.flush(60) == 0
    return acked


def test_acknowledged_before_spark_is_up_a_kill_during_its_start_loses_nothing_and_two_servers_run(tmp_path):
    a = ServerProcess(tmp_path / "a", connect_port=False).start(table=False)
    try:
        assert TABLE_READY not in a.log_text()
        acked = produce(a.bootstrap, "early", N)
        # acknowledged at the WAL while Spark was still starting
        assert len(acked) == N and TABLE_READY not in a.log_text(), a.log_text()[-3000:]
        assert not (a.data_dir / "_pipeline" / "endpoints.json").exists()
        # kill -9 while the table side is still starting: nothing of it may outlive the server
        leftover = describe(a.kill(grace_s=CHILDREN_GRACE_S))
        assert TABLE_READY not in a.log_text()
        assert leftover == [], leftover
    finally:
        if a.running:
            a.kill()

    restarted = ServerProcess(tmp_path / "a", connect_port=False, port=a.port)
    b = ServerProcess(tmp_path / "b", connect_port=False).launch()
    try:
        b.wait_for("listening on")
        listening = time.monotonic()
        # Ctrl-C right after B listens, with 3,000 records acknowledged at its WAL, Spark still starting
        b_acked = produce(b.bootstrap, "ctrl-c", CTRL_C_RECORDS, b"c")
        assert len(b_acked) == CTRL_C_RECORDS and TABLE_READY not in b.log_text(), b.log_text()[-3000:]
        b.proc.send_signal(signal.SIGINT)
        print(f"Ctrl-C {time.monotonic() - listening:.2f} s after B listened, {CTRL_C_RECORDS} acknowledged")
        restarted.launch()  # beside B, which is still starting Spark to write them
        restarted.wait_for("listening on")
        restarted.wait_for(TABLE_READY)
        assert b.proc.wait(STOP_WAITS_FOR_TABLE_S + 30) == 0, b.log_text()[-3000:]
        b_log = b.log_text()
        assert "SIGINT received: shutting down" in b_log and "stopping before Spark is up: waiting up to" in b_log
        assert TABLE_READY in b_log and "stay in the WAL" not in b_log, b_log[-3000:]
        b_endpoint = re.search(r"queryable by name over Spark Connect at (sc://\S+)", b_log)
        endpoint = json.loads((restarted.data_dir / "_pipeline" / "endpoints.json").read_text())["spark_connect"]
        assert b_endpoint is not None and b_endpoint[1] != endpoint, (b_endpoint, endpoint)
        assert restarted.port != b.port
        rows = read_table_until(restarted.data_dir, "SELECT `partition`, `offset`, value FROM records "
                                "WHERE topic = 'early'", lambda rows: len(rows) >= N)
        # the WAL backlog, written once Spark was up: all of it (the table had none of it)
        assert f"recovery: {N} WAL records after the checkpoint, {N} to write now, 0 already in the table" \
            in restarted.log_text(), restarted.log_text()[-3000:]
        assert sorted((r["partition"], r["offset"]) for r in rows) == sorted(acked)  # each once
        assert sorted(r["value"] for r in rows) == sorted(b"early-%d" % i for i in range(N))
        assert restarted.stop() == 0, restarted.log_text()[-3000:]
        # B's table, read by name after its stop (a classic session on its data directory)
        rows = read_table(b.data_dir, "SELECT `partition`, `offset`, value FROM records WHERE topic = 'ctrl-c'")
        assert sorted((r["partition"], r["offset"]) for r in rows) == sorted(b_acked)  # each once
        assert sorted(r["value"] for r in rows) == sorted(b"c-%d" % i for i in range(CTRL_C_RECORDS))
    finally:
        for server in (restarted, b):
            if server.running:
                server.kill()
