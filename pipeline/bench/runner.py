"""``pipeline bench``: start servers, drive them, verify, report.

Each configuration (baseline; multiqueue for each queue count; the
shared-unmuted ablation) gets its own ``pipeline serve`` subprocess with a
fresh data directory, so runs of different configurations share nothing. All
servers (and the Spark session the runner verifies with) start at once, since
Spark start-up dominates a short benchmark; an idle server costs ~1 % of a
core while it waits. Then, one configuration at a time: a short warm-up (a
fresh server's first Spark writes take seconds), every load shape on its own
topic, SIGTERM (ordered shutdown: everything accepted is flushed; it overlaps
the next configuration's warm-up and is waited for before anything is
measured). Finally each configuration's table is read with Spark and every
run verified. The echo framing ceiling (``pipeline.bench.echo``) is measured
first with the same shapes; the echo server stays up, and on each multiqueue
server every acks=0 shape runs ``acks0_pairs`` times, each right after an echo
run of the same (C, K) that its fraction of the ceiling is taken against. When the plan sizes the headline comparison by
requests (``BenchOptions.headline``), its C=1, K=5, acks=-1 runs come right
after the ceiling, on every baseline and multiqueue server at once (warmed up
there), repeat by repeat across the models (``_headline``).

While a load runs, a sampler thread reads the server's process tree with
psutil (CPU time of the Python process *and* its Spark JVM and helper
processes, peak RSS) and scrapes ``/metrics`` every 200 ms for per-queue
depth. The load generator (``pipeline.bench.loadgen``) is a separate process;
it signals READY and waits, so CPU is measured over exactly the load window.

Output in ``--out``: ``results.json`` (every figure and the exact
configuration), PNG plots, ``summary.md``, and per-server logs.

Last, unless the plan has no broker counts, the brokers phase
(``pipeline.bench.brokers_bench.run_phase``: ``pipeline serve --brokers N`` for
each N, librdkafka producers at default settings, 1 KiB records): its rows go
into the same ``results.json`` under ``"brokers"``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

import psutil

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

from pipeline.bench import verify
from pipeline.bench.frames import parse_record_key
from pipeline.bench.loadgen import LoadSpec, split_requests
from pipeline.bench.options import HEADLINE_MAX_S, HEADLINE_SHAPE, BenchOptions
from pipeline.bench.processes import (ManagedProcess, Sampler, counter,
                                      machine, scrape_metrics)

LOAD_GRACE_S = 240.0
"""A load generator may run this much longer than its duration bound (set-up,
pre-build, draining slow flushes) before it is killed and the run failed."""


# ------------------------------------------------------------------ the plan


@dataclass(slots=True)
class ServerConfiguration:
    """One server to start: a mode and its size."""

    name: str
    mode: str
    queues: int | None = None
    io_threads: int | None = None

    def serve_args(self, opts: BenchOptions) -> list[str]:
        # No compaction (the bench measures the request path, and its verifier
        # reads the files of several data directories without their catalogs);
        # no Spark Connect endpoint (the servers start at once and would
        # share its port).
        args = ["--mode", self.mode, "--num-partitions", str(opts.partitions),
                "--linger-ms", str(opts.linger_ms), "--ack-on", opts.ack_on, "--metrics-port", "0",
                "--table-compaction-interval-ms", "0", "--spark-connect-port", "0"]
        if self.queues is not None:
            args += ["--queues", str(self.queues)]
        if self.io_threads is not None:
            args += ["--io-threads", str(self.io_threads)]
        return args + list(opts.server_args)


def configurations(opts: BenchOptions) -> list[ServerConfiguration]:
    out = []
    for name in opts.configs:
        if name == "multiqueue":
            out += [ServerConfiguration(f"multiqueue-q{q}", "multiqueue", queues=q) for q in opts.queues]
        else:
            out.append(ServerConfiguration(name, name, io_threads=opts.io_threads))
    return out


def shape_key(c: int, k: int) -> str:
    return f"C={c},K={k}"


# ------------------------------------------------------------------- running


@dataclass(slots=True)
class RunOutcome:
    """A finished load run: the generator's result plus the sampler's window."""

    name: str
    topic: str
    shape: dict
    load: dict | None = None
    server: dict = field(default_factory=dict)
    client_cpu_s: float | None = None
    error: str | None = None


class LoadWindow(Protocol):
    """What ``run_load`` tells of the load window it runs (``processes.Sampler``, a phase marker)."""

    def begin(self) -> None:
        """The load starts now (its connections are up)."""

    def end(self) -> dict:
        """The load ended; returns the window's server figures (``RunOutcome.server``)."""


def run_load(spec: LoadSpec, workdir: Path, name: str, sampler: LoadWindow | None) -> RunOutcome:
    """Run one load generator subprocess to completion (bounded by its spec + LOAD_GRACE_S)."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, result_path = workdir / f"{name}.spec.json", workdir / f"{name}.result.json"
    spec_path.write_text(json.dumps(asdict(spec), indent=1))
    result_path.unlink(missing_ok=True)
    outcome = RunOutcome(name, spec.topic, {
        "connections": spec.connections, "in_flight": spec.in_flight, "acks": spec.acks,
        "records_per_request": spec.records, "record_bytes": spec.record_bytes,
        "partitions": spec.partitions, "max_requests": spec.max_requests,
        "duration_s": spec.duration_s, "client": spec.client, "protocol": spec.protocol})
    with open(workdir / f"{name}.loadgen.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pipeline.bench.loadgen", str(spec_path), str(result_path),
                                 "--handshake"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        killer = threading.Timer(spec.duration_s + spec.drain_timeout_s + LOAD_GRACE_S, proc.kill)
        killer.start()
        cpu = None
        try:
            assert proc.stdout is not None
            assert proc.stdin is not None
            for line in proc.stdout:
                if line.strip() == "READY":
                    if sampler is not None:
                        sampler.begin()
                    proc.stdin.write("GO\n")
                    proc.stdin.close()
                elif line.strip() == "END":
                    if sampler is not None:
                        outcome.server = sampler.end()
                    try:
                        t = psutil.Process(proc.pid).cpu_times()
                        cpu = t.user + t.system
                    except psutil.Error:
                        pass
            rc = proc.wait()
        finally:
            killer.cancel()
    outcome.client_cpu_s = cpu
    if rc != 0 or not result_path.exists():
        tail = (workdir / f"{name}.loadgen.log").read_text(errors="replace")[-3000:]
        outcome.error = f"load generator exited with {rc}:\n{tail}"
        return outcome
    outcome.load = json.loads(result_path.read_text())
    return outcome


def figures(outcome: RunOutcome, ceiling_rps: float | None) -> dict:
    """Throughput, latency and resource figures of a run (units in the key names)."""
    from hdrh.histogram import HdrHistogram

    load = outcome.load or {}
    if not load:
        return {}
    spec = load["spec"]
    elapsed = load["elapsed_s"]
    acked = spec["protocol"] == "echo" or spec["acks"] != 0
    requests = load["completed"] if acked else load["sent"]
    per_unit = spec["records"] if spec["client"] == "raw" else 1
    records = requests * per_unit
    if spec["client"] == "confluent":
        # Units are records; librdkafka chose the requests: take them from the server.
        server_requests = (outcome.server.get("counters") or {}).get("produce_requests")
        requests = server_requests if server_requests is not None else None
    request_bytes = load.get("request_bytes")
    out = {
        "elapsed_s": elapsed,
        "requests": requests,
        "records": records,
        "requests_per_s": None if requests is None else requests / elapsed,
        "records_per_s": records / elapsed,
        "mb_per_s": (requests * request_bytes / elapsed / 1e6) if request_bytes and requests else
                    records * spec["record_bytes"] / elapsed / 1e6,
        "request_bytes": request_bytes,
        "stopped_by": load["stopped_by"],
        "timed_out": load["timed_out"],
        "prebuilt_requests": load.get("prebuilt_requests"),
        "prebuild_capped": load.get("prebuild_capped"),
        "latency_ms": None,
        "client_cpu_s": load.get("client_cpu_s"),
        "client_process_cpu_s": outcome.client_cpu_s,
    }
    if load.get("latency_hdr"):
        h = HdrHistogram.decode(load["latency_hdr"])
        out["latency_ms"] = {
            "count": h.get_total_count(),
            **{f"p{p:g}": h.get_value_at_percentile(p) / 1000 for p in (50, 90, 99, 99.9)},
            "max": h.get_max_value() / 1000,
            "mean": h.get_mean_value() / 1000,
        }
    srv = outcome.server or {}
    if srv:
        out["server_cpu_s"] = srv["server_cpu_s"]
        out["server_cpu_cores"] = srv["server_cpu_s"] / max(1e-9, srv["window_s"])
        # CPU seconds of the server process tree (JVM included) per million records of the run
        out["server_cpu_s_per_m_records"] = srv["server_cpu_s"] / records * 1e6 if records else None
        out["peak_rss_mb"] = srv["peak_rss_bytes"] / 2**20
        out["queue_depth_max"] = srv["queue_depth"]["max"]
        out["queue_depth_mean"] = srv["queue_depth"]["mean"]
        out["server_counters"] = srv["counters"]
    if ceiling_rps and out["requests_per_s"]:
        out["fraction_of_ceiling"] = out["requests_per_s"] / ceiling_rps
    return out


def verify_run(outcome: RunOutcome, rows: list | None) -> verify.RunVerification:
    """(a), (b) from the responses, (c) against ``rows`` (None: table not read)."""
    load = outcome.load or {}
    spec = load.get("spec", {})
    acked = spec.get("acks", -1) != 0
    arrivals: dict[int, list[int]] = {}
    sent: dict[int, int] = {}
    responses: list[verify.Response] = []
    expected: list[verify.ExpectedRequest] = []
    for conn in load.get("connections", []):
        c, partition, per = conn["conn"], conn["partition"], conn["records_per_request"]
        sent[c] = conn["sent"]
        arrivals[c] = [r[0] for r in conn["responses"]]
        if acked:
            responses += [verify.Response(c, r[0], partition, r[2], per, r[3]) for r in conn["responses"]]
        else:
            expected += [verify.ExpectedRequest(c, req, partition, per) for req in range(conn["sent"])]
    if acked:
        order = verify.response_order(arrivals, sent)
        offsets = verify.offset_order(responses)
        expected = verify.expected_from_responses(responses)
    else:
        order, offsets = verify.ResponseOrderReport(), verify.OffsetOrderReport()
    table = verify.check_table(expected, rows) if rows is not None else None
    return verify.RunVerification(order, offsets, table)


def read_topic_rows(spark: SparkSession, data_dir: Path, topics: list[str]) -> dict[str, list[tuple]]:
    """Stored rows of each of ``topics`` as (partition, offset, record name), read
    from the table's files (the benchmark's servers never compact, ``serve_args``)
    one Spark job per topic, so that the verifier's driver holds one run's rows at
    a time (an acks=0 run at ~55k requests/s leaves ~1.4 M; all runs of a
    server at once overflowed its 1 GiB heap); the name is None for a foreign key."""
    from pyspark.sql import functions as F

    from pipeline.table.catalog import read_uncompacted_files

    files = read_uncompacted_files(spark, data_dir)
    rows: dict[str, list[tuple]] = {}
    for topic in topics:
        table = files.where(F.col("topic") == topic).select("partition", "offset", "key").toArrow()
        stored = rows[topic] = []
        for p, o, k in zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(),
                           table.column("key").to_pylist()):
            try:
                name = parse_record_key(k)
            except ValueError:
                name = None
            stored.append((p, o, name))
    return rows


# ----------------------------------------------------------------------- main


def _request_bound(opts: BenchOptions, ceiling: dict[str, float], c: int, k: int, acks: int) -> int:
    """Requests to pre-build for one run: ``--requests``, lowered to three times
    what the echo ceiling took in ``--duration`` at the same (C, K): no server
    doing real work gets near it, and pre-building (3 us and 1 KiB a request)
    should not dwarf runs that complete a few thousand requests."""
    rps = ceiling.get(shape_key(c, k))
    if rps is None:
        return opts.requests
    return max(c * k * 4, min(opts.requests, int(rps * opts.duration * 3)))


WARMUP_SHAPE = (4, 5, -1)
"""(C, K, acks) of each server's warm-up load: a fresh server's first Spark
writes take seconds (JIT, directory creation), which no run should measure."""
WARMUP_S = 1.5


TABLE_WAIT_S = 60.0
"""Bound on the wait, before each paired acks=0 run, for the server's table side to take what
the previous one left (``_wait_for_table``)."""


def _wait_for_table(server: ManagedProcess, timeout_s: float = TABLE_WAIT_S) -> float | None:
    """Wait until the server holds no record for the table (``pipeline_buffered_records`` 0:
    none waiting for or in a WAL write or a Spark flush), polled every 100 ms; returns the
    seconds waited, None if the metrics cannot be read or the bound passed first. So that each
    paired run starts as the first does, never sharing the cores with the flushes of the
    previous run's ~1.4 M records (at quick size the table side keeps up: ~0.01 s waited)."""
    if server.metrics_port is None:
        return None
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            buffered = counter(scrape_metrics(server.metrics_port), "pipeline_buffered_records")
        except OSError:
            return None
        if buffered == 0:
            return time.monotonic() - started
        time.sleep(0.1)
    return None


def _warm_up(config: ServerConfiguration, server: ManagedProcess, opts: BenchOptions, out: Path) -> dict:
    """The server's warm-up load (``WARMUP_SHAPE`` for ``WARMUP_S``); its entry for results.json."""
    c, k, acks = WARMUP_SHAPE
    warm = run_load(LoadSpec("127.0.0.1", server.port, topic="bench-warmup", connections=c, in_flight=k, acks=acks,
                             records=opts.records, record_bytes=opts.record_bytes, partitions=opts.partitions,
                             max_requests=opts.requests, duration_s=min(WARMUP_S, opts.duration)),
                    out / "runs", f"{config.name}-warmup", None)
    return {"figures": figures(warm, None), "error": warm.error}


def _headline(opts: BenchOptions, out: Path, ready: list[tuple[ServerConfiguration, ManagedProcess]],
              step: Callable[..., None]) -> dict[str, list[RunOutcome]]:
    """The headline comparison (``HEADLINE_SHAPE``) on the ``ready`` (warmed-up) servers: repeat r
    runs once on every server in turn (so each repeat sees every model under the same machine
    load), each run bounded by its share of ``opts.headline_requests`` and ``HEADLINE_MAX_S``.
    ``step(description)`` tells progress, ``step(advance=1)`` ends a repeat. Returns the outcomes
    by configuration name, repeat order; each shape carries ``repeat``."""
    c, k, acks = HEADLINE_SHAPE
    outcomes: dict[str, list[RunOutcome]] = {config.name: [] for config, _ in ready}
    samplers = {config.name: Sampler(server.pid, server.metrics_port) for config, server in ready}
    try:
        for r, n in enumerate(split_requests(opts.headline_requests, opts.headline_repeats)):
            for config, server in ready:
                step(f"{config.name}: C={c} K={k} acks={acks}, repeat {r + 1}/{opts.headline_repeats} "
                     f"({n} requests)")
                topic = f"bench-headline-r{r}-c{c}-k{k}-acks{'m1' if acks == -1 else acks}"
                spec = LoadSpec("127.0.0.1", server.port, protocol="kafka", client=opts.client, topic=topic,
                                connections=c, in_flight=k, records=opts.records, record_bytes=opts.record_bytes,
                                partitions=opts.partitions, acks=acks, max_requests=n, duration_s=HEADLINE_MAX_S)
                o = run_load(spec, out / "runs", f"{config.name}-{topic}", samplers[config.name])
                o.shape["repeat"] = r
                outcomes[config.name].append(o)
            step(advance=1)
    finally:
        for sampler in samplers.values():
            sampler.close()
    return outcomes


def _server_command(config: ServerConfiguration, opts: BenchOptions, data_dir: Path) -> list[str]:
    return [sys.executable, "-m", "pipeline.cli", "serve", "--listen", "127.0.0.1:0",
            "--data-dir", str(data_dir), *config.serve_args(opts)]


def _ceiling_run(opts: BenchOptions, out: Path, echo: ManagedProcess, sampler: LoadWindow, c: int, k: int,
                 name: str) -> tuple[RunOutcome, dict, dict]:
    """One (C, K) load against the echo server: (outcome, figures, its entry for results.json)."""
    spec = LoadSpec("127.0.0.1", echo.port, protocol="echo", client="raw", topic="echo",
                    connections=c, in_flight=k, records=opts.records, record_bytes=opts.record_bytes,
                    partitions=opts.partitions, acks=-1, max_requests=opts.requests, duration_s=opts.duration)
    o = run_load(spec, out / "runs", name, sampler)
    f = figures(o, None)
    v = verify_run(o, None) if o.load else None
    return o, f, {"shape": o.shape, "figures": f, "error": o.error,
                  "response_order_violations": v.response_order.violations if v else None}


def _measure_ceiling(opts: BenchOptions, out: Path, echo: ManagedProcess, sampler: LoadWindow,
                     shapes: list[tuple[int, int]], results: dict, on_step: Callable[[str], None]) -> dict[str, float]:
    """Run every (C, K) against the echo server; returns {shape_key: requests/s}."""
    ceiling: dict[str, float] = {}
    for c, k in shapes:
        on_step(f"ceiling (trio frame echo): C={c} K={k}")
        o, f, entry = _ceiling_run(opts, out, echo, sampler, c, k, f"ceiling-c{c}-k{k}")
        if f.get("requests_per_s") and not o.error:
            ceiling[shape_key(c, k)] = f["requests_per_s"]
        results["ceiling"]["runs"].append(entry)
    return ceiling


def _judge(config: ServerConfiguration, entry: dict, o: RunOutcome, rows: list | None, table_error: str | None,
           ceiling: dict[str, float]) -> dict:
    """The run's entry for results.json: figures, verification, status and why."""
    paired = o.shape.get("pair_ceiling_requests_per_s")
    f = figures(o, paired if paired is not None else ceiling.get(shape_key(o.shape["connections"],
                                                                         o.shape["in_flight"])))
    v = verify_run(o, rows) if o.load is not None else None
    reasons = []
    if o.error:
        reasons.append(o.error.splitlines()[0])
    if table_error:
        reasons.append(f"table not read: {table_error}")
    if v is not None and v.violations:
        reasons.append(f"{v.violations} violation(s)")
    if v is not None and v.offset_order.errors.count:
        reasons.append(f"{v.offset_order.errors.count} error response(s)")
    if f.get("timed_out"):
        reasons.append("responses still outstanding at the drain timeout")
    if not f.get("requests"):
        reasons.append("no request completed")
    if entry.get("exit_code") not in (0, None):
        reasons.append(f"server exited with {entry['exit_code']}")
    return {
        "topic": o.topic, "shape": o.shape, "status": "OK" if not reasons else "FAILED", "reasons": reasons,
        "figures": f, "verification": v.to_json() if v is not None else None,
        "ordering_violations": v.ordering_violations if v is not None else None,
        "queue_depth_series": (o.server.get("queue_depth") or {}).get("series"),
        "timeline": (o.load or {}).get("timeline"),
        "timeline_ms": (o.load or {}).get("timeline_ms"),
        "error": o.error,
    }


def prepare_out(out: Path) -> Path:
    """``out`` resolved, with the previous run's data/, runs/ and logs/ removed and runs/, logs/ made."""
    out = out.resolve()
    for stale in ("data", "runs", "logs"):
        shutil.rmtree(out / stale, ignore_errors=True)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    return out


def main(opts: BenchOptions) -> int:
    """Run the plan; returns the exit code (1 if a baseline/multiqueue run or a brokers phase N failed)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from pipeline.bench import report

    console = Console(stderr=True)
    out = prepare_out(opts.out)
    configs = configurations(opts)
    shapes = opts.all_shapes()
    ceiling_shapes = sorted({(c, k) for c, k, _ in shapes})
    results: dict = {
        "command": "pipeline bench " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
        "configurations": [],
        "ceiling": {"server": "pipeline.bench.echo", "runs": []},
    }
    started = time.monotonic()
    total = (len(ceiling_shapes) if opts.ceiling else 0) + len(configs) * (len(shapes) + 3)
    headline = opts.headline()
    if headline:  # the headline shape's runs move to their own phase, one step per repeat
        total += opts.headline_repeats - sum(c.mode != "shared-unmuted" for c in configs)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verifier-spark")
    spark_future: Future | None = None
    ceiling: dict[str, float] = {}
    echo: ManagedProcess | None = None
    echo_sampler: Sampler | None = None
    failed_required = False
    servers = [ManagedProcess(c.name, _server_command(c, opts, out / "data" / c.name),
                              out / "logs" / f"{c.name}.log") for c in configs]

    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=False)
    with progress:
        task = progress.add_task("starting", total=total)

        def step(description: str | None = None, advance: int = 0) -> None:
            if description is not None:
                progress.update(task, description=description)
            if advance:
                progress.advance(task, advance)

        entries: list[dict[str, Any]] = []
        for config, server in zip(configs, servers):
            entries.append({"name": config.name, "mode": config.mode, "queues": config.queues,
                            "io_threads": config.io_threads, "serve_args": config.serve_args(opts),
                            "command": " ".join(["pipeline", *server.cmd[3:]]), "runs": [], "error": None})
        results["configurations"] = entries
        outcomes: dict[str, list[RunOutcome]] = {c.name: [] for c in configs}
        try:
            # Every server (and the verifier's Spark) starts at once: Spark
            # start-up dominates a quick bench and overlaps well on 2 cores.
            # An idle server costs ~1 % of a core; they wait their turn.
            step(f"starting {len(servers)} server(s) and the verifier's Spark in parallel")
            for server in servers:
                server.launch()
            spark_future = executor.submit(verifier_spark)
            for entry, server in zip(entries, servers):
                try:
                    server.wait_ready()
                    entry["startup_s"] = server.startup_s
                    entry["listening_s"] = server.listening_s  # before Spark is up with --ack-on wal
                except RuntimeError as exc:
                    entry["error"] = str(exc)
                step(advance=1)

            if opts.ceiling:
                def ceiling_step(description: str) -> None:
                    step(description)
                    step(advance=1)

                # The echo server stays up (idle: nothing) for the acks=0 runs' paired ceiling runs.
                echo = ManagedProcess("echo", [sys.executable, "-m", "pipeline.bench.echo", "--listen", "127.0.0.1:0"],
                                      out / "logs" / "echo.log").start()
                echo_sampler = Sampler(echo.pid, None)
                ceiling = _measure_ceiling(opts, out, echo, echo_sampler, ceiling_shapes, results, ceiling_step)

            # The headline comparison first, on every baseline and multiqueue server at once
            # (warmed up here, not again below), its repeats interleaved between the models.
            warmed: set[str] = set()
            if headline:
                ready = []
                for config, server, entry in zip(configs, servers, entries):
                    if config.mode != "shared-unmuted" and entry["error"] is None:
                        step(f"{config.name}: warm-up")
                        entry["warmup"] = _warm_up(config, server, opts, out)
                        warmed.add(config.name)
                        ready.append((config, server))

                if ready:
                    for name, runs_done in _headline(opts, out, ready, step).items():
                        outcomes[name] += runs_done

            stopping: tuple[ManagedProcess, dict] | None = None

            def finish_stopping() -> None:
                nonlocal stopping
                if stopping is not None:
                    previous, previous_entry = stopping
                    previous_entry["exit_code"] = previous.stop()
                    previous_entry["server_log_tail"] = (previous.log_tail(1500)
                                                         if previous_entry["exit_code"] != 0 else None)
                    stopping = None

            for config, server, entry in zip(configs, servers, entries):
                if entry["error"] is not None:
                    failed_required |= config.mode != "shared-unmuted"
                    step(advance=len(shapes) + 1)
                    continue
                if config.name not in warmed:
                    step(f"{config.name}: warm-up")
                    entry["warmup"] = _warm_up(config, server, opts, out)
                # The previous server shut down during the warm-up; it must be
                # gone before anything is measured.
                finish_stopping()
                step(advance=1)
                sampler = Sampler(server.pid, server.metrics_port)
                try:
                    for i, (c, k, acks) in enumerate(shapes):
                        if config.name in warmed and (c, k, acks) == HEADLINE_SHAPE:
                            continue  # run in the headline phase
                        step(f"{config.name}: C={c} K={k} acks={acks}")
                        topic = f"bench-{i:02d}-c{c}-k{k}-acks{'m1' if acks == -1 else acks}"
                        pairs = (opts.acks0_pairs if config.mode == "multiqueue" and echo is not None
                                 and acks == 0 and opts.acks0_paired() else 0)
                        for pair in range(max(pairs, 1)):
                            pair_topic = f"{topic}-pair{pair}" if pairs else topic
                            spec = LoadSpec("127.0.0.1", server.port, protocol="kafka", client=opts.client,
                                            topic=pair_topic, connections=c, in_flight=k, records=opts.records,
                                            record_bytes=opts.record_bytes, partitions=opts.partitions, acks=acks,
                                            max_requests=_request_bound(opts, ceiling, c, k, acks),
                                            duration_s=opts.duration)
                            ceiling_rps = None
                            table_wait_s = None
                            if pairs:
                                assert echo is not None and echo_sampler is not None
                                if pair:
                                    step(f"{config.name}: C={c} K={k} acks={acks}, pair {pair + 1}/{pairs}: "
                                         "waiting for the table side")
                                    table_wait_s = _wait_for_table(server)
                                step(f"{config.name}: C={c} K={k} acks={acks}, pair {pair + 1}/{pairs}: ceiling")
                                echo_run, echo_figures, echo_entry = _ceiling_run(
                                    opts, out, echo, echo_sampler, c, k, f"ceiling-c{c}-k{k}-{config.name}-pair{pair}")
                                echo_entry["shape"]["pair"] = pair
                                echo_entry["paired_with"] = config.name
                                results["ceiling"]["runs"].append(echo_entry)
                                ceiling_rps = echo_figures.get("requests_per_s") if not echo_run.error else None
                                step(f"{config.name}: C={c} K={k} acks={acks}, pair {pair + 1}/{pairs}")
                            o = run_load(spec, out / "runs", f"{config.name}-{pair_topic}", sampler)
                            if pairs:
                                o.shape["pair"] = pair
                                o.shape["pair_ceiling_requests_per_s"] = ceiling_rps
                                o.shape["table_wait_s"] = table_wait_s
                            outcomes[config.name].append(o)
                        step(advance=1)
                        if server.proc is not None and server.proc.poll() is not None:
                            break
                finally:
                    sampler.close()
                    server.terminate()  # ordered shutdown, overlapping the next warm-up
                    stopping = (server, entry)
            step("stopping the last server (flushes everything)")
            finish_stopping()
        finally:
            for server in servers:  # only if we are leaving early
                if server.proc is not None and server.proc.poll() is None:
                    server.kill()
            if echo_sampler is not None:
                echo_sampler.close()
            if echo is not None:
                echo.stop()

        step("verifying the tables")
        spark = None
        try:
            spark = spark_future.result() if spark_future is not None else None
        except Exception as exc:  # noqa: BLE001 - reported per configuration
            for entry in entries:
                entry["error"] = entry["error"] or f"verifier Spark failed to start: {exc}"
        for config, entry in zip(configs, entries):
            step(f"{config.name}: verifying the table")
            stored, table_error = None, None
            if spark is not None and outcomes[config.name]:
                try:
                    stored = read_topic_rows(spark, out / "data" / config.name,
                                             [o.topic for o in outcomes[config.name]])
                except Exception as exc:  # noqa: BLE001
                    table_error = f"{type(exc).__name__}: {exc}"[:500]
            for o in outcomes[config.name]:
                rows = stored.get(o.topic) if stored is not None and o.load is not None else None
                run = _judge(config, entry, o, rows, table_error, ceiling)
                failed_required |= run["status"] != "OK" and config.mode != "shared-unmuted"
                entry["runs"].append(run)
            step(advance=1)
        step(f"done in {time.monotonic() - started:.0f} s")

    if spark_future is not None:
        try:
            spark_future.result().stop()
        except Exception:  # noqa: BLE001 - already reported
            pass
    executor.shutdown(wait=False)
    plan = opts.brokers_plan()
    if plan is not None:
        from pipeline.bench.brokers_bench import run_phase

        console.print(f"brokers phase: N = {', '.join(map(str, plan.brokers))}, {plan.producers} librdkafka "
                      f"producers, {plan.records:,} records of {plan.record_bytes} B per N, --ack-on wal")
        results["brokers_options"] = asdict(plan)
        results["brokers"] = run_phase(plan, out / "data", out / "logs", console.print)
        failed_required |= not all(row["ok"] for row in results["brokers"])
    results["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    results["wall_s"] = time.monotonic() - started
    results["ceiling"]["requests_per_s"] = ceiling
    results["headline"] = report.headline_summary(results)
    results["targets"] = report.evaluate_targets(results)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    report.write_plots(results, out)
    (out / "summary.md").write_text(report.markdown(results))
    wide = Console(width=None if Console().is_terminal else 200)
    report.print_report(results, wide)
    wide.print(f"results: {out / 'results.json'}; plots and summary.md in {out}")
    return 1 if failed_required else 0


def verifier_spark() -> SparkSession:
    from pipeline.persist.spark_sink import build_spark_session

    return build_spark_session("local[2]", app_name="pipeline-bench-verify")
