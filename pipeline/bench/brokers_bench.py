"""Throughput, latency, CPU and memory of ``pipeline serve --brokers N`` for several N (issue 13's shape).

    pipeline bench --quick                      # the model runs, then this phase for N = 1, 2
    pipeline bench --brokers 1,2                # this phase alone (results in bench-results/brokers)
    python -m pipeline.bench.brokers_bench --brokers 1,2 --producers 4 --records 100000

For each N: a fresh data directory and Spark Connect server, ``pipeline serve
--brokers N --ack-on wal --spark-remote ...`` (N = 1 is the plain server,
writing through Connect as well, so only the number of brokers differs), one
topic of ``partitions`` partitions per producer (the partitions' leaders
spread over the brokers), a warm-up of 5,000 records, then ``producers``
confluent-kafka (librdkafka) producer processes at *default settings*
(``acks=all``, no linger or batch overrides; a full local queue is waited out
by polling, ``BufferError``) writing ``records`` values of ``record_bytes``
(1 KiB) in all, as fast as acknowledged, released together by a barrier once
every producer exists. The producing loop is ``pipeline.bench.security_bench.produce``.

Reported per N (``phase_row``):

* records/s and MB/s (value + key bytes, 10^6 bytes) of acknowledged records
  over the load window, the first ``produce()`` of any producer to the last
  acknowledgement of any;
* p50/p99/p99.9/max of ``produce()`` -> acknowledgement (librdkafka's
  ``Message.latency()``), in ms, every producer's histogram merged (``hdrh``);
* CPU seconds (user + system) of the broker process tree (the supervisor, the
  brokers and their decode workers) over the window, per broker and per
  million records acknowledged, and its peak RSS (sampled every 200 ms by
  ``pipeline.bench.processes.Sampler``); the Spark Connect server's JVM the
  same, listed apart (it is shared and not part of the brokers);
* undelivered records (sent but not acknowledged by the phase's timeout) and
  delivery errors; every acknowledged offset is checked (per partition of a
  fresh topic exactly 0..n-1). A row with undelivered records or errors fails
  the bench (exit status 1).

Buffering: with ``--ack-on wal`` a produce is acknowledged once in the WAL and
the Spark table catches up behind it within ``buffer.memory`` (256 MiB per
broker). Before the load the bench waits until every broker's persister is
empty (``pipeline_buffered_bytes`` 0 on each /metrics, after the warm-up), and
the default phase sizes (quick 100,000 x 1 KiB, full 200,000 x 1 KiB, in all
brokers together) fit in one broker's buffer, so the window measures the front
end and the WAL, not how fast Spark drains a backlog. A larger ``records``
than fits measures the drain too.

The figures mean something only on a machine with at least N + 1 idle cores
(the producers and the Connect server's JVM need theirs); the report says so.
Every wait is bounded (``timeout_s`` per phase, 600 s per start-up); the
servers are stopped (SIGTERM, killed after 300 s) however the phase ends.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pipeline.bench.options import BROKERS_CLIENTS as CLIENTS, BrokersBenchOptions
from pipeline.bench.processes import broker_pids, start_brokers, stop_brokers

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier

TOPIC = "bench-brokers"
KCAT_DOC = """kcat producers: ``kcat -P -b BOOTSTRAP -t TOPIC -l FILE``, one process per producer, each
sending every line of its own file (``record_bytes`` printable random bytes each, no key) at
librdkafka's defaults. The same library as confluent-kafka's, without a Python call and a
Python delivery callback per record (~10 us of client CPU per record, which on 2 cores
takes a core from the brokers at ~100k records/s). Window: the processes' start to the
last one's exit (kcat exits once every record is acknowledged or failed); acknowledged:
the topics' high watermarks; no per-record latency."""
WARMUP_RECORDS = 5000
HISTOGRAM_MAX_US = 600_000_000


# ------------------------------------------------------------------- producers


def _producer(bootstrap: str, topic: str, records: int, record_bytes: int, timeout_s: float, ready: Barrier,
              start: Barrier, out: Queue[dict]) -> None:
    """One producer process: ``security_bench.produce`` at librdkafka's defaults; once set up it waits
    at ``ready`` (all producers set up), then at ``start`` (the parent's CPU readings are taken), then
    produces. Puts its figures (or ``{"error": text}``) on ``out``."""
    from pipeline.bench.security_bench import produce

    def go() -> None:
        ready.wait(120)
        start.wait(120)

    try:
        figures = produce({"bootstrap.servers": bootstrap}, topic, records, record_bytes, timeout_s, go=go)
        figures["acked"] = {str(p): n for p, n in figures["acked"].items()}
        out.put(figures)
    except Exception as exc:  # noqa: BLE001 - reported in the row
        out.put({"error": f"{type(exc).__name__}: {exc}"})


def kcat_input(path: Path, records: int, record_bytes: int) -> Path:
    """Write ``records`` lines of ``record_bytes`` printable random bytes (+ newline) to ``path``."""
    import base64

    with open(path, "wb") as f:
        for start in range(0, records, 1000):
            n = min(1000, records - start)
            raw = base64.b64encode(os.urandom(record_bytes * n))
            f.write(b"".join(raw[i * record_bytes:(i + 1) * record_bytes] + b"\n" for i in range(n)))
    return path


def kcat_produce(bootstrap: str, topics: list[str], inputs: list[Path], records: int, record_bytes: int,
                 timeout_s: float) -> list[dict]:
    """Run one kcat producer per topic (``KCAT_DOC``); returns figures shaped like
    ``security_bench.produce``'s (``records``, ``bytes``, ``key_bytes``, ``t_start``/``t_last_ack`` on
    ``time.perf_counter``, ``errors``), one per producer. Acknowledged records are read from
    the high watermarks (fresh topics: the watermark is the count)."""
    from confluent_kafka import Consumer, TopicPartition

    started = time.perf_counter()
    procs = [subprocess.Popen(["kcat", "-P", "-b", bootstrap, "-t", t, "-l", str(f)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for t, f in zip(topics, inputs)]
    figures = []
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-brokers-watermarks",
                         "enable.auto.commit": False})
    try:
        ends = []
        for proc in procs:
            try:
                _, err = proc.communicate(timeout=max(1.0, started + timeout_s - time.perf_counter()))
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            ends.append((time.perf_counter(), err))
        for topic, proc, (ended, err) in zip(topics, procs, ends):
            meta = consumer.list_topics(topic, timeout=30).topics[topic].partitions
            acked = sum(consumer.get_watermark_offsets(TopicPartition(topic, p), 30)[1] for p in meta)
            errors = [line for line in err.decode(errors="replace").splitlines() if "ERROR" in line or "fail" in line]
            if proc.returncode:
                errors.append(f"kcat exited with status {proc.returncode}")
            figures.append({"records": acked, "bytes": acked * record_bytes, "key_bytes": 0, "t_start": started,
                            "t_last_ack": ended, "errors": errors[:10], "latency_hdr": None})
    finally:
        consumer.close()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return figures


def merge_latency(figures: list[dict]) -> dict[str, float]:
    """p50/p99/p99.9/max (ms) of the producers' ``latency_hdr`` histograms together; {} if none."""
    from hdrh.histogram import HdrHistogram

    merged = HdrHistogram(1, HISTOGRAM_MAX_US, 3)
    for f in figures:
        if f.get("latency_hdr"):
            merged.add(HdrHistogram.decode(f["latency_hdr"]))
    if merged.get_total_count() == 0:
        return {}
    return {name: merged.get_value_at_percentile(q) / 1000 for name, q in
            (("p50", 50), ("p99", 99), ("p99.9", 99.9))} | {"max": merged.get_max_value() / 1000}


def phase_row(n: int, opts: BrokersBenchOptions, figures: list[dict], sent: int, broker: dict, broker_cpu: list[float],
              connect: dict) -> dict:
    """The per-N entry of results.json from the producers' figures and the samplers' windows.

    ``broker``/``connect``: ``runner.Sampler.end()`` of the broker tree / the Connect JVM
    (``server_cpu_s``, ``peak_rss_bytes``). Pure.
    """
    done = [f for f in figures if "error" not in f]
    acked = sum(f["records"] for f in done)
    window = (max(f["t_last_ack"] for f in done) - min(f["t_start"] for f in done)) if done else 0.0
    nbytes = sum(f["bytes"] + f["key_bytes"] for f in done)
    errors = [f["error"] for f in figures if "error" in f] + [e for f in done for e in f["errors"]]
    cpu = broker.get("server_cpu_s")
    return {
        "brokers": n, "producers": opts.producers, "client": opts.client, "record_bytes": opts.record_bytes,
        "records_sent": sent, "records": acked, "undelivered": sent - acked, "errors": errors[:20],
        "seconds": round(window, 3),
        "records_per_s": acked / window if window > 0 else None,
        "mb_per_s": nbytes / window / 1e6 if window > 0 else None,
        "latency_ms": merge_latency(done),
        "broker_cpu_s": [round(c, 2) for c in broker_cpu],
        "broker_tree_cpu_s": cpu,
        "cpu_s_per_m_records": cpu / acked * 1e6 if cpu is not None and acked else None,
        "peak_rss_mb": broker["peak_rss_bytes"] / 2**20 if broker.get("peak_rss_bytes") else None,
        "connect_cpu_s": connect.get("server_cpu_s"),
        "connect_peak_rss_mb": connect["peak_rss_bytes"] / 2**20 if connect.get("peak_rss_bytes") else None,
        "cpus": os.cpu_count(), "load_average": os.getloadavg()[0],
        "ok": not errors and sent == acked and bool(done),
    }


# --------------------------------------------------------------------- servers


def _measured(server_pid: int, n: int, connect_pid: int, load: Callable[[], list[dict]],
              metrics_ports: list[int], timeout_s: float) -> tuple[list[dict], dict, list[float], dict, dict]:
    """Run ``load`` (it returns the producers' figures) while sampling the broker tree and the Connect JVM,
    then wait until every broker's table holds what it acknowledged (``queryable``).

    Returns (figures, broker tree window, CPU s of each broker in it, Connect window, queryable); the
    windows are ``runner.Sampler.end()``'s (``server_cpu_s``, ``peak_rss_bytes``) over the load;
    ``queryable`` is ``_queryable``'s, over the load and the table's catch-up after it.
    """
    from pipeline.bench.processes import Sampler, cpu_since, sample_tree
    from pipeline.bench.security_bench import wait_for_table

    import psutil

    brokers = broker_pids(server_pid, n)
    broker_sampler, connect_sampler = Sampler(server_pid, None), Sampler(connect_pid, None)
    try:
        commits0 = _commit_counters(metrics_ports)
        machine0 = psutil.cpu_times()
        cpu0 = [sample_tree(pid) for pid in brokers]
        broker_sampler.begin()
        connect_sampler.begin()
        figures = load()
        broker_window, connect_window = broker_sampler.end(), connect_sampler.end()
        broker_cpu = [cpu_since(c, sample_tree(pid)) for pid, c in zip(brokers, cpu0)]
        drained = wait_for_table(metrics_ports, timeout_s)
        t_queryable = time.perf_counter()
        tree_cpu = [cpu_since(c, sample_tree(pid)) for pid, c in zip(brokers, cpu0)]
        machine1 = psutil.cpu_times()
        commits1 = _commit_counters(metrics_ports)
    finally:
        broker_sampler.close()
        connect_sampler.close()
    queryable = _queryable(figures, t_queryable if drained is not None else None, tree_cpu, commits0, commits1)
    if queryable:
        idle = (machine1.idle - machine0.idle) + (machine1.iowait - machine0.iowait)
        total = sum(machine1) - sum(machine0)
        queryable["machine_busy_cores"] = (1 - idle / total) * (os.cpu_count() or 1) if total > 0 else None
    return figures, broker_window, broker_cpu, connect_window, queryable


COMMIT_COUNTERS = ("pipeline_table_commit_seconds_total", "pipeline_table_lock_wait_seconds_total",
                   "pipeline_flush_records_total")
"""Each broker's counters read before the load and once its table caught up (``_queryable``)."""


def _commit_counters(metrics_ports: list[int]) -> list[dict[str, float]]:
    """``COMMIT_COUNTERS`` of each broker (one ``/metrics`` port each); a missing one reads 0."""
    from pipeline.bench.processes import counter, scrape_metrics

    out = []
    for port in metrics_ports:
        metrics = scrape_metrics(port)
        out.append({name: counter(metrics, name) or 0.0 for name in COMMIT_COUNTERS})
    return out


def _queryable(figures: list[dict], t_queryable: float | None, tree_cpu: list[float],
               before: list[dict[str, float]], after: list[dict[str, float]]) -> dict:
    """Ingest to queryable (issue 34): from the first ``produce()`` of any producer to the moment every
    broker's table held what it acknowledged (``pipeline_buffered_bytes`` 0 on each, polled every
    0.25 s). ``seconds``, ``records_per_s``, ``mb_per_s`` (value + key bytes); ``broker_cores``: the
    broker trees' CPU seconds (each broker with its decode workers, from the load's start) over the
    window; ``commit_s`` / ``lock_wait_s``: each broker's time holding / waiting for the tables' lock
    in its commits (``pipeline_table_commit_seconds``, ``pipeline_table_lock_wait_seconds``);
    ``commit_overlap``: their commit seconds summed over the window: above 1, commits of different
    brokers overlapped in time for at least (overlap - 1) x the window (two intervals on one line
    cannot sum past it otherwise); ``flush_records``: records each broker committed. Pure; {} when
    the table did not catch up or no producer finished."""
    done = [f for f in figures if "error" not in f]
    if t_queryable is None or not done:
        return {}
    window = t_queryable - min(f["t_start"] for f in done)
    records = sum(f["records"] for f in done)
    nbytes = sum(f["bytes"] + f["key_bytes"] for f in done)
    def delta(name: str) -> list[float]:
        return [a[f"{name}_total"] - b[f"{name}_total"] for a, b in zip(after, before)]

    commit, wait = delta("pipeline_table_commit_seconds"), delta("pipeline_table_lock_wait_seconds")
    flushed = [int(f) for f in delta("pipeline_flush_records")]
    return {"seconds": round(window, 3), "records_per_s": records / window, "mb_per_s": nbytes / window / 1e6,
            "broker_cores": sum(tree_cpu) / window, "broker_cpu_s": [round(c, 2) for c in tree_cpu],
            "commit_s": [round(c, 3) for c in commit], "lock_wait_s": [round(w, 3) for w in wait],
            "commit_overlap": sum(commit) / window, "flush_records": flushed}


def run_one(n: int, opts: BrokersBenchOptions, data: Path, log_path: Path, say: Callable[[str], None]) -> dict:
    """One N: Connect server, brokers, warm-up, drain, load; returns ``phase_row``.

    Raises RuntimeError if the servers do not start, or an exception of the set-up (topics, warm-up).
    """
    from confluent_kafka.admin import AdminClient, NewTopic

    from pipeline.bench.security_bench import produce, wait_for_table
    from pipeline.persist.spark_cluster import ConnectServer
    from pipeline.table.catalog import catalog_conf

    with ConnectServer(data / "_pipeline" / "spark-connect", conf=catalog_conf(data), timeout_s=600) as connect:
        cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--brokers", str(n), "--listen", "127.0.0.1:0",
               "--data-dir", str(data), "--spark-remote", connect.url, "--ack-on", "wal", "--metrics-port", "0",
               *opts.server_args]
        say(f"brokers N={n}: starting `pipeline {' '.join(cmd[3:])}`")
        proc, addresses, metrics_ports, log = start_brokers(cmd, n, log_path)
        admin = None
        try:
            bootstrap = ",".join(addresses)
            admin = AdminClient({"bootstrap.servers": bootstrap})
            topics = [f"{TOPIC}-warmup"] + [f"{TOPIC}-{i}" for i in range(opts.producers)]
            for f in admin.create_topics([NewTopic(t, opts.partitions, 1) for t in topics]).values():
                f.result(60)
            warm = produce({"bootstrap.servers": bootstrap}, topics[0], WARMUP_RECORDS, opts.record_bytes, 120)
            if warm["timed_out"] or warm["errors"]:
                raise RuntimeError(f"warm-up failed: {warm['errors'][:3]} (timed out: {warm['timed_out']})")
            drained = wait_for_table(metrics_ports, 300)
            say(f"brokers N={n}: {opts.producers} producers x {opts.records // opts.producers:,} records of "
                f"{opts.record_bytes} B (buffer drained in {drained if drained is None else round(drained, 1)} s)")
            per = opts.records // opts.producers
            spark_process = connect.process
            assert spark_process is not None and spark_process.proc is not None  # started by the with
            connect_pid = spark_process.proc.pid
            if opts.client == "kcat":
                inputs = [kcat_input(data / f"kcat-{i}.txt", per, opts.record_bytes) for i in range(opts.producers)]
                figures, broker_window, broker_cpu, connect_window, queryable = _measured(
                    proc.pid, n, connect_pid,
                    lambda: kcat_produce(bootstrap, topics[1:], inputs, per, opts.record_bytes, opts.timeout_s),
                    metrics_ports, opts.timeout_s)
            else:
                ctx = multiprocessing.get_context("spawn")
                out = ctx.Queue()
                ready, start = ctx.Barrier(opts.producers + 1), ctx.Barrier(opts.producers + 1)
                workers = [ctx.Process(target=_producer, args=(bootstrap, topics[1 + i], per, opts.record_bytes,
                                                               opts.timeout_s, ready, start, out), daemon=True)
                           for i in range(opts.producers)]

                def load() -> list[dict]:
                    # The producers start only now, after _measured's first CPU readings: a 20,000-record
                    # load can end within the tenths of a second those readings take.
                    start.wait(180)
                    return [out.get(timeout=opts.timeout_s + 120) for _ in workers]

                try:
                    for w in workers:
                        w.start()
                    ready.wait(180)
                    figures, broker_window, broker_cpu, connect_window, queryable = _measured(
                        proc.pid, n, connect_pid, load, metrics_ports, opts.timeout_s)
                finally:
                    for w in workers:
                        w.join(30)
                        if w.is_alive():
                            w.kill()
            row = phase_row(n, opts, figures, per * opts.producers, broker_window, broker_cpu, connect_window)
            row["table_wait_s"] = drained
            row["queryable"] = queryable
            return row
        finally:
            del admin  # its connections go before the brokers (no "connection refused" noise)
            stop_brokers(proc, log)


def run_phase(opts: BrokersBenchOptions, work: Path, log_dir: Path, say: Callable[[str], None] = print) -> list[dict]:
    """Every N of ``opts.brokers`` in turn (data in ``work/brokers-N``, removed after; logs in ``log_dir``).

    Returns one ``phase_row`` per N; an N that could not run gives ``{"brokers": N, "error": text, "ok": False}``.
    """
    rows = []
    log_dir.mkdir(parents=True, exist_ok=True)
    for n in opts.brokers:
        data = work / f"brokers-{n}"
        shutil.rmtree(data, ignore_errors=True)
        try:
            row = run_one(n, opts, data, log_dir / f"brokers-{n}.log", say)
        except Exception as exc:  # noqa: BLE001 - reported in the row
            row = {"brokers": n, "error": f"{type(exc).__name__}: {exc}", "ok": False}
        finally:
            shutil.rmtree(data, ignore_errors=True)
        rows.append(row)
        say(f"brokers N={n}: " + ("OK" if row["ok"] else f"FAILED {row.get('error') or row.get('errors')}"))
    return rows


# ------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    """The phase alone: ``OUT/results.json`` (``configurations`` empty, ``brokers`` the rows; redraw with
    ``python -m pipeline.bench.report OUT``), ``OUT/brokers.json`` (the rows), ``summary.md``,
    ``throughput_vs_brokers.png``, the table on stdout. Exit status 1 if an N failed."""
    from rich.console import Console

    from pipeline.bench import report
    from pipeline.bench.options import int_list
    from pipeline.bench.processes import machine

    d = BrokersBenchOptions()
    p = argparse.ArgumentParser(prog="python -m pipeline.bench.brokers_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--brokers", type=int_list, default=d.brokers, help="broker counts to run (default 1,2)")
    p.add_argument("--producers", type=int, default=d.producers, help=f"producer processes (default {d.producers})")
    p.add_argument("--records", type=int, default=d.records, help=f"records per N, all producers (default {d.records})")
    p.add_argument("--record-bytes", type=int, default=d.record_bytes, help="value bytes per record (default 1024)")
    p.add_argument("--partitions", type=int, default=d.partitions,
                   help=f"partitions of each producer's topic (default {d.partitions})")
    p.add_argument("--out", type=Path, default=Path("bench-results") / "brokers", help="output directory")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG", help="extra `pipeline serve` argument")
    p.add_argument("--client", choices=CLIENTS, default=d.client,
                   help="producers: confluent-kafka processes (default) or kcat processes (librdkafka without "
                        "Python; no latency figures)")
    args = p.parse_args(argv)
    opts = BrokersBenchOptions(brokers=args.brokers, producers=args.producers, records=args.records,
                               record_bytes=args.record_bytes, partitions=args.partitions,
                               server_args=list(args.server_arg), client=args.client)
    try:
        opts.check()
    except ValueError as exc:
        raise SystemExit(f"pipeline bench: {exc}") from None
    command = "python -m pipeline.bench.brokers_bench " + " ".join(sys.argv[1:] if argv is None else argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: dict[str, Any] = {"command": command, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(),
               "options": {"preset": "brokers"}, "configurations": [], "ceiling": {},
               "brokers_options": asdict(opts)}
    with tempfile.TemporaryDirectory(prefix="brokers-bench-") as tmp:
        results["brokers"] = run_phase(opts, Path(tmp), out / "logs")
    results["wall_s"] = time.monotonic() - started
    results["targets"] = report.evaluate_targets(results)
    (out / "brokers.json").write_text(json.dumps(results["brokers"], indent=2))
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    report.write_plots(results, out)
    (out / "summary.md").write_text(report.markdown(results))
    print(report.markdown(results), flush=True)
    report.print_report(results, Console(width=None if Console().is_terminal else 200))
    return 0 if all(r["ok"] for r in results["brokers"]) else 1


if __name__ == "__main__":
    sys.exit(main())
