"""The per-connection response sequencer that keeps Kafka's ordering promise, without I/O.

``ResponseSequencer``: one per connection. Kafka promises that responses on a
connection come back in the order of its requests (the client matches them
by correlation id, and librdkafka/the Java client treat a mismatch as a
fatal protocol error). With several requests of one connection in flight
across stages, a later request may finish first; the sequencer holds it
until everything before it has finished (a FIFO of correlation ids, as
Kafka's NetworkClient keeps on the client side in InFlightRequests).

The offsets' sequencer is ``pipeline.log.sequencing.OffsetSequencer``.
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

    @property
    def next_token(self) -> int:
        """The token ``register`` gives next."""
        return self._next_token

    def register_all(self, correlation_ids: list[int]) -> None:
        """``register`` each of ``correlation_ids`` in order: their tokens are ``next_token`` on."""
        first = self._next_token
        tokens = range(first, first + len(correlation_ids))
        self._next_token = tokens.stop
        self._cids.update(zip(tokens, correlation_ids))
        if self._ordered:
            self._order.extend(tokens)

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

    def complete_unanswered(self, tokens: list[int]) -> None:
        """``complete(token, None)`` for each of ``tokens``, in order.

        Raises:
            SequencingError: a token was never issued, or completed already (those before it are
                complete).
        """
        cids, done = self._cids, self._done
        for token in tokens:
            if token not in cids or token in done:
                raise SequencingError(f"token {token} is not in flight")
            done[token] = None
            if not self._ordered:
                self._completion_order.append(token)

    def pop_unanswered(self) -> list[int]:
        """Remove the requests at the head of the writing order that are complete and get no
        response (acks=0), up to the first that is not complete or has a response; return
        their tokens. What ``pop_ready`` would return first, without building responses."""
        done, cids = self._done, self._cids
        tokens: list[int] = []
        if not self._ordered:
            completion = self._completion_order
            i = 0
            while i < len(completion) and done[completion[i]] is None:
                i += 1
            tokens, self._completion_order = completion[:i], completion[i:]
        else:
            order = self._order
            while order and order[0] in done and done[order[0]] is None:
                tokens.append(order.popleft())
        for token in tokens:
            del cids[token], done[token]
        return tokens

    def has_ready(self) -> bool:
        """Whether ``pop_ready`` would return anything now."""
        if not self._ordered:
            return bool(self._completion_order)
        return bool(self._order) and self._order[0] in self._done

    def _ready_tokens(self) -> list[int]:
        """Take the tokens whose turn has come off the writing order, in that order (their
        correlation ids and payloads stay for the caller to pop)."""
        if not self._ordered:
            tokens, self._completion_order = self._completion_order, []
            return tokens
        tokens = []
        order, done = self._order, self._done
        while order and order[0] in done:
            tokens.append(order.popleft())
        return tokens

    def pop_ready(self) -> list[ReadyResponse]:
        """Remove and return the responses that may be written now, in writing order."""
        done, cids = self._done, self._cids
        return [ReadyResponse(cids.pop(t), done.pop(t), t) for t in self._ready_tokens()]

    def pop_ready_payloads(self) -> tuple[list[int], list[bytes]]:
        """``pop_ready`` without its objects, for the writer: the tokens of the responses that
        may be written now, in writing order, and the payloads among them (those that get no
        response left out), in the same order."""
        done, cids = self._done, self._cids
        tokens = self._ready_tokens()
        payloads = []
        for token in tokens:
            del cids[token]
            payload = done.pop(token)
            if payload is not None:
                payloads.append(payload)
        return tokens, payloads
