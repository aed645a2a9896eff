"""The decode worker's start-up: tied to the server's life, at a lower priority when asked, and without
the imports it never uses."""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor

from pipeline.cli import DECODE_NICENESS_WITH_WAL_ACKS
from pipeline.process.lifecycle import worker_init


def worker_niceness(niceness: int) -> int:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=worker_init,
                             initargs=(os.getpid(), niceness)) as pool:
        return pool.submit(os.nice, 0).result(timeout=60)


def test_the_worker_yields_the_cpu_by_the_niceness_asked():
    base = os.nice(0)
    assert worker_niceness(0) == base
    assert worker_niceness(DECODE_NICENESS_WITH_WAL_ACKS) == min(19, base + DECODE_NICENESS_WITH_WAL_ACKS)


def _decode_imports() -> tuple[bool, bool]:
    """In the worker: whether the decode jobs' module imports (kio among them), and whether hypothesis came with it."""
    import pipeline.persist.group_sink  # noqa: F401
    return "kio" in sys.modules, sys.modules.get("hypothesis") is not None


def test_the_worker_leaves_out_what_kio_would_import_but_no_job_uses():
    import hypothesis  # noqa: F401  # installed here: kio would import it

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=worker_init,
                             initargs=(os.getpid(), 0)) as pool:
        assert pool.submit(_decode_imports).result(timeout=60) == (True, False)
