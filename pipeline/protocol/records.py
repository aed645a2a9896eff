"""Cheap validation of one partition's produced records (RecordBatch v2).

A Produce request carries, per partition, one or more concatenated record
batches. Before records are acknowledged they must be checked the way
Kafka's ``LogValidator``/``DefaultRecordBatch.ensureValid`` check them,
but without decoding (or decompressing) the individual records: the batch
is persisted as the client sent it, so only its framing and checksum matter
here. The cost is one header unpack plus one CRC32C per batch (a few us for
small batches; CRC32C runs at GB/s with the ``crc32c`` extension).

Batch layout, header struct and CRC32C come from kafka-python's
``kafka.record``. ``DefaultRecordBatch.validate_crc()`` would copy the batch
into a bytearray first, so the same check (CRC32C of everything from the
attributes field on, compared with the header's CRC) is done here on a
memoryview with ``kafka.record.util.calc_crc32c``.
"""

from __future__ import annotations

import struct

from dataclasses import dataclass

from kafka.record.default_records import DefaultRecordBatch
from kafka.record.util import calc_crc32c

from .errors import CorruptRecordError
from .errors import UnsupportedRecordVersionError

__all__ = ("RecordsInfo", "validate_records")

_HEADER = DefaultRecordBatch.HEADER_STRUCT  # 61 bytes, big-endian
_HEADER_SIZE = _HEADER.size
_LENGTH = struct.Struct(">i")  # batch length, at byte 8
_LOG_OVERHEAD = DefaultRecordBatch.AFTER_LEN_OFFSET  # base_offset:int64 + length:int32 = 12
_MAGIC_OFFSET = 16  # after base_offset, length, partition_leader_epoch (same in v0/v1)
_CRC_START = DefaultRecordBatch.ATTRIBUTES_OFFSET  # 21: CRC covers attributes..end
_CODEC_MASK = DefaultRecordBatch.CODEC_MASK
_MAX_CODEC = DefaultRecordBatch.CODEC_ZSTD
_TRANSACTIONAL_MASK = DefaultRecordBatch.TRANSACTIONAL_MASK
_CONTROL_MASK = DefaultRecordBatch.CONTROL_MASK
_NO_SEQUENCE = DefaultRecordBatch.NO_SEQUENCE
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class RecordsInfo:
    """Summary of one partition's records.

    ``producer_id``/``producer_epoch``/``base_sequence``/``is_transactional``
    come from the first batch (all batches must agree on producer id and
    epoch), ``last_sequence`` from the last batch (-1 if it has no sequence),
    ``record_count`` and ``batch_count`` are totals, ``max_timestamp_ms`` the
    largest batch max timestamp (ms since epoch, CreateTime as sent).
    """

    record_count: int
    batch_count: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    last_sequence: int
    is_transactional: bool
    max_timestamp_ms: int


def _last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    # Sequence numbers wrap from INT32_MAX to 0 (Kafka
    # DefaultRecordBatch.incrementSequence).
    if base_sequence == _NO_SEQUENCE:
        return _NO_SEQUENCE
    return (base_sequence + last_offset_delta) % (_INT32_MAX + 1)


def validate_records(records: bytes | None) -> RecordsInfo:
    """Validate the raw records of one partition without decoding records.

    Checks, per batch: enough bytes for the length field, a length that
    fits in what is left, magic 2, a full 61-byte v2 header, CRC32C,
    record count >= 1 and equal to ``last_offset_delta + 1`` (Kafka
    ``LogValidator``: "Inner record count and offset range don't match"), a
    known compression codec, not a control batch (only a transaction
    coordinator writes those), and the same producer id/epoch as the first
    batch. No bytes may follow the last batch.

    :raises UnsupportedRecordVersionError: a batch's magic is not 2.
    :raises CorruptRecordError: None/empty records or any other failed
        check; the message names the batch index and byte position.
    """
    if not records:
        raise CorruptRecordError("partition has no record batch (null or empty records)")
    view = memoryview(records)
    end = len(view)
    pos = 0
    index = 0
    record_count = 0
    max_timestamp = -1
    first: tuple | None = None
    last_sequence = _NO_SEQUENCE
    while pos < end:
        remaining = end - pos
        if remaining < _LOG_OVERHEAD:
            raise CorruptRecordError(
                f"batch {index} at byte {pos}: {remaining} trailing bytes, "
                f"less than the {_LOG_OVERHEAD}-byte log overhead"
            )
        (length,) = _LENGTH.unpack_from(view, pos + 8)
        batch_size = _LOG_OVERHEAD + length
        if length < 0 or batch_size > remaining:
            raise CorruptRecordError(
                f"batch {index} at byte {pos}: length field {length} does not fit "
                f"the {remaining - _LOG_OVERHEAD} bytes left (truncated batch?)"
            )
        if batch_size > _MAGIC_OFFSET:
            magic = view[pos + _MAGIC_OFFSET]
            if magic != 2:
                raise UnsupportedRecordVersionError(
                    f"batch {index} at byte {pos}: magic {magic}, only RecordBatch v2 (magic 2) is accepted"
                )
        if batch_size < _HEADER_SIZE:
            raise CorruptRecordError(
                f"batch {index} at byte {pos}: {batch_size} bytes, smaller than the "
                f"{_HEADER_SIZE}-byte RecordBatch v2 header"
            )
        (
            _base_offset,
            _length,
            _leader_epoch,
            _magic,
            crc,
            attributes,
            last_offset_delta,
            _first_timestamp,
            batch_max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        ) = _HEADER.unpack_from(view, pos)
        if calc_crc32c(view[pos + _CRC_START : pos + batch_size]) != crc:
            raise CorruptRecordError(f"batch {index} at byte {pos}: CRC32C mismatch")
        if count < 1 or count != last_offset_delta + 1:
            raise CorruptRecordError(
                f"batch {index} at byte {pos}: record count {count} does not match "
                f"last offset delta {last_offset_delta}"
            )
        if attributes & _CODEC_MASK > _MAX_CODEC:
            raise CorruptRecordError(
                f"batch {index} at byte {pos}: unknown compression codec {attributes & _CODEC_MASK}"
            )
        if attributes & _CONTROL_MASK:
            raise CorruptRecordError(f"batch {index} at byte {pos}: control batch from a producer")
        if first is None:
            first = (producer_id, producer_epoch, base_sequence, bool(attributes & _TRANSACTIONAL_MASK))
        elif (producer_id, producer_epoch) != first[:2]:
            raise CorruptRecordError(
                f"batch {index} at byte {pos}: producer {producer_id}/{producer_epoch} differs "
                f"from the first batch's {first[0]}/{first[1]}"
            )
        last_sequence = _last_sequence(base_sequence, last_offset_delta)
        record_count += count
        if batch_max_timestamp > max_timestamp:
            max_timestamp = batch_max_timestamp
        pos += batch_size
        index += 1
    assert first is not None  # records is non-empty, so the loop ran
    return RecordsInfo(
        record_count=record_count,
        batch_count=index,
        producer_id=first[0],
        producer_epoch=first[1],
        base_sequence=first[2],
        last_sequence=last_sequence,
        is_transactional=first[3],
        max_timestamp_ms=max_timestamp,
    )
