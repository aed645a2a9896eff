"""Throughput of ``pipeline serve --brokers N`` for several N, one shared Spark Connect server each.

    python -m pipeline.bench.brokers_bench --brokers 1,2 --producers 4 --records 400000

For each N: a fresh data directory and Spark Connect server, ``pipeline serve
--brokers N --spark-remote ...`` (N = 1 is the plain server, writing through
Connect as well, so only the number of brokers differs), a topic of
``--partitions`` partitions, a warm-up, then ``--producers`` confluent-kafka
producer processes (acks=1, linger.ms=5) sending ``--records`` records of
``--record-bytes`` in all, as fast as they are acknowledged. Reported per N:
records/s over the load window (first send to last acknowledgement) and the
CPU seconds each broker process used in it. Results: ``OUT/brokers.json``.

The figure means something only on a machine with at least N + 1 idle cores
(the producers and the Connect server's JVM need theirs).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

LISTENING = re.compile(r"listening on (\S+):(\d+)")
TOPIC = "bench-brokers"


def _produce(bootstrap: str, count: int, record_bytes: int, index: int, out) -> None:
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5,
                                         "batch.num.messages": 1000, "queue.buffering.max.messages": 200_000})
    value = b"v" * record_bytes
    failed = []

    def on_delivery(err, _msg):
        if err is not None:
            failed.append(str(err))

    started = time.time()
    for i in range(count):
        while True:
            try:
                producer.produce(TOPIC, key=f"{index}-{i % 1000}".encode(), value=value, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(600)
    out.put((started, time.time(), left, len(failed)))


def _start(cmd: list[str], n: int, log_path: Path, timeout_s: float = 600.0):
    log = open(log_path, "ab")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            process_group=0)
    addresses: list[str] = []
    lines: list[str] = []

    def read() -> None:
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode(errors="replace")
            lines.append(line)
            m = LISTENING.search(line)
            if m:
                addresses.append(f"{m.group(1)}:{m.group(2)}")

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while len(addresses) < n:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"server did not start; log {log_path}")
        time.sleep(0.5)
    return proc, addresses, log


def _broker_processes(proc, n: int):
    import psutil

    root = psutil.Process(proc.pid)
    if n == 1:
        return [root]
    return [c for c in root.children() if "--node-id" in c.cmdline()]


def run_one(n: int, args: argparse.Namespace, work: Path) -> dict:
    import psutil
    from confluent_kafka.admin import AdminClient, NewTopic

    from pipeline.persist.spark_cluster import ConnectServer
    from pipeline.table.catalog import catalog_conf

    data = work / f"brokers-{n}"
    with ConnectServer(data / "_pipeline" / "spark-connect", conf=catalog_conf(data), timeout_s=600) as connect:
        cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--brokers", str(n), "--listen", "127.0.0.1:0",
               "--data-dir", str(data), "--spark-remote", connect.url, *args.server_arg]
        proc, addresses, log = _start(cmd, n, work / f"brokers-{n}.log")
        admin = None
        try:
            bootstrap = ",".join(addresses)
            admin = AdminClient({"bootstrap.servers": bootstrap})
            for f in admin.create_topics([NewTopic(TOPIC, args.partitions, 1)]).values():
                f.result(60)
            ctx = multiprocessing.get_context("spawn")
            out = ctx.Queue()
            _produce(bootstrap, 5000, args.record_bytes, -1, out)  # warm-up: metadata, connections, first writes
            out.get()
            brokers = _broker_processes(proc, n)
            cpu0 = [sum(p.cpu_times()[:2]) for p in brokers]
            per = args.records // args.producers
            workers = [ctx.Process(target=_produce, args=(bootstrap, per, args.record_bytes, i, out))
                       for i in range(args.producers)]
            for w in workers:
                w.start()
            results = [out.get(timeout=900) for _ in workers]
            for w in workers:
                w.join()
            cpu = [round(sum(p.cpu_times()[:2]) - c, 2) for p, c in zip(brokers, cpu0)]
            window = max(r[1] for r in results) - min(r[0] for r in results)
            undelivered = sum(r[2] + r[3] for r in results)
            records = per * args.producers
            return {"brokers": n, "records": records, "seconds": round(window, 2),
                    "records_per_s": round(records / window),
                    "mb_per_s": round(records * args.record_bytes / window / 1e6, 2), "undelivered": undelivered,
                    "broker_cpu_s": cpu, "cpu_s_per_m_records": round(sum(cpu) / records * 1e6, 2),
                    "cpus": psutil.cpu_count(), "load_average": os.getloadavg()[0]}
        finally:
            del admin  # its connections go before the brokers (no "connection refused" noise)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(300)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.bench.brokers_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--brokers", default="1,2", help="broker counts to run (default 1,2)")
    p.add_argument("--producers", type=int, default=4, help="producer processes (default 4)")
    p.add_argument("--records", type=int, default=400_000, help="records in all per run (default 400000)")
    p.add_argument("--record-bytes", type=int, default=100, help="value bytes per record (default 100)")
    p.add_argument("--partitions", type=int, default=8, help="partitions of the topic (default 8)")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="where brokers.json goes")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG", help="extra `pipeline serve` argument")
    args = p.parse_args(argv)
    command = "python -m pipeline.bench.brokers_bench " + " ".join(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="brokers-bench-") as tmp:
        for n in (int(x) for x in args.brokers.split(",")):
            row = run_one(n, args, Path(tmp))
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "brokers.json").write_text(json.dumps(rows, indent=2))
    base = rows[0]["records_per_s"] if rows else None
    print(f"`{command}`\n\n| brokers | records/s | MB/s | x {rows[0]['brokers'] if rows else ''} broker(s) | "
          "broker CPU s | CPU s per M records | undelivered |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['brokers']} | {r['records_per_s']:,} | {r['mb_per_s']} | {r['records_per_s'] / base:.2f} | "
              f"{r['broker_cpu_s']} | {r['cpu_s_per_m_records']} | {r['undelivered']} |")
    return 1 if any(r["undelivered"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
