"""The table side of Fetch and ListOffsets: records the write-ahead log no longer holds, read back
from the Spark tables as Kafka RecordBatch v2 bytes with their original offsets.

Once retention deletes a WAL segment, its records exist only in the tables
(``pipeline.records``, a typed topic's own table, ``pipeline.dead_letters``;
docs/table.md). A consumer fetching those offsets gets them from here:
``TableReader.read`` selects one topic-partition's rows by offset, and
``pipeline.table.batches.encode_batches`` turns them into RecordBatches
(magic 2) whose base offset and offset deltas give each record its original
offset, timestamp, timestamp type, key, value and headers: whole-column
numpy and Arrow work, byte for byte what kafka-python's
``DefaultRecordBatchBuilder`` builds, without a Python object per record.

Where the rows come from (``direct``, the default): the catalog says which
Parquet files make the tables (``DataFrame.inputFiles`` of a scan pruned to
the topic: one planning call, no Spark job), and pyarrow reads them
(``pipeline.table.files``): each file's footer once, for the min/max of
``partition`` and ``offset`` per row group; a row group that can hold the
offsets asked for is decoded once, sorted by (partition, offset), and kept in
an LRU cache bounded in bytes (``cache_bytes``). A file written by one commit
holds every partition of the topic, so one decode serves the reads of all of
them; each read is then a binary search and a zero-copy slice. Files not on
a local path (another machine's Spark) are read the old way, below.

A listing is a snapshot. Offsets are dense in the tables but for retention's
gaps, and per partition a commit adds offsets above every earlier one, so a
file committed after the listing shows as a gap (or no rows) in what a read
finds: the reader then lists again once before serving a gap; a listed file
a compaction has since deleted (after ``file.delete.delay.ms``) makes it list
again too. With ``warm=True`` (the server) a thread lists the records table
once at start, so the first consumer pays for neither the listing nor the
JVM's first planning of a table scan.

Without ``direct`` (or for non-local files): a Spark query costs tens to
hundreds of ms however few rows it returns, while a sequential consumer
catching up asks for ~1 MiB (``max.partition.fetch.bytes``) at a time. So a
miss reads one chunk (up to ``chunk_rows`` rows / ~``chunk_bytes``) of the
offsets at and after the one asked for, as Arrow (``DataFrame.toArrow``), and
keeps it in the same LRU cache keyed by (topic, partition). A chunk is an
offset *range* ``offset >= lo AND offset < lo + span``: Parquet's min/max
statistics on ``offset`` skip every file outside it. A range with no rows (a
retention gap) costs one more query, ``min(offset)`` after it, to jump the gap.

Measured: see docs/benchmarks.md ("Consuming"): from the table, librdkafka
reads 200,000 x 1 KiB records at 0.8-1.3x its rate from the WAL (0.06x with
Spark queries and kafka-python's builder). In-process, a warm reader serves
the same records in ~0.5 s (~400,000 records/s: listing 0.15 s, decoding
four row groups 0.12 s, encoding 0.2 s); kafka-python's builder took ~17 us a
record for the encoding alone.

Kafka rules followed: FetchRequest/KIP-74 (at least one whole record even if
it exceeds ``max_bytes``, for the first partition of a response), records
absent from the log are skipped as for compacted topics (the consumer goes by
each record's offset), ListOffsets by timestamp (the earliest offset whose
timestamp >= the target, Kafka ``UnifiedLog.fetchOffsetByTimestamp``) and
max timestamp (ListOffsets -3, KIP-734).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import reduce

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession

from pipeline.table.batches import CODEC_GZIP, CODEC_LZ4, CODEC_NONE, CODEC_SNAPPY, CODEC_ZSTD, HEADER_BYTES, encode_batches
from pipeline.table.catalog import OwnedTable, TableCatalog, _functions
from pipeline.table.files import DecodedGroup, FooterGroups, RowGroups, local_file
from pipeline.table.schema import ARROW_SCHEMA

log = logging.getLogger(__name__)

READ_COLUMNS: tuple[str, ...] = ("offset", "timestamp", "timestampType", "key", "value", "headers")
"""The columns a RecordBatch needs (topic and partition are the caller's)."""

DEFAULT_CHUNK_ROWS = 10_000
"""At most this many rows per Spark query."""
DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024
"""Aim for about this many bytes per Spark query, once a partition's row size is known."""
DEFAULT_COLD_CHUNK_ROWS = 1_000
"""Rows of the first query of a (topic, partition) whose row size is not known yet."""
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024
"""The cache's bound (Arrow buffer bytes of every cached chunk and decoded row group): a row group
Spark writes holds up to ~100,000 rows of every partition of a topic (~100 MiB of 1 KiB records), and a
consumer reading all partitions needs it until each has passed it, and the next one beside it."""

_MAX_FOOTERS = 100_000
"""Footers kept (files are immutable, so a footer never goes stale; this only bounds memory)."""
_NO_FILES = RowGroups.from_footers([])

CODECS = {"none": CODEC_NONE, "gzip": CODEC_GZIP, "snappy": CODEC_SNAPPY, "lz4": CODEC_LZ4, "zstd": CODEC_ZSTD}
"""``compression`` names (Kafka ``compression.type``) -> codec ids."""

BATCH_HEADER_BYTES = HEADER_BYTES
"""61: the RecordBatch v2 header (Kafka ``DefaultRecordBatch.RECORD_BATCH_OVERHEAD``)."""


@dataclass(frozen=True, slots=True)
class TableSlice:
    """What ``TableReader.read`` returns for one topic-partition.

    Attributes:
        records: zero or more concatenated RecordBatch v2 (magic 2), each
            batch's base offset + offset deltas giving the records' original
            offsets, ascending; offsets the tables lack are simply not there.
        next_offset: the offset after the last record returned; with
            ``records`` empty, ``end`` when the tables hold no offset in
            ``[offset, end)``, the offset asked for when they do but its
            record does not fit (``min_one`` false).
        size_bytes: ``len(records)``.
        record_count: records in ``records``.
    """

    records: bytes
    next_offset: int
    size_bytes: int
    record_count: int


@dataclass(slots=True)
class _Chunk:
    """Every row the tables hold with ``start <= offset < end``, sorted by offset."""

    start: int
    end: int
    offsets: np.ndarray
    rows: pa.Table
    nbytes: int


class TableReader:
    """Reads one topic-partition's records from the tables by offset or timestamp (see the module docstring).

    Every method blocks (Spark jobs, CPU-bound encoding): call it from a
    worker thread (``trio.to_thread.run_sync``). Thread-safe: any number of
    threads may call any method at once, also while the persister writes
    through the same SparkSession from its own thread; the cache is guarded
    by a lock that is never held during a Spark query (two threads missing
    on the same partition at once both query; the later chunk wins).

    What is cached, and when it can be stale: a chunk holds the rows of an
    offset range as they were when it was read. The reader relies on rows
    below the ``end`` its callers pass being final (committed to the table,
    which is what offsets whose WAL segments were deleted are); compaction
    rewrites the same rows, so it changes nothing; rows that retention drops
    may still be served from the cache until the chunk is evicted or
    ``invalidate`` is called. The Spark session caches each table's relation
    too (its schema and table metadata; file listings are not cached,
    ``catalog_conf``), and sees only its own changes in it: after
    ``invalidate``, the next read of the topic refreshes the tables it reads
    (``Catalog.refreshTable``) first, so another broker's changes are seen.

    Args:
        spark: a session on the tables' catalog (the server's own).
        catalog: the ``TableCatalog`` whose tables to read (its config says
            which topics are typed).
        chunk_rows: at most this many rows per Spark query (> 0).
        chunk_bytes: aim for about this many bytes per query (> 0), from the
            row size measured on the partition's previous chunk; the first
            query of a partition reads ``cold_chunk_rows`` rows.
        cold_chunk_rows: see ``chunk_bytes`` (> 0).
        cache_bytes: bound on the cached chunks' and decoded row groups'
            Arrow bytes (>= 0; 0: no cache). A chunk or row group larger than
            the bound is served, not cached.
        compression: codec of the batches built (Kafka ``compression.type``):
            none (default), gzip, snappy, lz4 or zstd; a batch that does not
            shrink is sent uncompressed (kafka-python's rule). ``max_bytes``
            always counts the uncompressed size.
        direct: read the Parquet files the catalog lists with pyarrow
            (``pipeline.table.files``); a topic whose files are not local
            paths is read with Spark queries either way. False: always Spark.
        warm: plan one listing now, in a thread of its own (``warm``), so the
            first consumer does not wait for the JVM's first planning of a
            table scan (1-10 s on a loaded 2-core machine, 0.3 s after).

    Raises:
        ValueError: a size is out of range or ``compression`` is unknown.
    """

    def __init__(self, spark: SparkSession, catalog: TableCatalog, *, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, cold_chunk_rows: int = DEFAULT_COLD_CHUNK_ROWS,
                 cache_bytes: int = DEFAULT_CACHE_BYTES, compression: str = "none", direct: bool = True,
                 warm: bool = False) -> None:
        if chunk_rows < 1 or chunk_bytes < 1 or cold_chunk_rows < 1 or cache_bytes < 0:
            raise ValueError(f"chunk_rows, chunk_bytes, cold_chunk_rows must be > 0 and cache_bytes >= 0, got "
                             f"{chunk_rows}, {chunk_bytes}, {cold_chunk_rows}, {cache_bytes}")
        if compression not in CODECS:
            raise ValueError(f"compression must be one of {sorted(CODECS)}, not {compression!r}")
        self.spark = spark
        self._F = _functions(spark)  # pyspark.sql.functions, or their Connect twins for a Connect session
        self.catalog = catalog
        self.chunk_rows = chunk_rows
        self.chunk_bytes = chunk_bytes
        self.cold_chunk_rows = cold_chunk_rows
        self.cache_bytes = cache_bytes
        self._codec = CODECS[compression]
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, int], _Chunk] = OrderedDict()
        self._cached_bytes = 0
        self._row_bytes: dict[tuple[str, int], float] = {}
        self._existing: set[str] = set()
        self._stale: set[str] = set()  # tables whose Spark relation the next read of theirs refreshes
        self._refreshing = threading.Lock()  # held while a stale table is refreshed (no other lock then)
        self.refreshes = 0
        """Tables refreshed before a read (``invalidate``)."""
        self.direct = direct
        self._listings: dict[str, RowGroups | None] = {}
        self._footers: dict[str, FooterGroups] = {}
        self._groups: OrderedDict[tuple[str, int], DecodedGroup] = OrderedDict()
        self.hits = 0
        """Reads served from the cache."""
        self.misses = 0
        """Reads that queried Spark or decoded a row group."""
        self.listings = 0
        """Catalog listings (Spark planning calls) of one topic's data files (the direct path)."""
        self.decoded = 0
        """Row groups decoded (the direct path)."""
        self._warm_files: dict[str, list[str]] = {}
        self.warming: threading.Thread | None = None
        """The thread ``warm=True`` started (it ends after one planning call)."""
        if warm and direct:
            # A daemon: one bounded planning call that must not hold up the server's exit.
            self.warming = threading.Thread(target=self.warm, name="table-reader-warm", daemon=True)
            self.warming.start()

    # -- Fetch ---------------------------------------------------------------------

    def read(self, topic: str, partition: int, offset: int, max_bytes: int, *, end: int,
             max_records: int | None = None, min_one: bool = True) -> TableSlice:
        """Records of ``topic``-``partition`` with ``offset <= o < end``, ascending, as RecordBatch v2 bytes.

        Args:
            topic, partition: the topic-partition.
            offset: the fetch offset (>= 0); the first record returned is the
                one with the smallest offset >= it the tables hold.
            max_bytes: bound on ``len(records)`` in bytes (Kafka's partition
                max bytes); whole records only, never a truncated one.
            end: exclusive bound (the high watermark, or where the WAL
                takes over): no record at or after it is returned.
            max_records: at most this many records (None: no bound).
            min_one: return the first record even when it alone exceeds
                ``max_bytes`` (Kafka ``minOneMessage``, KIP-74: true for the
                first partition of a fetch response that has data).

        Returns:
            ``TableSlice``; empty when the tables hold nothing in ``[offset, end)``
            (``next_offset == end``), or when the first record does not fit and
            ``min_one`` is false (``next_offset == offset``).

        Raises:
            ValueError: ``offset`` < 0, ``max_bytes`` < 0 or ``max_records`` < 1.
            Whatever Spark raises (pyspark.errors.*, py4j errors) for a failed query.
        """
        if offset < 0 or max_bytes < 0 or (max_records is not None and max_records < 1):
            raise ValueError(f"offset and max_bytes must be >= 0 and max_records >= 1, got "
                             f"{offset}, {max_bytes}, {max_records}")
        if offset >= end:
            return TableSlice(b"", offset, 0, 0)
        rows = self._rows(topic, partition, offset, end, max_bytes, max_records)
        if rows.num_rows == 0:
            return TableSlice(b"", end, 0, 0)
        return self._encode(rows, offset, max_bytes, max_records, min_one)

    def invalidate(self, topic: str | None = None, partition: int | None = None) -> None:
        """Forget cached rows: of one partition, of one topic (``partition`` None), or all (``topic`` None).

        The tables that can hold the topic's rows (every table for None) are refreshed before their next
        read (``Catalog.refreshTable``, one catalog call each, seconds on a busy Spark Connect server):
        not here, so that a caller on a latency path (a partition taken over, ``LeadershipService``) does
        not wait for it. Never raises; a failed refresh fails the read that makes it (and is made again
        by the next)."""
        typed = self.catalog.typed_tables
        tables = [t.name for t in ([self.catalog.records, self.catalog.dead_letters] + (
            list(typed.values()) if topic is None else [typed[topic]] if topic in typed else []))]
        with self._lock:
            self._stale.update(tables)
            for key in [k for k in self._cache if topic is None or (k[0] == topic and partition in (None, k[1]))]:
                self._cached_bytes -= self._cache.pop(key).nbytes
            listings = [t for t in self._listings if topic is None or t == topic]
            paths = {path for t in listings for path in (self._listings.pop(t) or _NO_FILES).paths}
            for key in [k for k in self._groups if k[0] in paths]:
                self._cached_bytes -= self._groups.pop(key).nbytes

    @property
    def cached_bytes(self) -> int:
        """Arrow bytes the cache holds now (<= ``cache_bytes``)."""
        with self._lock:
            return self._cached_bytes

    def warm(self) -> None:
        """List the records table's data files (one planning call, no job, no file read) and keep each
        raw topic's list for its first read: that read then skips its own listing, and the JVM has
        loaded what later listings use (catalog client, planner, partition pruning).

        The list is a snapshot like any listing here: files committed later show as a gap, which
        makes a read list again (``_rows``). Never raises: a failure (Spark stopping) is logged at
        debug level."""
        try:
            uris = self.spark.table(self.catalog.records.name).inputFiles()
        except Exception as exc:  # noqa: BLE001 - only a warm-up
            log.debug("table reader warm-up failed: %s", exc)
            return
        by_topic: dict[str, list[str]] = {}
        for uri in uris:
            path = local_file(uri)
            topic = _topic_of(path) if path is not None else None
            if topic is None:
                return  # not local, or not laid out as expected: every topic lists on its first read
            by_topic.setdefault(topic, []).append(path)  # type: ignore[arg-type]
        typed = set(self.catalog.typed_tables)  # typed topics have more tables: they list on first read
        with self._lock:
            self._warm_files = {t: files for t, files in by_topic.items() if t not in typed}

    # -- ListOffsets -----------------------------------------------------------------

    def earliest_offset(self, topic: str, partition: int) -> int | None:
        """The smallest offset the tables hold for the partition, None if they hold none.

        One Spark query over the ``offset`` column of the partition's rows.

        Raises:
            Whatever Spark raises.
        """
        row = self._frame(topic, partition).agg(self._F.min("offset")).collect()[0]
        return row[0]

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int,
                             end: int | None = None) -> tuple[int, int] | None:
        """Kafka ListOffsets by timestamp over the tables: the earliest offset whose timestamp is
        >= ``timestamp_ms``, and that record's timestamp (ms), or None when no record has one.

        The record timestamp is the one consumers see (CreateTime, or the
        broker's time for LogAppendTime; Kafka ``UnifiedLog.fetchOffsetByTimestamp``).
        Only time partitions at or after the target's date and hour are read.

        Args:
            timestamp_ms: ms since the epoch (>= 0; ListOffsets' special
                values -1, -2, -3 ... are the caller's).
            end: consider only offsets below it (None: all).

        Raises:
            ValueError: ``timestamp_ms`` < 0.
            Whatever Spark raises.
        """
        if timestamp_ms < 0:
            raise ValueError(f"timestamp_ms must be >= 0, got {timestamp_ms} (special ListOffsets values are "
                             "the caller's)")
        at = datetime.fromtimestamp(timestamp_ms / 1000, timezone.utc)
        date, hour = at.strftime("%Y-%m-%d"), at.hour

        def prune(owned: OwnedTable) -> Column:
            if "hour" not in owned.partition_columns:
                return self._F.col("date") >= self._F.lit(date)
            return (self._F.col("date") > self._F.lit(date)) | ((self._F.col("date") == self._F.lit(date)) & (
                self._F.col("hour").isNull() | (self._F.col("hour") >= self._F.lit(hour))))

        where = self._F.col("timestamp") >= self._F.timestamp_millis(self._F.lit(timestamp_ms))
        if end is not None:
            where = where & (self._F.col("offset") < self._F.lit(end))
        rows = (self._frame(topic, partition, where, prune).orderBy("offset").limit(1)
                .select("offset", self._F.unix_millis("timestamp")).collect())
        return (rows[0][0], rows[0][1]) if rows else None

    def max_timestamp(self, topic: str, partition: int, end: int | None = None) -> tuple[int, int] | None:
        """ListOffsets -3 (KIP-734) over the tables: the offset and timestamp (ms) of the record with the
        largest timestamp (the earliest such offset on a tie), None when the tables hold no record.

        One Spark query reading the ``offset`` and ``timestamp`` columns of every row of the partition.

        Raises:
            Whatever Spark raises.
        """
        where = None if end is None else self._F.col("offset") < self._F.lit(end)
        rows = (self._frame(topic, partition, where).orderBy(self._F.col("timestamp").desc(), self._F.col("offset").asc())
                .limit(1).select("offset", self._F.unix_millis("timestamp")).collect())
        return (rows[0][0], rows[0][1]) if rows else None

    # -- internals -------------------------------------------------------------------

    def _sources(self, topic: str) -> list[tuple[OwnedTable, bool]]:
        """(table, filter on topic?) of every table that can hold the topic's rows, each refreshed first
        if ``invalidate`` made it stale.

        Raw topics are in the records table; a typed topic's rows are in its
        own table or the dead letters, and its rows from before it was typed
        in the records table. A table not created yet (no write) is skipped.

        Raises:
            Whatever Spark raises for a failed refresh (the table stays stale).
        """
        out = [(self.catalog.records, True)]
        typed = self.catalog.typed_tables.get(topic)
        for owned, by_topic in ([(typed, False)] if typed else []) + [(self.catalog.dead_letters, True)]:
            if owned.name in self._existing or self.spark.catalog.tableExists(owned.name):
                with self._lock:
                    self._existing.add(owned.name)
                out.append((owned, by_topic))
        with self._refreshing:  # a read of a table being refreshed waits for the refresh
            for owned, _ in out:
                with self._lock:  # marked again by an invalidate during the refresh: refreshed again
                    if owned.name not in self._stale:
                        continue
                    self._stale.discard(owned.name)
                try:
                    self.spark.catalog.refreshTable(owned.name)
                except BaseException:
                    with self._lock:
                        self._stale.add(owned.name)
                    raise
                with self._lock:
                    self.refreshes += 1
        return out

    def _frame(self, topic: str, partition: int, where: Column | None = None,
               prune: Callable[[OwnedTable], Column] | None = None) -> DataFrame:
        """The partition's rows of every source table (``READ_COLUMNS``), filtered by ``where`` (and by
        ``prune(table)``, a condition on the table's partition columns)."""
        frames = []
        for owned, by_topic in self._sources(topic):
            conditions = [self._F.col("partition") == self._F.lit(partition)]
            if by_topic:
                conditions.insert(0, self._F.col("topic") == self._F.lit(topic))
            if prune is not None:
                conditions.append(prune(owned))
            if where is not None:
                conditions.append(where)
            frames.append(self.spark.table(owned.name).where(reduce(lambda a, b: a & b, conditions))
                          .select(*READ_COLUMNS))
        return reduce(DataFrame.unionByName, frames)

    def _query(self, topic: str, partition: int, lo: int, hi: int) -> pa.Table:
        """Rows with ``lo <= offset < hi``, sorted by offset, one row per offset."""
        where = (self._F.col("offset") >= self._F.lit(lo)) & (self._F.col("offset") < self._F.lit(hi))
        rows = self._frame(topic, partition, where).toArrow()
        if rows.num_rows == 0:
            return rows
        return _sorted_unique(rows)

    def _rows(self, topic: str, partition: int, offset: int, end: int, max_bytes: int,
              max_records: int | None) -> pa.Table:
        """The rows at and after ``offset`` below ``end``: from the data files (``_rows_direct``), or from
        the chunk cache or one chunk query (``_rows_spark``)."""
        if self.direct:
            with self._lock:
                known = topic in self._listings
                listing = self._listings.get(topic)
            fresh = False
            if not known:
                listing, fresh = self._list(topic)
            while listing is not None:
                try:
                    rows = self._rows_direct(listing, topic, partition, offset, end, max_bytes, max_records)
                except FileNotFoundError:  # a compaction's or retention's delayed deletion: list again
                    if fresh:
                        raise
                else:
                    offsets = rows.column("offset")
                    # Offsets are dense but for retention's gaps; a listing made before a commit misses its
                    # files, which shows as a gap: list again once before serving one.
                    dense = rows.num_rows and offsets[0].as_py() == offset \
                        and offsets[-1].as_py() - offset + 1 == rows.num_rows
                    if dense:
                        return rows
                    if fresh:
                        if not rows.num_rows or offsets[0].as_py() != offset:
                            log.info("%s-%d: the tables hold no offset in [%d, %s) (%d data files listed)",
                                     topic, partition, offset, offsets[0].as_py() if rows.num_rows else end,
                                     len(listing.paths))
                        return rows
                listing, fresh = self._list(topic, warm=False)
        return self._rows_spark(topic, partition, offset, end, max_records)

    def _list(self, topic: str, warm: bool = True) -> tuple[RowGroups | None, bool]:
        """The row groups of every data file that can hold the topic's rows, from the catalog (one
        planning call per source table, no job), or from the warm-up's listing if ``warm`` and it has
        one for the topic; None when a file is not on a local path. And whether it was listed now."""
        with self._lock:
            warm_paths = self._warm_files.pop(topic, None)
        listed_now = warm_paths is None or not warm
        paths: list[str | None] = list(warm_paths or [])
        if listed_now:
            with self._lock:
                self.listings += 1
            uris = []
            for owned, by_topic in self._sources(topic):
                frame = self.spark.table(owned.name)
                if by_topic:
                    frame = frame.where(self._F.col("topic") == self._F.lit(topic))
                uris += frame.inputFiles()
            paths = [local_file(u) for u in uris]
        listing = None
        local = [p for p in paths if p is not None]
        if len(local) == len(paths):
            footers = []
            for path in sorted(set(local)):
                footer = self._footers.get(path)
                if footer is None:
                    try:
                        footer = FooterGroups.read(path)
                    except FileNotFoundError:  # replaced since the warm-up listed it
                        if listed_now:
                            raise
                        return self._list(topic, warm=False)
                footers.append(footer)
            listing = RowGroups.from_footers(footers)
        with self._lock:
            if listing is not None:
                if len(self._footers) > _MAX_FOOTERS:
                    self._footers.clear()
                self._footers.update((f.path, f) for f in footers)
            self._listings[topic] = listing
        return listing, listed_now

    def _rows_direct(self, listing: RowGroups, topic: str, partition: int, offset: int, end: int,
                     max_bytes: int, max_records: int | None) -> pa.Table:
        """Rows of the partition from ``offset`` on, below ``end``, that the listed row groups hold, up to
        the first offset a row group not decoded yet could hold.

        Row groups are decoded by ascending smallest offset until the rows complete so far (those
        below the next one's smallest offset) fill ``max_bytes`` (Arrow bytes, an estimate of the
        encoded size) or ``max_records``, or none is left."""
        candidates = listing.candidates(partition, offset, end)
        parts: list[tuple[pa.Table, np.ndarray, float]] = []
        bound = end
        decoded = False
        for i, g in enumerate(candidates.tolist()):
            key = (listing.paths[listing.file[g]], int(listing.index[g]))
            with self._lock:
                group = self._groups.get(key)
                if group is not None:
                    self._groups.move_to_end(key)
            if group is None:
                decoded = True
                group = DecodedGroup.decode(key[0], key[1], READ_COLUMNS, topic)
                with self._lock:
                    self.decoded += 1
                self._keep(key, group)
            part = group.slice(partition, offset, end)
            if part.num_rows:
                parts.append((part, part.column("offset").to_numpy(), group.nbytes / max(1, group.rows.num_rows)))
            # Every row below the next candidate's smallest offset is among the row groups decoded.
            bound = int(listing.omin[candidates[i + 1]]) if i + 1 < len(candidates) else end
            below = [int(np.searchsorted(offsets, bound)) for _, offsets, _ in parts]
            rows_below = sum(below)
            if rows_below and (sum(k * size for k, (_, _, size) in zip(below, parts)) >= max_bytes
                               or (max_records is not None and rows_below >= max_records)):
                break
        with self._lock:
            if decoded:
                self.misses += 1
            else:
                self.hits += 1
        tables = [part.slice(0, int(np.searchsorted(offsets, bound))) for part, offsets, _ in parts]
        tables = [t for t in tables if t.num_rows]
        if not tables:
            return _empty_rows()
        return tables[0] if len(tables) == 1 else _sorted_unique(pa.concat_tables(tables))

    def _keep(self, key: tuple[str, int], group: DecodedGroup) -> None:
        with self._lock:
            old = self._groups.pop(key, None)
            if old is not None:
                self._cached_bytes -= old.nbytes
            if group.nbytes <= self.cache_bytes:
                self._groups[key] = group
                self._cached_bytes += group.nbytes
                while self._cached_bytes > self.cache_bytes:
                    if self._groups and (not self._cache or len(self._groups) > 1):
                        self._cached_bytes -= self._groups.popitem(last=False)[1].nbytes
                    else:
                        self._cached_bytes -= self._cache.popitem(last=False)[1].nbytes

    def _rows_spark(self, topic: str, partition: int, offset: int, end: int, max_records: int | None) -> pa.Table:
        """The rows at and after ``offset`` below ``end`` that the cache or one chunk query has."""
        key = (topic, partition)
        with self._lock:
            chunk = self._cache.get(key)
            if chunk is not None and chunk.start <= offset < chunk.end:
                lo = int(np.searchsorted(chunk.offsets, offset))
                hi = int(np.searchsorted(chunk.offsets, end))
                if hi > lo:
                    self._cache.move_to_end(key)
                    self.hits += 1
                    return chunk.rows.slice(lo, hi - lo)
                if end <= chunk.end:  # the tables hold nothing in [offset, end)
                    self.hits += 1
                    return chunk.rows.slice(0, 0)
                offset = chunk.end  # [offset, chunk.end) is empty: read on from there
            self.misses += 1
            row_bytes = self._row_bytes.get(key)
        span = self.cold_chunk_rows if row_bytes is None else int(self.chunk_bytes // max(row_bytes, 1.0))
        span = max(1, min(self.chunk_rows, span))
        start, lo = offset, offset
        while True:
            hi = min(end, lo + span)
            rows = self._query(topic, partition, lo, hi)
            if rows.num_rows:
                break
            if hi >= end:
                return rows
            # A gap (retention dropped a time partition): jump to the next offset the tables hold.
            nxt = self._frame(topic, partition, (self._F.col("offset") >= self._F.lit(hi)) & (self._F.col("offset") < self._F.lit(end))) \
                .agg(self._F.min("offset")).collect()[0][0]
            if nxt is None:
                return rows
            lo = nxt
        offsets = rows.column("offset").to_numpy()
        chunk = _Chunk(start, int(offsets[-1]) + 1, offsets, rows, rows.nbytes)
        with self._lock:
            self._row_bytes[key] = chunk.nbytes / rows.num_rows
            old = self._cache.pop(key, None)
            if old is not None:
                self._cached_bytes -= old.nbytes
            if chunk.nbytes <= self.cache_bytes:
                self._cache[key] = chunk
                self._cached_bytes += chunk.nbytes
                while self._cached_bytes > self.cache_bytes:
                    if len(self._cache) > 1 or not self._groups:
                        self._cached_bytes -= self._cache.popitem(last=False)[1].nbytes
                    else:
                        self._cached_bytes -= self._groups.popitem(last=False)[1].nbytes
        return rows

    def _encode(self, rows: pa.Table, offset: int, max_bytes: int, max_records: int | None,
                min_one: bool) -> TableSlice:
        """RecordBatches of ``rows`` (sorted by offset) within ``max_bytes`` and ``max_records``.

        A batch ends where the timestamp type changes, or, for LogAppendTime,
        where the timestamp does: every record of a LogAppendTime batch has
        the batch's max timestamp (Kafka ``DefaultRecordBatch``).
        """
        rows = rows.slice(0, max_records) if max_records is not None else rows
        rows = rows.slice(0, _fit(rows, max_bytes))
        if rows.num_rows == 0:
            return TableSlice(b"", offset, 0, 0)
        columns = {name: _array(rows.column(name)) for name in READ_COLUMNS}
        offsets = columns["offset"].to_numpy(zero_copy_only=False)
        # Stored as microseconds (Kafka's ms * 1000); null never written, read as Kafka's -1 (no timestamp).
        ts_us = columns["timestamp"].cast(pa.int64()).fill_null(-1000).to_numpy(zero_copy_only=False)
        types = columns["timestampType"].fill_null(0).to_numpy(zero_copy_only=False)
        records, count = encode_batches(offsets, ts_us // 1000, types, columns["key"], columns["value"],
                                        columns["headers"], max_bytes, min_one=min_one, codec=self._codec)
        if count == 0:
            return TableSlice(b"", offset, 0, 0)
        return TableSlice(records, int(offsets[count - 1]) + 1, len(records), count)


def _topic_of(path: str) -> str | None:
    """The topic of a records-table data file, from its Hive partition directory (``.../topic=<name>/...``;
    Kafka topic names use no character Hive escapes); None if the path has none."""
    for part in reversed(path.split("/")):
        if part.startswith("topic="):
            return part[len("topic="):]
    return None


def _fit(rows: pa.Table, max_bytes: int) -> int:
    """How many of ``rows`` could fit in ``max_bytes`` at their smallest (7 bytes plus key and value a
    record, plus one batch header), at least 1: a bound on what ``encode_batches`` takes, found
    without copying the rows."""
    n = min(rows.num_rows, max(1, max_bytes // 7))
    rows = rows.slice(0, n)
    sizes = [pc.binary_length(rows.column(c)).fill_null(0).to_numpy() for c in ("key", "value")]
    smallest = np.cumsum(7 + sizes[0].astype(np.int64) + sizes[1]) + BATCH_HEADER_BYTES
    return max(1, min(n, int(np.searchsorted(smallest, max_bytes, side="right")) + 1))


def _sorted_unique(rows: pa.Table) -> pa.Table:
    """``rows`` sorted by offset, one row per offset."""
    offsets = [c.to_numpy() for c in rows.column("offset").chunks]
    if all(len(o) for o in offsets) and all((np.diff(o) > 0).all() for o in offsets) \
            and all(a[-1] < b[0] for a, b in zip(offsets, offsets[1:])):
        return rows  # already in order: no copy
    rows = rows.take(pc.sort_indices(rows.column("offset")))
    offsets = rows.column("offset").to_numpy()
    if len(offsets) > 1 and not (np.diff(offsets) > 0).all():  # never expected: one table per offset
        keep = np.concatenate(([True], np.diff(offsets) > 0))
        rows = rows.filter(pa.array(keep))
    return rows


def _empty_rows() -> pa.Table:
    return pa.schema([ARROW_SCHEMA.field(c) for c in READ_COLUMNS]).empty_table()


def _array(column: pa.ChunkedArray) -> pa.Array:
    """One contiguous array (zero-copy when the column has one chunk)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
