"""``pipeline.bench.report`` on a results.json with a brokers phase (synthetic results: the renderer only)."""

from __future__ import annotations

import json

from pipeline.bench import report


def _row(n: int, records_per_s: float, record_bytes: int = 1024, ok: bool = True) -> dict:
    mb = records_per_s * (record_bytes + 5) / 1e6
    return {"brokers": n, "producers": 4, "record_bytes": record_bytes, "records_sent": 100_000,
            "records": 100_000, "undelivered": 0, "errors": [], "seconds": 100_000 / records_per_s,
            "records_per_s": records_per_s, "mb_per_s": mb,
            "latency_ms": {"p50": 3.0, "p99": 20.0, "p99.9": 41.5, "max": 60.0},
            "broker_cpu_s": [4.0] * n, "broker_tree_cpu_s": 4.5 * n, "cpu_s_per_m_records": 45.0 * n,
            "peak_rss_mb": 180.0 * n, "connect_cpu_s": 9.0, "connect_peak_rss_mb": 900.0, "cpus": 2,
            "load_average": 1.0, "ok": ok}


def _results(rows: list[dict], cpus: int) -> dict:
    return {"command": "pipeline bench --brokers 1,2", "started_at": "2024-01-01T00:00:00+0000", "wall_s": 10,
            "machine": {"cpus": cpus, "platform": "Linux", "python": "3.12", "load_average_at_start": [0.1, 0.1, 0.1]},
            "options": {"preset": "brokers"}, "configurations": [], "ceiling": {},
            "brokers_options": {"producers": 4, "records": 100_000, "record_bytes": 1024}, "brokers": rows}


def _target(results: dict, start: str) -> dict:
    return next(t for t in report.evaluate_targets(results) if t["target"].startswith(start))


def test_markdown_plot_and_redraw(tmp_path):
    results = _results([_row(1, 50_000), _row(2, 70_000), {"brokers": 4, "error": "RuntimeError: x", "ok": False}], 2)
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert report.main([str(tmp_path)]) == 0
    md = (tmp_path / "summary.md").read_text()
    assert "| " + " | ".join(report.BROKERS_COLUMNS) + " |" in md
    assert "| 1 | 50000 | 51.5 | 1.00 | 3.0 | 20.0 | 41.5 | 4.0 | 45.0 | 180 | 9.0 | 900 | 0 | OK |" in md
    assert "| 2 | 70000 | 72.0 | 1.40 | 3.0 | 20.0 | 41.5 | 4.0+4.0 | 90.0 | 360 |" in md
    assert "| 4 | - |" in md and md.count("FAILED") == 1
    assert "| config |" not in md  # no model runs in this results.json
    assert (tmp_path / "throughput_vs_brokers.png").stat().st_size > 1000


def test_targets_met_and_not_met():
    met = _results([_row(1, 150_000), _row(2, 250_000)], 8)
    assert _target(met, "end to end")["status"] == "met"
    assert "best N=2" in _target(met, "end to end")["detail"]
    assert _target(met, "--brokers 2")["status"] == "met"

    missed = _results([_row(1, 100_000), _row(2, 120_000)], 8)
    assert _target(missed, "end to end")["status"] == "not met"
    assert _target(missed, "--brokers 2")["status"] == "not met"
    assert _target(missed, "--brokers 2")["detail"].startswith("1.20x")


def test_targets_on_fewer_than_four_cores_and_unmeasured():
    two = _results([_row(1, 100_000), _row(2, 170_000)], 2)
    scale = _target(two, "--brokers 2")
    assert scale["status"] == "not measurable here (2 cores)" and scale["detail"].startswith("1.70x")

    assert _target(_results([_row(1, 300_000, record_bytes=100)], 8), "end to end")["status"] == "not measured"
    assert _target(_results([_row(1, 300_000), _row(2, 1, ok=False)], 8), "--brokers 2")["status"] == "not measured"
    none = _results([], 8)
    none.pop("brokers")
    assert {t["status"] for t in report.brokers_targets(none)} == {"not measured"}


def test_targets_with_a_row_that_recorded_no_record_size():
    # A row without "record_bytes" (its size unknown) next to one with it: the end-to-end target is
    # "not measured" and names both; sorting {None, 100} used to raise TypeError.
    unknown = _row(2, 300_000)
    del unknown["record_bytes"]
    e2e = _target(_results([_row(1, 300_000, record_bytes=100), unknown], 8), "end to end")
    assert e2e["status"] == "not measured"
    assert e2e["detail"].startswith("records of [None, 100] B, not 1 KiB")


def _queryable(row: dict, records_per_s: float, cores: float, commit_s: list[float], seconds: float = 10.0) -> dict:
    row["queryable"] = {"seconds": seconds, "records_per_s": records_per_s, "mb_per_s": records_per_s * 1029 / 1e6,
                        "broker_cores": cores, "broker_cpu_s": [cores * seconds / len(commit_s)] * len(commit_s),
                        "commit_s": commit_s, "lock_wait_s": [0.1] * len(commit_s),
                        "commit_overlap": sum(commit_s) / seconds, "flush_records": [1] * len(commit_s)}
    return row


def test_the_ingest_to_queryable_target_and_table():
    start = "ingest to queryable"
    met = _results([_queryable(_row(1, 50_000), 20_000, 0.9, [3.0]),
                    _queryable(_row(3, 70_000), 27_000, 1.9, [4.0, 4.0, 4.0])], 2)
    assert _target(met, start)["status"] == "met"
    assert _target(met, start)["detail"].startswith("1.35x")
    assert "commits 4.0 + 4.0 + 4.0 s in 10.0 s (overlap 1.20)" in _target(met, start)["detail"]
    md = report.markdown(met)
    assert "| " + " | ".join(report.QUERYABLE_COLUMNS) + " |" in md
    assert "| 3 | 10.0 | 27000 | 27.8 | 1.35 | 1.90 | - | 4.0+4.0+4.0 | 1.20 | 0.1+0.1+0.1 |" in md

    bound = _results([_queryable(_row(1, 50_000), 20_000, 0.9, [3.0]),
                      _queryable(_row(3, 70_000), 22_000, 1.9, [4.0, 4.0, 4.0])], 2)
    assert _target(bound, start)["status"] == "machine-bound"
    serial = _results([_queryable(_row(1, 50_000), 20_000, 0.9, [3.0]),
                       _queryable(_row(3, 70_000), 22_000, 1.9, [3.0, 3.0, 3.0])], 2)
    assert _target(serial, start)["status"] == "not met"  # the commits never overlapped
    idle = _results([_queryable(_row(1, 50_000), 20_000, 0.9, [3.0]),
                     _queryable(_row(3, 70_000), 22_000, 1.2, [4.0, 4.0, 4.0])], 2)
    assert _target(idle, start)["status"] == "not met"  # the machine was not the limit
    assert _target(_results([_queryable(_row(1, 50_000), 20_000, 0.9, [3.0])], 2), start)["status"] == "not measured"
