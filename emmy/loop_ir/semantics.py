"""What each Loop IR operation computes, on numpy arrays (used by the interpreter).

Values live in their type's compute type (f16, bf16 and the 8-bit floats as float32);
`round_to` rounds to the storage type on a cast or a store. Folds reduce over given axes
(keeping them, with size 1); running folds (scans) give both the inclusive and the exclusive
running values.
"""

from __future__ import annotations

import numpy as np

from emmy.dtypes import DType, rounded, to_numpy
from emmy.loop_ir.ir import Accum, CastTo, Compute, EwOp, ReduceOp
from emmy.tensor_ir.semantics import COMBINE, REDUCE, RUNNING, UFUNC

def to_compute(a, dtype: DType) -> np.ndarray:
    return np.asarray(a).astype(to_numpy(dtype.compute), copy=False)


def round_to(a, dtype: DType) -> np.ndarray:
    """`a` in the storage type of `dtype` (bf16 and the 8-bit floats: float32 rounded to their
    values, nearest even)."""
    return rounded(np.asarray(a).astype(to_numpy(dtype)), dtype)


# Ops whose result jumps where their operand crosses a threshold: comparisons, rounding to an
# integer (and a cast to an integer or bool). Their 16-bit operands are rounded to their type
# first, as the program rounds them (in the emitted CUDA, emmy/kernel_ir/elements.py, and in
# the interpreter): elsewhere a 16-bit value computed in float is rounded only where it is
# stored or read as a wider float (a difference within the dtype's tolerance), but here one
# rounding step can move the result by a whole unit (an index, a mask).
STEPS = frozenset({EwOp.LT, EwOp.LE, EwOp.GT, EwOp.GE, EwOp.EQ, EwOp.NE, EwOp.FLOOR,
                   EwOp.CEIL, EwOp.ROUND, EwOp.SIGN})


def cast_is_step(dtype: DType) -> bool:
    """Whether a cast to `dtype` takes its operand's 16-bit value as STEPS do: a cast to an
    integer or bool, or to a float wider than 16 bits."""
    return not dtype.is_float or dtype.itemsize > 2


def exact_operands(body) -> frozenset[str]:
    """The values whose own operands are taken at their 16-bit value too: every op and cast in
    the backward slice of a step's operand within `body` (a kernel's statements), so a chain of
    16-bit ops ending in a step rounds after each op, as eager does. Fake quantization computes
    `round(x / (amax / 127))` in f16: rounding only the quotient, not the scale before it,
    moves 1-3% of the values a whole unit. Elsewhere the chain stays in float (within the
    tolerance)."""
    defs: dict[str, tuple] = {}
    folded: dict[str, list] = {}
    seeds: list = []

    def walk(items) -> None:
        for s in items:
            if isinstance(s, Compute):
                defs[s.dst] = s.args
                if s.op in STEPS:
                    seeds.extend(s.args)
            elif isinstance(s, CastTo):
                defs[s.dst] = (s.arg,)
                if cast_is_step(s.dtype):
                    seeds.append(s.arg)
            elif isinstance(s, Accum):
                folded.setdefault(s.acc, []).append(s.value)
            walk(getattr(s, "body", ()) or ())
    walk(body)
    out: set[str] = set()
    stack = [a for a in seeds if isinstance(a, str)]
    seen: set[str] = set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in defs:
            out.add(n)
            stack.extend(a for a in defs[n] if isinstance(a, str))
        stack.extend(folded.get(n, ()))
    return frozenset(out)


def apply_op(op: EwOp, args: list, dtype: DType) -> np.ndarray:
    """An elementwise op on arrays or Python literals, giving `dtype`'s compute type."""
    return to_compute(UFUNC[op](*args), dtype)


def fold(op: ReduceOp, acc: np.ndarray, pos: np.ndarray | None, value: np.ndarray,
         position: np.ndarray | None, axes: list[int]):
    """Fold `value` over `axes` into the accumulator; returns (value, position)."""
    if value.size == 0:
        return acc, pos
    if op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN):
        return _fold_arg(op, acc, pos, value, position, axes)
    part = REDUCE[op](value, axis=tuple(axes), keepdims=True)
    return COMBINE[op](acc, part).astype(acc.dtype), None


def _fold_arg(op, acc, pos, value, position, axes):
    rest = [i for i in range(value.ndim) if i not in axes]
    flat_shape = tuple(value.shape[i] for i in rest) + (-1,)
    values = np.transpose(value, rest + axes).reshape(flat_shape)
    positions = np.transpose(position, rest + axes).reshape(flat_shape)
    pick = np.argmax if op is ReduceOp.ARGMAX else np.argmin
    at = pick(values, axis=-1)[..., None]  # the first occurrence, NaN counting as extreme
    kept = [1 if i in axes else n for i, n in enumerate(value.shape)]
    best = np.take_along_axis(values, at, -1).reshape(kept)
    where = np.take_along_axis(positions, at, -1).reshape(kept)
    beats = best > acc if op is ReduceOp.ARGMAX else best < acc
    if best.dtype.kind == "f":
        beats = beats | (np.isnan(best) & ~np.isnan(acc))
    return np.where(beats, best, acc).astype(acc.dtype), np.where(beats, where, pos)


def running(op: ReduceOp, init: np.ndarray, value: np.ndarray, axis: int, reverse: bool):
    """(inclusive, exclusive) running folds of `value` along `axis`, starting from `init`."""
    v = np.flip(value, axis) if reverse else value
    inclusive = COMBINE[op](init, RUNNING[op](v, axis=axis)).astype(init.dtype)
    first = np.broadcast_to(init, inclusive.shape[:axis] + (1,) + inclusive.shape[axis + 1:])
    exclusive = np.concatenate([first, np.take(inclusive, range(v.shape[axis] - 1), axis=axis)],
                               axis=axis)
    if reverse:
        inclusive, exclusive = np.flip(inclusive, axis), np.flip(exclusive, axis)
    return inclusive, exclusive
