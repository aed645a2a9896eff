"""One configuration and structured logs, through the real command on 127.0.0.1.

* ``pipeline config show`` with a file, an environment override and a flag
  names each value's source (table and JSON);
* a bad key or value in the file, the environment or a flag stops ``pipeline
  serve`` with exit code 2, naming the key and the source, before any JVM
  starts (``java`` is a stand-in that leaves a marker file when run); so does
  a port in use (a listener, metrics, Spark Connect, Thrift), in one line;
* (slow) a server logging JSON: every line parses, request-related lines carry
  the connection id and the correlation id, each start-up stage says its time;
* (slow) ``make serve``'s start-up (defaults, a temp data directory, free
  ports) listens before Spark is up and writes nothing to stderr until its
  table side is ready but the server's own INFO lines: no Python warning, no
  JVM line.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.raw_client import RawClient
from tests.e2e.server_process import ServerProcess

CLI = [sys.executable, "-m", "pipeline.cli"]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without PIPELINE_* variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    return {**env, "COLUMNS": "200", **extra}


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env or clean_env(), timeout=timeout)


@pytest.fixture
def config_file(tmp_path) -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text('num.network.threads = 5\nnum.io.threads = 6\nlisteners = "PLAINTEXT://127.0.0.1:19092"\n'
                    '[topic."orders"]\ntable.retention.days = 30\n')
    return path


def test_config_show_names_the_source_of_each_value(config_file):
    env = clean_env(PIPELINE_NUM_IO_THREADS="16", PIPELINE_QUEUED_MAX_REQUESTS="17")
    args = ["config", "show", "--config", str(config_file), "--queued-max-requests", "27", "--log-format", "json"]
    shown = run_cli(*args, "--format", "json", env=env)
    assert shown.returncode == 0, shown.stderr
    config = json.loads(shown.stdout)
    assert config["num.network.threads"] == {"value": 5, "source": f"file:{config_file}"}
    assert config["listeners"] == {"value": "PLAINTEXT://127.0.0.1:19092", "source": f"file:{config_file}"}
    assert config["num.io.threads"] == {"value": 16, "source": "env:PIPELINE_NUM_IO_THREADS"}
    assert config["queued.max.requests"] == {"value": 27, "source": "flag:--queued-max-requests"}
    assert config["log.format"] == {"value": "json", "source": "flag:--log-format"}
    assert config["num.partitions"] == {"value": 1, "source": "default"}
    assert config['topic."orders".table.retention.days'] == {"value": 30, "source": f"file:{config_file}"}

    table = run_cli(*args, env={**env, "COLUMNS": "400"})  # wide enough for one line per key
    assert table.returncode == 0, table.stderr
    rows = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:4]]
            for line in table.stdout.splitlines() if line.startswith("│")}
    assert rows["num.network.threads"] == ["5", f"file:{config_file}"]
    assert rows["num.io.threads"] == ["16", "env:PIPELINE_NUM_IO_THREADS"]
    assert rows["queued.max.requests"] == ["27", "flag:--queued-max-requests"]
    assert rows["max.connections.per.ip"] == ["(= max.connections)", "default"]


@pytest.fixture
def fake_java(tmp_path) -> tuple[dict[str, str], Path]:
    """An environment whose ``java`` (JAVA_HOME and PATH) only leaves ``marker`` and fails."""
    marker = tmp_path / "java-was-started"
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    java.chmod(0o755)
    env = clean_env(JAVA_HOME=str(home), PATH=f"{home / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    return env, marker


def serve(data_dir: Path, *args: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = run_cli("serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir), "--spark-connect-port", "0",
                   *args, env=env)
    return done, time.monotonic() - started


def test_the_java_stand_in_notices_a_jvm_start(tmp_path, fake_java):
    """The control: with a good configuration ``serve`` does try to start Spark's JVM."""
    env, marker = fake_java
    done, _took = serve(tmp_path / "data", env=env)
    assert done.returncode != 0 and marker.exists(), done.stderr[-2000:]


@pytest.mark.parametrize("where", ["file", "env", "flag"])
@pytest.mark.parametrize("problem", ["unknown key", "bad value"])
def test_a_bad_key_or_value_stops_serve_before_any_jvm(tmp_path, fake_java, where, problem):
    env, marker = fake_java
    config = tmp_path / "pipeline.toml"
    config.write_text("num.partitions = 2\n")
    args = ["--config", str(config)]
    if where == "file":
        config.write_text("num.network.thread = 2\n" if problem == "unknown key" else "num.network.threads = -1\n")
        expected = (f"file:{config}: unknown key 'num.network.thread'" if problem == "unknown key"
                    else f"file:{config}: num.network.threads: expected an integer >= 1, got -1")
    elif where == "env":
        if problem == "unknown key":
            env["PIPELINE_NUM_NETWORK_THREAD"] = "2"
            expected = "env:PIPELINE_NUM_NETWORK_THREAD: unknown key 'num.network.thread'"
        else:
            env["PIPELINE_NUM_NETWORK_THREADS"] = "two"
            expected = "env:PIPELINE_NUM_NETWORK_THREADS: num.network.threads: expected an integer >= 1, got 'two'"
    else:
        if problem == "unknown key":
            args += ["--network-thread", "2"]  # argparse refuses it (exit 2) and names it
            expected = "unrecognized arguments: --network-thread 2"
        else:
            args += ["--network-threads", "0"]
            expected = "flag:--network-threads: num.network.threads: expected an integer >= 1, got 0"
    data_dir = tmp_path / "data"
    done, took = serve(data_dir, *args, env=env)
    assert done.returncode == 2, done.stderr
    assert expected in done.stderr
    assert not marker.exists(), "a JVM was started"
    assert not data_dir.exists(), "the data directory was touched"
    assert took < 60, f"took {took:.1f} s to fail"


@pytest.mark.parametrize("key, flag", [("listeners (PLAINTEXT)", "--listen"),
                                       ("spark.connect.grpc.binding.port", "--spark-connect-port"),
                                       ("pipeline.metrics.port", "--metrics-port"),
                                       ("hive.server2.thrift.port", "--thrift-port")])
def test_a_port_in_use_stops_serve_in_one_line_before_any_jvm(tmp_path, fake_java, key, flag):
    """Issue 23: a second server beside a running one must not die in JVM tracebacks: every port
    is checked before anything starts, and a taken one is one ERROR line naming its key, exit 2."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        env, marker = fake_java
        value = f"127.0.0.1:{port}" if flag == "--listen" else str(port)
        data_dir = tmp_path / "data"
        done = run_cli("serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir), flag, value, env=env)
    assert done.returncode == 2, done.stderr
    assert f"{key}: 127.0.0.1:{port} cannot be bound (Address already in use)" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 2, done.stderr
    assert not marker.exists(), "a JVM was started"
    assert not data_dir.exists(), "the data directory was touched"


# -- a real server ---------------------------------------------------------------------------

PLAIN_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+): ")


def unserved_request(correlation_id: int) -> bytes:
    """DeleteRecords v0 (api key 21, not served): the handler closes the connection with a logged reason."""
    client_id = b"log-test"
    body = struct.pack(">hhih", 21, 0, correlation_id, len(client_id)) + client_id + b"\x00" * 16
    return struct.pack(">i", len(body)) + body


@pytest.mark.slow
def test_json_logs_parse_line_by_line_and_request_lines_carry_their_ids(tmp_path):
    from kafka import KafkaProducer

    # A server of its own: --log-format is a server-level setting, and every line of the log,
    # start-up to shutdown, must parse.
    server = ServerProcess(tmp_path / "data", "--log-format", "json", "--metrics-port", "0").start()
    try:
        producer = KafkaProducer(bootstrap_servers=server.bootstrap)
        producer.send("logged", b"value").get(timeout=60)
        producer.close(30)
        client = RawClient(server.host, server.port)
        client.send(unserved_request(correlation_id=4242))
        assert client.closed_by_server()
        client.close()
        deadline = time.monotonic() + 30
        while '"correlation_id": 4242' not in server.log_text() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        code = server.stop() if server.running else server.proc.returncode
    assert code == 0, server.log_text()
    events = [json.loads(line) for line in server.log_path.read_text().splitlines() if line.strip()]
    for event in events:
        assert {"ts", "level", "logger", "message"} <= event.keys(), event
        assert event["level"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
    request_lines = [e for e in events if e["logger"].startswith("pipeline.requests")
                     or "correlation_id" in e]
    assert request_lines, "no request-related line"
    for event in request_lines:
        assert isinstance(event.get("connection_id"), str) and isinstance(event.get("correlation_id"), int), event
    for event in events:
        if event["logger"] == "pipeline.network.channel":
            assert event.get("connection_id"), event
    client_line = next(e for e in events if "client kafka-python" in e["message"])
    assert client_line["connection_id"] in client_line["message"]
    closing = next(e for e in events if e.get("correlation_id") == 4242)
    assert closing["level"] == "WARNING" and "is not served" in closing["message"]
    assert closing["connection_id"] in closing["message"]
    stages = {e["stage"]: e for e in events if "stage" in e}
    assert set(stages) == {"metrics", "spark", "recovery", "listener", "table"}
    assert all(isinstance(e["seconds"], (int, float)) and e["seconds"] >= 0 for e in stages.values())
    assert stages["listener"]["message"].startswith(f"listening on 127.0.0.1:{server.port} (ready in ")


@pytest.mark.slow
def test_default_start_up_listens_before_spark_and_prints_only_our_own_lines(tmp_path):
    """`make serve` (defaults; here a temp data directory and free ports): it listens before
    Spark is up (issue 23), and until the table side is ready nothing but our own INFO lines
    reach stderr (no Python warning, no JVM or Spark line), one line per stage."""
    # A server of its own: the test watches a fresh start with the defaults.
    server = ServerProcess(tmp_path / "data", connect_port=False).launch()
    try:
        selector = selectors.DefaultSelector()
        selector.register(server.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 180
        out = b""
        while not re.search(rb"table side ready\n", out):
            assert time.monotonic() < deadline and server.running, server.log_text()
            if selector.select(timeout=0.5):
                out += os.read(server.proc.stdout.fileno(), 4096)
        assert re.fullmatch(rb"pipeline multiqueue: listening on 127\.0\.0\.1:\d+\n"
                            rb"pipeline multiqueue: table side ready\n", out), out
        stderr_lines = server.log_path.read_text().splitlines()
    finally:
        code = server.stop()
    assert code == 0, server.log_text()
    ready = next(i for i, line in enumerate(stderr_lines) if "table side ready" in line)
    before = stderr_lines[:ready + 1]
    for line in before:
        m = PLAIN_LINE.match(line)
        assert m is not None, f"not a log line of ours: {line!r}\n" + "\n".join(before)
        assert m.group(1) == "INFO" and (m.group(2) == "pipeline" or m.group(2).startswith("pipeline.")), line
    text = "\n".join(before)
    assert "Warning" not in text and "WARNING" not in text and "jdk.incubator" not in text
    stages = ("recovery done in ", "listening on 127.0.0.1:", "Spark ready in ", "table side ready")
    at = [next(i for i, line in enumerate(before) if stage in line) for stage in stages]
    assert at == sorted(at), text  # listening before Spark is up
    for stage in stages:
        assert sum(stage in line for line in before) == 1, (stage, text)
    assert "(ready in " in before[at[1]] and "produce acknowledged at the WAL, Spark starting" in before[at[1]]
    assert "UI off (spark.ui.enabled=false)" in text and "driver log: WARN and up" in text
    assert "tables queryable by name over Spark Connect at sc://127.0.0.1:" in text  # a free port, published
    assert len(before) <= 12, text
