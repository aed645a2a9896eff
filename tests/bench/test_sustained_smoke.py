"""``pipeline bench --sustained --smoke`` end to end: a real server (Spark), real librdkafka producers,
the naive Spark loop in its own JVM, every acknowledged record checked against the table."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

COMMIT_FAST = "--table-commit-interval-ms=500"
"""The run waits twice for the table to hold everything (after the warm-up, after the load): with the
server's default 10 s commit interval each wait is up to 10 s."""


# The bench starts its own server: time to listening and to ready are among its figures.
def test_sustained_bench_smoke(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "bench", "--sustained", "--smoke", "--out",
                           str(tmp_path), f"--server-arg={COMMIT_FAST}"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    r = json.loads((tmp_path / "results.json").read_text())
    assert r["error"] is None and r["failures"] == []
    f, v = r["figures"], r["verification"]
    assert f["records_sent"] == f["records_acked"] == 10_000
    assert v["rows"] == v["expected"] == 10_000
    assert v["lost"] == v["duplicated"] == v["violations"] == v["unacknowledged"] == 0
    assert f["acked_mb_per_s"] > 0 and f["sustained_mb_per_s"] > 0 and f["naive_mb_per_s"] > 0
    assert f["ratio"] == pytest.approx(f["sustained_mb_per_s"] / f["naive_mb_per_s"])
    assert f["lag_to_queryable_s"] >= 0 and f["queryable_seconds"] >= f["ack_seconds"]
    assert {"front end", "decode worker", "JVM", "server total", "producers"} <= set(f["cpu_s"])
    assert f["cpu_s"]["front end"] > 0 and f["cpu_s"]["JVM"] > 0 and f["cpu_s"]["producers"] > 0
    assert f["cpu_s_per_m_records"]["server total"] == pytest.approx(f["cpu_s"]["server total"] / 10_000 * 1e6)
    assert 0 < r["server"]["listening_s"] <= r["server"]["startup_s"] and r["server"]["exit_code"] == 0
    assert r["naive"]["records"] == 10_000 and r["naive_exit_code"] == 0
    assert "| ratio sustained / naive |" in (tmp_path / "summary.md").read_text()
    assert f"Reproduce: `pipeline bench --sustained --smoke --out {tmp_path}" in proc.stdout
