"""The one seam between Python and the C fast paths (``pipeline/_frames.c``, ``_records.c``, ``_stages.c``,
``_avro.c``).

Every call into C goes through this module: it names each stage that has a C path, calls the
C function, and counts per stage how often the C path did the work and how often the caller's
Python path had to (``STAGES``; plain integers, one increment per call). No other module imports
the extensions (``tests/test_native.py`` checks it).

The C paths decline by *returning* a documented signal, never by raising: ``None`` (or, for
the batch stages, stopping before the first item they leave), and the caller then runs its
Python path on that item. So nothing here catches an exception around a C call: an exception
from C is a bug or ``MemoryError`` and propagates, and a stage that is bypassed shows in its
counters instead of passing silently.

The stages, the C function, its decline signal, and the Python path that takes what it declines:

========================  ===========================  ============================  ====================================
stage                     C                            declines by                   Python path
========================  ===========================  ============================  ====================================
``FRAME_CUT``             ``_frames.cut``              stopping before a frame       ``ConnectionState.next_request``
``PRODUCE_BODY``          ``_records.produce_body``    None                          kio's decode (``decode_produce``)
``PLAIN_PRODUCE``         ``_records.plain_produce``   None                          ``KafkaApis.handle``
``PLAIN_RUN``             ``_records.plain_run``       stopping before a request     ``KafkaApis.plain_produce``
``RECORDS_SUMMARY``       ``_records.summarize``       None                          ``validate_records``' walk
``STAGE_METRICS``         ``_stages.record``           (never)                       none
``AVRO_COLUMNS``          ``_avro.columns``            a value's index in            ``parse_values``' fastavro read
                                                       ``declined``
========================  ===========================  ============================  ====================================

C with no Python path (bad input raises their documented errors): ``scan``, ``columns``,
``max_timestamp`` and ``RecordsError`` of ``_records``, ``Layout`` of ``_frames``.

Where C reads or fills Python objects by attribute name or field position (``cut`` builds
``RequestHeader`` and ``Request`` through Layouts, positionally; ``plain_run`` reads a
request's ``header``, ``frame``, ``received_at`` and sets its ``dequeued_at``), the classes
are checked when their module is imported (``check_request_classes``): a renamed or reordered
field fails the import, not the fast path.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from pipeline import _avro, _frames, _records, _stages

__all__ = ("AVRO_COLUMNS", "AVRO_KINDS", "FRAME_CUT", "PLAIN_PRODUCE", "PLAIN_RUN", "PRODUCE_BODY", "RECORDS_SUMMARY", "STAGES", "STAGE_METRICS",
           "Layout", "RecordsError", "Stage", "avro_columns", "check_request_classes", "columns", "counts", "cut_frames",
           "max_timestamp", "plain_produce", "plain_run", "produce_body", "record_stages", "reset_counts", "scan",
           "summarize")


@dataclasses.dataclass(slots=True)
class Stage:
    """One stage with a C path, and how often each path ran since start (or ``reset_counts``).

    ``native``: items the C did (frames cut, requests or partitions' records read, responses'
    metrics recorded). ``python``: items the C declined, which the caller's Python path then took
    (for ``PLAIN_RUN``: the request it stopped at, left to the one-by-one path; a partition's
    records the handler inflates in a thread are declined twice, before and in ``validate_records``).
    """

    name: str
    native: int = 0
    python: int = 0


FRAME_CUT: Final = Stage("frame cut")
"""Whole frames of a read into requests (the Processor's read path, multi-queue channels)."""
PRODUCE_BODY: Final = Stage("produce body read")
"""A Produce body into ``ProduceRequestView``'s fields (``decode_produce``)."""
PLAIN_PRODUCE: Final = Stage("plain produce read")
"""A plain Produce body with each partition's records summarized (a handler's produce run)."""
PLAIN_RUN: Final = Stage("plain produce run")
"""Consecutive plain Produce requests of a queue item whose partitions the run has checked."""
RECORDS_SUMMARY: Final = Stage("records summary")
"""One partition's records checked and summarized (``validate_records``)."""
STAGE_METRICS: Final = Stage("stage metrics")
"""A response's request stage times into the per-api histograms (``RequestMetrics.record``)."""
AVRO_COLUMNS: Final = Stage("avro columns")
"""A typed topic's Avro record values into Arrow columns (``pipeline.table.values.parse_values``)."""
STAGES: Final = (FRAME_CUT, PRODUCE_BODY, PLAIN_PRODUCE, PLAIN_RUN, RECORDS_SUMMARY, STAGE_METRICS, AVRO_COLUMNS)

Layout = _frames.Layout
RecordsError = _records.RecordsError
scan = _records.scan
columns = _records.columns
max_timestamp = _records.max_timestamp

# The C functions with a Python path, looked up at each call (a test swaps one to see that its
# stage neither falls back nor swallows an exception).
_cut = _frames.cut
_produce_body = _records.produce_body
_plain_produce = _records.plain_produce
_plain_run = _records.plain_run
_summarize = _records.summarize
_record_stages = _stages.record
_avro_columns = _avro.columns

AVRO_KINDS: Final[dict[str, int]] = {name[2:].lower(): getattr(_avro, name) for name in dir(_avro)
                                     if name.startswith("K_")}
"""``avro_columns``' value kinds by name (``"boolean"``, ``"int"``, ... ``"timestamp_millis"``), as ``_avro.c``
numbers them."""

CUT_HEADER_FIELDS: Final = ("api_key", "api_version", "correlation_id", "client_id", "header_version", "body_offset")
"""The first fields of the header class ``cut`` fills, in the order it passes them."""
CUT_REQUEST_FIELDS: Final = ("connection", "header", "frame", "token", "received_at", "pool_bytes", "pool")
"""The first fields of the request class ``cut`` fills, in the order it passes them."""
PLAIN_RUN_REQUEST_READS: Final[tuple[str, ...]] = _records.PLAIN_RUN_READS[0]
"""The request attributes ``plain_run`` reads (and sets: ``dequeued_at``), as spelled in ``_records.c``."""
PLAIN_RUN_HEADER_READS: Final[tuple[str, ...]] = _records.PLAIN_RUN_READS[1]
"""The header attributes ``plain_run`` reads, as spelled in ``_records.c``."""


def counts() -> dict[str, tuple[int, int]]:
    """Each stage's name -> (C uses, Python uses) since start or ``reset_counts``."""
    return {stage.name: (stage.native, stage.python) for stage in STAGES}


def reset_counts() -> None:
    """Set every stage's counters to 0."""
    for stage in STAGES:
        stage.native = stage.python = 0


def check_request_classes(request_cls: type, header_cls: type) -> None:
    """Check that C can build and read ``request_cls`` and ``header_cls`` as it expects: ``cut``
    fills their first fields positionally (``CUT_REQUEST_FIELDS``, ``CUT_HEADER_FIELDS``) and
    ``plain_run`` reads attributes by name (``PLAIN_RUN_REQUEST_READS``, ``PLAIN_RUN_HEADER_READS``).
    Call it where the classes are defined, so a renamed or reordered field fails the import.

    Raises:
        TypeError: a class is not a dataclass, or its fields do not start with those ``cut``
            fills, or lack one ``plain_run`` reads (the message names the field).
    """
    for cls, first, reads in ((request_cls, CUT_REQUEST_FIELDS, PLAIN_RUN_REQUEST_READS),
                              (header_cls, CUT_HEADER_FIELDS, PLAIN_RUN_HEADER_READS)):
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls.__name__}: the C fast path builds and reads it as a dataclass")
        names = tuple(f.name for f in dataclasses.fields(cls))
        if names[:len(first)] != first:
            raise TypeError(f"{cls.__name__}: pipeline._frames.cut fills its first fields as {first}, "
                            f"the class has {names[:len(first)]}")
        missing = [name for name in reads if name not in names]
        if missing:
            raise TypeError(f"{cls.__name__}: pipeline._records.plain_run reads {missing}, not fields of the class")


def cut_frames(buffer: bytes | bytearray, pos: int, max_count: int, budget: int, max_receive: int, table: bytearray,
               header: _frames.Layout, request: _frames.Layout, owner: object, first_token: int, now: float,
               pool: object) -> tuple[list[Any], int, int, list[int]]:
    """``FRAME_CUT``'s C path (``_frames.cut``, see its docstring): (requests, position after them,
    their frame bytes, their correlation ids). The frame it stops before goes to the Python path
    (``ConnectionState.next_request``, which counts it with ``FRAME_CUT.python``)."""
    taken = _cut(buffer, pos, max_count, budget, max_receive, table, header, request, owner, first_token, now, pool)
    FRAME_CUT.native += len(taken[0])
    return taken


def produce_body(frame: bytes | bytearray | memoryview, pos: int, flexible: bool,
                 ) -> tuple[int, int, str | None, list[tuple[str, int, bytes | None]]] | None:
    """``PRODUCE_BODY``'s C path (``_records.produce_body``): (acks, timeout_ms, transactional_id,
    [(topic, partition, records)]) of the Produce body at byte ``pos`` of ``frame``; None when it
    declines (a frame that is not ``bytes``/``bytearray``, or a body it leaves to the general
    decoder), and the caller decodes it with kio. Never raises for bad input."""
    if isinstance(frame, (bytes, bytearray)):
        body = _produce_body(frame, pos, flexible)
        if body is not None:
            PRODUCE_BODY.native += 1
            return body
    PRODUCE_BODY.python += 1
    return None


def plain_produce(frame: bytes | bytearray | memoryview, pos: int, flexible: bool, min_timestamp_ms: int,
                  max_timestamp_ms: int) -> tuple[int, int, list[tuple[str, int, bytes, int, int]]] | None:
    """``PLAIN_PRODUCE``'s C path (``_records.plain_produce``): (acks, timeout_ms, [(topic,
    partition, records, record_count, uncompressed_bytes)]) of a plain Produce body; None when it
    declines (not plain, or a frame that is not ``bytes``/``bytearray``), and the request goes to
    ``KafkaApis.handle``. Never raises for bad input."""
    if isinstance(frame, (bytes, bytearray)):
        body = _plain_produce(frame, pos, flexible, min_timestamp_ms, max_timestamp_ms)
        if body is not None:
            PLAIN_PRODUCE.native += 1
            return body
    PLAIN_PRODUCE.python += 1
    return None


def plain_run(requests: list[Any], start: int, checked: dict[tuple[str, int], bool], now: float,
              min_timeout_ms: int, min_timestamp_ms: int, max_timestamp_ms: int, produce_key: int,
              first_version: int, last_version: int, first_flexible_version: int,
              ) -> tuple[list[tuple[Any, int, float, list[tuple[str, int, bytes, int, int]]]], int]:
    """``PLAIN_RUN``'s C path (``_records.plain_run``, see its docstring): the plain Produce
    requests from ``start`` on, and the index of the first it leaves to the one-by-one path
    (``KafkaApis.plain_produce``, then ``handle``), counted with ``PLAIN_RUN.python``.
    Never raises for bad input."""
    plains, end = _plain_run(requests, start, checked, now, min_timeout_ms, min_timestamp_ms, max_timestamp_ms,
                             produce_key, first_version, last_version, first_flexible_version)
    PLAIN_RUN.native += len(plains)
    if end < len(requests):
        PLAIN_RUN.python += 1
    return plains, end


def summarize(records: bytes, min_timestamp_ms: int, max_timestamp_ms: int,
              ) -> tuple[int, int, int, int, int, int, bool, int, int] | None:
    """``RECORDS_SUMMARY``'s C path (``_records.summarize``): RecordsInfo's fields of valid
    uncompressed batches; None when it declines (compressed or invalid), and the caller's walk
    (``validate_records``) inflates them or names what is wrong. Never raises for bad input."""
    summary = _summarize(records, min_timestamp_ms, max_timestamp_ms)
    if summary is None:
        RECORDS_SUMMARY.python += 1
    else:
        RECORDS_SUMMARY.native += 1
    return summary


def record_stages(buckets: list[list[int]], sums_ms: list[float], bounds_ms: tuple[float, ...], received: float,
                  dequeued: float, local_done: float, response_complete: float, response_dequeued: float,
                  sent: float, count: int = 1) -> None:
    """``STAGE_METRICS``, C only (``_stages.record``, see its docstring): ``count`` responses'
    stage times into ``buckets`` and ``sums_ms``."""
    _record_stages(buckets, sums_ms, bounds_ms, received, dequeued, local_done, response_complete,
                   response_dequeued, sent, count)
    STAGE_METRICS.native += 1


def avro_columns(ops: tuple[tuple[int, int, int, int, Any], ...], count: int, validity: Any, offsets: Any, data: Any,
                 offset: int, large: bool, wire: int, ids: tuple[int, ...] | None, skip: bytes | None,
                 ) -> tuple[list[tuple[bytes, bytes | None, bytes]], list[int]]:
    """``AVRO_COLUMNS``'s C path (``_avro.columns``, see its docstring): one column's Arrow buffers
    (validity, int32 offsets or None, data) per op, and the indexes of the values it declined, which
    are null rows here and which the caller reads with its Python path (counted per value).

    Raises:
        ValueError: offsets outside ``data``, a malformed plan.
        OverflowError: a column's values past 2 GiB.
    """
    built, declined = _avro_columns(ops, count, validity, offsets, data, offset, large, wire, ids, skip)
    AVRO_COLUMNS.native += count - len(declined)
    AVRO_COLUMNS.python += len(declined)
    return built, declined
