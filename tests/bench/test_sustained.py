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


def test_avro_values_decode_with_the_registered_schema_and_are_distinct():
    import io

    from fastavro import parse_schema, schemaless_reader

    from pipeline.bench.avro_values import AVRO_SCHEMA, POOL, AvroValues

    values = AvroValues(1024, schema_id=7, seed=1)
    schema = parse_schema(AVRO_SCHEMA)
    for seq in (0, 1, POOL - 1, POOL, 100_000):
        value = values.value(seq)
        assert len(value) == 1024 and value[:5] == b"\x00\x00\x00\x00\x07"  # magic byte, schema id 7
        payload = io.BytesIO(value[5:])
        record = schemaless_reader(payload, schema, None)
        assert payload.tell() == 1019  # nothing left after the record
        assert set(record) == {f["name"] for f in AVRO_SCHEMA["fields"]} and record["payload"]
    assert len({values.value(i) for i in range(5000)}) == 5000
    with pytest.raises(ValueError, match="--record-bytes 300"):
        AvroValues(300, schema_id=7)


def test_typed_ratios_and_failures_of_the_typed_phase():
    from pipeline.bench.sustained_bench import typed_ratios

    r = typed_ratios({"acked_mb_per_s": 100.0, "sustained_mb_per_s": 80.0},
                     {"acked_mb_per_s": 90.0, "sustained_mb_per_s": 20.0})
    assert r == {"typed_acked_mb_per_s": 90.0, "typed_acked_ratio": 0.9,
                 "typed_sustained_mb_per_s": 20.0, "typed_sustained_ratio": 0.25}
    assert typed_ratios({"acked_mb_per_s": 100.0}, {"acked_mb_per_s": None})["typed_acked_ratio"] is None

    ok = {"error": None, "verification": {"lost": 0, "duplicated": 0, "violations": 0}, "producers": [],
          "server": {"exit_code": 0}, "naive_exit_code": 0,
          "typed": {"registry": "http://127.0.0.1:1", "verification": {"lost": 0, "duplicated": 0, "violations": 0},
                    "counts": {"rows": 5, "decoded": 5, "dead_letters": 0},
                    "producers": [{"producer": 1, "errors": [], "timed_out": False}]}}
    assert failures(ok) == []
    bad = ok | {"typed": ok["typed"] | {"counts": {"rows": 5, "decoded": 4, "dead_letters": 2},
                                        "producers": [{"producer": 1, "errors": [], "timed_out": True}]}}
    assert failures(bad) == ["typed phase producer 1: timed out",
                             "typed table: 2 dead letter(s), 1 row(s) with a typed column null"]
    assert failures(ok | {"typed": {"registry": "http://127.0.0.1:1"}}) == ["the typed table was not verified"]
