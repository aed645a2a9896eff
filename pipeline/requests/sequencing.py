"""The two sequencers that keep Kafka's ordering promises, without I/O.

* ``ResponseSequencer``: one per connection. Kafka promises that responses on a
  connection come back in the order of its requests (the client matches them
  by correlation id, and librdkafka/the Java client treat a mismatch as a
  fatal protocol error). With several requests of one connection in flight
  across stages, a later request may finish first; the sequencer holds it
  until everything before it has finished (a FIFO of correlation ids, as
  Kafka's NetworkClient keeps on the client side in InFlightRequests).
* ``OffsetSequencer``: one per server. Assigns each topic-partition's offsets
  as a gapless sequence 0, 1, 2, ... in the order appends are sequenced (Kafka
  Log.append assigns offsets from the log end offset under the partition lock).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from pipeline.fastinit import fast_frozen_init


class SequencingError(Exception):
    """A token completed twice, or a token this sequencer never issued."""


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class ReadyResponse:
    """A response whose turn has come.

    Attributes:
        correlation_id: the correlation id of the request it answers.
        payload: response bytes without the size prefix, or None when the
            request gets no response (Produce with acks=0).
        token: the request's token (from ``register``).
    """

    correlation_id: int
    payload: bytes | None
    token: int = -1


class ResponseSequencer:
    """Per-connection FIFO of in-flight requests that releases responses in order.

    ``register`` when a request is read, ``complete`` when its response (or
    the decision to send none) is known, in any order; ``pop_ready`` returns
    the completed responses at the head of the FIFO, in request order.

    Args:
        ordered: False only for the benchmark's ``shared-unmuted`` ablation:
            ``pop_ready`` then returns responses in completion order, which
            breaks Kafka's ordering promise on purpose.
    """

    __slots__ = ("_ordered", "_next_token", "_order", "_cids", "_done", "_completion_order")

    def __init__(self, ordered: bool = True) -> None:
        self._ordered = ordered
        self._next_token = 0
        self._order: deque[int] = deque()  # tokens in arrival order (ordered mode)
        self._cids: dict[int, int] = {}  # in-flight token -> correlation id
        self._done: dict[int, bytes | None] = {}
        self._completion_order: list[int] = []  # unordered mode

    @property
    def in_flight(self) -> int:
        """Requests registered whose responses have not been popped yet."""
        return len(self._cids)

    def register(self, correlation_id: int) -> int:
        """Record a request in arrival order; returns the token to complete it with."""
        token = self._next_token
        self._next_token += 1
        self._cids[token] = correlation_id
        if self._ordered:
            self._order.append(token)
        return token

    def complete(self, token: int, payload: bytes | None) -> None:
        """Give the response of request ``token`` (None: send nothing).

        Raises:
            SequencingError: ``token`` was never issued, or completed already.
        """
        if token not in self._cids or token in self._done:
            raise SequencingError(f"token {token} is not in flight")
        self._done[token] = payload
        if not self._ordered:
            self._completion_order.append(token)

    def pop_ready(self) -> list[ReadyResponse]:
        """Remove and return the responses that may be written now, in writing order."""
        done, cids = self._done, self._cids
        if not self._ordered:
            tokens, self._completion_order = self._completion_order, []
            return [ReadyResponse(cids.pop(t), done.pop(t), t) for t in tokens]
        ready: list[ReadyResponse] = []
        order = self._order
        while order and order[0] in done:
            token = order.popleft()
            ready.append(ReadyResponse(cids.pop(token), done.pop(token), token))
        return ready


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
