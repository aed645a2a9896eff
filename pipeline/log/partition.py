"""One topic-partition's log on the read side: where its batches are, and what may be read.

Kafka's Partition/UnifiedLog keep, per partition, the log end offset (next
offset to assign), the high watermark (offsets below it are committed and the
only ones served to consumers) and the log start offset, and an offset index
from offsets to positions in segment files. Here the segments are the
write-ahead log's, shared by every partition (one group commit writes many
partitions' batches into one entry), so each partition keeps its own index of
where its batches sit: ``(base offset, end offset, segment, byte position,
byte length, max timestamp)`` per appended batch set, in offset order, in
parallel ``array('q')`` columns (48 bytes per produce request and partition).

Offsets below the first indexed one were written before the retained WAL
(its older segments were deleted by retention once the table held them): they
are read from the table. The high watermark here is durability: it advances
when the appends' acknowledgement point is reached (the WAL fsync, or the
Spark commit with ``pipeline.ack.on=spark``), so a consumer never sees a
record the producer could not have been told is stored.

No I/O and no clock: the caller reads bytes at the locations this returns.
"""

from __future__ import annotations

import bisect
import struct
from array import array
from dataclasses import dataclass

from pipeline import native
from pipeline.fastinit import fast_frozen_init

# RecordBatch v2 header up to maxTimestamp (Kafka DefaultRecordBatch):
# baseOffset int64, batchLength int32, partitionLeaderEpoch int32, magic int8,
# crc uint32, attributes int16, lastOffsetDelta int32, baseTimestamp int64,
# maxTimestamp int64. The CRC covers attributes onwards, so baseOffset and
# partitionLeaderEpoch can be set without recomputing it (Kafka does the same
# when it assigns offsets, LogValidator).
BATCH_HEADER = struct.Struct(">qiibIhiqq")
_LENGTH_OFFSET = 8
_LOG_OVERHEAD = 12  # baseOffset + batchLength
_BASE_OFFSET = struct.Struct(">q")

INDEX_ENTRY_BYTES = 48
"""Index memory per indexed append: six int64 columns (``PartitionLog``)."""

DEFAULT_INDEX_MAX_BYTES = 64 * 1024 * 1024
"""Default bound on the WAL index (``pipeline.wal.index.max.bytes``; ``pipeline.log.manager.LogManager``):
about 1.4 million appends."""


def batch_spans(records: bytes | bytearray | memoryview) -> list[tuple[int, int, int, int]]:
    """``(position, size in bytes, record count, max timestamp ms)`` of each RecordBatch in ``records``.

    ``records`` is a produce request's validated records field (one or more
    concatenated RecordBatch v2), so the headers are trusted.

    Raises:
        ValueError: a header runs past the end (the bytes were not validated).
    """
    spans = []
    pos, end = 0, len(records)
    while pos < end:
        if pos + BATCH_HEADER.size > end:
            raise ValueError(f"truncated RecordBatch header at byte {pos}")
        (_base, length, _epoch, _magic, _crc, _attrs, last_delta, _first_ts,
         max_ts) = BATCH_HEADER.unpack_from(records, pos)
        size = _LOG_OVERHEAD + length
        if length <= 0 or pos + size > end:
            raise ValueError(f"RecordBatch at byte {pos} of length {length} runs past the end ({end} bytes)")
        spans.append((pos, size, last_delta + 1, max_ts))
        pos += size
    return spans


def max_timestamp(records: bytes | bytearray | memoryview) -> int:
    """The largest batch max timestamp (ms) of ``records`` (validated RecordBatch v2), -1 if none.

    ``max(ts for *_, ts in batch_spans(records))`` without building the spans, in C
    (``pipeline._records.max_timestamp``: the WAL stage asks it for every append).

    Raises:
        ValueError: a header runs past the end (the bytes were not validated).
    """
    return native.max_timestamp(records)


def rebase(records: bytearray, base_offset: int) -> None:
    """Give the batches in ``records`` consecutive offsets from ``base_offset``, in place.

    Producers send batches with baseOffset 0; the broker assigns the real one
    when it appends (Kafka LogValidator.assignOffsetsNonCompressed), here when
    it serves a fetch: the stored bytes stay what the producer sent.
    """
    offset = base_offset
    for pos, _size, count, _ts in batch_spans(records):
        _BASE_OFFSET.pack_into(records, pos, offset)
        offset += count


def batches_from(records: bytearray, offset: int, max_bytes: int, min_one: bool) -> memoryview:
    """The batches of rebased ``records`` a fetch from ``offset`` returns: from the one holding
    ``offset`` (or the first after it), while their total stays within ``max_bytes`` bytes;
    with ``min_one`` that first batch whatever its size (KIP-74). Kafka serves a fetch whole
    batches from the batch holding the fetch offset (``LogSegment.read``); a batch set of the
    WAL may hold several requests' batches (``pipeline.requests.handler`` merges a produce
    run's), so its batches before ``offset`` are not sent again.
    """
    start = stop = 0
    pos, end = 0, len(records)
    unpack = BATCH_HEADER.unpack_from
    while pos < end:
        base, length, _epoch, _magic, _crc, _attrs, last_delta, _first_ts, _max_ts = unpack(records, pos)
        size = _LOG_OVERHEAD + length
        if base + last_delta < offset:
            start = stop = pos + size
        elif stop - start + size <= max_bytes or (min_one and stop == start):
            stop = pos + size
        else:
            break
        pos += size
    return memoryview(records)[start:stop]


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class Location:
    """Where one appended batch set of a partition is in the write-ahead log.

    Attributes:
        base_offset: offset of its first record; ``end_offset`` one past its last.
        segment: WAL segment index; ``position``: byte offset of the batches in
            that segment file; ``length``: their size in bytes.
        max_timestamp: largest record timestamp (ms) of the batches.
    """

    base_offset: int
    end_offset: int
    segment: int
    position: int
    length: int
    max_timestamp: int


class PartitionLog:
    """Index and watermarks of one topic-partition (see the module docstring).

    Attributes:
        high_watermark: offsets below it are durable and may be served.
        log_start_offset: the first offset of the partition (0: the table keeps
            everything the WAL dropped; table retention leaves gaps that reads skip).
    """

    __slots__ = ("topic", "partition", "high_watermark", "log_start_offset", "_first",
                 "_bases", "_ends", "_segments", "_positions", "_lengths", "_max_ts", "_segment_bytes",
                 "ongoing", "aborted")

    def __init__(self, topic: str, partition: int, high_watermark: int = 0) -> None:
        self.topic = topic
        self.partition = partition
        self.high_watermark = high_watermark
        self.log_start_offset = 0
        self._first = 0  # index of the first live entry in the columns
        self._bases = array("q")
        self._ends = array("q")
        self._segments = array("q")
        self._positions = array("q")
        self._lengths = array("q")
        self._max_ts = array("q")
        self._segment_bytes: dict[int, int] = {}  # segment -> bytes of this partition in it
        self.ongoing: dict[int, int] = {}
        """Open transactions with records here: producer id -> offset of its first record (Kafka
        ProducerStateManager.ongoingTxns)."""
        self.aborted: list[tuple[int, int, int]] = []
        """Aborted transactions of the indexed log, by marker offset: (producer id, first offset,
        offset of the ABORT marker) (Kafka's transaction index)."""

    def __len__(self) -> int:
        """Indexed batch sets."""
        return len(self._bases) - self._first

    def index(self, location: Location) -> None:
        """Add the location of an append (offsets increase from one call to the next).

        Raises:
            ValueError: ``location`` starts before the end of the last one.
        """
        if len(self) and location.base_offset < self._ends[-1]:
            raise ValueError(f"{self.topic}-{self.partition}: append at offset {location.base_offset} "
                             f"before the indexed end {self._ends[-1]}")
        self._bases.append(location.base_offset)
        self._ends.append(location.end_offset)
        self._segments.append(location.segment)
        self._positions.append(location.position)
        self._lengths.append(location.length)
        self._max_ts.append(location.max_timestamp)
        self._segment_bytes[location.segment] = self._segment_bytes.get(location.segment, 0) + location.length

    def transaction_started(self, producer_id: int, offset: int) -> None:
        """A transactional batch of ``producer_id`` at ``offset`` was indexed (the first one opens it)."""
        self.ongoing.setdefault(producer_id, offset)

    def transaction_ended(self, producer_id: int, marker_offset: int, aborted: bool) -> None:
        """The marker of ``producer_id``'s transaction is at ``marker_offset``; an abort is listed."""
        first = self.ongoing.pop(producer_id, None)
        if aborted and first is not None:
            self.aborted.append((producer_id, first, marker_offset))

    @property
    def last_stable_offset(self) -> int:
        """Offsets below it are durable and in no open transaction (Kafka's LSO, KIP-98): the
        high watermark, or the first offset of the oldest open transaction if lower."""
        if not self.ongoing:
            return self.high_watermark
        return min(self.high_watermark, min(self.ongoing.values()))

    def aborted_transactions(self, offset: int, upper: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions overlapping [offset, upper)
        (Kafka UnifiedLog.collectAbortedTransactions, for a read-committed fetch)."""
        return [(pid, first) for pid, first, last in self.aborted if last >= offset and first < upper]

    def advance_high_watermark(self, end_offset: int) -> bool:
        """Raise the high watermark to ``end_offset`` (never lowers it); True if it moved."""
        if end_offset > self.high_watermark:
            self.high_watermark = end_offset
            return True
        return False

    @property
    def first_indexed_offset(self) -> int | None:
        """The first offset readable from the WAL, None if nothing is indexed."""
        return self._bases[self._first] if len(self) else None

    @property
    def segment_bytes(self) -> dict[int, int]:
        """WAL segment -> bytes of this partition's batches in it."""
        return self._segment_bytes

    def locations(self, offset: int, max_bytes: int, min_one: bool = True, end: int | None = None) -> list[Location]:
        """Indexed batch sets to serve a fetch from ``offset``, all below the high watermark.

        The first holds ``offset``; following ones are added while the total
        stays within ``max_bytes``. With ``min_one`` the first is returned
        whatever its size, so a consumer always makes progress (KIP-74). Empty when ``offset`` is
        not indexed (before the first indexed offset: read the table; at or
        past the high watermark: nothing to read yet). ``end`` lowers the bound
        (the last stable offset of a read-committed fetch).
        """
        hw = self.high_watermark if end is None else min(end, self.high_watermark)
        first = self.first_indexed_offset
        if first is None or offset < first or offset >= hw:
            return []
        ends = self._ends
        i = bisect.bisect_right(ends, offset, self._first)
        if i < len(ends) and self._bases[i] > offset:
            return []  # in a gap of the index: read the table (``gap_end``)
        out: list[Location] = []
        total = 0
        while i < len(ends) and ends[i] <= hw:
            length = self._lengths[i]
            if (out or not min_one) and total + length > max_bytes:
                break
            if out and self._bases[i] != out[-1].end_offset:
                break  # the offsets between are only in the table
            out.append(Location(self._bases[i], ends[i], self._segments[i], self._positions[i], length,
                                self._max_ts[i]))
            total += length
            i += 1
        return out

    def gap_end(self, offset: int) -> int | None:
        """None when an indexed batch holds ``offset`` (read it from the WAL); else the end of the
        offsets from ``offset`` that only the table holds: the next indexed batch's base offset, or the
        high watermark past the last one. Below the first indexed offset that is the first indexed
        offset; the index has gaps above it only where a new leader adopted a dead broker's open
        transactions (``pipeline.cluster.service``), whose neighbours are in the table."""
        if not len(self):
            return self.high_watermark
        ends = self._ends
        i = bisect.bisect_right(ends, offset, self._first)
        if i == len(ends):
            return self.high_watermark
        return self._bases[i] if self._bases[i] > offset else None

    def first_at_or_after_timestamp(self, timestamp_ms: int) -> Location | None:
        """The first durable indexed batch set whose max timestamp is >= ``timestamp_ms`` (ListOffsets)."""
        for i in range(self._first, len(self._bases)):
            if self._ends[i] > self.high_watermark:
                return None
            if self._max_ts[i] >= timestamp_ms:
                return Location(self._bases[i], self._ends[i], self._segments[i], self._positions[i],
                                self._lengths[i], self._max_ts[i])
        return None

    def max_timestamp(self) -> Location | None:
        """The durable indexed batch set holding the largest timestamp (ListOffsets -3, KIP-734)."""
        best = None
        for i in range(self._first, len(self._bases)):
            if self._ends[i] > self.high_watermark:
                break
            if best is None or self._max_ts[i] > self._max_ts[best]:
                best = i
        if best is None:
            return None
        return Location(self._bases[best], self._ends[best], self._segments[best], self._positions[best],
                        self._lengths[best], self._max_ts[best])

    def drop_segments_before(self, segment: int) -> int:
        """Forget batch sets in segments before ``segment`` (deleted by retention); returns how many."""
        segments = self._segments
        i = self._first
        while i < len(segments) and segments[i] < segment:
            i += 1
        dropped = i - self._first
        self._first = i
        for s in [s for s in self._segment_bytes if s < segment]:
            del self._segment_bytes[s]
        first_left = self._bases[i] if i < len(segments) else self.high_watermark
        # The table holds no aborted record: fetches below the WAL need no list.
        self.aborted = [t for t in self.aborted if t[2] >= first_left]
        if self._first > 4096 and self._first * 2 > len(segments):
            for column in (self._bases, self._ends, self._segments, self._positions, self._lengths, self._max_ts):
                del column[:self._first]
            self._first = 0
        return dropped
