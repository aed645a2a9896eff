"""No process outlives the server, however it ends; stop signals are honoured at any time.

* ``kill -9`` of ``pipeline serve``: its decode worker, the multiprocessing
  resource tracker and Spark's JVM (with its Python workers) exit by
  themselves (pipeline/lifecycle.py says how each notices).
* SIGTERM / SIGINT while Spark is still starting: the server exits promptly
  with code 0, logs why, and leaves no child behind.
* SIGTERM under load: every request the server read is answered (success or
  a Kafka error) before its connection closes, everything acknowledged is in
  the table exactly once, and the server exits 0 in bounded time.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import defaultdict

import psutil
import pytest

from tests.e2e.table_reader import read_table
from tests.e2e import raw_client as rc
from tests.e2e.server_process import ServerProcess, reap

pytestmark = pytest.mark.slow

CHILDREN_GRACE_S = 15.0
"""How long the children of a killed server may take to notice (s)."""


def describe(processes: list[psutil.Process]) -> list[str]:
    out = []
    for p in processes:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:160]}")
        except psutil.Error:
            out.append(f"{p.pid} (gone)")
    return out


def test_children_exit_after_kill_9(tmp_path):
    server = ServerProcess(tmp_path / "data").start()
    try:
        client = rc.RawClient(server.host, server.port)
        client.send(rc.frame(rc.produce("t", [b"a", b"b"]), 1))
        assert client.read_response()[0] == 1  # the decode worker and Spark have worked
        client.close()
        children = server.descendants()
        names = " ".join(describe(children))  # a short-lived child may already be a zombie
        assert "java" in names and "resource_tracker" in names and "spawn_main" in names, describe(children)
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(30)
        _gone, alive = psutil.wait_procs(children, timeout=CHILDREN_GRACE_S)
        leftover = describe(alive)
        reap(alive, 0)
    finally:
        server.kill()
    assert leftover == [], f"outlived the server by {CHILDREN_GRACE_S} s: {leftover}"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stop_signal_while_spark_starts(tmp_path, signum):
    server = ServerProcess(tmp_path / "data").launch()
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


class LoadConnection(threading.Thread):
    """Pipelined acks=-1 produce (up to ``in_flight`` requests ahead) until the server closes."""

    def __init__(self, host: str, port: int, name: str, in_flight: int = 4) -> None:
        super().__init__(daemon=True, name=name)
        self.client = rc.RawClient(host, port, timeout_s=60)
        self.topic = name
        self.in_flight = in_flight
        self.sent: list[list[bytes]] = []
        self.answers: list[tuple[int, int]] = []  # (error code, base offset) per answered request
        self.failure: str | None = None
        self.started = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + 120
        try:
            while time.monotonic() < deadline and len(self.sent) < 50_000:
                while len(self.sent) - len(self.answers) < self.in_flight:
                    values = [f"{self.topic}:{len(self.sent)}:{i}".encode() for i in range(5)]
                    self.client.send(rc.frame(rc.produce(self.topic, values), len(self.sent)))
                    self.sent.append(values)
                cid, body = self.client.read_response()
                if cid != len(self.answers):
                    self.failure = f"response {cid}, expected {len(self.answers)}"
                    return
                part = rc.decode_produce_response(body).responses[0].partition_responses[0]
                self.answers.append((int(part.error_code), int(part.base_offset)))
                if len(self.answers) > 20:
                    self.started.set()
        except (ConnectionError, OSError) as exc:
            self.closed_with = repr(exc)  # expected: the server stopped
        finally:
            self.started.set()
            self.client.close()


def test_sigterm_under_load_answers_flushes_and_exits_0(tmp_path):
    server = ServerProcess(tmp_path / "data", "--linger-ms", "50").start()
    try:
        setup = rc.RawClient(server.host, server.port)
        for i in range(4):
            setup.send(rc.frame(rc.metadata(f"load-{i}"), i))
            setup.read_response()
        setup.close()
        loads = [LoadConnection(server.host, server.port, f"load-{i}") for i in range(4)]
        for load in loads:
            load.start()
        for load in loads:
            assert load.started.wait(60)
        started = time.monotonic()
        code = server.stop(timeout_s=90)
        took = time.monotonic() - started
    finally:
        server.kill()  # no-op once stopped; a failure above must not leave it running
    for load in loads:
        load.join(30)
        assert not load.is_alive()
    log = server.log_text()
    assert code == 0, log
    assert took < 60, f"shutdown took {took:.1f} s"
    assert "responses unsent" not in log, log
    # the resource tracker ignores SIGTERM: it must be left to exit on EOF,
    # not terminated (that cost 10 s and a SIGKILL), see stop_children
    assert not [line for line in log.splitlines() if "stopped child" in line and "resource_tracker" in line], log

    rows = read_table(server.data_dir, "SELECT topic, `offset`, value FROM records")
    stored: dict[bytes, list[tuple[str, int]]] = defaultdict(list)
    for row in rows:
        stored[bytes(row["value"])].append((row["topic"], row["offset"]))
    acked = 0
    for load in loads:
        assert load.failure is None, load.failure
        # answered in order; whatever was answered with success is stored once, at its offset
        for values, (error, base) in zip(load.sent, load.answers):
            if error == 0:
                for i, value in enumerate(values):
                    assert stored.get(value) == [(load.topic, base + i)], value
                acked += len(values)
            else:
                assert error in (6, 7, 56), error  # not leader, timed out, storage error: never stored
        # requests sent but never answered were not read by the server: not stored either
        for values in load.sent[len(load.answers):]:
            assert all(v not in stored for v in values)
    assert acked > 0
    assert len(rows) == acked
