"""Run ``pipeline serve`` as a real subprocess on a free 127.0.0.1 port, for tests."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

LISTENING = re.compile(r"listening on (\S+):(\d+)")
TABLE_READY = "table side ready"
"""What ``pipeline serve`` prints once Spark is up (with ``--ack-on wal`` after "listening on")."""


_picked: set[int] = set()

DEFAULT_PORTS = (
    range(4040, 4057),  # a Spark driver's UI (spark.ui.port)
    range(5432, 5433),  # PostgreSQL (Debian's own cluster)
    range(6066, 6083),  # a standalone Master's REST submission server (spark.master.rest.port; on by default)
    range(7077, 7094),  # a standalone Master (spark://HOST:7077), compose.yaml's Worker (7078)
    range(7337, 7338),  # Spark's external shuffle service (spark.shuffle.service.port)
    range(8080, 8097),  # a Master's web UI (8080), a Worker's (8081)
)
"""Ports that Spark and friends bind by default, each with the 16 next ones where Spark tries them
when it is taken (``Utils.startServiceOnPort``, ``spark.port.maxRetries``). ``TEST_PORTS`` leaves them
out: test_compose_services_as_local_processes picked 6066 for its metrics proxy in CI, the Spark
Master it started took 6066 for its REST server first, and the proxy's port answered HTTP 468 (the
REST server's "unknown protocol version")."""

TEST_PORTS = tuple(port for port in range(3000, 9000) if not any(port in ports for ports in DEFAULT_PORTS))
"""The ports ``free_port`` picks from, one slice per pytest-xdist worker: below
``pipeline.network.listeners.FREE_PORT_FLOOR``, where a server under test picks its own (its Spark
Connect port), below the defaults (9092, 9093, 9464) a test may start a server on, and outside
``DEFAULT_PORTS``. A port picked here is bound a moment (a ``make serve``: seconds) later by
another process; no other worker's test and no server picks it meanwhile (random picks from one
shared range did, in CI)."""


def _worker_ports() -> tuple[int, ...]:
    """This pytest-xdist worker's slice of ``TEST_PORTS`` (``PYTEST_XDIST_WORKER`` is ``gwN``); all of it
    outside xdist."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    size = len(TEST_PORTS) // max(count, 1)
    return TEST_PORTS[index * size:(index + 1) * size]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, from this worker's slice of ``TEST_PORTS``, and not
    handed out before by this process (a server binds it a moment later).

    Raises:
        OSError: no port was free in 200 picks.
    """
    from pipeline.network.listeners import free_listen_port

    port = free_listen_port("127.0.0.1", avoid=_picked, ports=_worker_ports())
    _picked.add(port)
    return port


class ServerProcess:
    """``pipeline serve --listen 127.0.0.1:0 ...``; ``bootstrap`` once started.

    The server's stderr (its log) goes to ``log_path`` so a failing test can show it.

    The server runs in a process group of its own (its pid is the group id),
    which every process it starts inherits (Spark's JVM and the JVM's Python
    workers, the decode worker, the multiprocessing resource tracker). A
    child the server leaves behind is reparented away from it and no longer
    shows in ``descendants()``, but it stays in that group: ``kill()`` and
    ``stop()`` end with every process of the group gone, so a test leaves
    nothing running even when the server leaked a child.
    """

    def __init__(self, data_dir: Path, *args: str, log_path: Path | None = None, port: int = 0,
                 connect_port: bool = True) -> None:
        self.data_dir = Path(data_dir)
        self.args = list(args)
        self.log_path = log_path or self.data_dir.parent / f"{self.data_dir.name}-server.log"
        self.proc: subprocess.Popen | None = None
        self.host = "127.0.0.1"
        self.port = port
        self.connect_port: int | None = None
        self._pick_connect_port = connect_port
        """Pass ``--spark-connect-port`` with a free port unless ``args`` has one; False: the
        server's default (a free port it picks and publishes in ``endpoints.json``)."""
        self.port_from_stdout: int | None = None
        self._stdout = b""

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def launch(self) -> "ServerProcess":
        """Start the process and return at once (``start`` also waits for "listening on")."""
        self._log = open(self.log_path, "ab")
        self._stdout = b""
        self.port_from_stdout = None
        extra = []
        if "--spark-connect-port" not in self.args and self._pick_connect_port:
            # Known before the start, so a test can reach it once the table side is up.
            self.connect_port = free_port()
            extra = ["--spark-connect-port", str(self.connect_port)]
        cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--listen", f"127.0.0.1:{self.port}",
               "--data-dir", str(self.data_dir), *extra, *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"}, process_group=0)
        return self

    def start(self, timeout_s: float = 180.0, table: bool = True) -> "ServerProcess":
        """``launch``, then wait for "listening on" and, with ``table``, for the table side
        (Spark) too: the server listens before Spark is up with ``--ack-on wal``."""
        self.launch()
        self.wait_for("listening on", timeout_s)
        if table:
            self.wait_for(TABLE_READY, timeout_s)
        return self

    def wait_for(self, what: str, timeout_s: float = 180.0) -> None:
        """Read the server's stdout until a line with ``what`` ("listening on": sets ``host`` and
        ``port``; ``TABLE_READY``: Spark is up).

        Raises:
            RuntimeError: the server exited first.
            TimeoutError: not within ``timeout_s`` (the server is killed).
        """
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            while time.monotonic() < deadline:
                while b"\n" in self._stdout:
                    line, self._stdout = self._stdout.split(b"\n", 1)
                    text = line.decode(errors="replace")
                    m = LISTENING.search(text)
                    if m and self.port_from_stdout is None:
                        self.host, self.port = m.group(1), int(m.group(2))
                        self.port_from_stdout = self.port
                    if what in text:
                        return
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode} before {what!r}:\n{self.log_text()}")
                if sel.select(timeout=0.5):
                    self._stdout += os.read(self.proc.stdout.fileno(), 4096)
        finally:
            sel.close()
        self.kill()
        raise TimeoutError(f"server did not print {what!r} within {timeout_s} s:\n{self.log_text()}")

    def descendants(self) -> list[psutil.Process]:
        """The server's child processes, recursively (Spark JVM, decode worker, resource tracker, ...)."""
        if not self.running:
            return []
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def group(self) -> list[psutil.Process]:
        """Every live process of the server's process group but the server itself.

        Unlike ``descendants()`` it still finds a child after the server has
        exited (an orphan is reparented to init or a subreaper but keeps its
        process group).
        """
        if self.proc is None:
            return []
        members = []
        for process in psutil.process_iter():
            try:
                if process.pid != self.proc.pid and os.getpgid(process.pid) == self.proc.pid:
                    members.append(process)
            except (ProcessLookupError, psutil.Error):
                pass
        return members

    def _tree(self) -> list[psutil.Process]:
        """``descendants()`` plus ``group()``, each process once."""
        return list({p.pid: p for p in [*self.descendants(), *self.group()]}.values())

    def stop(self, timeout_s: float = 120.0) -> int:
        """SIGTERM, wait for the ordered shutdown; returns the exit code.

        Raises:
            AssertionError: not stopped within ``timeout_s`` (it is killed), with its log's end.

        Child processes still alive 15 s after the server exited are killed
        (and the test fails in ``tests/e2e/test_lifecycle.py``, which checks
        that there are none).
        """
        assert self.proc is not None
        children = self._tree()
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            # Where it stood (the shutdown logs each stage): the stage that did not end is the finding.
            raise AssertionError(f"the server did not stop within {timeout_s:.0f} s of SIGTERM (killed); "
                                 f"its log ends:\n{self.log_text()[-6000:]}") from None
        finally:
            self._log.close()
            reap(children)
            reap(self.group(), 0)  # started during the shutdown, or not a descendant any more

    def kill(self, grace_s: float = 15.0) -> list[psutil.Process]:
        """SIGKILL (a crash: no shutdown, no flush) and reap.

        The server's children must then exit by themselves; any still alive
        after ``grace_s`` are killed so tests leave nothing behind, and
        returned (already dead) so a test can assert there were none. That
        includes children an already exited server left behind (found by
        process group, see the class docstring).
        """
        children = self._tree()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        if getattr(self, "_log", None) is not None:
            self._log.close()
        killed = reap(children, grace_s)
        return killed + reap(self.group(), 0)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except OSError:
            return ""


def reap(processes: list[psutil.Process], grace_s: float = 15.0) -> list[psutil.Process]:
    """Wait up to ``grace_s`` for ``processes`` to exit; SIGKILL the rest.

    Returns the ones that had to be killed. A zombie has exited (only its process table entry waits
    for its new parent, init, to reap it, which a loaded machine does late): not counted as alive.
    """
    _gone, alive = psutil.wait_procs(processes, timeout=grace_s)
    alive = [p for p in alive if not _zombie(p)]
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    return alive


def _zombie(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def describe(processes: list[psutil.Process]) -> list[str]:
    """``"PID command line"`` (160 characters at most) of each process, ``"PID (gone)"`` if it has exited."""
    out = []
    for p in processes:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:160]}")
        except psutil.Error:
            out.append(f"{p.pid} (gone)")
    return out
