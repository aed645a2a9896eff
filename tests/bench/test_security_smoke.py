"""``pipeline bench --security --smoke`` end to end: one real server with three listeners, real clients."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeline.bench.security_bench import summarize, table_rows

pytestmark = [pytest.mark.slow, pytest.mark.bench_smoke]

COMMIT_FAST = "--table-commit-interval-ms=500"


def test_security_bench_smoke(tmp_path):
    out = tmp_path / "security"
    # Each phase starts once the persister is empty (a table commit): the server's default
    # 10 s commit interval made those waits most of the run; 500 ms keeps them to about a second.
    # --duration 1: each protocol's latency phase is 300/s for 1 s instead of the preset's 2 s.
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "bench", "--security", "--smoke", "--out", str(out),
                           "--duration", "1", f"--server-arg={COMMIT_FAST}"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert "error" not in results and not results["failed"]
    assert [r["protocol"] for r in results["runs"]] == ["PLAINTEXT", "SSL", "SASL_SSL"]
    for run in results["runs"]:
        t, s = run["throughput"], run["latency"]
        assert t["records"] == 3000 and not t["errors"] and not t["timed_out"]
        assert s["records"] == 300 and not s["errors"] and not s["timed_out"]  # 300/s for 1 s
        assert 0 < t["latency_ms"]["p50"] <= t["latency_ms"]["p99"] and run["server_cpu_s"] > 0
        assert s["first_ack_ms"] > 0
        assert run["table_wait_s"] is not None  # each phase started with the persister empty
    rows = {r["protocol"]: r for r in results["summary"]}
    assert rows["PLAINTEXT"]["records_per_s_vs_plaintext"] == 1.0
    assert all(r["ok"] and r["records_per_s"] > 0 and r["p99_ms"] > 0 for r in rows.values())
    assert results["server"]["exit_code"] == 0
    summary = (out / "summary.md").read_text()
    assert "pipeline bench --security --smoke" in summary and "| SASL_SSL |" in summary
    # the run's password is in neither the results nor the server log
    assert "sasl.password" not in json.dumps(results)
    log = (out / "logs" / "server.log").read_text()
    assert "authenticated as User:bench (SCRAM-SHA-512)" in log


def _run(protocol: str, rps: float, p99: float | None, errors: list[str] | None = None) -> dict:
    figures = {"records_per_s": rps, "mb_per_s": rps / 1000, "records": 1000, "errors": errors or [],
               "timed_out": False, "first_ack_ms": 10.0,
               "latency_ms": {} if p99 is None else {"p50": p99 / 2, "p99": p99, "p99.9": p99 * 2}}
    return {"protocol": protocol, "throughput": figures, "latency": figures, "server_cpu_s": 0.5}


def test_summarize_takes_the_median_and_compares_with_the_first_protocol():
    runs = [_run("PLAINTEXT", 100, 10), _run("SSL", 60, 30), _run("PLAINTEXT", 300, 20), _run("SSL", 90, 20),
            _run("PLAINTEXT", 200, 30), _run("SSL", 80, 25, errors=["timed out"])]
    plain, ssl = summarize(runs, ["PLAINTEXT", "SSL"])
    assert plain["records_per_s"] == 200 and plain["p99_ms"] == 20 and plain["rounds"] == 3 and plain["ok"]
    assert ssl["records_per_s"] == 80 and ssl["records_per_s_vs_plaintext"] == pytest.approx(0.4)
    assert ssl["p99_ms"] == 25 and ssl["p99_ms_vs_plaintext"] == pytest.approx(1.25)
    assert ssl["server_cpu_us_per_record"] == 500 and not ssl["ok"]
    assert table_rows([plain, ssl])[1][3] == "0.40" and table_rows([plain, ssl])[1][-1] == "INCOMPLETE"


def test_summarize_without_latency_figures_says_so():
    (row,) = summarize([_run("SSL", 50, None)], ["SSL"])
    assert row["p99_ms"] is None and table_rows([row])[0][8] == "-"
