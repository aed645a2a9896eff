"""Start-up recovery: bring the table up to date with the WAL, rebuild offsets and producer state.

Two halves. ``recover_log`` needs no JVM: it loads the checkpoint, opens the
WAL and rebuilds offsets and producer state, so the server can listen and
acknowledge produce at the WAL while Spark starts (``--ack-on wal``); the WAL
entries after the checkpoint are its ``backlog``, which the persister writes to
the table first once Spark is up (``BatchingPersister(backlog=...)``).
``recover`` runs both halves at once, blocking (``--ack-on spark``, tools).
Steps:

1. Load the checkpoint (``state.py``). Without one (a new data dir, or a
   table written before checkpoints existed), ask the table for each
   partition's end offset.
2. Open the WAL: a torn tail (an append whose fsync never returned, so never
   acknowledged) is cut off; corruption in the middle stops the start.
3. WAL entries after the checkpoint's position may or may not be in the table
   (a crash can fall between the Spark commit and the checkpoint). Ask the
   table which of their offsets it already holds and write only the others,
   in Spark writes of at most the flush policy's records and bytes (a
   backlog of a whole ``buffer.memory`` in one write can run the driver out
   of memory): replay never duplicates a row.
4. Rebuild: every partition continues at the next offset after the highest
   one in the table or the WAL; idempotent producer state is the checkpoint's
   plus the replayed batches, so a producer retrying across the restart is
   answered with its original offsets. Save a new checkpoint; truncate the WAL.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Collection, Protocol

from pipeline.persist.accumulator import FlushPolicy
from pipeline.log.batch import PartitionAppend
from pipeline.persist.persister import GroupSink, offset_ranges
from pipeline.log.state import LogState
from pipeline.log.checkpoint import Checkpoint, StateStore
from pipeline.log.control import ABORT, CONTROL, DATA, TRANSACTIONAL, batch_kind, marker_type
from pipeline.log.wal import WalPosition, WriteAheadLog, decode_appends

log = logging.getLogger(__name__)


class TableSink(GroupSink, Protocol):
    """A GroupSink that can also tell each partition's end offset (recovery without a checkpoint)."""

    def end_offsets(self, topics: Collection[str] | None = None) -> dict[tuple[str, int], int]:
        """(topic, partition) -> max(offset) + 1 over the whole table, or over the rows of ``topics``."""


Backlog = list[tuple[WalPosition, list[PartitionAppend]]]
"""WAL entries after the checkpoint, oldest first: (the entry's end position, its appends)."""


@dataclass(slots=True)
class Recovered:
    """What recovery found and did.

    Attributes:
        checkpoint: the state to continue from: the stored checkpoint plus the backlog
            (every partition's next offset, producer state, topics).
        stored: the checkpoint as stored (or taken from the table): what the table is
            known to hold; the backlog goes on top of it.
        backlog: WAL entries after ``stored.wal_position`` (``recover`` empties it once written).
        replayed_records: records written from the WAL now.
        skipped_records: WAL records already in the table (not written again).
    """

    checkpoint: Checkpoint
    stored: Checkpoint = field(default_factory=Checkpoint)
    backlog: Backlog = field(default_factory=list)
    replayed_records: int = 0
    skipped_records: int = 0

    @property
    def backlog_records(self) -> int:
        return sum(a.record_count for _, appends in self.backlog for a in appends)


DEFAULT_POLICY = FlushPolicy()
"""``recover``'s chunking when the caller gives none: ``FlushPolicy``'s defaults."""


def recover_log(wal: WriteAheadLog, store: StateStore,
                visit: Callable[[WalPosition, int, memoryview], None] | None = None,
                end_offsets: Callable[[], dict[tuple[str, int], int]] | None = None) -> Recovered:
    """Steps 1, 2 and 4 of the module docstring, without touching the table unless there is no
    checkpoint. Blocking; needs no JVM when a checkpoint exists. Saves nothing: the checkpoint
    moves once the backlog is in the table.

    Args:
        visit: sees every retained WAL entry (``WriteAheadLog.open``): the read side indexes the log with it.
        end_offsets: the table's (topic, partition) -> max(offset) + 1 (``TableSink.end_offsets``),
            asked only when there is no checkpoint; None: the table is known to be empty then.

    Raises:
        pipeline.log.wal.WalCorruptionError: the WAL is damaged before its tail.
    """
    stored = store.load()
    if stored is None:
        stored = Checkpoint(end_offsets=end_offsets() if end_offsets is not None else {})
        for (topic, partition) in stored.end_offsets:
            stored.topics[topic] = max(stored.topics.get(topic, 0), partition + 1)
        if stored.end_offsets:
            log.info("no checkpoint: took end offsets of %d partitions from the table", len(stored.end_offsets))
    pending = wal.open(stored.wal_position, visit)
    backlog: Backlog = [(e.position, decode_appends(e.payload)) for e in pending]
    state = LogState.from_checkpoint(stored)
    checkpoint = Checkpoint(stored.wal_position, dict(stored.end_offsets), list(stored.producers), dict(stored.topics))
    for _, appends in backlog:
        for a in appends:
            state.apply(a)
            checkpoint.topics[a.topic] = max(checkpoint.topics.get(a.topic, 0), a.partition + 1)
    checkpoint.end_offsets = state.end_offsets()
    checkpoint.producers = state.producers.snapshot()
    if backlog:
        checkpoint.wal_position = backlog[-1][0]
    return Recovered(checkpoint, stored, backlog)


def settle_transactions(backlog: Backlog) -> tuple[Backlog, list[PartitionAppend]]:
    """Split a dead broker's WAL backlog by what its transactions' markers say (KIP-98), as the
    persister's routing does live (``BatchingPersister._route``): a transaction's records with a
    COMMIT marker later in the backlog go to the table (in the marker's entry), those with an ABORT
    marker never do, and those with no marker yet are the transaction's *open* appends: the table
    must not get them until their marker is written by the partition's next leader
    (``pipeline.cluster.service`` adopts them). Markers themselves are never rows. Pure.

    Returns:
        (the backlog for the table: its data appends and committed transactions' appends, in WAL
        order; the open transactions' appends, in WAL order).
    """
    held: dict[tuple[int, str, int], list[PartitionAppend]] = {}
    out: Backlog = []
    for position, appends in backlog:
        kept: list[PartitionAppend] = []
        for a in appends:
            kind = batch_kind(a.records)
            if kind == TRANSACTIONAL:
                held.setdefault((a.producer_id, a.topic, a.partition), []).append(a)
            elif kind == CONTROL:
                mine = held.pop((a.producer_id, a.topic, a.partition), [])
                if marker_type(a.records) != ABORT:
                    kept.extend(mine)
            else:
                kept.append(a)
        if kept:
            out.append((position, kept))
    open_ = sorted((a for appends in held.values() for a in appends), key=lambda a: (a.topic, a.partition,
                                                                                      a.base_offset))
    return out, open_


def replay(sink: TableSink, backlog: Backlog, policy: FlushPolicy = DEFAULT_POLICY,
           present: set[tuple[str, int, int]] | None = None) -> tuple[int, int]:
    """Step 3: write the backlog's records the table does not hold yet, in writes of at most
    ``policy``'s records and bytes (whole appends). Blocking.

    ``present``: the backlog's (topic, partition, offset) rows the table holds, when the caller
    knows them; None: read from the table (``TableSink.present_offsets``).

    Returns:
        (records written, records already in the table).

    Raises:
        Whatever Spark raises if the table cannot be read or written.
    """
    appends = [a for _, entry in backlog for a in entry]
    if not appends:
        return 0, 0
    if present is None:
        present = sink.present_offsets(offset_ranges(appends))
    total = sum(a.record_count for a in appends)
    if len(present) < total:
        for chunk in _chunks(appends, policy):
            if any((a.topic, a.partition, o) not in present
                   for a in chunk for o in range(a.base_offset, a.base_offset + a.record_count)):
                sink.write(sink.to_table(chunk), present)
    return total - len(present), len(present)


def recover(sink: TableSink, wal: WriteAheadLog, store: StateStore,
            visit: Callable[[WalPosition, int, memoryview], None] | None = None,
            policy: FlushPolicy = DEFAULT_POLICY) -> Recovered:
    """See the module docstring: ``recover_log``, then ``replay``, then the checkpoint. Blocking.

    ``visit`` sees every retained WAL entry (``WriteAheadLog.open``): the read
    side indexes the log with it. ``policy``: the replay's writes hold at most
    its ``max_records`` / ``max_bytes`` (whole appends; its linger is unused).

    Raises:
        pipeline.log.wal.WalCorruptionError: the WAL is damaged before its tail.
        Whatever Spark raises if the table cannot be read or written.
    """
    had_checkpoint = store.load() is not None
    result = recover_log(wal, store, visit, lambda: sink.end_offsets())
    if any(batch_kind(a.records) != DATA for _, appends in result.backlog for a in appends):
        # Transactions in the backlog: only the persister knows which of their records may
        # reach the table (BatchingPersister(backlog=...) holds and releases them), so the
        # backlog is left to it, as with ``recover_log``.
        log.info("recovery: %d WAL records after the checkpoint include transactions; the persister "
                 "writes them", result.backlog_records)
        return result
    if result.backlog:
        total = result.backlog_records
        result.replayed_records, result.skipped_records = replay(sink, result.backlog, policy)
        log.info("recovery: %d WAL records after the checkpoint, %d written now, %d already in the table",
                 total, result.replayed_records, result.skipped_records)
    checkpoint = result.checkpoint
    if result.backlog or not had_checkpoint:
        store.save(checkpoint)
    result.stored, result.backlog = checkpoint, []
    if checkpoint.wal_position is not None and visit is None:
        # With a read side the WAL is the log consumers fetch from: its
        # retention (LogManager.wal_cut) decides what goes, not the checkpoint.
        wal.truncate_before(checkpoint.wal_position)
    return result


def _chunks(appends: list[PartitionAppend], policy: FlushPolicy) -> list[list[PartitionAppend]]:
    """``appends`` in order, cut into runs that each reach ``policy``'s records or bytes only with their
    last append (as the persister's flushes are)."""
    chunks: list[list[PartitionAppend]] = [[]]
    records = size = 0
    for a in appends:
        if records >= policy.max_records or size >= policy.max_bytes:
            chunks.append([])
            records = size = 0
        chunks[-1].append(a)
        records += a.record_count
        size += a.size_bytes
    return chunks if chunks[0] else []
