"""The headline comparison's report (``report.headline_summary`` and its target): C=1, K=5, acks=-1
runs sized by completed requests, repeated, pooled per model, with the ratio's spread."""

from __future__ import annotations

import pytest

from pipeline.bench import report


def _run(repeat: int, requests: int, elapsed_s: float, per_flush: int = 1) -> dict:
    return {"shape": {"connections": 1, "in_flight": 5, "acks": -1, "repeat": repeat}, "status": "OK",
            "figures": {"requests": requests, "elapsed_s": elapsed_s, "requests_per_s": requests / elapsed_s,
                        "server_counters": {"flushes": requests // per_flush}},
            "verification": {"violations": 0}}


def _results(base: list[tuple[int, float]], mq: list[tuple[int, float]], asked: int = 200) -> dict:
    c64 = {"shape": {"connections": 64, "in_flight": 5, "acks": -1}, "status": "OK",
           "figures": {"requests": 100, "elapsed_s": 1.0, "requests_per_s": 100.0}, "verification": {"violations": 0}}
    return {"options": {"headline_requests": asked}, "ceiling": {}, "machine": {"cpus": 2}, "configurations": [
        {"name": "baseline", "mode": "baseline", "runs": [_run(i, n, t) for i, (n, t) in enumerate(base)] + [c64]},
        {"name": "multiqueue-q4", "mode": "multiqueue", "runs": [_run(i, n, t, 5) for i, (n, t) in enumerate(mq)]}]}


def test_pooled_ratio_and_spread_over_repeats():
    results = _results(base=[(50, 25.0), (50, 20.0), (50, 25.0), (50, 30.0)],
                       mq=[(50, 5.0), (50, 5.0), (50, 10.0), (50, 6.0)])
    h = report.headline_summary(results)
    assert h is not None and h["shape"] == {"connections": 1, "in_flight": 5, "acks": -1}
    assert h["models"]["baseline"]["requests"] == 200 and h["models"]["baseline"]["elapsed_s"] == 100.0
    r = h["ratios"]["multiqueue-q4"]
    assert r["ratio"] == pytest.approx((200 / 26.0) / (200 / 100.0))
    assert r["per_repeat"] == pytest.approx([5.0, 4.0, 2.5, 5.0])
    assert (r["min"], r["median"], r["max"]) == pytest.approx((2.5, 4.5, 5.0))
    results["headline"] = h
    [target] = [t for t in report.evaluate_targets(results) if "C=1" in t["target"]]
    assert target["status"] == "not met"  # 3.85x < 4x
    assert "3.85x" in target["detail"] and "200 and 200 completed requests" in target["detail"]
    assert "min/median/max 2.50/4.50/5.00x over 4 repeats" in target["detail"]
    assert h["models"]["multiqueue-q4"]["requests_per_flush"] == 5.0 and h["models"]["baseline"]["flushes"] == 200
    assert "5.0 vs 1.0 requests per Spark flush" in target["detail"]
    assert [row[0] for row in report.table_rows(results)][:2] == ["baseline #1", "baseline #2"]


def test_fewer_requests_than_asked_are_reported():
    results = _results(base=[(40, 40.0)], mq=[(50, 5.0)], asked=50)
    results["headline"] = report.headline_summary(results)
    [target] = [t for t in report.evaluate_targets(results) if "C=1" in t["target"]]
    assert target["status"] == "met" and "fewer than the 50 requests asked completed for baseline" in target["detail"]


def test_no_headline_runs():
    results = _results(base=[], mq=[])
    assert report.headline_summary(results) is None
