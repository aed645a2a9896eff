"""The owner of every partition's log: offsets, producer state, high watermarks, reads, retention.

Kafka's LogManager/ReplicaManager own each partition's UnifiedLog: offset
assignment, the high watermark, the log start offset, idempotent producer
state, reads and retention. Here:

* **Writes**: request handlers sequence against ``state`` (``LogState``:
  log end offsets and producer state) and hand appends to the persister,
  which writes them to the write-ahead log, then the table.
* **Where records are**: the persister tells the manager where each append
  landed in the WAL (``wal_appended``) and when it became durable
  (``durable``: the high watermark advances and waiting fetches wake).
  Recovery feeds the retained WAL through ``index_wal_entry`` at start.
* **Reads**: ``read`` serves offsets from the WAL while its segments are kept,
  older ones from the table (``pipeline.table.reader.TableReader``), as
  RecordBatch v2 with their original offsets. Only offsets below the high
  watermark are served.
* **Retention**: a WAL segment is deleted once the table holds it
  (checkpointed) and, for every partition with batches in it, its last
  append is older than the topic's ``retention.ms`` or the partition's bytes
  in newer segments reach ``retention.bytes`` (Kafka's per-partition rules,
  applied to segments shared by all partitions), or sooner when the index
  would outgrow ``index_max_bytes`` (memory stays bounded whatever the
  request rate). Deleted offsets are then read from the table.

Everything runs in the trio thread; file and Spark reads go to worker threads.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, Sequence

import trio

from pipeline.log.control import ABORT, CONTROL, TRANSACTIONAL, batch_kind, build_empty_batch, marker_type
from pipeline.log.partition import (INDEX_ENTRY_BYTES, Location, PartitionLog, batches_from, max_timestamp,
                                    rebase)
from pipeline.log.state import LogState
from pipeline.log.batch import PartitionAppend
from pipeline.log.wal import WalPosition, WriteAheadLog, decode_appends

log = logging.getLogger(__name__)

RETENTION_CHECK_INTERVAL_S = 60.0
"""How often retention is applied when no table commit does it (Kafka log.retention.check.interval.ms: 5 min)."""

EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP = -2, -1, -3
"""ListOffsets special timestamps (Kafka ListOffsetsRequest; -3 is KIP-734)."""


class TableRecords(Protocol):
    """What a table read returns (``pipeline.table.reader.TableSlice``)."""

    @property
    def records(self) -> bytes:
        """Zero or more concatenated RecordBatch v2, offsets ascending."""

    @property
    def next_offset(self) -> int:
        """The offset after the last record read; with no records, the read's ``end`` when the table
        holds no offset in [offset, end), else the offset asked for (its record did not fit)."""


class TableSource(Protocol):
    """The table side of reads (``pipeline.table.reader.TableReader``); blocking, thread-safe."""

    def read(self, topic: str, partition: int, offset: int, max_bytes: int, *, end: int,
             min_one: bool = True) -> TableRecords:
        """Records of offsets in [offset, end) as RecordBatch v2 bytes (``.records``), at most
        ``max_bytes`` but with ``min_one`` at least one record (KIP-74)."""

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int,
                             end: int | None = None) -> tuple[int, int] | None:
        """(offset, timestamp ms) of the earliest record below ``end`` with timestamp >= ``timestamp_ms``."""

    def invalidate(self, topic: str | None = None, partition: int | None = None) -> None:
        """Forget what is cached of ``topic`` (or one partition of it; None: everything)."""

    def max_timestamp(self, topic: str, partition: int, end: int | None = None) -> tuple[int, int] | None:
        """(offset, timestamp ms) of the record below ``end`` with the largest timestamp."""


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What a fetch of one partition gets.

    Attributes:
        records: RecordBatch v2 bytes (may start before the fetch offset:
            whole batches are served, as Kafka does); empty if nothing to read.
        high_watermark: the partition's high watermark at the read.
        log_start_offset: the partition's first offset.
        source: "wal", "table" or "" (nothing read).
        last_stable_offset: the partition's last stable offset at the read (-1: not asked).
        aborted: (producer id, first offset) of aborted transactions in the records read
            (read-committed reads only; None otherwise).
    """

    records: bytes
    high_watermark: int
    log_start_offset: int
    source: str = ""
    last_stable_offset: int = -1
    aborted: list[tuple[int, int]] | None = None


@dataclass(slots=True)
class ReadStats:
    """Counters since start: fetch reads served from the WAL and from the table (reads, bytes),
    and bytes served per topic (Kafka BytesOutPerSec)."""

    wal_reads: int = 0
    wal_bytes: int = 0
    table_reads: int = 0
    table_bytes: int = 0
    bytes_out: dict[str, int] = field(default_factory=dict)


class OffsetOutOfRange(Exception):
    """The fetch offset is past the log end or before the log start (Kafka OFFSET_OUT_OF_RANGE)."""


class LogManager:
    """See the module docstring.

    Args:
        state: the live log end offsets and producer state (recovered).
        wal: the opened write-ahead log to read from (None: reads serve the table only).
        table: the table side of reads (None: offsets the WAL no longer has are not served).
        retention: topic -> (retention.ms, retention.bytes); -1 means no limit.
            Default: (-1, -1), keep the WAL until told otherwise.
        index_max_bytes: bound on the WAL index (``INDEX_ENTRY_BYTES`` per
            indexed append): above it the oldest segments the table holds are
            let go whatever the retention, so memory stays bounded (their
            offsets are then read from the table). None: no bound.
    """

    def __init__(self, state: LogState | None = None, wal: WriteAheadLog | None = None,
                 table: TableSource | None = None,
                 retention: Callable[[str], tuple[int, int]] | None = None,
                 index_max_bytes: int | None = None, table_pending: bool = False) -> None:
        self.state = state or LogState()
        self.index_max_bytes = index_max_bytes
        self._segment_entries: dict[int, int] = {}  # segment -> indexed appends in it
        self.wal = wal
        self.table = table
        self.table_pending = table_pending
        """The table side is starting (the server listens before Spark is up, ``attach_table`` comes):
        a read of offsets only the table holds answers nothing yet instead of going on at the WAL."""
        self.retention = retention or (lambda topic: (-1, -1))
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._taken_over_at: dict[tuple[str, int], int] = {}  # reset_partition's end offsets
        self._segment_last_append_ms: dict[int, int] = {}
        self._segment_partitions: dict[int, set[tuple[str, int]]] = {}
        self._waiters: dict[tuple[str, int], set[trio.Event]] = {}
        self._checkpointed: WalPosition | None = None
        self._retention_running = False
        self._read_limiter = trio.CapacityLimiter(4)
        self.closing = False
        self.stats = ReadStats()

    # -- the partitions ----------------------------------------------------

    def start(self, state: LogState, end_offsets: dict[tuple[str, int], int]) -> None:
        """After recovery: ``state`` (the recovered offsets and producer state) is the logs' own, and
        every recovered record is durable, so each high watermark is its end offset."""
        self.state = state
        for (topic, partition), end in end_offsets.items():
            self.log(topic, partition).advance_high_watermark(end)

    def abandon_table(self) -> None:
        """No table will be attached (the table side failed to start): offsets only it would hold are
        not served, and a fetch below the WAL goes on at its first offset."""
        self.table_pending = False

    def attach_table(self, table: TableSource) -> None:
        """Read the offsets the WAL no longer has from ``table`` from now on (the table side is up)."""
        self.table = table
        self.table_pending = False

    def log(self, topic: str, partition: int) -> PartitionLog:
        """The partition's log, created empty (high watermark 0) on first use."""
        key = (topic, partition)
        plog = self._logs.get(key)
        if plog is None:
            plog = self._logs[key] = PartitionLog(topic, partition)
        return plog

    def log_end_offset(self, topic: str, partition: int) -> int:
        return self.state.offsets.log_end_offset(topic, partition)

    def drop_topic(self, topic: str) -> None:
        """Forget a deleted topic: offsets, producer state, index; its waiting fetches wake."""
        for key in [k for k in self._logs if k[0] == topic]:
            del self._logs[key]
            self._taken_over_at.pop(key, None)
            for event in self._waiters.pop(key, ()):
                event.set()
        for members in self._segment_partitions.values():
            members.difference_update({k for k in members if k[0] == topic})
        self.state.forget_topic(topic)

    def reset_partition(self, topic: str, partition: int, end_offset: int,
                        batches: Iterable[tuple[int, int, int, int, int]] = ()) -> None:
        """This broker leads ``topic``-``partition`` after another one did (``pipeline.cluster.service``): its log
        continues at ``end_offset`` (the table's end: every offset below it is read from the table), its
        idempotent producers' state is ``batches`` ((producer id, epoch, first seq, last seq, base offset),
        oldest first); what this broker knew of it before is forgotten and its waiting fetches wake."""
        key = (topic, partition)
        self._logs[key] = PartitionLog(topic, partition, end_offset)
        self._taken_over_at[key] = end_offset
        for event in self._waiters.pop(key, ()):
            event.set()
        self.state.offsets.restore(topic, partition, end_offset)
        producers = self.state.producers
        producers.forget_partition(topic, partition)
        for pid, epoch, first_seq, last_seq, base_offset in batches:
            producers.update(pid, epoch, topic, partition, first_seq, last_seq, base_offset)

    def taken_over_at(self, topic: str, partition: int) -> int | None:
        """The log end offset at which this broker took ``topic``-``partition`` over from another leader
        (``reset_partition``): what its producers' state holds of batches below it came with the
        take-over, not from appends here. None: never taken over here."""
        return self._taken_over_at.get((topic, partition))

    # -- told by recovery and the persister (LogListener) -------------------

    def index_wal_entry(self, position: WalPosition, start: int, payload: memoryview) -> None:
        """Index one retained WAL entry at start-up (``WriteAheadLog.open``'s ``visit``)."""
        positions: list[int] = []
        appends = decode_appends(payload, positions)
        self._index(appends, position.segment, [start + p for p in positions],
                    max((a.log_append_time_ms for a in appends), default=0))

    def wal_appended(self, appends: Sequence[PartitionAppend], segment: int, positions: Sequence[int],
                     now_ms: int) -> None:
        self._index(appends, segment, positions, now_ms)

    def _index(self, appends: Sequence[PartitionAppend], segment: int, positions: Sequence[int],
               append_ms: int) -> None:
        members = self._segment_partitions.setdefault(segment, set())
        self._segment_entries[segment] = self._segment_entries.get(segment, 0) + len(appends)
        self._segment_last_append_ms[segment] = max(self._segment_last_append_ms.get(segment, 0), append_ms)
        logs = self._logs
        for a, pos in zip(appends, positions):
            key = (a.topic, a.partition)
            plog = logs.get(key)
            if plog is None:
                plog = self.log(a.topic, a.partition)
            location = Location(a.base_offset, a.base_offset + a.record_count, segment, pos, len(a.records),
                                max_timestamp(a.records))
            kind = batch_kind(a.records)
            try:
                plog.index(location)
            except ValueError:
                # The topic was deleted and re-created: its new offsets start
                # again, and the old topic's batches are no longer its log.
                log.warning("%s-%d: offsets restart at %d in WAL segment %d; earlier batches are "
                            "not served from the WAL", a.topic, a.partition, a.base_offset, segment)
                hw = plog.high_watermark if plog.high_watermark <= a.base_offset else 0
                plog = self._logs[key] = PartitionLog(a.topic, a.partition, hw)
                plog.index(location)
            if kind == TRANSACTIONAL:
                plog.transaction_started(a.producer_id, a.base_offset)
            elif kind == CONTROL:
                plog.transaction_ended(a.producer_id, a.base_offset, marker_type(a.records) == ABORT)
            members.add(key)

    def durable(self, appends: Sequence[PartitionAppend]) -> None:
        for a in appends:
            key = (a.topic, a.partition)
            if self.log(a.topic, a.partition).advance_high_watermark(a.base_offset + a.record_count):
                for event in self._waiters.pop(key, ()):
                    event.set()

    def wal_cut(self, checkpointed: WalPosition, now_ms: int) -> WalPosition | None:
        self._checkpointed = checkpointed
        return self._retention_cut(checkpointed, now_ms)

    def wal_truncated(self, segments: Sequence[int]) -> None:
        if not segments:
            return
        oldest = min(segments)
        gone = [s for s in self._segment_partitions if s < oldest]
        if not gone:
            return
        for s in gone:
            for key in self._segment_partitions.pop(s):
                plog = self._logs.get(key)
                if plog is not None:
                    plog.drop_segments_before(oldest)
            self._segment_last_append_ms.pop(s, None)
            self._segment_entries.pop(s, None)
        log.info("log retention: %d WAL segment(s) deleted; their offsets are now read from the table", len(gone))

    def _retention_cut(self, checkpointed: WalPosition, now_ms: int) -> WalPosition | None:
        """The position to truncate the WAL before (segments the table holds and retention lets go)."""
        candidates = sorted(s for s in self._segment_partitions if s < checkpointed.segment)
        if not candidates:
            return None
        remaining: dict[tuple[str, int], int] = {}
        cut = None
        index_bytes = self.index_bytes
        for segment in candidates:
            over_budget = self.index_max_bytes is not None and index_bytes > self.index_max_bytes
            index_bytes -= self._segment_entries.get(segment, 0) * INDEX_ENTRY_BYTES
            if over_budget:
                cut = WalPosition(segment + 1, 0)
                continue
            last_ms = self._segment_last_append_ms.get(segment, 0)
            for key in self._segment_partitions[segment]:
                plog = self._logs.get(key)
                if plog is None:
                    continue
                retention_ms, retention_bytes = self.retention(key[0])
                if key not in remaining:
                    remaining[key] = sum(plog.segment_bytes.values())
                remaining[key] -= plog.segment_bytes.get(segment, 0)
                by_time = retention_ms >= 0 and now_ms - last_ms > retention_ms
                by_size = retention_bytes >= 0 and remaining[key] >= retention_bytes
                if not (by_time or by_size):
                    return cut
            cut = WalPosition(segment + 1, 0)
        return cut

    @property
    def index_bytes(self) -> int:
        """Memory the WAL index takes (``INDEX_ENTRY_BYTES`` per indexed append)."""
        return sum(self._segment_entries.values()) * INDEX_ENTRY_BYTES

    async def run(self, wall_clock_ms: Callable[[], int], *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Apply retention every RETENTION_CHECK_INTERVAL_S when idle, at ``wall_clock_ms()`` (the
        wall clock in ms, which retention.ms is measured against); runs until cancelled."""
        task_status.started()
        while True:
            await trio.sleep(RETENTION_CHECK_INTERVAL_S)
            await self.apply_retention(wall_clock_ms())

    async def apply_retention(self, now_ms: int) -> None:
        """Truncate the WAL as far as retention (at wall-clock time ``now_ms``) and the last checkpoint allow."""
        if self.wal is None or self._checkpointed is None:
            return
        cut = self._retention_cut(self._checkpointed, now_ms)
        if cut is None:
            return
        wal = self.wal

        def truncate() -> list[int]:
            wal.truncate_before(cut)
            return wal.segments

        try:
            remaining = await trio.to_thread.run_sync(truncate)
        except Exception as exc:  # the next check retries
            log.warning("log retention: truncating the WAL failed: %s", exc)
            return
        self.wal_truncated(remaining)

    def close(self) -> None:
        """Server shutdown: fetches waiting for data are answered at once with what there is."""
        self.closing = True
        waiters, self._waiters = self._waiters, {}
        for events in waiters.values():
            for event in events:
                event.set()

    # -- reads ----------------------------------------------------------------

    def watch(self, keys: Iterable[tuple[str, int]], event: trio.Event) -> None:
        """Set ``event`` when any of these partitions' high watermark moves (a long-polling fetch),
        or the topic is deleted, or the server stops (then at once)."""
        if self.closing:
            event.set()
            return
        for key in keys:
            self._waiters.setdefault(key, set()).add(event)

    def wake(self, keys: Iterable[tuple[str, int]]) -> None:
        """Wake the fetches waiting on these partitions (this broker serves them now: a fetch that
        waited for their take-over reads them)."""
        for key in keys:
            for event in self._waiters.pop(key, ()):
                event.set()

    def unwatch(self, keys: Iterable[tuple[str, int]], event: trio.Event) -> None:
        for key in keys:
            events = self._waiters.get(key)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[key]

    def available_bytes(self, topic: str, partition: int, offset: int, limit: int,
                        read_committed: bool = False) -> int:
        """Bytes a fetch from ``offset`` would get now, counted up to ``limit`` (``fetch.min.bytes``
        checks; the work is bounded by ``limit``, not by how far behind the consumer is); no I/O.
        Offsets only the table holds count as ``limit``: they are there to read. ``read_committed``:
        only below the last stable offset."""
        plog = self._logs.get((topic, partition))
        if plog is None or limit <= 0:
            return 0
        end = plog.last_stable_offset if read_committed else plog.high_watermark
        if offset >= end:
            return 0
        if plog.gap_end(offset) is not None:
            return limit
        return sum(loc.length for loc in plog.locations(offset, limit, min_one=True, end=end))

    async def read(self, topic: str, partition: int, offset: int, max_bytes: int,
                   min_one: bool = True, read_committed: bool = False) -> ReadResult:
        """Records of the partition from ``offset``, at most ``max_bytes``; with ``min_one`` at
        least one batch whatever its size (KIP-74: the first partition of a fetch with data).

        ``read_committed`` (Fetch ``isolation_level`` 1, KIP-98): only offsets below the last
        stable offset, with the aborted transactions among them listed. Records of aborted
        transactions are served either way, as Kafka serves them; the consumer drops them.
        The table holds committed records only, so what it serves needs no list.

        Raises:
            OffsetOutOfRange: ``offset`` < 0 or past the log end offset.
        """
        plog = self.log(topic, partition)
        hw = plog.high_watermark
        lso = plog.last_stable_offset
        if offset < plog.log_start_offset or offset > max(self.log_end_offset(topic, partition), hw):
            raise OffsetOutOfRange(f"{topic}-{partition}: offset {offset} is outside "
                                   f"[{plog.log_start_offset}, {self.log_end_offset(topic, partition)}]")
        end = lso if read_committed else hw
        nothing = ReadResult(b"", hw, plog.log_start_offset, "", lso, [] if read_committed else None)
        if offset >= end:
            return nothing
        async with self._read_limiter:
            first = plog.gap_end(offset)  # None: the WAL holds ``offset``
            if first is not None:
                indexed = first < hw
                table_end = min(first, end)
                records, next_offset = await self._read_table(topic, partition, offset, max_bytes, table_end,
                                                              min_one)
                if not records and not indexed and offset < table_end <= next_offset and self.table is not None:
                    # No row in [offset, table_end), and the WAL holds none of it: transaction markers
                    # or aborted records of a moved partition (never rows). An empty batch moves the
                    # consumer past them, as after Kafka's log cleaner emptied a batch.
                    return ReadResult(build_empty_batch(offset, table_end - offset), hw, plog.log_start_offset,
                                      "table", lso, nothing.aborted)
                if records or not indexed or next_offset < table_end:  # read, or held but not fitting
                    return self._counted(topic, ReadResult(records, hw, plog.log_start_offset,
                                                           "table" if records else "", lso, nothing.aborted))
                # The table holds no offset in [offset, first) (table retention dropped them): go on
                # from the WAL, as a fetch in a gap of a compacted log gets the next record there is.
                log.info("%s-%d: a fetch at %d goes on at the WAL's offset %d: the table holds none below it",
                         topic, partition, offset, first)
                offset = first
            locations = plog.locations(offset, max_bytes, min_one, end=end)
            if not locations:
                return nothing
            try:
                records = await trio.to_thread.run_sync(self._read_wal, locations, offset, max_bytes, min_one)
            except FileNotFoundError:  # retention deleted the segment meanwhile
                records, _ = await self._read_table(topic, partition, offset, max_bytes, end, min_one)
                return self._counted(topic, ReadResult(records, hw, plog.log_start_offset,
                                                       "table" if records else "", lso, nothing.aborted))
            aborted = (plog.aborted_transactions(locations[0].base_offset, locations[-1].end_offset)
                       if read_committed else None)
            return self._counted(topic, ReadResult(records, hw, plog.log_start_offset, "wal", lso, aborted))

    @property
    def waiting_fetches(self) -> int:
        """Fetches waiting for appends now (Kafka's fetch purgatory size)."""
        return len({id(e) for events in self._waiters.values() for e in events})

    def _counted(self, topic: str, result: ReadResult) -> ReadResult:
        stats = self.stats
        if result.records:
            stats.bytes_out[topic] = stats.bytes_out.get(topic, 0) + len(result.records)
        if result.source == "wal":
            stats.wal_reads += 1
            stats.wal_bytes += len(result.records)
        elif result.source == "table":
            stats.table_reads += 1
            stats.table_bytes += len(result.records)
        return result

    def _read_wal(self, locations: list[Location], offset: int, max_bytes: int, min_one: bool) -> bytes:
        """The batches of ``locations`` a fetch from ``offset`` returns (``batches_from``), rebased."""
        assert self.wal is not None
        parts: list[bytearray | memoryview] = []
        for loc in locations:
            data = bytearray(self.wal.read(loc.segment, loc.position, loc.length))
            rebase(data, loc.base_offset)
            parts.append(data)
        first = locations[0]
        if first.base_offset < offset or first.length > max_bytes:
            parts[0] = batches_from(parts[0], offset, max_bytes, min_one)  # type: ignore[arg-type]
        return b"".join(parts)

    async def _read_table(self, topic: str, partition: int, offset: int, max_bytes: int, end: int,
                          min_one: bool) -> tuple[bytes, int]:
        """(records, next offset) of a table read of [offset, end) (``TableSource.read``); without a
        table, (b"", end): the offsets the WAL no longer has are not served; while the table side
        starts (``table_pending``), (b"", offset): nothing yet, and no offset is skipped (the consumer
        asks again; a partition taken over before Spark is up has its older offsets in the table)."""
        if offset >= end:
            return b"", end
        if self.table is None:
            return b"", offset if self.table_pending else end
        result = await trio.to_thread.run_sync(functools.partial(
            self.table.read, topic, partition, offset, max(0, max_bytes), end=end, min_one=min_one))
        return bytes(result.records), result.next_offset

    async def offset_for(self, topic: str, partition: int, timestamp_ms: int,
                         read_committed: bool = False) -> tuple[int, int]:
        """Kafka ListOffsets for one partition: (offset, timestamp ms), (-1, -1) when none.

        -2 (earliest): the log start offset; -1 (latest): the high watermark
        (the next offset a consumer will get), the last stable offset when
        ``read_committed`` (isolation level 1, KIP-98); -3 (KIP-734): the record with
        the largest timestamp; otherwise the earliest offset whose timestamp
        is >= ``timestamp_ms`` (Kafka UnifiedLog.fetchOffsetByTimestamp).
        """
        plog = self.log(topic, partition)
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return plog.log_start_offset, -1
        if timestamp_ms == LATEST_TIMESTAMP:
            return (plog.last_stable_offset if read_committed else plog.high_watermark), -1
        first = plog.first_indexed_offset
        # the table, when it holds records older than the log's first indexed one
        older = self.table if (first is None or first > plog.log_start_offset) and plog.high_watermark > 0 \
            else None
        if timestamp_ms == MAX_TIMESTAMP:
            best: tuple[int, int] | None = None
            if older is not None:
                best = await trio.to_thread.run_sync(older.max_timestamp, topic, partition, first)
            loc = plog.max_timestamp()
            if loc is not None and (best is None or loc.max_timestamp > best[1]):
                max_ts = loc.max_timestamp
                found = await self._find_in_batch(loc, lambda ts: ts == max_ts)
                if found is not None:
                    best = found
            return best if best is not None else (-1, -1)
        if older is not None:
            found = await trio.to_thread.run_sync(older.offset_for_timestamp, topic, partition,
                                                  timestamp_ms, first if first is not None else plog.high_watermark)
            if found is not None:
                return found
        loc = plog.first_at_or_after_timestamp(timestamp_ms)
        if loc is not None:
            found = await self._find_in_batch(loc, lambda ts: ts >= timestamp_ms)
            if found is not None:
                return found
        return -1, -1

    async def _find_in_batch(self, loc: Location, match: Callable[[int], bool]) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record of the batch set at ``loc`` whose timestamp matches."""
        try:
            data = await trio.to_thread.run_sync(self._read_wal, [loc], loc.base_offset, loc.length, True)
        except FileNotFoundError:
            return None
        from kafka.record import MemoryRecords

        records = MemoryRecords(data)
        while True:
            batch = records.next_batch()
            if batch is None:
                return None
            for record in batch:
                if match(record.timestamp):
                    return record.offset, record.timestamp
