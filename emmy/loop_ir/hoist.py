"""Loop-invariant hoisting: a pure statement that does not depend on a loop moves before it.

A statement depends on a loop when its index uses the loop variable, or it reads a value
defined in the loop, or an accumulator the loop folds into. Inner loops are hoisted first, so
a statement climbs out of as many loops as it can. Loops that run zero times keep their body.
"""

from __future__ import annotations

import dataclasses

from emmy.loop_ir.dataflow import PURE, defined, index_exprs, modified, reads
from emmy.loop_ir.ir import Kernel, Loop, Stmt


def hoist_invariants(k: Kernel) -> Kernel:
    """Move loop-invariant loads, arithmetic, casts and index values out of their loops."""
    return dataclasses.replace(k, body=_block(k.body))


def _block(body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Loop):
            stays, leaves = _split(s, _block(s.body))
            out += leaves
            out.append(dataclasses.replace(s, body=stays))
        else:
            out.append(s)
    return tuple(out)


def _split(loop: Loop, body: tuple[Stmt, ...]) -> tuple[tuple[Stmt, ...], list[Stmt]]:
    """(what stays in the loop, what may run once before it)."""
    if loop.extent < 1:
        return body, []
    inside = set(modified(loop))
    stays: list[Stmt] = []
    leaves: list[Stmt] = []
    for s in body:
        uses_var = any(loop.var in e.free_vars() for e in index_exprs(s))
        if isinstance(s, PURE) and not uses_var and not inside.intersection(reads(s)):
            leaves.append(s)
            continue
        stays.append(s)
        name = defined(s)
        if name is not None:
            inside.add(name)
    return tuple(stays), leaves
