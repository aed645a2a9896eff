"""MemoryPool and ConnectionQuotas: plain accounting."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.network.connection_quotas import ConnectionQuotas
from pipeline.network.memory_pool import MemoryPool


def test_strict_allocation_never_exceeds_capacity():
    pool = MemoryPool(100)
    assert pool.try_allocate(60)
    assert not pool.try_allocate(41)
    assert pool.try_allocate(40)
    assert pool.is_out_of_memory and pool.used == 100
    assert pool.try_allocate(0)


def test_release_tells_listeners_and_rejects_over_release():
    pool = MemoryPool(10)
    calls = []
    pool.add_release_listener(lambda: calls.append(pool.available))
    pool.try_allocate(7)
    pool.release(3)
    assert calls == [6]
    with pytest.raises(ValueError):
        pool.release(5)
    with pytest.raises(ValueError, match="cannot allocate 11"):
        pool.try_allocate(11)


@given(st.lists(st.integers(0, 50), max_size=60))
def test_used_is_the_sum_of_live_allocations(sizes):
    pool = MemoryPool(200)
    live = []
    for size in sizes:
        if pool.try_allocate(size):
            live.append(size)
        elif live:
            pool.release(live.pop(0))
        assert pool.used == sum(live) <= pool.capacity


def test_connection_quotas_total_and_per_ip():
    q = ConnectionQuotas(max_connections=3, max_connections_per_ip=2)
    assert q.try_acquire("10.0.0.1") is None
    assert q.try_acquire("10.0.0.1") is None
    assert q.try_acquire("10.0.0.1") == "max.connections.per.ip"
    assert q.try_acquire("10.0.0.2") is None
    assert q.try_acquire("10.0.0.3") == "max.connections"
    assert q.open == 3
    q.release("10.0.0.1")
    assert q.try_acquire("10.0.0.3") is None
    assert dict(q.rejected) == {"max.connections.per.ip": 1, "max.connections": 1}
    assert (q.created, q.closed) == (4, 1)
    with pytest.raises(ValueError):
        q.release("192.0.2.1")
