"""Listening before Spark is up (issue 23), with real servers, real clients and real Spark.

One story on two data directories, every server with the defaults (``--ack-on wal``, no
``--spark-connect-port``: each picks a free one and publishes it in ``endpoints.json``):

1. server A listens before its Spark is up; a confluent-kafka producer (acks=all) is
   acknowledged while the table side is still starting; then ``kill -9`` during Spark's
   start, and none of its children outlives it;
2. A restarted and a second default server B start side by side (their own data dirs and
   listeners) and both reach "table side ready" with different Spark Connect endpoints;
3. A's table holds every record acknowledged before the kill, exactly once (the WAL backlog
   written once Spark came up), read by name through A's own endpoint, as ``pipeline sql`` reads it;
4. both stop with exit code 0.

Server starts: A, A again (the restart is the point), B (the second server is the point).
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.server_process import TABLE_READY, ServerProcess, describe
from tests.e2e.table_reader import read_table_until

pytestmark = pytest.mark.slow

N = 200
CHILDREN_GRACE_S = 15.0
"""How long the killed server's children get to end (s). The decode worker dies with it at once
(PR_SET_PDEATHSIG); a JVM killed half-way through its launch, which reads nothing of ours until
its gateway is up, is killed by the launch reaper (pipeline.process.lifecycle.launch_reaper) within
~0.2 s. Before the reaper it ended only once its gateway was up: over 15 s on a CI runner at
load 17."""


def produce(bootstrap: str, topic: str, n: int) -> list[tuple[int, int]]:
    """``n`` records with acks=all; (partition, offset) of each acknowledged one."""
    from confluent_kafka import Producer

    acked: list[tuple[int, int]] = []

    def delivered(err, msg) -> None:
        assert err is None, err
        acked.append((msg.partition(), msg.offset()))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(n):
        producer.produce(topic, value=b"early-%d" % i, on_delivery=delivered)
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

    restarted = ServerProcess(tmp_path / "a", connect_port=False, port=a.port).launch()
    b = ServerProcess(tmp_path / "b", connect_port=False).launch()
    try:
        for server in (restarted, b):
            server.wait_for("listening on")
        for server in (restarted, b):
            server.wait_for(TABLE_READY)
        endpoints = [json.loads((s.data_dir / "_pipeline" / "endpoints.json").read_text())["spark_connect"]
                     for s in (restarted, b)]
        assert endpoints[0] != endpoints[1], endpoints
        assert restarted.port != b.port
        rows = read_table_until(restarted.data_dir, "SELECT `partition`, `offset`, value FROM records "
                                "WHERE topic = 'early'", lambda rows: len(rows) >= N)
        # the WAL backlog, written once Spark was up: all of it (the table had none of it)
        assert f"recovery: {N} WAL records after the checkpoint, {N} to write now, 0 already in the table" \
            in restarted.log_text(), restarted.log_text()[-3000:]
        assert sorted((r["partition"], r["offset"]) for r in rows) == sorted(acked)  # each once
        assert sorted(r["value"] for r in rows) == sorted(b"early-%d" % i for i in range(N))
        codes = [s.stop() for s in (restarted, b)]
        assert codes == [0, 0], restarted.log_text()[-3000:] + b.log_text()[-3000:]
    finally:
        for server in (restarted, b):
            if server.running:
                server.kill()
