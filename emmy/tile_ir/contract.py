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

An operand may also be **gathered** (an implicit GEMM): its element is computed by a few
statements instead of one affine load, such as a convolution's input under the window

    reduce k in 0..C*KH*KW          (nested reduces into the same accumulator, merged)
      ih = oh + k / KW % KH - pad;  inside = 0 <= ih < H && ...
      x = where(inside, load input[b, k / (KH*KW), ih % H, iw % W], 0)

A gathered operand's only grid axes (b, oh, ow) merge into one matrix dimension, and the
template copies its tiles element by element through those statements (emmy.cuda.gemm);
the weights stay an affine operand. A grouped convolution is first given a group axis
(split_groups), which makes it a batch of such products.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from emmy.dtypes import DType
from emmy.loop_ir.fuse import COMPUTED_OPERAND_OPS, operand_op
from emmy.loop_ir.ir import Accum, CastTo, Compute, IndexValue, Load, Store
from emmy.schedule.facts import offset, stride_along
from emmy.symbolic import FloorDiv, Lin, Sym, canonical, evaluate, var
from emmy.tensor_ir.ir import EwOp, ReduceOp, Scalar
from emmy.tile_ir.ir import Axis, Fold, FoldKind, Item, TileKernel
from emmy.tile_ir.window import Window, tabled, window
from emmy.tile_ir.values import (closure, fold_extents, index_exprs, index_vars, merge_reduces,
                                  operands, substitute_item, value_types)

_MMA_TYPES = (DType.F16, DType.BF16)


@dataclass(frozen=True, slots=True)
class Operand:
    buffer: str
    dtype: DType
    offset: Lin          # element offset in the buffer, affine in the grid vars and k
                         # (gathered: the load's offset, not affine)
    outer: str           # the grid var of its matrix row (A: m) or column (B: n)
    gather: tuple[Item, ...] = ()   # gathered: the statements computing one element
    value: str = ""                 # gathered: the element's value, in the operand's type
    parts: tuple[Axis, ...] = ()    # the grid axes merged into `outer`, outermost first
                                    # (empty: `outer` is one grid axis)
    k_major: bool = True            # gathered: neighbouring k are nearer in memory than
                                    # neighbouring rows (how its tiles are laid out)
    window: Window | None = None    # gathered: the element split into a part of its row
                                    # (column) and one of k (emmy.tile_ir.window), when it is
    computed: bool = False          # gathered: arithmetic on loads (a dequantized weight),
                                    # which PLACE=cut may store (emmy.tile_ir.cut)
    packing: int = 1                # computed: elements a raw element of its load holds
                                    # (int4 weights two to a byte, read at k // 2: 2), along
                                    # k (k_major) or along `outer` (AWQ's words at n // 8)

    @property
    def gathered(self) -> bool:
        return bool(self.gather)

    @property
    def load(self) -> Load:
        """A gathered operand's load whose layout its tiles take (its buffer's)."""
        return next(s for s in self.gather if isinstance(s, Load) and s.buffer == self.buffer)

    @property
    def axes(self) -> tuple[str, ...]:
        """The grid vars of its matrix row (column), outermost first."""
        return tuple(a.var for a in self.parts) or (self.outer,)

    @property
    def paired(self) -> bool:
        """A computed operand the template may compute two elements at a time on pairs of its
        16-bit type (pair_kinds)."""
        return self.computed and pair_kinds(self) is not None


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


def find_contraction(k: TileKernel, merge: bool = True) -> Contraction | None:
    """The kernel as a contraction, or None when it is not one (see the module docstring).
    `merge` False keeps each affine operand's outer axes apart (one is its matrix dimension,
    the others batches), as the back-to-back chain template needs."""
    folds = [i for i in k.body if isinstance(i, Fold)]
    if len(folds) != 1 or not k.grid:
        return None
    fold = folds[0]
    if (fold.kind is not FoldKind.REDUCE or fold.reverse or len(fold.accs) != 1
            or fold.accs[0].op is not ReduceOp.SUM or fold.accs[0].dtype is not DType.F32):
        return None
    bounds = {a.var: a.extent for a in k.grid} | fold_extents(fold)
    fold = _flatten(fold, bounds)
    before = k.body[:k.body.index(folds[0])]
    outer = {s.dst: s for s in before if isinstance(s, (Load, Compute, CastTo, IndexValue))}
    shapes = {b.name: b.type.shape for b in (*k.inputs, *k.outputs)}
    sides = None if fold is None else _product(fold, outer, shapes)
    if sides is None:
        return None
    epilogue = tuple(i for i in k.body if i is not folds[0])
    if any(isinstance(i, (Fold, Accum)) for i in epilogue):
        return None
    grid = [a.var for a in k.grid]
    offs = []
    for items, ld, *_ in sides:
        off = offset(ld.index, shapes[ld.buffer])
        used = index_vars(items)
        if fold.axis.var not in used or not used <= {*grid, fold.axis.var}:
            return None
        affine = len(items) == 1 and all(isinstance(atom, Sym) for atom, _ in off.terms)
        offs.append((off, used, affine))
    (_, ua, _), (_, ub, _) = offs
    only_a = [v for v in grid if v in ua and v not in ub]
    only_b = [v for v in grid if v in ub and v not in ua]
    if not only_a or not only_b:
        return None
    axes = {a.var: a for a in k.grid}
    ops = [_operand(k, side, off, only, affine, fold.axis, axes, bounds, merge, shapes)
           for side, (off, _, affine), only in zip(sides, offs, (only_a, only_b))]
    if None in ops:
        return None
    a, b = ops
    if _store_stride(epilogue, shapes, b.axes[-1]) != 1 and \
            _store_stride(epilogue, shapes, a.axes[-1]) == 1:
        # the output is contiguous along m: compute it as C^T = B^T A^T, so that a template's
        # neighbouring columns (its stores) are neighbours in memory
        a, b = b, a
    if a.dtype is not b.dtype or a.dtype not in (*_MMA_TYPES, DType.F32):
        return None
    matrix = {*a.axes, *b.axes}
    return Contraction(batch=tuple(ax for ax in k.grid if ax.var not in matrix),
                       m=_axis(a, axes), n=_axis(b, axes), k=fold.axis, a=a, b=b,
                       acc=fold.accs[0].acc, epilogue=epilogue,
                       allow_tf32=k.tf32 and a.dtype is DType.F32)


MIN_GROUP_ROWS = 8   # a group of fewer output channels stays a fold: its product tiles
                     # would be mostly empty


def split_groups(k: TileKernel) -> TileKernel | None:
    """A grouped convolution's kernel with its output-channel axis c split into (group g,
    channel in group j), c = g*d + j: the input reads c only through c / d (its group's
    channels), so after the split g is an axis both operands read (a batch) and j one only
    the weights read, and the kernel is a batch of products, one per group. None when no
    grid axis is read that way (with d >= MIN_GROUP_ROWS dividing its extent)."""
    folds = k.folds
    if len(folds) != 1:
        return None
    axes = {a.var: a for a in k.grid}
    split = next(((v, atom.den) for e in index_exprs(folds[0].body) for atom, _ in e.terms
                  if isinstance(atom, FloorDiv) and len(atom.num.terms) == 1
                  and atom.num.const == 0 and atom.num.terms[0][1] == 1
                  and isinstance(atom.num.terms[0][0], Sym)
                  and (v := atom.num.terms[0][0].name) in axes
                  and atom.den >= MIN_GROUP_ROWS and axes[v].extent % atom.den == 0
                  and axes[v].extent > atom.den), None)
    if split is None:
        return None
    v, d = split
    g, j = Axis(f"{v}g", axes[v].extent // d), Axis(f"{v}c", d)
    bounds = {a.var: a.extent for a in k.grid} | fold_extents(folds[0]) | {g.var: g.extent,
                                                                             j.var: d}
    env = {v: var(g.var) * d + var(j.var)}
    grid = tuple(x for a in k.grid for x in ((g, j) if a.var == v else (a,)))
    return replace(k, grid=grid, body=tuple(substitute_item(i, env, bounds) for i in k.body))


def _operand(k, side, off: Lin, only: list[str], affine: bool, kaxis: Axis, axes, bounds,
             merge: bool, shapes) -> Operand | None:
    items, ld, value, computed = side
    # a computed factor's type is its value's (f16 from an int8 load); a load's, maybe under
    # where(mask, ., 0), is the load's (the where may read it widened)
    dtype = value_types(items)[value] if computed else _type(k, ld.buffer)
    if affine:
        parts = _affine_parts(off, only, axes) if merge else (axes[only[-1]],)
        if len(parts) == 1:
            return Operand(ld.buffer, dtype, off, only[-1])
        outer = "_".join(a.var for a in parts)
        names = {a.var for a in parts}
        merged = Lin(tuple((atom, c) for atom, c in off.terms if atom.name not in names),
                     off.const) + var(outer) * dict(off.terms)[Sym(parts[-1].var)]
        return Operand(ld.buffer, dtype, merged, outer, parts=parts)
    parts = tuple(axes[v] for v in only)
    outer = "_".join(only)
    if computed:    # the pieces two reshapes split an int4 weight's k into, put together
        off = canonical(off)
    packing = _packing(off, kaxis.var) if computed else 1
    raw = _type(k, ld.buffer)
    # int4 weights packed in a byte or a word: its tiles are read along k (the nibbles of one
    # raw element), whatever the stride between raw elements (GPTQ's words lie along n)
    nibbles = packing > 1 and raw in _NIBBLE_WORDS and packing == 2 * raw.itemsize
    # or packed along its one row (column) axis, k its own (AWQ's words of eight along n):
    # its tiles are then read along that axis
    across = computed and packing == 1 and len(only) == 1 and raw in _NIBBLE_WORDS and \
        _packing(off, only[0]) == 2 * raw.itemsize and Sym(kaxis.var) in dict(off.terms)
    if across:
        packing = 2 * raw.itemsize
    return Operand(ld.buffer, dtype, off, outer, gather=items, value=value, computed=computed,
                   packing=packing, parts=parts if len(parts) > 1 else (),
                   k_major=nibbles or (not across and _spread(off, kaxis, parts[-1], bounds) <= 0),
                   window=tabled(window(items, value, shapes, kaxis.var, axes, bounds), bounds))


def _packing(off: Lin, kvar: str) -> int:
    """Elements of a computed operand per raw element of its load: P where the load reads
    its buffer at k // P (and nowhere else along k; the raw elements one after another along
    k, as int4 weights two to a byte of nn.Linear's (out, in // 2) layout, or strided, as
    GPTQ's int32 words of eight, (in // 8, out)), else 1."""
    terms = dict(off.terms)
    if Sym(kvar) in terms:
        return 1
    return next((a.den for a, c in terms.items() if isinstance(a, FloorDiv) and c > 0
                 and a.num == var(kvar)), 1)


def _affine_parts(off: Lin, only: list[str], axes) -> tuple[Axis, ...]:
    """The innermost of an affine operand's own grid axes, and the ones outside it that read
    on as one row-major index (each stride the next one's times its extent): a linear layer's
    batch and sequence, a 1x1 convolution's height and width. They merge into one matrix
    dimension rather than leave the outer ones as batches of short products."""
    strides = {atom.name: c for atom, c in off.terms}
    parts = [axes[only[-1]]]
    for v in reversed(only[:-1]):
        inner = parts[0]
        if strides.get(v, 0) != strides[inner.var] * inner.extent:
            break
        parts.insert(0, axes[v])
    return tuple(parts)


def _axis(op: Operand, axes) -> Axis:
    if not op.parts:
        return axes[op.outer]
    n = 1
    for a in op.parts:
        n *= a.extent
    return Axis(op.outer, n)


def _spread(off: Lin, kaxis: Axis, inner: Axis, bounds) -> int:
    """Whether neighbouring k (< 0) or neighbouring rows (> 0) of a gathered operand sit
    nearer in memory: the mean distance between the elements of a few neighbouring pairs."""
    def mean_step(axis: Axis) -> float:
        base = {v: 0 for v in bounds}
        steps = [abs(evaluate(off, {**base, axis.var: i + 1})
                     - evaluate(off, {**base, axis.var: i}))
                 for i in range(min(axis.extent - 1, 64))]
        return sum(steps) / len(steps) if steps else float("inf")
    dk, do = mean_step(kaxis), mean_step(inner)
    return (dk > do) - (dk < do)


def _flatten(f: Fold, bounds: dict[str, int]) -> Fold | None:
    """A reduce whose body ends in a reduce into the same accumulators, as one reduce over
    their merged axes (outer*n + inner); the statements before the inner reduce move into it
    (they are pure, so recomputing them per element is the same). None when the folds nest
    any other way."""
    inner = [i for i in f.body if isinstance(i, Fold)]
    if not inner:
        return f
    g = inner[0]
    if (len(inner) != 1 or f.body[-1] is not g or g.kind is not FoldKind.REDUCE or g.accs
            or g.reverse):
        return None
    if not all(isinstance(i, (Load, Compute, CastTo, IndexValue)) for i in f.body[:-1]):
        return None
    return _flatten(merge_reduces(f, g, f.body[:-1], bounds), bounds)


def _store_stride(epilogue, shapes, var: str) -> int | None:
    """Elements between the output's neighbours along grid axis `var` (the first store's)."""
    for s in epilogue:
        if isinstance(s, Store):
            return stride_along(offset(s.index, shapes[s.buffer]), var)
    return None


def _product(fold: Fold, outer: dict, shapes):
    """The fold's two factors, in the order the multiply reads them, each as (statements,
    its load, its value, computed): the value is the load itself, or where(mask, load, 0) with
    a mask computed from indices alone (maybe partly by the job's statements `outer`, before
    the fold), or computed from loads (_computed_factor), before any widening cast to f32.
    None when the fold does anything else."""
    body = fold.body
    if not all(isinstance(s, (Load, Compute, CastTo, IndexValue, Accum)) for s in body):
        return None
    accs = [s for s in body if isinstance(s, Accum)]
    defs = {s.dst: s for s in body if not isinstance(s, Accum)}
    if len(accs) != 1 or accs[0].op is not ReduceOp.SUM or accs[0].value not in defs:
        return None
    mul = defs[accs[0].value]
    if not isinstance(mul, Compute) or mul.op is not EwOp.MUL:
        return None
    sides, seen = [], {mul.dst}
    for a in mul.args:
        if not isinstance(a, str):
            return None
        seen.add(a)
        d = defs.get(a)
        if isinstance(d, CastTo) and d.dtype is DType.F32:
            a = d.arg
        side = _factor(a, defs, outer, fold.axis.var, shapes)
        if side is None:
            return None
        sides.append(side)
        seen |= {getattr(s, "dst") for s in side[0]}
    if not set(defs) <= seen or sides[0][1] is sides[1][1]:
        return None   # the fold computes more than the two factors, or squares one load
    return sides


def _factor(value: str, defs, outer, kvar: str, shapes) -> tuple[tuple, Load, str, bool] | None:
    """(statements, load, value, computed) of one factor: a load, maybe widened to f32, maybe
    under where(mask, ·, 0), every such value exactly one of the load's type; or computed
    (_computed_factor)."""
    d, items = defs.get(value), []
    if isinstance(d, Compute) and d.op is EwOp.WHERE:
        mask, x, zero = d.args
        if not (isinstance(mask, str) and isinstance(x, str) and isinstance(zero, Scalar)
                and zero.value == 0):
            return None
        known = outer | defs
        names = closure({mask}, known)
        masks = [known[n] for n in names]
        if (mask not in known or any(a not in known for s in masks for a in operands(s))
                or any(isinstance(s, Load) for s in masks)):
            return None     # the mask reads a load, or a value from outside the job
        items, d = [*masks, d], defs.get(x)
    if isinstance(d, CastTo) and d.dtype is DType.F32 and items:
        items, d = [*items, d], defs.get(d.arg)
    order = [*outer, *defs]
    if isinstance(d, (Compute, CastTo)) and not items:
        return _computed_factor(value, defs, outer, order, kvar, shapes)
    if not isinstance(d, Load) or d.dyn:
        return None     # not a load, or a gather (its rows are known only at run time)
    return tuple(sorted({*items, d}, key=lambda s: order.index(s.dst))), d, value, False


def _computed_factor(value: str, defs, outer, order, kvar: str, shapes
                     ) -> tuple[tuple, Load, str, bool] | None:
    """A factor computed from loads by a few casts and multiplies, adds or subtractions (an
    int8 weight dequantized: cast(load w[n, k]) * load scale[n], maybe less a zero point, the
    scale maybe per group of k), of a 16-bit float type: the template computes each element as
    it copies the operand's tile; integer data may first be unpacked (operand_op: int4
    weights two to a byte). Its load (the one whose layout its tiles take) is the one of the
    most bytes that reads along k (`kvar`)."""
    known = outer | defs
    names = closure({value}, known)
    items = [known[n] for n in names]
    if any(not isinstance(s, (Load, CastTo, Compute, IndexValue)) for s in items) \
            or any(isinstance(s, Compute) and not operand_op(s.op, s.dtype) for s in items) \
            or any(isinstance(s, Load) and s.dyn for s in items) \
            or any(a not in known for s in items for a in operands(s)):
        return None
    loads = [s for s in items if isinstance(s, Load)]
    if not loads or known[value].dtype not in _MMA_TYPES:
        return None
    along = [s for s in loads if kvar in index_vars((s,))]
    if not along:
        return None
    # the weight, not a group-wise scale (scale[n, k // 128]): the load of the most bytes
    # (int4 weights read two to a byte, packed[n, k // 2]), the first at an affine offset in
    # its buffer of those, then integer data before floats (GPTQ's words against scales of as
    # many bytes, one every 4 k), then the first in the program (the same choice in every
    # process: `names` is a set)
    def rank(s: Load) -> tuple[int, bool, bool, int]:
        affine = all(isinstance(atom, Sym) for atom, _ in offset(s.index, shapes[s.buffer]).terms)
        return (-math.prod(shapes[s.buffer]) * s.dtype.itemsize, not affine, s.dtype.is_float,
                order.index(s.dst))

    main = min(along, key=rank)
    return tuple(sorted(items, key=lambda s: order.index(s.dst))), main, value, True


# the loads a pair may widen: their values are exact in f32, so one rounding gives the 16-bit
_PAIR_LOADS = (DType.F16, DType.BF16, DType.F32, DType.I8, DType.U8, DType.I16)


def pair_kinds(op: Operand) -> dict[str, str] | None:
    """How a computed operand's values go two at a time (emmy.kernel_ir.elements.element_pairs),
    by name: "raw" its 8-bit integer load (an int4 operand's byte or word), "scalar" another
    load (read per element), "pair" a value of its 16-bit type held as a pair, and an int4
    operand's unpacking (_nibbles: "unpack", "nibbles:...", a zero point's "zero", or
    "zero:word" and "zero:pair" for one packed as the weights are along the row). None
    unless every value but the loads is of that type: the raw load cast straight to it, a load cast to it or of it, MUL / ADD / SUB / NEG of
    such values and of constants exact in it. Each operation on pairs rounds to the 16-bit type,
    as eager PyTorch rounds each of them; where the template computes one element at a time it
    rounds once at the end (the same bits for a cast and one multiply, the common dequant)."""
    kinds = _pair_kinds(op)
    return None if kinds is None else dict(kinds)


@lru_cache(maxsize=256)
def _pair_kinds(op: Operand) -> tuple[tuple[str, str], ...] | None:
    """pair_kinds, once per operand (Operand.paired asks again for every row's template, and
    an int4 operand's answer computes its unpacking for every byte)."""
    main, t = op.load, op.dtype
    if t not in _MMA_TYPES or main.dtype not in _NIBBLE_WORDS or \
            op.packing not in (1, 2 * main.dtype.itemsize) or \
            (op.packing == 1 and main.dtype not in (DType.I8, DType.U8)):
        return None
    kinds: dict[str, str] = {}
    dtypes: dict[str, DType] = {}
    if op.packing > 1:      # int4: the statements unpacking a nibble from its byte (word)
        unpacked = _nibbles(op)
        if unpacked is None:
            return None
        kinds.update(unpacked)

    def pairable(a) -> bool:
        if isinstance(a, Scalar):
            return sixteen_bits(a.value, t) is not None
        return kinds.get(a) == "pair" or (kinds.get(a) == "scalar" and dtypes[a] is t)

    for s in op.gather:
        if s.dst in kinds:
            continue
        if isinstance(s, Load):
            if s is not main and s.dtype not in _PAIR_LOADS:
                return None
            kinds[s.dst], dtypes[s.dst] = ("raw" if s is main else "scalar"), s.dtype
        elif isinstance(s, CastTo) and s.dtype is t and s.arg in kinds and \
                kinds[s.arg] != "unpack" and (kinds[s.arg] != "raw" or op.packing == 1):
            kinds[s.dst] = "pair"
        elif isinstance(s, Compute) and s.dtype is t and s.op in COMPUTED_OPERAND_OPS \
                and all(pairable(a) for a in s.args):
            kinds[s.dst] = "pair"
        else:
            return None
    # the raw byte (an int4 operand's unpacked nibble) only a cast to the 16-bit type reads
    raw = {n for n, kind in kinds.items() if kind not in ("pair", "scalar", "unpack")
           and not kind.startswith("zero")}
    used_raw = [s for s in op.gather if set(operands(s)) & raw
                and kinds[s.dst] != "unpack" and not kinds[s.dst].startswith("zero")]
    if any(not isinstance(s, CastTo) for s in used_raw) or kinds.get(op.value) != "pair":
        return None
    return tuple(kinds.items())


def _nibbles(op: Operand) -> dict[str, str] | None:
    """The kinds of an int4 operand's unpacking statements (its raw load reads a byte, or a
    16- or 32-bit word as GPTQ packs eight weights in an int32, at p // P, P its nibbles and p
    k or, for an operand packed along its row (column), that index): "unpack" each statement
    between the word and the value cast to the 16-bit type, and for that value
    "nibbles:ORDER" (NIBBLE_ORDERS: which nibble of the word element p % P is), ":signed"
    appended where the nibble is read as a 4-bit two's complement number. Found by computing the
    statements for every byte value at every byte of the word (the other bytes random) and
    every p % P (operand_op's integer operations and casts between integer types, index
    values of p alone); None where they compute anything else. A zero point subtracted before
    the cast is "zero" (one value a vector of k: _zero_point) or, packed as the weights are
    along the row (AWQ's qzeros), "zero:pair": its statements, two of them a pair of
    elements, unpacked the same way."""
    main, P = op.load, op.packing
    pvar = next(a.num.terms[0][0].name for a, c in op.offset.terms
                if isinstance(a, FloorDiv) and a.den == P)
    defs = {s.dst: s for s in op.gather}
    cast = next((s for s in op.gather if isinstance(s, CastTo) and s.dtype is op.dtype
                 and main.dst in closure({s.arg}, defs)), None)
    if cast is None:
        return None
    # GPTQ's form: a zero point (unpacked from data of its own, one value a group of k)
    # subtracted from the nibble before the cast: the nibble is then the subtraction's first
    # operand, and em_4x2 takes the zero point away with its magic number
    nibble, zero, most, zero_order = cast.arg, {}, 0, None
    sub = defs.get(cast.arg)
    less = constant_zero(sub)
    if less is not None and isinstance(sub.args[0], str) and \
            main.dst in closure({sub.args[0]}, defs):   # `(q & 15) - 8`, then the cast
        nibble, most = sub.args[0], less
        if most > ZERO_LIMIT:
            return None
    elif isinstance(sub, Compute) and sub.op is EwOp.SUB and sub.dtype in _SIGNED and \
            all(isinstance(a, str) for a in sub.args) and main.dst in closure({sub.args[0]}, defs):
        nibble = sub.args[0]
        found = _zero_point(sub.args[1], defs, pvar, main.dst) if op.k_major else None
        if found is not None:
            zero, most = {n: "zero" for n in found[0]}, found[1]
        else:
            paired = _paired_zero(op, sub.args[1], defs, pvar)
            if paired is None:
                return None
            zero, zero_order = paired
    kind = _nibble_order(nibble, main, P, pvar, op.gather)
    if kind is None or kind.endswith(":signed") and 8 + most > ZERO_LIMIT or \
            zero_order is not None and zero_order != kind:
        return None
    names = closure({nibble}, defs)
    unpack = names - {cast.arg} if not zero else names
    return {**{n: "unpack" for n in unpack}, **zero, cast.arg: kind, main.dst: "raw"}


# Which nibble of a raw element the element at p % P (of P) is, by order: "lo" the bytes' low
# nibbles first (byte i holds elements 2i, 2i + 1), "hi" their high ones first, "il" AWQ's
# interleave of a word of eight (elements 2i, 2i + 1 in nibbles i and i + 4)
NIBBLE_ORDERS = {"lo": lambda p: p, "hi": lambda p: 2 * (p // 2) + 1 - p % 2,
                 "il": lambda p: (p % 2) * 4 + (p % 8) // 2}


def constant_zero(s) -> int | None:
    """c where `s` is an integer subtraction of the constant c >= 0 (a nibble less 8 before
    its cast: em_4x2's bias takes c away with the magic number), else None."""
    if not isinstance(s, Compute) or s.op is not EwOp.SUB or s.dtype not in _SIGNED or \
            not isinstance(s.args[1], Scalar):
        return None
    c = s.args[1].value
    return int(c) if not isinstance(c, bool) and float(c) == int(c) and c >= 0 else None


def _nibble_order(value: str, main: Load, P: int, pvar: str, gather) -> str | None:
    """"nibbles:ORDER" (maybe ":signed") where the statements computing `value` from the word
    `main` reads give, at every p, the nibble NIBBLE_ORDERS[ORDER](p % P) of the word; else
    None."""
    import numpy as np

    from emmy.dtypes import to_numpy
    from emmy.tensor_ir.semantics import UFUNC

    names = closure({value}, {s.dst: s for s in gather})
    p = np.arange(64)[None, :]
    word = _test_words(main.dtype.itemsize)[:, None]
    values = {main.dst: word.astype(to_numpy(main.dtype))}
    for s in gather:
        if s.dst not in names or s is main:
            continue
        position = canonical(s.expr) if isinstance(s, IndexValue) else None
        if position is not None and position.free_vars() <= {pvar}:
            values[s.dst] = np.asarray(evaluate(position, {pvar: p}))
        elif isinstance(s, CastTo) and not s.dtype.is_float and s.arg in values:
            values[s.dst] = values[s.arg].astype(to_numpy(s.dtype))
        elif isinstance(s, Compute) and not s.dtype.is_float and operand_op(s.op, s.dtype) \
                and all(isinstance(a, Scalar) or a in values for a in s.args):
            args = [np.asarray(a.value, to_numpy(a.dtype)) if isinstance(a, Scalar)
                    else values[a] for a in s.args]
            values[s.dst] = np.asarray(UFUNC[s.op](*args)).astype(to_numpy(s.dtype))
        else:
            return None
    if value not in values:
        return None
    got = np.broadcast_to(values[value].astype(np.int64), (len(word), 64))
    for order, which in NIBBLE_ORDERS.items():
        if order == "il" and P != 8:
            continue
        expected = (word >> (4 * which(p % P))) & 15
        for signed in (False, True):
            if np.array_equal(got, (expected ^ 8) - 8 if signed else expected):
                return f"nibbles:{order}" + (":signed" if signed else "")
    return None


def _paired_zero(op: Operand, z: str, defs, pvar: str) -> tuple[dict[str, str], str] | None:
    """An operand packed along its row (column): ({name: kind} of the statements computing
    the zero point `z`, its nibble order) where they unpack it (unsigned) from a word of their
    own, read at pvar // P as the weight is (AWQ's qzeros[k // group, n // 8]): the word's
    load "zero:word", the rest "zero:pair" (the caller checks the order is the weight's);
    else None."""
    if op.k_major:
        return None
    names = closure({z}, defs)
    words = [defs[n] for n in names if isinstance(defs[n], Load)]
    if op.load.dst in names or len(words) != 1 or words[0].dtype is not op.load.dtype:
        return None
    (word,) = words
    reads = [a for e in word.index for a, _ in canonical(e).terms if pvar in a.free_vars()]
    if reads != [FloorDiv(var(pvar), op.packing)]:
        return None
    kind = _nibble_order(z, word, op.packing, pvar, tuple(defs[n] for n in defs if n in names))
    if kind is None or kind.endswith(":signed"):
        return None
    return {**{n: "zero:pair" for n in names}, word.dst: "zero:word"}, kind


ZERO_LIMIT = 127    # the most a nibble's bias may take away (em_4x2: magic + 127 keeps every
                    # subtraction exact, in f16 and in bf16)


def _zero_point(z: str, defs, kvar: str, main: str):
    """(the names of the statements computing an int4 operand's zero point `z`, its largest
    value) where they are integer loads, casts and operand_op's integer operations that read k
    only as k // d with d a multiple of 8 (one value for each vector of 8 k the template
    converts at once: GPTQ's qzeros unpacked, (qzeros[k // group, n // 8] >> 4 (n % 8)) & 15),
    and the last of them bounds it within 0..ZERO_LIMIT (a mask by a constant, maybe plus or
    minus a constant); None otherwise."""
    names = closure({z}, defs)
    if main in names:
        return None
    for n in names:
        s = defs[n]
        if isinstance(s, Load):
            exprs = s.index
            if s.dtype.is_float:
                return None
        elif isinstance(s, IndexValue):
            exprs = (s.expr,)
        elif isinstance(s, CastTo):
            exprs = ()
            if s.dtype.is_float or defs.get(s.arg) is not None and defs[s.arg].dtype.is_float:
                return None
        elif isinstance(s, Compute) and not s.dtype.is_float and operand_op(s.op, s.dtype):
            exprs = ()
        else:
            return None
        for e in exprs:
            for atom, _ in canonical(e).terms:
                if kvar in atom.free_vars() and not (
                        isinstance(atom, FloorDiv) and atom.num == var(kvar) and atom.den % 8 == 0):
                    return None
    bounds = _int_bounds(z, defs)
    if bounds is None or bounds[0] < 0 or bounds[1] > ZERO_LIMIT:
        return None
    return names, bounds[1]


def _int_bounds(name: str, defs) -> tuple[int, int] | None:
    """Bounds of an integer value that a mask by a non-negative constant makes (and a constant
    added to or taken from it then moves); None where they are not known that way."""
    s = defs.get(name)
    if isinstance(s, CastTo):
        return _int_bounds(s.arg, defs)
    if not isinstance(s, Compute) or len(s.args) != 2:
        return None
    a, b = s.args
    if isinstance(a, Scalar):
        a, b = b, a
    if not isinstance(b, Scalar) or isinstance(a, Scalar) or float(b.value) != int(b.value):
        return None
    c = int(b.value)
    if s.op is EwOp.BITAND and c >= 0:
        return (0, c)
    inner = _int_bounds(a, defs)
    if inner is None or s.op not in (EwOp.ADD, EwOp.SUB) or \
            (s.op is EwOp.SUB and s.args[0] != a):
        return None
    sign = 1 if s.op is EwOp.ADD else -1
    return (inner[0] + sign * c, inner[1] + sign * c)


_NIBBLE_WORDS = (DType.I8, DType.U8, DType.I16, DType.I32)   # what int4 weights pack into
_SIGNED = (DType.I8, DType.I16, DType.I32, DType.I64)   # a nibble less a zero point: no wrap


def _test_words(size: int):
    """Words of `size` bytes (as unsigned int64) that show how a function of a word reads its
    nibbles: at each byte every value, the other bytes random (a fixed seed)."""
    import numpy as np

    if size == 1:
        return np.arange(256, dtype=np.int64)
    rng = np.random.default_rng(0)
    background = rng.integers(0, 1 << (8 * size), 256, dtype=np.int64)
    values = np.arange(256, dtype=np.int64)
    return np.concatenate([(background & ~(0xFF << 8 * b)) | (values << 8 * b)
                           for b in range(size)])


def sixteen_bits(value, t: DType) -> int | None:
    """The bits of a constant as the 16-bit float type `t`; None where it is not a value of
    `t`."""
    import struct

    x = float(value)
    try:
        if t is DType.F16:
            bits = struct.unpack("<H", struct.pack("<e", x))[0]
            return bits if struct.unpack("<e", struct.pack("<H", bits))[0] == x else None
        wide = struct.unpack("<I", struct.pack("<f", x))[0]
    except OverflowError:
        return None
    exact = struct.unpack("<f", struct.pack("<I", wide))[0] == x and not wide & 0xFFFF
    return wide >> 16 if exact else None


def _type(k: TileKernel, buffer: str) -> DType:
    return next(b.type.dtype for b in (*k.inputs, *k.outputs) if b.name == buffer)
