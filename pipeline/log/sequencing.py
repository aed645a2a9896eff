"""The offset sequencer, without I/O.

``OffsetSequencer``: one per server. Assigns each topic-partition's offsets
as a gapless sequence 0, 1, 2, ... in the order appends are sequenced (Kafka
Log.append assigns offsets from the log end offset under the partition lock).
"""

from __future__ import annotations


class OffsetSequencer:
    """Log end offsets per topic-partition; hands out contiguous offset ranges.

    Offsets of a partition start at 0 (or where ``restore`` says) and have no
    gaps: ``assign(tp, n)`` returns the base offset ``b`` and the records get
    ``b .. b+n-1`` (Kafka Log.append / LogOffsetMetadata).
    """

    __slots__ = ("_log_end",)

    def __init__(self) -> None:
        self._log_end: dict[tuple[str, int], int] = {}

    def assign(self, topic: str, partition: int, record_count: int) -> int:
        """Reserve ``record_count`` (>= 1) offsets; returns the first one.

        Raises:
            ValueError: record_count < 1.
        """
        if record_count < 1:
            raise ValueError(f"record_count must be >= 1, got {record_count}")
        key = (topic, partition)
        base = self._log_end.get(key, 0)
        self._log_end[key] = base + record_count
        return base

    def log_end_offset(self, topic: str, partition: int) -> int:
        """The offset the next record of this partition will get."""
        return self._log_end.get((topic, partition), 0)

    def advance(self, topic: str, partition: int, next_offset: int) -> None:
        """Make sure the partition continues at or after ``next_offset`` (never moves back)."""
        key = (topic, partition)
        if next_offset > self._log_end.get(key, 0):
            self._log_end[key] = next_offset

    def end_offsets(self) -> dict[tuple[str, int], int]:
        """A copy of every partition's log end offset."""
        return dict(self._log_end)

    def forget_topic(self, topic: str) -> None:
        """Drop a deleted topic's partitions (a topic re-created later starts at 0)."""
        for key in [k for k in self._log_end if k[0] == topic]:
            del self._log_end[key]

    def restore(self, topic: str, partition: int, next_offset: int) -> None:
        """Continue a partition at ``next_offset`` (after recovery from storage)."""
        if next_offset < 0:
            raise ValueError(f"next_offset must be >= 0, got {next_offset}")
        self._log_end[(topic, partition)] = next_offset
