"""Chained products: a contraction whose operand is itself a contraction, fused.

    grid i × j
      reduce k2 into acc
        c = load C[k2, j]
        reduce k1 into inner { A[i, k1] * B[k1, k2] }
        h = epilogue1(inner)          (bias, activation: the MLP's up projection)
        acc <- add(acc, multiply(c, h))
      epilogue2(acc)

is O = epilogue2((epilogue1(A B)) C) computed without the intermediate ever reaching memory:
as the Loop IR fused it, every output element recomputes its row of the intermediate; when both
halves are contractions (FusedChain), the kernel is of kind `chain` and a back-to-back template
recomputes it once per output tile instead. PLACE=cut on this edge splits it into two kernels,
each a contraction with its own row:

    <name>_cut0: grid i × k2:  T[i, k2] = epilogue1(sum_k1 A[i, k1] B[k1, k2])
    <name>_cut1: grid i × j:   O[i, j]  = epilogue2(sum_k2 T[i, k2] C[k2, j])

with T a planned intermediate buffer (`<name>_mid`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from emmy.dtypes import DType
from emmy.loop_ir.ir import Accum, Buffer, CastTo, Compute, IndexValue, Load, Store
from emmy.symbolic import var
from emmy.tensor_ir.ir import EwOp, ReduceOp
from emmy.tile_ir.ir import Axis, Fold, FoldKind, Item, KernelKind, TileKernel
from emmy.tile_ir.values import (closure, fold_extents, free, index_vars, operands, used,
                                  value_types)
from emmy.torch_ir.ir import TensorType

_HALF = (DType.F16, DType.BF16)


@dataclass(frozen=True)
class Chain:
    outer: Fold                 # the fold over k2
    producer: tuple[Item, ...]  # the inner fold and the statements computing h, in order
    h: str                      # the producer's value the outer product multiplies
    axes: tuple[Axis, ...]      # the grid axes the producer reads (outermost first)


def find_chain(k: TileKernel) -> Chain | None:
    """The kernel as a fused chain of two products, or None."""
    if k.kind not in (KernelKind.ROW, KernelKind.CHAIN):
        return None
    folds = [i for i in k.body if isinstance(i, Fold)]
    if len(folds) != 1:
        return None
    outer = folds[0]
    if (outer.kind is not FoldKind.REDUCE or len(outer.accs) != 1
            or outer.accs[0].op is not ReduceOp.SUM or outer.reverse):
        return None
    inner = [i for i in outer.body if isinstance(i, Fold)]
    accums = [i for i in outer.body if isinstance(i, Accum)]
    if len(inner) != 1 or inner[0].kind is not FoldKind.REDUCE or len(accums) != 1:
        return None
    defs = {s.dst: s for s in outer.body if isinstance(s, (Load, Compute, CastTo, IndexValue))}
    mul = defs.get(accums[0].value)
    if not isinstance(mul, Compute) or mul.op is not EwOp.MUL:
        return None
    inner_accs = {i.acc for i in inner[0].accs}
    for h in (a for a in mul.args if isinstance(a, str)):
        slice_ = _slice(h, defs, inner_accs)
        other = next((a for a in mul.args if a != h), None)
        if slice_ is None or other is None or _slice(other, defs, inner_accs) is not None:
            continue
        # the inner fold also reads what the outer fold's body computes before it (loads
        # hoisted out of the inner loop, such as a batch norm's per-channel parameters)
        needs = closure(set(free((inner[0],))), defs)
        producer = tuple(i for i in outer.body if i is inner[0] or
                         (not isinstance(i, Fold) and getattr(i, "dst", None) in slice_ | needs))
        # and what the job computes before the outer fold (a norm of A's rows): its axes are
        # the intermediate's too
        reads = index_vars(producer) | index_vars(_before(k, outer, producer))
        grid = {a.var for a in k.grid}
        if not reads <= grid | {outer.axis.var} | set(fold_extents(inner[0])):
            return None
        axes = tuple(a for a in k.grid if a.var in reads)
        return Chain(outer, producer, h, axes)
    return None


def _before(k: TileKernel, outer: Fold, producer: tuple[Item, ...]) -> tuple[Item, ...]:
    """The job's statements before the outer fold that the producer reads, in order."""
    before = {i.dst: i for i in k.body[:k.body.index(outer)] if hasattr(i, "dst")}
    wanted = closure(used(producer) & set(before), before)
    return tuple(i for i in before.values() if i.dst in wanted)


def _slice(name: str, defs: dict, inner_accs: set[str]) -> set[str] | None:
    """The statements `name` depends on inside the outer fold, if it depends on the inner fold."""
    seen = closure({name}, defs)
    reads = {name} | {a for n in seen for a in operands(defs[n])}
    return seen if reads & inner_accs else None


def cut_chain(k: TileKernel, chain: Chain, merge: bool = True
              ) -> tuple[TileKernel, TileKernel, Buffer]:
    """The producer and consumer kernels, and the intermediate between them; each is a
    contraction where it is one (`merge` as find_contraction's; a grouped convolution split
    into its groups).

    When the program rounds the intermediate to f16/bf16 before widening it again (as eager
    torch does between two half-precision products), the buffer holds the rounded value in
    that type and the consumer widens it after its load: both kernels stay contractions on
    half-precision operands, and the rounding is exactly the program's."""
    from emmy.tile_ir.contract import find_contraction, split_groups

    outer = chain.outer
    types = value_types(k.body)
    producer, stored, widen = chain.producer, chain.h, None
    d = next((s for s in producer if isinstance(s, CastTo) and s.dst == chain.h), None)
    if d is not None and types.get(d.arg) in _HALF and types[chain.h] is DType.F32:
        producer = tuple(s for s in producer if s is not d)
        stored, widen = d.arg, d
    mid_axes = chain.axes + (outer.axis,)
    index = tuple(var(a.var) for a in mid_axes)
    mid = Buffer(f"{k.name}_mid", TensorType(tuple(a.extent for a in mid_axes), types[stored]))
    # the job's statements before the outer fold that the producer reads (a convolution's
    # output position as a value, for its padding test)
    producer = _before(k, outer, producer) + producer
    first = cut_part(k, "cut0", producer + (Store(mid.name, index, stored),), outputs=(mid,),
                     grid=mid_axes)
    rest = _consumer(outer.body, chain)
    produced = set(value_types(chain.producer)) - set(value_types(rest))
    body = (Load(stored, mid.name, index, types[stored]),) + ((widen,) if widen else ()) + rest
    new_outer = replace(outer, body=body)
    second_body = tuple(new_outer if i is outer else i for i in k.body)
    second = cut_part(k, "cut1", second_body, extra=(mid,))
    assert not (used(rest) & (produced - {chain.h})), "the consumer reads a producer value"
    out = []
    for part in (first, second):
        con = find_contraction(part, merge)
        if con is None and merge and (grouped := split_groups(part)) is not None:
            con = find_contraction(grouped)
            part = grouped if con else part
        out.append(replace(part, kind=KernelKind.CONTRACT, contract=con) if con else part)
    return out[0], out[1], mid


def _consumer(body, chain: Chain) -> tuple:
    """The outer fold's body without the producer, except the producer's statements that what
    remains still reads (a value both halves use is computed in both kernels)."""
    keep = [i for i in body if i not in chain.producer]
    fold = next(i for i in chain.producer if isinstance(i, Fold))
    accs = {a.acc for a in fold.accs}
    defs = {getattr(i, "dst", None): i for i in chain.producer if not isinstance(i, Fold)}
    before = {n: s for n, s in defs.items() if _slice(n, defs, accs) is None}
    wanted = closure(used(tuple(keep)) & set(before), before)
    return tuple(i for i in body if i not in chain.producer or getattr(i, "dst", None) in wanted)


def cut_part(k: TileKernel, tag: str, body: tuple[Item, ...], extra: tuple[Buffer, ...] = (),
             kind: KernelKind = KernelKind.ROW, **changes) -> TileKernel:
    """One half of `k` cut in two (`<name>_<tag>`, its identity derived from k's): `body`
    over the inputs of k it loads, then `extra`; a row kernel until its caller finds what
    it is."""
    needed = _buffers(body)
    return replace(k, name=f"{k.name}_{tag}", identity=_derived(k.identity, tag),
                   inputs=tuple(b for b in k.inputs if b.name in needed) + extra, body=body,
                   kind=kind, contract=None, attention=None, **changes)


def _buffers(items) -> set[str]:
    out: set[str] = set()
    for i in items:
        if isinstance(i, Fold):
            out |= _buffers(i.body)
        elif isinstance(i, (Load, Store)):
            out.add(i.buffer)
    return out


def _derived(identity: str, tag: str) -> str:
    return hashlib.sha256(f"{identity}/{tag}".encode()).hexdigest()[:12]


@dataclass(frozen=True)
class FusedChain:
    """A chain whose two halves are contractions over the same batch axes: the fused kernel a
    back-to-back template (emmy.cuda.chain) computes tile by tile, recomputing each row
    block's slice of the intermediate for every column tile of the output."""

    first: TileKernel            # H[.., i, k2] = mid(A @ B): the producer, as a contraction
    second: TileKernel           # O[.., i, j] = epilogue(H @ C)
    mid: Buffer                  # the intermediate (not allocated when fused)
    batch: tuple[Axis, ...]
    i: Axis
    k2: Axis
    j: Axis
    a: object                    # tile_ir.contract.Operand of A (outer axis i)
    b: object                    # of B (outer axis k2)
    c: object                    # of C (outer axis j)
    half: bool                   # f16/bf16 operands, H rounded to their type by the program


def fused_products(k: TileKernel) -> FusedChain | None:
    """The fused chain as two contractions the back-to-back template can take, or None."""
    chain = find_chain(k)
    if chain is None or not chain.axes:
        return None
    first, second, mid = cut_chain(k, chain, merge=False)
    if first.kind is not KernelKind.CONTRACT or second.kind is not KernelKind.CONTRACT:
        return None
    i, batch, k2 = chain.axes[-1], chain.axes[:-1], chain.outer.axis
    f, s = first.contract, second.contract
    if any(op.gathered for op in (f.a, f.b, s.a, s.b)):
        return None
    if [a.var for a in f.batch] != [a.var for a in batch] or \
            [a.var for a in s.batch] != [a.var for a in batch]:
        return None
    if {f.m.var, f.n.var} != {i.var, k2.var} or i.var not in (s.m.var, s.n.var):
        return None
    a, b = (f.a, f.b) if f.a.outer == i.var else (f.b, f.a)
    c = s.b if s.a.buffer == mid.name else s.a
    if c.buffer == mid.name or c.outer == i.var:
        return None
    j = s.n if s.n.var != i.var else s.m
    types = {a.dtype, b.dtype, c.dtype}
    half = len(types) == 1 and a.dtype in _HALF and mid.type.dtype is a.dtype
    if not half and types != {DType.F32}:
        return None
    return FusedChain(first, second, mid, batch, i, k2, j, a, b, c, half)
