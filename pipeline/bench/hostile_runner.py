"""``pipeline bench --hostile``: good producers beside every hostile client, RSS against the memory bound.

One multiqueue server (``pipeline serve`` subprocess) with explicit, smaller
limits (``hostile_server_config``), then:

1. warm-up: the good producers for a few seconds (a fresh server's first
   Spark writes take seconds);
2. **clean**: good producers at a fixed rate (``--rate`` requests/s over C=4
   connections, K=5 in flight, acks=-1, 10 x 64 B records per request) for
   ``--duration`` seconds, nothing else;
3. **hostile**: the same good producers (on their own topic) for the same
   time, beside ``pipeline.bench.hostile_clients`` repeating every hostile
   case (``pipeline.bench.hostile``) until the phase ends;
4. SIGTERM (ordered shutdown: everything accepted is flushed), then the table
   is read with Spark and checked (``pipeline.bench.verify``): every
   acknowledged record of the good producers and of the hostile clients is
   stored exactly once at its acknowledged offset; no refused one is stored.

Throughout, the server's RSS is sampled every ``RSS_INTERVAL_S`` with psutil:
the server *process* (the Python process the memory bound is about) and its
whole tree (plus the Spark JVM and the decode worker, reported beside it).
The bound is ``pipeline.bench.hostile.memory_bound`` of the configuration used.

Verdicts (``results.json`` "checks"): acknowledged records lost (must be 0),
peak RSS under the bound, every hostile case executed with the expected
answer (the client's view: closed / error code / acknowledged, and for
closes the reason the server logged for that connection), good producers'
p99 in the hostile phase within ``P99_TARGET_RATIO`` of the clean phase, RSS
within +-``RSS_BAND`` of its median after warm-up. The exit code is 1 if a
record was lost, the RSS exceeded the bound, a hostile case got an unexpected
answer, or the run could not complete; the p99 ratio and the RSS band are
reported as targets met / not met.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import psutil

if TYPE_CHECKING:
    from rich.console import Console

    from pipeline.persist.persister import AckOn

from pipeline.bench import verify
from pipeline.config import ServerConfig
from pipeline.bench.hostile import MiB, memory_bound
from pipeline.bench.hostile_clients import HostileSpec
from pipeline.bench.loadgen import LoadSpec
from pipeline.bench.processes import ManagedProcess, machine, process_tree
from pipeline.bench.runner import figures, prepare_out, read_topic_rows, run_load, verify_run

RSS_INTERVAL_S = 0.5
RSS_BAND = 0.10
P99_TARGET_RATIO = 2.0
WARMUP_S = 5.0
GOOD_CONNECTIONS = 4
GOOD_IN_FLIGHT = 5
GOOD_RECORDS = 10
GOOD_RECORD_BYTES = 64
PARTITIONS = 4
CLEAN_TOPIC = "good-clean"
HOSTILE_PHASE_TOPIC = "good-hostile"
HOSTILE_TOPIC = "hostile"
DRIVER_STARTUP_S = 1.0
"""About how long the hostile clients' process takes from its start to its first case (imports, topic)."""
DRIVER_MARGIN_S = 120.0
"""The hostile clients may run this much past their own hard bound before they are killed."""


@dataclass(slots=True)
class HostileOptions:
    """``pipeline bench --hostile`` options. Times in seconds.

    Attributes:
        out: output directory.
        duration: seconds of each phase (clean, hostile).
        rate: good producers' requests/s (all connections together).
        memory_attack_connections: connections of one memory-attack round.
        burst_connections: size of the first connection burst (later ones: a fifth of it).
        ack_on, linger_ms: the server's.
        server_args: extra ``pipeline serve`` arguments.
    """

    out: Path
    duration: float = 270.0
    rate: float = 300.0
    memory_attack_connections: int = 40
    burst_connections: int = 10_000
    ack_on: AckOn = "wal"
    linger_ms: float = 50.0
    server_args: list[str] = field(default_factory=list)


def hostile_server_config(opts: HostileOptions, data_dir: Path) -> ServerConfig:
    """The ServerConfig the bench starts (explicit limits; the rest are ServerConfig's defaults).

    The pool is a little smaller than socket.request.max.bytes so a frame can
    be larger than the pool yet allowed; response.buffer.max.bytes, buffer.memory
    and batch.max.bytes are lowered to keep the bound near what the server can
    really use; the timeouts are short so that stalling clients are closed often.
    """
    from pipeline.config import Mode

    d = ServerConfig()
    return ServerConfig(
        listen_host="127.0.0.1", listen_port=0, mode=Mode.MULTIQUEUE, data_dir=data_dir,
        socket_request_max_bytes=d.socket_request_max_bytes,     # 100 MiB
        queued_max_request_bytes=96 * MiB,
        max_connections=d.max_connections,                       # 1000
        response_buffer_max_bytes=128 * 1024,
        request_receive_timeout_ms=3_000,
        response_send_timeout_ms=3_000,
        buffer_memory=64 * MiB,
        batch_max_bytes=16 * MiB,
        num_partitions=PARTITIONS,
        linger_ms=opts.linger_ms,
        ack_on=opts.ack_on,
        metrics_port=0,
        table_compaction_interval_ms=0,   # its verifier reads the files (read_uncompacted_files)
        spark_connect_port=0,
    )


_FLAGS = ("mode", "queues", "socket_request_max_bytes", "queued_max_request_bytes", "max_connections",
          "max_in_flight_requests_per_connection", "response_buffer_max_bytes", "request_receive_timeout_ms",
          "response_send_timeout_ms", "connections_max_idle_ms", "buffer_memory", "batch_max_bytes",
          "batch_max_records", "num_partitions", "linger_ms", "ack_on", "metrics_port", "data_dir",
          "table_compaction_interval_ms", "spark_connect_port")


def serve_command(config: ServerConfig) -> list[str]:
    """``python -m pipeline.cli serve`` with every limit of ``config`` spelled out."""
    args = [sys.executable, "-m", "pipeline.cli", "serve", "--listen", f"{config.listen_host}:{config.listen_port}"]
    for name in _FLAGS:
        value = getattr(config, name)
        args += [f"--{name.replace('_', '-')}", str(value.value if hasattr(value, "value") else value)]
    return args


# ------------------------------------------------------------------ RSS sampling


class RssSampler:
    """RSS of the server process and of its whole tree every ``RSS_INTERVAL_S``, and phase marks."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.samples: list[tuple[float, int, int]] = []  # (s since t0, process RSS, tree RSS)
        self.marks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="rss-sampler")
        self._thread.start()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def mark(self, name: str) -> None:
        self.marks[name] = round(self.now(), 3)

    def _loop(self) -> None:
        while not self._stop.is_set():
            tree = process_tree(self.pid)
            if not tree:
                break
            own = total = 0
            for i, p in enumerate(tree):
                try:
                    rss = p.memory_info().rss
                except psutil.Error:
                    continue
                total += rss
                if i == 0:
                    own = rss
            if own:
                self.samples.append((round(self.now(), 3), own, total))
            self._stop.wait(RSS_INTERVAL_S)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


class PhaseHook:
    """Passed to ``run_load`` as its sampler: marks the load window, and for the
    hostile phase starts the hostile clients the moment the good producers are
    connected (so the burst cannot refuse them)."""

    def __init__(self, name: str, rss: RssSampler, start: Callable[[], None] | None = None) -> None:
        self.name, self.rss, self.start = name, rss, start

    def begin(self) -> None:
        self.rss.mark(f"{self.name}_start")
        if self.start is not None:
            self.start()

    def end(self) -> dict:
        self.rss.mark(f"{self.name}_end")
        return {}


# ------------------------------------------------------------------ evaluation


_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \S+ \S+: closing connection (\S+): (.*)$")


def closing_lines(log_text: str) -> dict[int, list[tuple[float, str]]]:
    """{client port: [(wall-clock time, reason)]} of the server log's "closing connection" lines."""
    out: dict[int, list[tuple[float, str]]] = defaultdict(list)
    for line in log_text.splitlines():
        m = _LOG_LINE.match(line)
        if m is None:
            continue
        when = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
        remote = m.group(3).split("-")
        if len(remote) < 2 or ":" not in remote[1]:
            continue
        try:
            out[int(remote[1].rsplit(":", 1)[1])].append((when, m.group(4)))
        except ValueError:
            continue
    return out


def check_logged_reasons(executions: list[dict], closes: dict[int, list[tuple[float, str]]]) -> None:
    """For each execution answered as expected whose case names a logged reason:
    every one of its connections must have a closing line in its time window
    matching the reason; otherwise its answer says what the log had."""
    for ex in executions:
        ex["logged"] = None
        if not ex.get("reason") or not ex["ok"]:
            continue
        pattern = re.compile(ex["reason"])
        seen = []
        for port in ex["ports"]:
            lines = [r for t, r in closes.get(port, ()) if ex["t0"] - 2 <= t <= ex["t1"] + 2]
            hit = next((r for r in lines if pattern.search(r)), None)
            seen.append(hit if hit is not None else (lines[0] if lines else None))
            if hit is None:
                ex["ok"] = False
                ex["answer"] += (f" (server log: {lines[0]!r})" if lines else " (no closing line in the server log)")
                break
        ex["logged"] = seen[0] if seen else None


def summarize_cases(executions: list[dict]) -> list[dict]:
    """Per case: executions, how many got the expected answer, and the answers seen."""
    by_case: dict[str, dict] = {}
    for ex in executions:
        c = by_case.setdefault(ex["case"], {"case": ex["case"], "expected": ex["expected"], "executed": 0,
                                            "as_expected": 0, "answers": defaultdict(int), "logged": None,
                                            "example_detail": ex.get("detail")})
        c["executed"] += 1
        c["as_expected"] += bool(ex["ok"])
        c["answers"][ex["answer"]] += 1
        c["logged"] = c["logged"] or ex.get("logged")
    out = []
    for c in by_case.values():
        c["answers"] = dict(c["answers"])
        c["unexpected"] = c["executed"] - c["as_expected"]
        out.append(c)
    return out


def rss_stats(samples: list[list], marks: dict[str, float], warm_end: float | None, bound: int) -> dict:
    """Peak, per-phase and post-warm-up figures of the server process RSS (bytes)."""
    def window(a: float | None, b: float | None) -> list[int]:
        if a is None or b is None:
            return []
        return [s[1] for s in samples if a <= s[0] <= b]

    def median(xs: list[int]) -> float | None:
        if not xs:
            return None
        ys = sorted(xs)
        return ys[len(ys) // 2]

    own = [s[1] for s in samples]
    tree = [s[2] for s in samples]
    h_start, h_end = marks.get("hostile_start"), marks.get("hostile_end")
    clean = window(marks.get("clean_start"), marks.get("clean_end"))
    hostile = window(h_start, h_end)
    after = window(warm_end, h_end)
    mid = median(after)
    band = None
    if mid:
        lo, hi = (1 - RSS_BAND) * mid, (1 + RSS_BAND) * mid
        inside = sum(lo <= x <= hi for x in after)
        band = {"median": mid, "min": min(after), "max": max(after), "low": lo, "high": hi,
                "samples": len(after), "inside": inside, "fraction_inside": inside / len(after),
                "within": inside == len(after), "warm_up_end_s": warm_end}
    return {
        "interval_s": RSS_INTERVAL_S,
        "samples": len(samples),
        "peak": max(own, default=0),
        "peak_tree": max(tree, default=0),
        "bound": bound,
        "under_bound": bool(own) and max(own) <= bound,
        "clean": {"min": min(clean, default=None), "max": max(clean, default=None), "median": median(clean)},
        "hostile": {"min": min(hostile, default=None), "max": max(hostile, default=None),
                    "median": median(hostile)},
        "band_after_warm_up": band,
    }


def table_findings(report: verify.TableReport | None) -> dict | None:
    if report is None:
        return None
    return {"rows": report.rows, "expected": report.expected,
            **{k: getattr(report, k).to_json() for k in
               ("missing", "duplicated", "unexpected", "misplaced", "out_of_order", "gaps")}}


def latency_points(load: dict | None, rate: float) -> list[tuple[float, float]]:
    """(estimated send time in s since the phase start, latency in ms) of every good response.

    The loadgen keeps latencies, not send times. The token bucket releases
    requests at a steady rate, so each connection's requests are spread over
    the sending time: request ``r`` of a connection that sent ``n`` is placed
    at ``(r + 0.5) / n`` of it. When the window (K per connection) is full the
    real send is later, so a slow response is placed at or before the moment
    it was sent: good enough to line spikes up with what the hostile clients
    were doing, not to the millisecond. (``rate`` is unused; kept for callers.)
    """
    if not load:
        return []
    sending_s = min(load["spec"]["duration_s"], load.get("elapsed_s") or load["spec"]["duration_s"])
    out = []
    for conn in load.get("connections", []):
        n = max(1, conn["sent"])
        for req, latency_us, _, _ in conn["responses"]:
            if latency_us > 0:
                out.append(((req + 0.5) / n * sending_s, latency_us / 1000))
    out.sort()
    return out


def percentile(values: list[float], p: float) -> float | None:
    """The ``p``th percentile (nearest rank) of ``values``; None if there are none."""
    return _percentile(values, p) if values else None


def _percentile(values: list[float], p: float) -> float:
    """``percentile`` of a non-empty ``values``."""
    ys = sorted(values)
    return ys[min(len(ys) - 1, int(round(p / 100 * (len(ys) - 1))))]


def busy_spans(executions: list[dict], wall_start: float, prefixes: tuple[str, ...], after_s: float = 2.0
               ) -> list[tuple[float, float]]:
    """(start, end) in s since ``wall_start`` of the executions whose case starts with one of ``prefixes``."""
    return [(ex["t0"] - wall_start, ex["t1"] - wall_start + after_s) for ex in executions
            if ex["case"].startswith(prefixes)]


def p99_outside(points: list[tuple[float, float]], spans: list[tuple[float, float]]) -> float | None:
    return percentile([lat for t, lat in points if not any(a <= t <= b for a, b in spans)], 99)


def analyse_latency(load: dict, executions: list[dict], phase_wall0: float, rate: float) -> dict:
    """The hostile phase's p99 inside and outside the connection bursts (and 2 s after
    each) and the memory-attack rounds; ``phase_wall0``: wall-clock time of the phase start."""
    pts = latency_points(load, rate)
    bursts = busy_spans(executions, phase_wall0, ("burst",))
    memory = busy_spans(executions, phase_wall0, ("memory",), after_s=0.0)
    return {
        "p99_ms_outside_bursts": p99_outside(pts, bursts),
        "p99_ms_during_bursts": percentile([lat for t, lat in pts if any(a <= t <= b for a, b in bursts)], 99),
        "p99_ms_outside_bursts_and_memory_rounds": p99_outside(pts, bursts + memory),
        "burst_spans_s": bursts, "memory_round_spans_s": memory,
        "share_of_requests_in_burst_spans": (sum(any(a <= t <= b for a, b in bursts) for t, _ in pts)
                                             / max(1, len(pts))),
    }


# ------------------------------------------------------------------ the run


def good_spec(port: int, topic: str, opts: HostileOptions, duration: float) -> LoadSpec:
    return LoadSpec("127.0.0.1", port, topic=topic, connections=GOOD_CONNECTIONS, in_flight=GOOD_IN_FLIGHT,
                    records=GOOD_RECORDS, record_bytes=GOOD_RECORD_BYTES, partitions=PARTITIONS, acks=-1,
                    max_requests=int(opts.rate * duration * 1.1) + 100, duration_s=duration, rate=opts.rate)


def main(opts: HostileOptions) -> int:
    from rich.console import Console

    console = Console(stderr=True)
    out = prepare_out(opts.out)
    data_dir = out / "data" / "hostile"
    config = hostile_server_config(opts, data_dir)
    bound = memory_bound(config)
    cmd = serve_command(config) + list(opts.server_args or [])
    started = time.monotonic()
    results: dict = {
        "kind": "hostile",
        "command": "pipeline bench " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
        "server": {"command": " ".join(["pipeline", *cmd[3:]]),
                   "config": {f.name: (str(getattr(config, f.name)) if isinstance(getattr(config, f.name), Path)
                                       else getattr(config, f.name).value if hasattr(getattr(config, f.name), "value")
                                       else getattr(config, f.name)) for f in fields(config)},
                   "rss_measured": "the server process (pipeline serve, Python); tree = it plus its children "
                                   "(Spark JVM, decode worker)"},
        "memory_bound": bound.to_json(),
        "good_producers": {"connections": GOOD_CONNECTIONS, "in_flight": GOOD_IN_FLIGHT, "records": GOOD_RECORDS,
                           "record_bytes": GOOD_RECORD_BYTES, "partitions": PARTITIONS, "acks": -1,
                           "rate_requests_per_s": opts.rate},
        "error": None,
    }
    console.print(f"[bold]pipeline bench --hostile[/]: {opts.duration:g} s clean + {opts.duration:g} s hostile, "
                  f"good producers at {opts.rate:g} req/s")
    console.print("server: " + results["server"]["command"])
    console.print("memory bound: " + ", ".join(f"{k} {v / MiB:.0f} MiB" for k, v in bound.to_json().items()))

    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verifier-spark")
    from pipeline.bench.runner import verifier_spark

    server = ManagedProcess("hostile-server", cmd, out / "logs" / "server.log")
    rss: RssSampler | None = None
    outcomes = {}
    driver_result: dict | None = None
    driver_proc: subprocess.Popen | None = None
    spark_future = None
    try:
        server.launch()
        spark_future = executor.submit(verifier_spark)
        server.wait_ready()
        results["server"]["startup_s"] = server.startup_s
        results["server"]["listening_s"] = server.listening_s
        rss = RssSampler(server.pid)
        console.print(f"server ready in {server.startup_s:.0f} s on port {server.port}; warm-up {WARMUP_S:g} s")
        warm = run_load(good_spec(server.port, "good-warmup", opts, WARMUP_S), out / "runs", "warmup",
                        PhaseHook("warmup", rss))
        results["warmup_error"] = warm.error

        console.print(f"phase 1 (clean): {opts.duration:g} s")
        outcomes["clean"] = run_load(good_spec(server.port, CLEAN_TOPIC, opts, opts.duration), out / "runs",
                                     "clean", PhaseHook("clean", rss))

        spec = HostileSpec(
            host="127.0.0.1", port=server.port, topic=HOSTILE_TOPIC, duration_s=opts.duration,
            socket_request_max_bytes=config.socket_request_max_bytes, pool_bytes=config.queued_max_request_bytes,
            receive_timeout_ms=config.request_receive_timeout_ms, send_timeout_ms=config.response_send_timeout_ms,
            response_buffer_max_bytes=config.response_buffer_max_bytes, max_connections=config.max_connections,
            memory_attack_connections=opts.memory_attack_connections, burst_connections=opts.burst_connections,
            burst_repeat_connections=max(1, opts.burst_connections // 5))
        spec_path, result_path = out / "runs" / "hostile-clients.spec.json", out / "runs" / "hostile-clients.result.json"
        spec_path.write_text(json.dumps(asdict(spec), indent=1))
        result_path.unlink(missing_ok=True)
        driver_log = open(out / "logs" / "hostile-clients.log", "wb")

        driver_started = [time.monotonic()]

        def start_driver() -> None:
            nonlocal driver_proc
            driver_started[0] = time.monotonic()
            driver_proc = subprocess.Popen([sys.executable, "-m", "pipeline.bench.hostile_clients", str(spec_path),
                                            str(result_path)], stdout=driver_log, stderr=driver_log)

        console.print(f"phase 2 (hostile): {opts.duration:g} s, every hostile case on repeat")
        outcomes["hostile"] = run_load(good_spec(server.port, HOSTILE_PHASE_TOPIC, opts, opts.duration),
                                       out / "runs", "hostile", PhaseHook("hostile", rss, start_driver))
        if driver_proc is not None:
            hard = (opts.duration + spec.grace_s + spec.memory_attack_connections
                    * (spec.receive_timeout_ms / 1000 + 3) + 60 + DRIVER_MARGIN_S)
            try:
                driver_proc.wait(max(10.0, hard - (time.monotonic() - driver_started[0])))
            except subprocess.TimeoutExpired:
                driver_proc.kill()
                driver_proc.wait(30)
            rss.mark("hostile_clients_end")
            if result_path.exists():
                driver_result = json.loads(result_path.read_text())
        driver_log.close()
        console.print("stopping the server (ordered shutdown flushes everything)")
        rss.mark("stop")
        results["server"]["exit_code"] = server.stop()
    except Exception as exc:  # noqa: BLE001 - reported, exit 1
        results["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if rss is not None:
            rss.close()
        if driver_proc is not None and driver_proc.poll() is None:
            driver_proc.kill()
        if server.proc is not None and server.proc.poll() is None:
            server.kill()

    # ---------------------------------------------------------- verification
    console.print("verifying the table")
    rows: dict[str, list] = {}
    try:
        if spark_future is None:
            raise RuntimeError("the verifier's Spark was never started")
        spark = spark_future.result()
        try:
            rows = read_topic_rows(spark, data_dir, [CLEAN_TOPIC, HOSTILE_PHASE_TOPIC, HOSTILE_TOPIC])
        finally:
            spark.stop()
    except Exception as exc:  # noqa: BLE001
        results["error"] = results["error"] or f"table not read: {type(exc).__name__}: {exc}"[:800]
    executor.shutdown(wait=False)

    phases: dict[str, dict[str, Any]] = {}
    lost = 0
    for name, topic in (("clean", CLEAN_TOPIC), ("hostile", HOSTILE_PHASE_TOPIC)):
        o = outcomes.get(name)
        if o is None:
            phases[name] = {"error": "not run"}
            continue
        f = figures(o, None)
        v = verify_run(o, rows.get(topic)) if o.load is not None and rows else None
        if v is not None and v.table is not None:
            lost += v.table.missing.count
        phases[name] = {"topic": topic, "figures": f, "error": o.error,
                        "verification": v.to_json() if v is not None else None}
    hostile_table = None
    executions: list[dict] = []
    if driver_result is not None:
        executions = driver_result["executions"]
        expected = [verify.ExpectedRequest(c, r, 0, n, base) for ex in executions for c, r, n, base in ex["acked"]]
        if rows:
            hostile_table = verify.check_table(expected, rows.get(HOSTILE_TOPIC, []))
            lost += hostile_table.missing.count
        check_logged_reasons(executions, closing_lines(server.log_path.read_text(errors="replace")))
    cases = summarize_cases(executions)

    # warm-up: until every case has been executed once (the server has seen each allocation pattern)
    warm_end = None
    if rss is not None and executions and "hostile_start" in rss.marks:
        firsts: dict[str, float] = {}
        for ex in executions:
            firsts.setdefault(ex["case"], ex["t1"])
        warm_end = round(max(firsts.values()) - rss.wall0, 3)
        warm_end = max(warm_end, rss.marks["hostile_start"] + 0.2 * opts.duration)
    samples = [list(s) for s in rss.samples] if rss is not None else []
    rss_figures = rss_stats(samples, rss.marks if rss else {}, warm_end, bound.total)

    p99 = {k: ((phases.get(k, {}).get("figures") or {}).get("latency_ms") or {}).get("p99")
           for k in ("clean", "hostile")}
    ratio = p99["hostile"] / p99["clean"] if p99["clean"] and p99["hostile"] else None
    # where the hostile phase's tail comes from: its p99 outside the bursts (and the 2 s after each)
    latency_analysis = None
    hostile_o = outcomes.get("hostile")
    if hostile_o is not None and hostile_o.load and driver_result is not None and rss is not None:
        latency_analysis = analyse_latency(hostile_o.load, executions,
                                           rss.wall0 + rss.marks.get("hostile_start", 0.0), opts.rate)
    verified = all((phases.get(k) or {}).get("verification") and phases[k]["verification"]["table"] is not None
                   for k in ("clean", "hostile")) and hostile_table is not None
    unexpected = sum(c["unexpected"] for c in cases)
    burst_total = sum(b.get("opened_and_dropped", 0) for b in (driver_result or {}).get("bursts", []))
    largest_burst = max((b.get("opened_and_dropped", 0) for b in (driver_result or {}).get("bursts", [])), default=0)
    checks = {
        "acked_records_lost": lost if verified else None,
        "table_verified": verified,
        "good_violations": {k: ((phases.get(k) or {}).get("verification") or {}).get("violations")
                            for k in ("clean", "hostile")},
        "hostile_table": table_findings(hostile_table),
        "rss_under_bound": rss_figures["under_bound"],
        "rss_within_band": (rss_figures["band_after_warm_up"] or {}).get("within"),
        "p99_ms": p99,
        "p99_ratio": ratio,
        "p99_within_target": None if ratio is None else ratio <= P99_TARGET_RATIO,
        "latency_analysis": latency_analysis,
        "hostile_cases": len(cases),
        "hostile_executions": len(executions),
        "unexpected_answers": unexpected,
        "every_case_ran": bool(cases) and all(c["executed"] > 0 for c in cases),
        "largest_burst": largest_burst,
        "connections_burst_total": burst_total,
        "driver_errors": (driver_result or {}).get("errors", ["hostile clients produced no result"]),
        "server_exit_code": results["server"].get("exit_code"),
    }
    failures = []
    if not verified:
        failures.append("the table could not be verified")
    elif lost:
        failures.append(f"{lost} acknowledged record(s) lost")
    if not rss_figures["under_bound"]:
        failures.append(f"RSS peak {rss_figures['peak'] / MiB:.0f} MiB over the bound {bound.total / MiB:.0f} MiB")
    if unexpected:
        which = "; ".join(f"{c['case']}: expected {c['expected']}, answers {c['answers']}"
                          for c in cases if c["unexpected"])
        failures.append(f"{unexpected} hostile execution(s) got an unexpected answer ({which})")
    if checks["driver_errors"]:
        failures.append("hostile clients: " + "; ".join(checks["driver_errors"]))
    for k in ("clean", "hostile"):
        if (phases.get(k) or {}).get("error"):
            failures.append(f"{k} phase: " + phases[k]["error"].splitlines()[0])
        phase_verification = (phases.get(k) or {}).get("verification")
        if phase_verification and phase_verification["violations"]:
            failures.append(f"{k} phase: {phase_verification['violations']} verification violation(s)")
    if hostile_table is not None and hostile_table.violations:
        failures.append(f"hostile topic: {hostile_table.violations} table violation(s)")
    if checks["server_exit_code"] not in (0,):
        failures.append(f"server exit code {checks['server_exit_code']}")
    if results["error"]:
        failures.append(results["error"])
    checks["failures"] = failures
    checks["ok"] = not failures

    results.update(phases=phases, rss=rss_figures, rss_series=samples, marks=rss.marks if rss else {},
                   wall_clock_at_0=rss.wall0 if rss else None,
                   cases=cases, bursts=(driver_result or {}).get("bursts", []), checks=checks,
                   finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), wall_s=time.monotonic() - started)
    (out / "runs" / "executions.json").write_text(json.dumps(executions, separators=(",", ":")))
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    write_rss_plot(results, out)
    write_latency_plot(results, out, {k: o.load for k, o in outcomes.items() if o is not None})
    (out / "summary.md").write_text(markdown(results))
    wide = Console(width=None if Console().is_terminal else 200)
    print_report(results, wide)
    wide.print(f"results: {out / 'results.json'}; rss_over_time.png and summary.md in {out}")
    return 0 if checks["ok"] else 1


# ------------------------------------------------------------------ report


def _mib(v: float | None) -> str:
    return "-" if v is None else f"{v / MiB:.0f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def phase_rows(results: dict) -> list[list[str]]:
    rows = []
    for name in ("clean", "hostile"):
        p = results["phases"].get(name) or {}
        f = p.get("figures") or {}
        lat = f.get("latency_ms") or {}
        v = p.get("verification") or {}
        t = v.get("table") or {}
        rows.append([name, _ms(f.get("requests_per_s")), _ms(lat.get("p50")), _ms(lat.get("p99")),
                     _ms(lat.get("p99.9")), _ms(lat.get("max")), str(t.get("expected", "-")),
                     str((t.get("missing") or {}).get("count", "-")), str(v.get("violations", "-"))])
    return rows


PHASE_COLUMNS = ("phase", "req/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "acked records", "lost", "violations")
CASE_COLUMNS = ("case", "expected", "runs", "as expected", "other answers")


def case_rows(results: dict) -> list[list[str]]:
    rows = []
    for c in results["cases"]:
        others = "; ".join(f"{a} x{n}" for a, n in c["answers"].items() if a != c["expected"])
        rows.append([c["case"], c["expected"], str(c["executed"]), str(c["as_expected"]), others or "-"])
    return rows


def verdict_lines(results: dict) -> list[str]:
    c, r = results["checks"], results["rss"]
    band = r.get("band_after_warm_up") or {}
    ratio = c.get("p99_ratio")
    return [
        f"acknowledged records lost: {c['acked_records_lost']} (must be 0)",
        f"server RSS peak {_mib(r['peak'])} MiB, bound {_mib(r['bound'])} MiB: "
        f"{'under' if r['under_bound'] else 'OVER'} (process tree with the Spark JVM: peak {_mib(r['peak_tree'])} MiB)",
        (f"RSS after warm-up (from {band['warm_up_end_s']:.0f} s): median {_mib(band['median'])} MiB, "
         f"{_mib(band['min'])}-{_mib(band['max'])} MiB, {100 * band['fraction_inside']:.0f} % of samples within "
         f"+-{100 * RSS_BAND:.0f} %: {'met' if band['within'] else 'not met'}") if band else
        "RSS band after warm-up: not measured",
        f"good producers' p99: clean {_ms(c['p99_ms']['clean'])} ms, hostile {_ms(c['p99_ms']['hostile'])} ms, "
        f"ratio {'-' if ratio is None else f'{ratio:.2f}'} (target <= {P99_TARGET_RATIO:g}): "
        f"{'-' if ratio is None else 'met' if c['p99_within_target'] else 'not met'}",
        *([f"hostile phase p99 outside the connection bursts (and 2 s after each): "
           f"{_ms(c['latency_analysis']['p99_ms_outside_bursts'])} ms, during them "
           f"{_ms(c['latency_analysis']['p99_ms_during_bursts'])} ms "
           f"({100 * c['latency_analysis']['share_of_requests_in_burst_spans']:.0f} % of the requests); outside "
           f"bursts and memory-attack rounds {_ms(c['latency_analysis']['p99_ms_outside_bursts_and_memory_rounds'])}"
           f" ms"] if c.get("latency_analysis") else []),
        f"hostile: {c['hostile_cases']} cases, {c['hostile_executions']} executions, "
        f"{c['unexpected_answers']} unexpected answer(s); largest connection burst {c['largest_burst']}, "
        f"{c['connections_burst_total']} burst connections in all",
        "result: " + ("OK" if c["ok"] else "FAILED: " + "; ".join(c["failures"])),
    ]


def print_report(results: dict, console: Console) -> None:
    from rich.table import Table

    t = Table(title=f"good producers ({results['good_producers']['rate_requests_per_s']:g} req/s, "
                    f"C={GOOD_CONNECTIONS} K={GOOD_IN_FLIGHT} acks=-1)")
    for col in PHASE_COLUMNS:
        t.add_column(col, justify="left" if col == "phase" else "right")
    for row in phase_rows(results):
        t.add_row(*row)
    console.print(t)
    c = Table(title="hostile cases")
    for col in CASE_COLUMNS:
        c.add_column(col, overflow="fold")
    for row in case_rows(results):
        c.add_row(*row, style="red" if row[-1] != "-" else None)
    console.print(c)
    for line in verdict_lines(results):
        console.print(line, style="red" if "FAILED" in line or "OVER" in line else None, markup=False)


def markdown(results: dict) -> str:
    b = results["memory_bound"]
    lines = [f"Command: `{results['command']}`  ",
             f"Started {results['started_at']}, {results.get('wall_s', 0):.0f} s wall; machine: "
             f"{results['machine']['cpus']} CPUs, {results['machine']['platform']}, load average at start "
             f"{', '.join(f'{x:.2f}' for x in results['machine']['load_average_at_start'])}.", "",
             f"Server: `{results['server']['command']}`", "",
             "Memory bound (MiB): " + ", ".join(f"{k} {v / MiB:.0f}" for k, v in b.items()), "",
             "| " + " | ".join(PHASE_COLUMNS) + " |", "|" + "---|" * len(PHASE_COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in phase_rows(results)]
    lines += ["", "| " + " | ".join(CASE_COLUMNS) + " |", "|" + "---|" * len(CASE_COLUMNS)]
    lines += ["| " + " | ".join(x.replace("|", "\\|") for x in r) + " |" for r in case_rows(results)]
    lines += [""] + [f"- {line}" for line in verdict_lines(results)]
    return "\n".join(lines) + "\n"


def write_rss_plot(results: dict, out: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = results.get("rss_series") or []
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(10, 4.5))
    t = [s[0] for s in series]
    ax.plot(t, [s[1] / MiB for s in series], linewidth=1, label="server process RSS")
    ax.plot(t, [s[2] / MiB for s in series], linewidth=0.8, linestyle=":", color="grey",
            label="process tree with the Spark JVM (not what the bound is about)")
    ax.axhline(results["rss"]["bound"] / MiB, color="red", linestyle="--", linewidth=1,
               label=f"bound {results['rss']['bound'] / MiB:.0f} MiB")
    band = results["rss"].get("band_after_warm_up")
    if band:
        end = results["marks"].get("hostile_end", t[-1])
        ax.fill_between([band["warm_up_end_s"], end], band["low"] / MiB, band["high"] / MiB, color="green",
                        alpha=0.12, label=f"+-{100 * RSS_BAND:.0f} % of the median after warm-up")
    marks = results.get("marks") or {}
    for name, colour in (("clean", "tab:blue"), ("hostile", "tab:orange")):
        if f"{name}_start" in marks and f"{name}_end" in marks:
            ax.axvspan(marks[f"{name}_start"], marks[f"{name}_end"], color=colour, alpha=0.06)
            ax.text(marks[f"{name}_start"], ax.get_ylim()[1] * 0.97, f" {name}", fontsize=8, va="top")
    ax.set(xlabel="seconds since the server was ready", ylabel="RSS (MiB)",
           title="pipeline bench --hostile: server RSS over time")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="center right")
    fig.tight_layout()
    path = out / "rss_over_time.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_latency_plot(results: dict, out: Path, loads: dict[str, dict | None]) -> Path | None:
    """Good producers' latency over (estimated send) time, 1 s p99 windows, clean vs hostile,
    with the hostile phase's bursts and memory-attack rounds shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rate = results["good_producers"]["rate_requests_per_s"]
    series = {k: latency_points(loads.get(k), rate) for k in ("clean", "hostile")}
    if not any(series.values()):
        return None
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for name, colour in (("clean", "tab:blue"), ("hostile", "tab:orange")):
        pts = series[name]
        if not pts:
            continue
        buckets: dict[int, list[float]] = defaultdict(list)
        for t, lat in pts:
            buckets[int(t)].append(lat)
        xs = sorted(buckets)
        ax.plot(xs, [_percentile(buckets[x], 99) for x in xs], color=colour, linewidth=1, label=f"{name}: p99 per s")
        ax.plot(xs, [_percentile(buckets[x], 50) for x in xs], color=colour, linewidth=0.6, linestyle=":",
                label=f"{name}: p50 per s")
    analysis = (results.get("checks") or {}).get("latency_analysis") or {}
    for i, (a, b) in enumerate(analysis.get("burst_spans_s", [])):
        ax.axvspan(a, b, color="red", alpha=0.12, label="hostile: connection burst" if i == 0 else None)
    for i, (a, b) in enumerate(analysis.get("memory_round_spans_s", [])):
        ax.axvspan(a, b, color="purple", alpha=0.06, label="hostile: memory-attack round" if i == 0 else None)
    ax.set(yscale="log", xlabel="seconds into the phase (estimated send time)", ylabel="latency (ms)",
           title=f"good producers ({rate:g} req/s, acks=-1): clean vs beside the hostile clients")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "latency_over_time.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _redraw(argv: list[str] | None = None) -> int:
    """Redraw from an earlier run: ``python -m pipeline.bench.hostile_runner DIR``."""
    from rich.console import Console

    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "bench-results/hostile")
    results = json.loads((out / "results.json").read_text())
    write_rss_plot(results, out)
    loads = {}
    for name in ("clean", "hostile"):
        path = out / "runs" / f"{name}.result.json"
        loads[name] = json.loads(path.read_text()) if path.exists() else None
    executions_path = out / "runs" / "executions.json"
    if loads["hostile"] and executions_path.exists() and "hostile_start" in results.get("marks", {}):
        executions = json.loads(executions_path.read_text())
        if results.get("wall_clock_at_0"):
            phase_wall0 = results["wall_clock_at_0"] + results["marks"]["hostile_start"]
        elif executions:
            # results.json of a run before wall_clock_at_0 was recorded: the phase
            # began when the hostile clients' process was started, about
            # DRIVER_STARTUP_S before its first execution.
            phase_wall0 = min(ex["t0"] for ex in executions) - DRIVER_STARTUP_S
            results["checks"]["latency_analysis_note"] = (
                f"phase start estimated as the first hostile execution - {DRIVER_STARTUP_S:g} s (+-1 s)")
        else:
            phase_wall0 = None
        if phase_wall0 is not None:
            results["checks"]["latency_analysis"] = analyse_latency(
                loads["hostile"], executions, phase_wall0, results["good_producers"]["rate_requests_per_s"])
            (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    write_latency_plot(results, out, loads)
    (out / "summary.md").write_text(markdown(results))
    print_report(results, Console())
    return 0


if __name__ == "__main__":
    sys.exit(_redraw())
