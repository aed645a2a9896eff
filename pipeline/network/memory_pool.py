"""MemoryPool: the bytes all received requests may hold at once (Kafka ``queued.max.request.bytes``).

Kafka's SocketServer gives every Selector one ``MemoryPool``; a
NetworkReceive allocates its body from it once the 4-byte size is read, and a
channel whose allocation fails is muted until memory is released (Kafka
KafkaChannel.read, Selector.pollSelectionKeys, seed 001/000). The body is
released when the request is done with (here: after its RequestHandler has
handled it; records travelling on to the persister are counted there, against
``buffer.memory``). AutoMQ caps the pool at 100 MiB.

This pool is strict (Kafka's ``SimpleMemoryPool`` with ``strict=true``): an
allocation succeeds only if it fits in what is available, so the bytes held
never exceed ``capacity``. It is not fair: a small request may be served while
a large one waits, so a flood of large declared sizes cannot starve small,
well-behaved producers (the large one is served when enough is returned).

Sans-I/O: plain accounting. Whoever waits for memory registers a listener
(``add_release_listener``); the trio layer turns that into a wake-up.
"""

from __future__ import annotations

from typing import Callable, Final

DEFAULT_QUEUED_MAX_REQUEST_BYTES: Final = 100 * 1024 * 1024
"""Pool size in bytes: AutoMQ's cap of 100 MiB (Kafka's default, -1, is unbounded)."""


class MemoryPool:
    """Counts bytes held by received requests against ``capacity``.

    Args:
        capacity: bytes the pool can lend out at once (>= 1).

    Raises:
        ValueError: ``capacity`` < 1.
    """

    __slots__ = ("capacity", "_available", "_listeners")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._available = capacity
        self._listeners: list[Callable[[], None]] = []

    @property
    def available(self) -> int:
        """Bytes that can be allocated now."""
        return self._available

    @property
    def used(self) -> int:
        """Bytes currently lent out."""
        return self.capacity - self._available

    @property
    def is_out_of_memory(self) -> bool:
        """Nothing is left (Kafka MemoryPool.isOutOfMemory)."""
        return self._available <= 0

    def try_allocate(self, size: int) -> bool:
        """Lend ``size`` bytes if they are available now; False (nothing lent) if not.

        Raises:
            ValueError: ``size`` < 0, or larger than ``capacity`` (it could never be served).
        """
        if size < 0 or size > self.capacity:
            raise ValueError(f"cannot allocate {size} bytes from a pool of {self.capacity}")
        if size > self._available:
            return False
        self._available -= size
        return True

    def release(self, size: int) -> None:
        """Return ``size`` bytes lent earlier; tells every release listener.

        Raises:
            ValueError: more bytes returned than are lent out.
        """
        if size < 0 or self._available + size > self.capacity:
            raise ValueError(f"releasing {size} bytes, but only {self.used} are allocated")
        if size == 0:
            return
        self._available += size
        for listener in self._listeners:
            listener()

    def add_release_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every release (Selector's unmute of channels muted for memory)."""
        self._listeners.append(listener)
