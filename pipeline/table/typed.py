"""One flush's rows, split by destination table: raw topics, typed topics, dead letters.

Sans-I/O and Spark-free: runs in the decode worker process right after the
records are decoded (``build_flush``), so parsing values costs the event
loop nothing.

* A topic without a value format goes to the records table (``COLUMNS``).
* A topic with one (``value.format`` json, avro or protobuf) goes to a table of its
  own, ``<database>.<table_name_for_topic(topic)>``: the raw Kafka-source
  columns, then one column per typed field (``pipeline.table.values``). A
  typed field named like a raw column (``key``, ``timestamp``, ...) or a
  partition column is renamed ``value_<name>``.
* A record of a typed topic whose value does not parse goes to the dead
  letters (``<database>.dead_letters``): the raw columns plus ``error``, the
  reason. It is in exactly one of the two tables, never dropped, and the
  other records of its batch land as usual.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.table.schema import ARROW_SCHEMA, COLUMNS
from pipeline.table.values import ValueFormat, parse_values

if TYPE_CHECKING:  # the decode worker's entry points import them; the live view's tail only splits
    from pipeline.log.batch import AppendColumns, PartitionAppend
    from pipeline.log.wal import WalSpan

DEAD_LETTERS_TABLE = "dead_letters"
"""The dead-letter table's name (in the table database)."""

DEAD_LETTER_SCHEMA = ARROW_SCHEMA.append(pa.field("error", pa.string()))

RESERVED_NAMES = frozenset({*COLUMNS, "date", "hour", "error"})


@dataclass(frozen=True, slots=True)
class NoSchema:
    """A typed topic whose schema cannot be had now (e.g. its registry subject has no version yet):
    every record of it in a flush is a dead letter with ``reason``, never dropped, never raw."""

    reason: str


TopicFormat = ValueFormat | NoSchema
"""How one typed topic's values are decoded in a flush."""


def typed_column_name(name: str) -> str:
    """The column a typed field becomes: its own name, or ``value_<name>`` if that is taken."""
    return f"value_{name}" if name in RESERVED_NAMES else name


@dataclass(slots=True)
class FlushTables:
    """The rows of one flush by destination.

    Attributes:
        records: raw topics' rows (``ARROW_SCHEMA``).
        typed: typed topic -> its good rows (``ARROW_SCHEMA`` + typed columns).
        dead_letters: typed topics' rows that did not parse (``DEAD_LETTER_SCHEMA``).
    """

    records: pa.Table
    typed: dict[str, pa.Table] = field(default_factory=dict)
    dead_letters: pa.Table = field(default_factory=DEAD_LETTER_SCHEMA.empty_table)

    @property
    def num_rows(self) -> int:
        return self.records.num_rows + sum(t.num_rows for t in self.typed.values()) + self.dead_letters.num_rows

    def without(self, exclude: set[tuple[str, int, int]]) -> "FlushTables":
        """The same rows minus the (topic, partition, offset) in ``exclude`` (already in the table)."""
        if not exclude:
            return self
        return FlushTables(_without(self.records, exclude),
                           {t: _without(table, exclude) for t, table in self.typed.items()},
                           _without(self.dead_letters, exclude))


def _without(table: pa.Table, exclude: set[tuple[str, int, int]]) -> pa.Table:
    keep = [(t, p, o) not in exclude for t, p, o in zip(
        table.column("topic").to_pylist(), table.column("partition").to_pylist(), table.column("offset").to_pylist())]
    return table.filter(pa.array(keep, pa.bool_()))


def split_typed(table: pa.Table, formats: dict[str, TopicFormat]) -> FlushTables:
    """Split a decoded flush (``ARROW_SCHEMA``) by destination; see the module docstring."""
    if not formats or table.num_rows == 0:
        return FlushTables(table)
    topics = table.column("topic")
    typed_topics = pa.array(sorted(formats), pa.string())
    raw = table.filter(pc.invert(pc.is_in(topics, value_set=typed_topics)))
    typed: dict[str, pa.Table] = {}
    dead: list[pa.Table] = []
    for topic in sorted(formats):
        of_topic = pc.equal(topics, topic)
        # a flush of one topic (a sustained producer's) is taken whole: a filter copies every value
        rows = table if pc.all(of_topic).as_py() else table.filter(of_topic)
        if rows.num_rows == 0:
            continue
        fmt = formats[topic]
        if isinstance(fmt, NoSchema):
            dead.append(rows.append_column("error", pa.array([fmt.reason] * rows.num_rows, pa.string())))
            continue
        columns, errors = parse_values(rows.column("value"), fmt, rows.column("headers"))
        ok = pc.is_null(errors)
        all_good = errors.null_count == len(errors)
        good = rows if all_good else rows.filter(ok)
        good_columns = columns if all_good else columns.filter(ok)
        for name in good_columns.column_names:
            good = good.append_column(typed_column_name(name), good_columns.column(name))
        typed[topic] = good
        bad = pc.invert(ok)
        if not all_good:
            dead.append(rows.filter(bad).append_column("error", errors.filter(bad)))
    dead_letters = pa.concat_tables(dead) if dead else DEAD_LETTER_SCHEMA.empty_table()
    return FlushTables(raw, typed, dead_letters)


def build_flush(appends: Sequence[PartitionAppend], formats: dict[str, TopicFormat]) -> FlushTables:
    """Decode ``appends`` (``appends_to_table``) and split the rows (``split_typed``): the decode worker's job."""
    from pipeline.table.arrow import appends_to_table

    return split_typed(appends_to_table(appends), formats)


def build_flush_from_columns(columns: AppendColumns, formats: dict[str, TopicFormat]) -> FlushTables:
    """``build_flush`` of the appends ``pipeline.log.batch.to_columns`` made (the decode worker's
    entry point: columns pickle much more cheaply than the appends themselves)."""
    from pipeline.log.batch import from_columns

    return build_flush(from_columns(columns), formats)


def build_flush_from_wal(columns: AppendColumns, wal_directory: str, spans: Sequence[WalSpan],
                         formats: dict[str, TopicFormat]) -> FlushTables:
    """``build_flush_from_columns`` for appends whose records are read from the write-ahead log:
    ``columns``' records column is ignored; append i's records are the bytes of ``spans[i]`` in
    ``wal_directory`` (``pipeline.log.wal.read_spans``). The decode worker's entry point when the
    persister hands it WAL positions instead of record bytes.

    Raises:
        ValueError: ``spans`` and the appends differ in number; see ``build_flush`` otherwise.
        OSError: a span could not be read (``read_spans``).
    """
    if len(spans) != len(columns[0]):
        raise ValueError(f"{len(spans)} WAL spans for {len(columns[0])} appends")
    from pipeline.log.batch import from_columns
    from pipeline.log.wal import read_spans

    records = read_spans(wal_directory, spans)
    return build_flush(from_columns((*columns[:3], records, *columns[4:])), formats)
