"""Results of pure functions of immutable IR objects, kept by the objects' identity.

An evaluator estimates many rows of one program: each estimate runs the stages from the loop
program on, with one kernel's row changed. The loop program is the same object every time, and
so are the Tile IR kernels whose rows did not change and their Kernel IR; lifting, applying a
row and emitting CUDA are pure functions of them, so each is done once. Keys hold the object
(an id alone could be reused once the object is freed); the table is bounded.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

_KEPT = 512


class ByIdentity:
    """`table(obj, extra, make)`: `make()` the first time `obj` (by identity) is asked for with
    `extra` (hashable), the remembered result after."""

    def __init__(self, kept: int = _KEPT):
        self._kept = kept
        self._table: dict[tuple[int, Hashable], tuple[Any, Any]] = {}

    def __call__(self, obj: Any, extra: Hashable, make: Callable[[], Any]) -> Any:
        key = (id(obj), extra)
        hit = self._table.get(key)
        if hit is None or hit[0] is not obj:
            if len(self._table) >= self._kept:
                self._table.clear()
            hit = self._table[key] = (obj, make())
        return hit[1]

    def clear(self) -> None:
        """Forget every result (a benchmark timing the first computation)."""
        self._table.clear()
