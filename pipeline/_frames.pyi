"""Types of ``pipeline._frames`` (C, ``pipeline/_frames.c``): see its docstrings."""

from typing import Any

class Layout:
    def __init__(self, cls: type, names: tuple[str, ...], defaults: tuple[Any, ...], missing: Any, /) -> None: ...
    def __call__(self, *fields: Any) -> Any: ...

def cut(buffer: bytes | bytearray, pos: int, max_count: int, budget: int, max_receive: int, table: bytearray,
        header: Layout, request: Layout, owner: object, first_token: int, now: float, pool: object, /,
        ) -> tuple[list[Any], int, int, list[int]]:
    """Whole frames at ``buffer[pos:]`` as requests (see the C docstring): (requests, pos, used bytes,
    correlation ids)."""
