"""The request fuzzers' corpus, mutations and oracle, shared by the
hypothesis tests (tests/protocol/test_fuzz_requests.py) and the child
process that runs them where a native abort cannot take pytest down
(tests/protocol/fuzz_child.py).

* Valid frames: one kio-encoded request per served (api key, version)
  (``SUPPORTED_VERSIONS``); the fuzzers draw from one version per request
  wire format (:data:`FUZZED`). Produce requests carry RecordBatch v2 built by
  kafka-python, uncompressed or gzip/snappy/lz4/zstd (every codec
  ``pipeline.protocol.compression`` inflates).
* Mutations are plain tuples (:data:`Op`), so hypothesis can draw and shrink
  them (:func:`ops_strategy`) and a seeded ``random.Random`` can generate them
  by the thousand (:func:`random_ops`); :func:`apply_ops` turns a frame and
  ops into the hostile frame. Length fields of the request (every int16/int32
  length and uvarint of the body, found by walking kio's schema with the
  guard's plan, plus the header's client id and tagged-field count) and of
  the RecordBatch (length, magic, CRC, attributes/codec, counts) are known by
  position and overwritten with hostile values.
* The oracle :func:`serve` runs a frame through the server's own per-request
  path: ``parse_request_header``, then per api what
  ``pipeline.requests.handler.RequestHandler.handle`` calls
  (``api_versions_response``; ``decode_request`` then ``metadata_response``,
  ``init_producer_id_response`` or ``produce_view``; per partition
  ``has_compressed_batch`` and ``validate_records``). The other served
  apis (read side, groups, admin) are handled in pipeline/log,
  pipeline/coordinator and pipeline/admin, whose handlers all start with
  ``decode_request``: the oracle stops there. Only the documented
  exceptions may leave it: ``InvalidRequestError`` (with
  ``UnsupportedVersionError``) from the request path, ``RecordError``
  subclasses from the records validation (those it catches itself). One more
  promise is checked: records that validation accepts must decode in the
  persister (``pipeline.table.arrow.appends_to_table``) to exactly the
  validated record count, since acknowledged records that the persister
  cannot decode would stall every flush behind them.
"""

from __future__ import annotations

import os
import random
import struct
import time

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c
from kafka import codec as kafka_codec

from pipeline.bench.hostile import uvarint
from pipeline.table.arrow import appends_to_table
from pipeline.log.batch import PartitionAppend
from pipeline.protocol import BrokerInfo
from pipeline.protocol import InvalidRequestError
from pipeline.protocol import RecordError
from pipeline.protocol import api_versions_response
from pipeline.protocol import decode_request
from pipeline.protocol import init_producer_id_response
from pipeline.protocol import metadata_response
from pipeline.protocol import parse_request_header
from pipeline.protocol import produce_view
from pipeline.protocol import validate_records
from pipeline.protocol import apis
from pipeline.protocol import guard
from pipeline.protocol.records import has_compressed_batch
from tests.protocol.protocol_helpers import one_per_wire_format
from tests.protocol.protocol_helpers import request_frame
from tests.protocol.protocol_helpers import sample_request
from tests.protocol.protocol_helpers import served_versions

SERVED: list[tuple[int, int]] = served_versions()
FUZZED: list[tuple[int, int]] = one_per_wire_format(SERVED)
"""What the fuzzers draw from: the first served version of each request
wire format (versions laid out alike would only share the examples)."""
PRODUCE_VERSIONS = [version for api_key, version in SERVED if api_key == apis.PRODUCE]
CODECS = (0, 1, 2, 3, 4)  # none, gzip, snappy, lz4, zstd (Kafka CompressionType)

DOCUMENTED_REQUEST_ERRORS = (InvalidRequestError,)
"""What the request path may raise (UnsupportedVersionError is a subclass)."""
DOCUMENTED_RECORD_ERRORS = (RecordError,)
"""What ``validate_records`` may raise (every RecordError subclass)."""


def fuzz_examples(default: int) -> int:
    """max_examples for a fuzz test: ``FUZZ_EXAMPLES`` or ``default``."""
    return int(os.environ.get("FUZZ_EXAMPLES", default))


# ---------------------------------------------------------------- valid data


def record_batch(
    codec: int = 0, count: int = 3, *, producer_id: int = -1, value_size: int = 20, timestamp_type: int = 0
) -> bytes:
    """One RecordBatch v2 of ``count`` records (keys, values, one header each)."""
    builder = DefaultRecordBatchBuilder(2, codec, False, producer_id, 0 if producer_id >= 0 else -1,
                                        0 if producer_id >= 0 else -1, 1 << 20)
    for i in range(count):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i,
                       value=bytes([65 + i % 26]) * value_size, headers=[("h", b"x"), ("n", None)])
    batch = bytearray(builder.build())
    if timestamp_type:
        attributes = struct.unpack_from(">h", batch, 21)[0] | 0x08
        struct.pack_into(">h", batch, 21, attributes)
        fix_crc(batch, 0)
    return bytes(batch)


def fix_crc(records: bytearray, start: int) -> None:
    """Recompute the CRC32C of the batch at ``start`` (attributes to its declared end)."""
    if start + 61 > len(records):
        return
    (length,) = struct.unpack_from(">i", records, start + 8)
    end = min(len(records), start + 12 + max(length, 0))
    if end > start + 21:
        struct.pack_into(">I", records, start + 17, calc_crc32c(bytes(records[start + 21 : end])))


BATCHES: dict[int, bytes] = {codec: record_batch(codec) for codec in CODECS}
# The codecs kafka-python's producer compresses with (Kafka's framings).
_COMPRESS = {
    1: kafka_codec.gzip_encode,
    2: kafka_codec.snappy_encode,
    3: kafka_codec.lz4_encode,
    4: kafka_codec.zstd_encode,
}


def produce_frame(version: int, records: bytes) -> bytes:
    return request_frame(sample_request(0, version, records=records), correlation_id=7, client_id="fuzz")


VALID_FRAMES: dict[tuple[int, int], bytes] = {
    key: request_frame(sample_request(*key), correlation_id=7, client_id="fuzz") for key in SERVED
}


# -------------------------------------------------------- where lengths are

# Length-field kinds, by how they are written.
INT16, INT32, UVARINT = "int16", "int32", "uvarint"


def length_fields(frame: bytes) -> list[tuple[int, str, int]]:
    """``(position, kind, encoded width)`` of every length-like field of a
    *valid* request frame: the header's client id (int16) and tagged-field
    count (uvarint), then the body's string/bytes/array lengths and
    tagged-field counts, found by walking the guard's plan of the request."""
    header = parse_request_header(frame)
    found: list[tuple[int, str, int]] = [(8, INT16, 2)]
    if header.header_version == 2:
        found.append((header.body_offset - 1, UVARINT, 1))  # valid frames have no header tags
    plan = apis._REQUEST_PLANS[(header.api_key, header.api_version)]
    end = _trace(plan, frame, header.body_offset, found)
    assert end == len(frame), (header, end, len(frame))
    return found


def _trace(plan: guard.Plan, buffer: bytes, pos: int, found: list[tuple[int, str, int]]) -> int:
    """Walk a valid body like guard._walk, recording the length fields."""
    for op, arg, nullable, _path in plan:
        if op == guard._SKIP:
            pos += arg
        elif op in (guard._COMPACT, guard._COMPACT_ARRAY, guard._TAGS):
            value, after = guard._uvarint(buffer, pos, len(buffer), "trace")
            found.append((pos, UVARINT, after - pos))
            pos = after
            if op == guard._TAGS:
                assert value == 0, "valid corpus frames carry no tagged fields"
            elif value and op == guard._COMPACT:
                pos += value - 1
            elif value:
                pos = _trace_array(arg[0], value - 1, buffer, pos, found)
        elif op == guard._INT16_STRING:
            found.append((pos, INT16, 2))
            (length,) = struct.unpack_from(">h", buffer, pos)
            pos += 2 + max(length, 0)
        elif op in (guard._INT32_BYTES, guard._INT32_ARRAY):
            found.append((pos, INT32, 4))
            (length,) = struct.unpack_from(">i", buffer, pos)
            pos += 4
            if op == guard._INT32_BYTES:
                pos += max(length, 0)
            else:
                pos = _trace_array(arg[0], length, buffer, pos, found)
        else:  # _STRUCT
            if nullable:
                pos += 1
                if buffer[pos - 1] == 0xFF:
                    continue
            pos = _trace(arg, buffer, pos, found)
    return pos


def _trace_array(element: guard.Plan, count: int, buffer: bytes, pos: int,
                 found: list[tuple[int, str, int]]) -> int:
    for _ in range(max(count, 0)):
        pos = _trace(element, buffer, pos, found)
    return pos


# ------------------------------------------------------------- mutations

Op = tuple[Any, ...]
"""A mutation. Positions are any non-negative int, taken modulo the size
(so hypothesis shrinks them towards the start):

* ``("flip", pos, mask)``: xor one byte;
* ``("set", pos, byte)``;
* ``("insert", pos, data)``;
* ``("cut", pos)``: truncate there;
* ``("delete", pos, n)``: remove ``n`` bytes;
* ``("length", which, value_kind, raw)``: overwrite length field ``which``
  (index into :func:`length_fields`) with a hostile value (see
  :func:`_hostile_length`);
* ``("junk", data)``: append bytes (random bytes after a valid request).
"""

BATCH_FIELDS: dict[str, tuple[int, str]] = {
    # RecordBatch v2 header (Kafka DefaultRecordBatch): offset, struct format
    "base_offset": (0, ">q"),
    "length": (8, ">i"),
    "leader_epoch": (12, ">i"),
    "magic": (16, ">b"),
    "crc": (17, ">I"),
    "attributes": (21, ">h"),
    "last_offset_delta": (23, ">i"),
    "first_timestamp": (27, ">q"),
    "max_timestamp": (35, ">q"),
    "producer_id": (43, ">q"),
    "producer_epoch": (51, ">h"),
    "base_sequence": (53, ">i"),
    "count": (57, ">i"),
}
"""A RecordOp ``("field", name, value_kind, raw)`` overwrites one of these;
``("byte", pos, byte, fix_crc)``, ``("cut", pos)``, ``("insert", pos, data,
fix_crc)`` act on the records bytes; ``("varint", pos, data)`` splices a
hostile varint into the records area (after the 61-byte header) and fixes
the CRC, which reaches the record reader; ``("concat", codec, producer_id)``
appends another batch; ``("append", data)`` appends bytes *inside* the first
batch (length and CRC fixed: junk after a compressed stream, or after the
last record); ``("inner", codec, pos, data)`` replaces the records with the
uncompressed batch's, overwritten at ``pos`` with ``data``, compressed with
``codec`` (a consistent compressed batch around malformed records)."""

HOSTILE_VARINTS = (
    b"\x00",
    b"\x01",  # zigzag -1: null key/value, or a negative length
    b"\x7f",
    b"\xff\x01",
    b"\xfe\xff\xff\xff\x0f",  # zigzag 2**31 - 1
    b"\xff\xff\xff\xff\x0f",
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # 10 bytes: int64 range
    b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # 11 bytes: over-long
    b"\x80",  # cut short
)


def _hostile_length(kind: str, width: int, original: int, remaining: int, value_kind: int, raw: int) -> bytes:
    """The bytes to write over a length field of ``kind``.

    ``value_kind`` picks: 0 -1, 1 0, 2 huge, 3 original + 1, 4 original - 1,
    5 the bytes remaining + 1 (off by one past the end), 6 ``raw``, 7 -2,
    8 an over-long or truncated varint (uvarint fields; else ``raw``).
    """
    value = (-1, 0, 1 << 40, original + 1, original - 1, remaining + 1, raw, -2, raw)[value_kind % 9]
    if kind == INT16:
        return struct.pack(">h", 0x7FFF if value > 0x7FFF else max(value, -0x8000))
    if kind == INT32:
        return struct.pack(">i", 0x7FFFFFFF if value > 0x7FFFFFFF else max(value, -0x80000000))
    if value_kind % 9 == 8:
        return HOSTILE_VARINTS[raw % len(HOSTILE_VARINTS)]
    if value < 0:  # the compact null (0) or a huge unsigned value
        value = 0 if value == -1 else (1 << 32) - 1
    return uvarint(min(value, (1 << 35) - 1))


def _read_length(kind: str, frame: bytes, pos: int) -> int:
    if kind == INT16:
        return struct.unpack_from(">h", frame, pos)[0]
    if kind == INT32:
        return struct.unpack_from(">i", frame, pos)[0]
    return guard._uvarint(frame, pos, len(frame), "op")[0]


def apply_ops(frame: bytes, ops: Sequence[Op], fields: Sequence[tuple[int, str, int]] = ()) -> bytes:
    """``frame`` with ``ops`` applied in order. ``fields`` are the length
    fields of the *unmutated* frame; "length" ops are applied first (while
    positions are still those of the valid frame), from the last field to the
    first so earlier positions stay valid."""
    out = bytearray(frame)
    length_ops = sorted((op for op in ops if op[0] == "length" and fields),
                        key=lambda op: fields[op[1] % len(fields)][0], reverse=True)
    done: set[int] = set()
    for _, which, value_kind, raw in length_ops:
        pos, kind, width = fields[which % len(fields)]
        if pos in done:
            continue
        done.add(pos)
        original = _read_length(kind, frame, pos)
        replacement = _hostile_length(kind, width, original, len(frame) - pos - width, value_kind, raw)
        out[pos : pos + width] = replacement
    for op in ops:
        kind = op[0]
        if kind == "length":
            continue
        if kind == "junk":
            out += op[1]
            continue
        if not out:
            if kind == "insert":
                out += op[2]
            continue
        pos = op[1] % len(out)
        if kind == "flip":
            out[pos] ^= op[2] or 1
        elif kind == "set":
            out[pos] = op[2]
        elif kind == "insert":
            out[pos:pos] = op[2]
        elif kind == "cut":
            del out[pos:]
        elif kind == "delete":
            del out[pos : pos + op[2]]
    return bytes(out)


def apply_record_ops(records: bytes, ops: Sequence[Op]) -> bytes:
    """Mutate RecordBatch bytes (see :data:`BATCH_FIELDS`)."""
    out = bytearray(records)
    for op in ops:
        kind = op[0]
        if kind == "concat":
            out += record_batch(op[1] % len(CODECS), count=1 + op[2] % 3, producer_id=-1 if op[2] % 2 else op[2])
        elif kind == "inner":
            _, codec, pos, data = op
            out = bytearray(recompressed(codec % len(CODECS), pos, data))
        elif kind == "append":
            out += op[1]
            if len(out) >= 61:
                struct.pack_into(">i", out, 8, len(out) - 12)
                fix_crc(out, 0)
        elif kind == "field":
            _, name, value_kind, raw = op
            offset, fmt = BATCH_FIELDS[name]
            if offset + struct.calcsize(fmt) > len(out):
                continue
            (original,) = struct.unpack_from(fmt, out, offset)
            if name == "attributes":
                value = _hostile_attributes(original, value_kind, raw)
            elif name == "magic":
                value = (0, 1, 3, -1, 2)[value_kind % 5]
            else:
                value = (-1, 0, 1, original + 1, original - 1, raw, 0x7FFFFFFF, len(out) - 11)[value_kind % 8]
            out[offset : offset + struct.calcsize(fmt)] = _pack_clamped(fmt, value)
            if name != "crc" and raw % 4:  # usually keep the CRC right, to get past it
                fix_crc(out, 0)
        elif not out:
            continue
        elif kind == "byte":
            _, pos, byte, fix = op
            out[pos % len(out)] = byte
            if fix:
                fix_crc(out, 0)
        elif kind == "cut":
            del out[op[1] % len(out) :]
        elif kind == "insert":
            _, pos, data, fix = op
            pos %= len(out)
            out[pos:pos] = data
            if fix:
                fix_crc(out, 0)
        elif kind == "varint" and len(out) > 61:
            _, pos, data = op
            pos = 61 + pos % (len(out) - 61)
            out[pos : pos + len(data)] = data
            fix_crc(out, 0)
    return bytes(out)


def recompressed(codec: int, pos: int, data: bytes) -> bytes:
    """The uncompressed corpus batch with its records area overwritten at
    ``pos`` by ``data``, compressed with ``codec``, length and CRC right."""
    plain = bytearray(BATCHES[0])
    at = 61 + pos % (len(plain) - 61)
    plain[at : at + len(data)] = data
    payload = bytes(plain[61:])
    if codec:
        payload = _COMPRESS[codec](payload)
    out = bytearray(plain[:61]) + payload
    attributes = struct.unpack_from(">h", out, 21)[0] & ~0x07 | codec
    struct.pack_into(">h", out, 21, attributes)
    struct.pack_into(">i", out, 8, len(out) - 12)
    fix_crc(out, 0)
    return bytes(out)


def _hostile_attributes(original: int, value_kind: int, raw: int) -> int:
    choice = value_kind % 6
    if choice == 0:  # another codec, 0-7 (5-7 are unknown)
        return (original & ~0x07) | (raw & 0x07)
    if choice == 1:
        return original | 0x10  # transactional
    if choice == 2:
        return original | 0x20  # control batch
    if choice == 3:
        return original ^ 0x08  # timestamp type
    if choice == 4:
        return -1
    return raw & 0xFFFF


def _pack_clamped(fmt: str, value: int) -> bytes:
    bits = struct.calcsize(fmt) * 8
    if fmt[-1].isupper():
        value %= 1 << bits
    else:
        value = max(min(value, (1 << (bits - 1)) - 1), -(1 << (bits - 1)))
    return struct.pack(fmt, value)


# ---------------------------------------------------------- strategies

_positions = st.integers(0, 1 << 16)


def ops_strategy(max_ops: int = 4) -> st.SearchStrategy[list[Op]]:
    """Request-level mutations (see :data:`Op`)."""
    op = st.one_of(
        st.tuples(st.just("flip"), _positions, st.integers(1, 255)),
        st.tuples(st.just("set"), _positions, st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]) | st.integers(0, 255)),
        st.tuples(st.just("insert"), _positions, st.binary(min_size=1, max_size=8) | st.sampled_from(HOSTILE_VARINTS)),
        st.tuples(st.just("cut"), _positions),
        st.tuples(st.just("delete"), _positions, st.integers(1, 8)),
        st.tuples(st.just("length"), st.integers(0, 64), st.integers(0, 8), st.integers(-3, 1 << 20)),
        st.tuples(st.just("junk"), st.binary(min_size=1, max_size=32)),
    )
    return st.lists(op, min_size=1, max_size=max_ops)


def record_ops_strategy(max_ops: int = 3) -> st.SearchStrategy[list[Op]]:
    """RecordBatch mutations (see :data:`BATCH_FIELDS`)."""
    op = st.one_of(
        st.tuples(st.just("field"), st.sampled_from(sorted(BATCH_FIELDS)), st.integers(0, 7),
                  st.integers(-(1 << 31), (1 << 31) - 1)),
        st.tuples(st.just("byte"), _positions, st.integers(0, 255), st.booleans()),
        st.tuples(st.just("cut"), _positions),
        st.tuples(st.just("insert"), _positions, st.binary(min_size=1, max_size=8), st.booleans()),
        st.tuples(st.just("varint"), _positions, st.sampled_from(HOSTILE_VARINTS)),
        st.tuples(st.just("concat"), st.integers(0, 4), st.integers(0, 7)),
        st.tuples(st.just("append"), st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("inner"), st.integers(0, 4), _positions,
                  st.sampled_from(HOSTILE_VARINTS) | st.binary(min_size=1, max_size=4)),
    )
    return st.lists(op, min_size=0, max_size=max_ops)


def random_ops(rng: random.Random, max_ops: int = 4) -> list[Op]:
    """Like :func:`ops_strategy`, from a seeded ``random.Random``."""
    ops: list[Op] = []
    for _ in range(rng.randint(1, max_ops)):
        kind = rng.choice(("flip", "set", "insert", "cut", "delete", "length", "length", "junk"))
        pos = rng.randrange(1 << 16)
        if kind == "flip":
            ops.append((kind, pos, rng.randint(1, 255)))
        elif kind == "set":
            ops.append((kind, pos, rng.choice((0x00, 0x01, 0x7F, 0x80, 0xFF, rng.getrandbits(8)))))
        elif kind == "insert":
            data = rng.choice((rng.randbytes(rng.randint(1, 8)), rng.choice(HOSTILE_VARINTS)))
            ops.append((kind, pos, data))
        elif kind == "cut":
            ops.append((kind, pos))
        elif kind == "delete":
            ops.append((kind, pos, rng.randint(1, 8)))
        elif kind == "length":
            ops.append((kind, rng.randrange(64), rng.randrange(9), rng.randint(-3, 1 << 20)))
        else:
            ops.append((kind, rng.randbytes(rng.randint(1, 32))))
    return ops


def random_record_ops(rng: random.Random, max_ops: int = 3) -> list[Op]:
    """Like :func:`record_ops_strategy`, from a seeded ``random.Random``."""
    ops: list[Op] = []
    for _ in range(rng.randint(0, max_ops)):
        kind = rng.choice(("field", "field", "byte", "cut", "insert", "varint", "varint", "concat",
                           "append", "inner", "inner"))
        pos = rng.randrange(1 << 16)
        if kind == "field":
            ops.append((kind, rng.choice(sorted(BATCH_FIELDS)), rng.randrange(8),
                        rng.randint(-(1 << 31), (1 << 31) - 1)))
        elif kind == "byte":
            ops.append((kind, pos, rng.getrandbits(8), rng.random() < 0.7))
        elif kind == "cut":
            ops.append((kind, pos))
        elif kind == "insert":
            ops.append((kind, pos, rng.randbytes(rng.randint(1, 8)), rng.random() < 0.7))
        elif kind == "varint":
            ops.append((kind, pos, rng.choice(HOSTILE_VARINTS)))
        elif kind == "append":
            ops.append((kind, rng.choice((rng.randbytes(rng.randint(1, 16)), b"\x1f\x8b", b"\x00" * 4))))
        elif kind == "inner":
            data = rng.choice((rng.choice(HOSTILE_VARINTS), rng.randbytes(rng.randint(1, 4))))
            ops.append((kind, rng.randrange(5), pos, data))
        else:
            ops.append((kind, rng.randrange(5), rng.randrange(8)))
    return ops


# ------------------------------------------------------------- the oracle


class _Topics:
    """A TopicResolver with two topics (auto-creation refused)."""

    def describe(self, name: str, auto_create: bool) -> tuple[int, int]:
        return (0, 4) if name in ("events", "audit") else (3, 0)  # 3: UNKNOWN_TOPIC_OR_PARTITION

    def all_topics(self) -> dict[str, int]:
        return {"events": 4, "audit": 1}


BROKER = BrokerInfo(node_id=1, host="127.0.0.1", port=9092, cluster_id="fuzz")
TOPICS = _Topics()


@dataclass
class Outcome:
    """What :func:`serve` saw: the request error, if any, and the partitions'
    record outcomes (a RecordError class name, or "ok")."""

    request_error: str | None = None
    partitions: list[str] | None = None


def serve(frame: bytes | bytearray) -> Outcome:
    """Run ``frame`` (no size prefix) through the server's request path.

    Returns the outcome when only documented exceptions were raised; any
    other exception propagates (that is the bug), and so does an
    ``AssertionError`` when accepted records do not decode in the persister.
    """
    try:
        header = parse_request_header(frame)
        api_key = header.api_key
        if api_key == apis.API_VERSIONS:
            api_versions_response(header, frame)
            return Outcome()
        body = decode_request(header, frame)  # refuses what is not served
        if api_key not in (apis.METADATA, apis.INIT_PRODUCER_ID, apis.PRODUCE):
            return Outcome()  # a registered handler's, past decoding
        if api_key == apis.METADATA:
            metadata_response(header, body, BROKER, TOPICS)
            return Outcome()
        if api_key == apis.INIT_PRODUCER_ID:
            init_producer_id_response(header, body, 1000, 0)
            return Outcome()
        view = produce_view(body)
    except DOCUMENTED_REQUEST_ERRORS as exc:
        return Outcome(request_error=type(exc).__name__)
    results = []
    for part in view.partitions:
        has_compressed_batch(part.records)
        try:
            info = validate_records(part.records, header.api_version)
        except DOCUMENTED_RECORD_ERRORS as exc:
            results.append(type(exc).__name__)
            continue
        check_persistable(part.records, info.record_count)
        results.append("ok")
    return Outcome(partitions=results)


def check_persistable(records: bytes, record_count: int) -> None:
    """Records that validation accepted decode in the persister to
    ``record_count`` rows (else the flush that holds them fails forever)."""
    append = PartitionAppend("events", 0, 0, records, record_count, int(time.time() * 1000))
    try:
        table = appends_to_table([append])
    except Exception as exc:
        raise AssertionError(
            f"validate_records accepted {record_count} records that the persister cannot decode: "
            f"{type(exc).__name__}: {exc} (records {records.hex()})"
        ) from exc
    assert table.num_rows == record_count


# ------------------------------------------------------ hostile frames


def hostile_request(rng: random.Random) -> bytes:
    """One hostile frame for the child process: a mutated valid request of a
    served (api key, version), a Produce with mutated (possibly compressed)
    records, or random bytes after a valid header."""
    kind = rng.randrange(4)
    if kind == 0:
        key = rng.choice(FUZZED)
        frame = VALID_FRAMES[key]
        return apply_ops(frame, random_ops(rng), length_fields(frame))
    if kind == 1:
        key = rng.choice(FUZZED)
        header_end = parse_request_header(VALID_FRAMES[key]).body_offset
        return VALID_FRAMES[key][:header_end] + rng.randbytes(rng.randint(0, 80))
    version = rng.choice(PRODUCE_VERSIONS)
    records = apply_record_ops(BATCHES[rng.choice(CODECS)], random_record_ops(rng))
    frame = produce_frame(version, records)
    if kind == 3:
        frame = apply_ops(frame, random_ops(rng, 2), length_fields(frame))
    return frame
