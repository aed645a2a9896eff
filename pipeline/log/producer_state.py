"""Idempotent producer state: sequence checks per (producer id, topic-partition), no I/O.

An idempotent producer (KIP-98) numbers its batches per partition; the broker
keeps, per producer and partition, the epoch and the last few batches'
sequence ranges and offsets, so that a retried batch is recognised and
answered with its original offset instead of being stored twice, and a gap is
refused (Kafka ProducerStateManager / ProducerAppendInfo). Kafka keeps the last
5 batches because a producer has at most 5 requests in flight per connection.

The state can be exported and imported (``snapshot`` / ``restore``) so it
survives restarts with the table and the write-ahead log.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Iterable

from kio.schema.errors import ErrorCode

from pipeline.fastinit import fast_frozen_init

NO_PRODUCER_ID = -1
MAX_SEQUENCE = 2**31 - 1
BATCHES_KEPT = 5
"""Batch metadata kept per producer-partition (Kafka ProducerStateEntry.NumBatchesToRetain)."""


class Verdict(enum.Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    ERROR = "error"


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """One appended batch of a producer on one partition.

    Attributes:
        first_seq, last_seq: its sequence range (inclusive).
        base_offset: offset given to its first record.
        ticket: what the server keeps to answer a duplicate (e.g. the
            durability handle of the original append); not exported.
    """

    first_seq: int
    last_seq: int
    base_offset: int
    ticket: object = None


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class SequenceCheck:
    """Outcome of ``ProducerStateManager.check``.

    Attributes:
        verdict: APPEND (new batch), DUPLICATE (already appended: answer with
            ``duplicate.base_offset``), ERROR (answer ``error_code``).
        error_code: Kafka error code when verdict is ERROR, else 0.
        duplicate: the original batch when verdict is DUPLICATE.
        unknown_producer: APPEND of a batch whose producer has no state on the
            partition here and whose first sequence is not 0 (Kafka accepts it;
            the request handler refuses it retriably a few times first,
            ``UnknownProducers``).
    """

    verdict: Verdict
    error_code: int = 0
    duplicate: BatchMetadata | None = None
    unknown_producer: bool = False


_APPEND = SequenceCheck(Verdict.APPEND)
"""The common verdict, made once (``check`` runs for every partition of every produce)."""
_APPEND_UNKNOWN = SequenceCheck(Verdict.APPEND, unknown_producer=True)
"""APPEND for a producer with no state here whose batch does not start at sequence 0."""


def next_sequence(seq: int, count: int = 1) -> int:
    """Sequence ``count`` after ``seq``; sequences wrap from 2^31-1 to 0 (Kafka DefaultRecordBatch)."""
    return (seq + count) % (MAX_SEQUENCE + 1)


class _Entry:
    __slots__ = ("epoch", "batches")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.batches: deque[BatchMetadata] = deque(maxlen=BATCHES_KEPT)


class ProducerStateManager:
    """Per (producer id, topic, partition): epoch and the last 5 batches."""

    def __init__(self) -> None:
        self._entries: dict[tuple[int, str, int], _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def check(self, producer_id: int, epoch: int, topic: str, partition: int,
              first_seq: int, last_seq: int) -> SequenceCheck:
        """Judge a batch before it is appended (does not change state).

        Rules (Kafka ProducerAppendInfo.checkProducerEpoch / checkSequence):
        an older epoch is fenced (INVALID_PRODUCER_EPOCH); a newer epoch must
        start at sequence 0; within an epoch a batch equal to one of the last 5
        is a duplicate, and otherwise must start right after the last one
        (OUT_OF_ORDER_SEQUENCE_NUMBER). A producer this broker has no state for
        on the partition is accepted at any sequence (``unknown_producer`` set
        when it is not 0), as Kafka does since 2.5 (KIP-360: "if there is no
        current producer epoch ... accept writes with any sequence number").
        The UNKNOWN_PRODUCER_ID of older brokers makes librdkafka bump its
        epoch and renumber every message it has not seen acknowledged, on every
        partition, so that those another broker committed unanswered (a paused
        or killed leader) are written twice.
        """
        if producer_id == NO_PRODUCER_ID:
            return _APPEND
        entry = self._entries.get((producer_id, topic, partition))
        if entry is None:
            return _APPEND if first_seq == 0 else _APPEND_UNKNOWN
        if epoch < entry.epoch:
            # Fenced, also when a transaction marker with a newer epoch is all it wrote here.
            return SequenceCheck(Verdict.ERROR, ErrorCode.invalid_producer_epoch.value)
        if not entry.batches:  # only a transaction marker's epoch: its next batch starts at 0
            if first_seq == 0:
                return _APPEND
            return SequenceCheck(Verdict.ERROR, ErrorCode.out_of_order_sequence_number.value)
        if epoch < entry.epoch:
            return SequenceCheck(Verdict.ERROR, ErrorCode.invalid_producer_epoch.value)
        if epoch > entry.epoch:
            if first_seq == 0:
                return _APPEND
            return SequenceCheck(Verdict.ERROR, ErrorCode.out_of_order_sequence_number.value)
        for batch in entry.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return SequenceCheck(Verdict.DUPLICATE, duplicate=batch)
        if first_seq != next_sequence(entry.batches[-1].last_seq):
            return SequenceCheck(Verdict.ERROR, ErrorCode.out_of_order_sequence_number.value)
        return _APPEND

    def update(self, producer_id: int, epoch: int, topic: str, partition: int,
               first_seq: int, last_seq: int, base_offset: int, ticket: object = None) -> None:
        """Record an appended batch (after ``check`` said APPEND, or on recovery)."""
        if producer_id == NO_PRODUCER_ID:
            return
        key = (producer_id, topic, partition)
        entry = self._entries.get(key)
        if entry is None or epoch > entry.epoch:
            entry = self._entries[key] = _Entry(epoch)
        elif epoch < entry.epoch:
            # Fenced already (``check`` refuses it live); the committed state can see a
            # transaction's records reach the table after a fence's marker moved the epoch on.
            return
        elif entry.batches and base_offset <= entry.batches[-1].base_offset:
            # Already applied: recovery replays WAL entries after a checkpoint that a
            # transaction held back (pipeline.persist.persister), some of them known to it.
            return
        entry.batches.append(BatchMetadata(first_seq, last_seq, base_offset, ticket))

    def end_transaction(self, producer_id: int, epoch: int, topic: str, partition: int) -> None:
        """A transaction marker of ``producer_id`` at ``epoch`` was appended to the partition.

        Kafka ProducerAppendInfo.appendEndTxnMarker: a marker with a newer epoch (the
        coordinator fenced the producer, or aborted its timed-out transaction) makes that
        epoch the partition's, with no batches: the old epoch is fenced here from now on,
        and the new one starts at sequence 0. A marker at the current epoch keeps the batches
        (the producer's next transaction continues its sequence).
        """
        key = (producer_id, topic, partition)
        entry = self._entries.get(key)
        if entry is None or epoch > entry.epoch:
            self._entries[key] = _Entry(epoch)

    def epoch(self, producer_id: int, topic: str, partition: int) -> int | None:
        """The producer's epoch on the partition, None without state there."""
        entry = self._entries.get((producer_id, topic, partition))
        return None if entry is None else entry.epoch

    def batches(self, producer_id: int, topic: str, partition: int) -> list[BatchMetadata]:
        """The producer's last batches kept on the partition (at most ``BATCHES_KEPT``), oldest first."""
        entry = self._entries.get((producer_id, topic, partition))
        return [] if entry is None else list(entry.batches)

    def active(self, topic: str, partition: int) -> list[tuple[int, int, int]]:
        """(producer id, epoch, last sequence or -1) of each producer with state on the partition,
        by producer id (Kafka DescribeProducers' ``active_producers``)."""
        return sorted((pid, entry.epoch, entry.batches[-1].last_seq if entry.batches else -1)
                      for (pid, t, p), entry in self._entries.items() if t == topic and p == partition)

    def forget_topic(self, topic: str) -> None:
        """Drop the state of a deleted topic's partitions."""
        for key in [k for k in self._entries if k[1] == topic]:
            del self._entries[key]

    def forget_partition(self, topic: str, partition: int) -> None:
        """Drop one partition's state (its new state comes from elsewhere: a leadership move)."""
        for key in [k for k in self._entries if k[1] == topic and k[2] == partition]:
            del self._entries[key]

    def snapshot(self) -> list[list]:
        """JSON-ready rows ``[pid, epoch, topic, partition, first_seq, last_seq, base_offset]``."""
        rows = []
        for (pid, topic, partition), entry in self._entries.items():
            if not entry.batches:  # only a marker's epoch: first_seq -1 says so
                rows.append([pid, entry.epoch, topic, partition, -1, -1, -1])
            for b in entry.batches:
                rows.append([pid, entry.epoch, topic, partition, b.first_seq, b.last_seq, b.base_offset])
        return rows

    def restore(self, rows: Iterable[list]) -> None:
        """Load rows from ``snapshot`` (in their order), on top of the current state."""
        for pid, epoch, topic, partition, first_seq, last_seq, base_offset in rows:
            if first_seq < 0:
                self.end_transaction(pid, epoch, topic, partition)
            else:
                self.update(pid, epoch, topic, partition, first_seq, last_seq, base_offset)


REFUSALS_KEPT = 10_000
"""Connections' partitions ``RefusedPartitions`` remembers at most (the oldest is forgotten first)."""


class RefusedPartitions:
    """Per connection, the partitions whose last produce this broker refused with a retriable error,
    unwritten (NOT_LEADER_OR_FOLLOWER while it takes a partition over, REQUEST_TIMED_OUT while
    persistence is stalled, KAFKA_STORAGE_ERROR), until a batch of the partition from that connection
    is appended or answered as a duplicate.

    A producer pipelines up to 5 requests per connection. When the first is refused and the next
    arrives once the cause is gone (the take-over done), the next batch's sequence leaves a gap, and
    Kafka's rules answer OUT_OF_ORDER_SEQUENCE_NUMBER (a producer with no state here at all is
    ``UnknownProducers``' case). librdkafka takes it for "an earlier request failed" and bumps its
    epoch (KIP-360, ``rd_kafka_idemp_drain_epoch_bump``): it renumbers, on every partition, each
    message it has not seen acknowledged, including those of requests that timed out at another
    broker that went on to write them, which are then written twice. ``gap_error`` gives such a
    batch the first refusal's error instead, and the client retries the batches in order with their
    sequences. Keyed by connection,
    not producer: a Kafka client has one producer id. No I/O; the request handlers share one (a
    connection's requests reach them in order).
    """

    def __init__(self, kept: int = REFUSALS_KEPT) -> None:
        self._kept = kept
        self._errors: dict[tuple[str, str, int], int] = {}  # insertion order: oldest first

    def __bool__(self) -> bool:
        return bool(self._errors)

    def refused(self, connection_id: str, topic: str, partition: int, error_code: int) -> None:
        """A produce of ``topic``-``partition`` from ``connection_id`` was answered ``error_code``,
        unwritten. Only retriable errors are kept (a client retries the batch with its sequence)."""
        if not ErrorCode(error_code).retriable:
            return
        key = (connection_id, topic, partition)
        self._errors.pop(key, None)
        self._errors[key] = error_code
        if len(self._errors) > self._kept:
            del self._errors[next(iter(self._errors))]

    def accepted(self, connection_id: str, topic: str, partition: int) -> None:
        """A batch of ``topic``-``partition`` from ``connection_id`` was appended or was a duplicate:
        the retries caught up."""
        self._errors.pop((connection_id, topic, partition), None)

    def gap_error(self, connection_id: str, topic: str, partition: int) -> int | None:
        """The error to answer a batch from ``connection_id`` with a sequence gap (Kafka's rules answer
        OUT_OF_ORDER_SEQUENCE_NUMBER): the refusal before it, if one is kept, else None."""
        return self._errors.get((connection_id, topic, partition))


UNKNOWN_PRODUCER_REFUSALS = 5
"""How many times in a row ``UnknownProducers`` refuses one batch before it is accepted (Kafka's rule)."""


class UnknownProducers:
    """Batches of idempotent producers this broker has no state of on a partition, with a first sequence
    other than 0 (``SequenceCheck.unknown_producer``), refused with a retriable error a few times before
    Kafka's rule accepts them.

    Kafka since 2.5 accepts such a batch at any sequence (KIP-360; the producer's state expired with
    its records). Here it comes mostly from a leadership move: the producer's earlier batches of the
    partition were refused unwritten by the partition's previous leader (NOT_LEADER_OR_FOLLOWER) and
    are on their way again, behind this one (librdkafka sent a later batch to the new leader first, in
    the fault test, session 55). Accepted at once, it would be written ahead of them and they would
    then be refused OUT_OF_ORDER_SEQUENCE_NUMBER; answered UNKNOWN_PRODUCER_ID (older Kafka), librdkafka
    bumps its epoch and renumbers, on every partition, each message it has not seen acknowledged,
    including those another broker wrote unanswered, which are then written twice. A retriable refusal
    lets the client retry the partition's messages in their order; the same batch refused
    ``refusals`` times in a row is accepted (the earlier batches are not coming). No I/O; bounded.
    """

    def __init__(self, refusals: int = UNKNOWN_PRODUCER_REFUSALS, kept: int = REFUSALS_KEPT) -> None:
        self._refusals = refusals
        self._kept = kept
        self._refused: dict[tuple[int, str, int], tuple[int, int]] = {}  # -> (first sequence, times); oldest first

    def refuse(self, producer_id: int, topic: str, partition: int, first_seq: int) -> bool:
        """Whether to refuse this batch (a producer unknown here, first sequence not 0) once more: False
        once the same batch was refused ``refusals`` times in a row (then accept it)."""
        key = (producer_id, topic, partition)
        seq, times = self._refused.pop(key, (first_seq, 0))
        if seq != first_seq:
            times = 0
        if times >= self._refusals:
            return False
        self._refused[key] = (first_seq, times + 1)
        if len(self._refused) > self._kept:
            del self._refused[next(iter(self._refused))]
        return True

    def appended(self, producer_id: int, topic: str, partition: int) -> None:
        """A batch of the producer was appended to the partition (its state is known here now)."""
        if self._refused:
            self._refused.pop((producer_id, topic, partition), None)

