"""The naive Spark write loop: the denominator of ``pipeline bench --sustained``.

A process of its own (its own JVM: it must not share the server's), driven over
stdin/stdout by ``pipeline.bench.sustained_bench``:

    python -m pipeline.bench.naive_spark --records-per-write 100000 --record-bytes 1024 --out DIR

It starts a plain ``local[*]`` Spark session (``NAIVE_CONF``: only loopback,
no UI, quiet logs, Arrow on; none of the pipeline's write-path settings),
builds one Arrow table of ``--records-per-write`` records shaped as the
pipeline's table rows (``pipeline.table.arrow.appends_to_table`` of RecordBatch
v2 built from the producers' keys and values, ``RandomValues``), writes it
twice untimed (JIT, first-write costs, as the server's warm-up) and prints
``READY``. On each line ``WRITE N`` it runs ``spark.createDataFrame(table).
write.mode("append").parquet(DIR/naive)`` N times and prints one JSON line
(``seconds``, ``records``, ``bytes``: value + key bytes written, ``writes``).
End of input ends it (Spark stopped, exit 0).

The loop is the issue's "plain Spark loop": ``createDataFrame(arrow_table).write.parquet``,
100,000 x 1 KiB per write, ``local[*]``, default Parquet settings (snappy).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

NAIVE_WRITE_RECORDS = 100_000
"""Records per naive write (the issue's loop: 100,000 x 1 KiB)."""
WARMUP_WRITES = 2
NAIVE_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}
"""Housekeeping only: the loop must stay the naive one, whatever the pipeline's own session tunes."""
TOPIC = "bench-sustained"
"""The topic of the sustained run; the naive loop's rows carry it too."""


class RandomValues:
    """Distinct random record values of ``record_bytes`` bytes: consecutive slices of one
    16 MiB random buffer (wrapping around), so no two values within 16 MiB repeat and
    neither Parquet's dictionary nor snappy finds structure a real payload would not have.
    """

    BUFFER_BYTES = 16 * 2**20

    def __init__(self, record_bytes: int, seed: int = 0) -> None:
        self.record_bytes = record_bytes
        self._buf = os.urandom(self.BUFFER_BYTES + record_bytes)
        self._span = self.BUFFER_BYTES // max(1, record_bytes)
        self._shift = seed * 7919

    def value(self, seq: int) -> bytes:
        """The value of record ``seq`` (``record_bytes`` bytes)."""
        start = ((seq + self._shift) % self._span) * self.record_bytes
        return self._buf[start:start + self.record_bytes]


def record_key(producer: int, seq: int) -> bytes:
    """The key of record ``seq`` of producer ``producer``: ``b"P-SEQ"`` (``parse_key`` reads it)."""
    return b"%d-%d" % (producer, seq)


def parse_key(key: bytes | None) -> tuple[int, int] | None:
    """(producer, seq) of a ``record_key``; None for any other key."""
    if not key:
        return None
    head, _, tail = key.partition(b"-")
    if not head.isdigit() or not tail.isdigit():
        return None
    return int(head), int(tail)


def build_table(records: int, record_bytes: int, partitions: int = 4, batch_records: int = 1000) -> pa.Table:
    """``records`` rows in the pipeline table's Arrow schema, keys and values as the sustained run's
    producers send them (producer 0, partitions round-robin per batch of ``batch_records``)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    from pipeline.log.batch import PartitionAppend
    from pipeline.table.arrow import appends_to_table

    values = RandomValues(record_bytes)
    now_ms = int(time.time() * 1000)
    appends = []
    next_offset = [0] * partitions
    for i, start in enumerate(range(0, records, batch_records)):
        n = min(batch_records, records - start)
        b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                      producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
        for j in range(n):
            b.append(j, timestamp=now_ms, key=record_key(0, start + j), value=values.value(start + j), headers=[])
        p = i % partitions
        appends.append(PartitionAppend(TOPIC, p, next_offset[p], bytes(b.build()), n, now_ms))
        next_offset[p] += n
    return appends_to_table(appends)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.bench.naive_spark", description=__doc__.split("\n\n")[0])
    p.add_argument("--records-per-write", type=int, default=NAIVE_WRITE_RECORDS)
    p.add_argument("--record-bytes", type=int, default=1024)
    p.add_argument("--out", type=Path, required=True, help="directory the loop writes Parquet into")
    p.add_argument("--master", default="local[*]")
    args = p.parse_args(argv)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(args.master).appName("pipeline-bench-naive")
    for key, value in NAIVE_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        table = build_table(args.records_per_write, args.record_bytes)
        nbytes = sum(len(k) for k in table.column("key").to_pylist()) + args.records_per_write * args.record_bytes
        path = str(args.out / "naive")
        for _ in range(WARMUP_WRITES):
            spark.createDataFrame(table).write.mode("append").parquet(str(args.out / "warmup"))
        print("READY", flush=True)
        for line in sys.stdin:
            command, _, count = line.strip().partition(" ")
            if command != "WRITE" or not count.isdigit():
                print(json.dumps({"error": f"unknown command {line.strip()!r}"}), flush=True)
                continue
            writes = int(count)
            started = time.perf_counter()
            for _ in range(writes):
                spark.createDataFrame(table).write.mode("append").parquet(path)
            seconds = time.perf_counter() - started
            print(json.dumps({"seconds": seconds, "writes": writes, "records": writes * args.records_per_write,
                              "bytes": writes * nbytes, "records_per_write": args.records_per_write,
                              "conf": NAIVE_CONF, "master": args.master}), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
