"""appends_to_table: real RecordBatch v2 bytes (kafka.record's builder) in, Arrow out."""

from __future__ import annotations

import struct
from datetime import datetime, timedelta, timezone

import kafka.codec
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.util import calc_crc32c
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from pipeline.table.arrow import appends_to_table
from pipeline.log.batch import PartitionAppend
from pipeline.table.schema import ARROW_SCHEMA, COLUMNS, SPARK_SCHEMA

TS0 = 1_700_000_000_000  # ms
UTC = timezone.utc

CODECS = {
    "gzip": (DefaultRecordBatch.CODEC_GZIP, kafka.codec.has_gzip),
    "snappy": (DefaultRecordBatch.CODEC_SNAPPY, kafka.codec.has_snappy),
    "lz4": (DefaultRecordBatch.CODEC_LZ4, kafka.codec.has_lz4),
    "zstd": (DefaultRecordBatch.CODEC_ZSTD, kafka.codec.has_zstd),
}


def build_batch(records, codec: int = 0, log_append_time: bool = False) -> bytes:
    """One RecordBatch v2 of ``records`` = [(key, value, timestamp_ms, headers)].

    The producer's base offset is 0 and offset deltas count from 0, as a
    producer sends them. ``log_append_time`` sets the timestamp-type bit (which
    only a broker would) and recomputes the CRC so the batch stays valid.
    """
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=False,
        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 30,
    )
    for i, (key, value, ts, headers) in enumerate(records):
        assert builder.append(i, ts, key, value, headers) is not None
    buf = builder.build()
    if log_append_time:
        attrs_at = DefaultRecordBatch.ATTRIBUTES_OFFSET
        (attrs,) = struct.unpack_from(">h", buf, attrs_at)
        struct.pack_into(">h", buf, attrs_at, attrs | DefaultRecordBatch.TIMESTAMP_TYPE_MASK)
        crc = calc_crc32c(bytes(buf[attrs_at:]))
        struct.pack_into(">I", buf, DefaultRecordBatch.CRC_OFFSET, crc)
    batch = DefaultRecordBatch(bytes(buf))
    assert batch.validate_crc()
    assert batch.compression_type == codec
    assert batch.timestamp_type == int(log_append_time)
    return bytes(buf)


def make_append(records_bytes: bytes, count: int, topic="orders", partition=0,
                base_offset=0, log_append_time_ms=TS0 + 999_000) -> PartitionAppend:
    return PartitionAppend(topic, partition, base_offset, records_bytes, count, log_append_time_ms)


def ts(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


VARIED = [
    (b"k0", b"v0", TS0, []),
    (None, b"no key", TS0 + 1, [("h", b"x")]),
    (b"no value", None, TS0 - 5, [("a", b"1"), ("null", None), ("", b"")]),
    (None, None, TS0 + 123, []),
    (b"", b"", TS0 + 10**6, [("\u00e9t\u00e9", b"\x00\xff")]),
]


def expected_headers(headers):
    return [{"key": k, "value": v} for k, v in headers] if headers else None


def test_schema_is_spark_kafka_source_schema_in_arrow():
    assert tuple(ARROW_SCHEMA.names) == COLUMNS
    assert tuple(SPARK_SCHEMA.fieldNames()) == COLUMNS
    # exactly what createDataFrame(pa.Table) casts to, and back
    assert to_arrow_schema(SPARK_SCHEMA, timezone="UTC") == ARROW_SCHEMA
    assert from_arrow_schema(ARROW_SCHEMA) == SPARK_SCHEMA


def test_every_column_of_every_record():
    table = appends_to_table(
        [make_append(build_batch(VARIED), len(VARIED), "orders", 7, base_offset=41)]
    )
    assert table.schema == ARROW_SCHEMA
    assert table.to_pylist() == [
        {
            "key": key,
            "value": value,
            "topic": "orders",
            "partition": 7,
            "offset": 41 + i,
            "timestamp": ts(t),
            "timestampType": 0,
            "headers": expected_headers(headers),
        }
        for i, (key, value, t, headers) in enumerate(VARIED)
    ]


def test_timestamps_keep_millisecond_precision_as_microseconds():
    table = appends_to_table([make_append(build_batch([(b"k", b"v", 1_700_000_000_123, [])]), 1)])
    assert table.column("timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_123_000]


def test_offsets_count_across_batches_and_appends_in_order():
    first = [(b"a%d" % i, b"x", TS0 + i, []) for i in range(3)]
    second = [(b"b%d" % i, b"y", TS0 + 10 + i, [("n", b"%d" % i)]) for i in range(2)]
    other = [(b"c%d" % i, b"z", TS0 + 20 + i, []) for i in range(4)]
    table = appends_to_table([
        make_append(build_batch(first) + build_batch(second), 5, "orders", 0, base_offset=100),
        make_append(build_batch(other), 4, "123", 2, base_offset=0),
        make_append(build_batch(first), 3, "orders", 0, base_offset=105),
    ])
    cols = table.to_pydict()
    assert cols["key"] == (
        [b"a0", b"a1", b"a2", b"b0", b"b1"] + [b"c0", b"c1", b"c2", b"c3"] + [b"a0", b"a1", b"a2"]
    )
    assert cols["topic"] == ["orders"] * 5 + ["123"] * 4 + ["orders"] * 3
    assert cols["partition"] == [0] * 5 + [2] * 4 + [0] * 3
    assert cols["offset"] == [100, 101, 102, 103, 104, 0, 1, 2, 3, 105, 106, 107]
    assert cols["headers"][3:5] == [[{"key": "n", "value": b"0"}], [{"key": "n", "value": b"1"}]]
    assert cols["headers"][:3] == [None] * 3


@pytest.mark.parametrize("name", list(CODECS))
def test_compressed_batch(name):
    codec, available = CODECS[name]
    if not available():
        pytest.skip(f"no {name} library for kafka.codec")
    records = [(b"key-%d" % i, b"value " * 20 + b"%d" % i, TS0 + i, [("i", b"%d" % i)])
               for i in range(50)]
    plain = build_batch(records[:2])
    table = appends_to_table(
        [make_append(plain + build_batch(records, codec=codec), 52, base_offset=10)]
    )
    assert table.column("key").to_pylist() == [b"key-0", b"key-1"] + [r[0] for r in records]
    assert table.column("value").to_pylist()[2:] == [r[1] for r in records]
    assert table.column("offset").to_pylist() == list(range(10, 62))
    assert table.column("timestamp").to_pylist()[2:] == [ts(r[2]) for r in records]
    assert table.column("headers").to_pylist()[2:] == [expected_headers(r[3]) for r in records]


def test_log_append_time_batch_takes_the_append_time():
    create = [(b"c", b"1", TS0 + 1, []), (b"c", b"2", TS0 + 2, [])]
    logged = [(b"l", b"1", TS0 + 3, []), (b"l", b"2", TS0 + 4, [])]
    append_ms = TS0 + 55_555
    table = appends_to_table([
        make_append(build_batch(create) + build_batch(logged, log_append_time=True), 4,
                    log_append_time_ms=append_ms)
    ])
    assert table.column("timestampType").to_pylist() == [0, 0, 1, 1]
    assert table.column("timestamp").to_pylist() == [
        ts(TS0 + 1), ts(TS0 + 2), ts(append_ms), ts(append_ms)
    ]


@pytest.mark.parametrize("claimed", [0, 2, 4, 10])
def test_record_count_mismatch_raises(claimed):
    records = build_batch([(b"k", b"v", TS0, [])] * 3)
    with pytest.raises(ValueError, match=f"record_count is {claimed} but 3 records"):
        appends_to_table([make_append(records, claimed, "orders", 4)])


def test_truncated_trailing_batch_is_a_count_mismatch():
    whole = build_batch([(b"k", b"v", TS0, [])] * 2)
    with pytest.raises(ValueError, match="record_count is 4 but 2 records"):
        appends_to_table([make_append(whole + whole[:-3], 4)])


def test_legacy_magic_is_rejected():
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    builder.append(0, timestamp=TS0, key=b"k", value=b"v")
    with pytest.raises(ValueError, match="magic 0 or 1"):
        appends_to_table([make_append(bytes(builder.build()), 1)])


def test_no_appends_and_empty_appends_give_an_empty_table():
    assert appends_to_table([]) == ARROW_SCHEMA.empty_table()
    assert appends_to_table([make_append(b"", 0)]).num_rows == 0


header = st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5))
record = st.tuples(
    st.none() | st.binary(max_size=20),
    st.none() | st.binary(max_size=50),
    st.integers(min_value=0, max_value=4_000_000_000_000),
    st.lists(header, max_size=3),
)
batches = st.lists(st.lists(record, min_size=1, max_size=6), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(appends=st.lists(st.tuples(batches, st.integers(0, 2**40)), min_size=1, max_size=4))
def test_roundtrip_matches_the_records_sent(appends):
    expected = []
    inputs = []
    for index, (append_batches, base) in enumerate(appends):
        flat = [r for b in append_batches for r in b]
        inputs.append(make_append(b"".join(build_batch(b) for b in append_batches), len(flat),
                                  f"t{index % 2}", index, base_offset=base))
        expected += [(key, value, f"t{index % 2}", index, base + i, ts(t), 0, expected_headers(h))
                     for i, (key, value, t, h) in enumerate(flat)]
    table = appends_to_table(inputs)
    assert [tuple(row.values()) for row in table.to_pylist()] == expected

