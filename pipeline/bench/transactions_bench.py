"""``pipeline bench --transactions``: transactional produce on one broker and on ``--brokers 3``, side by side.

    pipeline bench --transactions                                   # 300 transactions on N = 1, then on N = 3
    pipeline bench --transactions --transactions-count 1000 --partitions 6 --record-bytes 1024
    pipeline bench --transactions --smoke                           # CI size: 30 transactions per N

For each N of ``--brokers`` (default 1,3) in turn, as ``pipeline.bench.brokers_bench`` starts its
servers: a fresh data directory and Spark Connect server, ``pipeline serve --brokers N --ack-on wal
--spark-remote ... --metrics-port 0`` plus any ``--server-arg`` (N = 1 is the plain server, writing
through Connect as well, so only the number of brokers differs), and a topic ``TOPIC`` of
``--partitions`` (3) partitions, whose leaders the static cluster spreads over the brokers. Then one
confluent-kafka (librdkafka) transactional producer, ``transactional.id`` ``TRANSACTIONAL_ID`` (the
same in every run, so the same broker coordinates it: ``crc32(id) % N`` of the brokers sorted by id,
``pipeline.cluster.membership.Cluster.coordinator``), ``linger.ms`` 0 and otherwise librdkafka's
defaults (acks=all, idempotent): ``init_transactions``, ``WARMUP_TRANSACTIONS`` unmeasured
transactions (connections to every leader, the first AddPartitionsToTxn), then
``--transactions-count`` (300) measured ones, one after the other, each

    begin_transaction(); produce(one record of --record-bytes to partition k) for k in 0..P-1; commit_transaction()

Measured per N (``row``):

* transactions/s (and records/s): committed transactions over the window from the first measured
  ``begin_transaction()`` to the last ``commit_transaction()``'s return;
* ``commit_transaction()`` latency p50/p99/p99.9/max (``hdrh``, microseconds, reported in ms): the
  produce acknowledgements it flushes, then EndTxn, which the coordinator answers once every
  partition's COMMIT marker is durable: it writes those of the partitions it leads into its own WAL
  and, in a cluster, queues the others in the shared transaction store (SQLite in the data
  directory) for their leaders, which look for queued markers every 5 ms while they expect some;
  it looks every 5 ms whether they are written. ``markers_local`` / ``markers_queued`` say how many
  of the P partitions each way took;
* the whole transaction (``begin_transaction()`` to ``commit_transaction()``'s return) p50/p99/max;
* CPU seconds (user + system) of the broker process tree (the supervisor, the brokers and their
  decode workers; not the Connect JVM) over the window, per transaction;
* the check: a ``read_committed`` consumer reads the topic back from the start; each partition must
  hold every transaction's record (warm-up included) exactly once; the partitions' end offsets
  are read too (a record and its transaction's marker take one offset each).

Every wait is bounded: ``timeout_s`` on the measured loop of each N, ``COMMIT_TIMEOUT_S`` on each
commit, ``READ_TIMEOUT_S`` on the read-back, 600 s on each start-up; the servers are stopped (SIGTERM,
their process group killed after 300 s) however the run ends. Results in ``OUT/results.json`` and
``OUT/summary.md`` (default ``bench-results/transactions``), the table and the reproducing command on
stdout. Exit status 1 if an N could not run, a transaction failed, or the read-back found a record
missing or twice.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pipeline.bench.options import TRANSACTIONS_DEFAULT_COUNT, TRANSACTIONS_SMOKE_COUNT
from pipeline.bench.processes import cpu_since, run_and_report, sample_tree, start_brokers, stop_brokers

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message, Producer
    from confluent_kafka.admin import AdminClient
    from hdrh.histogram import HdrHistogram

TOPIC = "bench-transactions"
TRANSACTIONAL_ID = "bench-transactions"
WARMUP_TRANSACTIONS = 10
"""Unmeasured transactions before the measured ones (``--smoke``: ``SMOKE_WARMUP_TRANSACTIONS``)."""
SMOKE_WARMUP_TRANSACTIONS = 3
COMMIT_TIMEOUT_S = 60.0
"""Bound on one ``commit_transaction()`` (librdkafka's ``transaction.timeout.ms`` default is 60 s too)."""
READ_TIMEOUT_S = 120.0
"""Bound on the read-back of one N's topic."""
HISTOGRAM_MAX_US = 600_000_000


@dataclass(slots=True)
class TransactionsBenchOptions:
    """The plan of ``pipeline bench --transactions``. Sizes in bytes, times in seconds.

    Attributes:
        out: output directory (results.json, summary.md, logs; the data directories, removed after each N).
        brokers: broker counts N, in run order; ratios are to the first.
        transactions: measured transactions per N.
        warmup: unmeasured transactions before them.
        record_bytes: value bytes of each record (one per partition per transaction).
        partitions: partitions of the topic, each written by every transaction.
        timeout_s: bound on the measured transactions of one N (those not committed by then fail the run).
        server_args: extra ``pipeline serve`` arguments.
    """

    out: Path = Path("bench-results/transactions")
    brokers: list[int] = field(default_factory=lambda: [1, 3])
    transactions: int = TRANSACTIONS_DEFAULT_COUNT
    warmup: int = WARMUP_TRANSACTIONS
    record_bytes: int = 100
    partitions: int = 3
    timeout_s: float = 600.0
    server_args: list[str] = field(default_factory=list)

    def check(self) -> "TransactionsBenchOptions":
        """Raises ValueError naming the option out of range."""
        if not self.brokers or any(not 1 <= n <= 16 for n in self.brokers) or len(set(self.brokers)) != len(
                self.brokers):
            raise ValueError("--transactions needs distinct --brokers values 1..16")
        if not 1 <= self.transactions <= 100_000:
            raise ValueError("--transactions-count must be 1..100,000")
        if not 1 <= self.record_bytes <= 1_000_000 or not 1 <= self.partitions <= 64:
            raise ValueError("--transactions needs --record-bytes 1..1,000,000 and --partitions 1..64")
        return self


def resolve_transactions(args: Any) -> TransactionsBenchOptions:
    """The ``--transactions`` plan from ``pipeline bench`` arguments (``--smoke``: ``TRANSACTIONS_SMOKE_COUNT``
    transactions after ``SMOKE_WARMUP_TRANSACTIONS``).

    Raises:
        ValueError: an option out of range (the message names it).
    """
    d = TransactionsBenchOptions()
    smoke = args.preset == "smoke"
    out = args.out if args.out != Path("bench-results") else d.out
    count = getattr(args, "transactions_count", None)
    return TransactionsBenchOptions(
        out=out, brokers=list(args.brokers) if args.brokers else d.brokers,
        transactions=count if count is not None else (TRANSACTIONS_SMOKE_COUNT if smoke else d.transactions),
        warmup=SMOKE_WARMUP_TRANSACTIONS if smoke else d.warmup,
        record_bytes=d.record_bytes if args.record_bytes is None else args.record_bytes,
        partitions=d.partitions if args.partitions is None else args.partitions,
        server_args=list(args.server_arg)).check()


# ------------------------------------------------------------------- the load


def percentiles_ms(h: HdrHistogram) -> dict[str, float]:
    """p50/p99/p99.9/max (ms) of a histogram of microseconds; {} if it is empty."""
    if h.get_total_count() == 0:
        return {}
    return {name: h.get_value_at_percentile(q) / 1000 for name, q in
            (("p50", 50), ("p99", 99), ("p99.9", 99.9))} | {"max": h.get_max_value() / 1000}


class _Deliveries:
    """Delivery reports of the transactional producer: acknowledged records and the first errors."""

    def __init__(self) -> None:
        self.acked = 0
        self.errors: list[str] = []

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            if len(self.errors) < 10:
                self.errors.append(str(err))
            return
        self.acked += 1


def _transaction(producer: Producer, seq: int, opts: TransactionsBenchOptions, value: bytes,
                 on_delivery: _Deliveries) -> tuple[float, float]:
    """One transaction: one record (key ``seq``) to each partition, then ``commit_transaction``.
    Returns (its start, the start of its commit) on ``time.perf_counter``.

    Raises:
        confluent_kafka.KafkaException: a transactional call failed.
    """
    started = time.perf_counter()
    producer.begin_transaction()
    key = b"%d" % seq
    for p in range(opts.partitions):
        producer.produce(TOPIC, key=key, value=value, partition=p, on_delivery=on_delivery)
    committing = time.perf_counter()
    producer.commit_transaction(COMMIT_TIMEOUT_S)
    return started, committing


def load(bootstrap: str, opts: TransactionsBenchOptions, sample_cpu: Callable[[], float]) -> dict:
    """The producer's run against one N: ``init_transactions``, ``opts.warmup`` unmeasured transactions,
    then ``opts.transactions`` measured ones (bounded by ``opts.timeout_s``); ``sample_cpu()`` is called
    right before and right after the measured ones (the broker tree's CPU seconds so far).

    Returns the figures: ``transactions`` (measured and committed), ``warmup`` (committed), ``seconds``
    (the measured window), ``commit_ms`` / ``transaction_ms`` (``percentiles_ms``), ``broker_cpu_s``
    over the window, ``records_acked`` (every delivery report, warm-up included), ``errors``.
    """
    from confluent_kafka import KafkaException, Producer
    from hdrh.histogram import HdrHistogram

    commit_us, txn_us = HdrHistogram(1, HISTOGRAM_MAX_US, 3), HdrHistogram(1, HISTOGRAM_MAX_US, 3)
    deliveries = _Deliveries()
    errors: list[str] = []
    value = os.urandom(opts.record_bytes)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": TRANSACTIONAL_ID, "linger.ms": 0})
    warm = measured = 0
    first = last = time.perf_counter()
    cpu0: float | None = None
    cpu1: float | None = None
    try:
        producer.init_transactions(COMMIT_TIMEOUT_S)
        for seq in range(opts.warmup):
            _transaction(producer, seq, opts, value, deliveries)
            warm += 1
        cpu0 = sample_cpu()
        first = last = time.perf_counter()
        deadline = first + opts.timeout_s
        for seq in range(opts.warmup, opts.warmup + opts.transactions):
            if time.perf_counter() > deadline:
                errors.append(f"{opts.transactions - measured} transactions not run within {opts.timeout_s:g} s")
                break
            started, committing = _transaction(producer, seq, opts, value, deliveries)
            last = time.perf_counter()
            commit_us.record_value(max(1, int((last - committing) * 1e6)))
            txn_us.record_value(max(1, int((last - started) * 1e6)))
            measured += 1
        cpu1 = sample_cpu()
    except KafkaException as exc:
        errors.append(f"transaction {warm + measured}: {exc}")
        if exc.args and exc.args[0].txn_requires_abort():
            try:
                producer.abort_transaction(COMMIT_TIMEOUT_S)
            except KafkaException as abort:
                errors.append(f"abort_transaction: {abort}")
    finally:
        producer.flush(10)
        del producer
    seconds = last - first
    return {"transactions": measured, "warmup": warm, "seconds": round(seconds, 4),
            "commit_ms": percentiles_ms(commit_us), "transaction_ms": percentiles_ms(txn_us),
            "broker_cpu_s": round(cpu1 - cpu0, 3) if cpu0 is not None and cpu1 is not None else None,
            "records_acked": deliveries.acked, "errors": errors + deliveries.errors}


def read_back(bootstrap: str, partitions: int, expected: int, timeout_s: float = READ_TIMEOUT_S) -> dict:
    """Read ``TOPIC`` from its start with a ``read_committed`` consumer until ``expected`` records per
    partition came (or ``timeout_s``), then 1 s more for any extra.

    Returns ``records`` (read in all), ``expected`` (all partitions), per partition ``missing`` and
    ``duplicated`` keys (of ``0..expected-1``) and ``unexpected`` ones, ``end_offsets`` (the
    partitions' high watermarks), ``markers`` (each end offset less the records read there: the
    control records, one per transaction when each was written once), ``errors`` and ``ok``.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-transactions-read-back",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    seen: dict[int, list[int]] = {p: [] for p in range(partitions)}
    errors: list[str] = []
    try:
        consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + timeout_s
        quiet_until: float | None = None
        while time.monotonic() < deadline and (quiet_until is None or time.monotonic() < quiet_until):
            for msg in consumer.consume(500, 0.2):
                if msg.error() is not None:
                    if len(errors) < 10:
                        errors.append(str(msg.error()))
                    continue
                seen.setdefault(msg.partition() or 0, []).append(int(msg.key() or b"-1"))
            if quiet_until is None and all(len(seen[p]) >= expected for p in range(partitions)):
                quiet_until = time.monotonic() + 1.0
        ends = {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), 10)[1] for p in range(partitions)}
    finally:
        consumer.close()
    markers = {p: ends[p] - len(seen.get(p, [])) for p in range(partitions)}
    return check_read(seen, partitions, expected) | {"end_offsets": ends, "markers": markers, "errors": errors}


def check_read(seen: dict[int, list[int]], partitions: int, expected: int) -> dict:
    """Each of ``partitions`` must hold keys ``0..expected-1`` exactly once. Pure."""
    missing, duplicated, unexpected = {}, {}, {}
    for p in range(partitions):
        keys = seen.get(p, [])
        distinct = set(keys)
        missing[p] = len(set(range(expected)) - distinct)
        duplicated[p] = len(keys) - len(distinct)
        unexpected[p] = len(distinct - set(range(expected)))
    extra = {p: len(k) for p, k in seen.items() if not 0 <= p < partitions}
    return {"records": sum(len(k) for k in seen.values()), "expected": expected * partitions,
            "missing": missing, "duplicated": duplicated, "unexpected": unexpected, "other_partitions": extra,
            "ok": not any(missing.values()) and not any(duplicated.values()) and not any(unexpected.values())
            and not extra}


# ------------------------------------------------------------------- one N


def _layout(admin: AdminClient, partitions: int, timeout_s: float = 60.0) -> tuple[dict[int, int], int]:
    """({partition: leader node id}, the transaction coordinator's node id) once every partition of
    ``TOPIC`` has a leader. Raises RuntimeError after ``timeout_s``."""
    from pipeline.cluster.membership import Cluster, ClusterBroker

    deadline = time.monotonic() + timeout_s
    while True:
        meta = admin.list_topics(TOPIC, timeout=10)
        t = meta.topics.get(TOPIC)
        if t is not None and t.error is None and len(t.partitions) == partitions and all(
                p.leader >= 0 for p in t.partitions.values()) and meta.brokers:
            brokers = tuple(ClusterBroker(b.id, str(b.host), int(b.port or 0)) for b in meta.brokers.values())
            coordinator = Cluster(brokers, min(meta.brokers)).coordinator(TRANSACTIONAL_ID)
            return {p: t.partitions[p].leader for p in sorted(t.partitions)}, coordinator
        if time.monotonic() > deadline:
            raise RuntimeError(f"{TOPIC}: no leader for every partition within {timeout_s:.0f} s")
        time.sleep(0.2)


def run_one(n: int, opts: TransactionsBenchOptions, data: Path, log_path: Path, say: Callable[[str], None]) -> dict:
    """One N: Connect server, brokers, topic, the producer's transactions, the read-back; returns its row.

    Raises RuntimeError if the servers do not start, or an exception of the set-up (the topic).
    """
    from confluent_kafka.admin import AdminClient, NewTopic

    from pipeline.persist.spark_cluster import ConnectServer
    from pipeline.table.catalog import catalog_conf

    with ConnectServer(data / "_pipeline" / "spark-connect", conf=catalog_conf(data), timeout_s=600) as connect:
        cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--brokers", str(n), "--listen", "127.0.0.1:0",
               "--data-dir", str(data), "--spark-remote", connect.url, "--ack-on", "wal", "--metrics-port", "0",
               *opts.server_args]
        say(f"N={n}: starting `pipeline {' '.join(cmd[3:])}`")
        launched = time.monotonic()
        proc, addresses, _metrics, log = start_brokers(cmd, n, log_path)
        startup_s = time.monotonic() - launched
        admin = None
        try:
            bootstrap = ",".join(addresses)
            admin = AdminClient({"bootstrap.servers": bootstrap})
            admin.create_topics([NewTopic(TOPIC, opts.partitions, 1)])[TOPIC].result(60)
            leaders, coordinator = _layout(admin, opts.partitions)
            local = sum(1 for leader in leaders.values() if leader == coordinator)
            say(f"N={n}: listening after {startup_s:.0f} s; coordinator broker {coordinator}, leaders {leaders}; "
                f"{opts.warmup} + {opts.transactions} transactions of {opts.partitions} x {opts.record_bytes} B")
            tree0 = sample_tree(proc.pid)  # the supervisor, its brokers and their decode workers
            figures = load(bootstrap, opts, lambda: cpu_since(tree0, sample_tree(proc.pid)))
            total = figures["warmup"] + figures["transactions"]
            check = read_back(bootstrap, opts.partitions, total)
        finally:
            del admin  # its connections go before the brokers (no "connection refused" noise)
            stop_brokers(proc, log)
    return row(n, opts, figures, check, leaders, coordinator, local, startup_s)


def row(n: int, opts: TransactionsBenchOptions, figures: dict, check: dict, leaders: dict[int, int],
        coordinator: int, local: int, startup_s: float) -> dict:
    """The per-N entry of results.json. Pure."""
    seconds, committed = figures["seconds"], figures["transactions"]
    cpu = figures["broker_cpu_s"]
    return {
        "brokers": n, "transactions": committed, "transactions_planned": opts.transactions,
        "warmup": figures["warmup"], "partitions": opts.partitions, "record_bytes": opts.record_bytes,
        "seconds": seconds, "transactions_per_s": committed / seconds if seconds > 0 else None,
        "records_per_s": committed * opts.partitions / seconds if seconds > 0 else None,
        "commit_ms": figures["commit_ms"], "transaction_ms": figures["transaction_ms"],
        "coordinator": coordinator, "leaders": {str(p): leader for p, leader in leaders.items()},
        "markers_local": local, "markers_queued": opts.partitions - local,
        "broker_tree_cpu_s": cpu, "cpu_ms_per_transaction": cpu / committed * 1000 if cpu and committed else None,
        "records_acked": figures["records_acked"], "read_committed": check, "errors": figures["errors"],
        "startup_s": round(startup_s, 1), "cpus": os.cpu_count(), "load_average": os.getloadavg()[0],
        "ok": not figures["errors"] and committed == opts.transactions and check["ok"]
        and figures["records_acked"] == (figures["warmup"] + committed) * opts.partitions,
    }


def with_ratios(rows: list[dict]) -> list[dict]:
    """``rows`` with ``transactions_per_s_ratio`` and ``commit_p50_ratio``: each to the first row's. Pure."""
    base = rows[0] if rows else {}
    out = []
    for r in rows:
        rate, base_rate = r.get("transactions_per_s"), base.get("transactions_per_s")
        p50, base_p50 = (r.get("commit_ms") or {}).get("p50"), (base.get("commit_ms") or {}).get("p50")
        out.append(r | {"transactions_per_s_ratio": rate / base_rate if rate and base_rate else None,
                        "commit_p50_ratio": p50 / base_p50 if p50 and base_p50 else None})
    return out


def run(opts: TransactionsBenchOptions, say: Callable[[str], None]) -> dict:
    """Every N of ``opts.brokers`` in turn (data in ``OUT/data/brokers-N``, removed after; logs in
    ``OUT/logs``); an N that could not run gives ``{"brokers": N, "error": text, "ok": False}``."""
    (opts.out / "logs").mkdir(parents=True, exist_ok=True)
    rows = []
    for n in opts.brokers:
        data = opts.out / "data" / f"brokers-{n}"
        shutil.rmtree(data, ignore_errors=True)
        log_path = opts.out / "logs" / f"brokers-{n}.log"
        log_path.unlink(missing_ok=True)
        try:
            r = run_one(n, opts, data, log_path, say)
        except Exception as exc:  # noqa: BLE001 - reported in the row
            r = {"brokers": n, "error": f"{type(exc).__name__}: {exc}", "ok": False}
        finally:
            shutil.rmtree(data, ignore_errors=True)
        rows.append(r)
        why = r.get("error") or r.get("errors") or r.get("read_committed")
        say(f"N={n}: " + ("OK" if r["ok"] else f"FAILED {why}"))
    shutil.rmtree(opts.out / "data", ignore_errors=True)
    return {"rows": with_ratios(rows)}


# ------------------------------------------------------------------- report


def failures(result: dict) -> list[str]:
    """Why the run failed (empty: it did not). Pure."""
    reasons = []
    for r in result.get("rows") or []:
        if r.get("error"):
            reasons.append(f"N={r['brokers']}: {r['error']}")
        elif not r["ok"]:
            c = r["read_committed"]
            reasons.append(f"N={r['brokers']}: {r['transactions']} of {r['transactions_planned']} transactions "
                           f"committed, errors {r['errors'][:3]}; read back {c['records']} of {c['expected']} "
                           f"records (missing {c['missing']}, duplicated {c['duplicated']})")
    if not result.get("rows"):
        reasons.append("no broker count ran")
    return reasons


COLUMNS = ("brokers", "transactions", "txn/s", "txn/s x first", "commit p50 ms", "commit p99 ms", "commit max ms",
           "commit p50 x first", "txn p50 ms", "txn p99 ms", "markers local / queued", "broker CPU ms/txn",
           "read_committed", "check")


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table_rows(rows: list[dict]) -> list[tuple[str, ...]]:
    """The rows as strings, in ``COLUMNS`` order. Pure."""
    out: list[tuple[str, ...]] = []
    for r in rows:
        if r.get("error"):
            out.append((str(r["brokers"]), *["-"] * (len(COLUMNS) - 2), "FAILED"))
            continue
        c, t, commit = r["read_committed"], r["transaction_ms"], r["commit_ms"]
        out.append((str(r["brokers"]), f"{r['transactions']:,}", _fmt(r["transactions_per_s"], ",.1f"),
                    _fmt(r["transactions_per_s_ratio"], ".2f"), _fmt(commit.get("p50"), ".1f"),
                    _fmt(commit.get("p99"), ".1f"), _fmt(commit.get("max"), ".1f"), _fmt(r["commit_p50_ratio"], ".2f"),
                    _fmt(t.get("p50"), ".1f"), _fmt(t.get("p99"), ".1f"),
                    f"{r['markers_local']} / {r['markers_queued']}", _fmt(r["cpu_ms_per_transaction"], ".1f"),
                    f"{c['records']:,} of {c['expected']:,}", "OK" if r["ok"] else "FAILED"))
    return out


def summary_md(result: dict) -> str:
    """The run as Markdown: the command, the table (each N beside the first), what the columns are."""
    o, m = result["options"], result["machine"]
    rows = result.get("rows") or []
    first = rows[0]["brokers"] if rows else "-"
    header = [c.replace("x first", f"x N={first}") for c in COLUMNS]
    lines = [f"Command: `{result['command']}`  ",
             f"Started {result['started_at']}, {result['wall_s']:.0f} s wall; {m['cpus']} CPUs, "
             f"load average at start {', '.join(f'{x:.2f}' for x in m['load_average_at_start'])}.",
             "",
             "Per N: `pipeline serve --brokers N --ack-on wal` on its own Spark Connect server"
             + (f" plus `{' '.join(o['server_args'])}`" if o["server_args"] else "")
             + f"; one confluent-kafka transactional producer (`transactional.id` {TRANSACTIONAL_ID}, `linger.ms` 0, "
             f"otherwise librdkafka's defaults): {o['warmup']} unmeasured transactions, then {o['transactions']:,} "
             f"measured ones, each one record of {o['record_bytes']} B to each of the {o['partitions']} partitions "
             f"of `{TOPIC}`, then `commit_transaction()`.", "",
             "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(rows)]
    lines += ["",
              "commit: `commit_transaction()` (the produce acknowledgements it flushes, then EndTxn, answered once "
              "every partition's marker is durable); txn: `begin_transaction()` to `commit_transaction()`'s return; "
              "markers local / queued: of the partitions, those the transaction's coordinator leads (their markers "
              "in its own WAL) and those it queues in the shared transaction store for their leaders; broker CPU: "
              "the broker process tree over the measured window (not the Spark Connect JVM); read_committed: "
              "records a read_committed consumer read back (the warm-up's included) of those committed."]
    for r in rows:
        if r.get("error"):
            lines.append(f"\nN={r['brokers']} could not run: {r['error']}")
    lines += ["", f"Reproduce: `{result['command']}`"]
    return "\n".join(lines) + "\n"


def main(opts: TransactionsBenchOptions, argv: list[str] | None = None) -> int:
    """Run, write ``OUT/results.json`` and ``OUT/summary.md``, print; exit status 1 on ``failures``."""
    return run_and_report(opts, "--transactions", argv, run, failures, summary_md)
