"""``pipeline bench --sustained --smoke --value-format avro`` end to end: the raw phase, then on the
same server (with its Schema Registry) the same load as registry-framed Avro into a typed table,
every acknowledged record checked against that table, no dead letters, both MB/s and their ratio."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.bench.test_sustained_smoke import COMMIT_FAST

pytestmark = pytest.mark.slow


def test_sustained_bench_avro_smoke(tmp_path):
    argv = ["--sustained", "--smoke", "--value-format", "avro", "--out", str(tmp_path), f"--server-arg={COMMIT_FAST}"]
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "bench", *argv], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    r = json.loads((tmp_path / "results.json").read_text())
    assert r["error"] is None and r["failures"] == []
    f, typed = r["figures"], r["typed"]
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
    assert r["verification"]["rows"] == 10_000 and r["verification"]["violations"] == 0
    summary = (tmp_path / "summary.md").read_text()
    assert "| **acknowledged and queryable MB/s** |" in summary and "| typed / raw |" in summary
    assert f"Reproduce: `pipeline bench {' '.join(argv)}`" in proc.stdout
