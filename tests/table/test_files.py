"""pipeline.table.files without Spark: footers' statistics, candidate row groups, decoded and sorted
row groups, on real Parquet files written with pyarrow (rows of several partitions mixed, as one
commit writes them)."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.table.files import DecodedGroup, FooterGroups, RowGroups, local_file
from pipeline.table.reader import READ_COLUMNS
from pipeline.table.schema import ARROW_SCHEMA

DATA_SCHEMA = pa.schema([f for f in ARROW_SCHEMA if f.name != "topic"])


def rows(pairs: list[tuple[int, int]]) -> pa.Table:
    """Rows of (partition, offset) in the order given; value = b"p<partition>o<offset>"."""
    n = len(pairs)
    return pa.table({
        "key": pa.array([None] * n, pa.binary()),
        "value": pa.array([b"p%do%d" % pair for pair in pairs], pa.binary()),
        "partition": pa.array([p for p, _ in pairs], pa.int32()),
        "offset": pa.array([o for _, o in pairs], pa.int64()),
        "timestamp": pa.array([1_000_000 * o for _, o in pairs], pa.int64()).cast(ARROW_SCHEMA.field("timestamp").type),
        "timestampType": pa.array([0] * n, pa.int32()),
        "headers": pa.array([None] * n, ARROW_SCHEMA.field("headers").type),
    }, schema=DATA_SCHEMA)


def test_row_groups_statistics_and_candidates(tmp_path):
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    # a: partition 0 offsets 0..99 and partition 1 offsets 0..9, in two row groups of 55 rows
    pairs = [(0, o) for o in range(100)] + [(1, o) for o in range(10)]
    random.Random(1).shuffle(pairs)
    pq.write_table(rows(pairs), a, row_group_size=55)
    pq.write_table(rows([(0, o) for o in range(100, 150)]), b)
    footers = [FooterGroups.read(str(a)), FooterGroups.read(str(b))]
    assert [len(f.groups) for f in footers] == [2, 1]
    assert footers[1].groups == ((50, 0, 0, 100, 149),)
    groups = RowGroups.from_footers(footers)
    assert list(groups.file) == [0, 0, 1] and list(groups.index) == [0, 1, 0]
    assert set(groups.candidates(0, 120, 200).tolist()) == {2}
    # statistics cover all partitions of a row group: a's may hold partition 1 at 20 (they do not)
    assert set(groups.candidates(1, 20, 200).tolist()) == {0, 1}
    assert groups.candidates(1, 150, 200).tolist() == []
    assert groups.candidates(2, 0, 200).tolist() == []           # no partition 2 anywhere
    assert groups.candidates(0, 0, 1000).tolist()[-1] == 2       # ascending by smallest offset


def test_a_decoded_row_group_is_sorted_and_sliced_by_partition(tmp_path):
    path = tmp_path / "mixed.parquet"
    pairs = [(p, o) for p in (3, 0, 1) for o in range(40)]
    random.Random(2).shuffle(pairs)
    pq.write_table(rows(pairs), path)
    group = DecodedGroup.decode(str(path), 0, READ_COLUMNS)
    assert group.rows.column_names == list(READ_COLUMNS)
    assert group.partitions.tolist() == [0, 1, 3] and group.starts.tolist() == [0, 40, 80, 120]
    part = group.slice(1, 10, 15)
    assert part.column("offset").to_pylist() == [10, 11, 12, 13, 14]
    assert part.column("value").to_pylist() == [b"p1o%d" % o for o in range(10, 15)]
    assert part.column("timestamp").cast(pa.int64()).to_pylist() == [1_000_000 * o for o in range(10, 15)]
    assert group.slice(2, 0, 100).num_rows == 0 and group.slice(3, 40, 100).num_rows == 0
    assert group.slice(0, 0, 1 << 40).num_rows == 40
    assert group.nbytes == group.rows.nbytes > 0
    assert np.all(np.diff(group.offsets[group.starts[0]:group.starts[1]]) == 1)


def test_a_topic_column_in_the_file_filters_rows(tmp_path):
    path = tmp_path / "with_topic.parquet"
    table = rows([(0, o) for o in range(6)])
    table = table.append_column("topic", pa.array(["a", "b"] * 3))
    pq.write_table(table, path)
    group = DecodedGroup.decode(str(path), 0, READ_COLUMNS, topic="b")
    assert group.slice(0, 0, 10).column("offset").to_pylist() == [1, 3, 5]


def test_local_file():
    assert local_file("file:///data/tables/records/topic=t/date=2026-11-26/hour=6/part-0.parquet") == \
        "/data/tables/records/topic=t/date=2026-11-26/hour=6/part-0.parquet"
    assert local_file("file:/a%20b/c.parquet") == "/a b/c.parquet"
    assert local_file("/plain/path.parquet") == "/plain/path.parquet"
    assert local_file("s3a://bucket/x.parquet") is None
    assert local_file("hdfs://nn:8020/x.parquet") is None


def test_row_groups_of_a_commit_and_of_a_spark_written_compaction_read_alike_and_concatenate(tmp_path):
    """A compaction's file is Spark's: INT96 timestamps (naive when read), lists of another item name. Its
    row groups decode to the same types and values as a staged commit's, so a read spanning both
    concatenates them (a fetch failed with KAFKA_STORAGE_ERROR, "Schema at index 1 was different")."""
    headers_spark = pa.list_(pa.field("array", ARROW_SCHEMA.field("headers").type.value_type))
    committed = rows([(0, 0), (0, 1)])
    spark_written = rows([(0, 2), (0, 3)])
    spark_written = spark_written.set_column(
        spark_written.schema.get_field_index("timestamp"), "timestamp",
        spark_written.column("timestamp").cast(pa.timestamp("us")))
    spark_written = spark_written.set_column(
        spark_written.schema.get_field_index("headers"), "headers",
        pa.array([[{"key": "h", "value": b"v"}], None], headers_spark))
    pq.write_table(committed, tmp_path / "commit.parquet")
    pq.write_table(spark_written, tmp_path / "compacted.parquet", use_deprecated_int96_timestamps=True)
    assert pq.read_metadata(tmp_path / "compacted.parquet").schema.column(4).physical_type == "INT96"
    a = DecodedGroup.decode(str(tmp_path / "commit.parquet"), 0, READ_COLUMNS)
    b = DecodedGroup.decode(str(tmp_path / "compacted.parquet"), 0, READ_COLUMNS)
    assert a.rows.schema == b.rows.schema
    both = pa.concat_tables([a.slice(0, 0, 2), b.slice(0, 2, 4)])
    assert both.column("offset").to_pylist() == [0, 1, 2, 3]
    assert both.column("timestamp").cast(pa.int64()).to_pylist() == [0, 1_000_000, 2_000_000, 3_000_000]
    assert both.column("headers").to_pylist()[2] == [{"key": "h", "value": b"v"}]
