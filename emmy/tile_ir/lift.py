"""Lift a Loop IR kernel into Tile IR: the grid of independent jobs and a job's Fold tree."""

from __future__ import annotations

from dataclasses import replace

from emmy.loop_ir.dataflow import loop_extents
from emmy.loop_ir.ir import (Accum, CastTo, Compute, IndexValue, Init, Kernel, Load, Loop,
                             LoopKind, LoopProgram, Stmt)
from emmy.tile_ir.attention import find_attention, flash_ok
from emmy.tile_ir.chain import fused_products
from emmy.tile_ir.contract import find_contraction, split_groups
from emmy.tile_ir.ir import Axis, Fold, FoldKind, Item, KernelKind, TileKernel, TileProgram
from emmy.tile_ir.values import merge_reduces

_PURE = (Load, Compute, CastTo, IndexValue)
_FOLD_KIND = {LoopKind.PARALLEL: FoldKind.MAP, LoopKind.REDUCE: FoldKind.REDUCE,
              LoopKind.SCAN: FoldKind.SCAN}


def lift_program(lp: LoopProgram) -> TileProgram:
    """Lift every kernel of a Loop IR program."""
    from emmy.loop_ir.identity import kernel_id

    return TileProgram(name=lp.name, inputs=lp.inputs, intermediates=lp.intermediates,
                       outputs=lp.outputs,
                       kernels=tuple(lift_kernel(k, kernel_id(k), tf32=lp.tf32) for k in lp.kernels))


def lift_kernel(k: Kernel, identity: str = "", *, tf32: bool = False) -> TileKernel:
    """Peel the outer parallel loops into the grid; the rest of the nest becomes Folds."""
    grid: list[Axis] = []
    prefix: list[Stmt] = []
    block = k.body
    while True:
        loops = [s for s in block if isinstance(s, Loop)]
        scalars = [s for s in block if not isinstance(s, Loop)]
        if (len(loops) == 1 and loops[0].kind is LoopKind.PARALLEL
                and all(isinstance(s, _PURE) for s in scalars)
                and block.index(loops[0]) == len(block) - 1):
            # Statements hoisted out of the loop are recomputed per job (they're pure).
            prefix.extend(scalars)
            grid.append(Axis(loops[0].var, loops[0].extent))
            block = loops[0].body
            continue
        break
    body = tuple(prefix) + _items(block, loop_extents(k.body))
    folds = [i for i in body if isinstance(i, Fold)]
    if not folds:
        kind = KernelKind.MAP
    elif any(_has_scan(f) for f in folds):
        kind = KernelKind.SCAN
    else:
        kind = KernelKind.ROW
    tk = TileKernel(name=k.name, identity=identity, kind=kind, inputs=k.inputs,
                    outputs=k.outputs, grid=tuple(grid), body=body, tf32=tf32)
    if kind is KernelKind.ROW and (con := find_contraction(tk)) is not None:
        return replace(tk, kind=KernelKind.CONTRACT, contract=con)
    if (kind is KernelKind.ROW and (grouped := split_groups(tk)) is not None
            and (con := find_contraction(grouped)) is not None):
        return replace(grouped, kind=KernelKind.CONTRACT, contract=con)
    if kind is KernelKind.ROW and (att := find_attention(tk)) is not None and flash_ok(att):
        return replace(tk, kind=KernelKind.ATTENTION, attention=att)
    if kind is KernelKind.ROW and (fused := fused_products(tk)) is not None:
        return replace(tk, kind=KernelKind.CHAIN, chain=fused)
    return tk


def _has_scan(f: Fold) -> bool:
    return f.kind is FoldKind.SCAN or any(isinstance(i, Fold) and _has_scan(i) for i in f.body)


def _items(block: tuple[Stmt, ...], extents: dict[str, int]) -> tuple[Item, ...]:
    """Loops become Folds; each Init moves into the fold that accumulates into it."""
    inits = {s.acc: s for s in block if isinstance(s, Init)}
    owned: set[str] = set()
    out: list[Item] = []
    for s in block:
        if isinstance(s, Loop):
            accs = tuple(inits[a] for a in _accumulated(s) if a in inits)
            owned |= {i.acc for i in accs}
            out.append(_collapse(Fold(_FOLD_KIND[s.kind], Axis(s.var, s.extent), accs,
                                      _items(s.body, extents), s.reverse), extents))
        else:
            out.append(s)
    return tuple(i for i in out if not (isinstance(i, Init) and i.acc in owned))


def _accumulated(loop: Loop) -> tuple[str, ...]:
    """Accumulators folded anywhere inside the loop, in order of first appearance."""
    out: list[str] = []
    for s in loop.body:
        names = [s.acc] if isinstance(s, Accum) else _accumulated(s) if isinstance(s, Loop) else []
        out.extend(n for n in names if n not in out)
    return tuple(out)


def _collapse(f: Fold, extents: dict[str, int]) -> Fold:
    """reduce a0 { reduce a1 { … } } into the same accumulators -> one reduce over a0*N + a1."""
    if f.kind is not FoldKind.REDUCE or len(f.body) != 1 or not isinstance(f.body[0], Fold):
        return f
    inner = f.body[0]
    if inner.kind is not FoldKind.REDUCE or inner.accs or inner.reverse:
        return f
    # the merged extent is recorded for the whole kernel: an enclosing fold collapsed later
    # substitutes into bodies that already use this merged axis (a pool's window reduce
    # inside a mean's)
    return _collapse(merge_reduces(f, inner, (), extents), extents)
