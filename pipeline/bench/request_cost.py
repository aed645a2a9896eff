"""CPU per request of a running server under the bench's load (issue 13's A/B measurement).

usage::

    python -m pipeline.bench.request_cost PORT SERVER_PID [--acks 0] [--duration 5]
        [--connections 64] [--in-flight 5]

Runs the bench's raw load generator (``pipeline.bench.loadgen``, R=10
records of 64 B, 4 partitions, a fresh topic per run) against the server
listening on 127.0.0.1:PORT and prints requests/s, the load average, and the
CPU the server process used during the load: its own (the trio thread plus
its worker threads) in seconds and in microseconds per request, and its
children's (the Spark JVM, the decode worker) in seconds.

On a shared machine requests/s follows whatever else runs; CPU per request
much less so, which is why the before/after comparison of issue 13 alternates
runs against two servers (old and new code) and compares microseconds per
request. Start the servers as ``pipeline bench`` does
(``pipeline/bench/runner.py``, ``ServerConfiguration.serve_args``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil


def _cpu(process: psutil.Process) -> tuple[float, float]:
    """(the process's own CPU s, its children's CPU s)."""
    t = process.cpu_times()
    children = 0.0
    for child in process.children(recursive=True):
        try:
            c = child.cpu_times()
            children += c.user + c.system
        except psutil.Error:
            pass
    return t.user + t.system, children


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.bench.request_cost", description=__doc__.split("\n")[0])
    parser.add_argument("port", type=int)
    parser.add_argument("pid", type=int, help="the server's process id")
    parser.add_argument("--acks", type=int, default=0)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of load")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--in-flight", type=int, default=5)
    args = parser.parse_args(argv)
    spec = {"host": "127.0.0.1", "port": args.port, "topic": f"cost-{int(time.time() * 1000)}-acks{args.acks}",
            "connections": args.connections, "in_flight": args.in_flight, "records": 10, "record_bytes": 64,
            "partitions": 4, "acks": args.acks, "max_requests": 400_000, "duration_s": args.duration}
    server = psutil.Process(args.pid)
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        proc = subprocess.Popen([sys.executable, "-m", "pipeline.bench.loadgen", str(spec_path), str(result_path),
                                 "--handshake"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdin is not None and proc.stdout is not None
        before = after = (0.0, 0.0)
        load = os.getloadavg()[0]
        for line in proc.stdout:
            if line.strip() == "READY":  # connected and set up: measure from here
                before, load = _cpu(server), os.getloadavg()[0]
                proc.stdin.write("GO\n")
                proc.stdin.close()
            elif line.strip() == "END":
                after = _cpu(server)
        if proc.wait() != 0:
            print(f"load generator exited with {proc.returncode}", file=sys.stderr)
            return 1
        result = json.loads(result_path.read_text())
    sent, elapsed = result["sent"], result["elapsed_s"]
    own, children = after[0] - before[0], after[1] - before[1]
    print(f"{sent} requests in {elapsed:.2f} s: {sent / elapsed:.0f} req/s (acks={args.acks}); load average {load:.2f}")
    print(f"server CPU {own:.2f} s ({own / max(sent, 1) * 1e6:.0f} us/request), children {children:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
