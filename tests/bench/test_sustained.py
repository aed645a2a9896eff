"""The pure parts of ``pipeline bench --sustained``: the table check, the figures, CPU by process role."""

from __future__ import annotations

from array import array

import pytest

from pipeline.bench.naive_spark import RandomValues, parse_key, record_key
from pipeline.bench.options import SustainedBenchOptions
from pipeline.bench.processes import cpu_by_role
from pipeline.bench.sustained_bench import failures, figures, verify_table


def _producer(producer: int, placed: list[tuple[int, int]], t_start: float = 10.0, t_last_ack: float = 12.0) -> dict:
    """A producer's result: record seq acknowledged at ``placed[seq]`` = (partition, offset); offset -1 = not acked."""
    acked = [p for p in placed if p[1] >= 0]
    return {"producer": producer, "sent": len(placed), "acked": len(acked), "bytes": len(acked) * 1000,
            "t_start": t_start, "t_last_ack": t_last_ack, "cpu_s": 0.5, "errors": [], "timed_out": False,
            "partition": array("i", [p for p, _ in placed]).tobytes(),
            "offset": array("q", [o for _, o in placed]).tobytes()}


def test_keys_round_trip_and_values_are_distinct():
    assert parse_key(record_key(1, 12345)) == (1, 12345)
    assert parse_key(b"c0r1i2") is None and parse_key(None) is None and parse_key(b"1-") is None
    values = RandomValues(1024)
    assert len(values.value(7)) == 1024 and len({values.value(i) for i in range(1000)}) == 1000


def test_verify_table_counts_lost_and_duplicated_records():
    producers = [_producer(0, [(0, 0), (0, 1), (1, 0)]), _producer(1, [(1, 1), (0, -1)])]
    clean = [(0, 0, (0, 0, 0)), (0, 1, (0, 1, 0)), (1, 0, (0, 2, 0)), (1, 1, (1, 0, 0))]
    v = verify_table(producers, clean)
    assert (v["rows"], v["expected"], v["violations"], v["duplicated"]) == (4, 4, 0, 0)
    assert v["lost"] == v["unacknowledged"] == 1  # producer 1's second record was never acknowledged

    # (0, 1) is gone; (0, 0) is stored a second time at offset 2
    broken = [(0, 0, (0, 0, 0)), (0, 2, (0, 0, 0)), (1, 0, (0, 2, 0)), (1, 1, (1, 0, 0))]
    v = verify_table(producers, broken)
    assert v["lost"] == 2 and v["duplicated"] == 1 and v["violations"] >= 2
    assert v["findings"]["missing"]["count"] == 1


def test_figures_ratio_and_cpu_per_million_records():
    opts = SustainedBenchOptions(buffer_memory=1000)
    producers = [_producer(0, [(0, i) for i in range(1000)], 10.0, 12.0),
                 _producer(1, [(1, i) for i in range(1000)], 10.5, 14.0)]
    naive = {"seconds": 2.0, "bytes": 4_000_000, "records": 2000}
    f = figures(opts, producers, 18.0, {"front end": 1.0, "JVM": 3.0, "decode worker": 0.5}, naive)
    assert f["records_acked"] == 2000 and f["bytes_acked"] == 2_000_000 and f["exceeds_buffer_memory"]
    assert f["ack_seconds"] == 4.0 and f["acked_mb_per_s"] == 0.5
    assert f["lag_to_queryable_s"] == 4.0 and f["sustained_mb_per_s"] == 0.25
    assert f["naive_mb_per_s"] == 2.0 and f["ratio"] == 0.125
    assert f["cpu_s"]["server total"] == 4.5 and f["cpu_s"]["producers"] == 1.0
    assert f["cpu_s_per_m_records"]["JVM"] == pytest.approx(1500.0)
    assert figures(opts, producers, None, {}, None)["sustained_mb_per_s"] is None


def test_failures_name_what_went_wrong():
    ok = {"error": None, "verification": {"lost": 0, "duplicated": 0, "violations": 0},
          "producers": [{"producer": 0, "errors": [], "timed_out": False}], "server": {"exit_code": 0},
          "naive_exit_code": 0}
    assert failures(ok) == []
    bad = ok | {"verification": {"lost": 3, "duplicated": 1, "violations": 4}, "server": {"exit_code": 1}}
    assert failures(bad) == ["3 lost, 1 duplicated, 4 violation(s)", "server exited with 1"]


def test_cpu_by_role_counts_new_processes_from_zero():
    before = {1: ("front end", 10.0), 2: ("JVM", 50.0)}
    after = {1: ("front end", 12.5), 2: ("JVM", 58.0), 3: ("decode worker", 1.5)}
    assert cpu_by_role(before, after) == {"front end": 2.5, "JVM": 8.0, "decode worker": 1.5}
