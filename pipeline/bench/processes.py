"""Process helpers the benchmarks share: a managed server process, sampling its process tree and
``/metrics``, and the machine's description for a report.

Every benchmark starts ``pipeline serve`` (or the echo) as a ``ManagedProcess`` and reads it
through these; they import this module, not each other's internals.
"""

from __future__ import annotations

import os
import platform
import re
import signal
import subprocess
import sys
import threading
import json
import time
import urllib.request
from array import array
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Callable

import psutil

LISTENING = re.compile(r"listening on (\S+):(\d+)")
METRICS = re.compile(r"metrics on http://127\.0\.0\.1:(\d+)/metrics")
SAMPLE_INTERVAL_S = 0.2
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 180.0


# ------------------------------------------------------------------ processes


TABLE_READY = "table side ready"
"""What ``pipeline serve`` prints once Spark is up (after "listening on" with ``--ack-on wal``)."""


class ManagedProcess:
    """A child process that prints ``listening on HOST:PORT`` when ready.

    stdout is read by a thread (ready line, metrics line); stderr goes to
    ``log_path``. A ``pipeline serve`` (a command with ``serve`` in it) is
    ready once its table side is up too (``TABLE_READY``): it listens before
    Spark has started, and a bench's load must not compete with that start.
    """

    def __init__(self, name: str, cmd: list[str], log_path: Path) -> None:
        self.name = name
        self.cmd = cmd
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self._port: int | None = None
        self.metrics_port: int | None = None
        self._ready = threading.Event()
        self.serves_table = "serve" in cmd
        self.listening_s: float | None = None
        """Seconds from ``launch`` to "listening on"."""
        self._terminated = False
        self._stdout: list[str] = []

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "ManagedProcess":
        """``launch`` and ``wait_ready``."""
        return self.launch().wait_ready(timeout_s)

    def launch(self) -> "ManagedProcess":
        """Start the process without waiting (so a server's Spark can start
        while the previous server shuts down and is verified)."""
        self._log = open(self.log_path, "ab")
        self._launched_at = time.monotonic()
        self._port = None
        self._ready.clear()
        self.listening_s = None
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=self._log,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"}, text=True)
        threading.Thread(target=self._read_stdout, daemon=True, name=f"{self.name}-stdout").start()
        return self

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> "ManagedProcess":
        """Wait until it listens (a server: and its table side is up); ``startup_s`` is then the
        time since ``launch``, ``listening_s`` the time to "listening on".

        Raises:
            RuntimeError: it exited first, or did not listen within ``timeout_s``
                (then it is killed); the message ends with its log tail.
        """
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.2):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before listening:\n"
                                   f"{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{self.name} did not listen within {timeout_s:.0f} s:\n{self.log_tail()}")
        self.startup_s = time.monotonic() - self._launched_at
        return self

    def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self._stdout.append(line)
            if (m := METRICS.search(line)) is not None:
                self.metrics_port = int(m.group(1))
            if self._port is None and (m := LISTENING.search(line)) is not None:
                self._port = int(m.group(2))  # the first listener's (a server prints one line per listener)
                self.listening_s = time.monotonic() - self._launched_at
                if not self.serves_table:
                    self._ready.set()
            if self.serves_table and TABLE_READY in line:
                self._ready.set()

    @property
    def port(self) -> int:
        """The port of its first listener (``listening on HOST:PORT``).

        Raises:
            RuntimeError: it has not printed that line yet (``wait_ready`` first).
        """
        if self._port is None:
            raise RuntimeError(f"{self.name} is not listening yet")
        return self._port

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def terminate(self) -> None:
        """Send SIGTERM (ordered shutdown) once, without waiting; ``stop`` waits.

        Never twice: a second SIGTERM tells ``pipeline serve`` to stop at once,
        dropping what it has not flushed.
        """
        if self.proc is not None and self.proc.poll() is None and not self._terminated:
            self._terminated = True
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait (ordered shutdown); kills after ``timeout_s``. Returns the exit code."""
        if self.proc is None:
            return -1
        self.terminate()
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # The whole tree: a killed server would leave its Spark JVM behind.
            for child in process_tree(self.proc.pid)[1:]:
                try:
                    child.kill()
                except psutil.Error:
                    pass
            self.proc.kill()
            self.proc.wait(30)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def process_tree(pid: int) -> list[psutil.Process]:
    """``pid`` and all its descendants ([] if it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []



def start_brokers(cmd: list[str], n: int, log_path: Path, timeout_s: float = 600.0
                  ) -> tuple[subprocess.Popen[bytes], list[str], list[int], IO[bytes]]:
    """Start ``cmd`` (``pipeline serve --brokers N ... --metrics-port 0``, or a plain server for N = 1) in a
    process group of its own; wait for ``n`` ``listening on`` and ``n`` ``metrics on`` lines (one of each
    per broker). Its stdout and stderr go to ``log_path``. Stop it with ``stop_brokers``.

    Returns (process, addresses "host:port", metrics ports, open log file).
    Raises RuntimeError (the process killed) if it exits or does not get there in ``timeout_s``.
    """
    log = open(log_path, "ab")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            process_group=0)
    stdout = proc.stdout
    assert stdout is not None  # stdout=PIPE
    addresses: list[str] = []
    metrics: list[int] = []

    def read() -> None:
        for raw in iter(stdout.readline, b""):
            line = raw.decode(errors="replace")
            try:
                log.write(b"stdout: " + raw)
            except ValueError:  # the log was closed after the server stopped
                pass
            if m := METRICS.search(line):
                metrics.append(int(m.group(1)))
            elif m := LISTENING.search(line):
                addresses.append(f"{m.group(1)}:{m.group(2)}")

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while len(addresses) < n or len(metrics) < n:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait(60)
            log.close()
            raise RuntimeError(f"server did not start; log {log_path}")
        time.sleep(0.5)
    return proc, addresses[:n], metrics[:n], log


def broker_pids(pid: int, n: int) -> list[int]:
    """The broker processes of ``start_brokers``'s ``pid``: the server itself for N = 1, else the
    supervisor's ``--node-id`` children."""
    if n == 1:
        return [pid]
    return [c.pid for c in psutil.Process(pid).children() if "--node-id" in c.cmdline()]


def stop_brokers(proc: subprocess.Popen[bytes], log: IO[bytes]) -> None:
    """SIGTERM ``start_brokers``'s process and wait (ordered shutdown); after 300 s SIGKILL its process group."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own process group (process_group=0)
        proc.wait(60)
    log.close()


ROLES = ("front end", "decode worker", "JVM", "other")
"""The kinds of process in a ``pipeline serve`` tree, as ``process_role`` names them."""


def process_role(proc: psutil.Process, root_pid: int) -> str:
    """What ``proc`` is in the tree of the server ``root_pid``: "front end" (the server process
    itself), "JVM" (Spark's java), "decode worker" (a ``multiprocessing`` spawn child: the
    persister's decode pool) or "other" (e.g. multiprocessing's resource tracker).

    Raises:
        psutil.Error: the process is gone.
    """
    if proc.pid == root_pid:
        return "front end"
    if "java" in proc.name():
        return "JVM"
    cmdline = " ".join(proc.cmdline())
    if "spawn_main" in cmdline:
        return "decode worker"
    return "other"


def cpu_by_process(pid: int) -> dict[int, tuple[str, float]]:
    """{pid: (role, CPU seconds user + system so far)} for ``pid`` and all its descendants
    (``process_role``); a process that exits while being read is left out."""
    out: dict[int, tuple[str, float]] = {}
    for p in process_tree(pid):
        try:
            with p.oneshot():
                t = p.cpu_times()
                out[p.pid] = (process_role(p, pid), t.user + t.system)
        except psutil.Error:
            pass
    return out


def cpu_by_role(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per role between two ``cpu_by_process`` readings of one tree: a process
    that started in between counts from 0, one that ended in between is lost (its last
    reading is unknown). Pure. Roles with no process are left out."""
    roles: dict[str, float] = {}
    for pid, (role, cpu) in after.items():
        start = before.get(pid, (role, 0.0))[1]
        roles[role] = roles.get(role, 0.0) + max(0.0, cpu - start)
    return roles

# ------------------------------------------------------------------- sampling


@dataclass(slots=True)
class ProcessSample:
    cpu_s: float
    """CPU seconds of the tree's processes so far (``by_pid`` summed)."""
    rss_bytes: int
    by_pid: dict[int, float] = field(default_factory=dict)
    """Each process's CPU seconds so far, with its reaped children's (see ``sample_tree``)."""


def sample_tree(pid: int) -> ProcessSample:
    """CPU seconds (user + system) and RSS of ``pid`` and all its descendants (the Spark JVM), per
    process. A process's CPU includes what its children that ended and were waited for used
    (``children_user`` and ``children_system``: the kernel adds a reaped child's times to its parent's),
    so a descendant that ends between two samples keeps counting. Take differences with
    ``cpu_since``."""
    cpu, rss, by_pid = 0.0, 0, {}
    for p in process_tree(pid):
        try:
            with p.oneshot():
                t = p.cpu_times()
                by_pid[p.pid] = t.user + t.system + t.children_user + t.children_system
                cpu += by_pid[p.pid]
                rss += p.memory_info().rss
        except psutil.Error:
            pass
    return ProcessSample(cpu, rss, by_pid)


def cpu_since(before: ProcessSample, after: ProcessSample) -> float:
    """CPU seconds a process tree used between two ``sample_tree`` readings (>= 0): each process's
    growth, a process new in ``after`` from 0. A process of ``before`` missing from ``after`` adds
    nothing: reaped inside the tree, its CPU is in its parent's children times (counted in full, so
    what it used before ``before`` too); left the tree (its parent ended first, and init or a
    subreaper waits for it), the rest of its CPU is lost. The sums' difference went negative that
    way (bench-smoke failed CI twice with -0.17 s and -0.12 s of server CPU in a window). Pure."""
    return sum(max(0.0, cpu - before.by_pid.get(pid, 0.0)) for pid, cpu in after.by_pid.items())


def scrape_metrics(port: int, timeout_s: float = 1.0) -> dict[str, dict[tuple, float]]:
    """``/metrics`` as {sample name: {label items: value}} (prometheus_client's text parser).

    Raises:
        OSError: the endpoint is unreachable.
    """
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as resp:
        text = resp.read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def queue_depths(metrics: dict[str, dict[tuple, float]]) -> list[float]:
    """Per-queue depth (Kafka RequestQueueSize), ordered by queue number."""
    samples = metrics.get("kafka_network_requestchannel_requestqueuesize", {})
    by_queue = {int(dict(labels)["queue"]): v for labels, v in samples.items() if "queue" in dict(labels)}
    return [by_queue[q] for q in sorted(by_queue)]


def counter(metrics: dict[str, dict[tuple, float]], name: str, **labels: str) -> float | None:
    """Sum of sample ``name`` over the label sets that have ``labels``; None if there is no such sample."""
    values = [v for key, v in (metrics.get(name) or {}).items() if labels.items() <= dict(key).items()]
    return sum(values) if values else None


class Sampler:
    """Background sampling of one server (or the echo) while loads run.

    ``begin()``/``end()`` bracket one load window; ``end`` returns the window's
    CPU seconds, peak RSS, per-queue depth series and counter deltas.
    """

    COUNTERS = {
        "requests": ("kafka_network_requestmetrics_requests_total", {}),
        "produce_requests": ("kafka_network_requestmetrics_requests_total", {"request": "Produce"}),
        "records_persisted": ("pipeline_flush_records_total", {}),
        "flushes": ("pipeline_flush_time_ms_count", {}),
        "flush_time_ms": ("pipeline_flush_time_ms_sum", {}),
        "wal_writes": ("kafka_log_logflushstats_logflushrateandtimems_count", {}),
    }
    """Counter deltas reported per load window: key -> (sample name, labels to match)."""

    def __init__(self, pid: int, metrics_port: int | None) -> None:
        self.pid = pid
        self.metrics_port = metrics_port
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._window: dict | None = None
        self.metrics_errors = 0
        self._thread = threading.Thread(target=self._loop, daemon=True, name="sampler")
        self._thread.start()

    def _scrape(self) -> dict | None:
        if self.metrics_port is None:
            return None
        try:
            return scrape_metrics(self.metrics_port)
        except OSError:
            self.metrics_errors += 1
            return None

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            s = sample_tree(self.pid)
            m = self._scrape()
            with self._lock:
                w = self._window
                if w is None:
                    continue
                w["peak_rss"] = max(w["peak_rss"], s.rss_bytes)
                if m is not None:
                    w["depth"].append((round(time.monotonic() - w["t0"], 3), queue_depths(m)))

    def begin(self) -> None:
        s = sample_tree(self.pid)
        m = self._scrape()
        with self._lock:
            self._window = {"t0": time.monotonic(), "cpu0": s, "peak_rss": s.rss_bytes,
                            "depth": [], "m0": m}

    def end(self) -> dict:
        s = sample_tree(self.pid)
        m = self._scrape()
        with self._lock:
            w, self._window = self._window, None
        if w is None:
            return {}
        deltas = {}
        for key, (name, labels) in self.COUNTERS.items():
            a = counter(w["m0"], name, **labels) if w["m0"] else None
            b = counter(m, name, **labels) if m else None
            deltas[key] = None if a is None or b is None else b - a
        depths = [d for _, d in w["depth"]]
        queues = max((len(d) for d in depths), default=0)
        return {
            "server_cpu_s": cpu_since(w["cpu0"], s),
            "window_s": time.monotonic() - w["t0"],
            "peak_rss_bytes": max(w["peak_rss"], s.rss_bytes),
            "queue_depth": {
                "interval_s": SAMPLE_INTERVAL_S,
                "series": w["depth"],
                "max": [max((d[q] for d in depths if q < len(d)), default=0) for q in range(queues)],
                "mean": [sum(d[q] for d in depths if q < len(d)) / max(1, len(depths)) for q in range(queues)],
            },
            "counters": deltas,
        }

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


# ------------------------------------------------------------------- the machine


def machine() -> dict:
    """The machine, for a report: CPUs, platform, Python, memory, load average at the start."""
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average_at_start": os.getloadavg(),
    }


def machine_and_kernel() -> dict:
    """The machine, for a report: CPUs, memory, Python, kernel, load average (consume and security benches)."""
    return {"cpus": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "kernel": platform.release(),
            "load_average": os.getloadavg()}


def server_cpu(server: ManagedProcess) -> ProcessSample:
    """CPU seconds (user + system) of ``server``'s process tree so far, per process (``cpu_since``
    takes the difference of two)."""
    return sample_tree(server.pid)


def run_and_report(opts: Any, flag: str, argv: list[str] | None, run: Callable[..., dict],
                   failures: Callable[[dict], list[str]], summary_md: Callable[[dict], str]) -> int:
    """The ``main`` of a benchmark mode that runs once and reports (``--sustained``, ``--freshness``):
    ``run(opts, log)`` with timestamped progress lines, then ``OUT/results.json`` (the command, the start,
    the wall time in s, the machine, the options, the run's own result and its ``failures``) and
    ``OUT/summary.md`` (``summary_md``), printed; ``opts.out`` is the output directory.

    Returns:
        The exit status: 1 when ``failures`` found any, else 0.
    """
    from rich.console import Console

    console = Console(width=None if Console().is_terminal else 160)
    opts.out = opts.out.resolve()
    opts.out.mkdir(parents=True, exist_ok=True)
    started, started_at, at_start = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%S%z"), machine()
    result = run(opts, lambda text: console.print(f"[dim]{time.monotonic() - started:6.1f} s[/] {text}"))
    result = {"command": "pipeline bench " + " ".join(argv if argv is not None else [flag]),
              "started_at": started_at, "wall_s": time.monotonic() - started, "machine": at_start,
              "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(opts).items()}, **result}
    result["failures"] = failures(result)
    (opts.out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    summary = summary_md(result)
    (opts.out / "summary.md").write_text(summary)
    print(summary, flush=True)  # plain: rich would wrap the reproducing command
    console.print(f"results: {opts.out / 'results.json'}")
    for reason in result["failures"]:
        console.print(f"[red]FAILED[/]: {reason}")
    return 1 if result["failures"] else 0


class DeliveryLog:
    """The acknowledgements of one producer process's records, by sequence number: a record's key is
    ``<producer>-<seq>``; ``on_delivery`` is its confluent-kafka delivery callback.

    Attributes:
        partition, offset: per seq (``array`` 'i' / 'q' of ``capacity``), -1 until acknowledged.
        state: ``acked`` (records), ``bytes`` (key + ``record_bytes`` each), ``last`` (``time.perf_counter``
            of the latest acknowledgement).
        errors: the first 10 delivery errors.
    """

    def __init__(self, capacity: int, record_bytes: int) -> None:
        self.partition, self.offset = array("i", [-1]) * capacity, array("q", [-1]) * capacity
        self.state: dict[str, float] = {"acked": 0, "bytes": 0, "last": 0.0}
        self.errors: list[str] = []
        self.record_bytes = record_bytes

    def on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            if len(self.errors) < 10:
                self.errors.append(str(err))
            return
        key = msg.key() or b""
        seq = int(key.partition(b"-")[2])
        self.partition[seq], self.offset[seq] = msg.partition() or 0, msg.offset() or 0
        self.state["acked"] += 1
        self.state["bytes"] += len(key) + self.record_bytes
        self.state["last"] = time.perf_counter()
