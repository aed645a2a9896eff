"""Groups sequenced appends into flushes, and decides when to flush, without I/O.

A Spark write costs 200-300 ms however few rows it carries, so records of many
produce requests are grouped into one write. When a group is ready follows
Kafka's producer RecordAccumulator.ready(): the batch is full (records or
bytes), its linger time has passed since its first record, or the
accumulator is closing; and, when the policy has an idle time, once no
record has arrived for that long while the group is big enough to be worth
a commit (the input went quiet: a burst need not wait out a long commit
interval to become queryable). Time is an argument (ms, any monotonic origin); this
module never reads a clock.

Each ``append`` carries an opaque ``waiter`` (what to tell when the group
holding it is durable); a request's appends all land in one group, so a
produce response waits for exactly one flush.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Generic, Sequence, TypeVar

from pipeline.log.batch import PartitionAppend

W = TypeVar("W")


class FlushReason(enum.Enum):
    """Why a group was flushed (Kafka RecordAccumulator.ready conditions)."""

    FULL_RECORDS = "batch-max-records"
    FULL_BYTES = "batch-max-bytes"
    LINGER = "linger-ms"
    IDLE = "idle-ms"
    MEMORY = "buffer-memory"
    CLOSING = "closing"
    RECOVERY = "recovery"  # the WAL backlog written once Spark is up (not an accumulator decision)


@dataclass(frozen=True, slots=True)
class FlushPolicy:
    """Limits of one flush group.

    Attributes:
        max_records: flush once a group holds at least this many records.
        max_bytes: flush once a group holds at least this many bytes of raw
            record batches.
        linger_ms: flush once this many ms have passed since the group's first
            append (0 flushes as soon as the persister is free).
        idle_ms: also flush once this many ms have passed since the group's
            last append, if it holds at least ``idle_min_bytes``; 0: never
            (only linger). Shorter than ``linger_ms`` to be of use.
        idle_min_bytes: the smallest group an idle flush takes (bytes): a
            trickle below it keeps waiting for linger, so it is not written
            as one small file per quiet gap.

    Raises:
        ValueError: a limit below 1 (records, bytes) or below 0 (times, idle bytes).
    """

    max_records: int = 200_000
    max_bytes: int = 64 * 1024 * 1024
    linger_ms: float = 50.0
    idle_ms: float = 0.0
    idle_min_bytes: int = 0

    def __post_init__(self) -> None:
        if (self.max_records < 1 or self.max_bytes < 1 or self.linger_ms < 0 or self.idle_ms < 0
                or self.idle_min_bytes < 0):
            raise ValueError(f"invalid flush policy {self}")


@dataclass(slots=True)
class FlushGroup(Generic[W]):
    """What one flush writes and whom it answers.

    Attributes:
        appends: partition appends in sequencing order.
        waiters: one per ``append`` call, in call order.
        records: total records.
        size_bytes: total ``PartitionAppend.size_bytes`` (decompressed bytes).
        reason: why it was flushed.
    """

    appends: list[PartitionAppend] = field(default_factory=list)
    waiters: list[W] = field(default_factory=list)
    records: int = 0
    size_bytes: int = 0
    reason: FlushReason | None = None


class RecordAccumulator(Generic[W]):
    """The group being filled, and the flush decision.

    Args:
        policy: the flush limits.
    """

    def __init__(self, policy: FlushPolicy) -> None:
        self.policy = policy
        self._group: FlushGroup[W] = FlushGroup()
        self._first_append_ms: float | None = None
        self._closing = False
        self._marks: list[tuple[int, int, int, float]] = []
        """Per waiter of the group, after its ``append``: (appends, records, bytes) so far, and its time (ms)."""

    @property
    def records(self) -> int:
        """Records in the group being filled."""
        return self._group.records

    @property
    def size_bytes(self) -> int:
        """Bytes in the group being filled."""
        return self._group.size_bytes

    @property
    def pending(self) -> int:
        """Waiters in the group being filled (``append`` calls since the last drain)."""
        return len(self._group.waiters)

    @property
    def closing(self) -> bool:
        return self._closing

    def append(self, appends: Sequence[PartitionAppend], waiter: W, now_ms: float) -> None:
        """Add the appends of one request to the current group.

        Raises:
            RuntimeError: after ``close``.
        """
        if self._closing:
            raise RuntimeError("accumulator is closed")
        group = self._group
        if not group.waiters:
            self._first_append_ms = now_ms
        group.appends.extend(appends)
        group.waiters.append(waiter)
        records = size = 0
        for a in appends:  # a loop, not two generators: this runs once per produce request
            records += a.record_count
            size += a.size_bytes
        group.records += records
        group.size_bytes += size
        self._marks.append((len(group.appends), group.records, group.size_bytes, now_ms))

    def close(self) -> None:
        """Stop taking appends; whatever is buffered becomes ready (reason CLOSING)."""
        self._closing = True

    def ready(self, now_ms: float) -> FlushReason | None:
        """Whether the current group should be flushed now, and why."""
        group = self._group
        if not group.waiters:
            return None
        if group.records >= self.policy.max_records:
            return FlushReason.FULL_RECORDS
        if group.size_bytes >= self.policy.max_bytes:
            return FlushReason.FULL_BYTES
        if self._closing:
            return FlushReason.CLOSING
        assert self._first_append_ms is not None
        if now_ms - self._first_append_ms >= self.policy.linger_ms:
            return FlushReason.LINGER
        idle = self._idle_deadline_ms()
        if idle is not None and now_ms >= idle:
            return FlushReason.IDLE
        return None

    def deadline_ms(self) -> float | None:
        """When the current group becomes ready by time (ms): its linger expires, or its input
        has been idle for ``idle_ms`` (if it is big enough); None if it is empty."""
        if self._first_append_ms is None or not self._group.waiters:
            return None
        linger = self._first_append_ms + self.policy.linger_ms
        idle = self._idle_deadline_ms()
        return linger if idle is None else min(linger, idle)

    def _idle_deadline_ms(self) -> float | None:
        policy = self.policy
        if not policy.idle_ms or not self._marks or self._group.size_bytes < policy.idle_min_bytes:
            return None
        return self._marks[-1][3] + policy.idle_ms

    def drain(self, reason: FlushReason) -> FlushGroup[W]:
        """Take the current group for flushing, at most up to the policy's limits.

        Waiters are taken in order, whole (a waiter's appends never split),
        until the taken ones reach ``max_records`` or ``max_bytes``, as the
        group would have been drained had its flusher been free when it
        filled; the rest stay, as the next group, with the linger clock of
        its first append. Without that cap a group keeps growing while the
        previous flush is written (a Spark write can take seconds), and one
        Spark append of the whole ``buffer.memory`` ran a 1 GiB driver heap
        out of memory (issue 13).
        """
        group, marks, policy = self._group, self._marks, self.policy
        take = len(marks)
        for i, (_, records, size, _) in enumerate(marks):
            if records >= policy.max_records or size >= policy.max_bytes:
                take = i + 1
                break
        if take >= len(marks):
            self._group, self._marks = FlushGroup(), []
            group.reason = reason
            self._first_append_ms = None
            return group
        appends, records, size, _ = marks[take - 1]
        taken = FlushGroup(group.appends[:appends], group.waiters[:take], records, size, reason)
        self._group = FlushGroup(group.appends[appends:], group.waiters[take:], group.records - records,
                                 group.size_bytes - size)
        self._marks = [(a - appends, r - records, b - size, t) for a, r, b, t in marks[take:]]
        self._first_append_ms = marks[take][3]
        return taken
