"""Hostile and broken client input as bytes, the answer each must get, and the memory bound (sans-I/O).

``pipeline bench --hostile`` (``pipeline.bench.hostile_runner``) throws every
case here at a server while good producers produce beside them; the clients
that send them are in ``pipeline.bench.hostile_clients``. The byte-level
builders are the ones tests/e2e/test_hostile.py uses, kept here because the
benchmark must not import tests; the expected answers are Kafka's (see that
test module for the broker code each follows).

Record keys of every batch built here are benchmark keys
(``pipeline.bench.frames.record_key``): ``conn`` is the case number, ``req``
the execution number of that case, so the table check can tell an
acknowledged hostile record from a refused one that was stored anyway.

The memory bound (``memory_bound``) is docs/architecture.md, "Limits and the
memory bound", with the terms named and the defaults taken from
``ServerConfig`` and the modules that define them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable

from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.util import calc_crc32c
from kio.schema.errors import ErrorCode

from pipeline.bench.frames import encode_request, produce_request, record_key

if TYPE_CHECKING:
    from kio.serial.readers import Reader

    from pipeline.config import ServerConfig

MiB = 1024 * 1024
KiB = 1024

# ---------------------------------------------------------------- error codes

NONE = 0
CORRUPT_MESSAGE = int(ErrorCode.corrupt_message)                            # 2
UNKNOWN_TOPIC_OR_PARTITION = int(ErrorCode.unknown_topic_or_partition)      # 3
MESSAGE_TOO_LARGE = int(ErrorCode.message_too_large)                        # 10
INVALID_TOPIC_EXCEPTION = int(ErrorCode.invalid_topic_exception)            # 17
INVALID_TIMESTAMP = int(ErrorCode.invalid_timestamp)                        # 32
UNSUPPORTED_VERSION = int(ErrorCode.unsupported_version)                    # 35
UNSUPPORTED_COMPRESSION_TYPE = int(ErrorCode.unsupported_compression_type)  # 76
INVALID_RECORD = int(ErrorCode.invalid_record)                              # 87

# ------------------------------------------------- RecordBatch v2 field offsets

LENGTH_OFFSET = 8
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
COUNT_OFFSET = 57
TIMESTAMP_MS = 1_700_000_000_000


# ------------------------------------------------------------------ builders


def batch(values: list[bytes], keys: list[bytes] | None = None, codec: int = 0,
          timestamp_ms: int = TIMESTAMP_MS) -> bytes:
    """One RecordBatch v2 of ``values`` (keys None unless given), ``codec`` 0-4."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=0,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 24)
    for i, value in enumerate(values):
        builder.append(i, timestamp=timestamp_ms + i, key=None if keys is None else keys[i], value=value,
                       headers=[])
    return bytes(builder.build())


def recrc(data: bytes | bytearray) -> bytes:
    """Recompute the CRC32C of a single batch after editing it (so only the edit is wrong)."""
    data = bytearray(data)
    struct.pack_into(">I", data, CRC_OFFSET, calc_crc32c(bytes(data[ATTRIBUTES_OFFSET:])))
    return bytes(data)


def set_length(data: bytes | bytearray, length: int) -> bytes:
    """The batch with its length field set to ``length`` (CRC untouched)."""
    data = bytearray(data)
    struct.pack_into(">i", data, LENGTH_OFFSET, length)
    return bytes(data)


def raw_frame(api_key: int, api_version: int, correlation_id: int, rest: bytes = b"",
              client_id: bytes = b"hostile") -> bytes:
    """A frame with a hand-made request header v1 (+ ``rest``)."""
    body = struct.pack(">hhih", api_key, api_version, correlation_id, len(client_id)) + client_id + rest
    return struct.pack(">i", len(body)) + body


def produce_frame(records: bytes, correlation_id: int, topic: str, acks: int = -1, version: int = 9,
                  partition: int = 0) -> bytes:
    """A Produce request frame carrying ``records`` (any bytes) for one partition."""
    return encode_request(produce_request(topic, partition, records, acks, version), correlation_id, "hostile")


def metadata_frame(names: list[str] | None, correlation_id: int, auto_create: bool) -> bytes:
    """Metadata v9 naming ``names`` (None: all topics)."""
    from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
    from kio.schema.types import TopicName

    entity = MetadataRequest(
        topics=None if names is None else tuple(MetadataRequestTopic(name=TopicName(n)) for n in names),
        allow_auto_topic_creation=auto_create, include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False)
    return encode_request(entity, correlation_id, "hostile")


def api_versions_frame(correlation_id: int) -> bytes:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest

    return encode_request(ApiVersionsRequest(client_software_name="pipeline-bench-hostile",
                                             client_software_version="1"), correlation_id, "hostile")


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def keys(conn: int, req: int, n: int) -> list[bytes]:
    """Benchmark record keys of ``n`` records (see module docstring)."""
    return [record_key(conn, req, i) for i in range(n)]


# ------------------------------------------------------------ decoding answers


def decode_produce(body: bytes, version: int = 9) -> tuple[int, int]:
    """(error code, base offset) of the only partition of a Produce response body
    (after the correlation id)."""
    from kio.index import load_response_schema
    from kio.serial import entity_reader

    # the schema is looked up by api key and version: its fields are not known statically
    read: Reader[Any] = entity_reader(load_response_schema(0, version))
    entity, _ = read(body, 1 if version >= 9 else 0)
    part = entity.responses[0].partition_responses[0]
    return int(part.error_code), int(part.base_offset)


def decode_metadata_errors(body: bytes) -> dict[str, int]:
    """{topic: error code} of a Metadata v9 response body (after the correlation id)."""
    from kio.schema.metadata.v9.response import MetadataResponse
    from kio.serial import entity_reader

    entity, _ = entity_reader(MetadataResponse)(body, 1)
    return {t.name: int(t.error_code) for t in entity.topics}


def decode_api_versions_error(body: bytes) -> int:
    """Error code of an ApiVersions response read as v0 (what a server answers an unknown version with)."""
    from kio.index import load_response_schema
    from kio.serial import entity_reader

    read: Reader[Any] = entity_reader(load_response_schema(18, 0))  # looked up by key: fields not known statically
    entity, _ = read(body, 0)
    return int(entity.error_code)


# ---------------------------------------------------------- bad record batches
#
# Each takes (conn, req) for the record keys and returns the batch bytes.


def bad_crc(conn: int, req: int) -> bytes:
    data = bytearray(batch([b"reject:crc:0", b"reject:crc:1"], keys(conn, req, 2)))
    data[-3] ^= 0xFF  # inside the last record's value
    return bytes(data)


def magic_1(conn: int, req: int) -> bytes:
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    builder.append(0, timestamp=TIMESTAMP_MS, key=record_key(conn, req, 0), value=b"reject:magic1")
    return bytes(builder.build())


def magic_3(conn: int, req: int) -> bytes:
    data = bytearray(batch([b"reject:magic3"], keys(conn, req, 1)))
    data[MAGIC_OFFSET] = 3
    return recrc(data)


def wrong_record_count(conn: int, req: int) -> bytes:
    data = bytearray(batch([b"reject:count:0", b"reject:count:1", b"reject:count:2"], keys(conn, req, 3)))
    struct.pack_into(">i", data, COUNT_OFFSET, 5)  # 3 records, last offset delta 2
    return recrc(data)


def truncated_records(conn: int, req: int) -> bytes:
    # header, length and CRC agree with the bytes; the last record is cut short
    data = batch([b"reject:trunc:0", b"reject:trunc:1", b"reject:trunc:2" + b"t" * 40], keys(conn, req, 3))[:-25]
    return recrc(set_length(data, len(data) - 12))


def records_after_the_count(conn: int, req: int) -> bytes:
    # count 2 (last offset delta 1), but a third record follows in the batch
    k = keys(conn, req, 3)
    two = batch([b"reject:extra:0", b"reject:extra:1"], k[:2])
    data = bytearray(batch([b"reject:extra:0", b"reject:extra:1", b"reject:extra:2"], k))
    data[LAST_OFFSET_DELTA_OFFSET:LAST_OFFSET_DELTA_OFFSET + 4] = two[LAST_OFFSET_DELTA_OFFSET:
                                                                      LAST_OFFSET_DELTA_OFFSET + 4]
    data[COUNT_OFFSET:COUNT_OFFSET + 4] = two[COUNT_OFFSET:COUNT_OFFSET + 4]
    return recrc(data)


def unknown_codec(conn: int, req: int) -> bytes:
    data = bytearray(batch([b"reject:codec7"], keys(conn, req, 1)))
    struct.pack_into(">h", data, ATTRIBUTES_OFFSET, 7)
    return recrc(data)


def length_too_long(conn: int, req: int) -> bytes:
    data = batch([b"reject:long:0", b"reject:long:1"], keys(conn, req, 2))
    return set_length(data, len(data) - 12 + 100)


def length_too_short(conn: int, req: int) -> bytes:
    data = batch([b"reject:short:0", b"reject:short:1"], keys(conn, req, 2))
    return set_length(data, len(data) - 12 - 1)


_BOMB_CACHE: dict[int, bytes] = {}


def decompression_bomb(conn: int, req: int) -> bytes:
    """100 MiB of zeros in a few KiB of zstd. Compressing takes ~0.3 s, so it is
    built once per ``conn`` and every execution sends the same keys (request 0)."""
    if conn not in _BOMB_CACHE:
        _BOMB_CACHE[conn] = batch([b"reject:bomb" + bytes(100 * MiB)], keys(conn, 0, 1), codec=4)
    return _BOMB_CACHE[conn]


def not_really_gzip(conn: int, req: int) -> bytes:
    data = bytearray(batch([b"reject:gzip:0", b"reject:gzip:1"], keys(conn, req, 2)))
    struct.pack_into(">h", data, ATTRIBUTES_OFFSET, 1)
    return recrc(data)


def huge_timestamp(conn: int, req: int) -> bytes:
    # a CreateTime no table column can hold (microseconds overflow int64)
    return batch([b"reject:timestamp"], keys(conn, req, 1), timestamp_ms=2**62)


RECORD_BATCH_CASES: list[tuple[str, Callable[[int, int], bytes], int]] = [
    # (case, builder, Produce partition error code); Kafka's reasons in tests/e2e/test_hostile.py
    ("batch: bad CRC", bad_crc, CORRUPT_MESSAGE),
    ("batch: magic 1", magic_1, INVALID_RECORD),
    ("batch: magic 3", magic_3, CORRUPT_MESSAGE),
    ("batch: wrong record count", wrong_record_count, INVALID_RECORD),
    ("batch: truncated records", truncated_records, INVALID_RECORD),
    ("batch: records after the count", records_after_the_count, INVALID_RECORD),
    ("batch: unknown codec 7", unknown_codec, CORRUPT_MESSAGE),
    ("batch: length too long", length_too_long, INVALID_RECORD),
    ("batch: length too short", length_too_short, CORRUPT_MESSAGE),
    ("batch: decompression bomb", decompression_bomb, MESSAGE_TOO_LARGE),
    ("batch: not really gzip", not_really_gzip, CORRUPT_MESSAGE),
    ("batch: huge timestamp", huge_timestamp, INVALID_TIMESTAMP),
]

INVALID_TOPIC_NAMES = ["bad/topic", "a" * 250, "..", "white space", "ümlaut"]


def lying_body_length_frame(conn: int, req: int, topic: str, correlation_id: int) -> bytes:
    """Produce v9 whose records' compact-bytes length claims 200 bytes more than the frame holds."""
    records = batch([b"reject:bodylen"], keys(conn, req, 1))
    frame = produce_frame(records, correlation_id, topic)
    at = frame.index(records)
    length = uvarint(len(records) + 1)
    assert frame[at - len(length):at] == length
    body = frame[4:at - len(length)] + uvarint(len(records) + 1 + 200) + frame[at:]
    return struct.pack(">i", len(body)) + body


# ------------------------------------------------------------ the memory bound

R0_BYTES = 160 * MiB
"""The idle server process (Python, pyspark, pyarrow, py4j gateway), docs/architecture.md."""
CONNECTION_TASKS_BYTES = 64 * KiB
"""Per connection outside the pool besides its read and unsent responses: its tasks (docs/architecture.md)."""
ARROW_EXPANSION = 1.5
"""Arrow size of a flush over its decompressed record batches: 'about 1-1.5' (docs/architecture.md); the upper end."""


@dataclass(frozen=True, slots=True)
class MemoryBound:
    """docs/architecture.md's RSS bound for one server configuration, term by term (bytes)."""

    r0: int
    pool: int                    # queued.max.request.bytes
    connections: int             # max.connections x (socket read + response.buffer.max.bytes + tasks)
    decompressed_batch: int      # MAX_UNCOMPRESSED_BATCH_BYTES
    buffer_memory: int           # buffer.memory
    flush_arrow: int             # 2 x batch.max.bytes x expansion

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def to_json(self) -> dict:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "total": self.total}


def memory_bound(config: ServerConfig | None = None) -> MemoryBound:
    """The bound for ``config`` (a ``pipeline.config.ServerConfig``; None: the defaults).

    RSS <= R0 + queued.max.request.bytes
           + max.connections x (socket read + response.buffer.max.bytes + ~64 KiB)
           + MAX_UNCOMPRESSED_BATCH_BYTES + buffer.memory + 2 x batch.max.bytes x expansion
    """
    from pipeline.network.channel import RECEIVE_SIZE
    from pipeline.protocol.records import MAX_UNCOMPRESSED_BATCH_BYTES
    from pipeline.config import ServerConfig

    c = config if config is not None else ServerConfig()
    return MemoryBound(
        r0=R0_BYTES,
        pool=c.queued_max_request_bytes,
        connections=c.max_connections * (RECEIVE_SIZE + c.response_buffer_max_bytes + CONNECTION_TASKS_BYTES),
        decompressed_batch=MAX_UNCOMPRESSED_BATCH_BYTES,
        buffer_memory=c.buffer_memory,
        flush_arrow=int(2 * c.batch_max_bytes * ARROW_EXPANSION),
    )
