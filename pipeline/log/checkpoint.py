"""The checkpoint beside the table: what the table holds, and where the WAL may be cut.

After every Spark commit the persister saves a ``Checkpoint``: the end offset
of every partition in the table, the committed idempotent-producer state
(last 5 batches per producer-partition), the topics and their partition
counts, and the WAL position the commit covers. The WAL is truncated only
before that position, so on restart: the checkpoint says what is in the table,
and the WAL entries after its position are what may still be missing (they are
checked against the table before being written, so replay never duplicates).

Saved atomically (write a temporary file, fsync, rename, fsync the directory),
as JSON at ``DATA_DIR/_pipeline/checkpoint.json``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.log.wal import WalPosition

FORMAT_VERSION = 1


@dataclass(slots=True)
class Checkpoint:
    """State of the table as of one Spark commit.

    Attributes:
        wal_position: WAL entries ending at or before it are in the table
            (None: nothing committed through the WAL yet).
        end_offsets: (topic, partition) -> next offset after the last one in the table.
        producers: ``ProducerStateManager.snapshot()`` rows.
        topics: topic -> partition count.
    """

    wal_position: WalPosition | None = None
    end_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    producers: list[list] = field(default_factory=list)
    topics: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "format": FORMAT_VERSION,
            "wal_position": None if self.wal_position is None
            else [self.wal_position.segment, self.wal_position.offset],
            "end_offsets": [[t, p, o] for (t, p), o in sorted(self.end_offsets.items())],
            "producers": self.producers,
            "topics": self.topics,
        }

    @classmethod
    def from_json(cls, data: dict) -> "Checkpoint":
        """Raises ValueError on an unknown format."""
        if data.get("format") != FORMAT_VERSION:
            raise ValueError(f"unknown checkpoint format {data.get('format')!r}")
        pos = data.get("wal_position")
        return cls(
            wal_position=None if pos is None else WalPosition(int(pos[0]), int(pos[1])),
            end_offsets={(str(t), int(p)): int(o) for t, p, o in data.get("end_offsets", [])},
            producers=[list(r) for r in data.get("producers", [])],
            topics={str(t): int(n) for t, n in data.get("topics", {}).items()},
        )


class StateStore:
    """Loads and atomically saves the checkpoint file in ``directory``."""

    FILE = "checkpoint.json"

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.path = self.directory / self.FILE

    def load(self) -> Checkpoint | None:
        """The last saved checkpoint, or None if there is none.

        Raises:
            ValueError: the file exists but is not a checkpoint this version reads.
        """
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        return Checkpoint.from_json(json.loads(text))

    def save(self, checkpoint: Checkpoint) -> None:
        """Replace the checkpoint atomically (blocking: fsyncs)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(checkpoint.to_json(), f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
