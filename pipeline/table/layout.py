"""How records are laid out in the catalog tables, without Spark or I/O.

Every raw topic's records go to ONE catalog table, ``<database>.records``
(default ``pipeline.records``), with Spark's Kafka source columns plus two
time-partition columns computed from the record timestamp (UTC):

    partitioned by (topic string, date string 'YYYY-MM-DD', hour int 0-23)

A topic configured with day granularity has ``hour`` null (stored as Hive's
``__HIVE_DEFAULT_PARTITION__`` directory), so its files are per day; a record
without a timestamp (Kafka's -1, "no timestamp") has both ``date`` and ``hour``
null. One table rather than one per topic because a flush holds records of
many topics and one Spark job writes them all (a job costs 100-300 ms however
small); a topic with a typed value format gets a table of its own (see
``pipeline.table.values``).

A time-range query prunes directories when it filters on the partition
columns, e.g. ``WHERE topic = 'orders' AND date = '2026-11-23' AND hour >= 10``
(Spark cannot derive ``date``/``hour`` from a filter on ``timestamp``).

Compaction (``plan_compaction``) rewrites one time partition's files into
fewer, larger ones written to a NEW directory, then points the catalog
partition at it (``ALTER TABLE ... PARTITION ... SET LOCATION``): a reader
plans a query from the catalog and sees either the old set of files or the
new one, never both, never neither. The old directory is deleted only
``file.delete.delay.ms`` later (Kafka's name for the same delay before a
deleted log segment's file goes), so a query planned before the swap can
still read it.
"""

from __future__ import annotations

import enum
import math
import re
import time
from dataclasses import dataclass
from datetime import date, timedelta
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import pyarrow as pa

DEFAULT_DATABASE = "pipeline"
"""Catalog database holding the tables (``table.database``)."""

RECORDS_TABLE = "records"
"""The table of every raw topic's records."""

TABLES_DIR = "tables"
"""Table directories live at ``DATA_DIR/tables/<table>``."""

COMPACTED_DIR = "_compacted"
"""Compacted partition directories live at ``<table dir>/_compacted/<partition path>/v<ms>``
(a leading underscore: never mistaken for a partition directory)."""

PARTITION_COLUMNS: tuple[str, ...] = ("topic", "date", "hour")
"""Partition columns of the records table, in directory order."""

DEFAULT_TARGET_FILE_BYTES = 128 * 1024 * 1024
"""``table.target.file.bytes``: size compaction aims for, and the largest Spark commit (bytes)."""

DEFAULT_COMMIT_INTERVAL_MS = 10_000
"""``table.commit.interval.ms``: with ``--ack-on wal``, how long records wait to be committed to the table."""

DEFAULT_COMMIT_IDLE_MS = 1_000
"""``table.commit.idle.ms``: with ``--ack-on wal``, a commit also goes once no record has arrived for
this long (ms) and the records waiting hold at least ``COMMIT_IDLE_MIN_BYTES``; 0: only the interval."""

COMMIT_IDLE_MIN_BYTES = 4 * 1024 * 1024
"""The smallest commit ``table.commit.idle.ms`` makes (bytes): below it a quiet input's records wait
for ``table.commit.interval.ms``, so a trickle is not written as one small file per quiet second."""

DEFAULT_COMPACTION_INTERVAL_MS = 300_000
"""``table.compaction.interval.ms``: how often the server looks for partitions to compact."""

DEFAULT_COMPACTION_MIN_FILES = 4
"""``table.compaction.min.files``: a partition is compacted once it has this many small files."""

DEFAULT_FILE_DELETE_DELAY_MS = 60_000
"""``file.delete.delay.ms`` (Kafka's default): how long a replaced directory is kept for readers."""


class Granularity(str, enum.Enum):
    """Time partitioning of a topic's rows (``table.partition.granularity``)."""

    HOUR = "hour"
    DAY = "day"


_NOT_IDENTIFIER = re.compile(r"[^0-9a-z_]")


def table_name_for_topic(topic: str) -> str:
    """A Hive-metastore-valid table name for ``topic`` (lower case, ``[0-9a-z_]``).

    Kafka topic names are ``[a-zA-Z0-9._-]`` (Kafka ``Topic.validate``); the
    metastore takes ``[0-9a-z_]`` and folds case, so other characters become
    ``_`` and, when that changed the name, a short stable hash of the topic is
    appended so ``a.b`` and ``a_b`` never share a table.

    Raises:
        ValueError: ``topic`` is empty.
    """
    if not topic:
        raise ValueError("empty topic name")
    name = _NOT_IDENTIFIER.sub("_", topic.lower())
    if name != topic:
        import zlib

        name = f"{name}_{zlib.crc32(topic.encode()) & 0xFFFFFF:06x}"
    return name


_EPOCH = date(1970, 1, 1)
_US_PER_DAY = 86_400_000_000
_US_PER_HOUR = 3_600_000_000


def add_time_partitions(table: pa.Table, day_topics: frozenset[str] = frozenset()) -> pa.Table:
    """Append the ``date`` (string) and ``hour`` (int32) partition columns to a records table.

    Args:
        table: rows with at least ``topic`` (string) and ``timestamp``
            (``timestamp[us, tz=UTC]``) columns.
        day_topics: topics partitioned by day only (their ``hour`` is null).

    Returns:
        ``table`` with two more columns, computed in UTC: ``date`` is
        ``YYYY-MM-DD`` and ``hour`` 0-23; both null where the timestamp is
        null or before the epoch (Kafka's -1 means "no timestamp").
    """
    # Arrow here, not at the top: the configuration reads this module's defaults, and every
    # `pipeline` command loads the configuration (a cached module lookup per call after the first).
    import pyarrow as pa
    import pyarrow.compute as pc

    us = table.column("timestamp").cast(pa.int64())
    valid = pc.and_(pc.is_valid(us), pc.greater_equal(us, 0))
    # Integer arithmetic on microseconds since the epoch, and one string per distinct day:
    # ``pc.strftime`` formatted every row (12 % of the decode worker's time at 1 KiB records).
    day = pc.divide(pc.if_else(valid, us, 0), _US_PER_DAY)  # valid rows are >= 0: floor division
    days = pc.unique(pc.filter(day, valid))
    names = pa.array([(_EPOCH + timedelta(days=d)).isoformat() for d in days.to_pylist()], pa.string())
    dates = pc.if_else(valid, pc.take(names, pc.index_in(day, value_set=days)), pa.scalar(None, pa.string()))
    hours = pc.subtract(pc.divide(pc.if_else(valid, us, 0), _US_PER_HOUR), pc.multiply(day, 24))
    hour = pc.if_else(valid, hours.cast(pa.int32()), pa.scalar(None, pa.int32()))
    if day_topics:
        is_day = pc.is_in(table.column("topic"), value_set=pa.array(sorted(day_topics), pa.string()))
        hour = pc.if_else(is_day, pa.scalar(None, pa.int32()), hour)
    return table.append_column("date", dates).append_column("hour", hour)


def partition_spec_sql(values: dict[str, object]) -> str:
    """``PARTITION (...)`` clause body for ``ALTER TABLE``: ``topic='t', date='d', hour=3``.

    A None value is ``null``: Hive's default partition (``__HIVE_DEFAULT_PARTITION__``).

    Raises:
        ValueError: a string value holds a quote or backslash (Kafka topic
            names and dates never do).
    """
    parts = []
    for column, value in values.items():
        if value is None:
            parts.append(f"`{column}`=null")
        elif isinstance(value, int):
            parts.append(f"`{column}`={value}")
        else:
            text = str(value)
            if "'" in text or "\\" in text:
                raise ValueError(f"partition value {text!r} of {column} is not a plain literal")
            parts.append(f"`{column}`='{text}'")
    return ", ".join(parts)


def partition_path(values: dict[str, object]) -> str:
    """Hive-style relative directory of a partition: ``topic=t/date=d/hour=3``."""
    return "/".join(f"{c}={'__HIVE_DEFAULT_PARTITION__' if v is None else v}" for c, v in values.items())


def compacted_location(table_dir: str, values: dict[str, object], now_ms: int | None = None) -> str:
    """A new, unique directory for a compacted partition: ``<table_dir>/_compacted/<partition path>/v<ms>``."""
    stamp = int(time.time() * 1000) if now_ms is None else now_ms
    return f"{table_dir.rstrip('/')}/{COMPACTED_DIR}/{partition_path(values)}/v{stamp}"


@dataclass(frozen=True, slots=True)
class DataFile:
    """One data file of a partition: its path and size (bytes)."""

    path: str
    size: int


def plan_compaction(files: Sequence[DataFile], target_file_bytes: int, min_files: int) -> int | None:
    """How many files one partition's files should be merged into, or None to leave it.

    A file is small below half the target size (Kafka's log cleaner merges
    segments up to a size in the same way). A partition is compacted when it
    has at least ``min_files`` small files, into
    ``ceil(total bytes / target_file_bytes)`` files (at least 1), only if that
    reduces the file count.

    Args:
        files: the partition's data files.
        target_file_bytes: ``table.target.file.bytes``.
        min_files: ``table.compaction.min.files`` (>= 2).

    Raises:
        ValueError: ``target_file_bytes`` < 1 or ``min_files`` < 2.
    """
    if target_file_bytes < 1 or min_files < 2:
        raise ValueError(f"target_file_bytes must be >= 1 and min_files >= 2, got {target_file_bytes}, {min_files}")
    small = sum(1 for f in files if f.size < target_file_bytes // 2)
    if small < min_files:
        return None
    out = max(1, math.ceil(sum(f.size for f in files) / target_file_bytes))
    return out if out < len(files) else None
