"""Run ``pipeline serve --brokers N`` (the supervisor and its N brokers) as a real subprocess, for tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from tests.e2e.server_process import free_port, reap

BROKER_LINE = re.compile(r"^broker (\d+): .*listening on (\S+):(\d+)")
START_TIMEOUT_S = 400.0
"""Spark Connect plus two brokers on a loaded 2-core runner."""


class Cluster:
    """``pipeline serve --brokers N`` as a subprocess; ``addresses[i]`` once each broker listens."""

    def __init__(self, data_dir: Path, n: int, *args: str) -> None:
        self.data_dir = data_dir
        self.n = n
        self.args = list(args)
        self.log_path = data_dir.parent / f"{data_dir.name}-cluster.log"
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self.addresses: dict[int, tuple[str, int]] = {}
        self._changed = threading.Condition()

    def start(self) -> "Cluster":
        self._log = open(self.log_path, "ab")
        # The supervisor's own Connect server on a free port, unless the brokers use one already running.
        self.connect_port = None if "--spark-remote" in self.args else free_port()
        connect = [] if self.connect_port is None else ["--spark-connect-port", str(self.connect_port)]
        cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--brokers", str(self.n), "--listen", "127.0.0.1:0",
               "--data-dir", str(self.data_dir), *connect, *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"}, process_group=0)
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_listening(self.n, START_TIMEOUT_S)
        return self

    def _read(self) -> None:
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            with self._changed:
                self.lines.append(line)
                m = BROKER_LINE.match(line)
                if m:
                    self.addresses[int(m.group(1))] = (m.group(2), int(m.group(3)))
                self._changed.notify_all()

    def listening_lines(self) -> int:
        return sum(1 for line in self.lines if BROKER_LINE.match(line))

    def wait_listening(self, count: int, timeout_s: float) -> None:
        """Until ``count`` "broker I: ... listening on" lines have been printed in all."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self.listening_lines() < count:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"supervisor exited with {self.proc.returncode}:\n{self.log_text()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{count} listening lines not seen in {timeout_s} s:\n{self.log_text()}")
                self._changed.wait(1.0)

    def bootstrap(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.addresses.values())

    def broker_pid(self, node_id: int) -> int:
        for child in psutil.Process(self.proc.pid).children():
            cmd = cmdline(child)
            if "--node-id" in cmd and cmd[cmd.index("--node-id") + 1] == str(node_id):
                return child.pid
        raise LookupError(f"no broker {node_id} running")

    def tree(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout_s: float = 240.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        finally:
            self._log.close()

    def kill_all(self) -> None:
        """Clean-up after a failure: the supervisor and everything under it."""
        tree = self.tree()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        reap(tree, 15)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-30000:]
        except OSError:
            return ""

    def log_about(self, *words: str, limit: int = 200) -> str:
        """The log's lines (the last ``limit``) that name one of ``words`` or are warnings and errors: what
        a failure message needs when the log's tail is another test's traffic."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        lines = [line[:400] for line in text.splitlines()
                 if any(w in line for w in words) or " WARNING " in line or " ERROR " in line]
        return "\n".join(lines[-limit:])



def cmdline(process: psutil.Process) -> list[str]:
    """A process's command line; [] for one gone or a zombie (the Connect server's JVM leaves
    its launcher's process unreaped: spark-class execs the JVM after running it)."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []
