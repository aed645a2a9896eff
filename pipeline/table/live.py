"""The live view: the committed table plus the acknowledged records not yet committed, each once.

``pipeline.records_live`` is a view in the catalog (beside ``pipeline.records``)::

    SELECT <columns> FROM pipeline.records      WHERE offset < end(topic, partition)
    UNION ALL
    SELECT <columns> FROM pipeline.records_tail WHERE _boundary = '<the same ends>'

**The boundary.** After a table commit the server publishes the view again (``view_sql``) with
each partition's *prefix end* ``end(topic, partition)``: every record below it is in the table
(or never becomes a row: aborted, a transaction marker, a typed topic's dead letter). It is the
commit's own end offset, lowered to the first record of a transaction not yet in the table
(``pipeline.persist.persister.Persister.prefix_ends``), and the view text carries it twice, as
literals: in the table side's filter, and in the tail side's ``_boundary`` filter, which Spark
pushes down to ``records_tail`` (``LiveTailReader.pushFilters``). A query resolves the view once,
so both sides use the same boundary, whatever commits land while it runs:

- the table side keeps the rows below the boundary. Commits only add rows and publish after
  the commit has completed, so when the view is read the table holds all of them; rows of a
  later commit (or of one half done) are at or above the boundary and left out;
- the tail side reads each partition from the boundary to its last stable offset at planning
  (Kafka's LSO: read_committed, so an open transaction's records and aborted ones never show,
  as in the table), through the brokers' own Fetch (kafka-python's consumer: each partition
  from its leader, on one broker or many hosts).

Compaction swaps a partition's files in one catalog call and keeps every row; retention drops
whole time partitions from the table, and so from the view. So every acknowledged record whose
offset was below the LSO when the query was planned is in the result exactly once.

**The tail** (``records_tail``) is a catalog table of this module's Python data source
(``LiveTail``, name ``pipeline_live``, found by Spark through the ``pyspark_pipeline`` module:
pyspark registers every installed ``pyspark_*`` module's ``DefaultSource``). Spark plans it in a
Python worker (``LiveTailReader.partitions``: one input partition per topic-partition with
records past the boundary) and reads each on an executor. Filters on ``topic``, ``partition``
and ``offset`` prune partitions and offsets before anything is fetched; every other filter is
applied by Spark to the rows read. Read alone (no ``_boundary``), it reads every record the
brokers serve. Spark runs it only with ``spark.sql.python.filterPushdown.enabled=true``
(``SESSION_CONF``; the server's and ``pipeline sql``'s sessions set it; a session without it
gets Spark's DATA_SOURCE_PUSHDOWN_DISABLED naming it).

**After a clean stop** of a server alone the view is published with ``stopped``: the tail
reads nothing and connects to nothing, and the view equals the table, which then holds
everything acknowledged.

Sans-I/O except ``LiveTailReader`` (the Kafka consumer); no Spark session is needed here.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import pyarrow as pa

from pipeline.table.layout import add_time_partitions
from pipeline.table.schema import ARROW_SCHEMA, COLUMNS

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from pipeline.table.typed import TopicFormat

SOURCE_NAME = "pipeline_live"
"""The Python data source's name (``USING pipeline_live``)."""

LIVE_SUFFIX = "_live"

LIVE_DIR = "live"
"""Each broker's prefix ends, ``DATA_DIR/_pipeline/live/<hash>.json`` (``SparkGroupSink.publish_live``)."""
"""A table's live view is named after it: ``records`` -> ``records_live``."""

TAIL_SUFFIX = "_tail"
TAIL_TABLE = "records" + TAIL_SUFFIX
"""The catalog table of the tail data source, beside ``records`` (a typed topic's table ``t``:
``t_tail``)."""

BOUNDARY_COLUMN = "_boundary"
"""The tail's parameter column: the view's ``_boundary = '<json>'`` filter carries the boundary."""

TABLE_COLUMNS: tuple[str, ...] = (*COLUMNS, "date", "hour")
"""The records table's columns, partition columns last (its order in the catalog)."""

SESSION_CONF: dict[str, str] = {"spark.sql.python.filterPushdown.enabled": "true"}
"""What a Spark session needs to read the live view (a runtime SQL conf: ``spark.conf.set`` works)."""

PUBLISH_INTERVAL_S = 1.0
"""The view is published again after a commit at most this often (s): with ``--ack-on spark``
commits come every ``linger.ms``, and a catalog call each would double their cost. An older
boundary is still exact, only the tail is longer."""

READ_TIMEOUT_MS = 30_000
"""A tail partition whose fetches make no progress for this long (ms) fails the task
(Kafka's ``request.timeout.ms`` default)."""

BATCH_ROWS = 10_000
"""Rows per Arrow batch a tail read yields."""


@dataclass(frozen=True, slots=True)
class Boundary:
    """What one publication of the view fixes (``encode``/``decode``: the ``_boundary`` literal).

    Attributes:
        ends: (topic, partition) -> prefix end offset: every record below is in the table (or is
            never a row); a partition missing here has 0.
        typed: topics with a table of their own (their records are not in ``records``).
        day_topics: topics partitioned by day (``hour`` null).
        stopped: the server stopped cleanly and the table holds everything: no tail.
        brokers: where the tail is read from: ``host:port,...`` (Kafka's ``bootstrap.servers``),
            PLAINTEXT listeners of the brokers that published.
        topic: the typed topic whose table this is the view of (``<table>_live``); None: the
            records table's view.
        value_format: with ``topic``: how its values are decoded (``format_to_json`` of the
            ``ValueFormat`` the table side decodes them with when the view was published).
        dead_letter_formats: the ``dead_letters`` table's view: every typed topic's format
            (``format_to_json``; a ``NoSchema`` too), whose records that do not parse are its rows.
    """

    ends: Mapping[tuple[str, int], int] = field(default_factory=dict)
    typed: frozenset[str] = frozenset()
    day_topics: frozenset[str] = frozenset()
    stopped: bool = False
    brokers: str = ""
    topic: str | None = None
    value_format: Mapping[str, Any] | None = None
    dead_letter_formats: Mapping[str, Mapping[str, Any]] | None = None

    def encode(self) -> str:
        data: dict[str, Any] = {
            "ends": [[t, p, o] for (t, p), o in sorted(self.ends.items())],
            "typed": sorted(self.typed), "day": sorted(self.day_topics), "stopped": self.stopped,
            "brokers": self.brokers,
        }
        if self.topic is not None:
            data.update(topic=self.topic, format=self.value_format)
        if self.dead_letter_formats is not None:
            data["dead"] = self.dead_letter_formats
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> "Boundary":
        """Raises ValueError on text ``encode`` did not write."""
        try:
            data = json.loads(text)
            topic = data.get("topic")
            return cls({(str(t), int(p)): int(o) for t, p, o in data["ends"]}, frozenset(data["typed"]),
                       frozenset(data["day"]), bool(data["stopped"]), str(data["brokers"]),
                       None if topic is None else str(topic), data.get("format") if topic is not None else None,
                       data.get("dead"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a live-view boundary: {text[:80]!r}") from exc


def format_to_json(fmt: "TopicFormat") -> dict[str, Any]:
    """A typed topic's ``ValueFormat`` as JSON for its view's boundary: the arrow schema as base64
    Arrow IPC, the rest as ``ValueFormat``'s fields (``format_from_json`` rebuilds it); a
    ``NoSchema`` as its reason."""
    from pipeline.table.typed import NoSchema

    if isinstance(fmt, NoSchema):
        return {"no_schema": fmt.reason}
    return {"kind": fmt.kind, "schema": base64.b64encode(fmt.schema.serialize().to_pybytes()).decode(),
            "avro_schema": fmt.avro_schema, "wire_format": fmt.wire_format, "registry": fmt.registry,
            "protobuf_schema": fmt.protobuf_schema, "protobuf_references": [list(r) for r in fmt.protobuf_references]}


def format_from_json(data: Mapping[str, Any]) -> "TopicFormat":
    """Raises ValueError on JSON ``format_to_json`` did not write, or a format ``ValueFormat`` refuses."""
    from pipeline.table.typed import NoSchema
    from pipeline.table.values import ValueFormat

    if "no_schema" in data:
        return NoSchema(str(data["no_schema"]))
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(data["schema"])))
        return ValueFormat(data["kind"], schema, data["avro_schema"], data["wire_format"], data["registry"],
                           data["protobuf_schema"], tuple(tuple(r) for r in data["protobuf_references"]))
    except (KeyError, TypeError, pa.ArrowInvalid) as exc:
        raise ValueError(f"not a live-view value format: {exc}") from exc


def merge_ends(*ends: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """The largest of several prefix ends per partition (each broker publishes its own; a prefix
    end stays one as the table grows, so the largest is too)."""
    out: dict[tuple[str, int], int] = {}
    for one in ends:
        for key, end in one.items():
            if end > out.get(key, -1):
                out[key] = end
    return out


def _string(text: str) -> str:
    """A Spark SQL string literal (backslash escapes on, Spark's default)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def table_filter_sql(ends: Mapping[tuple[str, int], int], missing_end: int = 0) -> str:
    """The table side's condition: ``offset`` below its partition's end (a literal nested map); a
    partition not in ``ends`` has ``missing_end``."""
    if not ends:
        return "false" if missing_end == 0 else "true"
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for (topic, partition), end in sorted(ends.items()):
        by_topic.setdefault(topic, []).append((partition, end))
    topics = ", ".join(
        f"{_string(topic)}, map({', '.join(f'{p}, {o}L' for p, o in parts)})" for topic, parts in by_topic.items())
    return f"`offset` < coalesce(try_element_at(try_element_at(map({topics}), `topic`), `partition`), {missing_end}L)"


def view_sql(database: str, boundary: Boundary, create: bool = False, table: str = "records",
             columns: Sequence[str] = TABLE_COLUMNS) -> str:
    """``ALTER VIEW <database>.<table>_live AS`` the union over ``<table>`` and ``<table>_tail`` at
    ``boundary``: one atomic catalog change (``CREATE OR REPLACE VIEW`` drops the view, then creates
    it: a query in between would not find it). ``create``: ``CREATE VIEW IF NOT EXISTS`` instead.
    ``table``: ``records``, or a typed topic's table (``columns``: its columns, partition columns
    last, as the catalog has them)."""
    names = ", ".join(_quote(c) for c in columns)
    name = f"`{database}`.`{table}{LIVE_SUFFIX}`"
    # dead letters of a topic with no end (e.g. typed once, raw now) are all in the table
    missing = 2**63 - 1 if boundary.dead_letter_formats is not None else 0
    head = (f"CREATE VIEW IF NOT EXISTS {name} "
            f"COMMENT 'pipeline.{table} plus the acknowledged records not yet committed, each once'"
            if create else f"ALTER VIEW {name}")
    return (f"{head} AS "
            f"SELECT {names} FROM `{database}`.`{table}` WHERE {table_filter_sql(boundary.ends, missing)} "
            f"UNION ALL SELECT {names} FROM `{database}`.`{table}{TAIL_SUFFIX}` "
            f"WHERE `{BOUNDARY_COLUMN}` = {_string(boundary.encode())}")


def tail_schema() -> "StructType":
    """The tail's columns (``records_tail``, the data source's rows): the records table's columns
    (``SPARK_SCHEMA``), its ``date`` and ``hour`` partition columns, then ``_boundary`` (always null)."""
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    from pipeline.table.schema import SPARK_SCHEMA

    return StructType([*SPARK_SCHEMA.fields, StructField("date", StringType()), StructField("hour", IntegerType()),
                       StructField(BOUNDARY_COLUMN, StringType())])


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def type_ddl(data_type: Any) -> str:
    """A Spark type as DDL with every nested field name quoted (``simpleString`` leaves them bare,
    which Spark's parser refuses for a name like ``a-b``, as JSON properties may be)."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(data_type, StructType):
        return "struct<" + ",".join(f"{_quote(f.name)}:{type_ddl(f.dataType)}" for f in data_type.fields) + ">"
    if isinstance(data_type, ArrayType):
        return f"array<{type_ddl(data_type.elementType)}>"
    if isinstance(data_type, MapType):
        return f"map<{type_ddl(data_type.keyType)},{type_ddl(data_type.valueType)}>"
    return str(data_type.simpleString())


def typed_tail_columns(table_schema: "StructType") -> tuple[list[str], str]:
    """A typed topic's table schema (as the catalog has it: partition columns last), or its tail
    table's (the same, then ``_boundary``: that column is not counted twice) -> the table's column
    names, and its tail table's columns DDL (the same columns, then ``_boundary``). A tail table
    made for the table's columns gives what the table gives."""
    fields = [f for f in table_schema.fields if f.name != BOUNDARY_COLUMN]
    names = [f.name for f in fields]
    ddl = ", ".join(f"{_quote(f.name)} {type_ddl(f.dataType)}" for f in fields)
    return names, f"{ddl}, {_quote(BOUNDARY_COLUMN)} string"


def tail_table_sql(database: str, table: str = "records", columns_ddl: str | None = None) -> str:
    """``CREATE TABLE IF NOT EXISTS <database>.<table>_tail (<columns>) USING pipeline_live`` (no
    options: the view's boundary says where to read). The columns are declared so that creating the
    table, and analysing the view over it, ask no Python worker for the source's schema (one
    fewer Python process per JVM: ~0.7 s). ``columns_ddl``: a typed topic's table's columns and
    ``_boundary`` (default: ``tail_schema``'s)."""
    columns = columns_ddl or ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in tail_schema().fields)
    return (f"CREATE TABLE IF NOT EXISTS `{database}`.`{table}{TAIL_SUFFIX}` ({columns}) USING {SOURCE_NAME} "
            f"COMMENT 'the records the brokers serve past the table: read it through {table}{LIVE_SUFFIX}'")


# -- the data source ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TailPartition:
    """One topic-partition's tail: offsets [start, end) (Spark's input partition, pickled to the executor)."""

    topic: str
    partition: int
    start: int
    end: int


@dataclass(slots=True)
class Bounds:
    """What the pushed filters allow: topics, partitions and an offset range (None: any)."""

    topics: set[str] | None = None
    partitions: set[int] | None = None
    partition_lo: int = 0
    partition_hi: int = 2**31
    offset_lo: int = 0
    offset_hi: int = 2**63

    def only_topics(self, topics: set[str]) -> None:
        """Narrow to ``topics`` (a typed table's view reads its topic, the dead letters' the typed ones)."""
        self.topics = set(topics) if self.topics is None else self.topics & topics

    def allows(self, topic: str, partition: int) -> bool:
        return ((self.topics is None or topic in self.topics)
                and (self.partitions is None or partition in self.partitions)
                and self.partition_lo <= partition < self.partition_hi)


def narrow(bounds: Bounds, f: Any) -> bool:
    """Narrow ``bounds`` by one pushed filter (``pyspark.sql.datasource``'s); whether the tail then
    applies it exactly, so that Spark need not (``DataSourceReader.pushFilters``: a filter not yielded
    back is the source's to apply).

    Exact: ``topic`` =/IN, ``partition`` =/IN/</<=/>/>=, ``offset`` =/</<=/>/>= (the planned ranges
    and ``read``'s [start, end) are those rows), and IS NOT NULL on any of the three (never null in
    a record). Not exact: ``offset`` IN of several values (narrowed to [min, max], Spark picks the
    values), and every other filter."""
    from pyspark.sql.datasource import (
        EqualTo, GreaterThan, GreaterThanOrEqual, In, IsNotNull, LessThan, LessThanOrEqual,
    )

    column = f.attribute[0] if len(f.attribute) == 1 else None
    if column in ("topic", "partition", "offset") and isinstance(f, IsNotNull):
        return True
    if column == "topic" and isinstance(f, (EqualTo, In)):
        values = {f.value} if isinstance(f, EqualTo) else set(f.value)
        bounds.topics = values if bounds.topics is None else bounds.topics & values
        return True
    if column not in ("partition", "offset") or not isinstance(
            f, (EqualTo, In, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)):
        return False
    if isinstance(f, In) or (isinstance(f, EqualTo) and column == "partition"):
        values = {int(v) for v in ((f.value,) if isinstance(f, EqualTo) else f.value) if v is not None}
        if column == "partition":
            bounds.partitions = values if bounds.partitions is None else bounds.partitions & values
            return True
        bounds.offset_lo = max(bounds.offset_lo, min(values, default=2**63))
        bounds.offset_hi = min(bounds.offset_hi, max(values, default=-1) + 1)
        return len(values) <= 1
    value = int(f.value)
    lo, hi = {EqualTo: (value, value + 1), GreaterThan: (value + 1, None), GreaterThanOrEqual: (value, None),
              LessThan: (None, value), LessThanOrEqual: (None, value + 1)}[type(f)]
    if column == "partition":
        bounds.partition_lo = max(bounds.partition_lo, lo) if lo is not None else bounds.partition_lo
        bounds.partition_hi = min(bounds.partition_hi, hi) if hi is not None else bounds.partition_hi
    else:
        bounds.offset_lo = max(bounds.offset_lo, lo) if lo is not None else bounds.offset_lo
        bounds.offset_hi = min(bounds.offset_hi, hi) if hi is not None else bounds.offset_hi
    return True


def plan_tail(boundary: Boundary, bounds: Bounds, log_ends: Mapping[tuple[str, int], int]) -> list[TailPartition]:
    """The tail's input partitions (pure): each raw topic-partition the filters allow, from its
    boundary and the filters' lower bound to its LSO (``log_ends``) and the filters' upper bound;
    empty ranges dropped. Sorted by topic, partition."""
    if boundary.stopped:
        return []
    out = []
    for (topic, partition), end in sorted(log_ends.items()):
        if not bounds.allows(topic, partition) or topic in boundary.typed:
            continue
        start = boundary.ends.get((topic, partition), 0)
        start, end = max(start, bounds.offset_lo), min(end, bounds.offset_hi)
        if start < end:
            out.append(TailPartition(topic, partition, start, end))
    return out


def _records_table(records: Sequence[Any]) -> pa.Table:
    """kafka-python ``ConsumerRecord``s as the records table's columns (``ARROW_SCHEMA``): the same
    values the table's decode gives (``pipeline.table.arrow.appends_to_table``)."""
    return pa.table([
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        pa.array([r.topic for r in records], pa.string()),
        pa.array([r.partition for r in records], pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.timestamp * 1000 for r in records], pa.int64()).cast(ARROW_SCHEMA.field("timestamp").type),
        pa.array([r.timestamp_type for r in records], pa.int32()),
        pa.array([[{"key": k, "value": v} for k, v in r.headers] if r.headers else None for r in records],
                 ARROW_SCHEMA.field("headers").type),
    ], schema=ARROW_SCHEMA)


def _with_boundary(table: pa.Table) -> pa.RecordBatch:
    table = table.append_column(BOUNDARY_COLUMN, pa.nulls(table.num_rows, pa.string()))
    return table.combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist(
        [], schema=table.schema)


def _as_schema(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch``'s columns named in ``schema``, in its order, cast to its types (the tail table's)."""
    columns = [batch.column(name).cast(field.type) for name, field in zip(schema.names, schema)]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def records_to_batch(records: Sequence[Any], day_topics: frozenset[str]) -> pa.RecordBatch:
    """kafka-python ``ConsumerRecord``s as one batch of the records table's columns plus ``_boundary``
    (null): the same values the table's decode gives (``pipeline.table.arrow.appends_to_table``)."""
    return _with_boundary(add_time_partitions(_records_table(records), day_topics))


def typed_records_to_batch(records: Sequence[Any], topic: str, fmt: "TopicFormat", day_topics: frozenset[str],
                           schema: pa.Schema) -> pa.RecordBatch:
    """kafka-python ``ConsumerRecord``s of typed topic ``topic`` as the rows its table gets from them
    (``pipeline.table.typed.split_typed`` with ``fmt``, the table side's own decode: the raw columns,
    then the typed ones), partition columns and ``_boundary`` (null) appended, in ``schema``'s
    column order and types (the tail table's). A record whose value does not parse is a dead letter,
    in no typed table: it is left out, as the table leaves it out.

    Raises:
        pipeline.registry.lookup.RegistryUnavailable: ``fmt``'s registry could not be asked.
        pyarrow.ArrowInvalid: a typed column does not cast to the tail table's type (the table's
            schema changed since the view was published; the next publication follows it).
    """
    from pipeline.table.typed import split_typed

    typed = split_typed(_records_table(records), {topic: fmt}).typed.get(topic)
    if typed is None:
        return pa.RecordBatch.from_pylist([], schema=schema)
    return _as_schema(_with_boundary(add_time_partitions(typed, day_topics)), schema)


def dead_letters_to_batch(records: Sequence[Any], fmt: "TopicFormat", day_topics: frozenset[str],
                          schema: pa.Schema) -> pa.RecordBatch:
    """kafka-python ``ConsumerRecord``s of one typed topic whose format is ``fmt`` as the
    ``dead_letters`` rows the table side makes of them (``split_typed``: the records whose value does
    not parse, with the reason in ``error``), partition columns and ``_boundary`` (null) appended,
    in ``schema``'s column order and types (the tail table's)."""
    from pipeline.table.typed import split_typed

    topic = records[0].topic if records else ""
    dead = split_typed(_records_table(records), {topic: fmt}).dead_letters
    return _as_schema(_with_boundary(add_time_partitions(dead, day_topics)), schema)
