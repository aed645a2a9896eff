"""``pipeline bench --smoke`` end to end: real servers (Spark), load, verification, report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.bench_smoke]

PLOTS = ("throughput_vs_connections.png", "latency_percentiles.png", "throughput_vs_queues.png",
         "queue_depth.png")


# C=1 beside the preset's C=4 brings in the headline comparison (C=1, K=5, acks=-1 sized by completed
# requests, repeats interleaved between baseline and multiqueue), at CI size: 2 repeats of 2 requests;
# C=4 acks=0 the acks=0 runs, on multiqueue each paired with an echo-ceiling run just before it.
# --duration 0.5 instead of the preset's 1.5 s: the nine runs bounded by time (the three warm-ups and
# the unpaired shape runs; the headline's, the ceiling's and the paired acks=0 runs stop at their
# request counts)
# each end a second sooner. What is checked is that every run completes, is measured and verified,
# not how much it sends.
def test_bench_smoke(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "bench", "--smoke", "--out", str(out),
                           "--shapes", "1:5:-1,4:5:-1,4:5:0", "--acks0-pairs", "2",
                           "--headline-requests", "4", "--headline-repeats", "2", "--duration", "0.5"],
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())

    assert results["options"]["preset"] == "smoke" and results["options"]["duration"] == 0.5
    assert {c["name"] for c in results["configurations"]} == {"baseline", "multiqueue-q2", "shared-unmuted"}
    for config in results["configurations"]:
        assert config["error"] is None, config["error"]
        assert config["exit_code"] == 0
        assert config["runs"], f"{config['name']} has no runs"
        for run in config["runs"]:
            f = run["figures"]
            assert f["requests_per_s"] > 0 and f["records_per_s"] > 0 and f["mb_per_s"] > 0
            if run["shape"]["acks"] != 0:  # acks=0 requests get no response to time
                assert 0 < f["latency_ms"]["p50"] <= f["latency_ms"]["p99"] <= f["latency_ms"]["p99.9"]
            assert f["server_cpu_s"] > 0 and f["peak_rss_mb"] > 0
            assert f["server_cpu_s_per_m_records"] == pytest.approx(f["server_cpu_s"] / f["records"] * 1e6)
            assert f["queue_depth_max"] is not None and f["fraction_of_ceiling"] > 0
            if "pair" in run["shape"]:  # against the ceiling run just before it
                assert f["fraction_of_ceiling"] == pytest.approx(
                    f["requests_per_s"] / run["shape"]["pair_ceiling_requests_per_s"])
            v = run["verification"]
            assert v is not None and v["table"] is not None and v["table"]["rows"] > 0
            if config["mode"] != "shared-unmuted":
                assert run["status"] == "OK", run["reasons"]
                assert v["violations"] == 0
                assert v["table"]["rows"] == v["table"]["expected"] == f["records"]

    headline = results["headline"]
    assert headline["shape"] == {"connections": 1, "in_flight": 5, "acks": -1}
    assert set(headline["models"]) == {"baseline", "multiqueue-q2"}  # not the ablation
    for name, model in headline["models"].items():
        assert model["requests"] == 4 and model["ok"] and model["violations"] == 0, (name, model)
        assert len(model["per_repeat_requests_per_s"]) == 2
        repeats = [r for c in results["configurations"] if c["name"] == name for r in c["runs"]
                   if "repeat" in r["shape"]]
        assert [r["shape"]["repeat"] for r in repeats] == [0, 1]
        assert all(r["figures"]["requests"] == 2 and r["figures"]["stopped_by"] == "count" for r in repeats)
    ratio = headline["ratios"]["multiqueue-q2"]
    assert ratio["ratio"] > 0 and ratio["min"] <= ratio["median"] <= ratio["max"] and len(ratio["per_repeat"]) == 2
    [c1] = [t for t in results["targets"] if "C=1" in t["target"]]
    assert "completed requests" in c1["detail"] and c1["status"] in ("met", "not met")
    ablation = next(c for c in results["configurations"] if c["name"] == "shared-unmuted")
    assert {(r["shape"]["connections"], r["shape"]["acks"]) for r in ablation["runs"]} == {(1, -1), (4, -1), (4, 0)}

    assert results["ceiling"]["requests_per_s"]
    acks0 = {c["name"]: [r["shape"].get("pair") for r in c["runs"] if r["shape"]["acks"] == 0]
             for c in results["configurations"]}
    assert acks0 == {"baseline": [None], "multiqueue-q2": [0, 1], "shared-unmuted": [None]}
    waits = [r["shape"]["table_wait_s"] for c in results["configurations"] for r in c["runs"] if "pair" in r["shape"]]
    assert waits[0] is None and waits[1] is not None and 0 <= waits[1] < 60  # the table side took the first's
    paired = [r for r in results["ceiling"]["runs"] if "pair" in r["shape"]]
    assert [(r["paired_with"], r["shape"]["pair"], r["shape"]["connections"]) for r in paired] == [
        ("multiqueue-q2", 0, 4), ("multiqueue-q2", 1, 4)]
    assert all(r["figures"]["requests_per_s"] > 0 and r["error"] is None for r in paired)
    assert {t["target"] for t in results["targets"]}
    for name in PLOTS:
        assert (out / name).stat().st_size > 1000, name
    assert "| config |" in (out / "summary.md").read_text()
