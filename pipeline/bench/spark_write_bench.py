"""The table side against a naive Spark write loop, interleaved in one run (issue 23, item 1).

Both sides get the same records: ``--writes`` x ``--records-per-write`` Kafka
records of ``--record-bytes`` random bytes (1 KiB by default, keys ``key-<n>``),
built once as RecordBatch v2 (``--batch-records`` records per batch, as a
librdkafka producer at default settings sends ~1 MB batches) over 4 partitions.

* **naive**: what a user of pyspark does: the records decoded to Arrow before the
  clock starts (``appends_to_table``), then per write
  ``spark.createDataFrame(arrow_table).write.mode("append").parquet(path)``, with
  pyspark's default Arrow settings (10,000-row batches, 48 MiB LocalRelation
  threshold). Decoding is free for it.
* **sink**: the server's table side as the server builds it: a ``BatchingPersister``
  (WAL group commit, ``--ack-on wal``'s commit policy and ``buffer.memory`` at the
  server's defaults) over a ``SparkGroupSink`` (decode worker process reading the
  records back from the WAL, the records table's catalog commit, checkpoint),
  fed the same RecordBatches as produce requests would be, as fast as it takes
  them; the clock runs from the first append to the last record committed and
  checkpointed.

Rounds alternate the two (naive first in even rounds, sink first in odd ones),
on one Spark session (``local[*]``, the JVM's defaults: no ``SPARK_SUBMIT_OPTS``
of the test suite), each sink round on a topic of its own; at the end every sink
round's rows are counted in the table (exactly the records sent, each once).
Reported per round and as median/min/max: MB/s (record value + key bytes / wall
s) of each side, the ratio sink / naive, and the CPU seconds of the whole process
tree (this process, the JVM, the decode worker) per side: a figure less bent by
other load on a shared machine than wall time.

    python -m pipeline.bench.spark_write_bench --rounds 5 --out bench-results/spark-write
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import trio
from kafka.record.default_records import DefaultRecordBatchBuilder
from rich.console import Console
from rich.table import Table

from pipeline.config import ServerConfig
from pipeline.log.batch import PartitionAppend
from pipeline.log.checkpoint import Checkpoint, StateStore
from pipeline.log.wal import WriteAheadLog
from pipeline.persist.accumulator import FlushPolicy
from pipeline.persist.persister import BatchingPersister
from pipeline.table.arrow import appends_to_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.persist.group_sink import SparkGroupSink

TARGET_RATIO = 1.2
PARTITIONS = 4
PYSPARK_ARROW_DEFAULTS = {
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
    "spark.sql.execution.arrow.localRelationThreshold": str(48 * 1024 * 1024),
}


def build_batches(records: int, record_bytes: int, batch_records: int) -> list[bytes]:
    """RecordBatch v2 bytes (uncompressed) of ``records`` records with random values of ``record_bytes``."""
    batches = []
    now_ms = int(time.time() * 1000)
    for start in range(0, records, batch_records):
        b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                      producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
        for i in range(min(batch_records, records - start)):
            b.append(i, timestamp=now_ms, key=b"key-%d" % (start + i), value=os.urandom(record_bytes), headers=[])
        batches.append(bytes(b.build()))
    return batches


def to_appends(batches: list[bytes], batch_records: int, topic: str) -> list[PartitionAppend]:
    """One append per batch, round-robin over ``PARTITIONS`` partitions, offsets from 0."""
    next_offset = [0] * PARTITIONS
    appends = []
    for i, raw in enumerate(batches):
        p = i % PARTITIONS
        appends.append(PartitionAppend(topic, p, next_offset[p], raw, batch_records, 0))
        next_offset[p] += batch_records
    return appends


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process and all its descendants (the JVM, the decode worker)."""
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def run_naive(spark: SparkSession, tables: list, path: str) -> None:
    """The naive loop: one ``createDataFrame(arrow).write.parquet`` per table, pyspark's Arrow defaults."""
    saved = {k: spark.conf.get(k) for k in PYSPARK_ARROW_DEFAULTS}
    for k, v in PYSPARK_ARROW_DEFAULTS.items():
        spark.conf.set(k, v)
    try:
        for table in tables:
            spark.createDataFrame(table).write.mode("append").parquet(path)
    finally:
        for k, saved_value in saved.items():
            if saved_value is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, saved_value)


def run_sink(sink: SparkGroupSink, state_dir: Path, appends: list[PartitionAppend], appends_per_request: int) -> None:
    """The persister over ``sink``, fed ``appends`` a request at a time, until all are committed."""
    c = ServerConfig()
    wal = WriteAheadLog(state_dir / "wal")
    wal.open()
    persister = BatchingPersister(
        sink, wal, StateStore(state_dir), Checkpoint(),
        FlushPolicy(c.batch_max_records, c.batch_max_bytes, c.table_commit_interval_ms),
        ack_on="wal", max_buffer_bytes=c.buffer_memory,
    )

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(persister.run)
            for i in range(0, len(appends), appends_per_request):
                await persister.wait_for_capacity()
                persister.append(appends[i:i + appends_per_request])
                await trio.lowlevel.checkpoint()
            persister.close()
            await persister.wait_closed()

    try:
        trio.run(main)
    finally:
        wal.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records-per-write", type=int, default=100_000, help="rows per naive write")
    parser.add_argument("--writes", type=int, default=3, help="naive writes per round (the sink gets the same records)")
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--batch-records", type=int, default=1000, help="records per RecordBatch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spark-master", default="local[*]")
    parser.add_argument("--out", type=Path, default=Path("bench-results/spark-write"))
    args = parser.parse_args(argv)
    console = Console()

    from pipeline.persist.group_sink import SparkGroupSink
    from pipeline.persist.spark_sink import build_spark_session, read_records
    from pipeline.table.catalog import catalog_conf

    records = args.records_per_write * args.writes
    batches = build_batches(records, args.record_bytes, args.batch_records)
    payload_bytes = sum(args.record_bytes + len(b"key-%d" % i) for i in range(records))
    per_write = args.records_per_write // args.batch_records
    naive_tables = [appends_to_table(to_appends(batches[i:i + per_write], args.batch_records, "naive"))
                    for i in range(0, len(batches), per_write)]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="pipeline-spark-write-bench-") as tmp:
        tmp_path = Path(tmp)
        data = tmp_path / "data"
        spark = build_spark_session(args.spark_master, app_name="pipeline-spark-write-bench", conf=catalog_conf(data))
        sink = SparkGroupSink(data, spark=spark, state_dir=tmp_path / "state")
        try:
            sink.start()
            console.print("warming up both paths (one write each) ...")
            run_naive(spark, naive_tables[:1], str(tmp_path / "naive"))
            run_sink(sink, tmp_path / "warmup", to_appends(batches[:per_write], args.batch_records, "warmup"), 1)
            for r in range(args.rounds):
                result: dict = {"round": r, "load_1m": os.getloadavg()[0]}
                order = ("naive", "sink") if r % 2 == 0 else ("sink", "naive")
                for side in order:
                    cpu0, t0 = tree_cpu_s(), time.perf_counter()
                    if side == "naive":
                        run_naive(spark, naive_tables, str(tmp_path / "naive"))
                    else:
                        run_sink(sink, tmp_path / f"state-{r}", to_appends(batches, args.batch_records, f"bench-{r}"), 1)
                    seconds, cpu = time.perf_counter() - t0, tree_cpu_s() - cpu0
                    result[side] = {"seconds": seconds, "mb_per_s": payload_bytes / seconds / 1e6, "cpu_s": cpu}
                result["ratio"] = result["sink"]["mb_per_s"] / result["naive"]["mb_per_s"]
                result["cpu_ratio"] = result["naive"]["cpu_s"] / max(result["sink"]["cpu_s"], 1e-9)
                rows.append(result)
                console.print(f"round {r}: naive {result['naive']['mb_per_s']:.1f} MB/s "
                              f"({result['naive']['cpu_s']:.1f} CPU s), sink {result['sink']['mb_per_s']:.1f} MB/s "
                              f"({result['sink']['cpu_s']:.1f} CPU s), ratio {result['ratio']:.2f}, "
                              f"load {result['load_1m']:.1f}")
            counts = {r["topic"]: r["count"] for r in
                      read_records(spark).where("topic like 'bench-%'").groupBy("topic").count().collect()}
            lost_or_duplicated = {t: n for t, n in counts.items() if n != records}
            missing = [f"bench-{r}" for r in range(args.rounds) if f"bench-{r}" not in counts]
        finally:
            sink.stop()
            spark.stop()

    ratios = [r["ratio"] for r in rows]
    summary = {
        "naive_mb_per_s": _spread([r["naive"]["mb_per_s"] for r in rows]),
        "sink_mb_per_s": _spread([r["sink"]["mb_per_s"] for r in rows]),
        "ratio": _spread(ratios),
        "naive_cpu_s": _spread([r["naive"]["cpu_s"] for r in rows]),
        "sink_cpu_s": _spread([r["sink"]["cpu_s"] for r in rows]),
    }
    verified = not lost_or_duplicated and not missing
    result_doc = {
        "config": vars(args) | {"out": str(args.out)},
        "records_per_round": records,
        "payload_bytes_per_round": payload_bytes,
        "rounds": rows,
        "summary": summary,
        "target_ratio": TARGET_RATIO,
        "met": verified and summary["ratio"]["median"] >= TARGET_RATIO,
        "verified": {"ok": verified, "wrong_counts": lost_or_duplicated, "missing_topics": missing},
        "command": "python -m pipeline.bench.spark_write_bench " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "spark_write_results.json").write_text(json.dumps(result_doc, indent=2))
    out = Table(title=f"table side vs naive Spark loop: {args.rounds} rounds of {records:,} x {args.record_bytes} B")
    for col in ("side", "MB/s median", "min", "max", "CPU s median"):
        out.add_column(col)
    for side in ("naive", "sink"):
        s, c = summary[f"{side}_mb_per_s"], summary[f"{side}_cpu_s"]
        out.add_row(side, f"{s['median']:.1f}", f"{s['min']:.1f}", f"{s['max']:.1f}", f"{c['median']:.1f}")
    console.print(out)
    console.print(f"sink / naive: median {summary['ratio']['median']:.2f} (min {summary['ratio']['min']:.2f}, "
                  f"max {summary['ratio']['max']:.2f}); target >= {TARGET_RATIO}: "
                  f"{'[green]met[/]' if result_doc['met'] else '[red]not met[/]'}; every record once: "
                  f"{'[green]yes[/]' if verified else f'[red]no[/] {lost_or_duplicated} missing {missing}'}")
    console.print(f"results: {args.out / 'spark_write_results.json'}")
    return 0 if verified else 1


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


if __name__ == "__main__":
    raise SystemExit(main())
