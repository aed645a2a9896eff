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

    Attributes:
        wait_seconds: total time blocked waiting for I/O (s, ``time.perf_counter``).
    """

    def __init__(self) -> None:
        self.wait_seconds = 0.0
        self._since = 0.0

    def before_io_wait(self, timeout: float) -> None:
        self._since = time.perf_counter()

    def after_io_wait(self, timeout: float) -> None:
        self.wait_seconds += time.perf_counter() - self._since
