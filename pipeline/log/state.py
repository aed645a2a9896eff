"""How an append advances a partition's log: one definition for produce, persistence and recovery.

A partition's log end offset and its idempotent producers' state (last 5
batches per producer, Kafka ProducerStateManager) move together on every
append. Three places keep such a state: the live one the request handlers
sequence against (``LogManager.state``), the committed one the persister
checkpoints (what the table holds), and the one recovery rebuilds from the
checkpoint and the write-ahead log. All three advance through
``LogState.apply``.
"""

from __future__ import annotations


from pipeline.log.batch import PartitionAppend
from pipeline.log.checkpoint import Checkpoint
from pipeline.log.producer_state import ProducerStateManager, next_sequence
from pipeline.log.sequencing import OffsetSequencer


class LogState:
    """Log end offsets (``offsets``) and idempotent producer state (``producers``) of every partition."""

    __slots__ = ("offsets", "producers")

    def __init__(self) -> None:
        self.offsets = OffsetSequencer()
        self.producers = ProducerStateManager()

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> "LogState":
        """The state a checkpoint recorded (end offsets, producer rows)."""
        state = cls()
        for (topic, partition), end in checkpoint.end_offsets.items():
            state.offsets.restore(topic, partition, end)
        state.producers.restore(checkpoint.producers)
        return state

    def apply(self, append: PartitionAppend, ticket: object = None) -> None:
        """Advance by one sequenced append (Kafka UnifiedLog.append / ProducerAppendInfo).

        The log end offset becomes at least ``base_offset + record_count``;
        an idempotent producer's batch (producer id >= 0) becomes its last
        batch on the partition, with ``ticket`` kept to answer a retry of it;
        a transaction marker (base sequence -1) sets the producer's epoch there.
        Applying an append twice changes nothing (recovery may replay known ones).
        """
        a = append
        self.offsets.advance(a.topic, a.partition, a.base_offset + a.record_count)
        if a.producer_id >= 0 and a.base_sequence < 0:
            # A transaction marker (pipeline.log.control): base sequence -1, as Kafka's control batches.
            self.producers.end_transaction(a.producer_id, a.producer_epoch, a.topic, a.partition)
        elif a.producer_id >= 0:
            self.producers.update(a.producer_id, a.producer_epoch, a.topic, a.partition, a.base_sequence,
                                  next_sequence(a.base_sequence, a.record_count - 1), a.base_offset, ticket)

    def end_offsets(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> next offset."""
        return self.offsets.end_offsets()

    def forget_topic(self, topic: str) -> None:
        """Drop a deleted topic's offsets and producer state."""
        self.offsets.forget_topic(topic)
        self.producers.forget_topic(topic)
