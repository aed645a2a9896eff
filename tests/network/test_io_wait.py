"""IoWaitMeter: the event loop's I/O waits, read from another thread as the metrics endpoint does."""

from __future__ import annotations

import time

import trio

from pipeline.network.io_wait import IoWaitMeter


def test_a_reading_during_a_wait_includes_the_wait_so_far():
    """The loop waits (for a worker thread) while that thread reads the meter: the wait under way
    counts, so consecutive readings never jump by more than the time between them."""
    meter = IoWaitMeter()

    def read_during_the_wait() -> tuple[float, float, float]:
        # The clock starts before the first reading and stops after the second: the meter (on
        # time.perf_counter too) may count no more than that (CI: started after the first reading,
        # the 7 us between them made 0.20011 s of readings exceed 0.20011 s "elapsed").
        started = time.perf_counter()
        first = meter.wait_seconds
        time.sleep(0.2)
        return first, meter.wait_seconds, time.perf_counter() - started

    async def main() -> tuple[tuple[float, float, float], float]:
        trio.lowlevel.add_instrument(meter)
        readings = await trio.to_thread.run_sync(read_during_the_wait)
        return readings, meter.wait_seconds

    (first, second, elapsed), after = trio.run(main)
    assert 0.15 <= second - first <= elapsed  # counted while the loop still waits
    assert after >= second  # and kept once the wait has ended
