"""``pipeline.native``, the one seam to the C fast paths.

Only it imports the extensions; the classes C builds and reads are checked when they are
defined, so a renamed or reordered field fails the import; and each stage's Python path runs
only on its C's decline signal (None, or stopping early): any exception from the C propagates
through the stage's entry point, and neither path is counted for it.
(``tests/requests/test_native_stages_trio.py``: no stage is bypassed on a plain produce.)
"""

from __future__ import annotations

import ast
import dataclasses
import io
import random
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from pipeline import _avro, _records, native
from pipeline.network.channel import _REQUEST_LAYOUT
from pipeline.network.connection_state import NEED_DATA, ConnectionLimits, ConnectionState, ReceivedFrame
from pipeline.network.memory_pool import MemoryPool
from pipeline.network.request_channel import Request
from pipeline.network.request_metrics import RequestMetrics
from pipeline.protocol import apis
from pipeline.protocol.header import RequestHeader, parse_request_header
from pipeline.protocol.records import validate_records
from pipeline.table.values import ValueFormat, parse_values
from tests.e2e import raw_client as rc

from pipeline.bench import avro_values

PIPELINE = Path(native.__file__).parent
EXTENSIONS = {"pipeline._avro", "pipeline._frames", "pipeline._records", "pipeline._stages"}


class Boom(Exception):
    """What a swapped C function raises: not the decline signal of any stage."""


@pytest.fixture(autouse=True)
def fresh_counts() -> Iterator[None]:
    native.reset_counts()
    yield
    native.reset_counts()


def test_only_the_seam_imports_the_extensions() -> None:
    importers = set()
    for path in PIPELINE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # from .. import _records, in pipeline/<package>/
                    base = "pipeline" + (f".{base}" if base else "")
                names = {base} | {f"{base}.{alias.name}" for alias in node.names}
            else:
                continue
            if names & EXTENSIONS:
                importers.add(path.relative_to(PIPELINE).as_posix())
    assert importers == {"native.py"}


def test_the_classes_c_builds_and_reads_pass_and_a_renamed_or_moved_field_fails() -> None:
    native.check_request_classes(Request, RequestHeader)  # what request_channel's import did

    def variant(cls: type, rename: dict[str, str] | None = None, swap: tuple[int, int] | None = None) -> type:
        fields = [(rename.get(f.name, f.name) if rename else f.name, f.type, f) for f in dataclasses.fields(cls)]
        if swap:
            i, j = swap
            fields[i], fields[j] = fields[j], fields[i]
        return dataclasses.make_dataclass(cls.__name__, [
            (name, type_, dataclasses.field(default=f.default)) if f.default is not dataclasses.MISSING
            else (name, type_) for name, type_, f in fields])

    for rename in ({"received_at": "received"}, {"dequeued_at": "taken_at"}):  # plain_run reads these by name
        with pytest.raises(TypeError, match=next(iter(rename))):
            native.check_request_classes(variant(Request, rename), RequestHeader)
    with pytest.raises(TypeError, match="body_offset"):
        native.check_request_classes(Request, variant(RequestHeader, {"body_offset": "offset"}))
    with pytest.raises(TypeError, match="cut fills"):  # cut fills the first fields by position
        native.check_request_classes(variant(Request, swap=(1, 2)), RequestHeader)
    with pytest.raises(TypeError, match="cut fills"):
        native.check_request_classes(Request, variant(RequestHeader, swap=(0, 1)))


@pytest.mark.parametrize("missing", [*_records.PLAIN_RUN_READS[0], *_records.PLAIN_RUN_READS[1]])
def test_the_names_the_c_exports_are_the_ones_plain_run_reads(missing: str) -> None:
    """Each exported name, taken off a request or its header, makes ``plain_run`` fail on it: the
    names checked at import are the ones the C uses."""
    frame = _produce_frame()
    header = parse_request_header(frame)
    fields: dict[str, Any] = {"api_key": header.api_key, "api_version": header.api_version,
                              "body_offset": header.body_offset}

    head, request = _Loose(), (_Fixed() if missing == "dequeued_at" else _Loose())
    for name, value in fields.items():
        if name != missing:
            setattr(head, name, value)
    for name, value in {"header": head, "frame": frame, "received_at": 1.0}.items():
        if name != missing:
            setattr(request, name, value)
    with pytest.raises(AttributeError, match=missing):
        native.plain_run([request], 0, {("t", 0): True}, 5.0, 1000, 0, 2**62, 0, 3, 11, 9)


class _Loose:
    """Any attribute may be left out, or set."""


class _Fixed:
    """A request whose ``dequeued_at`` cannot be set."""

    __slots__ = ("header", "frame", "received_at")


# -------------------------------------------------------------- fallback only on the decline signal

def _records_batch() -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    builder.append(0, timestamp=1_700_000_000_000, key=None, value=b"v", headers=[])
    return bytes(builder.build())


def _produce_frame(correlation_id: int = 1) -> bytes:
    """A plain Produce v9 frame body (no size prefix)."""
    return rc.frame(rc.produce("t", [b"v"], acks=1, partition=0, timeout_ms=30_000), correlation_id)[4:]


def _summary() -> object:
    return validate_records(_records_batch())


def _decode() -> object:
    frame = _produce_frame()
    return apis.decode_produce(parse_request_header(frame), frame)


def _plain_body() -> object:
    frame = _produce_frame()
    return apis.plain_produce_body(parse_request_header(frame), frame)


def _plain_run() -> object:
    frame = _produce_frame()
    request = Request(None, parse_request_header(frame), frame, 0, 1.0)  # type: ignore[arg-type]
    plains, end = apis.plain_produce_run([request], 0, {("t", 0): True}, 2.0, 1000)
    return [(acks, deadline, parts) for _, acks, deadline, parts in plains], end


def _stage_metrics() -> object:
    metrics = RequestMetrics()
    metrics.record(0, 9, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5)
    return metrics.api(0).buckets


def _cut() -> object:
    """The frames of one read as the Processor takes them: ``take_requests``, then ``next_request``."""
    parse_request_header(_produce_frame())  # cut's header table learns an api key from the Python path
    state = ConnectionState(MemoryPool(1 << 20), ConnectionLimits(), 0.0)
    state.receive_data(b"".join(struct.pack(">i", len(f)) + f for f in (_produce_frame(1), _produce_frame(2))), 0.0)
    taken = [(r.header, bytes(r.frame), r.token) for r in state.take_requests(0.0, _REQUEST_LAYOUT, None)]
    while isinstance(event := state.next_request(0.0), ReceivedFrame):
        taken.append((event.header, bytes(event.frame), event.token))
    assert event is NEED_DATA
    return taken


def _avro_parse() -> object:
    """Two registry-framed page views, as a typed topic's flush reads them."""
    rng = random.Random(7)
    values = [avro_values.WIRE_MAGIC + (1).to_bytes(4, "big") + _avro_record(avro_values.sample_record(rng))
              for _ in range(2)]
    typed, errors = parse_values(pa.array(values, pa.binary()), ValueFormat.for_avro(avro_values.AVRO_SCHEMA))
    return typed.to_pylist(), errors.to_pylist()


def _avro_record(record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(avro_values.AVRO_SCHEMA), record)
    return out.getvalue()


def _decline_every_value(ops: Any, count: int, *args: Any) -> object:
    """``_avro.columns`` told to decline every value (its ``skip``): the all-null columns and every index."""
    return _avro.columns(ops, count, *args[:-1], b"\x01" * count)


# stage, its C function's name in native, the stage's entry point, and what the C returns to decline
# (None for the stages with a Python path that takes one item; the batch stages decline by taking none).
DECLINE = [
    (native.RECORDS_SUMMARY, "_summarize", _summary, lambda *a: None),
    (native.PRODUCE_BODY, "_produce_body", _decode, lambda *a: None),
    (native.PLAIN_PRODUCE, "_plain_produce", _plain_body, lambda *a: None),
    (native.PLAIN_RUN, "_plain_run", _plain_run, lambda requests, start, *a: ([], start)),
    (native.FRAME_CUT, "_cut", _cut, lambda buffer, pos, *a: ([], pos, 0, [])),
    (native.STAGE_METRICS, "_record_stages", _stage_metrics, None),
    (native.AVRO_COLUMNS, "_avro_columns", _avro_parse, _decline_every_value),
]


def test_every_stage_is_covered_here() -> None:
    assert {stage.name for stage, *_ in DECLINE} == {stage.name for stage in native.STAGES}


@pytest.mark.parametrize("stage, name, entry, decline", DECLINE, ids=[s.name for s, *_ in DECLINE])
def test_a_stage_falls_back_only_on_its_decline_signal(monkeypatch: pytest.MonkeyPatch, stage: native.Stage,
                                                        name: str, entry: Callable[[], object],
                                                        decline: Callable[..., object] | None) -> None:
    fast = entry()
    assert stage.native >= 1 and stage.python == 0, native.counts()

    def boom(*args: object) -> object:
        raise Boom(name)

    native.reset_counts()
    monkeypatch.setattr(native, name, boom)
    with pytest.raises(Boom):
        entry()
    assert (stage.native, stage.python) == (0, 0)  # an exception is neither path: it propagates
    if decline is None:
        return  # C only: nothing to fall back to
    monkeypatch.setattr(native, name, decline)
    slow = entry()
    assert stage.native == 0 and stage.python >= 1
    if stage is native.PLAIN_PRODUCE:
        assert fast is not None and slow is None  # declined: the request goes to KafkaApis.handle
    elif stage is native.PLAIN_RUN:
        assert slow == ([], 0)  # declined: plain_produce takes the request (PLAIN_PRODUCE)
    else:
        assert slow == fast  # the Python path's result is the C path's
