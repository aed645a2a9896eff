"""The acks=0 target's report: multiqueue's C=64, K=5, acks=0 runs, each paired with the echo
ceiling run just before it, judged by the median of the pairs' fractions (``report.evaluate_targets``)."""

from __future__ import annotations

from pipeline.bench import report


def _run(rps: float, pair: int | None = None, ceiling: float | None = None) -> dict:
    shape = {"connections": 64, "in_flight": 5, "acks": 0}
    if pair is not None:
        shape |= {"pair": pair, "pair_ceiling_requests_per_s": ceiling}
    return {"shape": shape, "status": "OK", "figures": {"requests_per_s": rps, "request_bytes": 1050},
            "verification": {"violations": 0}}


def _results(runs: list[dict], ceiling: float = 150_000.0) -> dict:
    return {"options": {}, "machine": {"cpus": 2}, "ceiling": {"requests_per_s": {"C=64,K=5": ceiling}},
            "configurations": [{"name": "multiqueue-q4", "mode": "multiqueue", "runs": runs}]}


def _target(results: dict) -> dict:
    [target] = [t for t in report.evaluate_targets(results) if t["target"].startswith("acks=0")]
    return target


def test_the_median_of_the_pairs_decides():
    pairs = [_run(50_000, 0, 200_000), _run(55_000, 1, 150_000), _run(60_000, 2, 180_000)]
    target = _target(_results(pairs, ceiling=100_000))  # the ceiling measured first is not used
    assert target["status"] == "met"  # fractions 25 %, 37 %, 33 %: median 33 %
    assert "median 33% over 3 pairs (min/max 25%/37%" in target["detail"]
    assert "50000 of 200000, 55000 of 150000, 60000 of 180000" in target["detail"]
    assert "issue 13's 50%: not met" in target["detail"]
    rows = report.table_rows(_results(pairs))
    assert [row[0] for row in rows] == ["multiqueue-q4 pair 1", "multiqueue-q4 pair 2", "multiqueue-q4 pair 3"]
    assert report._rps_at(_results(pairs), "multiqueue-q4", 64, 5, 0) == 55_000


def test_a_pair_whose_ceiling_run_failed_is_left_out():
    pairs = [_run(50_000, 0, None), _run(40_000, 1, 200_000)]
    target = _target(_results(pairs))
    assert target["status"] == "not met" and "median 20% over 1 pairs" in target["detail"]


def test_an_unpaired_run_is_judged_against_the_ceiling_measured_first():
    target = _target(_results([_run(50_000)], ceiling=150_000))
    assert target["status"] == "met" and "33% of 150000 req/s (50000 req/s, 1050 B requests)" in target["detail"]
