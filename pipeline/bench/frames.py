"""Pre-built Produce request frames whose records say who sent them (sans-I/O).

The load generator must not become the bottleneck, so every request frame of
a run is built before the clock starts. Building each one with kio and
kafka.record costs ~100 us; instead one *template* frame is built per
(connection, partition) with those libraries, and each request's frame is a
copy of it with three fixed-width fields patched in place:

* the correlation id (request header, bytes 8-12 of the frame),
* the request number inside every record key (fixed-width ASCII digits, so no
  varint length changes), and
* the RecordBatch CRC32C (``kafka.record.util.calc_crc32c``), recomputed over
  the batch from its ``attributes`` field to the end, as Kafka's
  DefaultRecordBatch does.

Record keys are ``c<conn:04>r<req:08>i<index:04>`` (19 ASCII bytes), so every
stored row names the connection, request and position it came from; that is
what lets the table check find missing, duplicated and reordered rows. Values
are ``record_bytes`` filler bytes.

Correlation ids are the request number on its connection (0, 1, 2, ...);
setup requests (ApiVersions, Metadata) use ids from ``SETUP_CORRELATION_BASE``.
"""

from __future__ import annotations

import datetime
import io
import re
import struct
from typing import Any
from dataclasses import dataclass

from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c
from kio.serial import entity_writer
from kio.static.primitive import i16, i32
from kio.static.protocol import RequestPayload

KEY_FORMAT = "c{conn:04d}r{req:08d}i{index:04d}"
KEY_BYTES = 19
MAX_CONNECTIONS = 10_000
MAX_REQUESTS_PER_CONNECTION = 100_000_000
MAX_RECORDS_PER_REQUEST = 10_000
SETUP_CORRELATION_BASE = 1 << 30
"""Correlation ids at and above this are setup/fence requests, never produce requests."""

_KEY_RE = re.compile(rb"c(\d{4})r(\d{8})i(\d{4})")
_CORRELATION = struct.Struct(">i")
_CORRELATION_AT = 8  # size prefix (4) + api_key (2) + api_version (2)
# RecordBatch v2 (Kafka DefaultRecordBatch): baseOffset int64, batchLength int32,
# partitionLeaderEpoch int32, magic int8, crc uint32, attributes int16, ...
_CRC_AT = 17
_CRC_FROM = 21
_CRC = struct.Struct(">I")


def record_key(conn: int, req: int, index: int) -> bytes:
    """The key of record ``index`` of request ``req`` on connection ``conn`` (19 bytes)."""
    return KEY_FORMAT.format(conn=conn, req=req, index=index).encode()


def parse_record_key(key: bytes) -> tuple[int, int, int]:
    """``(conn, req, index)`` from a key made by :func:`record_key`.

    Raises:
        ValueError: ``key`` is not such a key (None, other length, other shape).
    """
    m = _KEY_RE.fullmatch(key or b"")
    if m is None:
        raise ValueError(f"not a benchmark record key: {key!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def produce_request(topic: str, partition: int, batch: bytes, acks: int, version: int) -> Any:
    """A kio ProduceRequest entity of ``version`` (3-11) with one partition."""
    from kio.index import load_payload_module
    from kio.static.constants import EntityType

    module = load_payload_module(0, version, EntityType.request)
    return module.ProduceRequest(
        transactional_id=None,
        acks=i16(acks),
        timeout=datetime.timedelta(seconds=30),
        topic_data=(module.TopicProduceData(name=topic, partition_data=(
            module.PartitionProduceData(index=i32(partition), records=batch),)),),
    )


def encode_request(entity: RequestPayload, correlation_id: int, client_id: str = "pipeline-bench") -> bytes:
    """Size prefix + request header (the version the entity's schema names) + body."""
    header_cls = entity.__header_schema__
    header = header_cls(request_api_key=entity.__api_key__, request_api_version=entity.__version__,
                        correlation_id=i32(correlation_id), client_id=client_id)
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header)
    entity_writer(type(entity))(buf, entity)
    body = buf.getvalue()
    return struct.pack(">i", len(body)) + body


def record_batch(conn: int, req: int, records: int, record_bytes: int, timestamp_ms: int) -> bytes:
    """One uncompressed RecordBatch v2 of ``records`` records keyed by :func:`record_key`."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 30)
    value = b"v" * record_bytes
    for i in range(records):
        builder.append(i, timestamp=timestamp_ms, key=record_key(conn, req, i), value=value, headers=[])
    return bytes(builder.build())


@dataclass(frozen=True, slots=True)
class RequestShape:
    """What every produce request of a run looks like.

    Attributes:
        topic: the one topic written.
        records: records per request (R).
        record_bytes: value bytes per record (S).
        acks: -1, 0 or 1.
        version: Produce api version (3-11; 9 is the first flexible one).
    """

    topic: str
    records: int
    record_bytes: int
    acks: int = -1
    version: int = 9


class FrameTemplate:
    """Produce frames of one connection to one partition, differing only in request number.

    Args:
        shape: see RequestShape.
        conn: connection number (0..9999), written into every key.
        partition: the partition every request of this template writes to.
        timestamp_ms: CreateTime of every record.

    Raises:
        ValueError: a field out of the fixed-width key's range.
    """

    def __init__(self, shape: RequestShape, conn: int, partition: int, timestamp_ms: int) -> None:
        if not 0 <= conn < MAX_CONNECTIONS:
            raise ValueError(f"connection number must be 0..{MAX_CONNECTIONS - 1}, got {conn}")
        if not 1 <= shape.records <= MAX_RECORDS_PER_REQUEST:
            raise ValueError(f"records per request must be 1..{MAX_RECORDS_PER_REQUEST}, got {shape.records}")
        self.conn = conn
        self.partition = partition
        batch = record_batch(conn, 0, shape.records, shape.record_bytes, timestamp_ms)
        frame = encode_request(produce_request(shape.topic, partition, batch, shape.acks, shape.version), 0)
        self._template = bytes(frame)
        start = frame.find(batch)
        if start < 0 or frame.find(batch, start + 1) >= 0:
            raise AssertionError("record batch not found exactly once in its request frame")
        self._crc_at = start + _CRC_AT
        self._crc_from = start + _CRC_FROM
        self._crc_to = start + len(batch)
        # Where the 8 request digits of each key sit: after "cNNNNr".
        self._req_digits: list[int] = []
        for i in range(shape.records):
            at = frame.find(record_key(conn, 0, i), start)
            if at < 0:
                raise AssertionError(f"key of record {i} not found in the template")
            self._req_digits.append(at + 6)

    @property
    def size(self) -> int:
        """Bytes of one frame, size prefix included."""
        return len(self._template)

    def frame(self, req: int) -> bytes:
        """The frame of request number ``req`` (also its correlation id).

        Raises:
            ValueError: ``req`` outside 0..99,999,999.
        """
        if not 0 <= req < MAX_REQUESTS_PER_CONNECTION:
            raise ValueError(f"request number must be 0..{MAX_REQUESTS_PER_CONNECTION - 1}, got {req}")
        buf = bytearray(self._template)
        _CORRELATION.pack_into(buf, _CORRELATION_AT, req)
        digits = b"%08d" % req
        for at in self._req_digits:
            buf[at:at + 8] = digits
        with memoryview(buf) as view:
            crc = calc_crc32c(view[self._crc_from:self._crc_to])
        _CRC.pack_into(buf, self._crc_at, crc)
        return bytes(buf)


def correlation_id_of(frame: bytes) -> int:
    """The correlation id of a request frame (size prefix included)."""
    return _CORRELATION.unpack_from(frame, _CORRELATION_AT)[0]
