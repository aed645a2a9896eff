"""The live view's pure parts (pipeline.table.live): the boundary's text, the table side's condition,
the tail's plan from pushed filters, and the tail's rows against the table's own decode."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual

from pipeline.table.live import (
    Boundary, Bounds, TailPartition, merge_ends, narrow, plan_tail, records_to_batch, table_filter_sql, view_sql,
)
from pipeline.table.live_source import LiveTailReader

ends_strategy = st.dictionaries(st.tuples(st.sampled_from(["a", "b.c", "d-e_f"]), st.integers(0, 64)),
                                st.integers(0, 2**62), max_size=20)


@given(ends_strategy, st.frozensets(st.text(max_size=5)), st.booleans())
def test_a_boundary_reads_back_as_written(ends, typed, stopped):
    boundary = Boundary(ends, typed, frozenset({"x"}), stopped, "h1:9092,h2:9093")
    assert Boundary.decode(boundary.encode()) == boundary


def test_text_that_is_not_a_boundary_is_refused():
    with pytest.raises(ValueError, match="not a live-view boundary"):
        Boundary.decode('{"ends": 3}')


def test_the_largest_prefix_end_per_partition_wins():
    assert merge_ends({("a", 0): 5, ("a", 1): 9}, {("a", 0): 7}, {}) == {("a", 0): 7, ("a", 1): 9}


def test_the_table_condition_is_the_offset_below_its_partitions_end(tmp_path):
    assert table_filter_sql({}) == "false"
    sql = table_filter_sql({("a", 0): 5, ("a", 1): 9, ("it's", 0): 1})
    assert "map('a', map(0, 5L, 1, 9L), 'it\\'s', map(0, 1L))" in sql
    assert sql.startswith("`offset` < coalesce(")
    view = view_sql("pipeline", Boundary({("a", 0): 5}, brokers="h:1"))
    assert view.startswith("ALTER VIEW `pipeline`.`records_live` AS SELECT ")
    assert "FROM `pipeline`.`records` WHERE `offset` <" in view
    assert "FROM `pipeline`.`records_tail` WHERE `_boundary` = '{\"ends\":[[\"a\",0,5]]" in view
    assert view_sql("db", Boundary(stopped=True), create=True).startswith("CREATE VIEW IF NOT EXISTS `db`.")


def _bounds(*filters) -> Bounds:
    bounds = Bounds()
    for f in filters:
        narrow(bounds, f)
    return bounds


LOG_ENDS = {("a", 0): 100, ("a", 1): 50, ("a", 2): 10, ("b", 0): 30, ("typed", 0): 40}
BOUNDARY = Boundary({("a", 0): 90, ("a", 1): 50, ("b", 0): 5}, frozenset({"typed"}))


def test_the_tail_is_each_raw_partition_from_its_end_to_its_lso():
    assert plan_tail(BOUNDARY, Bounds(), LOG_ENDS) == [
        TailPartition("a", 0, 90, 100), TailPartition("a", 2, 0, 10), TailPartition("b", 0, 5, 30)]
    assert plan_tail(Boundary(BOUNDARY.ends, stopped=True), Bounds(), LOG_ENDS) == []


@pytest.mark.parametrize("filters, expected", [
    ([EqualTo(("topic",), "b")], [("b", 0, 5, 30)]),
    ([In(("topic",), ("a", "x"))], [("a", 0, 90, 100), ("a", 2, 0, 10)]),
    ([EqualTo(("topic",), "a"), EqualTo(("partition",), 2)], [("a", 2, 0, 10)]),
    ([In(("partition",), (0, 2)), GreaterThan(("partition",), 0)], [("a", 2, 0, 10)]),
    ([LessThanOrEqual(("partition",), 0), GreaterThanOrEqual(("offset",), 95)], [("a", 0, 95, 100)]),
    ([EqualTo(("topic",), "a"), EqualTo(("partition",), 0), GreaterThanOrEqual(("offset",), 92),
      LessThan(("offset",), 94)], [("a", 0, 92, 94)]),
    ([EqualTo(("offset",), 7)], [("a", 2, 7, 8), ("b", 0, 7, 8)]),
    ([In(("offset",), (3, 96))], [("a", 0, 90, 97), ("a", 2, 3, 10), ("b", 0, 5, 30)]),
    ([LessThan(("offset",), 5)], [("a", 2, 0, 5)]),
    ([EqualTo(("topic",), "typed")], []),
])
def test_pushed_filters_narrow_the_tail_to_what_the_query_needs(filters, expected):
    assert plan_tail(BOUNDARY, _bounds(*filters), LOG_ENDS) == [TailPartition(*e) for e in expected]


def test_other_filters_are_left_to_spark_and_the_boundary_is_taken():
    reader = LiveTailReader({})
    boundary = EqualTo(("_boundary",), BOUNDARY.encode())
    others = [EqualTo(("topic",), "a"), EqualTo(("date",), "2026-11-28"), GreaterThan(("timestamp",), 1)]
    from pyspark.sql.datasource import IsNotNull

    left = list(reader.pushFilters([boundary, IsNotNull(("_boundary",)), *others]))
    assert left == others[1:]  # the topic's is the tail's (below)
    assert reader.boundary == BOUNDARY
    assert reader.bounds.topics == {"a"}


@pytest.mark.parametrize("f, exact", [
    (EqualTo(("topic",), "a"), True), (In(("topic",), ("a", "b")), True),
    (EqualTo(("partition",), 1), True), (In(("partition",), (0, 2)), True), (GreaterThan(("partition",), 0), True),
    (EqualTo(("offset",), 7), True), (GreaterThanOrEqual(("offset",), 7), True), (LessThan(("offset",), 9), True),
    (LessThanOrEqual(("offset",), 9), True), (In(("offset",), (7,)), True),
    (In(("offset",), (3, 96)), False),  # planned as [3, 96]: Spark keeps the values asked
    (EqualTo(("date",), "2026-11-28"), False), (GreaterThan(("timestamp",), 1), False),
])
def test_only_filters_the_tail_applies_exactly_are_kept_from_spark(f, exact):
    """Spark re-applies what pushFilters yields back; what it does not is the tail's to apply: the
    rows the plan and read give for those filters are exactly the rows that pass them."""
    from pyspark.sql.datasource import IsNotNull

    reader = LiveTailReader({})
    left = list(reader.pushFilters([EqualTo(("_boundary",), BOUNDARY.encode()), f, IsNotNull(("offset",))]))
    assert left == ([] if exact else [f])
    rows = [(t, p, o) for part in plan_tail(BOUNDARY, reader.bounds, LOG_ENDS)
            for t, p, o in ((part.topic, part.partition, o) for o in range(part.start, part.end))]
    everything = [(t, p, o) for part in plan_tail(BOUNDARY, Bounds(), LOG_ENDS)
                  for t, p, o in ((part.topic, part.partition, o) for o in range(part.start, part.end))]
    column = {"topic": 0, "partition": 1, "offset": 2}.get(f.attribute[0])
    if exact:
        assert column is not None
        passes = {EqualTo: lambda v: v == f.value, In: lambda v: v in f.value, GreaterThan: lambda v: v > f.value,
                  GreaterThanOrEqual: lambda v: v >= f.value, LessThan: lambda v: v < f.value,
                  LessThanOrEqual: lambda v: v <= f.value}[type(f)]
        assert rows == [r for r in everything if passes(r[column])]
    else:
        assert set(rows) <= set(everything)


def test_the_tail_is_read_through_the_view():
    with pytest.raises(ValueError, match="read through records_live"):
        LiveTailReader({}).partitions()


def test_tail_rows_are_the_rows_the_table_decode_gives():
    """Records as kafka-python hands them over become the columns appends_to_table gives the same
    records (the table's own decode), plus the time partitions and a null _boundary."""
    import pyarrow as pa

    from pipeline.table.layout import add_time_partitions
    from pipeline.table.schema import ARROW_SCHEMA

    records = [
        SimpleNamespace(key=b"k", value=b"v", topic="a", partition=1, offset=7, timestamp=1_795_900_000_123,
                        timestamp_type=0, headers=[("h", b"1"), ("n", None)]),
        SimpleNamespace(key=None, value=None, topic="d", partition=0, offset=8, timestamp=1_795_900_000_000,
                        timestamp_type=1, headers=[]),
    ]
    batch = records_to_batch(records, frozenset({"d"}))
    expected = add_time_partitions(pa.table({
        "key": [b"k", None], "value": [b"v", None], "topic": ["a", "d"], "partition": [1, 0], "offset": [7, 8],
        "timestamp": [1_795_900_000_123_000, 1_795_900_000_000_000], "timestampType": [0, 1],
        "headers": [[{"key": "h", "value": b"1"}, {"key": "n", "value": None}], None]},
    ).cast(ARROW_SCHEMA), frozenset({"d"}))
    assert pa.Table.from_batches([batch]).drop_columns(["_boundary"]).equals(expected)
    assert batch.column("hour").to_pylist()[1] is None  # a day-partitioned topic
    assert batch.column("_boundary").null_count == 2
