"""``pipeline bench --freshness`` end to end, CI size: a real server (Spark, Spark Connect), two real
librdkafka load producers and the probe; each probe seen by the first live query after its
acknowledgement, every acknowledged
record exactly once through the live view (right after the load, and again once the table holds
everything) and through the table."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.bench_smoke]

ARGV = ["--freshness", "--duration", "6", "--warmup", "1", "--server-arg=--table-commit-interval-ms=2500"]
"""6 s of load, 1 s of it not counted; 2.5 s commits instead of the default 10 s so that the
warm-up (the first commit) and the drain after the load stay short, yet far enough above a live
query (~0.5 s) that the table's lag stays the larger."""


def test_freshness_bench_smoke(tmp_path):
    argv = [*ARGV, "--out", str(tmp_path)]
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "bench", *argv], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    r = json.loads((tmp_path / "results.json").read_text())
    assert r["error"] is None and r["failures"] == []
    assert f"Reproduce: `pipeline bench {' '.join(argv)}`" in proc.stdout
    assert "| live view `pipeline.records_live` |" in proc.stdout

    live, table = r["probes"]["live_ms"], r["probes"]["table_ms"]
    assert live["count"] > 0 and table["count"] > 0
    assert r["probes"]["live_missed"] == r["probes"]["table_missed"] == 0
    # The live view's behaviour: each counted probe was returned by the first live query after its
    # acknowledgement (the tail is read up to the last stable offset at planning). Which lag is the
    # smaller is the benchmark's figure (docs/benchmarks.md), not this check's: at this size the
    # live queries run while the JVM still compiles them (a CI run: live p50 1.57 s, table 1.41 s
    # with 2.5 s commits).
    assert r["probes"]["live_after_more_than_one_query"] == 0, live
    assert 0 < live["p50"] and 0 < table["p50"]
    assert live["p50"] <= live["p99"] <= live["max"] and table["p50"] <= table["p99"] <= table["max"]

    load = r["load"]
    assert load["records_acked"] == load["records_sent"] > 0 and load["records_per_s"] > 0
    for name in ("live_at_end_of_load", "table", "live"):
        v = r["verification"][name]
        # the load's records and the warm-up's one
        assert v["rows"] == v["expected"] == load["records_acked"] + 1, name
        assert v["lost"] == v["duplicated"] == v["violations"] == 0, name
    files = r["table_files"]
    assert files["files"] > 0 and files["partition_hours"] >= 1 and r["commits_in_load"] > 0
    assert r["server"]["exit_code"] == 0
