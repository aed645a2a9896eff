"""``pipeline bench --sustained``: ingest that outlasts ``buffer.memory``, against a naive Spark loop.

    pipeline bench --sustained                      # 2 x 300,000 records of 1 KiB: 614 MB > 256 MiB
    pipeline bench --sustained --record-bytes 100   # CPU per record at 100 B (61 MB: fits the buffer)
    pipeline bench --sustained --smoke              # CI size: 2 x 5,000 records
    pipeline bench --sustained --value-format avro  # then the same load as Avro into a typed table

One ``pipeline serve`` at its defaults (``--ack-on wal``, ``buffer.memory``
256 MiB, one free Spark Connect port) but ``--metrics-port 0`` (the bench reads
``/metrics``) and any ``--server-arg``; one topic of ``--partitions`` (4)
partitions; ``--producers`` (2) confluent-kafka producer processes at default
settings (acks=all) sending ``--sustained-records`` records in all (default
600,000) of ``--record-bytes`` (1024) distinct random bytes each
(``naive_spark.RandomValues``) as fast as they are acknowledged, released
together by a barrier once every producer exists. The order:

1. The server starts: seconds to ``listening on`` and to ``table side ready``
   (``ManagedProcess.listening_s`` / ``startup_s``).
2. The naive loop's process starts (``pipeline.bench.naive_spark``: a JVM of
   its own) and warms up while the server takes a warm-up of
   ``WARMUP_RECORDS`` records and drains it to the table (neither measured).
   With ``--smoke`` it starts beside the server instead (two JVM start-ups
   at once: a shorter run, and a time to ready that includes that contention).
3. The measured load. Acknowledged MB/s: value + key bytes (10^6) from the
   first ``produce()`` to the last acknowledgement. Lag: from the last
   acknowledgement until the server's persister holds nothing
   (``pipeline_buffered_bytes`` 0 on ``/metrics``, polled every 0.25 s: every
   acknowledged record is committed to the table). Sustained MB/s, the
   ratio's numerator: the same bytes from the first ``produce()`` to that
   point, acknowledged *and* queryable. CPU seconds of every process of the
   server's tree over the same window, by role (front end, decode worker,
   JVM; ``processes.cpu_by_role``), and of the producers, per million records.
4. Every acknowledged record is checked against the table, read through the
   server's Spark Connect endpoint: ``verify.check_table`` (each record
   stored once, at the partition and offset it was acknowledged with,
   gapless, in each producer's send order). Lost: acknowledged records not
   in the table, plus records never acknowledged. Duplicated: records or
   offsets stored twice.
With ``--value-format avro`` the server also serves its Schema Registry
(``--schema-registry-listeners`` on a free port), and after step 4 the same
server takes a typed phase: ``AVRO_SCHEMA`` registered under
``AVRO_TOPIC-value`` (confluent-kafka's ``SchemaRegistryClient``), the topic
``AVRO_TOPIC`` created with ``value.format=avro`` and no ``value.schema`` (its
table follows the subject), an unmeasured warm-up to it (which creates its
table), then steps 3 and 4 again with registry-framed Avro values
(``avro_values.AvroValues``, exactly ``--record-bytes`` each): queryable means
a row of the topic's typed table; the table must hold every acknowledged
record, every typed column set (but the optional one) and no dead letter. The
headline: both phases' acknowledged-and-queryable MB/s and typed / raw.

5. The server stops (SIGTERM, ordered); then, with nothing else of the bench
   running, the naive loop writes the same number of records, ``naive_records_per_write``
   (100,000) per write: its MB/s is the ratio's denominator (ratio = sustained
   / naive).

Results in ``OUT/results.json`` and ``OUT/summary.md`` (default
``bench-results/sustained``), a table and the reproducing command on stdout.
Exit status 1 if a record was lost or duplicated, a producer failed, or the
server or the naive loop failed.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import socket
import subprocess
import sys
import threading
import time
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pipeline.bench.avro_values import AVRO_SCHEMA, AvroValues
from pipeline.bench.naive_spark import TOPIC, RandomValues, parse_key, record_key
from pipeline.bench.options import SustainedBenchOptions
from pipeline.bench.processes import (DeliveryLog, ManagedProcess, Sampler, cpu_by_process, cpu_by_role,
                                      run_and_report)

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier

    from confluent_kafka import KafkaError, Message

WARMUP_RECORDS = 5000
"""Records of the unmeasured warm-up (a fresh server's first Spark writes take seconds)."""
DRAIN_TIMEOUT_S = 900.0
"""Bound on the wait for the table to catch up (after the warm-up; after the load)."""
NAIVE_START_TIMEOUT_S = 600.0
WARMUP_PRODUCER = 99
"""The producer number in the warm-up's keys (the typed phase's warm-up shares the measured topic)."""
AVRO_TOPIC = f"{TOPIC}-avro"
"""The typed phase's topic (``--value-format avro``): ``value.format=avro``, no ``value.schema``."""


# ------------------------------------------------------------------- producers


def _values(record_bytes: int, seed: int, schema_id: int | None) -> RandomValues | AvroValues:
    """The values of one producer: random bytes, or registry-framed Avro of writer schema ``schema_id``."""
    if schema_id is None:
        return RandomValues(record_bytes, seed=seed)
    return AvroValues(record_bytes, schema_id, seed=seed)


def _produce(bootstrap: str, producer: int, records: int, record_bytes: int, timeout_s: float, barrier: Barrier,
             out: Queue[dict], topic: str = TOPIC, schema_id: int | None = None) -> None:
    """One producer process: librdkafka at default settings, ``records`` keyed records
    (``record_key(producer, seq)``) to ``topic`` as fast as acknowledged, random values
    (``schema_id`` None) or registry-framed Avro ones (``avro_values.AvroValues``, made
    before the barrier); puts its figures on ``out``:
    ``sent``, ``acked``, ``bytes`` (value + key bytes acknowledged), ``t_start``/``t_last_ack``
    (``time.perf_counter``: CLOCK_MONOTONIC, comparable between processes), ``cpu_s`` (this
    process, all threads, over the load), ``partition``/``offset`` (per seq, bytes of an
    ``array`` 'i'/'q', -1 when not acknowledged), ``errors`` (first 10), ``timed_out``."""
    try:
        from confluent_kafka import Producer

        values = _values(record_bytes, producer, schema_id)
        deliveries = DeliveryLog(records, record_bytes)
        partition, offset, state, errors = deliveries.partition, deliveries.offset, deliveries.state, deliveries.errors
        on_delivery = deliveries.on_delivery

        p = Producer({"bootstrap.servers": bootstrap})
        barrier.wait(180)
        cpu0, started = time.process_time(), time.perf_counter()
        deadline = started + timeout_s
        sent = 0
        while sent < records and time.perf_counter() < deadline:
            try:
                p.produce(topic, key=record_key(producer, sent), value=values.value(sent), on_delivery=on_delivery)
                sent += 1
            except BufferError:  # librdkafka's queue is full: serve delivery reports until it drains a little
                p.poll(0.05)
                continue
            if sent % 1000 == 0:
                p.poll(0)
        remaining = p.flush(max(1.0, deadline - time.perf_counter()))
        out.put({"producer": producer, "sent": sent, "acked": state["acked"], "bytes": state["bytes"],
                 "t_start": started, "t_last_ack": state["last"] or time.perf_counter(),
                 "cpu_s": time.process_time() - cpu0, "partition": partition.tobytes(), "offset": offset.tobytes(),
                 "errors": errors, "timed_out": sent < records or remaining > 0})
    except Exception as exc:  # noqa: BLE001 - reported in the results
        out.put({"producer": producer, "error": f"{type(exc).__name__}: {exc}"})


def _warm_up(bootstrap: str, records: int, record_bytes: int, topic: str = f"{TOPIC}-warmup",
             schema_id: int | None = None) -> dict:
    """``records`` records of producer ``WARMUP_PRODUCER`` to ``topic`` (a fresh server's first Spark
    writes take seconds; a typed topic's first write creates its table), values as ``_produce``'s.
    Returns where they were acknowledged, as ``_produce``'s figures have it (``producer``, ``sent``,
    ``partition``, ``offset``: for ``verify_table``).

    Raises RuntimeError if any is not acknowledged within 120 s."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap})
    values = _values(record_bytes, 99, schema_id)
    partition, offset = array("i", [-1]) * records, array("q", [-1]) * records
    failed: list[str] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failed.append(str(err))
            return
        seq = int((msg.key() or b"").partition(b"-")[2])
        partition[seq], offset[seq] = msg.partition() or 0, msg.offset() or 0

    for seq in range(records):
        while True:
            try:
                p.produce(topic, key=record_key(WARMUP_PRODUCER, seq), value=values.value(seq),
                          on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(120) or failed:
        raise RuntimeError(f"warm-up not acknowledged: {failed[:3]}")
    return {"producer": WARMUP_PRODUCER, "sent": records, "partition": partition.tobytes(),
            "offset": offset.tobytes()}


# ------------------------------------------------------------------- the naive loop


class NaiveLoop:
    """The ``pipeline.bench.naive_spark`` process: ``launch``, ``wait_ready``, ``write``, ``close``."""

    def __init__(self, opts: SustainedBenchOptions, out: Path, log_path: Path) -> None:
        self.per_write = min(opts.naive_records_per_write, opts.records)
        self.cmd = [sys.executable, "-m", "pipeline.bench.naive_spark", "--records-per-write", str(self.per_write),
                    "--record-bytes", str(opts.record_bytes), "--out", str(out)]
        self.log_path = log_path
        self.proc: subprocess.Popen[str] | None = None
        self.startup_s: float | None = None
        self._lines: list[str] = []
        self._line = threading.Condition()

    def launch(self) -> None:
        self._started = time.monotonic()
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True)
        threading.Thread(target=self._read, daemon=True, name="naive-stdout").start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._line:
                self._lines.append(line.strip())
                self._line.notify_all()
        with self._line:
            self._lines.append("EOF")
            self._line.notify_all()

    def _next(self, want: Callable[[str], bool], timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        with self._line:
            while True:
                for i, line in enumerate(self._lines):
                    if line == "EOF":
                        raise RuntimeError(f"the naive Spark loop exited; log {self.log_path}")
                    if want(line):
                        del self._lines[:i + 1]
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"the naive Spark loop did not answer within {timeout_s:.0f} s; "
                                       f"log {self.log_path}")
                self._line.wait(left)

    def wait_ready(self, timeout_s: float = NAIVE_START_TIMEOUT_S) -> None:
        """Raises RuntimeError if it exits or is not ready in time."""
        self._next(lambda line: line == "READY", timeout_s)
        self.startup_s = time.monotonic() - self._started

    def write(self, records: int, timeout_s: float) -> dict:
        """Write at least ``records`` records (whole writes); its JSON figures. Raises RuntimeError."""
        assert self.proc is not None and self.proc.stdin is not None
        writes = max(1, -(-records // self.per_write))
        self.proc.stdin.write(f"WRITE {writes}\n")
        self.proc.stdin.flush()
        figures: dict = json.loads(self._next(lambda line: line.startswith("{"), timeout_s))
        if "error" in figures:
            raise RuntimeError(figures["error"])
        return figures

    def close(self) -> int | None:
        """End it (end of input; killed after 120 s); its exit status."""
        if self.proc is None:
            return None
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            return self.proc.wait(120)
        except (subprocess.TimeoutExpired, OSError):
            self.proc.kill()
            return self.proc.wait(30)
        finally:
            self._log.close()


# ------------------------------------------------------------------- verification


def read_rows(data_dir: Path, table: str | None = None,
              topic: str = TOPIC) -> list[tuple[int, int, tuple[int, int, int] | None]]:
    """``topic``'s rows in ``table`` (default: the records table) as (partition, offset, (producer,
    seq, 0) or None), read through the running server's Spark Connect endpoint (its catalog: exact
    even after a compaction)."""
    from pipeline.process.datadir import table_session
    from pipeline.table.layout import DEFAULT_DATABASE, RECORDS_TABLE

    spark = table_session(data_dir)
    try:
        rows_of = spark.sql(f"SELECT partition, offset, key FROM {DEFAULT_DATABASE}.{table or RECORDS_TABLE} "
                            f"WHERE topic = '{topic}'").toArrow()
    finally:
        spark.stop()
    rows: list[tuple[int, int, tuple[int, int, int] | None]] = []
    for p, o, k in zip(rows_of.column("partition").to_pylist(), rows_of.column("offset").to_pylist(),
                       rows_of.column("key").to_pylist()):
        name = parse_key(k)
        rows.append((p, o, None if name is None else (name[0], name[1], 0)))
    return rows


def typed_table_counts(data_dir: Path, table: str, topic: str) -> dict[str, int]:
    """``topic``'s rows in its typed ``table`` and in the dead letters, the warm-up's included:
    ``rows``, ``decoded`` (rows whose every typed column but the optional ``referrer`` is set)
    and ``dead_letters``; read through the running server's Spark Connect endpoint."""
    from pipeline.process.datadir import table_session
    from pipeline.table.layout import DEFAULT_DATABASE
    from pipeline.table.typed import DEAD_LETTERS_TABLE

    required = [f["name"] for f in AVRO_SCHEMA["fields"] if f["name"] != "referrer"]
    spark = table_session(data_dir)
    try:
        decoded = " AND ".join(f"`{name}` IS NOT NULL" for name in required)
        rows, good = spark.sql(f"SELECT count(*), count_if({decoded}) FROM {DEFAULT_DATABASE}.{table}").collect()[0]
        dead = 0
        if spark.catalog.tableExists(f"{DEFAULT_DATABASE}.{DEAD_LETTERS_TABLE}"):
            dead = spark.sql(f"SELECT count(*) FROM {DEFAULT_DATABASE}.{DEAD_LETTERS_TABLE} "
                             f"WHERE topic = '{topic}'").collect()[0][0]
    finally:
        spark.stop()
    return {"rows": rows, "decoded": good, "dead_letters": dead}


def verify_table(producers: list[dict], rows: list[tuple[int, int, tuple[int, int, int] | None]]) -> dict:
    """``verify.check_table`` of every acknowledged record (one request of one record each: producer
    = conn, seq = req) against ``rows``; its report as JSON plus ``lost`` (acknowledged and not
    stored, plus sent and never acknowledged) and ``duplicated``. Pure."""
    from pipeline.bench.verify import ExpectedRequest, check_table

    expected = []
    unacked = 0
    for f in producers:
        partition, offset = array("i"), array("q")
        partition.frombytes(f["partition"])
        offset.frombytes(f["offset"])
        for seq in range(f["sent"]):
            if offset[seq] < 0:
                unacked += 1
            else:
                expected.append(ExpectedRequest(f["producer"], seq, partition[seq], 1, offset[seq]))
    report = check_table(expected, rows)
    table = {k: getattr(report, k).to_json() for k in
             ("missing", "duplicated", "unexpected", "misplaced", "out_of_order", "gaps")}
    return {"rows": report.rows, "expected": report.expected, "violations": report.violations,
            "lost": report.missing.count + unacked, "unacknowledged": unacked,
            "duplicated": report.duplicated.count, "findings": table}


def _lag_quantiles(metrics_port: int) -> dict[str, float | None]:
    from pipeline.observe.top import histogram_quantile, scrape

    buckets = scrape(f"http://127.0.0.1:{metrics_port}/metrics").buckets("pipeline_queryable_lag_ms")
    return {"p50": histogram_quantile(0.5, buckets), "p99": histogram_quantile(0.99, buckets)}


# ------------------------------------------------------------------------ figures


def figures(opts: SustainedBenchOptions, producers: list[dict], queryable_at: float | None, cpu: dict[str, float],
            naive: dict | None) -> dict:
    """The run's headline figures from the producers' results, the instant (``perf_counter``) the
    table held everything, CPU seconds by role and the naive loop's result. Pure."""
    done = [f for f in producers if "error" not in f]
    acked = sum(f["acked"] for f in done)
    nbytes = sum(f["bytes"] for f in done)
    start = min((f["t_start"] for f in done), default=0.0)
    last_ack = max((f["t_last_ack"] for f in done), default=0.0)
    ack_s = last_ack - start
    out: dict[str, Any] = {
        "records_sent": sum(f["sent"] for f in done), "records_acked": acked, "bytes_acked": nbytes,
        "exceeds_buffer_memory": nbytes > opts.buffer_memory,
        "ack_seconds": ack_s,
        "acked_mb_per_s": nbytes / ack_s / 1e6 if ack_s > 0 else None,
        "acked_records_per_s": acked / ack_s if ack_s > 0 else None,
        "lag_to_queryable_s": None if queryable_at is None else queryable_at - last_ack,
        "queryable_seconds": None if queryable_at is None else queryable_at - start,
        "sustained_mb_per_s": None if queryable_at is None or queryable_at <= start else nbytes / (queryable_at - start) / 1e6,
    }
    per_m = 1e6 / acked if acked else None
    client = sum(f["cpu_s"] for f in done)
    server = sum(cpu.values())
    out["cpu_s"] = {**{role: round(v, 3) for role, v in sorted(cpu.items())}, "server total": round(server, 3),
                    "producers": round(client, 3)}
    out["cpu_s_per_m_records"] = ({role: v * per_m for role, v in out["cpu_s"].items()} if per_m else None)
    if naive is not None and naive.get("seconds"):
        out["naive_mb_per_s"] = naive["bytes"] / naive["seconds"] / 1e6
        out["naive_records_per_s"] = naive["records"] / naive["seconds"]
        out["ratio"] = (out["sustained_mb_per_s"] / out["naive_mb_per_s"]) if out["sustained_mb_per_s"] else None
    return out


# ------------------------------------------------------------------------ report


def summary_md(result: dict) -> str:
    """The run as Markdown: the command, the headline table, CPU by role."""
    f, o, v = result["figures"], result["options"], result.get("verification") or {}
    naive = result.get("naive") or {}

    def fmt(x: float | None, spec: str = ".1f") -> str:
        return "-" if x is None else format(x, spec)

    lines = [f"Command: `{result['command']}`  ",
             f"Started {result['started_at']}, {result['wall_s']:.0f} s wall; {result['machine']['cpus']} CPUs, "
             f"load average at start {', '.join(f'{x:.2f}' for x in result['machine']['load_average_at_start'])}.",
             "",
             f"{o['producers']} confluent-kafka producers at default settings, {f['records_acked']:,} of "
             f"{o['records']:,} records of {o['record_bytes']} B acknowledged ({f['bytes_acked'] / 1e6:.0f} MB; "
             f"buffer.memory {o['buffer_memory'] / 2**20:.0f} MiB "
             f"{'exceeded' if f['exceeds_buffer_memory'] else 'not exceeded'}), {o['partitions']} partitions, "
             "server at defaults (`--ack-on wal`)"
             + (f" plus `{' '.join(o['server_args'])}`." if o["server_args"] else "."), "",
             "| figure | value |", "| --- | --- |",
             f"| time to `listening on` / to table side ready | {fmt(result['server'].get('listening_s'))} s / "
             f"{fmt(result['server'].get('startup_s'))} s |",
             f"| acknowledged | {fmt(f['acked_mb_per_s'])} MB/s ({fmt(f['acked_records_per_s'], ',.0f')} records/s, "
             f"{fmt(f['ack_seconds'])} s) |",
             f"| lag: last acknowledgement to all queryable | {fmt(f['lag_to_queryable_s'])} s |",
             f"| sustained: acknowledged and queryable | {fmt(f['sustained_mb_per_s'])} MB/s |",
             f"| naive Spark loop, same records ({naive.get('records_per_write', 0):,} per write) | "
             f"{fmt(f.get('naive_mb_per_s'))} MB/s |",
             f"| ratio sustained / naive | {fmt(f.get('ratio'), '.2f')} |",
             f"| lost / duplicated | {v.get('lost', '-')} / {v.get('duplicated', '-')} "
             f"({v.get('rows', '-')} rows, {v.get('violations', '-')} violation(s)) |",
             "", "| CPU (load to queryable) | CPU s | CPU s per million records |", "| --- | --- | --- |"]
    per_m = f.get("cpu_s_per_m_records") or {}
    for role, cpu in f["cpu_s"].items():
        lines.append(f"| {role} | {cpu:.1f} | {fmt(per_m.get(role))} |")
    typed = result.get("typed") or {}
    if typed.get("figures"):
        tf, tv, counts = typed["figures"], typed.get("verification") or {}, typed.get("counts") or {}
        tper_m = tf.get("cpu_s_per_m_records") or {}
        lines += ["", f"Typed phase, same server: {tf['records_acked']:,} Avro values of {o['record_bytes']} B "
                  f"(registry-framed, schema id {typed['schema_id']}) to `{typed['topic']}` (`value.format=avro`, "
                  f"its table `{typed['table']}` following the subject `{typed['topic']}-value`).", "",
                  "| figure | raw table | typed Avro table | typed / raw |", "| --- | --- | --- | --- |",
                  f"| acknowledged MB/s | {fmt(f['acked_mb_per_s'])} | {fmt(tf['acked_mb_per_s'])} | "
                  f"{fmt(f.get('typed_acked_ratio'), '.2f')} |",
                  f"| lag: last acknowledgement to all queryable, s | {fmt(f['lag_to_queryable_s'])} | "
                  f"{fmt(tf['lag_to_queryable_s'])} | |",
                  f"| **acknowledged and queryable MB/s** | {fmt(f['sustained_mb_per_s'])} | "
                  f"{fmt(tf['sustained_mb_per_s'])} | **{fmt(f.get('typed_sustained_ratio'), '.2f')}** |",
                  f"| rows (typed: the warm-up's included) / lost / duplicated | {v.get('rows', '-')} / "
                  f"{v.get('lost', '-')} / "
                  f"{v.get('duplicated', '-')} | {tv.get('rows', '-')} / {tv.get('lost', '-')} / "
                  f"{tv.get('duplicated', '-')} | |",
                  f"| dead letters / rows with a typed column null | | {counts.get('dead_letters', '-')} / "
                  f"{counts['rows'] - counts['decoded'] if counts else '-'} | |"]
        for role in tf["cpu_s"]:
            lines.append(f"| CPU s per million records: {role} | {fmt(per_m.get(role))} | {fmt(tper_m.get(role))} | |")
    lines += ["", f"Reproduce: `{result['command']}`"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------ main


def _server_command(opts: SustainedBenchOptions, data_dir: Path, registry_url: str | None = None) -> list[str]:
    registry = [] if registry_url is None else ["--schema-registry-listeners", registry_url]
    return [sys.executable, "-m", "pipeline.cli", "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir),
            "--metrics-port", "0", *registry, *opts.server_args]


def _load(opts: SustainedBenchOptions, bootstrap: str, server: ManagedProcess, topic: str,
          schema_id: int | None) -> tuple[list[dict], float | None, dict[str, float], dict]:
    """One measured load (module docstring, step 3) of ``opts.records`` records to ``topic``: the
    producers' figures (sorted by producer), the instant (``perf_counter``) the table held everything
    (None: not within ``DRAIN_TIMEOUT_S``), CPU seconds by role over that window, and the sampler's
    window (peak RSS)."""
    from pipeline.bench.security_bench import wait_for_table

    per = [opts.records // opts.producers + (i < opts.records % opts.producers) for i in range(opts.producers)]
    ctx = multiprocessing.get_context("spawn")
    queue, barrier = ctx.Queue(), ctx.Barrier(opts.producers + 1)
    workers = [ctx.Process(target=_produce, args=(bootstrap, i, n, opts.record_bytes, opts.timeout_s, barrier,
                                                  queue, topic, schema_id), daemon=True) for i, n in enumerate(per)]
    sampler = Sampler(server.pid, None)  # peak RSS only: no /metrics scrapes to count in the server's CPU
    queryable_at: float | None = None
    try:
        for w in workers:
            w.start()
        barrier.wait(180)
        cpu0 = cpu_by_process(server.pid)
        sampler.begin()
        producers = sorted((queue.get(timeout=opts.timeout_s + 120) for _ in workers), key=lambda f: f["producer"])
        if wait_for_table([server.metrics_port], DRAIN_TIMEOUT_S) is not None:
            queryable_at = time.perf_counter()
        cpu = cpu_by_role(cpu0, cpu_by_process(server.pid))
        window = sampler.end()
    finally:
        sampler.close()
        for w in workers:
            w.join(30)
            if w.is_alive():
                w.kill()
    return producers, queryable_at, cpu, window


def register_schema(registry_url: str, subject: str) -> int:
    """Register ``AVRO_SCHEMA`` under ``subject`` (confluent-kafka's ``SchemaRegistryClient``); its id."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    return SchemaRegistryClient({"url": registry_url}).register_schema(subject, Schema(json.dumps(AVRO_SCHEMA), "AVRO"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _typed_phase(opts: SustainedBenchOptions, bootstrap: str, server: ManagedProcess, registry_url: str,
                 data_dir: Path, say: Callable[[str], None]) -> dict:
    """The typed phase (``--value-format avro``), on the server the raw phase used: ``AVRO_SCHEMA``
    registered under ``AVRO_TOPIC-value``, ``AVRO_TOPIC`` created with ``value.format=avro`` (its
    table follows that subject), a warm-up to it that creates its table, then the same load as the
    raw phase's with registry-framed Avro values; its figures, checked against the typed table
    (``verify_table``: the warm-up's records included) and the dead letters. Raises RuntimeError
    if the table does not catch up."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from pipeline.bench.security_bench import wait_for_table
    from pipeline.table.layout import table_name_for_topic

    out: dict[str, Any] = {"topic": AVRO_TOPIC, "table": table_name_for_topic(AVRO_TOPIC)}
    out["schema_id"] = schema_id = register_schema(registry_url, f"{AVRO_TOPIC}-value")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(AVRO_TOPIC, opts.partitions, 1,
                                             config={"value.format": "avro"})]).values():
        fut.result(60)
    del admin
    say(f"typed phase: schema id {schema_id} under {AVRO_TOPIC}-value, topic {AVRO_TOPIC} (value.format=avro); "
        "warming its table up")
    warm = _warm_up(bootstrap, min(WARMUP_RECORDS, opts.records), opts.record_bytes, AVRO_TOPIC, schema_id)
    if wait_for_table([server.metrics_port], DRAIN_TIMEOUT_S) is None:
        raise RuntimeError("the typed warm-up did not reach the table")
    say(f"typed load: {opts.producers} producers, {opts.records:,} Avro values of {opts.record_bytes} B")
    producers, queryable_at, cpu, window = _load(opts, bootstrap, server, AVRO_TOPIC, schema_id)
    out["peak_rss_mb"] = window.get("peak_rss_bytes", 0) / 2**20
    out["producers"] = [{k: v for k, v in f.items() if k not in ("partition", "offset")} for f in producers]
    out["figures"] = figures(opts, producers, queryable_at, cpu, None)
    if queryable_at is None:
        raise RuntimeError(f"the typed table did not catch up within {DRAIN_TIMEOUT_S:.0f} s")
    say("verifying every acknowledged Avro record against the typed table and the dead letters")
    done = [f for f in producers if "error" not in f]
    # the warm-up's records are in the same table, before the load's: checked too
    out["verification"] = verify_table([warm, *done], read_rows(data_dir, out["table"], AVRO_TOPIC))
    out["counts"] = typed_table_counts(data_dir, out["table"], AVRO_TOPIC)
    return out


def run(opts: SustainedBenchOptions, say: Callable[[str], None]) -> dict:
    """The whole run (module docstring); returns the results (``error`` set if it could not finish)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from pipeline.bench.security_bench import wait_for_table

    out = opts.out
    data_dir = out / "data"
    shutil.rmtree(data_dir, ignore_errors=True)
    shutil.rmtree(out / "naive", ignore_errors=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"server": {}, "producers": [], "verification": None, "naive": None, "error": None}
    registry_url = f"http://127.0.0.1:{_free_port()}" if opts.value_format == "avro" else None
    server = ManagedProcess("sustained", _server_command(opts, data_dir, registry_url), out / "logs" / "server.log")
    naive = NaiveLoop(opts, out / "naive", out / "logs" / "naive-spark.log")
    result["server"]["command"] = "pipeline " + " ".join(server.cmd[3:])
    say(f"starting `{result['server']['command']}`")
    producers: list[dict] = []
    queryable_at: float | None = None
    cpu: dict[str, float] = {}
    try:
        server.launch()
        if opts.naive_with_server:
            naive.launch()
        server.wait_ready()
        result["server"] |= {"listening_s": server.listening_s, "startup_s": server.startup_s,
                             "naive_jvm_starting_beside": opts.naive_with_server}
        say(f"listening after {server.listening_s:.1f} s, table side ready after {server.startup_s:.1f} s; "
            "warming the server up" + ("" if opts.naive_with_server else ", starting the naive Spark loop's JVM"))
        if not opts.naive_with_server:
            naive.launch()
        bootstrap = f"127.0.0.1:{server.port}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for fut in admin.create_topics([NewTopic(TOPIC, opts.partitions, 1)]).values():
            fut.result(60)
        del admin
        _warm_up(bootstrap, min(WARMUP_RECORDS, opts.records), opts.record_bytes)
        if wait_for_table([server.metrics_port], DRAIN_TIMEOUT_S) is None:
            raise RuntimeError("the warm-up did not reach the table")
        naive.wait_ready()
        result["naive_startup_s"] = naive.startup_s

        per = opts.records // opts.producers
        say(f"load: {opts.producers} producers x ~{per:,} records of {opts.record_bytes} B "
            f"(~{opts.records * opts.record_bytes / 1e6:.0f} MB of values)")
        producers, queryable_at, cpu, window = _load(opts, bootstrap, server, TOPIC, None)
        result["server"]["peak_rss_mb"] = window.get("peak_rss_bytes", 0) / 2**20
        result["server"]["queryable_lag_ms"] = _lag_quantiles(server.metrics_port) if server.metrics_port else None
        result["producers"] = [{k: v for k, v in f.items() if k not in ("partition", "offset")} for f in producers]
        if queryable_at is None:
            raise RuntimeError(f"the table did not catch up within {DRAIN_TIMEOUT_S:.0f} s")
        say("verifying every acknowledged record against the table")
        done = [f for f in producers if "error" not in f]
        result["verification"] = verify_table(done, read_rows(data_dir))
        if registry_url is not None:
            result["typed"] = {"registry": registry_url}
            result["typed"] |= _typed_phase(opts, bootstrap, server, registry_url, data_dir, say)
    except Exception as exc:  # noqa: BLE001 - reported in the results
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        result["server"]["exit_code"] = server.stop() if server.proc is not None else None
        if result["server"]["exit_code"] not in (0, None):
            result["server"]["log_tail"] = server.log_tail(1500)
    try:
        if result["error"] is None:
            say("the server stopped; the naive Spark loop on the same records")
            result["naive"] = naive.write(opts.records, opts.timeout_s)
    except Exception as exc:  # noqa: BLE001 - reported in the results
        result["error"] = f"naive loop: {type(exc).__name__}: {exc}"
    finally:
        result["naive_exit_code"] = naive.close()
    result["figures"] = figures(opts, producers, queryable_at, cpu, result["naive"])
    typed = (result.get("typed") or {}).get("figures")
    if typed is not None:
        result["figures"] |= typed_ratios(result["figures"], typed)
    return result


def typed_ratios(raw: dict, typed: dict) -> dict[str, float | None]:
    """The typed phase against the raw one (``figures`` of each): both MB/s and typed / raw,
    acknowledged and acknowledged-and-queryable (``sustained``). Pure."""
    out: dict[str, float | None] = {}
    for what in ("acked", "sustained"):
        t, r = typed.get(f"{what}_mb_per_s"), raw.get(f"{what}_mb_per_s")
        out[f"typed_{what}_mb_per_s"] = t
        out[f"typed_{what}_ratio"] = t / r if t and r else None
    return out


def failures(result: dict) -> list[str]:
    """Why the run failed (empty: it did not). Pure."""
    reasons = [result["error"]] if result.get("error") else []
    v = result.get("verification")
    if v is None:
        reasons.append("the table was not verified")
    elif v["lost"] or v["duplicated"] or v["violations"]:
        reasons.append(f"{v['lost']} lost, {v['duplicated']} duplicated, {v['violations']} violation(s)")
    typed = result.get("typed") or {}
    for phase, producers in (("", result.get("producers") or []), ("typed phase ", typed.get("producers") or [])):
        for f in producers:
            if f.get("error") or f.get("errors") or f.get("timed_out"):
                reasons.append(f"{phase}producer {f['producer']}: {f.get('error') or f.get('errors') or 'timed out'}")
    if "registry" in typed:
        tv, counts = typed.get("verification"), typed.get("counts")
        if tv is None or counts is None:
            reasons.append("the typed table was not verified")
        else:
            if tv["lost"] or tv["duplicated"] or tv["violations"]:
                reasons.append(f"typed table: {tv['lost']} lost, {tv['duplicated']} duplicated, "
                               f"{tv['violations']} violation(s)")
            if counts["dead_letters"] or counts["decoded"] != counts["rows"]:
                reasons.append(f"typed table: {counts['dead_letters']} dead letter(s), "
                               f"{counts['rows'] - counts['decoded']} row(s) with a typed column null")
    if result["server"].get("exit_code") not in (0, None):
        reasons.append(f"server exited with {result['server']['exit_code']}")
    if result.get("naive_exit_code") not in (0, None):
        reasons.append(f"naive loop exited with {result['naive_exit_code']}")
    return reasons


def main(opts: SustainedBenchOptions, argv: list[str] | None = None) -> int:
    """Run, write ``OUT/results.json`` and ``OUT/summary.md``, print; exit status 1 on ``failures``."""
    return run_and_report(opts, "--sustained", argv, run, failures, summary_md)
