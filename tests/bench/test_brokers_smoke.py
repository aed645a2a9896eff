"""``pipeline bench --brokers 1,2`` end to end, CI size: one shared Spark Connect server per N, real producers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_brokers_bench_smoke(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "bench", "--brokers", "1,2", "--producers", "2",
                           "--brokers-records", "6000", "--partitions", "4", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = json.loads((tmp_path / "brokers.json").read_text())
    assert [r["brokers"] for r in rows] == [1, 2]
    for r in rows:
        assert r["records"] == 6000 and r["undelivered"] == 0
        assert r["records_per_s"] > 0 and r["mb_per_s"] > 0 and len(r["broker_cpu_s"]) == r["brokers"]
        assert r["cpu_s_per_m_records"] > 0
    assert "| brokers | records/s | MB/s |" in proc.stdout
    assert "python -m pipeline.bench.brokers_bench --brokers 1,2" in proc.stdout
