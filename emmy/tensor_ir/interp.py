"""Run a Tensor IR program with numpy: the CPU reference for this stage.

Half-precision elementwise ops compute in f32 and round once (as `DType.compute` says);
bf16 and 8-bit float values live in float32 arrays, rounded to their type after every
definition.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from emmy.dtypes import DType, rounded, to_numpy
from emmy.errors import InternalError, UserError
from emmy.symbolic import evaluate
from emmy.tensor_ir.semantics import REDUCE, RUNNING, UFUNC, as_numpy
from emmy.tensor_ir.ir import (Cast, Def, Elementwise, Gather, IndexMap, Input, InputKind, Iota,
                               Program, Reduce, ReduceOp, Scan, axis_var, gather_var)

def _identity(op: ReduceOp, dtype: np.dtype):
    """The value an exclusive scan starts from."""
    if op in (ReduceOp.SUM, ReduceOp.PROD):
        return 0 if op is ReduceOp.SUM else 1
    if dtype.kind == "f":
        lowest, highest = -np.inf, np.inf
    elif dtype.kind == "b":
        lowest, highest = False, True
    else:
        lowest, highest = np.iinfo(dtype).min, np.iinfo(dtype).max
    return lowest if op in (ReduceOp.MAX, ReduceOp.LOGADDEXP) else highest


def run(program: Program, inputs: Mapping[str, Any]) -> list[np.ndarray]:
    """Evaluate every definition in order; returns the outputs as numpy arrays."""
    env: dict[str, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for d in program.defs:
            value = _eval(d, env, program, inputs)
            if value.shape != d.type.shape:
                raise InternalError(f"{d.name}: computed shape {value.shape}, declared {d.type}")
            env[d.name] = _round(value, d.type.dtype)
    return [env[name] for name in program.outputs]


def _eval(d: Def, env, program: Program, inputs) -> np.ndarray:
    match d:
        case Input():
            return _input(d, program, inputs)
        case Elementwise():
            return _elementwise(d, env)
        case Cast():
            return _convert(env[d.arg], d.type.dtype)
        case IndexMap():
            return _index_map(d, env[d.arg])
        case Gather():
            dynamic = {gather_var(k): env[a].astype(np.int64) for k, a in enumerate(d.indices)}
            return _index_map(d, env[d.arg], dynamic)
        case Reduce():
            return _reduce(d, env[d.arg])
        case Scan():
            return _scan(d, env[d.arg])
        case Iota():
            shape = [1] * len(d.type.shape)
            shape[d.axis] = d.type.shape[d.axis]
            pos = np.arange(d.type.shape[d.axis]).reshape(shape)
            return np.broadcast_to(pos, d.type.shape).astype(to_numpy(d.type.dtype))
    raise InternalError(f"not a Tensor IR definition: {d!r}")


def _input(d: Input, program: Program, inputs) -> np.ndarray:
    if d.kind is InputKind.INPUT:
        if d.name not in inputs:
            raise UserError(f"missing input `{d.name}`; the program takes "
                            + ", ".join(i.name for i in program.inputs if i.kind is InputKind.INPUT))
        value = inputs[d.name]
    else:
        value = program.values[d.name]
    return _convert(as_numpy(value), d.type.dtype)


def _elementwise(d: Elementwise, env) -> np.ndarray:
    # a literal in its type's compute type, as torch applies a Python scalar to f16 (3.7, not
    # f16's 3.699)
    args = [env[a] if isinstance(a, str) else np.asarray(a.value, dtype=to_numpy(a.dtype.compute))
            for a in d.args]
    args = [a.astype(np.float32) if a.dtype == np.float16 else a for a in args]  # f16 computes in f32
    out = UFUNC[d.op](*args)
    return np.broadcast_to(out, d.type.shape).astype(to_numpy(d.type.dtype))


def _convert(value: np.ndarray, dtype: DType) -> np.ndarray:
    return _round(np.asarray(value).astype(to_numpy(dtype)), dtype)


def _round(value: np.ndarray, dtype: DType) -> np.ndarray:
    """Round float32 storage to bf16 or an 8-bit float (nearest even); other types are
    already exact."""
    return rounded(np.asarray(value, dtype=to_numpy(dtype)), dtype)


def _index_map(d: IndexMap | Gather, arg: np.ndarray, dynamic=None) -> np.ndarray:
    rank = len(d.type.shape)
    env = dict(dynamic or {})
    for i, n in enumerate(d.type.shape):
        shape = [1] * rank
        shape[i] = n
        env[axis_var(i)] = np.arange(n).reshape(shape)
    index = []
    for e, n in zip(d.index, arg.shape):
        pos = np.asarray(evaluate(e, env))
        if pos.size and (pos.min() < 0 or pos.max() >= n):
            raise InternalError(f"{d.name}: index {e} leaves [0, {n})")
        index.append(pos)
    picked = arg[tuple(index)] if index else arg
    return np.broadcast_to(picked, d.type.shape)


def _reduce(d: Reduce, arg: np.ndarray) -> np.ndarray:
    if d.op not in (ReduceOp.ARGMAX, ReduceOp.ARGMIN):
        return REDUCE[d.op](arg, axis=d.axes).astype(arg.dtype)
    kept = [i for i in range(arg.ndim) if i not in d.axes]
    moved = np.transpose(arg, kept + list(d.axes))
    flat = moved.reshape(moved.shape[:len(kept)] + (-1,))
    pick = np.argmax if d.op is ReduceOp.ARGMAX else np.argmin
    return pick(flat, axis=-1).astype(np.int64)


def _scan(d: Scan, arg: np.ndarray) -> np.ndarray:
    x = np.flip(arg, d.axis) if d.reverse else arg
    if d.exclusive:
        pad = [(0, 0)] * x.ndim
        pad[d.axis] = (1, 0)
        x = np.pad(x, pad, constant_values=_identity(d.op, x.dtype))
        x = np.take(x, range(arg.shape[d.axis]), axis=d.axis)
    out = RUNNING[d.op](x, axis=d.axis).astype(arg.dtype)
    return np.flip(out, d.axis) if d.reverse else out
