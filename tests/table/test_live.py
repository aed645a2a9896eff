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
from tests.table.test_values_registry import registered  # noqa: F401 - the fixture

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


def _typed_formats():
    import json

    import pyarrow as pa

    from pipeline.table.values import ValueFormat

    avro = {"type": "record", "name": "Reading", "fields": [
        {"name": "sensor", "type": "string"}, {"name": "celsius", "type": ["null", "double"], "default": None}]}
    return [ValueFormat("json", pa.schema([pa.field("n", pa.int64()), pa.field("memo", pa.string())])),
            ValueFormat.for_avro(json.dumps(avro), "none"),
            ValueFormat.for_avro(avro, "confluent", registry="/data/_pipeline/registry.db")]


@pytest.mark.parametrize("fmt", _typed_formats(), ids=["json", "avro", "avro-registry"])
def test_a_typed_topics_format_rides_in_its_views_boundary(fmt):
    from pipeline.table.live import format_from_json, format_to_json

    boundary = Boundary({("t", 0): 5}, brokers="h:1", topic="t", value_format=format_to_json(fmt))
    back = Boundary.decode(boundary.encode())
    assert back == boundary and back.topic == "t"
    assert format_from_json(back.value_format) == fmt
    assert Boundary.decode(Boundary({("t", 0): 5}).encode()).topic is None  # the records view's


def test_typed_tail_rows_are_the_rows_the_typed_table_gets():
    """A typed topic's records as kafka-python hands them over become its table's rows: the raw
    columns and the typed ones as the table side decodes them (``split_typed``), in the tail
    table's column order and Spark's Arrow types; a value that does not parse (a dead letter) is
    in no typed table and not in the tail either."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    from pipeline.table.live import typed_records_to_batch, typed_tail_columns
    from pipeline.table.schema import SPARK_SCHEMA

    fmt = _typed_formats()[0]
    records = [SimpleNamespace(key=b"k", value=value, topic="t", partition=0, offset=offset,
                               timestamp=1_795_900_000_123, timestamp_type=0, headers=[])
               for offset, value in ((7, b'{"n": 1, "memo": "one"}'), (8, b"not json"), (9, b'{"n": 2}'))]
    table_schema = StructType([*SPARK_SCHEMA.fields, StructField("n", LongType()), StructField("memo", StringType()),
                               StructField("date", StringType()), StructField("hour", IntegerType())])
    names, ddl = typed_tail_columns(table_schema)
    assert names[-4:] == ["n", "memo", "date", "hour"] and ddl.endswith("`hour` int, `_boundary` string")
    tail = StructType([*table_schema.fields, StructField("_boundary", StringType())])
    batch = typed_records_to_batch(records, "t", fmt, frozenset(), to_arrow_schema(tail, timezone="UTC"))
    assert batch.schema == to_arrow_schema(tail, timezone="UTC")
    rows = pa.Table.from_batches([batch]).select(["offset", "n", "memo", "date", "hour", "_boundary"]).to_pylist()
    assert rows == [{"offset": 7, "n": 1, "memo": "one", "date": "2026-11-28", "hour": 21, "_boundary": None},
                    {"offset": 9, "n": 2, "memo": None, "date": "2026-11-28", "hour": 21, "_boundary": None}]

    # The same records as dead_letters' tail (partitioned by topic and date) gives the one that did not parse.
    from pipeline.table.live import dead_letters_to_batch

    dead_schema = StructType([*SPARK_SCHEMA.fields, StructField("error", StringType()), StructField("date", StringType()),
                              StructField("_boundary", StringType())])
    dead = dead_letters_to_batch(records, fmt, frozenset(), to_arrow_schema(dead_schema, timezone="UTC")).to_pylist()
    assert [(r["offset"], r["value"], r["date"]) for r in dead] == [(8, b"not json", "2026-11-28")]
    assert dead[0]["error"]


def test_a_typed_views_sql_names_its_own_table_and_tail():
    view = view_sql("pipeline", Boundary({("t", 0): 5}, topic="t", value_format={}), table="t",
                    columns=["key", "n", "date", "hour"])
    assert view.startswith("ALTER VIEW `pipeline`.`t_live` AS SELECT `key`, `n`, `date`, `hour` FROM `pipeline`.`t` ")
    assert "FROM `pipeline`.`t_tail` WHERE `_boundary` = '{" in view


def test_a_registry_topics_tail_reads_each_value_with_its_writers_schema(registered):  # noqa: F811 - the fixture
    """The format as the view's boundary carries it (JSON, the registry's SQLite store by path): each
    framed value is read with its writer's schema from the store and resolved against the table's
    (v1's missing age takes v2's default); an id the registry lacks is a dead letter, left out."""
    import pyarrow as pa

    from pipeline.table.live import format_from_json, format_to_json, typed_records_to_batch
    from pipeline.table.values import ValueFormat
    from tests.table.test_values_registry import V1, V2, framed

    target, _, ids = registered
    carried = Boundary({("users", 0): 0}, topic="users",
                       value_format=format_to_json(ValueFormat.for_avro(V2, "confluent", registry=target)))
    fmt = format_from_json(Boundary.decode(carried.encode()).value_format)
    values = [framed(ids["v1"], V1, {"name": "ann"}), framed(999, V1, {"name": "lost"}),
              framed(ids["v2"], V2, {"name": "bob", "age": 7})]
    records = [SimpleNamespace(key=None, value=v, topic="users", partition=0, offset=o, timestamp=1_795_900_000_000,
                               timestamp_type=0, headers=[]) for o, v in enumerate(values)]
    schema = pa.schema([pa.field("offset", pa.int64()), pa.field("name", pa.string()), pa.field("age", pa.int32()),
                        pa.field("date", pa.string()), pa.field("hour", pa.int32()), pa.field("_boundary", pa.string())])
    batch = typed_records_to_batch(records, "users", fmt, frozenset(), schema)
    assert batch.to_pylist() == [
        {"offset": 0, "name": "ann", "age": -1, "date": "2026-11-28", "hour": 21, "_boundary": None},
        {"offset": 2, "name": "bob", "age": 7, "date": "2026-11-28", "hour": 21, "_boundary": None}]
