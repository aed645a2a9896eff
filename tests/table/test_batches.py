"""encode_batches: RecordBatch v2 built from Arrow columns, byte for byte what kafka-python's
``DefaultRecordBatchBuilder`` builds for the same records, and decoded back by kafka-python's
``MemoryRecords`` into the source rows (nulls, headers, timestamps, offsets)."""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder

from pipeline.table.batches import CODEC_GZIP, CODEC_LZ4, CODEC_NONE, CODEC_SNAPPY, CODEC_ZSTD, encode_batches
from pipeline.table.schema import HEADERS_ARROW_TYPE

T0 = 1_795_000_000_000  # ms


class _Builder(DefaultRecordBatchBuilder):
    """kafka-python's builder marking a batch LogAppendTime (the reference)."""

    def __init__(self, codec: int, batch_size: int, log_append_time: bool) -> None:
        super().__init__(magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
                         producer_epoch=-1, base_sequence=-1, batch_size=batch_size)
        self.lat = log_append_time

    def _get_attributes(self, include_compression_type=True):
        attrs = super()._get_attributes(include_compression_type)
        return attrs | self.TIMESTAMP_TYPE_MASK if self.lat else attrs


def reference(records: list[tuple], max_bytes: int, max_records: int | None = None, min_one: bool = True,
              codec: int = CODEC_NONE) -> tuple[bytes, int]:
    """kafka-python, one record at a time: the encoder the table reader used before."""
    if max_records is not None:
        records = records[:max_records]
    out, count, builder, base = bytearray(), 0, None, 0
    batch_type = batch_ts = 0

    def finish(b: _Builder) -> bytes:
        buf = b.build()
        struct.pack_into(">q", buf, 0, base)
        return buf

    for o, ts, t, key, value, headers in records:
        hs = headers or []
        if builder is not None and (t != batch_type or (t == 1 and ts != batch_ts)
                                    or builder.append(o - base, ts, key, value, hs) is None):
            out += finish(builder)
            builder = None
        if builder is None:
            remaining = max_bytes - len(out)
            need = 61 + DefaultRecordBatchBuilder.size_in_bytes(0, 0, key, value, hs)
            if need > remaining and not (min_one and count == 0):
                break
            builder = _Builder(codec, max(remaining, need), t == 1)
            base, batch_type, batch_ts = o, t, ts
            builder.append(0, ts, key, value, hs)
        count += 1
    if builder is not None:
        out += finish(builder)
    return bytes(out), count


def encode(records: list[tuple], max_bytes: int, **kw) -> tuple[bytes, int]:
    offsets = np.array([r[0] for r in records], np.int64)
    ts = np.array([r[1] for r in records], np.int64)
    types = np.array([r[2] for r in records], np.int64)
    keys = pa.array([r[3] for r in records], pa.binary())
    values = pa.array([r[4] for r in records], pa.binary())
    headers = pa.array([None if r[5] is None else [{"key": k, "value": v} for k, v in r[5]] for r in records],
                       HEADERS_ARROW_TYPE)
    return encode_batches(offsets, ts, types, keys, values, headers, max_bytes, **kw)


def decode(data: bytes) -> list[tuple]:
    out, batches = [], MemoryRecords(data)
    while (batch := batches.next_batch()) is not None:
        assert batch.magic == 2 and batch.validate_crc()
        for r in batch:
            out.append((r.offset, r.timestamp, r.timestamp_type, r.key, r.value, list(r.headers)))
    return out


def as_decoded(records: list[tuple]) -> list[tuple]:
    return [(o, ts, t, k, v, list(h or [])) for o, ts, t, k, v, h in records]


blobs = st.one_of(st.none(), st.binary(max_size=40), st.binary(min_size=120, max_size=300))
header_lists = st.one_of(st.none(), st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))),
                                            max_size=3))


@st.composite
def record_lists(draw) -> list[tuple]:
    n = draw(st.integers(1, 40))
    offset = draw(st.integers(0, 2**40))
    out = []
    for _ in range(n):
        offset += draw(st.sampled_from([1, 1, 1, 2, 1000, 2**20]))  # dense, with gaps now and then
        t = draw(st.sampled_from([0, 0, 1]))
        ts = draw(st.one_of(st.just(-1), st.integers(0, 2**45), st.integers(T0, T0 + 5)))
        out.append((offset, ts, t, draw(blobs), draw(blobs), draw(header_lists)))
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=record_lists(), max_bytes=st.integers(0, 6000), min_one=st.booleans(),
       max_records=st.one_of(st.none(), st.integers(1, 50)))
def test_the_same_bytes_as_kafka_python(records, max_bytes, min_one, max_records):
    got = encode(records, max_bytes, min_one=min_one, max_records=max_records)
    assert got == reference(records, max_bytes, max_records, min_one)
    data, count = got
    assert decode(data) == as_decoded(records[:count])
    if count and not (count == 1 and min_one):
        assert len(data) <= max_bytes


@pytest.mark.parametrize("codec", [CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD])
def test_compressed_batches(codec):
    records = [(i, T0 + i, 0, b"k%d" % i, b"same bytes " * 20, [("h", b"v")]) for i in range(50)]
    records += [(50, T0, 1, None, bytes(range(30)), None)]  # a LogAppendTime batch that does not shrink
    data, count = encode(records, 1 << 20, codec=codec)
    assert (data, count) == reference(records, 1 << 20, codec=codec)
    assert count == 51 and decode(data) == as_decoded(records)
    batches = MemoryRecords(data)
    assert batches.next_batch().compression_type == codec
    assert batches.next_batch().compression_type == 0


def test_batches_and_their_headers():
    records = [(3, T0, 0, None, b"a", [("h", None)]), (4, T0 - 500, 0, b"b", None, []), (9, -1, 0, b"k", b"v", None),
               (10, T0 + 7000, 1, b"k", b"v", None), (11, T0 + 7000, 1, b"k", b"v", None),
               (12, T0 + 9000, 1, b"k", b"v", None), (13, T0 + 10, 0, b"", b"", [("", b""), ("\u00e9", b"z")])]
    data, count = encode(records, 1 << 20)
    assert count == 7 and decode(data) == as_decoded(records)
    spans, batches = [], MemoryRecords(data)
    while (b := batches.next_batch()) is not None:
        spans.append((b.base_offset, b.last_offset, b.timestamp_type, b.max_timestamp))
    assert spans == [(3, 9, 0, T0), (10, 11, 1, T0 + 7000), (12, 12, 1, T0 + 9000), (13, 13, 0, T0 + 10)]


def test_large_values_and_a_sliced_input():
    values = [bytes([i]) * (100_000 + i) for i in range(12)]
    offsets = np.arange(100, 112, dtype=np.int64)
    headers = pa.array([[{"key": "n", "value": b"%d" % i}] for i in range(12)], HEADERS_ARROW_TYPE)
    keys = pa.array([b"k%d" % i for i in range(12)], pa.binary())
    args = (offsets[4:], np.full(8, T0, np.int64), np.zeros(8, np.int64), keys.slice(4), pa.array(values).slice(4),
            headers.slice(4))
    data, count = encode_batches(*args, 350_000)
    assert count == 3 and len(data) <= 350_000
    assert decode(data) == [(104 + i, T0, 0, b"k%d" % (4 + i), values[4 + i], [("n", b"%d" % (4 + i))])
                            for i in range(3)]
    one, n = encode_batches(*args, 10)
    assert n == 1 and decode(one)[0][0] == 104
    assert encode_batches(*args, 10, min_one=False) == (b"", 0)


def test_lengths_must_agree():
    with pytest.raises(ValueError):
        encode_batches(np.arange(2), np.zeros(1, np.int64), np.zeros(2, np.int64), pa.array([b"a", b"b"]),
                       pa.array([b"a", b"b"]), pa.array([None, None], HEADERS_ARROW_TYPE), 100)
