"""validate_records on real RecordBatch bytes built with kafka.record."""

from __future__ import annotations

import struct

import pytest

from kafka import codec
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.util import calc_crc32c

from pipeline.protocol import CorruptRecordError
from pipeline.protocol import InvalidRecordError
from pipeline.protocol import InvalidTimestampError
from pipeline.protocol import RecordsInfo
from pipeline.protocol import RecordTooLargeError
from pipeline.protocol import UnsupportedCompressionTypeError
from pipeline.protocol import validate_records
from pipeline.protocol.records import MAX_TIMESTAMP_MS
from pipeline.protocol.records import has_compressed_batch
from pipeline.protocol.records import MAX_UNCOMPRESSED_BATCH_BYTES

T0 = 1_700_000_000_000
CRC_OFFSET = DefaultRecordBatch.CRC_OFFSET  # 17
ATTRIBUTES_OFFSET = DefaultRecordBatch.ATTRIBUTES_OFFSET  # 21
COUNT_OFFSET = DefaultRecordBatch.HEADER_STRUCT.size - 4  # 57


def batch(
    count: int = 5,
    *,
    codec_id: int = DefaultRecordBatch.CODEC_NONE,
    producer_id: int = 1000,
    producer_epoch: int = 2,
    base_sequence: int = 0,
    transactional: bool = False,
    first_timestamp: int = T0,
    value: bytes | None = None,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec_id,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 20,
    )
    for i in range(count):
        builder.append(
            i,
            timestamp=first_timestamp + i,
            key=b"key-%d" % i,
            value=b"value-%d " % i * 20 if value is None else value,
            headers=[("h", b"v")],
        )
    return bytes(builder.build())


def recrc(data: bytes | bytearray, start: int = 0) -> bytes:
    """Recompute the CRC of the batch at ``start`` after editing its header."""
    data = bytearray(data)
    (length,) = struct.unpack_from(">i", data, start + 8)
    end = start + 12 + length
    struct.pack_into(">I", data, start + CRC_OFFSET, calc_crc32c(memoryview(data)[start + ATTRIBUTES_OFFSET : end]))
    return bytes(data)


def test_plain_batch() -> None:
    data = batch(5)
    assert DefaultRecordBatch(data).validate_crc()  # sanity: kafka.record agrees
    assert validate_records(data) == RecordsInfo(
        record_count=5,
        batch_count=1,
        producer_id=1000,
        producer_epoch=2,
        base_sequence=0,
        last_sequence=4,
        is_transactional=False,
        max_timestamp_ms=T0 + 4,
        uncompressed_bytes=len(data),
    )


def test_no_producer_id() -> None:
    info = validate_records(batch(1, producer_id=-1, producer_epoch=-1, base_sequence=-1))
    assert (info.producer_id, info.producer_epoch, info.base_sequence, info.last_sequence) == (
        -1,
        -1,
        -1,
        -1,
    )


def test_transactional_batch() -> None:
    assert validate_records(batch(2, transactional=True)).is_transactional is True


def test_sequence_wraps_at_int32_max() -> None:
    info = validate_records(batch(3, base_sequence=2**31 - 2))
    assert (info.base_sequence, info.last_sequence) == (2**31 - 2, 0)


CODECS = [
    ("gzip", DefaultRecordBatch.CODEC_GZIP, codec.has_gzip),
    ("snappy", DefaultRecordBatch.CODEC_SNAPPY, codec.has_snappy),
    ("lz4", DefaultRecordBatch.CODEC_LZ4, codec.has_lz4),
    ("zstd", DefaultRecordBatch.CODEC_ZSTD, codec.has_zstd),
]


@pytest.mark.parametrize(("name", "codec_id", "available"), CODECS, ids=[c[0] for c in CODECS])
def test_compressed_batch(name: str, codec_id: int, available) -> None:
    if not available():
        pytest.skip(f"{name} library not installed")
    data = batch(50, codec_id=codec_id)
    parsed = DefaultRecordBatch(data)
    assert parsed.compression_type == codec_id
    assert parsed.validate_crc()
    info = validate_records(data)
    assert (info.record_count, info.batch_count, info.last_sequence) == (50, 1, 49)


@pytest.mark.parametrize("codec_id", [1, 2, 3, 4])
def test_codec_bits_on_uncompressed_records_are_corrupt(codec_id: int) -> None:
    # The records are read: an uncompressed batch relabelled with a codec (and
    # re-checksummed) cannot be decompressed, so it is refused before any ack.
    data = bytearray(batch(3))
    (attributes,) = struct.unpack_from(">h", data, ATTRIBUTES_OFFSET)
    struct.pack_into(">h", data, ATTRIBUTES_OFFSET, attributes | codec_id)
    with pytest.raises(CorruptRecordError, match=f"batch 0 at byte 0: cannot decompress \\(codec {codec_id}\\)"):
        validate_records(recrc(data))


@pytest.mark.parametrize(("name", "codec_id", "available"), CODECS, ids=[c[0] for c in CODECS])
def test_decompression_bomb_is_refused_before_inflating(name: str, codec_id: int, available) -> None:
    # 100 MiB of zeros in well under 16 MiB: MESSAGE_TOO_LARGE, and
    # decompression stops at the limit (the test process would show it).
    data = batch(1, codec_id=codec_id, value=bytes(100 * 1024 * 1024))
    assert len(data) < 16 * 1024 * 1024
    with pytest.raises(RecordTooLargeError, match=f"more than the limit of {MAX_UNCOMPRESSED_BATCH_BYTES} bytes"):
        validate_records(data)


def test_uncompressed_bytes_count_the_inflated_size() -> None:
    plain = validate_records(batch(50))
    for codec_id in (1, 2, 3, 4):
        info = validate_records(batch(50, codec_id=codec_id))
        assert info.uncompressed_bytes == plain.uncompressed_bytes


def test_zstd_needs_produce_v7() -> None:
    data = batch(3, codec_id=DefaultRecordBatch.CODEC_ZSTD)
    with pytest.raises(UnsupportedCompressionTypeError, match="zstd needs Produce v7"):
        validate_records(data, produce_version=6)
    assert validate_records(data, produce_version=7).record_count == 3


def _edit_records(count_kept: int, total: int) -> bytes:
    """A batch whose header says ``total`` records but whose body holds the first ``count_kept``'s bytes."""
    full = batch(total)
    fewer = batch(count_kept)
    data = bytearray(full[: len(fewer)])
    struct.pack_into(">i", data, 8, len(data) - 12)
    return recrc(data)


def test_records_cut_short_are_invalid() -> None:
    with pytest.raises(InvalidRecordError, match="record 3 of 5 is truncated or malformed"):
        validate_records(_edit_records(3, 5))


def test_bytes_after_the_declared_records_are_invalid() -> None:
    three = bytearray(batch(3))
    two = batch(2)
    three[23:27] = two[23:27]  # last offset delta 1
    three[COUNT_OFFSET : COUNT_OFFSET + 4] = two[COUNT_OFFSET : COUNT_OFFSET + 4]
    with pytest.raises(InvalidRecordError, match="bytes left after the 2 records"):
        validate_records(recrc(three))


@pytest.mark.parametrize("timestamp", [MAX_TIMESTAMP_MS + 1, 2**62, -(2**62)])
def test_timestamp_the_table_cannot_hold_is_invalid(timestamp: int) -> None:
    with pytest.raises(InvalidTimestampError, match=f"record timestamp {timestamp} ms"):
        validate_records(batch(1, first_timestamp=timestamp))


def test_log_append_time_batch_timestamps_are_not_checked() -> None:
    data = bytearray(batch(1, first_timestamp=2**62))
    (attributes,) = struct.unpack_from(">h", data, ATTRIBUTES_OFFSET)
    struct.pack_into(">h", data, ATTRIBUTES_OFFSET, attributes | DefaultRecordBatch.TIMESTAMP_TYPE_MASK)
    assert validate_records(recrc(data)).record_count == 1


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unknown_codec_is_corrupt(codec_id: int) -> None:
    data = bytearray(batch(3))
    struct.pack_into(">h", data, ATTRIBUTES_OFFSET, codec_id)
    with pytest.raises(CorruptRecordError, match="compression codec"):
        validate_records(recrc(data))


def test_several_batches() -> None:
    first = batch(3, base_sequence=0, first_timestamp=T0 + 100)
    second = batch(4, base_sequence=3, first_timestamp=T0)
    info = validate_records(first + second)
    assert (info.record_count, info.batch_count) == (7, 2)
    assert (info.base_sequence, info.last_sequence) == (0, 6)
    assert info.max_timestamp_ms == T0 + 102


def test_accepts_bytearray_and_memoryview() -> None:
    data = batch(2)
    assert validate_records(bytearray(data)) == validate_records(data)
    assert validate_records(memoryview(data)) == validate_records(data)


@pytest.mark.parametrize("records", [None, b""])
def test_empty_records(records: bytes | None) -> None:
    with pytest.raises(CorruptRecordError, match="no record batch"):
        validate_records(records)


@pytest.mark.parametrize("position", [ATTRIBUTES_OFFSET, 40, 61, -1])
def test_flipped_byte_is_corrupt(position: int) -> None:
    data = bytearray(batch(5))
    data[position] ^= 0x01
    with pytest.raises(CorruptRecordError, match="batch 0 at byte 0: CRC32C mismatch"):
        validate_records(bytes(data))


def test_flipped_crc_is_corrupt() -> None:
    data = bytearray(batch(5))
    data[CRC_OFFSET] ^= 0x80
    with pytest.raises(CorruptRecordError, match="CRC32C"):
        validate_records(bytes(data))


def test_flipped_byte_in_second_batch_names_it() -> None:
    first = batch(2)
    second = bytearray(batch(2))
    second[-3] ^= 0xFF
    with pytest.raises(CorruptRecordError, match=f"batch 1 at byte {len(first)}: CRC32C"):
        validate_records(first + bytes(second))


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_magic_is_unsupported(magic: int) -> None:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=0, batch_size=1 << 20)
    for i in range(3):
        builder.append(i, timestamp=T0 if magic else None, key=None, value=b"v")
    with pytest.raises(InvalidRecordError, match=f"magic {magic}"):
        validate_records(bytes(builder.build()))


def test_magic_3_is_corrupt() -> None:
    data = bytearray(batch(1))
    data[16] = 3
    with pytest.raises(CorruptRecordError, match="magic 3"):
        validate_records(bytes(data))


def test_legacy_batch_after_a_v2_batch_is_unsupported() -> None:
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    builder.append(0, timestamp=T0, key=None, value=b"v")
    with pytest.raises(InvalidRecordError, match="batch 1"):
        validate_records(batch(1) + bytes(builder.build()))


@pytest.mark.parametrize("keep", [1, 11, 12, 16, 17, 60, 61, 200, -1])
def test_truncated_batch_is_refused(keep: int) -> None:
    data = batch(5)
    with pytest.raises((CorruptRecordError, InvalidRecordError), match="batch 0"):
        validate_records(data[:keep])


@pytest.mark.parametrize("tail", [1, 11, 12, 30, 70])
def test_trailing_partial_batch_is_invalid(tail: int) -> None:
    first = batch(2)
    with pytest.raises(InvalidRecordError, match=f"batch 1 at byte {len(first)}"):
        validate_records(first + batch(2)[:tail])


def test_length_too_small_for_header_is_corrupt() -> None:
    data = bytearray(batch(1))
    struct.pack_into(">i", data, 8, 20)  # claims 32 bytes in total
    with pytest.raises(CorruptRecordError, match="smaller than the 61-byte"):
        validate_records(bytes(data[:32]))


def test_negative_length_is_invalid() -> None:
    data = bytearray(batch(1))
    struct.pack_into(">i", data, 8, -1)
    with pytest.raises(InvalidRecordError, match="length field -1"):
        validate_records(bytes(data))


@pytest.mark.parametrize("count", [0, 4, 6, -1])
def test_record_count_must_match_offset_delta(count: int) -> None:
    data = bytearray(batch(5))
    struct.pack_into(">i", data, COUNT_OFFSET, count)
    with pytest.raises(InvalidRecordError, match="record count"):
        validate_records(recrc(data))


def test_control_batch_from_producer_is_invalid() -> None:
    data = bytearray(batch(1))
    (attributes,) = struct.unpack_from(">h", data, ATTRIBUTES_OFFSET)
    struct.pack_into(">h", data, ATTRIBUTES_OFFSET, attributes | DefaultRecordBatch.CONTROL_MASK)
    with pytest.raises(InvalidRecordError, match="control batch"):
        validate_records(recrc(data))


def test_batches_of_different_producers_are_invalid() -> None:
    with pytest.raises(InvalidRecordError, match="batch 1 .* producer 1001/2 differs"):
        validate_records(batch(1) + batch(1, producer_id=1001))


def test_transactional_and_plain_batches_together_are_invalid() -> None:
    # One partition's records are in one transaction or in none (the persister holds them by the first batch).
    with pytest.raises(InvalidRecordError, match="batch 1 .* transactional and non-transactional"):
        validate_records(batch(1, transactional=True) + batch(1, base_sequence=1))


def test_has_compressed_batch_looks_at_every_batch() -> None:
    plain, gzip = batch(2), batch(2, codec_id=DefaultRecordBatch.CODEC_GZIP)
    assert not has_compressed_batch(plain + plain)
    assert has_compressed_batch(gzip)
    assert has_compressed_batch(plain + gzip)  # a bomb behind a harmless first batch
    assert not has_compressed_batch(None) and not has_compressed_batch(b"\x00" * 5)
