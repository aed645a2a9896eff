"""The live view's tail as a Spark Python data source (``pipeline_live``): see ``pipeline.table.live``.

Imported by Spark's Python workers (through ``pyspark_pipeline``) and by nothing in the server.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, EqualTo, InputPartition, IsNotNull

from pipeline.table.live import (
    BATCH_ROWS, BOUNDARY_COLUMN, LIVE_SUFFIX, READ_TIMEOUT_MS, SOURCE_NAME, TAIL_TABLE, Boundary, Bounds, TailPartition, tail_schema,
    dead_letters_to_batch, format_from_json, narrow, plan_tail, records_to_batch, typed_records_to_batch,
)

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

TAIL_API_VERSION = (2, 6)
"""The Kafka version the tail's consumer assumes of the brokers (kafka-python's ``api_version``: it
then skips probing them, ~100 ms per consumer); ``kafka.api_version`` overrides it."""


def _consumer(brokers: str, options: Mapping[str, str]) -> Any:
    """A read_committed kafka-python consumer, no group, of ``brokers`` (``host:port,...``), with
    the data source's options ``kafka.<name>`` passed on as the consumer's ``<name>``."""
    from kafka import KafkaConsumer

    # A query names topics in its filters: looking one up must never create it.
    extra: dict[str, Any] = {"api_version": TAIL_API_VERSION, "allow_auto_create_topics": False}
    extra.update({k[len("kafka."):]: v for k, v in options.items() if k.startswith("kafka.")})
    return KafkaConsumer(bootstrap_servers=brokers.split(","), group_id=None,
                         enable_auto_commit=False, isolation_level="read_committed",
                         client_id="pipeline-live", **extra)


class LiveTailReader(DataSourceReader):
    """Plans and reads the tail (``pipeline.table.live``); options ``kafka.*`` go to the consumer."""

    def __init__(self, options: Mapping[str, str], schema: "StructType | None" = None) -> None:
        self.options = dict(options)
        self.boundary: Boundary | None = None
        self.bounds = Bounds()
        self.schema = schema
        """The tail table's columns (a typed topic's rows are given in their order and types)."""

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        """Take ``_boundary = '<json>'`` (the view's parameter); narrow topics, partitions and offsets
        by the others. Yielded back, for Spark to apply, are only those the tail does not apply
        exactly (``narrow``): a query for one topic-partition and an offset range then has no
        Filter over the scan, so no per-query code is generated for its literals (~4% of the
        server JVM's CPU per live query, measured with JFR on 2026-11-29)."""
        for f in filters:
            if f.attribute == (BOUNDARY_COLUMN,) and isinstance(f, (EqualTo, IsNotNull)):
                # Taken, so Spark does not apply them to the rows (their _boundary is null);
                # IsNotNull is the one Spark infers from the equality.
                if isinstance(f, EqualTo):
                    self.boundary = Boundary.decode(f.value)
                continue
            if not narrow(self.bounds, f):
                yield f

    def partitions(self) -> list[Any]:
        """One input partition per topic-partition with a tail (``plan_tail``); the LSOs are asked of
        the brokers now, so what was acknowledged before the query was planned is read."""
        from kafka import TopicPartition

        if self.boundary is None:
            raise ValueError(f"{TAIL_TABLE} is read through {TAIL_TABLE.replace('_tail', LIVE_SUFFIX)}, "
                             "whose boundary says from which offsets and from which brokers")
        if self.boundary.stopped:
            return []
        if self.boundary.topic is not None:  # a typed topic's view reads that topic alone
            self.bounds.only_topics({self.boundary.topic})
        elif self.boundary.dead_letter_formats is not None:  # the dead letters': the typed topics
            self.bounds.only_topics(set(self.boundary.dead_letter_formats))
        consumer = _consumer(self.boundary.brokers, self.options)
        try:
            # Named topics are looked up alone: ``topics()`` always asks for fresh metadata, and when
            # the consumer's own first request is still out, the second waits retry_backoff_ms
            # (100 ms) first (kafka-python 3's ClusterMetadata.ttl).
            topics = self.bounds.topics if self.bounds.topics is not None else consumer.topics()
            wanted = sorted(t for t in topics if not t.startswith("__"))
            tps = [TopicPartition(t, p) for t in wanted for p in sorted(consumer.partitions_for_topic(t) or ())
                   if self.bounds.allows(t, p)]
            ends = consumer.end_offsets(tps) if tps else {}
        finally:
            consumer.close()
        planned = plan_tail(self.boundary, self.bounds, {(tp.topic, tp.partition): o for tp, o in ends.items()})
        return [InputPartition(p) for p in planned]

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        """The records of one ``TailPartition`` [start, end), read_committed, in offset order.

        Raises:
            TimeoutError: no progress for ``READ_TIMEOUT_MS``.
            Whatever kafka-python raises (e.g. NoBrokersAvailable).
        """
        from kafka import TopicPartition

        if partition.value is None:  # Spark reads InputPartition(None) once when partitions() planned nothing
            return
        part: TailPartition = partition.value
        assert self.boundary is not None  # partitions() planned it
        to_batch = self._to_batch(self.boundary)
        tp = TopicPartition(part.topic, part.partition)
        consumer = _consumer(self.boundary.brokers, self.options)
        try:
            # The leader first (a blocking metadata request): polling without it finds nothing to
            # fetch and sleeps retry_backoff_ms (100 ms) before the first Fetch (kafka-python 3's
            # KafkaConsumer._poll_once): most of a small tail's read time.
            consumer.partitions_for_topic(part.topic)
            consumer.assign([tp])
            consumer.seek(tp, part.start)
            rows: list[Any] = []
            position = part.start
            progress_at = time.monotonic()
            while position < part.end:
                fetched = consumer.poll(timeout_ms=500, max_records=BATCH_ROWS).get(tp, [])
                rows.extend(r for r in fetched if r.offset < part.end)
                new_position = consumer.position(tp)
                if new_position > position:
                    position, progress_at = new_position, time.monotonic()
                elif time.monotonic() - progress_at > READ_TIMEOUT_MS / 1000:
                    raise TimeoutError(f"{part.topic}-{part.partition}: no records past offset {position} "
                                       f"in {READ_TIMEOUT_MS} ms (reading up to {part.end})")
                if len(rows) >= BATCH_ROWS:
                    yield to_batch(rows)
                    rows = []
            if rows:
                yield to_batch(rows)
        finally:
            consumer.close()

    def _to_batch(self, boundary: Boundary) -> Callable[[list[Any]], pa.RecordBatch]:
        """Records (of one topic-partition) -> rows of the records table, of the typed topic's table
        the boundary names (``typed_records_to_batch``), or of ``dead_letters``
        (``dead_letters_to_batch``), each decoded with the format the boundary carries."""
        day = boundary.day_topics
        dead = boundary.dead_letter_formats
        if dead is None and (boundary.topic is None or boundary.value_format is None):
            return lambda rows: records_to_batch(rows, day)
        from pyspark.sql.pandas.types import to_arrow_schema

        assert self.schema is not None  # Spark gives the reader the table's schema
        schema = to_arrow_schema(self.schema, timezone="UTC")  # what Spark checks a batch against
        if dead is not None:
            formats = {t: format_from_json(f) for t, f in dead.items()}
            return lambda rows: dead_letters_to_batch(rows, formats[rows[0].topic], day, schema)
        assert boundary.topic is not None and boundary.value_format is not None
        topic, fmt = boundary.topic, format_from_json(boundary.value_format)
        return lambda rows: typed_records_to_batch(rows, topic, fmt, day, schema)


class LiveTail(DataSource):
    """The ``pipeline_live`` data source: the records the brokers serve, as rows of the records table."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> "StructType":
        return tail_schema()

    def reader(self, schema: "StructType") -> LiveTailReader:
        return LiveTailReader(self.options, schema)
