"""The batching persister: the trio task that turns appends into Spark writes.

RequestHandlers call ``append`` with the sequenced appends of one request and
a callback; the persister groups appends across requests (see
``RecordAccumulator``), writes each group with ONE blocking call in a worker
thread (decode to Arrow + one Spark append), and then calls every callback of
the group, in append order, so produce responses are released only once their
records are durable.

Flushes run one at a time: while group k is written, group k+1 fills, so under
load groups grow by themselves (group commit). Memory is bounded: ``append``
must be preceded by ``await wait_for_capacity()``, which blocks while more
than ``max_buffer_bytes`` are buffered (Kafka producer ``buffer.memory``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import trio

from pipeline.persist.accumulator import FlushGroup, FlushPolicy, FlushReason, RecordAccumulator
from pipeline.persist.batch import PartitionAppend

log = logging.getLogger(__name__)

DurableCallback = Callable[[BaseException | None], None]
"""Called once per ``append``: None when durable, else the error that prevented it."""

GroupWriter = Callable[[Sequence[PartitionAppend]], None]
"""Blocking: makes the appends durable (one Spark write) or raises."""


@dataclass(slots=True)
class PersisterStats:
    """Counters since start (for logs, metrics and the benchmark)."""

    flushes: int = 0
    records: int = 0
    bytes: int = 0
    failed_flushes: int = 0
    write_seconds: float = 0.0
    last_flush_records: int = 0
    last_flush_reason: str = ""


class BatchingPersister:
    """Groups appends and flushes them with ``writer``; see the module docstring.

    Args:
        writer: blocking function that persists one group (runs in a thread).
        policy: flush limits (records, bytes, linger ms).
        max_buffer_bytes: bytes buffered (filling + being written) above which
            ``wait_for_capacity`` blocks.
        write_attempts: tries per group before its requests get an error.
        retry_backoff_s: first delay between tries, doubled each time (seconds).
    """

    def __init__(
        self,
        writer: GroupWriter,
        policy: FlushPolicy,
        *,
        max_buffer_bytes: int = 256 * 1024 * 1024,
        write_attempts: int = 3,
        retry_backoff_s: float = 0.5,
    ) -> None:
        self._writer = writer
        self._acc: RecordAccumulator[DurableCallback] = RecordAccumulator(policy)
        self._max_buffer_bytes = max_buffer_bytes
        self._write_attempts = max(1, write_attempts)
        self._retry_backoff_s = retry_backoff_s
        self._writing_bytes = 0
        self._wakeup = trio.Event()
        self._space = trio.Event()
        self._done = trio.Event()
        self.stats = PersisterStats()

    @staticmethod
    def _now_ms() -> float:
        return trio.current_time() * 1000.0

    @property
    def buffered_records(self) -> int:
        """Records in the group being filled."""
        return self._acc.records

    @property
    def buffered_bytes(self) -> int:
        """Bytes waiting in the filling group plus the group being written."""
        return self._acc.size_bytes + self._writing_bytes

    async def wait_for_capacity(self) -> None:
        """Block while more than ``max_buffer_bytes`` are buffered (backpressure)."""
        while self.buffered_bytes >= self._max_buffer_bytes and not self._acc.closing:
            self._wakeup.set()  # memory pressure is a flush trigger too
            await self._space.wait()

    def append(self, appends: Sequence[PartitionAppend], on_durable: DurableCallback) -> None:
        """Add one request's appends; ``on_durable`` is called once, after the flush.

        Synchronous on purpose: the caller assigns offsets and appends without
        yielding in between, so groups hold offsets in sequencing order.

        Raises:
            RuntimeError: after ``close``.
        """
        self._acc.append(appends, on_durable, self._now_ms())
        self._wakeup.set()

    def close(self) -> None:
        """Flush what is buffered, then let ``run`` return. Idempotent."""
        if not self._acc.closing:
            self._acc.close()
            self._wakeup.set()

    async def wait_closed(self) -> None:
        """Wait until ``run`` has flushed everything after ``close``."""
        await self._done.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The flush loop; returns after ``close`` once everything is flushed."""
        task_status.started()
        try:
            while True:
                reason = self._acc.ready(self._now_ms())
                if reason is not None:
                    await self._flush(self._acc.drain(reason))
                    continue
                if self._acc.closing and self._acc.pending == 0:
                    return
                deadline_ms = self._acc.linger_deadline_ms()
                self._wakeup = trio.Event()
                with trio.move_on_at(deadline_ms / 1000.0 if deadline_ms is not None else float("inf")):
                    await self._wakeup.wait()
                if self.buffered_bytes >= self._max_buffer_bytes and self._acc.pending:
                    # Memory pressure (RecordAccumulator: "memory exhausted").
                    await self._flush(self._acc.drain(FlushReason.MEMORY))
        finally:
            self._done.set()

    async def _flush(self, group: FlushGroup[DurableCallback]) -> None:
        self._writing_bytes = group.size_bytes
        error: BaseException | None = None
        started = time.perf_counter()
        try:
            for attempt in range(1, self._write_attempts + 1):
                try:
                    # Not abandoned on cancel: a write in progress always finishes,
                    # so its outcome is known before anyone is answered.
                    await trio.to_thread.run_sync(self._writer, group.appends)
                    error = None
                    break
                except Exception as exc:  # Spark raises many types; all mean "not durable"
                    error = exc
                    log.warning(
                        "flush of %d records failed (attempt %d/%d): %s",
                        group.records, attempt, self._write_attempts, exc,
                    )
                    if attempt < self._write_attempts:
                        await trio.sleep(self._retry_backoff_s * 2 ** (attempt - 1))
        finally:
            self._writing_bytes = 0
            space, self._space = self._space, trio.Event()
            space.set()
        elapsed = time.perf_counter() - started
        stats = self.stats
        if error is None:
            stats.flushes += 1
            stats.records += group.records
            stats.bytes += group.size_bytes
            stats.write_seconds += elapsed
            stats.last_flush_records = group.records
            stats.last_flush_reason = group.reason.value if group.reason else ""
            log.debug("flushed %d records (%d bytes, %s) in %.0f ms",
                      group.records, group.size_bytes, stats.last_flush_reason, elapsed * 1000)
        else:
            stats.failed_flushes += 1
            log.error("giving up on a flush of %d records: %s", group.records, error)
        for on_durable in group.waiters:
            try:
                on_durable(error)
            except Exception:  # one bad callback must not strand the others
                log.exception("durable callback failed")
