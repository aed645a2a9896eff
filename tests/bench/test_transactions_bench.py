"""``pipeline.bench.transactions_bench``'s pure parts: the options, the read-back check, the ratios and the report
(the run itself: tests/bench/test_transactions_smoke.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pipeline.bench.options import add_bench_arguments
from pipeline.bench.transactions_bench import (check_read, failures, resolve_transactions, summary_md, table_rows,
                                               with_ratios)


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_bench_arguments(p)
    return p.parse_args(["--transactions", *argv])


def test_resolve_defaults_smoke_and_explicit(tmp_path):
    opts = resolve_transactions(_args())
    assert (opts.brokers, opts.transactions, opts.warmup, opts.record_bytes, opts.partitions) == ([1, 3], 300, 10,
                                                                                                   100, 3)
    assert opts.out == Path("bench-results/transactions")
    smoke = resolve_transactions(_args("--smoke", "--out", str(tmp_path)))
    assert (smoke.transactions, smoke.warmup, smoke.out) == (30, 3, tmp_path)
    mine = resolve_transactions(_args("--brokers", "1,2,4", "--transactions-count", "50", "--record-bytes", "1024",
                                      "--partitions", "6", "--server-arg=--linger-ms=0"))
    assert (mine.brokers, mine.transactions, mine.record_bytes, mine.partitions) == ([1, 2, 4], 50, 1024, 6)
    assert mine.server_args == ["--linger-ms=0"]


@pytest.mark.parametrize("argv", [["--brokers", "1,1"], ["--brokers", "0"], ["--transactions-count", "0"],
                                  ["--partitions", "0"], ["--record-bytes", "0"]])
def test_resolve_refuses_out_of_range(argv):
    with pytest.raises(ValueError):
        resolve_transactions(_args(*argv))


def test_check_read_counts_missing_duplicated_and_unexpected_keys():
    assert check_read({0: [0, 1, 2], 1: [2, 1, 0]}, 2, 3)["ok"]
    bad = check_read({0: [0, 1, 1], 1: [0, 1, 2, 7], 5: [0]}, 2, 3)
    assert not bad["ok"] and (bad["records"], bad["expected"]) == (8, 6)
    assert bad["missing"] == {0: 1, 1: 0} and bad["duplicated"] == {0: 1, 1: 0}
    assert bad["unexpected"] == {0: 0, 1: 1} and bad["other_partitions"] == {5: 1}
    assert not check_read({0: [0, 1, 2]}, 2, 3)["ok"]  # partition 1 read nothing


def _row(n: int, rate: float, p50: float, ok: bool = True) -> dict:
    check = {"records": 99, "expected": 99, "missing": {}, "duplicated": {}, "ok": ok}
    return {"brokers": n, "transactions": 30, "transactions_planned": 30, "transactions_per_s": rate,
            "commit_ms": {"p50": p50, "p99": p50 * 2, "p99.9": p50 * 2, "max": p50 * 3},
            "transaction_ms": {"p50": p50 + 1, "p99": p50 * 2 + 1, "max": p50 * 3 + 1}, "markers_local": 3 if n == 1
            else 1, "markers_queued": 0 if n == 1 else 2, "cpu_ms_per_transaction": 9.0, "read_committed": check,
            "errors": [], "ok": ok}


def test_ratios_table_and_summary_name_each_n_beside_the_first():
    rows = with_ratios([_row(1, 60.0, 10.0), _row(3, 24.0, 40.0), {"brokers": 5, "error": "RuntimeError: x",
                                                                     "ok": False}])
    assert rows[0]["transactions_per_s_ratio"] == 1.0 and rows[1]["transactions_per_s_ratio"] == pytest.approx(0.4)
    assert rows[1]["commit_p50_ratio"] == pytest.approx(4.0) and rows[2]["transactions_per_s_ratio"] is None
    one, three, five = table_rows(rows)
    assert three[:5] == ("3", "30", "24.0", "0.40", "40.0") and three[10] == "1 / 2" and three[-1] == "OK"
    assert five[0] == "5" and five[-1] == "FAILED" and len(five) == len(one)
    result = {"command": "pipeline bench --transactions", "started_at": "2026-12-01T00:00:00+0000", "wall_s": 100,
              "machine": {"cpus": 2, "load_average_at_start": [0.1, 0.2, 0.3]},
              "options": {"server_args": [], "warmup": 3, "transactions": 30, "record_bytes": 100, "partitions": 3},
              "rows": rows}
    text = summary_md(result)
    assert "| brokers | transactions | txn/s | txn/s x N=1 | commit p50 ms |" in text
    assert "| 3 | 30 | 24.0 | 0.40 | 40.0 | 80.0 | 120.0 | 4.00 |" in text
    assert text.rstrip().endswith("Reproduce: `pipeline bench --transactions`")
    assert failures(result) == ["N=5: RuntimeError: x"]
    rows[1]["ok"] = False
    assert len(failures(result)) == 2 and failures({"rows": []}) == ["no broker count ran"]
