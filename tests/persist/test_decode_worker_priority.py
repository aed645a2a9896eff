"""The decode worker's start-up: tied to the server's life, and at a lower priority when asked."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from pipeline.cli import DECODE_NICENESS_WITH_WAL_ACKS
from pipeline.persist.group_sink import _decode_worker_init


def worker_niceness(niceness: int) -> int:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_decode_worker_init,
                             initargs=(os.getpid(), niceness)) as pool:
        return pool.submit(os.nice, 0).result(timeout=60)


def test_the_worker_yields_the_cpu_by_the_niceness_asked():
    base = os.nice(0)
    assert worker_niceness(0) == base
    assert worker_niceness(DECODE_NICENESS_WITH_WAL_ACKS) == min(19, base + DECODE_NICENESS_WITH_WAL_ACKS)
