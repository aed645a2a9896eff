"""Acceptor: accepts TCP connections and deals them round-robin to Processors.

Kafka SocketServer's Acceptor thread does only this: accept, then hand the
socket to the next Processor in turn, so connections spread evenly over the
network threads and each stays on one Processor for life. A connection over
``max.connections`` or ``max.connections.per.ip`` is closed at once
(ConnectionQuotas), with a log line (at most one a second, counting the
others) and a metric. Running out of file descriptors is survived by logging
and pausing accepts, as trio's ``serve_listeners`` does. Each listener
(KIP-103: PLAINTEXT, SSL, ...) has its own sockets, and every connection goes to
its Processor with the Listener it arrived on.
"""

from __future__ import annotations

import errno
import logging
from typing import Sequence

import trio

from pipeline.network.connection_quotas import ConnectionQuotas
from pipeline.network.listeners import PLAINTEXT_LISTENER, Listener
from pipeline.network.processor import Processor

log = logging.getLogger(__name__)

_RESOURCE_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
ACCEPT_BACKOFF_S = 0.1
"""Pause after an accept failed for lack of resources (seconds)."""
REJECT_LOG_INTERVAL_S = 1.0
"""At most one log line about refused connections per this many seconds."""


class Acceptor:
    """Accepts on ``listeners`` and hands each connection to the next Processor.

    Args:
        listeners: bound listening sockets.
        processors: where connections go, in turn.
        quotas: connection limits, shared with the Processors (which release).
        kinds: the Listener (name, security protocol, TLS) of each of
            ``listeners``, in the same order (KIP-103); default all PLAINTEXT.
    """

    def __init__(self, listeners: Sequence[trio.SocketListener], processors: Sequence[Processor],
                 quotas: ConnectionQuotas, kinds: Sequence[Listener] | None = None) -> None:
        if not processors:
            raise ValueError("at least one Processor is needed")
        self.listeners = list(listeners)
        self.kinds = list(kinds) if kinds is not None else [PLAINTEXT_LISTENER] * len(self.listeners)
        if len(self.kinds) != len(self.listeners):
            raise ValueError("one Listener per listening socket is needed")
        self._processors = list(processors)
        self._quotas = quotas
        self._next = 0
        self._last_reject_log = -float("inf")
        self._unlogged_rejects = 0

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) of each listening socket."""
        return [tuple(listener.socket.getsockname()[:2]) for listener in self.listeners]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept until cancelled; closes the listeners on the way out."""
        try:
            async with trio.open_nursery() as nursery:
                for listener, kind in zip(self.listeners, self.kinds):
                    nursery.start_soon(self._accept_loop, listener, kind)
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                for listener in self.listeners:
                    await trio.aclose_forcefully(listener)

    async def _accept_loop(self, listener: trio.SocketListener, kind: Listener) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno in _RESOURCE_ERRNOS:
                    log.error("accept failed (%s); pausing accepts for %.1f s", exc, ACCEPT_BACKOFF_S)
                    await trio.sleep(ACCEPT_BACKOFF_S)
                    continue
                raise
            ip = _peer_ip(stream)
            limit = self._quotas.try_acquire(ip)
            if limit is not None:
                await trio.aclose_forcefully(stream)
                self._log_reject(ip, limit)
                continue
            processor = self._processors[self._next]
            self._next = (self._next + 1) % len(self._processors)
            try:
                await processor.accept(stream, ip, kind)
            except trio.ClosedResourceError:  # processor stopping: shutdown under way
                self._quotas.release(ip)
                await trio.aclose_forcefully(stream)

    def _log_reject(self, ip: str, limit: str) -> None:
        self._unlogged_rejects += 1
        now = trio.current_time()
        if now - self._last_reject_log >= REJECT_LOG_INTERVAL_S:
            limit_value = (self._quotas.max_connections if limit == "max.connections"
                           else self._quotas.max_connections_per_ip)
            log.warning("rejected %d connection(s) at accept, last from %s: over %s %d (%d open)",
                        self._unlogged_rejects, ip, limit, limit_value, self._quotas.open)
            self._last_reject_log = now
            self._unlogged_rejects = 0


def _peer_ip(stream: trio.SocketStream) -> str:
    try:
        return stream.socket.getpeername()[0]
    except OSError:  # reset before we looked
        return "unknown"
