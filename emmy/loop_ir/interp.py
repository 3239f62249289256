"""Run Loop IR with numpy: the CPU reference for this stage.

Not scalar by scalar: every loop variable of a kernel gets its own array axis (the loop's
nesting depth), and each statement is evaluated once, as an array broadcast over the loops it
depends on (size 1 on the others). A reduce loop's folds become numpy reductions over that loop's axis, a scan loop's
become cumulative ones (np.cumsum, …), and a store scatters into the buffer.

Arithmetic is carried out in each type's compute type (f16 and bf16 in f32, rounded on a cast
and on a store). A kernel whose loop nest would make too large an array runs its outermost
loop in chunks.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from emmy import symbolic
from emmy.dtypes import DType, to_numpy
from emmy.errors import InternalError, UserError
from emmy.loop_ir.dataflow import defined, modified, reads
from emmy.loop_ir.ir import (Accum, CastTo, Compute, IndexValue, Init, Kernel, Load, Loop,
                             LoopKind, LoopProgram, ReduceOp, Stmt, Store)
from emmy.loop_ir.semantics import (STEPS, apply_op, cast_is_step, exact_operands, fold, round_to,
                                   running, to_compute)
from emmy.tensor_ir.ir import gather_var
from emmy.tensor_ir.semantics import as_numpy, identity

MAX_ELEMENTS = 1 << 24  # the most elements one statement's array may have before chunking


def run(lp: LoopProgram, inputs: Mapping[str, Any]) -> list[np.ndarray]:
    """Run every kernel in order; returns the outputs as numpy arrays (bf16 as float32)."""
    buffers: dict[str, np.ndarray] = {}
    for b in lp.inputs:
        if b.name not in inputs:
            raise UserError(f"missing input `{b.name}`; the program takes "
                            + ", ".join(i.name for i in lp.inputs))
        buffers[b.name] = round_to(as_numpy(inputs[b.name]).astype(to_numpy(b.type.dtype)),
                                   b.type.dtype).reshape(b.type.shape)
    for b in lp.intermediates + lp.outputs:
        if b.name not in buffers:
            buffers[b.name] = np.zeros(b.type.shape, to_numpy(b.type.dtype))
    with np.errstate(all="ignore"):
        for k in lp.kernels:
            run_kernel(k, buffers)
    return [buffers[b.name].copy() for b in lp.outputs]


def run_kernel(k: Kernel, buffers: dict[str, np.ndarray]) -> None:
    """Run one kernel against `buffers` (read its inputs, write its outputs)."""
    axes = _axes(k.body)
    volume = _volume(k.body)
    top = [s for s in k.body if isinstance(s, Loop) and s.kind is LoopKind.PARALLEL]
    chunks = 1
    if volume > MAX_ELEMENTS and len(top) == 1:
        chunks = min(top[0].extent, -(-volume // MAX_ELEMENTS))
    types = {b.name: b.type.dtype for b in k.inputs + k.outputs}
    cone = exact_operands(k.body)
    if chunks == 1:
        _Machine(axes, buffers, types, {}, cone).block(k.body)
        return
    loop = top[0]
    step = -(-loop.extent // chunks)
    for start in range(0, loop.extent, step):
        ranges = {loop.var: (start, min(loop.extent, start + step))}
        _Machine(axes, buffers, types, ranges, cone).block(k.body)


def _axes(body: tuple[Stmt, ...], depth: int = 0, out: dict[str, int] | None = None) -> dict[str, int]:
    """Each loop variable's array axis: its nesting depth. Sibling loops share an axis, as
    nothing defined in a loop outlives it but accumulators, which it folds to size 1."""
    out = {} if out is None else out
    for s in body:
        if isinstance(s, Loop):
            out[s.var] = depth
            _axes(s.body, depth + 1, out)
    return out


def _volume(body: tuple[Stmt, ...], outer: int = 1) -> int:
    """The largest product of extents along one chain of nested loops."""
    best = outer
    for s in body:
        if isinstance(s, Loop):
            best = max(best, _volume(s.body, outer * max(s.extent, 1)))
    return best


class _Acc:
    """An accumulator: its value (and, for argmax/argmin, the position of that value)."""

    def __init__(self, op: ReduceOp, value: np.ndarray, position: np.ndarray | None):
        self.op = op
        self.value = value
        self.position = position

    def read(self) -> np.ndarray:
        return self.position if self.position is not None else self.value


class _Machine:
    """Evaluates statements as broadcast arrays; one per kernel run (or chunk)."""

    def __init__(self, axes: dict[str, int], buffers: dict[str, np.ndarray],
                 types: dict[str, DType], ranges: dict[str, tuple[int, int]],
                 cone: frozenset[str] = frozenset()):
        self.axes = axes
        self.cone = cone            # values whose operands are taken exactly (exact_operands)
        self.ndim = max(axes.values(), default=-1) + 1
        self.buffers = buffers
        self.types = types          # buffer -> element type (bf16 buffers hold float32)
        self.ranges = ranges        # loop variable -> the part of its range this run covers
        self.values: dict[str, np.ndarray] = {}
        self.dtypes: dict[str, DType] = {}   # value or accumulator -> its element type
        self.accs: dict[str, _Acc] = {}
        self.vars: dict[str, np.ndarray] = {}
        self.open: list[Loop] = []  # the loops around the statement being run
        self.depth: dict[str, int] = {}  # accumulator -> len(open) at its Init

    # ---- values ----------------------------------------------------------------------------

    def shaped(self, a) -> np.ndarray:
        a = np.asarray(a)
        return a.reshape((1,) * self.ndim) if a.ndim == 0 else a

    def get(self, name: str) -> np.ndarray:
        if name in self.values:
            return self.values[name]
        if name in self.accs:
            return self.accs[name].read()
        raise InternalError(f"`{name}` is read before it is defined")

    def index(self, e: symbolic.Lin) -> np.ndarray:
        return self.shaped(symbolic.evaluate(e, self.vars))

    def operand(self, a):
        return self.get(a) if isinstance(a, str) else a.value

    def exact(self, a):
        """An operand of a step function or a cast to another kind: a 16-bit value rounded to
        its type first, as the emitted CUDA has it."""
        t = self.dtypes.get(a) if isinstance(a, str) else None
        if t is None or not t.is_narrow_float:
            return self.operand(a)
        return to_compute(round_to(self.get(a), t), t)

    # ---- statements ------------------------------------------------------------------------

    def block(self, body: tuple[Stmt, ...]) -> None:
        for s in body:
            self.stmt(s)

    def stmt(self, s: Stmt) -> None:
        match s:
            case Load():
                data = self.buffers[s.buffer]
                env = {**self.vars, **{gather_var(k): self.get(a).astype(np.int64)
                                       for k, a in enumerate(s.dyn)}}
                where = tuple(self.shaped(symbolic.evaluate(e, env)) for e in s.index)
                picked = data[where] if s.index else data
                self.values[s.dst] = self.shaped(to_compute(picked, s.dtype))
            case Compute():
                take = self.exact if s.op in STEPS or s.dst in self.cone else self.operand
                out = apply_op(s.op, [take(a) for a in s.args], s.dtype)
                self.values[s.dst] = self.shaped(out)
                self.dtypes[s.dst] = s.dtype
            case CastTo():
                arg = self.exact(s.arg) if cast_is_step(s.dtype) or s.dst in self.cone \
                    else self.get(s.arg)
                self.values[s.dst] = self.shaped(to_compute(round_to(arg, s.dtype), s.dtype))
                self.dtypes[s.dst] = s.dtype
            case IndexValue():
                self.values[s.dst] = self.index(s.expr).astype(to_numpy(s.dtype.compute))
            case Init():
                value = self.shaped(np.asarray(identity(s.op, s.dtype), to_numpy(s.dtype.compute)))
                position = self.shaped(np.zeros((), np.int64)) if s.op in _ARG else None
                self.accs[s.acc] = _Acc(s.op, value, position)
                self.depth[s.acc] = len(self.open)
            case Accum():
                self.fold(s)
            case Store():
                self.store(s)
            case Loop():
                self.loop(s)
            case _:
                raise InternalError(f"not a Loop IR statement: {s!r}")

    def loop(self, s: Loop) -> None:
        start, stop = self.ranges.get(s.var, (0, s.extent))
        shape = [1] * self.ndim
        shape[self.axes[s.var]] = stop - start
        self.vars[s.var] = np.arange(start, stop).reshape(shape)
        self.open.append(s)
        if s.kind is LoopKind.SCAN:
            self.scan_body(s)
        else:
            self.block(s.body)
        self.open.pop()

    def folded_axes(self, acc: str) -> list[Loop]:
        """The loops a fold into `acc` runs in: those opened after the accumulator's Init."""
        loops = self.open[self.depth[acc]:]
        if any(l.kind is LoopKind.PARALLEL for l in loops):
            raise InternalError(f"`{acc}` is folded inside a parallel loop it was not defined in")
        return loops

    def fold(self, s: Accum) -> None:
        acc = self.accs[s.acc]
        loops = self.folded_axes(s.acc)
        axes = [self.axes[l.var] for l in loops]
        shape = list(np.broadcast_shapes(self.get(s.value).shape, acc.value.shape))
        for l in loops:
            start, stop = self.ranges.get(l.var, (0, l.extent))
            shape[self.axes[l.var]] = stop - start
        value = np.broadcast_to(self.get(s.value), shape)
        position = None if s.position is None else np.broadcast_to(self.index(s.position), shape)
        acc.value, acc.position = fold(acc.op, acc.value, acc.position, value, position, axes)

    def store(self, s: Store) -> None:
        data = self.buffers[s.buffer]
        value = round_to(self.get(s.value), self.types[s.buffer])
        if not s.index:
            data[()] = value.reshape(-1)[0] if value.size == 1 else value
            return
        parts = np.broadcast_arrays(*(self.index(e) for e in s.index), value)
        data[tuple(parts[:-1])] = parts[-1]

    def scan_body(self, loop: Loop) -> None:
        """A scan loop: first what does not read its running values, then the rest in order."""
        own = [s for s in loop.body if isinstance(s, Accum)]
        running_accs = {s.acc for s in own}
        late = _reads_running(loop.body, running_accs)
        for s in loop.body:
            if not isinstance(s, (Accum, Store)) and id(s) not in late:
                self.stmt(s)
        before: dict[str, np.ndarray] = {}
        after: dict[str, np.ndarray] = {}
        start = {name: self.accs[name].value for name in running_accs}
        for s in own:
            acc = self.accs[s.acc]
            axis = self.axes[loop.var]
            value = np.broadcast_to(self.get(s.value), np.broadcast_shapes(
                self.get(s.value).shape, self.vars[loop.var].shape, acc.value.shape))
            inclusive, exclusive = running(acc.op, acc.value, value, axis, loop.reverse)
            before[s.acc], after[s.acc] = exclusive, inclusive
        seen: set[str] = set()
        for s in loop.body:
            for name in running_accs:
                self.accs[name].value = after[name] if name in seen else before[name]
            if isinstance(s, Accum):
                seen.add(s.acc)
            elif isinstance(s, Store) or id(s) in late:
                self.stmt(s)
        for name in running_accs:  # after the loop: the value at its last iteration
            last = 0 if loop.reverse else -1
            axis = self.axes[loop.var]
            self.accs[name].value = (np.take(after[name], [last], axis=axis)
                                     if after[name].shape[axis] else start[name])


_ARG = (ReduceOp.ARGMAX, ReduceOp.ARGMIN)


def _reads_running(body: tuple[Stmt, ...], accs: set[str]) -> set[int]:
    """Statements of a scan body that read a running value, directly or through other values."""
    tainted = set(accs)
    late: set[int] = set()
    for s in body:
        if isinstance(s, Accum):
            continue
        if tainted.intersection(reads(s)):
            late.add(id(s))
            name = defined(s)
            if name is not None:
                tainted.add(name)
            tainted |= modified(s)
    return late

