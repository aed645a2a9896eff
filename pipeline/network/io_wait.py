"""IoWaitMeter: how long the event loop waits for I/O, behind NetworkProcessorAvgIdlePercent.

A Kafka Processor is a thread with its own Selector, and its idle share is
the time it spends blocked in ``select`` (Kafka Selector ``io-wait-time``;
``NetworkProcessorAvgIdlePercent`` averages ``io-wait-ratio`` over the
Processors). Here every Processor is a task on the one trio thread, so the
Processors are idle exactly when that thread is: when trio's run loop is
blocked in its I/O manager (epoll) with nothing runnable. A trio
``Instrument`` sees that wait begin and end (``before_io_wait`` /
``after_io_wait``), once per pass of the run loop, not per request.

Time spent waiting for a worker thread (a WAL fsync, a Spark write) counts as
idle, as it does for a Kafka network thread.
"""

from __future__ import annotations

import time

import trio


class IoWaitMeter(trio.abc.Instrument):
    """Adds up the run loop's I/O waits; install with ``trio.lowlevel.add_instrument``.

    ``wait_seconds`` includes the wait under way, so a reading taken from another thread (the
    metrics endpoint's) is the idle time up to that moment: counted only when a wait ended, a
    wait that began before one scrape and ended after it would all land in the next interval,
    and an idle server's long waits made the idle rate exceed 100 % of the scrape interval.
    """

    def __init__(self) -> None:
        # (seconds of the waits that ended, time.perf_counter() when the current one began or
        # None): one attribute, replaced whole, so another thread never sees half an update.
        self._waits: tuple[float, float | None] = (0.0, None)

    @property
    def wait_seconds(self) -> float:
        """Time blocked waiting for I/O, the current wait included (s, ``time.perf_counter``)."""
        total, since = self._waits
        if since is not None:
            total += max(0.0, time.perf_counter() - since)
        return total

    def before_io_wait(self, timeout: float) -> None:
        self._waits = (self._waits[0], time.perf_counter())

    def after_io_wait(self, timeout: float) -> None:
        total, since = self._waits
        self._waits = (total + (time.perf_counter() - since if since is not None else 0.0), None)
