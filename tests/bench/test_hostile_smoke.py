"""``pipeline bench --hostile`` end to end, very short: a real server (Spark), good producers, every hostile case."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.bench_smoke]


def test_hostile_bench_smoke(tmp_path):
    out = tmp_path / "hostile"
    # 2 x 5 s of load (the shortest --duration); one 2,000-connection burst (two waves of 1,000, twice
    # the server's max.connections: 10,000 took ~4.4 s, during which the other lanes open nothing, so
    # their first round ended that much later); a short memory-attack round (each lane completes its
    # first round, every case once, past the phase if need be).
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "bench", "--hostile", "--duration", "5",
                           "--memory-attack-connections", "3", "--burst-connections", "2000", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)  # a loaded CI machine: ~200 s to start Spark
    results = json.loads((out / "results.json").read_text())
    checks = results["checks"]
    assert proc.returncode == 0, (checks["failures"], proc.stdout[-3000:], proc.stderr[-3000:])

    assert checks["ok"] and checks["table_verified"]
    assert checks["acked_records_lost"] == 0
    for phase in ("clean", "hostile"):
        v = results["phases"][phase]["verification"]
        assert v["violations"] == 0 and v["table"]["expected"] > 0
        assert v["table"]["rows"] == v["table"]["expected"]
        assert results["phases"][phase]["figures"]["latency_ms"]["p99"] > 0
    assert checks["p99_ratio"] is not None and checks["p99_ms"]["clean"] > 0

    cases = {c["case"]: c for c in results["cases"]}
    for name in ("size: negative", "size: over socket.request.max.bytes", "size: larger than the pool",
                 "slow: frame never completed", "header: truncated inside the client id",
                 "api key: unknown (9999)", "api version: Produce v99", "topic: invalid names in Metadata",
                 "topic: Produce to invalid names", "batch: bad CRC", "batch: magic 1", "batch: wrong record count",
                 "batch: truncated records", "batch: unknown codec 7", "batch: length too long",
                 "body: records length lies", "slow: 1 byte at a time", "slow: never reads its responses",
                 "burst: 1000-connection waves opened and dropped",
                 "memory: many connections stalling in big frames"):
        assert name in cases, name
    for c in results["cases"]:
        assert c["executed"] >= 1 and c["as_expected"] == c["executed"], c
    assert checks["unexpected_answers"] == 0
    assert checks["largest_burst"] == 2000 > results["server"]["config"]["max_connections"]

    rss = results["rss"]
    assert rss["samples"] > 10 and 0 < rss["peak"] <= rss["bound"] == results["memory_bound"]["total"]
    assert checks["rss_under_bound"]
    assert results["checks"]["hostile_table"]["missing"]["count"] == 0
    assert (out / "rss_over_time.png").stat().st_size > 1000
    assert "| phase |" in (out / "summary.md").read_text()
