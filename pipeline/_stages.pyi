"""Types of ``pipeline._stages`` (C, ``pipeline/_stages.c``): see its docstrings."""

def record(buckets: list[list[int]], sums_ms: list[float], bounds_ms: tuple[float, ...], received: float,
           dequeued: float, local_done: float, response_complete: float, response_dequeued: float,
           sent: float, count: int = 1, /) -> None:
    """``RequestMetrics.record``'s stage times into ``buckets`` and ``sums_ms`` (see the C docstring)."""
