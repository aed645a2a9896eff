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


class SequencingError(Exception):
    """A token completed twice, or a token this sequencer never issued."""


@dataclass(frozen=True, slots=True)
class ReadyResponse:
    """A response whose turn has come.

    Attributes:
        correlation_id: the correlation id of the request it answers.
        payload: response bytes without the size prefix, or None when the
            request gets no response (Produce with acks=0).
    """

    correlation_id: int
    payload: bytes | None


class ResponseSequencer:
    """Per-connection FIFO of in-flight requests that releases responses in order.

    ``register`` when a request is read, ``complete`` when its response (or
    the decision to send none) is known, in any order; ``pop_ready`` returns
    the completed responses at the head of the FIFO, in request order.
    """

    __slots__ = ("_next_token", "_order", "_done")

    def __init__(self) -> None:
        self._next_token = 0
        self._order: deque[tuple[int, int]] = deque()  # (token, correlation_id)
        self._done: dict[int, bytes | None] = {}

    @property
    def in_flight(self) -> int:
        """Requests registered whose responses have not been popped yet."""
        return len(self._order)

    def register(self, correlation_id: int) -> int:
        """Record a request in arrival order; returns the token to complete it with."""
        token = self._next_token
        self._next_token += 1
        self._order.append((token, correlation_id))
        return token

    def complete(self, token: int, payload: bytes | None) -> None:
        """Give the response of request ``token`` (None: send nothing).

        Raises:
            SequencingError: ``token`` was never issued, or completed already.
        """
        if token in self._done or not (
            self._order and self._order[0][0] <= token < self._next_token
        ):
            raise SequencingError(f"token {token} is not in flight")
        self._done[token] = payload

    def pop_ready(self) -> list[ReadyResponse]:
        """Remove and return the completed responses at the head, in request order."""
        ready: list[ReadyResponse] = []
        order, done = self._order, self._done
        while order and order[0][0] in done:
            token, correlation_id = order.popleft()
            ready.append(ReadyResponse(correlation_id, done.pop(token)))
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

    def restore(self, topic: str, partition: int, next_offset: int) -> None:
        """Continue a partition at ``next_offset`` (after recovery from storage)."""
        if next_offset < 0:
            raise ValueError(f"next_offset must be >= 0, got {next_offset}")
        self._log_end[(topic, partition)] = next_offset
