"""Hosts on one machine for tests: Linux network namespaces joined by veth pairs to a bridge.

``hosts(n)`` (a context manager) makes a bridge ``pl24br0`` with ``SUBNET``'s first address
(``BRIDGE_ADDRESS``, the machine's side: services every host reaches listen there) and ``n``
namespaces ``pl24h0``.. ``pl24h<n-1>``, each with its loopback and one veth ``eth0`` at
``10.247.0.(10+i)/24`` whose peer (``pl24v<i>``) is a port of the bridge. A namespace is a host as
far as the network goes: its own addresses, loopback, routes and links; a process started in it
(``Host.command``) binds and connects there only. The filesystem stays shared (the shared volume
of several hosts).

Everything is removed on the way out, whatever happened (the veths go with their namespaces), and
leftovers of a run killed before its clean-up are removed first, by name prefix. Only addresses
inside ``SUBNET``, on links the context makes, are used. Needs root and iproute2 (``ip``):
``unavailable()`` says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterator

PREFIX = "pl24"
"""Name prefix of every namespace and link made here (issue 24): leftovers are found by it."""
BRIDGE = f"{PREFIX}br0"
SUBNET = "10.247.0.0/24"
BRIDGE_ADDRESS = "10.247.0.1"


@dataclass(frozen=True)
class Host:
    """One namespace: ``name`` (``ip netns``), ``address`` (its ``eth0``), ``veth`` (the bridge side)."""

    name: str
    address: str

    @property
    def link(self) -> str:
        """The host's interface, inside its namespace."""
        return "eth0"

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside this host's namespace (``ip netns exec``, which execs it: same pid)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def set_link(self, up: bool) -> None:
        """Its ``eth0`` up or down (down: the host is cut from the network, as a pulled cable)."""
        _ip("-n", self.name, "link", "set", self.link, "up" if up else "down")


def unavailable() -> str | None:
    """Why namespaces cannot be made here (not root, no ``ip``), or None."""
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def clean() -> None:
    """Remove every namespace and link named ``PREFIX*`` (a previous run's leftovers, or ours)."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX):
            _ip("netns", "del", name, check=False)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith(PREFIX):
                _ip("link", "del", name, check=False)


@contextlib.contextmanager
def hosts(n: int) -> Iterator[list[Host]]:
    """``n`` hosts on one bridge (see the module docstring); all removed on exit.

    Raises:
        RuntimeError: an ``ip`` command failed (what is made so far is removed).
    """
    clean()
    try:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        made = []
        for i in range(n):
            host = Host(f"{PREFIX}h{i}", f"10.247.0.{10 + i}")
            veth = f"{PREFIX}v{i}"
            _ip("netns", "add", host.name)
            _ip("link", "add", veth, "type", "veth", "peer", "name", host.link, "netns", host.name)
            _ip("link", "set", veth, "master", BRIDGE)
            _ip("link", "set", veth, "up")
            _ip("-n", host.name, "addr", "add", f"{host.address}/24", "dev", host.link)
            _ip("-n", host.name, "link", "set", "lo", "up")
            _ip("-n", host.name, "link", "set", host.link, "up")
            made.append(host)
        yield made
    finally:
        clean()
