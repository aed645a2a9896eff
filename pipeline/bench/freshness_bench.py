"""``pipeline bench --freshness``: acknowledgement to visible, through the live view and through the table alone.

    pipeline bench --freshness                                  # 90 s (30 s warm-up), 2 producers, 1000 records/s of 1 KiB
    pipeline bench --freshness --rate 2000 --duration 120       # more load, longer
    pipeline bench --freshness --duration 8 --warmup 2 --server-arg=--table-commit-interval-ms=2500   # CI size

One ``pipeline serve`` at its defaults (``--ack-on wal``, ``table.commit.interval.ms`` 10 s,
background compaction every 5 min, Spark Connect on a free port published in
``DATA_DIR/_pipeline/endpoints.json``) but ``--metrics-port 0`` (the bench reads ``/metrics``)
and any ``--server-arg``, on a fresh data directory ``OUT/data``. The order:

1. The server starts; the bench creates the load topic ``LOAD_TOPIC`` (``--partitions``, 4) and
   the probe topic ``PROBE_TOPIC`` (one partition), produces one record to each and waits until
   both ``pipeline.records`` and ``pipeline.records_live`` return the probe's (the server's first
   commit, which creates the table's partitions and warms the JVM's write path, and the first
   live query, which starts Spark's Python workers: neither is measured).
2. The load: ``--producers`` (2) confluent-kafka producer processes at default settings
   (acks=all), keyed records (``naive_spark.record_key``) of ``--record-bytes`` (1024) random bytes
   to ``LOAD_TOPIC`` at ``--rate`` records/s in all (default 1000/s, ~1 MB/s: a small fraction of
   what ``--sustained`` measures on the 2-core machine, so the lags are the view's and the table's,
   not a saturated server's), paced in 10 ms steps, for ``--duration`` s (default 90).
3. Beside the load, two threads, each with its own Spark Connect session, so that neither's queries
   delay the other's:

   * the *probe/live* thread, every ``PROBE_INTERVAL_S`` (0.5 s): produce one record (its own
     librdkafka producer, acks=all, ``linger.ms`` 0) to ``PROBE_TOPIC`` partition 0 and wait for its
     acknowledgement (the delivery report: ack time and offset); then run
     ``SELECT offset FROM pipeline.records_live WHERE topic = .. AND partition = 0 AND offset = ..``
     until it returns the row. Live lag = the instant that query returned the row - the ack time:
     what a user who queries right after the acknowledgement waits, query time included (the
     first query normally returns it: the view reads the brokers up to the last stable offset at
     planning). Producing and querying in one thread keeps one live query in flight at a time, as
     a user would; if queries take longer than the interval, probes are spaced by them instead.
   * the *table* thread: every ``TABLE_POLL_S`` (0.5 s) one query for every probe not yet seen,
     ``SELECT offset FROM pipeline.records WHERE topic = .. AND partition = 0 AND offset >= <oldest
     pending>``. Table lag = the instant the query that first returned the probe's row finished
     - the ack time: its resolution is the poll interval plus one query (~0.1-0.5 s), small next to
     the 10 s commit interval.

   Probes acknowledged in the first ``--warmup`` s of the load (default 30: the first commits
   under load, and the JVM compiling the query path) are left out of the figures and reported
   apart. When the live queries outlast the load (a short run on a loaded machine: a CI run's
   queries took 6.3 s of a 6 s load), so that no probe was counted, one more probe is sent once
   the load ended, and counted: a run always has a figure, on a quieter server then. After the load
   the table thread keeps polling until it
   has seen every probe (bounded by ``FINAL_WAIT_S``).
4. Verification, as a by-product: right after the last acknowledgement, every acknowledged load
   record is read back through ``pipeline.records_live`` (before the table has them all: the live
   view must already hold each exactly once); then, once the persister holds nothing
   (``pipeline_buffered_bytes`` 0), through ``pipeline.records`` and ``pipeline.records_live``
   again. Each is ``sustained_bench.verify_table`` (``verify.check_table``: each record once, at
   the partition and offset it was acknowledged with): lost (acknowledged and missing, plus sent and
   never acknowledged) and duplicated. The table's shape for the load topic: parquet files under
   ``DATA_DIR/tables/records/topic=LOAD_TOPIC/date=*/hour=*/`` per partition-hour (what is there:
   background compaction every 5 min by default does not run in a 60 s load), and the Spark commits
   of the load (``pipeline_flush_time_ms_count`` on ``/metrics``, all topics).
5. The server stops (SIGTERM, ordered).

Results in ``OUT/results.json`` and ``OUT/summary.md`` (default ``bench-results/freshness``), the
table and the reproducing command on stdout. Exit status 1 if a record was lost or duplicated in
either read, a probe was never seen, a producer failed or the server failed.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import shutil
import statistics
import sys
import threading
import time
from array import array
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pipeline.bench.naive_spark import RandomValues, record_key
from pipeline.bench.options import FRESHNESS_DEFAULT_DURATION, FRESHNESS_DEFAULT_WARMUP
from pipeline.bench.processes import DeliveryLog, ManagedProcess, counter, run_and_report, scrape_metrics
from pipeline.bench.sustained_bench import read_rows, verify_table

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier

    from confluent_kafka import KafkaError, Message
    from pyspark.sql import SparkSession

LOAD_TOPIC = "bench-freshness"
PROBE_TOPIC = "bench-freshness-probe"
PROBE_INTERVAL_S = 0.5
"""How often the probe thread produces a probe (when its live query is quicker than this)."""
TABLE_POLL_S = 0.5
"""How often the table thread queries ``pipeline.records`` for the pending probes."""
PROBE_TIMEOUT_S = 60.0
"""Bound on one probe's live wait; a probe not seen by then counts as missed."""
FINAL_WAIT_S = 180.0
"""Bound on the wait, after the load, for the table to show every probe and to hold everything."""
WARMUP_TIMEOUT_S = 300.0
"""Bound on step 1 (the first commit and the first live query)."""
DEFAULT_DURATION = FRESHNESS_DEFAULT_DURATION
DEFAULT_WARMUP = FRESHNESS_DEFAULT_WARMUP
DEFAULT_RATE = 1000.0


@dataclass(slots=True)
class FreshnessBenchOptions:
    """The plan of ``pipeline bench --freshness``. Sizes in bytes, times in seconds.

    Attributes:
        out: output directory (results.json, summary.md, logs, the data directory).
        duration: seconds of load (warm-up included).
        warmup: the first seconds of the load whose probes are not counted.
        rate: load records/s, all producers together.
        producers: confluent-kafka producer processes of the load.
        record_bytes: value bytes per load record.
        partitions: partitions of the load topic.
        server_args: extra ``pipeline serve`` arguments.
    """

    out: Path = Path("bench-results/freshness")
    duration: float = DEFAULT_DURATION
    warmup: float = DEFAULT_WARMUP
    rate: float = DEFAULT_RATE
    producers: int = 2
    record_bytes: int = 1024
    partitions: int = 4
    server_args: list[str] = field(default_factory=list)

    def check(self) -> "FreshnessBenchOptions":
        """Raises ValueError naming the option out of range."""
        if not 5 <= self.duration <= 3600 or not 0 <= self.warmup <= self.duration - 2:
            raise ValueError("--freshness needs --duration 5..3600 s and --warmup 0..duration-2 s")
        if not 1 <= self.rate <= 100_000 or not 1 <= self.producers <= 16:
            raise ValueError("--freshness needs --rate 1..100,000 records/s and --producers 1..16")
        if not 1 <= self.record_bytes <= 1_000_000 or not 1 <= self.partitions <= 256:
            raise ValueError("--freshness needs --record-bytes 1..1,000,000 and --partitions 1..256")
        return self


def resolve_freshness(args: Any) -> FreshnessBenchOptions:
    """The ``--freshness`` plan from ``pipeline bench`` arguments.

    Raises:
        ValueError: an option out of range (the message names it).
    """
    d = FreshnessBenchOptions()
    out = args.out if args.out != Path("bench-results") else Path("bench-results") / "freshness"
    return FreshnessBenchOptions(
        out=out, duration=d.duration if args.duration is None else args.duration,
        warmup=d.warmup if getattr(args, "warmup", None) is None else args.warmup,
        rate=d.rate if args.rate is None else args.rate,
        producers=getattr(args, "producers", None) or d.producers,
        record_bytes=d.record_bytes if args.record_bytes is None else args.record_bytes,
        partitions=args.partitions or d.partitions, server_args=list(args.server_arg)).check()


# ------------------------------------------------------------------- the load


def _produce_at_rate(bootstrap: str, producer: int, rate: float, duration_s: float, record_bytes: int,
                     barrier: Barrier, out: Queue[dict], topic: str = LOAD_TOPIC) -> None:
    """One load producer process: librdkafka at default settings, keyed records
    (``record_key(producer, seq)``) of random values to ``topic`` at ``rate`` records/s (paced in
    10 ms steps) for ``duration_s``; puts its figures on ``out`` as ``sustained_bench._produce``
    does (``sent``, ``acked``, ``bytes``, ``t_start``/``t_last_ack`` as ``perf_counter``,
    ``partition``/``offset`` bytes of arrays per seq, ``errors``, ``timed_out``)."""
    try:
        from confluent_kafka import Producer

        values = RandomValues(record_bytes, seed=producer)
        capacity = int(rate * duration_s) + 1
        deliveries = DeliveryLog(capacity, record_bytes)
        partition, offset, state, errors = deliveries.partition, deliveries.offset, deliveries.state, deliveries.errors
        on_delivery = deliveries.on_delivery

        p = Producer({"bootstrap.servers": bootstrap})
        barrier.wait(180)
        started = time.perf_counter()
        end = started + duration_s
        sent = 0
        while (now := time.perf_counter()) < end:
            due = min(capacity, int((now - started) * rate) + 1)
            while sent < due:
                try:
                    p.produce(topic, key=record_key(producer, sent), value=values.value(sent),
                              on_delivery=on_delivery)
                    sent += 1
                except BufferError:
                    p.poll(0.05)
            p.poll(0)
            time.sleep(max(0.0, min(0.01, end - time.perf_counter())))
        remaining = p.flush(60)
        out.put({"producer": producer, "sent": sent, "acked": state["acked"], "bytes": state["bytes"],
                 "t_start": started, "t_end": time.perf_counter(), "t_last_ack": state["last"] or time.perf_counter(),
                 "partition": partition[:sent].tobytes(), "offset": offset[:sent].tobytes(),
                 "errors": errors, "timed_out": remaining > 0})
    except Exception as exc:  # noqa: BLE001 - reported in the results
        out.put({"producer": producer, "error": f"{type(exc).__name__}: {exc}"})


# ------------------------------------------------------------------- probes


@dataclass(slots=True)
class Probe:
    """One probe record: its offset in ``PROBE_TOPIC`` partition 0 and the instants
    (``perf_counter``) of its acknowledgement and of its first sight through each path."""

    seq: int
    offset: int
    acked_at: float
    counted: bool
    live_at: float | None = None
    table_at: float | None = None
    live_queries: int = 0
    """Live queries run for it (1: the first query after the acknowledgement returned it)."""


class ProbeBoard:
    """The probes, shared by the probe/live thread and the table thread (under one lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.probes: list[Probe] = []
        self.errors: dict[str, list[str]] = {"probe": [], "live": [], "table": []}
        self.live_queries: list[float] = []
        self.table_queries: list[float] = []
        self.warmup_errors: dict[str, list[str]] = {}

    def error(self, where: str, exc: BaseException) -> None:
        with self.lock:
            if len(self.errors[where]) < 10:
                self.errors[where].append(f"{type(exc).__name__}: {str(exc)[:300]}")

    def pending_table(self) -> list[Probe]:
        with self.lock:
            return [p for p in self.probes if p.table_at is None]


def _sql_offsets(spark: SparkSession, query: str) -> set[int]:
    return {int(row[0]) for row in spark.sql(query).collect()}


def _live_query(offset: int) -> str:
    from pipeline.table.layout import DEFAULT_DATABASE, RECORDS_TABLE
    from pipeline.table.live import LIVE_SUFFIX

    return (f"SELECT offset FROM {DEFAULT_DATABASE}.{RECORDS_TABLE}{LIVE_SUFFIX} "
            f"WHERE topic = '{PROBE_TOPIC}' AND partition = 0 AND offset = {offset}")


def _table_query(lowest: int) -> str:
    from pipeline.table.layout import DEFAULT_DATABASE, RECORDS_TABLE

    return (f"SELECT offset FROM {DEFAULT_DATABASE}.{RECORDS_TABLE} "
            f"WHERE topic = '{PROBE_TOPIC}' AND partition = 0 AND offset >= {lowest}")


class ProbeProducer:
    """Produces probe ``seq`` (acks=all, ``linger.ms`` 0) when called and returns (offset, ack
    instant as ``perf_counter``); ``close`` releases the librdkafka client (before the server stops:
    else it logs its reconnects on stderr)."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Producer

        self._producer: Producer | None = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})

    def __call__(self, seq: int) -> tuple[int, float]:
        """Raises RuntimeError if the probe is not acknowledged within 30 s or the producer is closed."""
        producer = self._producer
        if producer is None:
            raise RuntimeError("the probe producer is closed")
        got: dict[str, Any] = {}

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            got["at"] = time.perf_counter()
            got["err"], got["offset"] = err, msg.offset()

        producer.produce(PROBE_TOPIC, key=b"probe-%d" % seq, value=b"p" * 64, partition=0, on_delivery=on_delivery)
        producer.flush(30)
        if "at" not in got or got["err"] is not None or got["offset"] is None:
            raise RuntimeError(f"probe {seq} not acknowledged: {got.get('err')}")
        return int(got["offset"]), float(got["at"])

    def close(self) -> None:
        self._producer = None


def _live_loop(board: ProbeBoard, spark: SparkSession, produce: Callable[[int], tuple[int, float]],
               counted_from: float, stop: threading.Event) -> None:
    """The probe/live thread (module docstring, step 3) until ``stop``."""
    seq = 0
    next_at = time.perf_counter()
    after_load = False
    while True:
        if stop.is_set():
            if after_load or any(p.counted for p in board.probes):
                return
            after_load = True  # the live queries outlasted the load: one counted probe now (module docstring)
        try:
            offset, acked_at = produce(seq)
        except Exception as exc:  # noqa: BLE001 - reported in the results
            board.error("probe", exc)
            stop.wait(PROBE_INTERVAL_S)
            continue
        probe = Probe(seq, offset, acked_at, counted=acked_at >= counted_from)
        with board.lock:
            board.probes.append(probe)
        seq += 1
        while time.perf_counter() - acked_at < PROBE_TIMEOUT_S:
            t0 = time.perf_counter()
            try:
                seen = offset in _sql_offsets(spark, _live_query(offset))
            except Exception as exc:  # noqa: BLE001 - reported in the results; retried
                board.error("live", exc)
                seen = False
                time.sleep(0.2)
            now = time.perf_counter()
            with board.lock:
                board.live_queries.append(now - t0)
                probe.live_queries += 1
                if seen:
                    probe.live_at = now
            if seen:
                break
        next_at = max(next_at + PROBE_INTERVAL_S, time.perf_counter())
        stop.wait(max(0.0, next_at - time.perf_counter()))


def _table_loop(board: ProbeBoard, spark: SparkSession, stop: threading.Event, deadline: list[float]) -> None:
    """The table thread (module docstring, step 3): until ``stop`` is set and every probe is seen,
    or ``deadline[0]`` (``perf_counter``; set when the load ends) passes."""
    while time.perf_counter() < deadline[0]:
        pending = board.pending_table()
        if not pending:
            if stop.is_set():
                return
            time.sleep(TABLE_POLL_S)
            continue
        t0 = time.perf_counter()
        try:
            seen = _sql_offsets(spark, _table_query(min(p.offset for p in pending)))
        except Exception as exc:  # noqa: BLE001 - reported in the results; retried
            board.error("table", exc)
            seen = set()
        now = time.perf_counter()
        with board.lock:
            board.table_queries.append(now - t0)
            for p in pending:
                if p.offset in seen:
                    p.table_at = now
        time.sleep(max(0.0, TABLE_POLL_S - (time.perf_counter() - t0)))


# ------------------------------------------------------------------- figures


def lag_stats(lags_s: list[float]) -> dict[str, float | int | None]:
    """``count``, ``p50``, ``p99``, ``max`` and ``mean`` of lags in seconds, as ms (nearest rank). Pure."""
    if not lags_s:
        return {"count": 0, "p50": None, "p99": None, "max": None, "mean": None}
    ms = sorted(x * 1000 for x in lags_s)

    def rank(q: float) -> float:
        return ms[min(len(ms) - 1, max(0, math.ceil(q * len(ms)) - 1))]

    return {"count": len(ms), "p50": rank(0.5), "p99": rank(0.99), "max": ms[-1], "mean": statistics.fmean(ms)}


def probe_figures(probes: list[Probe]) -> dict:
    """The lags of the counted probes, live and table, the warm-up probes' live lags apart, and what
    was never seen. Pure."""
    counted = [p for p in probes if p.counted]
    return {
        "probes": len(probes), "counted": len(counted),
        "live_ms": lag_stats([p.live_at - p.acked_at for p in counted if p.live_at is not None]),
        "warmup_live_ms": lag_stats([p.live_at - p.acked_at for p in probes
                                     if not p.counted and p.live_at is not None]),
        "table_ms": lag_stats([p.table_at - p.acked_at for p in counted if p.table_at is not None]),
        "live_missed": sum(p.live_at is None for p in probes),
        "live_after_more_than_one_query": sum(p.live_queries > 1 for p in counted if p.live_at is not None),
        "table_missed": sum(p.table_at is None for p in probes),
    }


def table_files(data_dir: Path, topic: str = LOAD_TOPIC) -> dict:
    """Parquet files of ``topic`` in the records table's directory, per partition-hour (directory
    ``date=*/hour=*``, a day topic's ``hour`` directory included)."""
    from pipeline.table.layout import RECORDS_TABLE, TABLES_DIR

    base = data_dir / TABLES_DIR / RECORDS_TABLE / f"topic={topic}"
    per = {f"{h.parent.name}/{h.name}": len(list(h.glob("*.parquet"))) for h in sorted(base.glob("date=*/hour=*"))
           if h.is_dir()}
    files = sum(per.values())
    return {"directory": str(base), "partition_hours": len(per), "files": files,
            "files_per_partition_hour": files / len(per) if per else None, "per_partition_hour": per}


def _flushes(metrics_port: int | None) -> float | None:
    if metrics_port is None:
        return None
    try:
        return counter(scrape_metrics(metrics_port), "pipeline_flush_time_ms_count")
    except OSError:
        return None


# ------------------------------------------------------------------- the run


def _server_command(opts: FreshnessBenchOptions, data_dir: Path) -> list[str]:
    return [sys.executable, "-m", "pipeline.cli", "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir),
            "--metrics-port", "0", *opts.server_args]


WARMUP_PRODUCER = 99
"""The producer number in the key of step 1's load-topic record (checked with the load's)."""


def _warm_up(board: ProbeBoard, produce: Callable[[int], tuple[int, float]], bootstrap: str,
             live: SparkSession, table: SparkSession) -> tuple[float, dict]:
    """Step 1: one record to the load topic (``record_key(WARMUP_PRODUCER, 0)``), one probe (seq
    -1, not counted); waits until the table and the live view return the probe. Returns the
    seconds taken and the load record's figures as a producer's (for ``verify_table``). Raises
    RuntimeError after ``WARMUP_TIMEOUT_S``."""
    from confluent_kafka import Producer

    started = time.perf_counter()
    p = Producer({"bootstrap.servers": bootstrap})
    where: list[tuple[int, int]] = []
    p.produce(LOAD_TOPIC, key=record_key(WARMUP_PRODUCER, 0), value=b"w",
              on_delivery=lambda err, msg: where.append((msg.partition() or 0, msg.offset() or 0))
              if err is None else None)
    if p.flush(60) or not where:
        raise RuntimeError("the warm-up record was not acknowledged")
    warm = {"producer": WARMUP_PRODUCER, "sent": 1, "partition": array("i", [where[0][0]]).tobytes(),
            "offset": array("q", [where[0][1]]).tobytes()}
    offset, _ = produce(-1)
    for spark, query in ((table, _table_query(offset)), (live, _live_query(offset))):
        while True:
            try:
                if offset in _sql_offsets(spark, query):
                    break
            except Exception as exc:  # noqa: BLE001 - e.g. the view before the first commit publishes it
                board.error("live" if spark is live else "table", exc)
            if time.perf_counter() - started > WARMUP_TIMEOUT_S:
                raise RuntimeError(f"the warm-up probe was not visible within {WARMUP_TIMEOUT_S:.0f} s "
                                   f"({'live view' if spark is live else 'table'})")
            time.sleep(0.5)
    with board.lock:  # errors while the view did not exist yet are expected; kept apart from the run's
        board.warmup_errors = {k: e for k, e in board.errors.items() if e}
        board.errors = {k: [] for k in board.errors}
    return time.perf_counter() - started, warm


def run(opts: FreshnessBenchOptions, say: Callable[[str], None]) -> dict:
    """The whole run (module docstring); returns the results (``error`` set if it could not finish)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from pipeline.bench.security_bench import wait_for_table
    from pipeline.process.datadir import table_session
    from pipeline.table.layout import RECORDS_TABLE
    from pipeline.table.live import LIVE_SUFFIX

    live_table = RECORDS_TABLE + LIVE_SUFFIX
    data_dir = opts.out / "data"
    shutil.rmtree(data_dir, ignore_errors=True)
    (opts.out / "logs").mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"server": {}, "producers": [], "probes": None, "verification": {}, "table_files": None,
                              "error": None}
    server = ManagedProcess("freshness", _server_command(opts, data_dir), opts.out / "logs" / "server.log")
    result["server"]["command"] = "pipeline " + " ".join(server.cmd[3:])
    say(f"starting `{result['server']['command']}`")
    board = ProbeBoard()
    sessions: list[SparkSession] = []
    clients: list[ProbeProducer] = []
    try:
        server.start()
        result["server"] |= {"listening_s": server.listening_s, "startup_s": server.startup_s}
        bootstrap = f"127.0.0.1:{server.port}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for fut in admin.create_topics([NewTopic(LOAD_TOPIC, opts.partitions, 1),
                                        NewTopic(PROBE_TOPIC, 1, 1)]).values():
            fut.result(60)
        del admin
        live, table = table_session(data_dir), table_session(data_dir)
        sessions += [live, table]
        result["server"]["spark_connect"] = json.loads((data_dir / "_pipeline" / "endpoints.json").read_text()).get(
            "spark_connect")
        produce = ProbeProducer(bootstrap)
        clients.append(produce)
        say(f"ready after {server.startup_s:.1f} s (Spark Connect {result['server']['spark_connect']}); warming up: "
            "the first commit and the first live query")
        result["warmup_s"], warm = _warm_up(board, produce, bootstrap, live, table)

        say(f"load: {opts.producers} producers, {opts.rate:g} records/s of {opts.record_bytes} B for "
            f"{opts.duration:g} s (the first {opts.warmup:g} s not counted); probes every {PROBE_INTERVAL_S} s")
        ctx = multiprocessing.get_context("spawn")
        queue, barrier = ctx.Queue(), ctx.Barrier(opts.producers + 1)
        workers = [ctx.Process(target=_produce_at_rate, args=(bootstrap, i, opts.rate / opts.producers, opts.duration,
                                                              opts.record_bytes, barrier, queue), daemon=True)
                   for i in range(opts.producers)]
        for w in workers:
            w.start()
        stop, deadline = threading.Event(), [float("inf")]
        try:
            barrier.wait(180)
            flushes0, started = _flushes(server.metrics_port), time.perf_counter()
            threads = [threading.Thread(target=_live_loop, args=(board, live, produce, started + opts.warmup, stop),
                                        name="freshness-live", daemon=True),
                       threading.Thread(target=_table_loop, args=(board, table, stop, deadline),
                                        name="freshness-table", daemon=True)]
            for t in threads:
                t.start()
            producers = sorted((queue.get(timeout=opts.duration + 180) for _ in workers), key=lambda f: f["producer"])
            stop.set()
            threads[0].join(PROBE_TIMEOUT_S + 30)
        finally:
            stop.set()
            for w in workers:
                w.join(30)
                if w.is_alive():
                    w.kill()
        result["producers"] = [{k: v for k, v in f.items() if k not in ("partition", "offset")} for f in producers]
        done = [f for f in producers if "error" not in f]
        expected = [warm, *done]
        say("the load ended; every acknowledged record through the live view, before the table has them all")
        result["verification"]["live_at_end_of_load"] = verify_table(expected, read_rows(data_dir, live_table, LOAD_TOPIC))
        deadline[0] = time.perf_counter() + FINAL_WAIT_S
        say("waiting for the table to show every probe and to hold everything")
        threads[1].join(FINAL_WAIT_S + 30)
        if wait_for_table([server.metrics_port], FINAL_WAIT_S) is None:
            raise RuntimeError(f"the table did not hold everything within {FINAL_WAIT_S:.0f} s")
        flushes1 = _flushes(server.metrics_port)
        result["commits_in_load"] = None if flushes0 is None or flushes1 is None else int(flushes1 - flushes0)
        result["verification"]["table"] = verify_table(expected, read_rows(data_dir, RECORDS_TABLE, LOAD_TOPIC))
        result["verification"]["live"] = verify_table(expected, read_rows(data_dir, live_table, LOAD_TOPIC))
        result["table_files"] = table_files(data_dir)
        result["load"] = load_figures(done, opts)
    except Exception as exc:  # noqa: BLE001 - reported in the results
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for client in clients:
            client.close()
        for spark in sessions:
            try:
                spark.stop()
            except Exception:  # noqa: BLE001,S110 - the server may be gone
                pass
        result["server"]["exit_code"] = server.stop() if server.proc is not None else None
        if result["server"]["exit_code"] not in (0, None):
            result["server"]["log_tail"] = server.log_tail(1500)
    with board.lock:
        result["probes"] = probe_figures(board.probes)
        result["probes"]["errors"] = board.errors
        result["probes"]["warmup_errors"] = board.warmup_errors
        result["probes"]["live_query_ms_median"] = (statistics.median(board.live_queries) * 1000
                                                    if board.live_queries else None)
        result["probes"]["table_query_ms_median"] = (statistics.median(board.table_queries) * 1000
                                                     if board.table_queries else None)
        result["probes"]["list"] = [asdict(p) for p in board.probes]
    return result


def load_figures(producers: list[dict], opts: FreshnessBenchOptions) -> dict:
    """Records sent and acknowledged and the achieved rate (acknowledged over the load's span). Pure."""
    acked = sum(f["acked"] for f in producers)
    nbytes = sum(f["bytes"] for f in producers)
    start = min((f["t_start"] for f in producers), default=0.0)
    end = max((max(f["t_end"], f["t_last_ack"]) for f in producers), default=0.0)
    span = end - start
    return {"records_sent": sum(f["sent"] for f in producers), "records_acked": acked, "bytes_acked": nbytes,
            "seconds": span, "records_per_s": acked / span if span > 0 else None,
            "mb_per_s": nbytes / span / 1e6 if span > 0 else None, "target_records_per_s": opts.rate}


# ------------------------------------------------------------------- report


def failures(result: dict) -> list[str]:
    """Why the run failed (empty: it did not). Pure."""
    reasons = [result["error"]] if result.get("error") else []
    for name in ("live_at_end_of_load", "table", "live"):
        v = (result.get("verification") or {}).get(name)
        if v is None:
            reasons.append(f"{name}: not verified")
        elif v["lost"] or v["duplicated"] or v["violations"]:
            reasons.append(f"{name}: {v['lost']} lost, {v['duplicated']} duplicated, {v['violations']} violation(s)")
    probes = result.get("probes") or {}
    if probes.get("live_missed") or probes.get("table_missed"):
        reasons.append(f"probes never seen: {probes['live_missed']} through the live view, "
                       f"{probes['table_missed']} in the table")
    if not (probes.get("live_ms") or {}).get("count") or not (probes.get("table_ms") or {}).get("count"):
        reasons.append("no counted probe")
    for f in result.get("producers") or []:
        if f.get("error") or f.get("errors") or f.get("timed_out"):
            reasons.append(f"producer {f['producer']}: {f.get('error') or f.get('errors') or 'timed out'}")
    if result["server"].get("exit_code") not in (0, None):
        reasons.append(f"server exited with {result['server']['exit_code']}")
    return reasons


def summary_md(result: dict) -> str:
    """The run as Markdown: the command, the lags, the load, the table's files, the verification."""
    o, pr = result["options"], result.get("probes") or {}
    load, files, v = result.get("load") or {}, result.get("table_files") or {}, result.get("verification") or {}

    def fmt(x: float | None, spec: str = ",.0f") -> str:
        return "-" if x is None else format(x, spec)

    lines = [f"Command: `{result['command']}`  ",
             f"Started {result['started_at']}, {result['wall_s']:.0f} s wall; {result['machine']['cpus']} CPUs, "
             f"load average at start {', '.join(f'{x:.2f}' for x in result['machine']['load_average_at_start'])}.",
             "",
             "Server at defaults (`--ack-on wal`, 10 s table commit interval)"
             + (f" plus `{' '.join(o['server_args'])}`" if o["server_args"] else "")
             + f"; {o['producers']} producers of {o['record_bytes']} B records at {o['rate']:g} records/s to "
             f"`{LOAD_TOPIC}` ({o['partitions']} partitions) for {o['duration']:g} s; a probe every "
             f"{PROBE_INTERVAL_S} s to `{PROBE_TOPIC}`, the first {o['warmup']:g} s not counted "
             f"({pr.get('counted', 0)} of {pr.get('probes', 0)} probes counted).", "",
             "| acknowledgement to visible, ms | count | p50 | p99 | max |", "| --- | --- | --- | --- | --- |"]
    for name, key in (("live view `pipeline.records_live`", "live_ms"), ("table `pipeline.records`", "table_ms"),
                      ("live view, warm-up probes (not counted)", "warmup_live_ms")):
        s = pr.get(key) or {}
        lines.append(f"| {name} | {s.get('count', 0)} | {fmt(s.get('p50'))} | {fmt(s.get('p99'))} | "
                     f"{fmt(s.get('max'))} |")
    lines += ["",
              f"Median query time: live {fmt(pr.get('live_query_ms_median'))} ms, table "
              f"{fmt(pr.get('table_query_ms_median'))} ms (the table is polled every {TABLE_POLL_S} s); counted "
              f"probes the first live query after the acknowledgement did not return: "
              f"{fmt(pr.get('live_after_more_than_one_query'))}.", "",
              "| figure | value |", "| --- | --- |",
              f"| load achieved | {fmt(load.get('records_per_s'))} records/s, {fmt(load.get('mb_per_s'), '.2f')} MB/s "
              f"({fmt(load.get('records_acked'))} of {fmt(load.get('records_sent'))} records acknowledged) |",
              f"| Spark commits during the load and the drain (all topics) | {fmt(result.get('commits_in_load'))} |",
              f"| load topic's parquet files / partition-hours | {fmt(files.get('files'))} / "
              f"{fmt(files.get('partition_hours'))} ({fmt(files.get('files_per_partition_hour'), '.1f')} per "
              "partition-hour) |"]
    for name, key in (("live view, right after the last acknowledgement", "live_at_end_of_load"),
                      ("table, once it holds everything", "table"), ("live view, then", "live")):
        c = v.get(key) or {}
        lines.append(f"| {name}: rows / lost / duplicated | {c.get('rows', '-')} / {c.get('lost', '-')} / "
                     f"{c.get('duplicated', '-')} ({c.get('violations', '-')} violation(s)) |")
    errors = {k: e for k, e in (pr.get("errors") or {}).items() if e}
    if errors:
        lines += ["", f"Query errors (retried): {json.dumps(errors)[:1500]}"]
    lines += ["", f"Reproduce: `{result['command']}`"]
    return "\n".join(lines) + "\n"


def main(opts: FreshnessBenchOptions, argv: list[str] | None = None) -> int:
    """Run, write ``OUT/results.json`` and ``OUT/summary.md``, print; exit status 1 on ``failures``."""
    return run_and_report(opts, "--freshness", argv, run, failures, summary_md)
