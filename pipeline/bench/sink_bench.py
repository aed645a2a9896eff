"""Persister benchmark: the Spark sink's sustained records/s against a raw Spark write loop.

Two measurements on the same Spark session, the same flush size and the same
records:

* **raw**: a pre-built Arrow table written with
  ``spark.createDataFrame(table).write.mode("append").partitionBy("topic").parquet(path)``
  in a loop: the ceiling of what any Spark sink can do on this machine.
* **sink**: the real ``BatchingPersister`` (WAL group commit, then Spark
  flushes that decode RecordBatch v2 to Arrow while the previous flush is
  written), fed appends as fast as it accepts them, from the first append to
  the last record committed to the table.

Target (issue: persister production-grade): sink >= 80 % of raw.

    python -m pipeline.bench.sink_bench --out bench-results/sink
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import trio
from kafka.record.default_records import DefaultRecordBatchBuilder
from rich.console import Console
from rich.table import Table

from pipeline.persist.accumulator import FlushPolicy
from pipeline.table.arrow import appends_to_table
from pipeline.log.batch import PartitionAppend
from pipeline.persist.persister import BatchingPersister
from pipeline.log.checkpoint import Checkpoint, StateStore
from pipeline.log.wal import WriteAheadLog

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from pipeline.persist.persister import GroupSink

TARGET_FRACTION = 0.80


def build_batches(records: int, record_bytes: int, batch_records: int) -> list[bytes]:
    """RecordBatch v2 bytes: ``records`` records of ``record_bytes`` in batches of ``batch_records``."""
    value = b"v" * record_bytes
    batches = []
    for start in range(0, records, batch_records):
        n = min(batch_records, records - start)
        b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                      producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
        for i in range(n):
            b.append(i, timestamp=1_700_000_000_000 + start + i, key=b"key-%d" % ((start + i) % 100),
                     value=value, headers=[])
        batches.append(bytes(b.build()))
    return batches


def flush_appends(batches: list[bytes], batch_records: int, flush_index: int, partitions: int) -> list[PartitionAppend]:
    """One flush's worth of appends, spread over partitions, offsets continuing from earlier flushes."""
    per_partition: dict[int, int] = {}
    appends = []
    for i, raw in enumerate(batches):
        p = i % partitions
        base = flush_index * (len(batches) // partitions + 1) * batch_records + per_partition.get(p, 0)
        per_partition[p] = per_partition.get(p, 0) + batch_records
        appends.append(PartitionAppend("bench", p, base, raw, batch_records, 0))
    return appends


def run_raw(spark: SparkSession, table: pa.Table, path: str, flushes: int) -> float:
    """Seconds for ``flushes`` raw Spark writes of ``table``."""
    started = time.perf_counter()
    for _ in range(flushes):
        spark.createDataFrame(table).write.mode("append").partitionBy("topic").parquet(path)
    return time.perf_counter() - started


def run_sink(sink: GroupSink, data_dir: Path, flushes: list[list[PartitionAppend]], records_per_flush: int) -> float:
    """Seconds from the first append to the last record committed, through the real persister."""
    wal = WriteAheadLog(data_dir / "_pipeline" / "wal")
    wal.open()
    persister = BatchingPersister(
        sink, wal, StateStore(data_dir / "_pipeline"), Checkpoint(),
        FlushPolicy(max_records=records_per_flush, max_bytes=1 << 40, linger_ms=60_000),
        ack_on="wal", max_buffer_bytes=1 << 40,
    )

    async def main() -> float:
        async with trio.open_nursery() as nursery:
            await nursery.start(persister.run)
            started = time.perf_counter()
            for appends in flushes:
                await persister.wait_for_capacity()
                persister.append(appends)
                await trio.lowlevel.checkpoint()
            persister.close()
            await persister.wait_closed()
            return time.perf_counter() - started

    try:
        return trio.run(main)
    finally:
        wal.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records-per-flush", type=int, default=100_000)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--batch-records", type=int, default=500, help="records per producer RecordBatch")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--flushes", type=int, default=6)
    parser.add_argument("--spark-master", default="local[*]")
    parser.add_argument("--out", type=Path, default=Path("bench-results/sink"))
    args = parser.parse_args(argv)
    console = Console()

    from pipeline.persist.group_sink import SparkGroupSink
    from pipeline.persist.spark_sink import build_spark_session, read_records
    from pipeline.table.catalog import catalog_conf

    batches = build_batches(args.records_per_flush, args.record_bytes, args.batch_records)
    flushes = [flush_appends(batches, args.batch_records, k, args.partitions) for k in range(args.flushes)]
    records = args.records_per_flush * args.flushes
    with tempfile.TemporaryDirectory(prefix="pipeline-sink-bench-") as tmp:
        tmp_path = Path(tmp)
        spark = build_spark_session(args.spark_master, app_name="pipeline-sink-bench",
                                    conf=catalog_conf(tmp_path / "sink"))
        try:
            table = appends_to_table(flushes[0])
            decode_started = time.perf_counter()
            appends_to_table(flushes[1 % len(flushes)])
            decode_s = time.perf_counter() - decode_started
            console.print("warming up the JVM ...")
            run_raw(spark, table, str(tmp_path / "warmup"), 2)
            raw_s = run_raw(spark, table, str(tmp_path / "raw"), args.flushes)

            group_sink = SparkGroupSink(tmp_path / "sink", spark=spark)
            group_sink.start()
            sink_s = run_sink(group_sink, tmp_path / "sink", flushes, args.records_per_flush)
            group_sink.stop()
            stored = read_records(spark).count()
            if stored != records:
                raise SystemExit(f"sink stored {stored} records, expected {records}")
        finally:
            spark.stop()

    raw_rate, sink_rate = records / raw_s, records / sink_s
    fraction = sink_rate / raw_rate
    result = {
        "config": vars(args) | {"out": str(args.out)},
        "records": records,
        "raw": {"seconds": raw_s, "records_per_s": raw_rate},
        "sink": {"seconds": sink_s, "records_per_s": sink_rate},
        "decode_seconds_per_flush": decode_s,
        "raw_write_seconds_per_flush": raw_s / args.flushes,
        "fraction_of_raw": fraction,
        "target": TARGET_FRACTION,
        "met": fraction >= TARGET_FRACTION,
        "command": "python -m pipeline.bench.sink_bench " + " ".join(argv or []),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sink_results.json").write_text(json.dumps(result, indent=2))
    out = Table(title=f"Spark sink vs raw loop: {args.flushes} flushes x {args.records_per_flush} records "
                      f"of {args.record_bytes} B")
    for col in ("path", "seconds", "records/s", "per flush"):
        out.add_column(col)
    out.add_row("raw createDataFrame(arrow).write", f"{raw_s:.2f}", f"{raw_rate:,.0f}",
                f"{raw_s / args.flushes * 1000:.0f} ms write")
    out.add_row("pipeline persister (WAL + decode + write)", f"{sink_s:.2f}", f"{sink_rate:,.0f}",
                f"{decode_s * 1000:.0f} ms decode (overlapped)")
    console.print(out)
    console.print(f"sink = {fraction:.0%} of raw; target >= {TARGET_FRACTION:.0%}: "
                  f"{'[green]met[/]' if result['met'] else '[red]not met[/]'}")
    console.print(f"results: {args.out / 'sink_results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
