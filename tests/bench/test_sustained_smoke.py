"""``pipeline bench --sustained --smoke --value-format avro`` end to end, one run for both forms: a real
server (Spark, its Schema Registry), real librdkafka producers, the naive Spark loop in its own JVM;
the raw phase, then on the same server the same load as registry-framed Avro into a typed table. Every
acknowledged record is checked against its table (raw and typed), no dead letters, both MB/s, the
ratio to the naive loop and typed / raw."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.bench_smoke]

COMMIT_FAST = "--table-commit-interval-ms=500"
"""The run waits for the table to hold everything (after the warm-up, after each load): with the
server's default 10 s commit interval each wait is up to 10 s."""


# The bench starts its own server: time to listening and to ready are among its figures.
def test_sustained_bench_smoke_raw_then_avro(tmp_path):
    argv = ["--sustained", "--smoke", "--value-format", "avro", "--out", str(tmp_path), f"--server-arg={COMMIT_FAST}"]
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "bench", *argv], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    r = json.loads((tmp_path / "results.json").read_text())
    assert r["error"] is None and r["failures"] == []
    summary = (tmp_path / "summary.md").read_text()
    assert f"Reproduce: `pipeline bench {' '.join(argv)}`" in proc.stdout

    # the raw phase against the naive Spark loop
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
    assert "| ratio sustained / naive |" in summary

    # the typed phase: registry Avro into a typed table on the same server
    typed = r["typed"]
    assert "--schema-registry-listeners" in r["server"]["command"]
    assert typed["registry"].startswith("http://127.0.0.1:") and typed["schema_id"] > 0
    tf, tv, counts = typed["figures"], typed["verification"], typed["counts"]
    # the load's 10,000 records and the warm-up's 5,000, all in the typed table, all decoded
    assert tf["records_sent"] == tf["records_acked"] == 10_000
    assert tv["rows"] == tv["expected"] == 15_000
    assert tv["lost"] == tv["duplicated"] == tv["violations"] == tv["unacknowledged"] == 0
    assert counts == {"rows": 15_000, "decoded": 15_000, "dead_letters": 0}
    assert tf["bytes_acked"] == f["bytes_acked"]  # values of the same size: the MB/s compare like for like
    assert tf["sustained_mb_per_s"] > 0 and tf["acked_mb_per_s"] > 0 and tf["cpu_s"]["decode worker"] > 0
    assert f["typed_sustained_mb_per_s"] == tf["sustained_mb_per_s"]
    assert f["typed_sustained_ratio"] == pytest.approx(tf["sustained_mb_per_s"] / f["sustained_mb_per_s"])
    assert f["typed_acked_ratio"] == pytest.approx(tf["acked_mb_per_s"] / f["acked_mb_per_s"])
    assert "| **acknowledged and queryable MB/s** |" in summary and "| typed / raw |" in summary
