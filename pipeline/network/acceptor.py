"""Acceptor: accepts TCP connections and deals them round-robin to Processors.

Kafka SocketServer's Acceptor thread does only this: accept, then hand the
socket to the next Processor in turn, so connections spread evenly over the
network threads and each stays on one Processor for life. Running out of file
descriptors is survived by logging and pausing accepts, as trio's
``serve_listeners`` does.
"""

from __future__ import annotations

import errno
import logging
from typing import Sequence

import trio

from pipeline.network.processor import Processor

log = logging.getLogger(__name__)

_RESOURCE_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
ACCEPT_BACKOFF_S = 0.1
"""Pause after an accept failed for lack of resources (seconds)."""


class Acceptor:
    """Accepts on ``listeners`` and hands each connection to the next Processor."""

    def __init__(self, listeners: Sequence[trio.SocketListener], processors: Sequence[Processor]) -> None:
        if not processors:
            raise ValueError("at least one Processor is needed")
        self.listeners = list(listeners)
        self._processors = list(processors)
        self._next = 0
        self.accepted = 0

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) of each listening socket."""
        return [tuple(l.socket.getsockname()[:2]) for l in self.listeners]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept until cancelled; closes the listeners on the way out."""
        try:
            async with trio.open_nursery() as nursery:
                for listener in self.listeners:
                    nursery.start_soon(self._accept_loop, listener)
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                for listener in self.listeners:
                    await trio.aclose_forcefully(listener)

    async def _accept_loop(self, listener: trio.SocketListener) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno in _RESOURCE_ERRNOS:
                    log.error("accept failed (%s); pausing accepts for %.1f s", exc, ACCEPT_BACKOFF_S)
                    await trio.sleep(ACCEPT_BACKOFF_S)
                    continue
                raise
            self.accepted += 1
            processor = self._processors[self._next]
            self._next = (self._next + 1) % len(self._processors)
            try:
                await processor.accept(stream)
            except trio.ClosedResourceError:  # processor stopping: shutdown under way
                await trio.aclose_forcefully(stream)
