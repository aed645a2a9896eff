"""``pipeline bench --transactions --smoke`` end to end: one broker, then ``--brokers 3``, each on its own Spark
Connect server, a real confluent-kafka transactional producer, every transaction read back read_committed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.bench_smoke]

TRANSACTIONS, WARMUP, PARTITIONS = 30, 3, 3
"""``--smoke``'s counts (pipeline.bench.options.TRANSACTIONS_SMOKE_COUNT, transactions_bench.SMOKE_WARMUP_TRANSACTIONS)
and the default partitions."""


def test_transactions_bench_smoke(tmp_path):
    argv = ["--transactions", "--smoke", "--out", str(tmp_path)]
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "bench", *argv], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["failures"] == []
    one, three = result["rows"]
    assert (one["brokers"], three["brokers"]) == (1, 3)
    committed = WARMUP + TRANSACTIONS
    for row in (one, three):
        assert row["ok"] and row["errors"] == [], row
        assert (row["transactions"], row["warmup"], row["partitions"]) == (TRANSACTIONS, WARMUP, PARTITIONS)
        assert row["records_acked"] == committed * PARTITIONS
        # every committed transaction's record on every partition exactly once, read back read_committed, and
        # one marker per transaction on each partition (those another broker's coordinator queued included)
        back = row["read_committed"]
        assert back["ok"] and back["records"] == back["expected"] == committed * PARTITIONS, back
        assert set(back["missing"].values()) == set(back["duplicated"].values()) == {0}
        assert back["end_offsets"] == {str(p): 2 * committed for p in range(PARTITIONS)}
        assert back["markers"] == {str(p): committed for p in range(PARTITIONS)}
        commit = row["commit_ms"]
        assert row["transactions_per_s"] > 0 and 0 < commit["p50"] <= commit["p99"] <= commit["max"]
        assert 0 < row["transaction_ms"]["p50"] and row["broker_tree_cpu_s"] > 0
        assert row["markers_local"] == sum(1 for leader in row["leaders"].values() if leader == row["coordinator"])
        assert row["markers_local"] + row["markers_queued"] == PARTITIONS
    assert one["leaders"] == {str(p): 0 for p in range(PARTITIONS)} and one["markers_queued"] == 0
    # the three partitions led by the three brokers: the coordinator writes one marker, queues two
    assert set(three["leaders"].values()) == {0, 1, 2} and three["markers_queued"] == 2
    assert one["transactions_per_s_ratio"] == 1.0 and three["transactions_per_s_ratio"] > 0
    header = "| brokers | transactions | txn/s | txn/s x N=1 | commit p50 ms | commit p99 ms |"
    summary = (tmp_path / "summary.md").read_text()
    assert header in proc.stdout and header in summary
    assert f"Reproduce: `pipeline bench {' '.join(argv)}`" in proc.stdout
    assert "| 3 | 30 |" in summary
