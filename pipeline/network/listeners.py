"""Listeners: named endpoints, each with a security protocol (KIP-103).

Kafka's ``listeners`` is a comma-separated list of ``NAME://HOST:PORT``;
``listener.security.protocol.map`` says which security protocol each name
speaks (``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT``, ``SASL_SSL``), and
``advertised.listeners`` what Metadata tells a client who came in through that
listener. This module parses and checks those values (sans-I/O); the Acceptor
opens one socket set per listener, and every connection knows its listener.
"""

from __future__ import annotations

import random
import socket
import ssl
from collections.abc import Container, Sequence
from dataclasses import dataclass

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
"""Kafka's SecurityProtocol values a listener may speak."""

TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
"""Security protocols whose connections are wrapped in TLS (Kafka SslTransportLayer)."""

DEFAULT_PROTOCOL_MAP: tuple[tuple[str, str], ...] = tuple((p, p) for p in SECURITY_PROTOCOLS)
"""Kafka's default ``listener.security.protocol.map``: each protocol's name maps to itself."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One listener (Kafka ``EndPoint``): its name, host and port (0: a free one)."""

    name: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


def parse_host_port(text: str, whole: str, expected: str = "NAME://HOST:PORT") -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` -> (host, port 0..65535).

    Raises:
        ValueError: ``expected {expected}, got {whole!r}``.
    """
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected {expected}, got {whole!r}")
    return host, int(port)


def parse_endpoints(text: str, *, default_name: str = "PLAINTEXT") -> tuple[Endpoint, ...]:
    """``NAME://HOST:PORT[,NAME://HOST:PORT...]`` -> endpoints, in order (Kafka ``CoreUtils.listenerListToEndPoints``).

    A lone ``HOST:PORT`` (the form ``--listen`` takes) is one listener called
    ``default_name``. Names are upper-cased (Kafka ``ListenerName.normalised``).

    Raises:
        ValueError: an empty list, a malformed entry, a name given twice, or
            two listeners on one port other than 0 (Kafka: "Each listener must
            have a different port").
    """
    entries = [e.strip() for e in text.split(",")]
    if not text.strip() or not all(entries):
        raise ValueError(f"expected NAME://HOST:PORT[,NAME://HOST:PORT...], got {text!r}")
    endpoints: list[Endpoint] = []
    for entry in entries:
        name, sep, address = entry.partition("://")
        if not sep:
            if len(entries) > 1:
                raise ValueError(f"expected NAME://HOST:PORT for each of several listeners, got {entry!r}")
            name, address = default_name, entry
        name = name.strip().upper()
        if not name or not all(c.isalnum() or c in "_-" for c in name):
            raise ValueError(f"bad listener name {name!r} in {entry!r}")
        endpoints.append(Endpoint(name, *parse_host_port(address, entry)))
    names = [e.name for e in endpoints]
    if len(set(names)) != len(names):
        raise ValueError(f"each listener must have a different name, got {text!r}")
    ports = [e.port for e in endpoints if e.port]
    if len(set(ports)) != len(ports):
        raise ValueError(f"each listener must have a different port, got {text!r}")
    return tuple(endpoints)


def parse_protocol_map(text: str) -> tuple[tuple[str, str], ...]:
    """``NAME:PROTOCOL[,NAME:PROTOCOL...]`` -> pairs (Kafka ``listener.security.protocol.map``).

    Raises:
        ValueError: a malformed pair, an unknown protocol, or a name mapped twice.
    """
    pairs: list[tuple[str, str]] = []
    for entry in text.split(","):
        name, sep, protocol = entry.strip().partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not name or protocol not in SECURITY_PROTOCOLS:
            raise ValueError(f"expected NAME:PROTOCOL pairs with PROTOCOL one of {', '.join(SECURITY_PROTOCOLS)}, "
                             f"got {entry.strip()!r}")
        pairs.append((name, protocol))
    if len({n for n, _ in pairs}) != len(pairs):
        raise ValueError(f"a listener name is mapped twice in {text!r}")
    return tuple(pairs)


def security_protocol(name: str, protocol_map: tuple[tuple[str, str], ...]) -> str:
    """The security protocol of listener ``name``.

    Raises:
        ValueError: ``name`` is not in the map (Kafka: "No security protocol
            defined for listener NAME").
    """
    for mapped, protocol in protocol_map:
        if mapped == name:
            return protocol
    raise ValueError(f"no security protocol defined for listener {name} in listener.security.protocol.map")


def check_listeners(listeners: tuple[Endpoint, ...], advertised: tuple[Endpoint, ...],
                    protocol_map: tuple[tuple[str, str], ...]) -> None:
    """Cross-key checks Kafka's KafkaConfig makes at start-up.

    Raises:
        ValueError: a listener name without a security protocol, or an
            advertised listener whose name is not a listener's.
    """
    for endpoint in listeners:
        security_protocol(endpoint.name, protocol_map)
    names = {e.name for e in listeners}
    for endpoint in advertised:
        if endpoint.name not in names:
            raise ValueError(f"advertised.listeners names {endpoint.name}, which is not in listeners "
                             f"({', '.join(sorted(names))})")


@dataclass(frozen=True, slots=True)
class Listener:
    """What a connection needs to know of the listener it arrived on (Kafka ``ListenerName`` + its
    ChannelBuilder).

    Attributes:
        name: the listener name (``PLAINTEXT``, ``SSL``, a custom one).
        security_protocol: one of ``SECURITY_PROTOCOLS``.
        ssl_context: the server TLS context (SSL, SASL_SSL), else None.
        handshake_timeout_s: deadline of the TLS handshake (seconds).
    """

    name: str = "PLAINTEXT"
    security_protocol: str = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = None
    handshake_timeout_s: float = 10.0


PLAINTEXT_LISTENER = Listener()
"""The listener of a connection nobody said otherwise about (tests, the one-listener default)."""


EPHEMERAL_PORT_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
"""Linux's range for the local ports of outgoing connections (and of a bind to port 0)."""
DEFAULT_EPHEMERAL_PORTS = (32768, 60999)
"""Linux's default ``ip_local_port_range``, when the file cannot be read."""
FREE_PORT_FLOOR = 10000
"""``free_listen_port`` picks at or above this port."""


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's ephemeral port range (``EPHEMERAL_PORT_RANGE_FILE``; ``DEFAULT_EPHEMERAL_PORTS``
    if unreadable): (lowest, highest)."""
    try:
        with open(EPHEMERAL_PORT_RANGE_FILE) as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_PORTS


def free_listen_port(host: str, avoid: Container[int] = (), tries: int = 200,
                     ports: Sequence[int] | None = None) -> int:
    """A TCP port that ``host`` can listen on now, picked at random from ``ports`` (default:
    ``FREE_PORT_FLOOR`` up to just below the ephemeral range), and not in ``avoid``. For a listener
    another process binds a moment later (the Spark Connect server's): the kernel's port-0 pick
    comes from the ephemeral range, which every outgoing connection's local port shares, so some
    connection may take it first; below that range none does.

    Raises:
        OSError: no port was free in ``tries`` picks.
    """
    if ports is None:
        high = ephemeral_ports()[0] - 1
        ports = range(min(FREE_PORT_FLOOR, high), high + 1)
    for _ in range(tries):
        port = random.choice(ports)
        if port in avoid:
            continue
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                continue
        return port
    raise OSError(f"no free port on {host} in {min(ports)}-{max(ports)} after {tries} picks")
