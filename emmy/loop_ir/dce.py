"""Dead-code elimination: drop values nobody reads, accumulators nobody reads, empty loops.

Stores are the only effects a kernel has. A value is live when a live statement reads it; an
accumulator when something other than its own folds reads it. Repeats until nothing changes.
"""

from __future__ import annotations

import dataclasses

from emmy.loop_ir.dataflow import PURE, reads, walk
from emmy.loop_ir.ir import Accum, Init, Kernel, Loop, Stmt


def eliminate_dead_code(k: Kernel) -> Kernel:
    """Remove dead pure statements, dead accumulators (Init and folds) and emptied loops."""
    body = k.body
    while True:
        used = {name for s in walk(body) if not isinstance(s, Loop) for name in reads(s)}
        pruned = _prune(body, used)
        if pruned == body:
            return dataclasses.replace(k, body=body)
        body = pruned


def _prune(body: tuple[Stmt, ...], used: set[str]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        match s:
            case Loop():
                inner = _prune(s.body, used)
                if inner:
                    out.append(dataclasses.replace(s, body=inner))
            case Init() | Accum() if s.acc not in used:
                pass
            case _ if isinstance(s, PURE) and s.dst not in used:
                pass
            case _:
                out.append(s)
    return tuple(out)
