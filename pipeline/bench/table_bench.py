"""``pipeline bench --table``: what a steady produce load leaves in the table, before and after compaction.

One server (``--ack-on wal``, ``table.commit.interval.ms`` from
``--commit-interval-ms``, default 500 ms here), one confluent-kafka producer
at default settings sending ``--rate`` records/s for ``--duration`` s, the
record timestamps spread evenly over ``--hours`` simulated hours
(CreateTime), so the rows land in that many hour partitions as a day of
steady traffic would, each simulated hour lasting ``duration / hours`` s of
real time. Before compaction a partition-hour therefore holds about
``duration / hours / commit interval`` files (10 with the defaults); in real
time, with the server's 10 s default, it would be 360. Reported:

* files per partition-hour and mean file size, before and after compaction;
* acknowledgement-to-queryable lag p50/p99 (the server's
  ``pipeline_queryable_lag_ms`` histogram, scraped at the end);
* the time of ``SELECT count(*)`` over the topic and of a 3-hour time-range
  query (median of ``--repeats``), before and after compaction, in one
  classic Spark session on the table's catalog.

The server runs without background compaction; after it stops, the bench
compacts through ``TableCatalog.compact`` (what ``pipeline compact`` does).
Figures and the command go to ``OUT/table_results.json`` and the terminal.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message
    from pyspark.sql import SparkSession

    from pipeline.table.catalog import TableCatalog

TOPIC = "bench-table"


@dataclass(slots=True)
class TableBenchOptions:
    """Sizes in bytes, times in seconds unless named ``_ms``."""

    out: Path = Path("bench-results/table")
    rate: float = 200.0
    duration: float = 120.0
    record_bytes: int = 200
    hours: int = 24
    commit_interval_ms: int | None = 500
    repeats: int = 5
    target_file_bytes: int | None = None


def _produce(bootstrap: str, opts: TableBenchOptions) -> int:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    delivered = 0

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1

    total = int(opts.rate * opts.duration)
    start_ms = int(time.time() // 86400 * 86400 * 1000)  # today 00:00 UTC
    step_ms = opts.hours * 3_600_000 / max(1, total)
    payload = b"x" * opts.record_bytes
    began = time.monotonic()
    for i in range(total):
        producer.produce(TOPIC, key=b"%d" % i, value=payload, timestamp=int(start_ms + i * step_ms),
                         on_delivery=on_delivery)
        producer.poll(0)
        wait = began + (i + 1) / opts.rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
    producer.flush(60)
    return delivered


def _measure(spark: SparkSession, catalog: TableCatalog, repeats: int) -> dict:
    from pipeline.table.catalog import list_data_files

    files = {}
    for p in catalog.partitions():
        if p.values.get("topic") == TOPIC:
            files[f"{p.values['date']}/{p.values['hour']}"] = list_data_files(p.location)
    sizes = [f.size for fs in files.values() for f in fs]
    table = catalog.records_table
    hours = sorted(files)
    middle = hours[len(hours) // 2].split("/") if hours else ["", "0"]
    h = int(middle[1]) if middle[1] != "None" else 0
    range_query = (f"SELECT count(*) FROM {table} WHERE topic = '{TOPIC}' AND date = '{middle[0]}' "
                   f"AND hour BETWEEN {h} AND {h + 2}")

    def timed(query: str) -> tuple[float, int]:
        times, value = [], 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            value = spark.sql(query).collect()[0][0]
            times.append(time.perf_counter() - t0)
        return statistics.median(times), value

    count_s, count = timed(f"SELECT count(*) FROM {table} WHERE topic = '{TOPIC}'")
    range_s, range_rows = timed(range_query)
    return {
        "partitions": len(files),
        "files": len(sizes),
        "files_per_partition_hour": len(sizes) / max(1, len(files)),
        "max_files_in_a_partition": max((len(fs) for fs in files.values()), default=0),
        "mean_file_bytes": statistics.mean(sizes) if sizes else 0,
        "count_s": count_s,
        "count": count,
        "range_query_s": range_s,
        "range_rows": range_rows,
        "range_query": range_query,
    }


def main(opts: TableBenchOptions, argv: list[str] | None = None) -> int:
    from pipeline.bench.processes import ManagedProcess
    from pipeline.observe.top import histogram_quantile, scrape

    console = Console(width=None if Console().is_terminal else 160)
    out = opts.out
    data_dir = out / "data"
    shutil.rmtree(data_dir, ignore_errors=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir),
           "--metrics-port", "0", "--spark-connect-port", "0", "--table-compaction-interval-ms", "0"]
    if opts.commit_interval_ms is not None:
        cmd += ["--table-commit-interval-ms", str(opts.commit_interval_ms)]
    server = ManagedProcess("table", cmd, out / "logs" / "server.log")
    console.print(f"starting the server; producing {opts.rate:g} records/s for {opts.duration:g} s "
                  f"over {opts.hours} simulated hours")
    server.start()
    try:
        delivered = _produce(f"127.0.0.1:{server.port}", opts)
        # the last records are acknowledged; wait for their commit, then read the lag histogram
        time.sleep((opts.commit_interval_ms or 10_000) / 1000 + 2)
        metrics = scrape(f"http://127.0.0.1:{server.metrics_port}/metrics")
    finally:
        code = server.stop()
    if code != 0:
        raise SystemExit(f"server exited with {code}; see {out / 'logs' / 'server.log'}")
    buckets = metrics.buckets("pipeline_queryable_lag_ms")
    lag = {"p50_ms": histogram_quantile(0.5, buckets), "p99_ms": histogram_quantile(0.99, buckets)}

    from dataclasses import replace

    from pipeline.process.datadir import table_session
    from pipeline.table.catalog import TableCatalog
    from pipeline.table.table_config import TableConfig

    spark = table_session(data_dir, "local[*]", app_name="pipeline-bench-table")
    try:
        config = TableConfig(file_delete_delay_ms=0)
        if opts.target_file_bytes:
            config = replace(config, target_file_bytes=opts.target_file_bytes)
        catalog = TableCatalog(spark, data_dir, config)
        before = _measure(spark, catalog, opts.repeats)
        started = time.perf_counter()
        compaction = catalog.compact()
        compaction_s = time.perf_counter() - started
        after = _measure(spark, catalog, opts.repeats)
    finally:
        spark.stop()
    if not before["count"] == after["count"] == delivered:
        raise SystemExit(f"row counts {before['count']} / {after['count']} differ from the {delivered} delivered")
    result = {
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(opts).items()},
        "delivered": delivered,
        "queryable_lag": lag,
        "before": before,
        "after": after,
        "compaction": {"seconds": compaction_s, "partitions": compaction.compacted_partitions,
                       "files_before": compaction.files_before, "files_after": compaction.files_after},
        "command": "pipeline bench " + " ".join(argv or ["--table"]),
    }
    (out / "table_results.json").write_text(json.dumps(result, indent=1))
    table = Table(title=f"table after {delivered} records at {opts.rate:g}/s over {opts.hours} simulated hours "
                        f"(commit interval {opts.commit_interval_ms or 'default'} ms)")
    for column in ("", "partitions", "files/partition-hour", "max files", "mean file", "count(*)", "3-hour range"):
        table.add_column(column)
    for name, m in (("before compaction", before), ("after compaction", after)):
        table.add_row(name, str(m["partitions"]), f"{m['files_per_partition_hour']:.1f}",
                      str(m["max_files_in_a_partition"]), f"{m['mean_file_bytes'] / 1024:.1f} KiB",
                      f"{m['count_s'] * 1000:.0f} ms", f"{m['range_query_s'] * 1000:.0f} ms")
    console.print(table)
    console.print(f"acknowledgement-to-queryable lag: p50 {lag['p50_ms'] or 0:.0f} ms, "
                  f"p99 {lag['p99_ms'] or 0:.0f} ms; "
                  f"compaction {compaction_s:.1f} s for {compaction.compacted_partitions} partitions")
    console.print(f"results: {out / 'table_results.json'}")
    return 0
