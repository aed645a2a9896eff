"""``pipeline bench --brokers N`` end to end, CI size: one shared Spark Connect server per N, real
librdkafka producers at default settings, 1 KiB records, ``--ack-on wal``.

Each N runs once in the module: N = 2 (the supervisor and two brokers) with confluent-kafka producers,
N = 1 (the plain server writing through Connect) with kcat producers. N = 1 with confluent-kafka
producers as well was a third Connect server and broker start-up for the server configuration the
kcat test runs; the confluent-kafka producing path does not depend on N and runs here at N = 2. A
run of several N (rows in N order, the "x N=1" column) is the renderer's, tests/bench/test_report_brokers.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.missing import need_command

pytestmark = [pytest.mark.slow, pytest.mark.bench_smoke]

COMMIT_FAST = "--table-commit-interval-ms=500"
"""Every N waits for the brokers' persisters to empty after the warm-up (a table commit): with the
server's default 10 s interval that wait was up to 10 s per N."""


# 20,000 records per N: windows of a few tenths of a second, long enough for the brokers' CPU
# (10 ms clock ticks) to be measured; with 6,000 a window of ~0.1 s could read 0.00 s.
def test_brokers_bench_smoke(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "bench", "--brokers", "2", "--producers", "2",
                           "--brokers-records", "20000", "--partitions", "2", "--out", str(tmp_path),
                           f"--server-arg={COMMIT_FAST}"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = json.loads((tmp_path / "brokers.json").read_text())
    assert [r["brokers"] for r in rows] == [2]
    for r in rows:
        assert r["ok"] and r["records"] == r["records_sent"] == 20000 and r["undelivered"] == 0, r
        assert r["record_bytes"] == 1024 and r["records_per_s"] > 0 and r["mb_per_s"] > 0
        assert 0 < r["latency_ms"]["p50"] <= r["latency_ms"]["p99"] <= r["latency_ms"]["p99.9"]
        assert len(r["broker_cpu_s"]) == r["brokers"] and r["cpu_s_per_m_records"] > 0
        assert r["peak_rss_mb"] > 0 and r["connect_peak_rss_mb"] > 0
        q = r["queryable"]  # ingest to queryable: every acknowledged record committed by the brokers
        assert q["seconds"] >= r["seconds"] and 0 < q["records_per_s"] <= r["records_per_s"]
        assert sum(q["flush_records"]) == 20000 and len(q["commit_s"]) == len(q["lock_wait_s"]) == 2
        assert all(c > 0 for c in q["commit_s"]) and q["broker_cores"] > 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["brokers"] == rows
    assert {t["target"].split(":")[0] for t in results["targets"]} >= {"end to end"}
    assert (tmp_path / "throughput_vs_brokers.png").stat().st_size > 1000
    assert "| brokers | records/s | MB/s |" in proc.stdout and "| brokers |" in (tmp_path / "summary.md").read_text()
    assert "python -m pipeline.bench.brokers_bench --brokers 2" in proc.stdout


def test_brokers_bench_with_kcat_producers(tmp_path):
    need_command("kcat", "kcat")
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "bench", "--brokers", "1", "--brokers-client", "kcat",
                           "--producers", "2", "--brokers-records", "20000", "--partitions", "2", "--out",
                           str(tmp_path), f"--server-arg={COMMIT_FAST}"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    [row] = json.loads((tmp_path / "brokers.json").read_text())
    assert row["ok"] and row["client"] == "kcat" and row["errors"] == [], row
    assert row["records"] == row["records_sent"] == 20000 and row["undelivered"] == 0
    assert row["records_per_s"] > 0 and row["mb_per_s"] == pytest.approx(row["records_per_s"] * 1024 / 1e6)
    assert row["latency_ms"] == {} and row["cpu_s_per_m_records"] > 0
    assert row["brokers"] == 1 and len(row["broker_cpu_s"]) == 1 and row["peak_rss_mb"] > 0
    assert row["connect_peak_rss_mb"] > 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["brokers"] == [row] and (tmp_path / "throughput_vs_brokers.png").stat().st_size > 1000
    assert "--client kcat" in proc.stdout
