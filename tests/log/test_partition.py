"""PartitionLog and the RecordBatch header helpers: plain functions, no I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder

from pipeline.log.partition import Location, PartitionLog, batch_spans, batches_from, max_timestamp, rebase
from tests.e2e import raw_client as rc


def batch(values: list[bytes], timestamp_ms: int = 1_000) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=timestamp_ms + i, key=None, value=value, headers=[])
    return bytes(builder.build())


def offsets_and_values(data: bytes) -> list[tuple[int, bytes]]:
    records = MemoryRecords(data)
    out = []
    while (b := records.next_batch()) is not None:
        out.extend((r.offset, r.value) for r in b)
    return out


def test_batch_spans_give_size_count_and_max_timestamp() -> None:
    data = batch([b"a", b"b", b"c"], 500) + batch([b"d"], 900)
    spans = batch_spans(data)
    assert [(count, ts) for _pos, _size, count, ts in spans] == [(3, 502), (1, 900)]
    assert spans[0][0] == 0 and spans[1][0] == spans[0][1] and sum(s[1] for s in spans) == len(data)


def test_batch_spans_refuse_a_truncated_header() -> None:
    with pytest.raises(ValueError, match="truncated"):
        batch_spans(batch([b"a"])[:20])
    with pytest.raises(ValueError, match="past the end"):
        batch_spans(batch([b"a"])[:-1])


@given(st.lists(st.tuples(st.integers(1, 4), st.integers(-1, 2**42)), max_size=6), st.data())
def test_max_timestamp_in_c_is_the_largest_batch_max_timestamp_and_refuses_what_batch_spans_refuses(
        shapes: list[tuple[int, int]], data: st.DataObject) -> None:
    records = b"".join(batch([b"v%d" % i for i in range(n)], ts) for n, ts in shapes)
    assert max_timestamp(records) == max((ts for *_, ts in batch_spans(records)), default=-1)
    assert max_timestamp(memoryview(records)) == max_timestamp(bytearray(records)) == max_timestamp(records)
    if records:  # cut anywhere: the same refusal as batch_spans
        cut = records[:data.draw(st.integers(0, len(records) - 1))]
        try:
            expected: int | str = max((ts for *_, ts in batch_spans(cut)), default=-1)
        except ValueError as exc:
            expected = str(exc)
        try:
            got: int | str = max_timestamp(cut)
        except ValueError as exc:
            got = str(exc)
        assert got == expected


@given(st.lists(st.integers(1, 5), min_size=1, max_size=5), st.integers(0, 2**40))
def test_rebase_gives_consecutive_offsets_and_keeps_the_crc(counts: list[int], base: int) -> None:
    data = bytearray(b"".join(batch([b"v%d" % i for i in range(n)]) for n in counts))
    rebase(data, base)
    records = MemoryRecords(bytes(data))
    offsets = []
    while (b := records.next_batch()) is not None:
        assert b.validate_crc()  # baseOffset is outside the CRC
        offsets.extend(r.offset for r in b)
    assert offsets == list(range(base, base + sum(counts)))


def loc(base: int, count: int, segment: int = 0, length: int = 100, ts: int = 0) -> Location:
    return Location(base, base + count, segment, base * 1000, length, ts)


def test_locations_stop_at_the_high_watermark_and_keep_kip74() -> None:
    plog = PartitionLog("t", 0)
    for base in (0, 10, 20, 30):
        plog.index(loc(base, 10))
    assert plog.locations(0, 10_000) == []  # nothing durable yet
    plog.advance_high_watermark(30)
    assert [x.base_offset for x in plog.locations(0, 10_000)] == [0, 10, 20]
    assert [x.base_offset for x in plog.locations(15, 10_000)] == [10, 20]  # the batch holding 15
    assert [x.base_offset for x in plog.locations(0, 250)] == [0, 10]
    assert [x.base_offset for x in plog.locations(0, 1)] == [0]  # one whole batch, whatever its size
    assert plog.locations(0, 1, min_one=False) == []
    assert plog.locations(30, 10_000) == []  # at the high watermark: nothing yet


def test_index_refuses_going_back_and_hw_never_lowers() -> None:
    plog = PartitionLog("t", 0)
    plog.index(loc(0, 5))
    with pytest.raises(ValueError):
        plog.index(loc(3, 5))
    assert plog.advance_high_watermark(5) and not plog.advance_high_watermark(4)
    assert plog.high_watermark == 5


def test_dropping_segments_moves_the_first_indexed_offset() -> None:
    plog = PartitionLog("t", 0)
    for i, base in enumerate((0, 10, 20)):
        plog.index(loc(base, 10, segment=i))
    plog.advance_high_watermark(30)
    assert plog.segment_bytes == {0: 100, 1: 100, 2: 100}
    assert plog.drop_segments_before(2) == 2
    assert plog.first_indexed_offset == 20 and plog.segment_bytes == {2: 100}
    assert plog.locations(5, 10_000) == []  # before the WAL: the table's
    assert [x.base_offset for x in plog.locations(25, 10_000)] == [20]


def test_dropping_many_entries_compacts_the_columns() -> None:
    plog = PartitionLog("t", 0)
    for i in range(10_000):
        plog.index(loc(i, 1, segment=i // 100))
    plog.advance_high_watermark(10_000)
    plog.drop_segments_before(90)
    assert len(plog) == 1000 and plog.first_indexed_offset == 9000
    assert [x.base_offset for x in plog.locations(9500, 300)] == [9500, 9501, 9502]


def test_timestamp_lookups() -> None:
    plog = PartitionLog("t", 0)
    plog.index(loc(0, 10, ts=100))
    plog.index(loc(10, 10, ts=50))
    plog.index(loc(20, 10, ts=300))
    plog.advance_high_watermark(20)
    assert plog.first_at_or_after_timestamp(60).base_offset == 0
    assert plog.first_at_or_after_timestamp(101) is None  # the batch at 20 is not durable yet
    assert plog.max_timestamp().base_offset == 0
    plog.advance_high_watermark(30)
    assert plog.first_at_or_after_timestamp(101).base_offset == 20
    assert plog.max_timestamp().base_offset == 20


def test_batches_from_starts_at_the_batch_holding_the_offset_and_keeps_max_bytes_whole_batches():
    records = bytearray(rc.record_batch([b"a", b"b"]) + rc.record_batch([b"c"]) + rc.record_batch([b"d", b"e", b"f"]))
    rebase(records, 10)  # offsets 10-11, 12, 13-15
    sizes = [size for _pos, size, _count, _ts in batch_spans(records)]
    whole = len(records)
    assert bytes(batches_from(records, 10, whole, True)) == bytes(records)
    assert bytes(batches_from(records, 11, whole, True)) == bytes(records)  # 11 is in the first batch
    assert bytes(batches_from(records, 12, whole, True)) == bytes(records[sizes[0]:])
    assert bytes(batches_from(records, 15, whole, True)) == bytes(records[sizes[0] + sizes[1]:])
    assert bytes(batches_from(records, 10, sizes[0] + sizes[1], True)) == bytes(records[:sizes[0] + sizes[1]])
    assert bytes(batches_from(records, 12, 1, True)) == bytes(records[sizes[0]:sizes[0] + sizes[1]])  # KIP-74
    assert bytes(batches_from(records, 12, 1, False)) == b""
    assert bytes(batches_from(records, 16, whole, True)) == b""


def test_the_gaps_of_an_index_are_read_from_the_table() -> None:
    """A new leader indexes only the open transactions it adopted from a dead broker's WAL
    (``pipeline.cluster.service``): the offsets between and after them are in the table. ``gap_end``
    says how far a read from an offset goes in the table, and ``locations`` never steps over a gap."""
    plog = PartitionLog("t", 0, high_watermark=100)
    assert plog.gap_end(0) == 100  # nothing indexed: the table holds everything below the high watermark
    for base in (40, 50, 70):
        plog.index(loc(base, 10))
    assert plog.gap_end(0) == 40 and plog.gap_end(39) == 40
    assert plog.gap_end(40) is None and plog.gap_end(59) is None  # 40-59: two adjacent indexed batches
    assert plog.gap_end(60) == 70 and plog.gap_end(69) == 70
    assert plog.gap_end(75) is None
    assert plog.gap_end(80) == 100  # past the last indexed batch
    assert [x.base_offset for x in plog.locations(40, 10_000)] == [40, 50]  # stops before the gap at 60
    assert [x.base_offset for x in plog.locations(55, 10_000)] == [50]
    assert plog.locations(60, 10_000) == []  # in the gap: the table's
    assert [x.base_offset for x in plog.locations(70, 10_000)] == [70]
