"""Transaction markers: the control batches a transaction coordinator writes into the log (no I/O).

When a transaction ends, Kafka's coordinator writes one control batch into
every partition the transaction wrote to (KIP-98, Kafka ``EndTransactionMarker``
and ``MemoryRecords.withEndTransactionMarker``): a RecordBatch v2 whose
attributes say *transactional* and *control*, with the producer's id and
epoch, base sequence -1, and one record whose

* key is ``version int16 (0), type int16`` (0 ABORT, 1 COMMIT), and
* value is ``version int16 (0), coordinator epoch int32``.

A read-committed consumer drops the records of an aborted transaction up to
its ABORT marker (helped by the aborted-transactions list in Fetch), and
never delivers control records to the application. Here the markers also
decide what reaches the table: records of a transaction are held until its
marker, then written (COMMIT) or dropped (ABORT).
"""

from __future__ import annotations

import enum
import struct

from crc32c import crc32c

__all__ = ("ABORT", "COMMIT", "ControlType", "batch_kind", "build_empty_batch", "build_marker", "marker_type",
           "TRANSACTIONAL", "CONTROL", "DATA")

_HEADER = struct.Struct(">qiibIhiqqqhii")
"""RecordBatch v2 header (Kafka DefaultRecordBatch): baseOffset, batchLength, partitionLeaderEpoch, magic,
crc, attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence,
recordCount: 61 bytes."""
_CRC_START = 21  # the CRC covers attributes onwards
_ATTRIBUTES = struct.Struct(">h")
_ATTRIBUTES_AT = 21
_TRANSACTIONAL_BIT, _CONTROL_BIT = 0x10, 0x20


class ControlType(enum.IntEnum):
    """The type in a control record's key (Kafka ControlRecordType)."""

    ABORT = 0
    COMMIT = 1


ABORT, COMMIT = ControlType.ABORT, ControlType.COMMIT
DATA, TRANSACTIONAL, CONTROL = 0, 1, 2
"""``batch_kind`` results: ordinary records, records of a transaction, a transaction marker."""


def batch_kind(records: bytes | bytearray | memoryview) -> int:
    """DATA, TRANSACTIONAL or CONTROL, from the attributes of the first RecordBatch in ``records``.

    Every batch of one produce request has the same producer and the same
    transactional flag (``pipeline.protocol.records.validate_records``), and a
    marker is alone in its append, so the first batch speaks for the append.
    Empty ``records`` (an append stripped of its bytes) are DATA.
    """
    if len(records) < _ATTRIBUTES_AT + 2:
        return DATA
    (attributes,) = _ATTRIBUTES.unpack_from(records, _ATTRIBUTES_AT)
    if attributes & _CONTROL_BIT:
        return CONTROL
    return TRANSACTIONAL if attributes & _TRANSACTIONAL_BIT else DATA


def _varint(value: int) -> bytes:
    """Zig-zag varint (protobuf's, as Kafka's record fields use)."""
    v = (value << 1) ^ (value >> 63)
    out = bytearray()
    while v & ~0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def build_marker(producer_id: int, producer_epoch: int, control: ControlType, coordinator_epoch: int,
                 timestamp_ms: int) -> bytes:
    """One control batch (base offset 0: offsets are assigned when it is appended) ending a transaction.

    Args:
        producer_id, producer_epoch: the transaction's producer (the epoch the
            coordinator ends it with: bumped when it aborts a fenced or timed-out producer).
        control: COMMIT or ABORT.
        coordinator_epoch: the coordinator's epoch (Kafka's partition leader epoch of the
            transaction log; one broker keeps 0).
        timestamp_ms: the marker's timestamp (ms since the epoch).

    Returns:
        the RecordBatch v2 bytes, CRC32C set.
    """
    key = struct.pack(">hh", 0, int(control))
    value = struct.pack(">hi", 0, coordinator_epoch)
    body = (b"\x00" + _varint(0) + _varint(0) + _varint(len(key)) + key + _varint(len(value)) + value
            + _varint(0))  # attributes, timestamp delta, offset delta, key, value, no headers
    record = _varint(len(body)) + body
    length = _HEADER.size - 12 + len(record)
    attributes = _TRANSACTIONAL_BIT | _CONTROL_BIT
    header = bytearray(_HEADER.pack(0, length, -1, 2, 0, attributes, 0, timestamp_ms, timestamp_ms,
                                    producer_id, producer_epoch, -1, 1))
    batch = header + record
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[_CRC_START:])))
    return bytes(batch)


def marker_type(records: bytes | bytearray | memoryview) -> ControlType:
    """COMMIT or ABORT, from a control batch built by ``build_marker`` (or any Kafka marker).

    Raises:
        ValueError: ``records`` is not a control batch with a transaction-marker key.
    """
    if batch_kind(records) != CONTROL:
        raise ValueError("not a control batch")
    pos = _HEADER.size
    # record: length varint, attributes int8, timestamp delta varint, offset delta varint, key length varint
    pos = _skip_varint(records, pos)  # record length
    pos += 1  # attributes
    for _ in range(2):  # timestamp delta, offset delta
        pos = _skip_varint(records, pos)
    key_length, pos = _read_varint(records, pos)
    if key_length < 4 or pos + key_length > len(records):
        raise ValueError("control record without a 4-byte key")
    _version, kind = struct.unpack_from(">hh", records, pos)
    return ControlType(kind)


def _skip_varint(data: bytes | bytearray | memoryview, pos: int) -> int:
    while data[pos] & 0x80:
        pos += 1
    return pos + 1


def _read_varint(data: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    return (result >> 1) ^ -(result & 1), pos


def build_empty_batch(base_offset: int, count: int) -> bytes:
    """A RecordBatch v2 that holds no record and covers ``count`` offsets from ``base_offset``: how
    Kafka's log cleaner keeps offsets whose records are all gone (v2 keeps a batch's last offset,
    ``lastOffsetDelta``, when it empties it); consumers move past it to ``base_offset + count``.
    Served for offsets that are never rows of the table (markers, aborted records) where the table
    is all that is left of them (``pipeline.log.manager.LogManager.read``).

    Raises:
        ValueError: ``count`` < 1.
    """
    if count < 1:
        raise ValueError(f"an empty batch covers at least one offset, not {count}")
    header = bytearray(_HEADER.pack(base_offset, _HEADER.size - 12, -1, 2, 0, 0, count - 1, 0, 0, -1, -1, -1, 0))
    struct.pack_into(">I", header, 17, crc32c(bytes(header[_CRC_START:])))
    return bytes(header)
