"""Start-up recovery: bring the table up to date with the WAL, rebuild offsets and producer state.

Runs before the server listens (blocking). Steps:

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
from dataclasses import dataclass
from typing import Callable, Protocol

from pipeline.persist.accumulator import FlushPolicy
from pipeline.log.batch import PartitionAppend
from pipeline.persist.persister import GroupSink, offset_ranges
from pipeline.log.state import LogState
from pipeline.log.checkpoint import Checkpoint, StateStore
from pipeline.log.wal import WalPosition, WriteAheadLog, decode_appends

log = logging.getLogger(__name__)


class TableSink(GroupSink, Protocol):
    """A GroupSink that can also tell each partition's end offset (recovery without a checkpoint)."""

    def end_offsets(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> max(offset) + 1 over the whole table."""


@dataclass(slots=True)
class Recovered:
    """What recovery found and did.

    Attributes:
        checkpoint: the state to continue from (table and WAL agree with it).
        replayed_records: records written from the WAL now.
        skipped_records: WAL records already in the table (not written again).
    """

    checkpoint: Checkpoint
    replayed_records: int = 0
    skipped_records: int = 0


DEFAULT_POLICY = FlushPolicy()
"""``recover``'s chunking when the caller gives none: ``FlushPolicy``'s defaults."""


def recover(sink: TableSink, wal: WriteAheadLog, store: StateStore,
            visit: Callable[[WalPosition, int, memoryview], None] | None = None,
            policy: FlushPolicy = DEFAULT_POLICY) -> Recovered:
    """See the module docstring. Blocking.

    ``visit`` sees every retained WAL entry (``WriteAheadLog.open``): the read
    side indexes the log with it. ``policy``: the replay's writes hold at most
    its ``max_records`` / ``max_bytes`` (whole appends; its linger is unused).

    Raises:
        pipeline.log.wal.WalCorruptionError: the WAL is damaged before its tail.
        Whatever Spark raises if the table cannot be read or written.
    """
    checkpoint = store.load()
    had_checkpoint = checkpoint is not None
    if checkpoint is None:
        checkpoint = Checkpoint(end_offsets=sink.end_offsets())
        for (topic, partition) in checkpoint.end_offsets:
            checkpoint.topics[topic] = max(checkpoint.topics.get(topic, 0), partition + 1)
        if checkpoint.end_offsets:
            log.info("no checkpoint: took end offsets of %d partitions from the table",
                     len(checkpoint.end_offsets))
    pending = wal.open(checkpoint.wal_position, visit)
    appends = [a for e in pending for a in decode_appends(e.payload)]
    result = Recovered(checkpoint)
    if appends:
        present = sink.present_offsets(offset_ranges(appends))
        total = sum(a.record_count for a in appends)
        result.skipped_records = len(present)
        result.replayed_records = total - len(present)
        if result.replayed_records:
            for chunk in _chunks(appends, policy):
                if any((a.topic, a.partition, o) not in present
                       for a in chunk for o in range(a.base_offset, a.base_offset + a.record_count)):
                    sink.write(sink.to_table(chunk), present)
        log.info("recovery: %d WAL records after the checkpoint, %d written now, %d already in the table",
                 total, result.replayed_records, result.skipped_records)
    state = LogState.from_checkpoint(checkpoint)
    for a in appends:
        state.apply(a)
        checkpoint.topics[a.topic] = max(checkpoint.topics.get(a.topic, 0), a.partition + 1)
    checkpoint.end_offsets = state.end_offsets()
    checkpoint.producers = state.producers.snapshot()
    if pending:
        checkpoint.wal_position = pending[-1].position
    if pending or not had_checkpoint:
        store.save(checkpoint)
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
