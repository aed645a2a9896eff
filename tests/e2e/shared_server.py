"""Helpers for end-to-end tests on a server other tests use too (``tests/e2e/conftest.py``).

A shared server holds every test's topics, groups and table rows, and runs
on: a test creates topics of its own (``create_topics``, unique names),
reads only its own part of the log (``LogCursor``), waits for its records to
reach the table (``wait_committed``, ``wait_caught_up``) and reads them
through the running server's Spark Connect endpoint
(``tests.e2e.table_reader.read_table`` picks it while the server runs)
instead of stopping the server first.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Mapping

import psutil

from tests.e2e.server_process import ServerProcess, reap

COMMIT_INTERVAL_MS = 1000
"""The shared servers' ``--table-commit-interval-ms``."""
LOG_RETENTION_MS = 120_000
"""The shared multiqueue server's ``--log-retention-ms``."""
COMMON_ARGS = ("--linger-ms", "20", "--table-commit-interval-ms", str(COMMIT_INTERVAL_MS))
MULTIQUEUE_ARGS = ("--mode", "multiqueue", *COMMON_ARGS, "--group-initial-rebalance-delay-ms", "0",
                   "--log-retention-ms", str(LOG_RETENTION_MS), "--metrics-port", "0")
# No background compaction (--table-compaction-interval-ms): each turn scans every partition of the
# catalog, ~0.2 CPU cores on an idle server with 60 partitions and a 6 s interval (measured), for as
# long as the session lasts.
BASELINE_ARGS = ("--mode", "baseline", *COMMON_ARGS)


class LogCursor:
    """What the server logged after a point: the file from that byte on, not ``log_text()``'s tail."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.start = server.log_path.stat().st_size if server.log_path.exists() else 0

    def text(self) -> str:
        with open(self.server.log_path, "rb") as f:
            f.seek(self.start)
            return f.read().decode(errors="replace")

    def wait_for(self, pattern: str, timeout_s: float = 120.0) -> str:
        """The first new line matching ``pattern`` (a regex); AssertionError after ``timeout_s``."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while True:
            for line in self.text().splitlines():
                if regex.search(line):
                    return line
            if time.monotonic() > deadline:
                raise AssertionError(f"no server log line matching {pattern!r}; new log:\n{self.text()[-5000:]}")
            time.sleep(0.2)


def create_topics(server: ServerProcess, partitions: Mapping[str, int],
                  configs: Mapping[str, Mapping[str, str]] | None = None) -> None:
    """Create each topic with its partition count (and topic configs) through confluent-kafka's AdminClient."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    futures = admin.create_topics([NewTopic(name, count, config=dict((configs or {}).get(name, {})))
                                   for name, count in partitions.items()], request_timeout=60)
    for future in futures.values():
        future.result(60)


def checkpointed_ends(server: ServerProcess) -> dict[tuple[str, int], int]:
    """(topic, partition) -> next offset after the last one in the table, from the checkpoint
    the server saves after each table commit (``DATA_DIR/_pipeline/checkpoint.json``)."""
    try:
        data = json.loads((server.data_dir / "_pipeline" / "checkpoint.json").read_text())
    except (OSError, ValueError):  # not written yet, or being replaced
        return {}
    return {(t, p): o for t, p, o in data["end_offsets"]}


def wait_committed(server: ServerProcess, ends: Mapping[tuple[str, int], int], timeout_s: float = 120.0) -> None:
    """Wait until the table holds every partition of ``ends`` up to (at least) its end offset."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = checkpointed_ends(server)
        short = {key: (now.get(key), end) for key, end in ends.items() if now.get(key, 0) < end}
        if not short:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not in the table within {timeout_s} s: (committed, wanted) {short}")
        time.sleep(0.2)


def log_end_offsets(server: ServerProcess, topic: str, partitions: int) -> dict[tuple[str, int], int]:
    """(topic, partition) -> the partition's log end offset (high watermark), asked with ListOffsets."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "shared-server-watermarks"})
    try:
        return {(topic, p): consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in range(partitions)}
    finally:
        consumer.close()


def wait_caught_up(server: ServerProcess, topic: str, partitions: int, timeout_s: float = 120.0) -> None:
    """Wait until the table holds everything the topic's log holds (so a read sees every stored record,
    acknowledged or not, as a read after a clean stop would)."""
    wait_committed(server, log_end_offsets(server, topic, partitions), timeout_s)


def stop_cleanly(server: ServerProcess, timeout_s: float = 120.0) -> tuple[int, list[psutil.Process]]:
    """SIGTERM; the exit code and the children still alive 15 s after the server exited (killed then).

    Like ``ServerProcess.stop`` but returns what it had to kill, so a caller can assert there was nothing.
    """
    assert server.proc is not None
    children = list({p.pid: p for p in [*server.descendants(), *server.group()]}.values())
    server.proc.send_signal(signal.SIGTERM)
    try:
        code = server.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        server.kill()
        raise
    left = reap(children) + reap(server.group(), 0)
    server.kill()  # closes the log; nothing is left to kill
    return code, left
