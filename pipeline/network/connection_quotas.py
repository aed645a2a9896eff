"""ConnectionQuotas: how many connections may be open, in all and per client address.

Kafka's SocketServer keeps a ``ConnectionQuotas`` that its Acceptor asks
before taking a connection and its Processors tell when one closes:
``max.connections`` bounds the broker's total, ``max.connections.per.ip`` one
address's. A connection over either limit is closed at accept. Every
connection slot costs memory (a read buffer, a response backlog, tasks), so
these limits are factors of the server's memory bound (docs/architecture.md).

Sans-I/O: counters only.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Final

DEFAULT_MAX_CONNECTIONS: Final = 1000
"""Kafka ``max.connections`` (Kafka's default is unlimited; a bounded server needs a number)."""


@dataclass(slots=True)
class ConnectionQuotas:
    """Open connections per address against ``max_connections`` and ``max_connections_per_ip``.

    Attributes:
        max_connections: open connections in all (Kafka ``max.connections``).
        max_connections_per_ip: open connections of one client address
            (Kafka ``max.connections.per.ip``).
        created, closed: connections admitted and released since start.
        rejected: refused connections by the property that refused them.
    """

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_ip: int = DEFAULT_MAX_CONNECTIONS
    created: int = 0
    closed: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    _per_ip: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_connections_per_ip < 1:
            raise ValueError("max_connections and max_connections_per_ip must be >= 1")

    @property
    def open(self) -> int:
        """Connections admitted and not yet released."""
        return self.created - self.closed

    def try_acquire(self, ip: str) -> str | None:
        """Admit a connection from ``ip``; returns None, or the name of the limit it is over."""
        if self.open >= self.max_connections:
            limit = "max.connections"
        elif self._per_ip[ip] >= self.max_connections_per_ip:
            limit = "max.connections.per.ip"
        else:
            self._per_ip[ip] += 1
            self.created += 1
            return None
        self.rejected[limit] += 1
        return limit

    def release(self, ip: str) -> None:
        """A connection admitted from ``ip`` has closed.

        Raises:
            ValueError: no connection of ``ip`` is open.
        """
        if self._per_ip[ip] <= 0:
            raise ValueError(f"no open connection from {ip}")
        self._per_ip[ip] -= 1
        if not self._per_ip[ip]:
            del self._per_ip[ip]
        self.closed += 1
