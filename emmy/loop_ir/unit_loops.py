"""Unit loops: a parallel loop that runs once is its body, with the loop variable set to 0.

`nn.LayerNorm` over (batch, 1, hidden) lowers its output pass to `for a3 in 0..1 { for a4 … }`;
left alone, the extent-1 loop is the one a schedule spreads over the lanes, and the real work
runs serially in one lane. Reduce and scan loops keep their shape (their accumulators need one).
"""

from __future__ import annotations

import dataclasses

from emmy.loop_ir.dataflow import loop_extents
from emmy.loop_ir.ir import Accum, IndexValue, Kernel, Load, Loop, LoopKind, Stmt, Store
from emmy.symbolic import lin, substitute


def drop_unit_loops(k: Kernel) -> Kernel:
    """Inline every parallel loop of extent 1 into its parent block."""
    return dataclasses.replace(k, body=_block(k.body, loop_extents(k.body)))


def _block(body: tuple[Stmt, ...], bounds: dict[str, int]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Loop):
            inner = _block(s.body, bounds)
            if s.kind is LoopKind.PARALLEL and s.extent == 1:
                out += [_zero(t, s.var, bounds) for t in inner]
            else:
                out.append(dataclasses.replace(s, body=inner))
        else:
            out.append(s)
    return tuple(out)


def _zero(s: Stmt, name: str, bounds: dict[str, int]) -> Stmt:
    env = {name: lin(0)}
    match s:
        case Loop():
            return dataclasses.replace(s, body=tuple(_zero(t, name, bounds) for t in s.body))
        case Load() | Store():
            return dataclasses.replace(s, index=tuple(substitute(e, env, bounds) for e in s.index))
        case IndexValue():
            return dataclasses.replace(s, expr=substitute(s.expr, env, bounds))
        case Accum() if s.position is not None:
            return dataclasses.replace(s, position=substitute(s.position, env, bounds))
    return s
