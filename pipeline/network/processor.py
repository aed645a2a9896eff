"""Processor: a network worker that owns the connections the Acceptor gives it.

In Kafka a Processor is a thread with its own Selector; connections are
assigned to it round-robin and stay with it for life (seed 004). Here a
Processor is a trio task with a nursery: each of its connections is a
``KafkaChannel`` whose reader and writer tasks live in that nursery, so the
Processor's lifetime bounds theirs.

Like Kafka's Selector it also expires connections: a reaper task asks every
connection's ``ConnectionState.timeout_reason`` a few times a second and
aborts those that stalled inside a frame, stopped reading their responses,
or sat idle past ``connections.max.idle.ms``.

A connection from a TLS listener (SSL, SASL_SSL) first completes its TLS
handshake in its own task, under the listener's deadline (Kafka
SslTransportLayer); one that fails or times out is closed with a logged
reason before it becomes a KafkaChannel. The channel then reads and writes
the SSLStream as it would the socket, and knows its listener, security
protocol and (mTLS) principal.
"""

from __future__ import annotations

import itertools
import logging
import socket
from collections import Counter
from typing import Callable

import trio

from pipeline.observe.structured_logs import log_context
from pipeline.network.channel import KafkaChannel
from pipeline.network.connection_quotas import ConnectionQuotas
from pipeline.network.listeners import PLAINTEXT_LISTENER, Listener
from pipeline.security.tls import ANONYMOUS, TlsHandshakeError, server_handshake

log = logging.getLogger(__name__)

_connection_index = itertools.count()

REAP_INTERVAL_S = 0.25
"""How often connection timeouts are checked (s): the precision of every connection timeout."""


def connection_id(stream: trio.SocketStream) -> str:
    """Kafka's connection id: ``localAddr:localPort-remoteAddr:remotePort-index``.

    The index (a process-wide counter) keeps ids unique when a client reuses
    an address and port (Kafka SocketServer.ConnectionId).
    """
    index = next(_connection_index)
    try:
        local = stream.socket.getsockname()
        remote = stream.socket.getpeername()
    except OSError:
        return f"unknown-unknown-{index}"
    return f"{local[0]}:{local[1]}-{remote[0]}:{remote[1]}-{index}"


class Processor:
    """Serves the connections handed to it with ``accept``.

    Args:
        processor_id: index of this Processor (0-based).
        channel_factory: builds the KafkaChannel of a new connection from its
            id, stream, listener and principal (``ANONYMOUS``, or the mTLS client's).
        quotas: told when a connection closes (the Acceptor admitted it).
        new_connection_queue_size: connections that may wait to be taken up
            (Kafka's per-Processor newConnections queue, default 20).
    """

    def __init__(
        self,
        processor_id: int,
        channel_factory: Callable[[str, trio.abc.Stream, Listener, str], KafkaChannel],
        quotas: ConnectionQuotas,
        new_connection_queue_size: int = 20,
    ) -> None:
        self.processor_id = processor_id
        self._channel_factory = channel_factory
        self._quotas = quotas
        self._new_send, self._new_receive = trio.open_memory_channel[tuple[trio.SocketStream, str, Listener]](
            new_connection_queue_size
        )
        self.channels: set[KafkaChannel] = set()
        self.connections_created: Counter[str] = Counter()
        """Connections this Processor has served, by listener name (Kafka socket-server-metrics
        connection-creation-total)."""
        self.connections_closed: Counter[str] = Counter()
        """Of those, connections closed, by listener name (Kafka connection-close-total)."""
        self.handshake_failures = 0
        """TLS connections closed because their handshake failed or timed out."""
        self.failed_authentications: Counter[str] = Counter()
        """Failed TLS handshakes by listener name: Kafka counts them in failed-authentication-total."""
        self.successful_authentications: Counter[str] = Counter()
        """Completed TLS handshakes on SSL listeners, by listener name (Kafka successful-authentication-total;
        on SASL_SSL the SASL exchange is the authentication, counted by SaslApis)."""
        self._stopping = False

    async def accept(self, stream: trio.SocketStream, ip: str, listener: Listener = PLAINTEXT_LISTENER) -> None:
        """Hand a new connection from ``ip`` that arrived on ``listener`` to this Processor
        (waits while its queue is full).

        Raises:
            trio.ClosedResourceError: the Processor is stopping.
        """
        await self._new_send.send((stream, ip, listener))

    def stop_reading(self) -> None:
        """Server shutdown: read no more requests on any connection, take no new ones."""
        self._stopping = True
        self._new_send.close()
        for channel in list(self.channels):
            channel.stop_reading()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve connections until cancelled (all of them are closed on the way out)."""
        async with trio.open_nursery() as nursery:
            task_status.started()
            nursery.start_soon(self._reap)
            async for stream, ip, listener in self._new_receive:
                if self._stopping:
                    self._quotas.release(ip)
                    await trio.aclose_forcefully(stream)
                    continue
                try:
                    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
                except OSError:
                    pass
                if listener.ssl_context is None:
                    channel = self._new_channel(connection_id(stream), stream, listener, ANONYMOUS)
                    nursery.start_soon(self._serve, channel, ip)
                else:
                    nursery.start_soon(self._secure_and_serve, connection_id(stream), stream, ip, listener)

    def _new_channel(self, conn_id: str, stream: trio.abc.Stream, listener: Listener, principal: str) -> KafkaChannel:
        channel = self._channel_factory(conn_id, stream, listener, principal)
        self.channels.add(channel)
        self.connections_created[listener.name] += 1
        return channel

    async def _secure_and_serve(self, conn_id: str, stream: trio.SocketStream, ip: str, listener: Listener) -> None:
        """TLS handshake under the listener's deadline, then serve; a failed one closes this connection only."""
        log_context.set((conn_id, None))
        assert listener.ssl_context is not None  # accept() sends only TLS listeners' connections here
        try:
            secured, principal = await server_handshake(stream, listener.ssl_context, listener.handshake_timeout_s)
        except BaseException as exc:
            if isinstance(exc, TlsHandshakeError):
                self.handshake_failures += 1
                self.failed_authentications[listener.name] += 1
                log.warning("closing connection %s on listener %s: %s", conn_id, listener.name, exc,
                            extra={"connection_id": conn_id})
            self._quotas.release(ip)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            if not isinstance(exc, TlsHandshakeError):
                raise
            return
        channel = self._new_channel(conn_id, secured, listener, principal)
        if listener.security_protocol == "SSL":
            self.successful_authentications[listener.name] += 1
        if principal != ANONYMOUS:
            log.info("connection %s on listener %s: TLS client %s", conn_id, listener.name, principal)
        if self._stopping:
            channel.stop_reading()
        await self._serve(channel, ip)

    async def _reap(self) -> None:
        """Abort timed-out connections; ends once stopping and every connection is gone."""
        while not (self._stopping and not self.channels):
            await trio.sleep(REAP_INTERVAL_S)
            now = trio.current_time()
            for channel in list(self.channels):
                reason = channel.state.timeout_reason(now)
                if reason is not None:
                    channel.abort(reason)

    async def _serve(self, channel: KafkaChannel, ip: str) -> None:
        # Every line this connection's tasks log carries its id (pipeline.observe.structured_logs).
        log_context.set((channel.connection_id, None))
        log.debug("processor %d: new connection %s", self.processor_id, channel.connection_id)
        try:
            await channel.run()
        finally:
            self.channels.discard(channel)
            self.connections_closed[channel.listener] += 1
            self._quotas.release(ip)
            log.debug("processor %d: connection %s closed", self.processor_id, channel.connection_id)
