"""What the RequestHandler hands to the persister: sequenced, still-opaque record batches.

A produce request's records stay raw RecordBatch v2 bytes on the network path
(decoding costs ~5-7 us per record); the handler only checks their CRC, counts
them and assigns offsets. They are decoded once, in the persister, when a flush
turns many appends into one Arrow table for one Spark write.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PartitionAppend:
    """The records of one topic-partition of one produce request, with offsets assigned.

    Attributes:
        topic: topic name.
        partition: partition index (>= 0).
        base_offset: offset given to the first record; record i of the batches
            (in wire order, counting across batches) gets ``base_offset + i``.
        records: the raw ``records`` field of the produce request for this
            partition: one or more concatenated RecordBatch v2 (magic 2),
            CRC-checked already. Possibly compressed.
        record_count: number of records across all batches in ``records``.
        log_append_time_ms: broker time (ms since epoch) when the handler
            appended it; used as the timestamp of batches whose attributes say
            LogAppendTime (timestampType 1).
        producer_id, producer_epoch, base_sequence: the idempotent producer
            fields of the first batch (-1 when the producer is not
            idempotent); kept so producer state can be rebuilt on recovery.
    """

    topic: str
    partition: int
    base_offset: int
    records: bytes
    record_count: int
    log_append_time_ms: int
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1

    def __reduce__(self):
        # Plain positional pickling: the default for slotted dataclasses looks
        # up fields() per object, which showed up in profiles of the decode
        # worker hand-off.
        return (PartitionAppend, (self.topic, self.partition, self.base_offset, self.records,
                                  self.record_count, self.log_append_time_ms, self.producer_id,
                                  self.producer_epoch, self.base_sequence))

    @property
    def size_bytes(self) -> int:
        """Size of the raw record batches, in bytes (what batch-max-bytes counts)."""
        return len(self.records)
