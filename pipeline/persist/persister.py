"""The persister: write-ahead log group commit, then batched Spark flushes.

Two stages, each a trio task that runs its blocking I/O in a worker thread,
one call at a time, so each stage's next group fills while the current one is
written (pipelined group commit):

1. **WAL stage.** Appends of many requests are grouped (``wal_policy``) and
   written as one entry to the write-ahead log, then fsynced. With
   ``ack_on="wal"`` (default) the requests' ``Commit`` handles resolve here:
   the produce is acknowledged once its records survive a crash.
2. **Spark stage.** Groups that reached the WAL are regrouped into large
   flushes (``spark_policy``: batch-max-records/bytes, linger-ms) and written
   with ONE Spark append each. With ``ack_on="spark"`` the Commits resolve
   here. After each commit the persister saves a checkpoint (end offsets per
   partition, committed producer state, the WAL position covered) and
   truncates the WAL before that position.

Completions are released strictly in group order. A failed Spark write is
retried with capped exponential backoff for as long as it takes (the records
are in the WAL, so nothing is dropped); before a retry the table is asked
which offsets of the group already landed, and those rows are not written
again, so a retried flush never duplicates rows. Requests that cannot wait
that long are answered by the handler's timeout (REQUEST_TIMED_OUT), never
with success. A WAL write failure is treated as Kafka treats a failed log
directory: every later produce gets KAFKA_STORAGE_ERROR.

**Transactions** (KIP-98). Records of a transaction are written to the WAL
like any others (the producer is acknowledged there, with either ``ack_on``)
but held out of the table until the transaction's marker reaches the WAL: a
COMMIT marker releases them into the next flush, an ABORT drops them; the
markers themselves are never rows. So the table holds committed records
only, each once. A checkpoint never passes the WAL entry holding the first
record of a transaction still open, so after a crash recovery finds those
records again (rows the table already holds are skipped as for any backlog).

The Spark stage can start before its sink (``table_ready=False``, then
``mark_table_ready`` once Spark is up): the WAL stage acknowledges meanwhile
(``ack_on="wal"``) and the Spark stage waits; the first thing it writes then
is the recovery ``backlog`` (WAL entries after the checkpoint, which may be in
the table already: the table is asked which offsets it holds, and those rows
are not written again), then what was appended since. Closed before Spark is
up, it writes nothing: the records stay in the WAL for the next start.

Memory is bounded: ``append`` must be preceded by ``await wait_for_capacity()``,
which blocks while more than ``max_buffer_bytes`` are buffered in both stages
(Kafka producer ``buffer.memory``). With a sink that reads records back from
the WAL (``to_table_from_wal``, as ``SparkGroupSink`` does) the Spark stage
keeps only the appends' fields and WAL positions, not their bytes: the limit
then bounds how far the table may lag behind the WAL (counted in record
bytes) more than memory, which holds only what waits for the WAL write.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Generic, Literal, Protocol, Sequence, TypeVar, runtime_checkable

import trio
from hdrh.histogram import HdrHistogram

from pipeline.persist.accumulator import FlushGroup, FlushPolicy, FlushReason, RecordAccumulator
from pipeline.log.batch import PartitionAppend
from pipeline.log.state import LogState
from pipeline.log.checkpoint import Checkpoint, StateStore
from pipeline.table.live import PUBLISH_INTERVAL_S
from pipeline.log.control import ABORT, CONTROL, TRANSACTIONAL, batch_kind, marker_type
from pipeline.log.wal import WalPosition, WalSpan, WriteAheadLog, encode_appends

if TYPE_CHECKING:
    from pipeline.table.catalog import MaintenanceResult

log = logging.getLogger(__name__)

AckOn = Literal["wal", "spark"]

DEFAULT_WAL_POLICY = FlushPolicy(max_records=1_000_000, max_bytes=8 * 1024 * 1024, linger_ms=0)
STOP_WAITS_FOR_TABLE_S = 120.0
"""A persister closed before its table side is up (``table_ready=False``, ``--ack-on wal``) with records
to write: how long the Spark stage waits for ``mark_table_ready`` to write them to the table (s, from
``close``), unless ``abandon_table`` says the table side will not come. Past it the WAL keeps every
record, written to the table at the next start. A stop signal during start-up waits for Spark's start
(~5-30 s) this way; a second signal stops at once."""
"""WAL group commit: up to 8 MiB per fsync, no linger (group what arrived during the last fsync)."""


class StorageFailedError(Exception):
    """The write-ahead log failed; produce requests are refused from now on."""


class Commit:
    """Durability of one request's appends: resolves once, with None or an error.

    Callbacks added after resolution run at once. Used by the handler to
    complete responses, and kept in producer state so a duplicate batch is
    answered only once its original is durable.
    """

    __slots__ = ("done", "error", "_callbacks", "seq", "at_wal")

    def __init__(self, seq: int = 0, at_wal: bool = False) -> None:
        self.seq = seq  # the persister's append number (sync_table)
        self.at_wal = at_wal  # resolves at the WAL whatever ack_on says (records of a transaction)
        self.done = False
        self.error: BaseException | None = None
        self._callbacks: list[Callable[[Commit], None]] = []

    def add_callback(self, callback: Callable[[Commit], None]) -> None:
        if self.done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def resolve(self, error: BaseException | None = None) -> None:
        if self.done:
            return
        self.done, self.error = True, error
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:  # one bad callback must not strand the others
                log.exception("commit callback failed")


FlushT = TypeVar("FlushT")
"""A sink's decoded flush (``pipeline.table.typed.FlushTables`` for ``SparkGroupSink``): the persister
only passes what ``to_table`` returned back to ``write``."""


class GroupSink(Protocol[FlushT]):
    """The table side, blocking (each call runs in a worker thread)."""

    def to_table(self, appends: Sequence[PartitionAppend]) -> FlushT:
        """Decode the appends' records once into the flush's rows (e.g. ``pipeline.table.typed.FlushTables``,
        rows by destination table)."""

    def write(self, table: FlushT, exclude: set[tuple[str, int, int]] | None = None) -> None:
        """Write ``table`` (what ``to_table`` returned) minus the (topic, partition, offset) rows in ``exclude``."""

    def present_offsets(self, ranges: dict[tuple[str, int], tuple[int, int]]) -> set[tuple[str, int, int]]:
        """(topic, partition, offset) already in the table within [start, end) per partition."""

    # Optional: a sink may also be a WalReadingSink and a MaintainedSink (below).


_FlushT_co = TypeVar("_FlushT_co", covariant=True)


@runtime_checkable
class WalReadingSink(Protocol[_FlushT_co]):
    """A GroupSink that decodes records read back from the WAL. When the sink has it, the
    persister drops record bytes once they are in the WAL and uses it for every flush."""

    def to_table_from_wal(self, appends: Sequence[PartitionAppend], wal_directory: str,
                          spans: Sequence[WalSpan]) -> _FlushT_co:
        """Same as ``to_table``, but the appends come without their record bytes (``records``
        empty, ``size_bytes`` kept): append i's records are the bytes at ``spans[i]`` =
        (segment, position, length) of the WAL in ``wal_directory`` (``pipeline.log.wal.read_spans``)."""


@runtime_checkable
class MaintainedSink(Protocol):
    """A GroupSink with table maintenance, which the persister runs every
    ``maintenance_interval_s`` between two writes when that is set."""

    def maintain(self) -> MaintenanceResult:
        """Compaction and retention (``pipeline.table.catalog.TableCatalog.maintain``)."""


class LogListener(Protocol):
    """The read side (``pipeline.log.manager.LogManager``): told where appends landed and when they count.

    Called in the persister's trio task, never from a worker thread.
    """

    def wal_appended(self, appends: Sequence[PartitionAppend], segment: int, positions: Sequence[int],
                     now_ms: int) -> None:
        """The appends were written (fsynced) to WAL segment ``segment``; ``positions[i]`` is the byte
        position of ``appends[i].records`` in that segment file; ``now_ms`` the wall clock (ms)."""

    def durable(self, appends: Sequence[PartitionAppend]) -> None:
        """The appends reached their acknowledgement point: consumers may read them."""

    def wal_cut(self, checkpointed: WalPosition, now_ms: int) -> WalPosition | None:
        """Where to truncate the WAL now that the table holds everything up to ``checkpointed``
        (retention, at wall-clock time ``now_ms``, keeps more of it); None: keep everything."""

    def wal_truncated(self, segments: Sequence[int]) -> None:
        """Segments that remain after a truncation (the others are gone)."""


LATENCY_HISTOGRAM_MAX_MS = 3_600_000
"""Largest latency the histograms below record (1 h); larger values are clamped to it."""


def latency_histogram() -> HdrHistogram:
    """An HdrHistogram of milliseconds, 1 ms to 1 h, 3 significant digits."""
    return HdrHistogram(1, LATENCY_HISTOGRAM_MAX_MS, 3)


@dataclass(slots=True)
class PersisterStats:
    """Counters since start (logs, metrics, benchmarks).

    The histograms hold milliseconds (values clamped to 1..``LATENCY_HISTOGRAM_MAX_MS``):
    ``wal_write_ms`` one WAL append + fsync each, ``flush_ms`` one successful
    Spark write each (retries included), ``queryable_lag_ms`` one value per
    WAL group commit (the requests of a group share one acknowledgement): from
    that fsync (the acknowledgement with ``ack_on="wal"``) to the Spark commit
    that made the group's records queryable; ``live_lag_ms`` likewise, from the
    acknowledgement of a group of non-transactional records to their
    visibility through the live view (``pipeline.table.live``): at once (1 ms,
    the histograms' floor) once the view is published, else its first
    publication (a server whose Spark is still starting). A transaction's
    records become visible at its commit marker, and are not counted.
    """

    wal_writes: int = 0
    wal_bytes: int = 0
    wal_seconds: float = 0.0
    flushes: int = 0
    records: int = 0
    failed_flushes: int = 0
    write_seconds: float = 0.0
    flush_bytes: int = 0
    maintenance_runs: int = 0
    compacted_partitions: int = 0
    table_lock_wait_seconds: float = 0.0
    table_commit_seconds: float = 0.0
    wal_write_ms: HdrHistogram = field(default_factory=latency_histogram)
    flush_ms: HdrHistogram = field(default_factory=latency_histogram)
    queryable_lag_ms: HdrHistogram = field(default_factory=latency_histogram)
    live_lag_ms: HdrHistogram = field(default_factory=latency_histogram)


def _record_ms(histogram: HdrHistogram, ms: float) -> None:
    histogram.record_value(min(max(1, round(ms)), LATENCY_HISTOGRAM_MAX_MS))


@dataclass(slots=True)
class _SparkWaiter:
    commit: Commit | None          # resolved here when ack_on == "spark"
    position: WalPosition
    acked_at: float                # trio.current_time() (s) of the WAL commit
    seq: int = 0                   # the last append number of the WAL group
    spans: list[WalSpan] = field(default_factory=list)  # where the group's appends' records are in
                                                        # the WAL, when the sink reads them from there


@dataclass(slots=True)
class _Held:
    """A transaction's append kept out of the table until its marker.

    ``append`` is stripped of its records when the sink reads them back from the WAL
    (``span`` says where); ``hold_from`` is the end of the WAL entry before the one
    holding it (None: the WAL's start): checkpoints must not pass it.
    """

    append: PartitionAppend
    span: WalSpan | None
    hold_from: WalPosition | None


class _GaveUp(enum.Enum):
    GAVE_UP = 0


_GAVE_UP = _GaveUp.GAVE_UP
"""``BatchingPersister._prepare``: given up at shutdown."""


def _earlier(a: WalPosition | None, b: WalPosition | None) -> WalPosition | None:
    """The earlier position; None (the start of the WAL) is the earliest."""
    if a is None or b is None:
        return None
    return min(a, b)


def _without_records(a: PartitionAppend) -> PartitionAppend:
    """``a`` minus its record bytes, still counting their size (``size_bytes``) for the limits."""
    return PartitionAppend(a.topic, a.partition, a.base_offset, b"", a.record_count, a.log_append_time_ms,
                           a.producer_id, a.producer_epoch, a.base_sequence, a.size_bytes)


def offset_ranges(appends: Sequence[PartitionAppend]) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) -> [lowest offset, end offset) covered by ``appends``."""
    ranges: dict[tuple[str, int], tuple[int, int]] = {}
    for a in appends:
        key = (a.topic, a.partition)
        end = a.base_offset + a.record_count
        lo, hi = ranges.get(key, (a.base_offset, end))
        ranges[key] = (min(lo, a.base_offset), max(hi, end))
    return ranges


class BatchingPersister(Generic[FlushT]):
    """See the module docstring.

    Args:
        sink: the Spark side (``SparkGroupSink``).
        wal: an opened WriteAheadLog.
        store: where checkpoints go.
        checkpoint: the checkpoint recovery ended with (end offsets, producer
            state, WAL position); the persister continues from it.
        spark_policy: flush limits of the Spark stage.
        wal_policy: group-commit limits of the WAL stage (linger 0: write
            whatever gathered while the previous fsync ran).
        ack_on: "wal" or "spark": where Commits resolve.
        max_buffer_bytes: bytes buffered in both stages above which
            ``wait_for_capacity`` blocks.
        retry_backoff_s, max_retry_backoff_s: Spark retry delays (seconds).
        shutdown_grace_s: at close, how long a failing Spark stage keeps
            retrying before giving up (the WAL keeps the records).
        table_start_wait_s: at close before ``mark_table_ready``, how long the Spark stage waits for
            it (``STOP_WAITS_FOR_TABLE_S``).
        maintenance_interval_s: call ``sink.maintain()`` (table compaction
            and retention) this often, between two Spark writes; None: never.
            Set, it needs a sink that is a ``MaintainedSink``.
        maintains: asked at each due time whether this broker runs the maintenance now (in a cluster
            with leadership through the database: whether it is the controller, so maintenance
            moves with the controller when a broker dies); None: always. A broker whose turn just
            came runs its first maintenance one interval later: the controller's death that gave it
            the turn moved partitions to it, and with ``--ack-on spark`` their first answers wait
            for its table commits, which wait while it maintains (the writer's slot).
        log_listener: the read side, told where appends are in the WAL and
            when they are durable, and asked how much of the WAL to keep;
            None: nothing reads the WAL, it is cut at every checkpoint.
        backlog: recovery's WAL entries after ``checkpoint`` (``pipeline.persist.recovery.Backlog``),
            written to the table before anything appended here; ``checkpoint`` is then the
            stored one (what the table is known to hold), not the state after the backlog.
        table_ready: the sink is started; False: the Spark stage waits for ``mark_table_ready``.
        before_table_write: called (in a worker thread) with a commit's appends before each try of
            its table write; raising fails that try (leadership through the database writes the
            commit's idempotent producer state first, fenced by the broker's membership).
        after_table_write: called (in the worker thread, still under ``table_lock``) with a
            commit's appends once its table write succeeded (leadership through the database
            records each partition's new table end); it must not raise.
        table_lock: called with ``shared`` and held (in the worker thread, blocking) around
            ``before_table_write`` and the table write of each try, so the fencing check and the
            commit are one step for anyone else holding it (a new leader reading the table's end,
            exclusively); the sink's own table changes take it again (it must be re-entrant).
            ``shared`` is the sink's ``commits_shared(table)`` when it has one (a commit that
            other brokers' commits may overlap), else False; a shared try whose write raises
            ``pipeline.table.catalog.SparkAppendNeeded`` is made again at once, exclusively.
        publish_live: called (in a worker thread, blocking) with ``prefix_ends()`` and whether
            the persister is closing, once the table side is ready, after commits (at most every
            ``pipeline.table.live.PUBLISH_INTERVAL_S``) and after the last one at a clean close:
            the live view's boundary (``SparkGroupSink.publish_live``). A failure is logged; the
            view keeps its older boundary, which is still exact. None: no live view.

    Raises:
        ValueError: ``ack_on`` is neither "wal" nor "spark", or ``maintenance_interval_s``
            is set for a sink without ``maintain``.
    """

    def __init__(
        self,
        sink: GroupSink[FlushT],
        wal: WriteAheadLog,
        store: StateStore,
        checkpoint: Checkpoint,
        spark_policy: FlushPolicy,
        *,
        wal_policy: FlushPolicy = DEFAULT_WAL_POLICY,
        ack_on: AckOn = "wal",
        max_buffer_bytes: int = 256 * 1024 * 1024,
        retry_backoff_s: float = 0.25,
        max_retry_backoff_s: float = 5.0,
        shutdown_grace_s: float = 30.0,
        table_start_wait_s: float = STOP_WAITS_FOR_TABLE_S,
        maintenance_interval_s: float | None = None,
        maintains: Callable[[], bool] | None = None,
        log_listener: LogListener | None = None,
        backlog: Sequence[tuple[WalPosition, Sequence[PartitionAppend]]] = (),
        table_ready: bool = True,
        before_table_write: Callable[[Sequence[PartitionAppend]], None] | None = None,
        after_table_write: Callable[[Sequence[PartitionAppend]], None] | None = None,
        table_lock: Callable[[bool], contextlib.AbstractContextManager[None]] | None = None,
        publish_live: Callable[[dict[tuple[str, int], int], bool], None] | None = None,
    ) -> None:
        if ack_on not in ("wal", "spark"):
            raise ValueError(f"ack_on must be 'wal' or 'spark', got {ack_on!r}")
        if maintenance_interval_s is not None and not isinstance(sink, MaintainedSink):
            raise ValueError("maintenance_interval_s is set, but the sink has no maintain()")
        self._sink = sink
        self._wal = wal
        # A sink that can read records back from the WAL gets positions, not bytes (WalReadingSink).
        self._wal_reader = sink if isinstance(sink, WalReadingSink) else None
        self._reads_wal = self._wal_reader is not None
        self._maintainer = sink if isinstance(sink, MaintainedSink) else None
        self._store = store
        self.ack_on: AckOn = ack_on
        self._wal_acc: RecordAccumulator[Commit] = RecordAccumulator(wal_policy)
        self._spark_acc: RecordAccumulator[_SparkWaiter] = RecordAccumulator(spark_policy)
        self._max_buffer_bytes = max_buffer_bytes
        self._retry_backoff_s = retry_backoff_s
        self._max_retry_backoff_s = max_retry_backoff_s
        self._shutdown_grace_s = shutdown_grace_s
        self._table_start_wait_s = table_start_wait_s
        self._maintenance_interval_s = maintenance_interval_s
        self._maintains = maintains
        self._maintaining = False  # whether ``maintains()`` said yes at the last due time
        self._next_maintenance = math.inf  # set by run()
        self._in_wal_write = 0
        self._in_spark_prepare = 0
        self._in_spark_write = 0
        self._spark_writing = False
        self._wal_wakeup = trio.Event()
        self._spark_wakeup = trio.Event()
        self._space = trio.Event()
        self._done = trio.Event()
        self._failed: BaseException | None = None
        self._closing_since: float | None = None
        # What the table holds, as of the last Spark commit.
        self._committed = LogState.from_checkpoint(checkpoint)
        self._topics = dict(checkpoint.topics)
        self._listener = log_listener
        self._before_table_write = before_table_write
        self._after_table_write = after_table_write
        self._table_lock = table_lock or (lambda shared: contextlib.nullcontext())
        self._commits_shared: Callable[[FlushT], bool] | None = getattr(sink, "commits_shared", None)
        self._checkpointed_position = checkpoint.wal_position  # of the last checkpoint saved
        self._checkpoint_lock = trio.Lock()
        self._appended_seq = 0     # appends accepted (numbered from 1)
        self._table_seq = 0        # every append up to this number is in the table
        self._table_progress = trio.Event()
        self._sync_requested = 0
        # Open transactions: producer id -> its appends not in the table yet, in WAL order.
        self._held: dict[int, list[_Held]] = {}
        # (topic, partition, base offset) of every transactional append not in the table yet and not
        # aborted: held, or released by its COMMIT marker into a flush not written yet (prefix_ends).
        self._txn_pending: set[tuple[str, int, int]] = set()
        self._publish_live = publish_live
        self._published_at = -math.inf
        self._live_since: float | None = None   # the first publication of the live view
        self._live_waiting: list[float] = []    # acknowledgements (trio time) before it
        self._backlog_written_any = False
        self._backlog = self._hold_transactions(checkpoint.wal_position, backlog)
        self._last_wal_end = backlog[-1][0] if backlog else checkpoint.wal_position
        for _, appends in self._backlog:
            for a in appends:
                if self._topics.get(a.topic, 0) <= a.partition:
                    self._topics[a.topic] = a.partition + 1
        self._spark_closed = trio.Event()  # the WAL stage is done: the Spark stage's input is complete
        self._spark_closed_logged = False
        self._table_ready = trio.Event()
        self._table_abandoned = trio.Event()
        if table_ready:
            self._table_ready.set()
        self.stats = PersisterStats()

    # -- the handler's side ----------------------------------------------

    @property
    def failed(self) -> BaseException | None:
        """The WAL error that took storage offline, if any."""
        return self._failed

    @property
    def buffered_records(self) -> int:
        return self._wal_acc.records + self._spark_acc.records

    @property
    def buffered_bytes(self) -> int:
        """Bytes in both stages: filling, being written, waiting for Spark."""
        return (self._wal_acc.size_bytes + self._in_wal_write + self._spark_acc.size_bytes
                + self._in_spark_prepare + self._in_spark_write)

    @property
    def has_capacity(self) -> bool:
        """True if ``append`` may go on now without waiting (``wait_for_capacity`` would return at once)."""
        return self.buffered_bytes < self._max_buffer_bytes or self._wal_acc.closing

    async def wait_for_capacity(self, deadline: float = math.inf) -> bool:
        """Block while more than ``max_buffer_bytes`` are buffered (backpressure).

        Args:
            deadline: give up at this ``trio.current_time()`` (s).

        Returns:
            True when there is room (or the persister is closing), False if
            ``deadline`` passed first (the caller answers REQUEST_TIMED_OUT).
        """
        while self.buffered_bytes >= self._max_buffer_bytes and not self._wal_acc.closing:
            self._spark_wakeup.set()  # memory pressure is a flush trigger
            with trio.move_on_at(deadline):
                await self._space.wait()
            if trio.current_time() >= deadline:
                return False
        return True

    def append(self, appends: Sequence[PartitionAppend], at_wal: bool = False) -> Commit:
        """Add one request's sequenced appends; returns its durability handle.

        Synchronous on purpose: the caller assigns offsets and appends without
        yielding in between, so groups hold offsets in sequencing order.
        ``at_wal``: the Commit resolves once the WAL has them whatever ``ack_on`` says
        (a transaction's records: the table gets them at its commit). A transaction's
        markers (``pipeline.log.control``) go through here too, with ``at_wal`` False:
        with ``ack_on="spark"`` a COMMIT marker resolves once the records it releases
        are in the table.

        Raises:
            StorageFailedError: the WAL failed earlier.
            RuntimeError: after ``close``.
        """
        if self._failed is not None:
            raise StorageFailedError(str(self._failed))
        self._appended_seq += 1
        commit = Commit(self._appended_seq, at_wal)
        self._wal_acc.append(appends, commit, trio.current_time() * 1000.0)
        topics = self._topics
        for a in appends:
            if topics.get(a.topic, 0) <= a.partition:
                topics[a.topic] = a.partition + 1
        self._wal_wakeup.set()
        return commit

    async def sync_table(self) -> None:
        """Return once every append made before this call is in the table (a barrier).

        Both stages flush at once instead of waiting for linger or the
        commit interval. Used before a topic's rows are dropped (DeleteTopics),
        so no buffered record of it lands after the drop.

        Raises:
            StorageFailedError: the WAL failed; what it refused never reaches the table.
        """
        target = self._appended_seq
        self._sync_requested += 1
        try:
            while self._table_seq < target:
                if self._failed is not None:
                    raise StorageFailedError(str(self._failed))
                self._wal_wakeup.set()
                self._spark_wakeup.set()
                progress = self._table_progress
                with trio.move_on_after(1.0):  # re-check a WAL failure now and then
                    await progress.wait()
        finally:
            self._sync_requested -= 1

    async def forget_topic(self, topic: str) -> None:
        """A deleted topic leaves the checkpoint (after ``sync_table`` and the table drop), saved
        now: re-created, it starts again at offset 0, after a restart or a crash too.

        Raises:
            OSError: the checkpoint could not be saved (the deletion should fail and be retried).
        """
        async with self._checkpoint_lock:  # no older checkpoint may land after this one
            self._committed.forget_topic(topic)
            self._topics.pop(topic, None)
            checkpoint = Checkpoint(self._checkpointed_position, self._committed.end_offsets(),
                                    self._committed.producers.snapshot(), dict(self._topics))
            await trio.to_thread.run_sync(self._store.save, checkpoint)

    @property
    def table_ready(self) -> bool:
        """The sink is started (``mark_table_ready``): the Spark stage writes."""
        return self._table_ready.is_set()

    @property
    def backlog_records(self) -> int:
        """Records of the recovery backlog not in the table yet."""
        return sum(a.record_count for _, appends in self._backlog for a in appends)

    def mark_table_ready(self) -> None:
        """The sink is started: the Spark stage writes the backlog, then what waits. Idempotent."""
        self._table_ready.set()

    def abandon_table(self) -> None:
        """The sink will not start (Spark failed): a closing Spark stage stops waiting for it and
        the WAL keeps every record for the next start. Idempotent."""
        self._table_abandoned.set()

    async def wait_backlog_written(self) -> None:
        """Return once the recovery backlog is in the table (at once without one).

        Raises:
            RuntimeError: the persister stopped first (closed before Spark was up, or gave up on it).
        """
        while self._backlog:
            if self._done.is_set():
                raise RuntimeError("the persister stopped before the recovery backlog reached the table")
            progress = self._table_progress
            with trio.move_on_after(1.0):
                await progress.wait()

    def close(self) -> None:
        """Write what is buffered, then let ``run`` return. Idempotent."""
        if not self._wal_acc.closing:
            self._wal_acc.close()
            self._closing_since = trio.current_time()
            self._wal_wakeup.set()

    async def wait_closed(self) -> None:
        await self._done.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Both stages; returns after ``close`` once everything is written (or given up)."""
        if self._maintenance_interval_s is not None:
            self._next_maintenance = trio.current_time() + self._maintenance_interval_s
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._wal_stage)
                nursery.start_soon(self._spark_stage)
                task_status.started()
        finally:
            self._done.set()

    # -- stage 1: WAL group commit ---------------------------------------------

    async def _wal_stage(self) -> None:
        acc = self._wal_acc
        try:
            while True:
                reason = acc.ready(trio.current_time() * 1000.0)
                if reason is None and acc.pending and self._sync_requested:
                    reason = FlushReason.LINGER
                if reason is not None:
                    await self._write_wal(acc.drain(reason))
                    continue
                if acc.closing and acc.pending == 0:
                    return
                self._wal_wakeup = trio.Event()
                deadline = acc.deadline_ms()
                with trio.move_on_at(deadline / 1000.0 if deadline is not None else float("inf")):
                    await self._wal_wakeup.wait()
        finally:
            self._spark_acc.close()
            self._spark_closed.set()
            self._spark_wakeup.set()

    async def _write_wal(self, group: FlushGroup[Commit]) -> None:
        if self._failed is not None:
            for commit in group.waiters:
                commit.resolve(self._failed)
            return
        positions: list[int] = []
        self._in_wal_write = group.size_bytes
        started = time.perf_counter()
        try:
            # Encoded in the worker thread too: joining a group's records
            # (up to 8 MiB) is a copy the event loop need not make.
            position, size = await trio.to_thread.run_sync(self._encode_and_append, group.appends, positions)
        except Exception as exc:  # disk full, I/O error: the log directory is gone
            self._failed = exc
            log.critical("write-ahead log append failed; refusing produce requests from now on: %s", exc)
            for commit in group.waiters:
                commit.resolve(exc)
            return
        finally:
            self._in_wal_write = 0
        stats = self.stats
        elapsed = time.perf_counter() - started
        stats.wal_writes += 1
        stats.wal_bytes += size
        stats.wal_seconds += elapsed
        _record_ms(stats.wal_write_ms, elapsed * 1000.0)
        start = position.offset - size  # the payload's place in the segment
        if self._listener is not None:
            self._listener.wal_appended(group.appends, position.segment, [start + p for p in positions],
                                        int(time.time() * 1000))
        segment = position.segment
        spans = [(segment, start + p, len(a.records)) for a, p in zip(group.appends, positions)]
        appends, spans, transactional = self._route(group.appends, spans, self._last_wal_end)
        self._last_wal_end = position
        spark_commit = None
        if self.ack_on == "wal":
            if self._listener is not None:
                self._listener.durable(group.appends)
            for commit in group.waiters:
                commit.resolve(None)
            if len(transactional) < len(group.appends):  # readable by a live view's tail from now
                self._live_acknowledged(trio.current_time())
        else:
            if transactional and self._listener is not None:
                self._listener.durable(transactional)  # acknowledged at the WAL: readable
            waiters = []
            for commit in group.waiters:
                if commit.at_wal:  # a transaction's records: the table gets them at its commit
                    commit.resolve(None)
                else:
                    waiters.append(commit)
            spark_commit = Commit()

            def release(c: Commit, waiters: list[Commit] = waiters) -> None:
                for commit in waiters:
                    commit.resolve(c.error)

            spark_commit.add_callback(release)
        # A group with nothing for the table (a transaction's records, markers) still passes
        # through the Spark stage, empty: its place in the order of completions and checkpoints.
        now = trio.current_time()
        waiter = _SparkWaiter(spark_commit, position, now, max(c.seq for c in group.waiters))
        if self._reads_wal:
            # From here on the records are read back from the WAL where they are decoded: the
            # Spark stage keeps no copy of them in memory, and none is pickled to the decoder.
            waiter.spans = spans
            appends = [_without_records(a) for a in appends]
        self._spark_acc.append(appends, waiter, now * 1000.0)
        self._spark_wakeup.set()

    # -- transactions --------------------------------------------------------

    def _route(self, appends: Sequence[PartitionAppend], spans: list[WalSpan] | None,
               hold_from: WalPosition | None, strip: bool = True,
               ) -> tuple[list[PartitionAppend], list[WalSpan], list[PartitionAppend]]:
        """Split one WAL entry's appends: what goes to the table now (with the records a COMMIT
        marker releases, before the entry's own), what a transaction holds, what a marker settles.

        ``spans[i]`` is where append i's records are in the WAL (None: unknown, the appends keep
        their records). ``strip``: held appends drop their records when the sink reads the WAL.
        Returns (appends for the table, their spans, the entry's transactional appends).
        """
        if not self._held and not any(batch_kind(a.records) for a in appends):
            return list(appends), list(spans or ()), []  # the common case: no transaction in sight
        out: list[PartitionAppend] = []
        out_spans: list[WalSpan] = []
        released: list[_Held] = []
        transactional: list[PartitionAppend] = []
        for i, a in enumerate(appends):
            kind = batch_kind(a.records)
            span = spans[i] if spans is not None else None
            if kind == TRANSACTIONAL:
                kept = _without_records(a) if strip and self._reads_wal and span is not None else a
                self._held.setdefault(a.producer_id, []).append(_Held(kept, span, hold_from))
                self._txn_pending.add((a.topic, a.partition, a.base_offset))
                transactional.append(a)
            elif kind == CONTROL:
                held = self._held.get(a.producer_id, [])
                mine = [h for h in held if h.append.topic == a.topic and h.append.partition == a.partition]
                if mine:
                    rest = [h for h in held if h not in mine]
                    if rest:
                        self._held[a.producer_id] = rest
                    else:
                        del self._held[a.producer_id]
                if marker_type(a.records) == ABORT:
                    for h in mine:  # their offsets and sequences are taken; their rows never exist
                        self._committed.apply(h.append)
                        self._txn_pending.discard((h.append.topic, h.append.partition, h.append.base_offset))
                else:
                    released.extend(mine)
                self._committed.apply(a)
            else:
                out.append(a)
                if span is not None:
                    out_spans.append(span)
        if released:
            out = [h.append for h in released] + out
            out_spans = [h.span for h in released if h.span is not None] + out_spans
        return out, out_spans, transactional

    def _hold_transactions(self, stored: WalPosition | None,
                           backlog: Sequence[tuple[WalPosition, Sequence[PartitionAppend]]],
                           ) -> list[tuple[WalPosition, list[PartitionAppend]]]:
        """The recovery backlog minus what transactions hold (``_route`` on each entry, in order).

        A held append gets its WAL span (re-encoding the entry gives its records' positions,
        ``encode_appends`` being deterministic), so it is read back from the WAL like a live one.
        """
        out = []
        previous = stored
        for position, appends in backlog:
            spans = None
            if any(batch_kind(a.records) == TRANSACTIONAL for a in appends):
                positions: list[int] = []
                payload = encode_appends(appends, positions)
                start = position.offset - len(payload)
                spans = [(position.segment, start + p, len(a.records)) for a, p in zip(appends, positions)]
            # Backlog appends keep their records, held ones too: released by a marker of the
            # backlog they are written with ``to_table``, by a live one they are read back by span.
            kept, _spans, _transactional = self._route(appends, spans, previous, strip=False)
            if kept:
                out.append((position, kept))
            previous = position
        return out

    def _checkpoint_position(self, position: WalPosition) -> WalPosition | None:
        """``position``, or earlier: never past the WAL entry of an open transaction's first record."""
        result: WalPosition | None = position
        for held in self._held.values():
            result = _earlier(result, held[0].hold_from)
        return result

    def open_appends(self, topic: str, partition: int) -> list[PartitionAppend]:
        """The appends of open transactions held out of the table on ``topic``-``partition`` (no marker
        yet), in WAL order, with their records (read back from the WAL where they were stripped;
        blocking: call it in a worker thread). What a leader hands over with the partition
        (``pipeline.cluster.service``), then ``hand_over_open``.

        Raises:
            OSError: the WAL could not be read.
        """
        out = []
        for held in list(self._held.values()):
            for h in held:
                a = h.append
                if a.topic != topic or a.partition != partition:
                    continue
                if not a.records and h.span is not None:
                    segment, position, length = h.span
                    a = PartitionAppend(a.topic, a.partition, a.base_offset, self._wal.read(segment, position, length),
                                        a.record_count, a.log_append_time_ms, a.producer_id, a.producer_epoch,
                                        a.base_sequence, a.uncompressed_bytes)
                out.append(a)
        return sorted(out, key=lambda a: a.base_offset)

    def hand_over_open(self, topic: str, partition: int) -> int:
        """Forget the open transactions' appends on ``topic``-``partition``: another leader holds them
        now (``open_appends``); the checkpoint may pass them. Returns how many were forgotten."""
        forgotten = 0
        for pid in list(self._held):
            kept = [h for h in self._held[pid] if h.append.topic != topic or h.append.partition != partition]
            forgotten += len(self._held[pid]) - len(kept)
            if kept:
                self._held[pid] = kept
            else:
                del self._held[pid]
        self._txn_pending = {key for key in self._txn_pending if key[:2] != (topic, partition)}
        return forgotten

    @property
    def open_transactions(self) -> int:
        """Producers with records held out of the table (open transactions)."""
        return len(self._held)

    def prefix_ends(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> the offset below which every record is in the table or never a row
        (aborted, a marker, a dead letter): the last commit's end offset, lowered to the first record
        of a transaction not in the table yet (open, or committed but not written). The live view's
        boundary (``pipeline.table.live``)."""
        ends = self._committed.end_offsets()
        for topic, partition, offset in self._txn_pending:
            if offset < ends.get((topic, partition), 0):
                ends[(topic, partition)] = offset
        return ends

    async def _publish(self, closing: bool = False) -> None:
        """Publish the live view's boundary now (``publish_live``); failures are logged."""
        if self._publish_live is None:
            return
        self._published_at = trio.current_time()
        try:
            await trio.to_thread.run_sync(self._publish_live, self.prefix_ends(), closing)
        except Exception as exc:  # the view keeps its older boundary: exact, with a longer tail
            log.warning("publishing the live view failed: %s", str(exc).splitlines()[0] if str(exc) else exc)
            return
        if self._live_since is None:  # the view reads the tail from now on
            self._live_since = trio.current_time()
            for acked_at in self._live_waiting:
                _record_ms(self.stats.live_lag_ms, (self._live_since - acked_at) * 1000.0)
            self._live_waiting.clear()

    def _live_acknowledged(self, acked_at: float) -> None:
        """A group of non-transactional records was acknowledged at ``acked_at`` and is readable:
        visible through the live view at once once it is published, else at its first publication."""
        if self._publish_live is None:
            return
        if self._live_since is not None:
            _record_ms(self.stats.live_lag_ms, 0.0)
        else:
            self._live_waiting.append(acked_at)

    def _encode_and_append(self, appends: Sequence[PartitionAppend], positions: list[int]) -> tuple[WalPosition, int]:
        """One WAL entry for ``appends`` (``encode_appends``, filling ``positions``), written and fsynced;
        returns the end position and the payload's size (bytes). Blocking: a worker thread."""
        payload = encode_appends(appends, positions)
        return self._wal.append([payload]), len(payload)

    # -- stage 2: Spark flushes --------------------------------------------

    async def _spark_stage(self) -> None:
        """Group, then decode (thread 1) while the previous group is written (thread 2).

        Decoding records to Arrow is CPU work in Python; a Spark write is
        mostly JVM time. Overlapping them makes a flush cycle cost the larger
        of the two, not their sum.
        """
        send, receive = trio.open_memory_channel[tuple[FlushGroup[_SparkWaiter], FlushT | None]](0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._spark_writer, receive)
            async with send:
                await self._spark_grouper(send)

    async def _until_table_ready(self) -> bool:
        """Wait for ``mark_table_ready``. Closed before it with records to write (acknowledged since
        the start, or the recovery backlog), wait on for at most ``table_start_wait_s`` from
        ``close``, so a clean stop during start-up leaves the table complete; False when there is
        nothing to write, when that wait passes, or when ``abandon_table`` comes first (nothing is
        written: the WAL keeps every record for the next start)."""
        while not self._table_ready.is_set():
            waiting = self._spark_acc.records + self.backlog_records
            if self._table_abandoned.is_set():
                log.warning("stopping without the table side: %d records stay in the WAL and are written "
                            "to the table at the next start", waiting)
                return False
            deadline = math.inf
            if self._spark_acc.closing and not waiting:
                log.info("stopping before Spark is up: nothing to write to the table")
                return False
            if self._spark_acc.closing:
                assert self._closing_since is not None
                deadline = self._closing_since + self._table_start_wait_s
                if trio.current_time() >= deadline:
                    log.warning("stopping: Spark did not start within %.0f s of the stop; %d records stay in "
                                "the WAL and are written to the table at the next start",
                                self._table_start_wait_s, waiting)
                    return False
                if not self._spark_closed_logged:
                    self._spark_closed_logged = True
                    log.info("stopping before Spark is up: waiting up to %.0f s for it, to write %d records "
                             "to the table (a second signal stops at once; the WAL keeps them)",
                             deadline - trio.current_time(), waiting)
            with trio.move_on_at(deadline):
                async with trio.open_nursery() as nursery:
                    async def first(event: trio.Event) -> None:
                        await event.wait()
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(first, self._table_ready)
                    nursery.start_soon(first, self._table_abandoned)
                    if not self._spark_acc.closing:
                        nursery.start_soon(first, self._spark_closed)
        return True

    async def _spark_grouper(self, send: trio.MemorySendChannel) -> None:
        acc = self._spark_acc
        if not await self._until_table_ready():
            return
        while True:
            now_ms = trio.current_time() * 1000.0
            reason = acc.ready(now_ms)
            if reason is None and acc.pending and self.buffered_bytes >= self._max_buffer_bytes:
                reason = FlushReason.MEMORY
            if reason is None and acc.pending and self._sync_requested:
                reason = FlushReason.LINGER  # sync_table: go now (once the write in flight is done)
            waiting_for_writer = reason in (FlushReason.LINGER, FlushReason.IDLE) and self._spark_writing
            if waiting_for_writer:
                # Group commit: while a write is in flight a lingered group
                # keeps filling, and goes when the writer is free (or the
                # group fills up, which still overlaps its decoding with the
                # write). Draining it at once would split the next flush in
                # two and pay the fixed cost of a Spark write twice.
                reason = None
            if reason is not None:
                group = acc.drain(reason)
                self._in_spark_prepare = group.size_bytes
                try:
                    table = await self._prepare(group)
                    if table is _GAVE_UP:
                        return
                    await send.send((group, table))
                except trio.BrokenResourceError:
                    return  # the writer gave up at shutdown; the WAL keeps the rest
                finally:
                    self._in_spark_prepare = 0
                continue
            if acc.closing and acc.pending == 0:
                return
            self._spark_wakeup = trio.Event()
            deadline = None if waiting_for_writer else acc.deadline_ms()
            with trio.move_on_at(deadline / 1000.0 if deadline is not None else float("inf")):
                await self._spark_wakeup.wait()

    async def _prepare(self, group: FlushGroup[_SparkWaiter]) -> FlushT | None | Literal[_GaveUp.GAVE_UP]:
        """Decode one group for its write (the sink may stage files there: ``SparkGroupSink``), retried
        with backoff as a failed write is (a full or missing table directory fails it too); None for a
        group with nothing for the table (see ``_write_wal``), ``_GAVE_UP`` if given up at shutdown."""
        if not group.appends:
            return None
        backoff = self._retry_backoff_s
        attempt = 0
        while True:
            attempt += 1
            try:
                if self._wal_reader is not None:
                    spans = [span for w in group.waiters for span in w.spans]
                    return await trio.to_thread.run_sync(self._wal_reader.to_table_from_wal, group.appends,
                                                         self._wal.directory, spans)
                return await trio.to_thread.run_sync(self._sink.to_table, group.appends)
            except Exception as exc:  # the records are in the WAL: nothing is lost by waiting
                if self._failed_attempt(group, exc, "preparing the flush of", attempt, backoff):
                    return _GAVE_UP
                await trio.sleep(backoff)
                backoff = min(backoff * 2, self._max_retry_backoff_s)

    def _failed_attempt(self, group: FlushGroup[_SparkWaiter], exc: Exception, what: str, attempt: int,
                        backoff: float) -> bool:
        """Count and log a failed preparation or write of ``group``; True when it is given up: the
        persister is closing and its ``shutdown_grace_s`` has passed (the group's Commits resolve
        with ``exc``; the WAL keeps its records for the next start)."""
        self.stats.failed_flushes += 1
        log.warning("%s %d records failed (attempt %d), retrying in %.2f s: %s", what, group.records, attempt,
                    backoff, str(exc).splitlines()[0] if str(exc) else exc)
        if self._closing_since is None or trio.current_time() - self._closing_since <= self._shutdown_grace_s:
            return False
        log.error("giving up on the table at shutdown: %d records stay in the WAL and are written at the "
                  "next start", self.buffered_records + group.records)
        for waiter in group.waiters:
            if waiter.commit is not None:
                waiter.commit.resolve(exc)
        return True

    async def _spark_writer(self, receive: trio.MemoryReceiveChannel) -> None:
        async with receive:
            if not await self._until_table_ready():
                return
            await self._publish()  # at once: the view of a previous run may be stopped or stale
            if not await self._write_backlog():
                return
            if self._backlog_written_any:
                await self._publish()
            while True:
                with trio.move_on_at(self._next_maintenance) as maintenance_due:
                    try:
                        group, table = await receive.receive()
                    except trio.EndOfChannel:
                        await self._publish(closing=True)
                        return
                if maintenance_due.cancelled_caught:
                    # Between two writes, never during one: a compaction
                    # must not swap a partition a write is adding files to.
                    await self._maintain()
                    continue
                self._spark_writing = True
                try:
                    if not await self._write_spark(group, table):
                        return
                finally:
                    self._spark_writing = False
                    self._spark_wakeup.set()  # a lingered group may go now
                if trio.current_time() - self._published_at >= PUBLISH_INTERVAL_S:
                    await self._publish()

    async def _write_backlog(self) -> bool:
        """Write the recovery backlog (``pipeline.persist.recovery.replay``'s rule: rows the table
        already holds are not written again), in groups of the Spark policy's size, each
        checkpointed like a flush; False if given up at shutdown."""
        if not self._backlog:
            return True
        self._backlog_written_any = True
        appends = [a for _, entry in self._backlog for a in entry]
        total = sum(a.record_count for a in appends)
        exclude: set[tuple[str, int, int]] | None = None
        backoff = self._retry_backoff_s
        while exclude is None:
            try:
                exclude = await trio.to_thread.run_sync(self._sink.present_offsets, offset_ranges(appends))
            except Exception as exc:  # Spark not answering yet: as a failed flush
                log.warning("reading the table's offsets for the WAL backlog failed, retrying in %.2f s: %s",
                            backoff, str(exc).splitlines()[0] if str(exc) else exc)
                if self._closing_since is not None and trio.current_time() - self._closing_since > self._shutdown_grace_s:
                    return False
                await trio.sleep(backoff)
                backoff = min(backoff * 2, self._max_retry_backoff_s)
        log.info("recovery: %d WAL records after the checkpoint, %d to write now, %d already in the table",
                 total, total - len(exclude), len(exclude))
        policy = self._spark_acc.policy
        while self._backlog:
            group: FlushGroup[_SparkWaiter] = FlushGroup(reason=FlushReason.RECOVERY)
            while self._backlog and not (group.records >= policy.max_records or group.size_bytes >= policy.max_bytes):
                position, entry = self._backlog[0]
                group.appends.extend(entry)
                group.records += sum(a.record_count for a in entry)
                group.size_bytes += sum(a.size_bytes for a in entry)
                group.waiters.append(_SparkWaiter(None, position, trio.current_time()))
                self._backlog.pop(0)
            table = await trio.to_thread.run_sync(self._sink.to_table, group.appends)
            if not await self._write_spark(group, table, exclude):
                return False
        return True

    async def _maintain(self) -> None:
        """One ``sink.maintain()`` (compaction, retention) in the writer's slot; failures are logged."""
        assert self._maintenance_interval_s is not None and self._maintainer is not None  # checked in __init__
        self._next_maintenance = trio.current_time() + self._maintenance_interval_s
        if self._maintains is not None:
            turn, was_turn = self._maintains(), self._maintaining
            self._maintaining = turn
            if not turn:
                return  # another broker's turn (the controller's)
            if not was_turn:  # it just came: the partitions taken over first
                log.info("table maintenance is this broker's now (the controller's); its first run in %.1f s",
                         self._maintenance_interval_s)
                return
        try:
            result = await trio.to_thread.run_sync(self._maintainer.maintain)
        except Exception as exc:  # the next run retries; the table's journal keeps what must be deleted
            log.warning("table maintenance failed: %s", str(exc).splitlines()[0] if str(exc) else exc)
        else:
            self.stats.maintenance_runs += 1
            self.stats.compacted_partitions += result.compacted_partitions
            if result.compacted_partitions or result.dropped_partitions:
                log.info("table maintenance: %d partitions compacted (%d files into %d), %d dropped by "
                         "retention, %d directories deleted, %.1f s", result.compacted_partitions,
                         result.files_before, result.files_after, result.dropped_partitions,
                         result.deleted_directories, result.seconds)
        self._next_maintenance = trio.current_time() + self._maintenance_interval_s

    def _commit(self, appends: Sequence[PartitionAppend], table: FlushT | None,
                exclude: set[tuple[str, int, int]] | None) -> None:
        """One try of a table write (blocking): ``before_table_write``, the write, then
        ``after_table_write``, under ``table_lock`` (shared when the sink says the commit may be)."""
        from pipeline.table.catalog import SparkAppendNeeded

        shared = table is not None and self._commits_shared is not None and self._commits_shared(table)
        try:
            self._commit_held(appends, table, exclude, shared)
        except SparkAppendNeeded:
            if not shared:
                raise
            # A typed topic's table needs a Spark append after all (another broker changed its
            # columns): again, exclusively. The files committed by the shared try are skipped.
            self._commit_held(appends, table, exclude, False)

    def _commit_held(self, appends: Sequence[PartitionAppend], table: FlushT | None,
                     exclude: set[tuple[str, int, int]] | None, shared: bool) -> None:
        started = time.perf_counter()
        with self._table_lock(shared):
            held = time.perf_counter()
            self.stats.table_lock_wait_seconds += held - started
            if self._before_table_write is not None:
                self._before_table_write(appends)
            if table is not None:
                self._sink.write(table, exclude)
            if self._after_table_write is not None:
                self._after_table_write(appends)
            self.stats.table_commit_seconds += time.perf_counter() - held

    async def _write_spark(self, group: FlushGroup[_SparkWaiter], table: FlushT | None,
                           exclude: set[tuple[str, int, int]] | None = None) -> bool:
        """Write one group (minus the rows in ``exclude``) until it succeeds; False if given up at shutdown."""
        self._in_spark_write = group.size_bytes
        backoff = self._retry_backoff_s
        started = time.perf_counter()
        attempt = 0
        try:
            while True:
                attempt += 1
                try:
                    if attempt > 1:
                        # The failed try may have landed some rows: never twice.
                        exclude = await trio.to_thread.run_sync(
                            self._sink.present_offsets, offset_ranges(group.appends))
                    await trio.to_thread.run_sync(self._commit, group.appends, table, exclude)
                    break
                except Exception as exc:  # Spark raises many types; all mean "not written"
                    if self._failed_attempt(group, exc, "Spark flush of", attempt, backoff):
                        return False
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, self._max_retry_backoff_s)
        finally:
            self._in_spark_write = 0
            space, self._space = self._space, trio.Event()
            space.set()
        elapsed = time.perf_counter() - started
        stats = self.stats
        stats.flushes += 1 if table is not None else 0
        self._table_seq = max(self._table_seq, max(w.seq for w in group.waiters))
        progress, self._table_progress = self._table_progress, trio.Event()
        progress.set()
        stats.records += group.records
        stats.flush_bytes += group.size_bytes
        stats.write_seconds += elapsed
        _record_ms(stats.flush_ms, elapsed * 1000.0)
        committed_at = trio.current_time()
        for waiter in group.waiters:
            _record_ms(stats.queryable_lag_ms, (committed_at - waiter.acked_at) * 1000.0)
        if self.ack_on == "spark" and group.appends:  # acknowledged, and readable, now
            self._live_acknowledged(committed_at)
        log.debug("flushed %d records (%d bytes, %s) in %.0f ms", group.records, group.size_bytes,
                  group.reason.value if group.reason else "", elapsed * 1000)
        for a in group.appends:
            self._committed.apply(a)
        if self._txn_pending:
            self._txn_pending.difference_update((a.topic, a.partition, a.base_offset) for a in group.appends)
        if self.ack_on == "spark" and self._listener is not None:
            self._listener.durable(group.appends)
        for waiter in group.waiters:
            if waiter.commit is not None:
                waiter.commit.resolve(None)
        position = self._checkpoint_position(group.waiters[-1].position)
        async with self._checkpoint_lock:
            self._checkpointed_position = position
            checkpoint = Checkpoint(position, self._committed.end_offsets(),
                                    self._committed.producers.snapshot(), dict(self._topics))
            cut = position if self._listener is None or position is None else self._listener.wal_cut(
                position, int(time.time() * 1000))
            try:
                remaining = await trio.to_thread.run_sync(self._checkpoint_and_truncate, checkpoint, cut)
            except Exception as exc:  # the next flush checkpoints again; replay is idempotent
                log.warning("checkpoint after flush failed: %s", exc)
            else:
                if self._listener is not None:
                    self._listener.wal_truncated(remaining)
        return True

    def _checkpoint_and_truncate(self, checkpoint: Checkpoint, cut: WalPosition | None) -> list[int]:
        """Save ``checkpoint``, truncate the WAL before ``cut``; returns the segments left."""
        self._store.save(checkpoint)
        if cut is not None:
            assert checkpoint.wal_position is not None and cut <= checkpoint.wal_position
            self._wal.truncate_before(cut)
        return self._wal.segments
