"""A topic's Parquet data files read directly with pyarrow: footer statistics and decoded row groups.

Why: a Spark query costs 0.3-1 s here however few rows it returns, and a
consumer catching up from the table asks for ~1 MiB per partition per
Fetch. The catalog still says which files make a table (``inputFiles`` of
a query pruned to the topic: a compaction's swap or a retention drop shows
up there, ``pipeline.table.layout``); the rows themselves are read here,
without the JVM:

* ``RowGroups.from_files`` reads each file's footer once and keeps, per row
  group, the min/max of ``partition`` and ``offset`` (Parquet statistics;
  absent statistics count as "may hold anything"), so a read decodes only
  row groups that can hold the offsets asked for;
* ``DecodedGroup.decode`` reads one row group's ``READ_COLUMNS`` and sorts
  its rows by (partition, offset), once: every partition's rows of the row
  group are then a zero-copy slice found by binary search. A file written by
  one commit holds every partition of the topic mixed, so one decode serves
  the reads of every partition.

Spark writes timestamps as INT96 (``spark.sql.parquet.outputTimestampType``'s
default): read as microseconds (``coerce_int96_timestamp_unit``), the unit
Spark keeps, so nothing overflows and the values equal a Spark read.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.table.schema import ARROW_SCHEMA

_ANY_LOW = np.iinfo(np.int64).min
_ANY_HIGH = np.iinfo(np.int64).max


def local_file(uri: str) -> str | None:
    """The local path of a data file URI as Spark's ``inputFiles`` spells it (``file:///a%20b/c``),
    None for another scheme (``s3a://``, ``hdfs://``)."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file") or parsed.netloc not in ("", "localhost"):
        return None
    return unquote(parsed.path) if parsed.scheme else uri


@dataclass(frozen=True, slots=True)
class FooterGroups:
    """One file's row groups: (rows, partition min, max, offset min, max) each, from its footer."""

    path: str
    groups: tuple[tuple[int, int, int, int, int], ...]

    @classmethod
    def read(cls, path: str) -> FooterGroups:
        """Raises OSError (FileNotFoundError: the file is gone) or pyarrow's ArrowInvalid for a bad footer."""
        meta = pq.read_metadata(path)
        names = [meta.schema.column(i).path for i in range(meta.num_columns)]
        where = {name: names.index(name) for name in ("partition", "offset") if name in names}
        groups = []
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            bounds = []
            for name in ("partition", "offset"):
                stats = group.column(where[name]).statistics if name in where else None
                if stats is not None and stats.has_min_max:
                    bounds += [int(stats.min), int(stats.max)]
                else:
                    bounds += [_ANY_LOW, _ANY_HIGH]
            groups.append((group.num_rows, *bounds))
        return cls(path, tuple(groups))


_RECORDS_TYPES = {f.name: f.type for f in ARROW_SCHEMA if f.name not in ("topic", "partition")}


@dataclass(frozen=True, slots=True)
class RowGroups:
    """Every row group of a set of files, as parallel arrays (one element per row group).

    Attributes:
        paths: the files.
        file: (g,) index into ``paths``; index: (g,) the row group's index in its file.
        pmin, pmax, omin, omax: (g,) int64, statistics of ``partition`` and ``offset``.
    """

    paths: tuple[str, ...]
    file: np.ndarray
    index: np.ndarray
    pmin: np.ndarray
    pmax: np.ndarray
    omin: np.ndarray
    omax: np.ndarray

    @classmethod
    def from_footers(cls, footers: list[FooterGroups]) -> RowGroups:
        rows = [(f, i, *g[1:]) for f, footer in enumerate(footers) for i, g in enumerate(footer.groups) if g[0]]
        a = np.array(rows, np.int64).reshape(-1, 6)
        return cls(tuple(f.path for f in footers), a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4], a[:, 5])

    def candidates(self, partition: int, offset: int, end: int) -> np.ndarray:
        """Row groups that may hold rows of ``partition`` with ``offset <= o < end``, by ascending ``omin``."""
        hit = np.flatnonzero((self.pmin <= partition) & (self.pmax >= partition) & (self.omax >= offset)
                             & (self.omin < end))
        return hit[np.argsort(self.omin[hit], kind="stable")]


@dataclass(frozen=True, slots=True)
class DecodedGroup:
    """One row group's rows sorted by (partition, offset), with where each partition's rows are.

    Attributes:
        rows: the ``columns`` asked for (``offset`` among them), sorted.
        partitions: (k,) the partitions present, ascending.
        starts: (k + 1,) row index where each partition's rows start, then the row count.
        offsets: (rows,) int64.
        nbytes: Arrow buffer bytes of ``rows``.
    """

    rows: pa.Table
    partitions: np.ndarray
    starts: np.ndarray
    offsets: np.ndarray
    nbytes: int

    @classmethod
    def decode(cls, path: str, index: int, columns: tuple[str, ...], topic: str | None = None) -> DecodedGroup:
        """Read row group ``index`` of ``path`` (``columns`` plus ``partition``; rows of another topic
        dropped when the file has a ``topic`` column and ``topic`` is given).

        Raises:
            OSError (FileNotFoundError: the file is gone), pyarrow errors for a damaged file.
        """
        file = pq.ParquetFile(path, coerce_int96_timestamp_unit="us")
        has_topic = topic is not None and "topic" in file.schema_arrow.names
        wanted = [*columns, "partition", *(["topic"] if has_topic else [])]
        table = file.read_row_group(index, columns=wanted, use_threads=False)
        if has_topic:
            table = table.filter(pc.equal(table.column("topic"), topic))
        order = pc.sort_indices(table, sort_keys=[("partition", "ascending"), ("offset", "ascending")])
        parts = table.column("partition").to_numpy(zero_copy_only=False)[order.to_numpy()]
        if not _is_identity(order):
            table = table.take(order)
        offsets = table.column("offset").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        partitions, first = np.unique(parts, return_index=True)
        starts = np.append(first, len(parts)).astype(np.int64)
        rows = _canonical(table.select(list(columns))).combine_chunks()
        return cls(rows, partitions.astype(np.int64), starts, offsets, rows.nbytes)

    def slice(self, partition: int, offset: int, end: int) -> pa.Table:
        """The rows of ``partition`` with ``offset <= o < end`` (zero-copy), sorted by offset."""
        k = int(np.searchsorted(self.partitions, partition))
        if k == len(self.partitions) or self.partitions[k] != partition:
            return self.rows.slice(0, 0)
        lo, hi = int(self.starts[k]), int(self.starts[k + 1])
        a = lo + int(np.searchsorted(self.offsets[lo:hi], offset))
        b = lo + int(np.searchsorted(self.offsets[lo:hi], end))
        return self.rows.slice(a, b - a)


def _canonical(table: pa.Table) -> pa.Table:
    """``table`` with each column of the records table's schema (``pipeline.table.schema.ARROW_SCHEMA``)
    as that schema types it, so row groups of any writer concatenate: a file Spark wrote (a compaction's)
    has INT96 timestamps, read as naive ``timestamp[us]`` (Spark's INT96 is UTC, so only the time zone is
    added), where a staged commit's are ``timestamp[us, tz=UTC]``; its lists may name their items
    differently. Values are unchanged."""
    for i, field in enumerate(table.schema):
        want = _RECORDS_TYPES.get(field.name)
        if want is not None and field.type != want:
            table = table.set_column(i, pa.field(field.name, want, field.nullable), table.column(i).cast(want))
    return table


def _is_identity(order: pa.Array) -> bool:
    idx = order.to_numpy()
    return bool((idx == np.arange(len(idx))).all())
