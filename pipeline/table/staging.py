"""A flush's records as Parquet files written from Arrow, staged for a catalog commit.

Why not ``createDataFrame(arrow).write``: on the 2-core machine a Spark append of
64 MiB of 1 KiB records spent 1.5-3 s of JVM time (Arrow batches shipped inside
the task and Java-deserialized, converted to rows, sorted by the partition
columns, then encoded by parquet-mr), where Arrow's C++ Parquet writer encodes the
same rows in ~0.05 s of CPU (docs/benchmarks.md, "Table side: the Spark write
path"). So the decode worker writes the records table's files itself, here, into
a staging directory inside the table's directory (same filesystem, so moving a
file in is one ``rename``), and the commit (``TableCatalog.commit_staged``)
registers the files' partitions in the catalog, then renames each file into its
partition's location. Spark reads the files like its own: columns by name, the
table's schema from the catalog.

File layout (as Spark writes the table's files): one file per (topic, date, hour)
partition per flush, the data columns (``DATA_COLUMNS``, no partition columns),
one row group, ``timestamp`` as INT64 ``TIMESTAMP(MICROS, UTC)``, ``headers`` as a
standard 3-level LIST. Per column: no dictionary for ``value`` (random values
overflow the dictionary page at once; Kafka values rarely repeat), and no
min/max statistics for ``value`` (nothing filters on them, and they cost a
comparison of every value); ``offset``, ``partition`` and ``timestamp`` keep
theirs (the table reader's offset ranges skip files by them).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.table.layout import PARTITION_COLUMNS, add_time_partitions
from pipeline.table.schema import COLUMNS
from pipeline.table.typed import FlushTables

DATA_COLUMNS: tuple[str, ...] = tuple(c for c in COLUMNS if c != "topic")
"""Columns stored in the records table's files (the partition columns live in directory names)."""

STAGING_DIR = "_staging"
"""``DATA_DIR/tables/records/_staging/<sink>``: a name Spark's listing skips (leading ``_``),
on the table's filesystem."""

DICTIONARY_COLUMNS = ["key", "partition", "offset", "timestamp", "timestampType",
                      "headers.list.element.key", "headers.list.element.value"]
"""Columns (Parquet paths) encoded with a dictionary: every one but ``value``."""

STATISTICS_COLUMNS = ["key", "partition", "offset", "timestamp", "timestampType",
                      "headers.list.element.key", "headers.list.element.value"]
"""Columns with min/max statistics: every one but ``value``."""

CODECS = {"none": "none", "uncompressed": "none", "snappy": "snappy", "gzip": "gzip", "zstd": "zstd",
          "lz4": "lz4", "lz4_raw": "lz4", "brotli": "brotli"}
"""Spark's ``spark.sql.parquet.compression.codec`` values -> Arrow's (Arrow's ``lz4`` is Parquet's
LZ4_RAW, which Spark >= 3.3 reads; Hadoop's framed LZ4 and LZO have no Arrow writer)."""


def arrow_codec(spark_codec: str) -> str:
    """The Arrow codec for a ``spark.sql.parquet.compression.codec`` value.

    Raises:
        ValueError: a codec Arrow cannot write (``lzo``).
    """
    try:
        return CODECS[spark_codec.lower()]
    except KeyError:
        raise ValueError(f"spark.sql.parquet.compression.codec={spark_codec!r}: the table's writer "
                         f"supports {sorted(CODECS)}") from None


@dataclass(frozen=True, slots=True)
class StagedFile:
    """One Parquet file waiting in the staging directory for its commit.

    Attributes:
        path: absolute path in the staging directory.
        partition: the table partition's values in ``PARTITION_COLUMNS`` order
            (None: Hive's default partition).
        rows: rows in the file.
        ranges: (topic, Kafka partition, first offset, last offset) of its rows, one
            per topic-partition; a row outside these is not in the file (the
            commit uses them to find files holding rows it must not write twice).
    """

    path: str
    partition: tuple[tuple[str, object], ...]
    rows: int
    ranges: tuple[tuple[str, int, int, int], ...]

    def holds_any(self, exclude: set[tuple[str, int, int]]) -> bool:
        """Whether a (topic, partition, offset) of ``exclude`` may be among the file's rows."""
        for topic, partition, offset in exclude:
            for t, p, lo, hi in self.ranges:
                if t == topic and p == partition and lo <= offset <= hi:
                    return True
        return False


@dataclass(frozen=True, slots=True)
class StagedRecords:
    """A flush's rows of one table, written to staged files: the records table's
    (``stage_records``) or a typed topic's (``stage_typed``)."""

    files: tuple[StagedFile, ...] = ()

    @property
    def num_rows(self) -> int:
        return sum(f.rows for f in self.files)


def stage_records(table: pa.Table, staging_dir: str, day_topics: frozenset[str] = frozenset(),
                  codec: str = "snappy") -> StagedRecords:
    """Write the rows of ``table`` (``ARROW_SCHEMA``) as one Parquet file per time partition.

    Args:
        table: the flush's records-table rows.
        staging_dir: existing directory to write into.
        day_topics: topics partitioned by day only (``add_time_partitions``).
        codec: Arrow compression codec (``arrow_codec``).

    Returns:
        The files, in partition order of first appearance. An empty table stages nothing.

    Raises:
        OSError: a file could not be written (nothing written is left behind).
    """
    if table.num_rows == 0:
        return StagedRecords()
    table = add_time_partitions(table, day_topics)
    keys = table.select(list(PARTITION_COLUMNS)).group_by(list(PARTITION_COLUMNS), use_threads=False) \
        .aggregate([]).to_pylist()
    files = []
    try:
        for values in keys:
            rows = table if len(keys) == 1 else table.filter(_partition_mask(table, values))
            files.append(_write(rows, staging_dir, tuple((c, values[c]) for c in PARTITION_COLUMNS), codec))
    except BaseException:
        for f in files:
            _unlink(f.path)
        raise
    return StagedRecords(tuple(files))


TYPED_PARTITION_COLUMNS = ("date", "hour")
"""A typed topic's table's partition columns (``TableCatalog.typed_tables``)."""


def stage_typed(table: pa.Table, staging_dir: str, day_topics: frozenset[str] = frozenset(),
                codec: str = "snappy") -> StagedRecords:
    """Write a typed topic's rows (``ARROW_SCHEMA`` + its typed columns, ``pipeline.table.typed``)
    as one Parquet file per (date, hour) partition, as ``stage_records`` does for the records
    table: every column but ``date`` and ``hour`` in the file, in ``table``'s order (the order
    a Spark append of the same rows gives the table), no dictionary and no statistics for
    ``value``. Spark reads such a file by column name, so ``TableCatalog.commit_staged_typed``
    commits it only to a table whose columns are the file's (else it appends the rows with Spark).

    Raises:
        OSError: a file could not be written (nothing written is left behind).
    """
    if table.num_rows == 0:
        return StagedRecords()
    columns = list(table.column_names)
    typed = [c for c in columns if c not in COLUMNS]
    table = add_time_partitions(table, day_topics)
    keys = table.select(list(TYPED_PARTITION_COLUMNS)).group_by(list(TYPED_PARTITION_COLUMNS), use_threads=False) \
        .aggregate([]).to_pylist()
    files = []
    try:
        for values in keys:
            rows = table if len(keys) == 1 else table.filter(_partition_mask(table, values, TYPED_PARTITION_COLUMNS))
            files.append(_write(rows, staging_dir, tuple((c, values[c]) for c in TYPED_PARTITION_COLUMNS), codec,
                                columns, [*DICTIONARY_COLUMNS, *typed]))
    except BaseException:
        for f in files:
            _unlink(f.path)
        raise
    return StagedRecords(tuple(files))


def without(staged: StagedFile, exclude: set[tuple[str, int, int]], codec: str = "snappy") -> StagedFile | None:
    """``staged`` minus the rows in ``exclude``: the same file if it holds none of them, else a
    new staged file in its place (None if no row is left); the old file is removed.

    Raises:
        OSError: the file could not be read or written.
    """
    if not staged.holds_any(exclude):
        return staged
    table = pq.read_table(staged.path)
    columns = list(table.column_names)
    # the records table's files: topic is a partition column; a typed table's: one topic, a data column
    topic = next((v for c, v in staged.partition if c == "topic"), None) or staged.ranges[0][0]
    keep = [(topic, p, o) not in exclude for p, o in zip(table.column("partition").to_pylist(),
                                                          table.column("offset").to_pylist())]
    table = table.filter(pa.array(keep, pa.bool_()))
    _unlink(staged.path)
    if table.num_rows == 0:
        return None
    for c, v in staged.partition:
        table = table.append_column(c, pa.array([v] * table.num_rows, _partition_type(c)))
    if "topic" in columns:  # a typed table's file: its own columns again
        return _write(table, os.path.dirname(staged.path), staged.partition, codec, columns,
                      [*DICTIONARY_COLUMNS, *(c for c in columns if c not in COLUMNS)])
    return _write(table, os.path.dirname(staged.path), staged.partition, codec)


def _partition_type(column: str) -> pa.DataType:
    return pa.int32() if column == "hour" else pa.string()


def _partition_mask(table: pa.Table, values: dict[str, object],
                    partition_columns: tuple[str, ...] = PARTITION_COLUMNS) -> pa.ChunkedArray:
    mask = None
    for c in partition_columns:
        column = table.column(c)
        v = values[c]
        m = pc.is_null(column) if v is None else pc.fill_null(pc.equal(column, pa.scalar(v, column.type)), False)
        mask = m if mask is None else pc.and_(mask, m)
    return mask


def _write(rows: pa.Table, staging_dir: str, partition: tuple[tuple[str, object], ...], codec: str,
           columns: Sequence[str] = DATA_COLUMNS, dictionary: Sequence[str] = DICTIONARY_COLUMNS) -> StagedFile:
    """``rows``' ``columns`` as one Parquet file (one row group), ``dictionary`` columns dictionary
    encoded and with min/max statistics."""
    ranges = rows.group_by(["topic", "partition"], use_threads=False).aggregate(
        [("offset", "min"), ("offset", "max")]).to_pylist()
    path = os.path.join(staging_dir, f"part-{uuid.uuid4().hex}.c000.{'' if codec == 'none' else codec + '.'}parquet")
    try:
        pq.write_table(rows.select(list(columns)), path, compression=codec,
                       use_dictionary=list(dictionary), write_statistics=list(dictionary),
                       row_group_size=max(rows.num_rows, 1))
    except BaseException:
        _unlink(path)
        raise
    return StagedFile(path, partition, rows.num_rows,
                      tuple((r["topic"], r["partition"], r["offset_min"], r["offset_max"]) for r in ranges))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@dataclass(frozen=True, slots=True)
class Staging:
    """Where and how a sink stages its flushes' records (picklable: it goes to the decode worker).

    Attributes:
        directory: the staging directory (exists).
        day_topics: topics partitioned by day only.
        codec: Arrow compression codec (``arrow_codec``).
    """

    directory: str
    day_topics: frozenset[str] = frozenset()
    codec: str = "snappy"


def stage_flush(flush: FlushTables, staging: Staging) -> FlushTables:
    """``flush`` with its records-table rows and its typed topics' rows written to staged files
    (``stage_records``, ``stage_typed``); the dead letters stay an Arrow table (Spark appends them)."""
    if isinstance(flush.records, StagedRecords):
        return flush
    typed = {topic: table if isinstance(table, StagedRecords)
             else stage_typed(table, staging.directory, staging.day_topics, staging.codec)
             for topic, table in flush.typed.items()}
    return FlushTables(stage_records(flush.records, staging.directory, staging.day_topics, staging.codec),
                       typed, flush.dead_letters)
