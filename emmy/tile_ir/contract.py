"""Contractions: a row kernel whose one fold is a sum of products of two loads.

    grid b.. × m × n
      reduce k into acc = init(add) : f32
        x = load A[.. m .. k ..]   (maybe cast to f32)
        y = load B[.. k .. n ..]   (maybe cast to f32)
        acc <- add(acc, multiply(x, y))
      epilogue(acc, b.., m, n)     (loads, element-wise arithmetic, stores; no folds)

is a matrix product with a fused epilogue (bias, activation, scaling, residual add). Such a
kernel gets the tiled product's decision points (warp grid, block tile and instruction, K
split, staging depth, launch order) instead of the job-per-element ones, and lowers through
a template (emmy.cuda.gemm). `m` is the grid axis only A's index uses, `n` the one only B's
uses (the innermost such axis when there are several); every other grid axis is a batch axis,
which an operand may ignore (a broadcast operand: batch stride 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.dtypes import DType
from emmy.loop_ir.ir import Accum, CastTo, Compute, IndexValue, Load, Store
from emmy.schedule.facts import offset, stride_along
from emmy.symbolic import Lin, Sym
from emmy.tensor_ir.ir import EwOp, ReduceOp
from emmy.tile_ir.ir import Axis, Fold, FoldKind, Item, TileKernel

_MMA_TYPES = (DType.F16, DType.BF16)


@dataclass(frozen=True, slots=True)
class Operand:
    buffer: str
    dtype: DType
    offset: Lin          # element offset in the buffer, affine in the grid vars and k
    outer: str           # the grid var of its matrix row (A: m) or column (B: n)


@dataclass(frozen=True, slots=True)
class Contraction:
    batch: tuple[Axis, ...]       # outermost first
    m: Axis
    n: Axis
    k: Axis
    a: Operand
    b: Operand
    acc: str                      # the accumulator the epilogue reads
    epilogue: tuple[Item, ...]    # the job's statements besides the fold, in order
    allow_tf32: bool = False      # f32 operands may be rounded to tf32 (the workload's choice)

    @property
    def batch_size(self) -> int:
        out = 1
        for ax in self.batch:
            out *= ax.extent
        return out

    @property
    def element(self) -> DType:
        """The operands' element type (both the same)."""
        return self.a.dtype

    @property
    def tensor_core_ok(self) -> bool:
        return self.element in _MMA_TYPES

    def stride(self, op: Operand, var: str) -> int:
        return dict((a.name, c) for a, c in op.offset.terms).get(var, 0)

    @property
    def plain_store(self) -> bool:
        """The epilogue stores the accumulator as it is (maybe cast): a split may add into it."""
        names = {self.acc}
        for s in self.epilogue:
            if isinstance(s, CastTo) and s.arg in names:
                names.add(s.dst)
            elif isinstance(s, Store):
                if s.value not in names:
                    return False
            elif not isinstance(s, (Load, IndexValue)):
                return False
        return True


def find_contraction(k: TileKernel) -> Contraction | None:
    """The kernel as a contraction, or None when it is not one (see the module docstring)."""
    folds = [i for i in k.body if isinstance(i, Fold)]
    if len(folds) != 1 or not k.grid:
        return None
    fold = folds[0]
    if (fold.kind is not FoldKind.REDUCE or fold.reverse or len(fold.accs) != 1
            or fold.accs[0].op is not ReduceOp.SUM or fold.accs[0].dtype is not DType.F32):
        return None
    loads = _product(fold)
    if loads is None:
        return None
    epilogue = tuple(i for i in k.body if i is not fold)
    if any(isinstance(i, (Fold, Accum)) for i in epilogue):
        return None
    shapes = {b.name: b.type.shape for b in (*k.inputs, *k.outputs)}
    grid = [a.var for a in k.grid]
    offs = []
    for ld in loads:
        off = offset(ld.index, shapes[ld.buffer])
        if any(not isinstance(atom, Sym) for atom, _ in off.terms):
            return None
        used = {a.name for a, _ in off.terms}
        if fold.axis.var not in used or not used <= {*grid, fold.axis.var}:
            return None
        offs.append((off, used))
    (oa, ua), (ob, ub) = offs
    only_a = [v for v in grid if v in ua and v not in ub]
    only_b = [v for v in grid if v in ub and v not in ua]
    if not only_a or not only_b:
        return None
    m, n = only_a[-1], only_b[-1]
    if _store_stride(epilogue, shapes, n) != 1 and _store_stride(epilogue, shapes, m) == 1:
        # the output is contiguous along m: compute it as C^T = B^T A^T, so that a template's
        # neighbouring columns (its stores) are neighbours in memory
        loads, (oa, ob), m, n = loads[::-1], (ob, oa), n, m
    a_type, b_type = (_type(k, ld.buffer) for ld in loads)
    if a_type is not b_type or a_type not in (*_MMA_TYPES, DType.F32):
        return None
    axes = {a.var: a for a in k.grid}
    return Contraction(batch=tuple(a for a in k.grid if a.var not in (m, n)), m=axes[m],
                       n=axes[n], k=fold.axis,
                       a=Operand(loads[0].buffer, a_type, oa, m),
                       b=Operand(loads[1].buffer, b_type, ob, n),
                       acc=fold.accs[0].acc, epilogue=epilogue,
                       allow_tf32=k.tf32 and a_type is DType.F32)


def _store_stride(epilogue, shapes, var: str) -> int | None:
    """Elements between the output's neighbours along grid axis `var` (the first store's)."""
    for s in epilogue:
        if isinstance(s, Store):
            return stride_along(offset(s.index, shapes[s.buffer]), var)
    return None


def _product(fold: Fold) -> tuple[Load, Load] | None:
    """The two loads whose product the fold sums, in the order the multiply reads them."""
    loads = {s.dst: s for s in fold.body if isinstance(s, Load)}
    casts = {s.dst: s.arg for s in fold.body if isinstance(s, CastTo) and s.dtype is DType.F32}
    muls = [s for s in fold.body if isinstance(s, Compute)]
    accs = [s for s in fold.body if isinstance(s, Accum)]
    if (len(loads) != 2 or len(muls) != 1 or len(accs) != 1
            or len(fold.body) != 2 + len(casts) + 2):
        return None
    mul, acc = muls[0], accs[0]
    if mul.op is not EwOp.MUL or acc.value != mul.dst or acc.op is not ReduceOp.SUM:
        return None
    srcs = []
    for a in mul.args:
        name = casts.get(a, a) if isinstance(a, str) else None
        if name not in loads:
            return None
        srcs.append(loads[name])
    if srcs[0] is srcs[1]:
        return None
    return srcs[0], srcs[1]


def _type(k: TileKernel, buffer: str) -> DType:
    return next(b.type.dtype for b in (*k.inputs, *k.outputs) if b.name == buffer)
