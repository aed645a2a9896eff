"""WAL-mode latency benchmark: produce p99 at half of the maximum sustained throughput.

With ``--ack-on wal`` a produce is answered after its records are fsynced in
the write-ahead log. This benchmark starts one multiqueue server in that mode,
measures its maximum sustained request rate with the closed-loop raw load
generator (C connections, K in flight, acks=-1), then offers half that rate
(a token bucket in the load generator) and reports the latency percentiles.

Target (issue: persister production-grade): p99 <= 20 ms at half of the maximum.

    python -m pipeline.bench.wal_latency --out bench-results/wal-latency
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pipeline.bench.loadgen import LoadSpec
from pipeline.bench.processes import ManagedProcess
from pipeline.bench.runner import figures, run_load

TARGET_P99_MS = 20.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--in-flight", type=int, default=5)
    parser.add_argument("--records-per-request", type=int, default=10)
    parser.add_argument("--record-bytes", type=int, default=64)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--duration", type=float, default=6.0, help="seconds of load per phase")
    parser.add_argument("--out", type=Path, default=Path("bench-results/wal-latency"))
    args = parser.parse_args(argv)
    console = Console()
    args.out.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="pipeline-wal-latency-") as tmp:
        cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--listen", "127.0.0.1:0", "--data-dir",
               str(Path(tmp) / "data"), "--mode", "multiqueue", "--queues", str(args.queues),
               "--ack-on", "wal", "--num-partitions", str(args.partitions)]
        server = ManagedProcess("wal-server", cmd, args.out / "server.log").start()
        try:
            def phase(name: str, rate: float, requests: int) -> dict:
                spec = LoadSpec(host="127.0.0.1", port=server.port, topic=f"wal-{name}",
                                connections=args.connections, in_flight=args.in_flight,
                                records=args.records_per_request, record_bytes=args.record_bytes,
                                partitions=args.partitions, acks=-1, max_requests=requests,
                                duration_s=args.duration, rate=rate)
                outcome = run_load(spec, args.out / "runs", name, None)
                if outcome.error:
                    raise SystemExit(outcome.error)
                return figures(outcome, None)

            console.print("warming up ...")
            phase("warmup", 0.0, 2_000)
            console.print("phase 1: maximum sustained throughput (closed loop)")
            peak = phase("max", 0.0, 200_000)
            half_rate = peak["requests_per_s"] / 2
            console.print(f"phase 2: {half_rate:,.0f} requests/s (half of the maximum)")
            half = phase("half", half_rate, int(half_rate * args.duration) + 1)
        finally:
            server.stop()

    p99 = half["latency_ms"]["p99"]
    result = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "max": peak,
        "half": half,
        "target_p99_ms": TARGET_P99_MS,
        "met": p99 <= TARGET_P99_MS,
        "command": "python -m pipeline.bench.wal_latency " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    (args.out / "wal_latency.json").write_text(json.dumps(result, indent=2))
    table = Table(title=f"--ack-on wal, multiqueue q{args.queues}, C={args.connections} K={args.in_flight}, "
                        f"{args.records_per_request} x {args.record_bytes} B per request")
    for col in ("phase", "req/s", "rec/s", "p50 ms", "p99 ms", "p99.9 ms"):
        table.add_column(col)
    for name, f in (("max (closed loop)", peak), ("half of max", half)):
        lat = f["latency_ms"] or {}
        table.add_row(name, f"{f['requests_per_s']:,.0f}", f"{f['records_per_s']:,.0f}",
                      f"{lat.get('p50', 0):.2f}", f"{lat.get('p99', 0):.2f}", f"{lat.get('p99.9', 0):.2f}")
    console.print(table)
    console.print(f"p99 at half of the maximum = {p99:.2f} ms; target <= {TARGET_P99_MS:g} ms: "
                  f"{'[green]met[/]' if result['met'] else '[red]not met[/]'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
