"""Hosts on one machine for tests: Linux network namespaces joined by veth pairs to a bridge.

``network(n)`` (a context manager) makes a bridge with the first address of a free
``10.247.X.0/24`` (``Network.bridge_address``, the machine's side: services every host reaches
listen there) and ``n`` namespaces, each with its loopback and one veth ``eth0`` at
``10.247.X.(10+i)`` whose peer is a port of the bridge. A namespace is a host as far as the
network goes: its own addresses, loopback, routes and links; a process started in it
(``Host.command``) binds and connects there only. The filesystem stays shared (the shared volume
of several hosts).

Every name carries ``PREFIX`` and the test process's pid (``pl24n<pid>h<i>``, bridge
``pl24b<pid>``, veths ``pl24v<pid>x<i>``), so two runs on one machine do not meet. Everything is
removed on the way out, whatever happened (a veth goes with its namespace); leftovers of a run
killed before its clean-up (its pid gone) are removed first, by name prefix. Only addresses
inside the chosen subnet, on links made here, are used. Needs root and iproute2 (``ip``):
``unavailable()`` says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterator

import psutil

PREFIX = "pl24"
"""Name prefix of every namespace and link made here (issue 24): leftovers are found by it."""
_OWNER = re.compile(rf"^{PREFIX}[nbv](\d+)")


@dataclass(frozen=True)
class Host:
    """One namespace: ``name`` (``ip netns``) and ``address`` (its ``eth0``)."""

    name: str
    address: str
    link: str = "eth0"
    """The host's interface, inside its namespace."""

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside this host's namespace (``ip netns exec``, which execs it: same pid)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def set_link(self, up: bool) -> None:
        """Its ``eth0`` up or down (down: the host is cut from the network, as a pulled cable)."""
        _ip("-n", self.name, "link", "set", self.link, "up" if up else "down")


@dataclass(frozen=True)
class Network:
    """The bridge (``bridge_address`` in ``subnet``, on the machine's side) and the hosts on it."""

    hosts: list[Host]
    bridge_address: str
    subnet: str


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


def _ours(name: str, pid: int | None) -> bool:
    """Whether ``name`` was made here by ``pid`` (None: by a process that is gone)."""
    m = _OWNER.match(name)
    if m is None:
        return False
    owner = int(m.group(1))
    return owner == pid if pid is not None else not psutil.pid_exists(owner)


def clean(pid: int | None = None) -> None:
    """Remove the namespaces and links ``pid`` made; None: those of runs whose process is gone."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if _ours(name, pid):
            _ip("netns", "del", name, check=False)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if _ours(name, pid):
                _ip("link", "del", name, check=False)


def _free_subnet() -> int:
    """An X with no address of 10.247.X.0/24 on this machine's links."""
    used = set(re.findall(r"inet 10\.247\.(\d+)\.", _ip("-o", "-4", "addr", "show").stdout))
    return next(x for x in range(256) if str(x) not in used)


@contextlib.contextmanager
def network(n: int) -> Iterator[Network]:
    """``n`` hosts on one bridge (see the module docstring); all removed on exit.

    Raises:
        RuntimeError: an ``ip`` command failed (what is made so far is removed).
    """
    clean()
    pid = os.getpid()
    bridge = f"{PREFIX}b{pid}"
    try:
        x = _free_subnet()
        net = Network([], f"10.247.{x}.1", f"10.247.{x}.0/24")
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{net.bridge_address}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i in range(n):
            host = Host(f"{PREFIX}n{pid}h{i}", f"10.247.{x}.{10 + i}")
            veth = f"{PREFIX}v{pid}x{i}"
            _ip("netns", "add", host.name)
            _ip("link", "add", veth, "type", "veth", "peer", "name", host.link, "netns", host.name)
            _ip("link", "set", veth, "master", bridge)
            _ip("link", "set", veth, "up")
            _ip("-n", host.name, "addr", "add", f"{host.address}/24", "dev", host.link)
            _ip("-n", host.name, "link", "set", "lo", "up")
            _ip("-n", host.name, "link", "set", host.link, "up")
            net.hosts.append(host)
        yield net
    finally:
        clean(pid)
