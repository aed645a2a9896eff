"""pipeline._records (C): every record of RecordBatch v2 batches, against kafka-python's reader,
and malformed records refused (RecordsError), never read past their bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from pipeline import _records
from pipeline.protocol.records import record_batches

HEADER = 61

record = st.tuples(
    st.one_of(st.none(), st.binary(max_size=30)),                      # key
    st.one_of(st.none(), st.binary(max_size=300)),                     # value
    st.integers(-(2**40), 2**40),                                       # timestamp delta (ms)
    st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=3),
)


def build(records: list) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    first = 1_700_000_000_000
    for i, (key, value, delta, headers) in enumerate(records):
        builder.append(i, timestamp=first + delta, key=key, value=value, headers=headers)
    return bytes(builder.build())


def binary(column, n: int) -> list:
    data, offsets, validity, nulls = column
    offs = np.frombuffer(offsets, np.int32)
    assert len(offs) == n + 1 and offs[0] == 0
    bits = np.unpackbits(np.frombuffer(validity, np.uint8), bitorder="little") if validity is not None else None
    assert (nulls == 0) == (validity is None)
    return [None if bits is not None and not bits[i] else data[offs[i]:offs[i + 1]] for i in range(n)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(record, min_size=1, max_size=12), min_size=1, max_size=4))
def test_columns_are_what_kafka_python_reads(batches):
    raw = [build(b) for b in batches]
    sections = [b for r in raw for b in record_batches(r)]
    out = _records.columns([s.records for s in sections], [s.count for s in sections])
    expected = [rec for r in raw for rec in DefaultRecordBatch(r)]
    n = len(expected)
    assert out["rows"] == n
    assert binary(out["key"], n) == [r.key for r in expected]
    assert binary(out["value"], n) == [r.value for r in expected]
    firsts = np.repeat([s.first_timestamp for s in sections], [s.count for s in sections])
    deltas = np.frombuffer(out["timestamp_delta"], np.int64)
    assert list(firsts + deltas) == [r.timestamp for r in expected]
    if not any(r.headers for r in expected):
        assert out["header_offsets"] is None
    else:
        offs = np.frombuffer(out["header_offsets"], np.int32)
        total = int(offs[-1])
        keys = [k.decode() for k in binary(out["header_key"], total)]
        values = binary(out["header_value"], total)
        got = [list(zip(keys[offs[i]:offs[i + 1]], values[offs[i]:offs[i + 1]])) for i in range(n)]
        assert got == [list(r.headers) for r in expected]
    for s in sections:
        count, low, high = _records.scan(s.records, s.count)
        assert count == s.count and low <= high


@settings(max_examples=300, deadline=None)
@given(st.lists(record, min_size=1, max_size=5), st.data())
def test_a_record_cut_or_changed_anywhere_is_refused_or_read_within_its_bytes(records, data):
    body = build(records)[HEADER:]
    cut = data.draw(st.integers(0, len(body) - 1))
    for damaged in (body[:cut], body[:cut] + bytes([data.draw(st.integers(0, 255))]) + body[cut + 1:]):
        for call, args in ((_records.scan, (damaged, len(records))), (_records.columns, ([damaged], [len(records)]))):
            try:
                call(*args)
            except _records.RecordsError as exc:
                message, batch, index = exc.args
                assert batch == 0 and 0 <= index <= len(records) and message


@pytest.mark.parametrize("body, count, message", [
    (b"", 1, "truncated record length"),
    (b"\x02\x00", 1, "truncated timestamp delta"),            # length 1: only the attributes byte
    (b"\x7f", 1, "record length past the end"),                 # length -64
    (bytes([40]) + b"\x00" * 10, 1, "record length past the end"),  # length 20, 10 bytes left
])
def test_named_errors(body, count, message):
    with pytest.raises(_records.RecordsError, match=message):
        _records.scan(body, count)


def test_bytes_after_the_last_record_and_a_bad_header_key_are_refused():
    body = build([(b"k", b"v", 0, [])])[HEADER:]
    with pytest.raises(_records.RecordsError, match="bytes left after the declared record count"):
        _records.scan(body + b"\x00", 1)
    with pytest.raises(_records.RecordsError, match="bytes left after the declared record count") as info:
        _records.columns([body, body + b"\x00"], [1, 1])
    assert info.value.args == ("bytes left after the declared record count", 1, 1)
    bad_key = build([(b"k", b"v", 0, [("h", b"x")])])[HEADER:].replace(b"\x02h", b"\x02\xff")
    with pytest.raises(_records.RecordsError, match="header key is not UTF-8"):
        _records.scan(bad_key, 1)


def test_counts_must_match_the_batches():
    with pytest.raises(ValueError, match="differ in length"):
        _records.columns([b""], [])
    with pytest.raises(ValueError, match="negative"):
        _records.columns([b""], [-1])
    assert _records.columns([], [])["rows"] == 0
