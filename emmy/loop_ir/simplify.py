"""Literals folded, and the boolean round trips of masks removed.

    an op whose operands are all literals (or values folded before) is computed here, with the
    interpreter's semantics (a cast rounds, an op computes in its compute type); its readers
    that take literals (ops) read the result as a literal, so `or(False, True)` or a cast of a
    literal costs nothing at run time
    where(literal, x, y) is x or y
    cast(where(c, a, 0), bool) with c a bool and a a nonzero literal is c itself

torch writes masks this way (`torch.ones(n, n, dtype=torch.bool).tril()` becomes a select of a
constant, cast back to bool); after this pass a mask is its comparison, which the attention
recognizer reads. Statements left unread are removed by dead-code elimination.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from emmy.dtypes import DType
from emmy.loop_ir.dataflow import rename_reads
from emmy.loop_ir.ir import CastTo, Compute, Init, Kernel, Load, Loop, IndexValue, Stmt
from emmy.loop_ir.semantics import (STEPS, apply_op, cast_is_step, exact_operands, round_to,
                                   to_compute)
from emmy.tensor_ir.ir import EwOp, Scalar


def fold_constants(k: Kernel) -> Kernel:
    """The pass (module docstring)."""
    return dataclasses.replace(k, body=_Folder(exact_operands(k.body)).block(k.body))


class _Folder:
    def __init__(self, exact: frozenset[str] = frozenset()) -> None:
        self.exact = exact      # values whose operands are rounded too (exact_operands)
        self.literal: dict[str, Scalar] = {}     # names whose value is known
        self.renames: dict[str, str] = {}        # names that are another name's value
        self.defs: dict[str, Stmt] = {}
        self.types: dict[str, DType] = {}

    def block(self, body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
        out: list[Stmt] = []
        for s in body:
            if isinstance(s, Loop):
                out.append(dataclasses.replace(s, body=self.block(s.body)))
                continue
            s = self.statement(rename_reads(s, self.renames))
            if s is not None:
                out.append(s)
        return tuple(out)

    def statement(self, s: Stmt) -> Stmt | None:
        """`s` with known literals in its operands, or None where it is another name."""
        match s:
            case Compute():
                # a step function of a 16-bit value computed before: that value rounded to its
                # type first (STEPS), as the interpreter and the emitted CUDA take it
                known = (lambda a: _exact(self.literal[a])) \
                    if s.op in STEPS or s.dst in self.exact else (lambda a: self.literal[a])
                args = tuple(known(a) if isinstance(a, str) and a in self.literal else a
                             for a in s.args)
                s = dataclasses.replace(s, args=args)
                if s.op is EwOp.WHERE and isinstance(args[0], Scalar):
                    picked = args[1] if args[0].value else args[2]
                    if isinstance(picked, str) and self.types.get(picked) is s.dtype:
                        self.renames[s.dst] = picked
                        return None
                    if isinstance(picked, Scalar):
                        self.literal[s.dst] = _literal(picked.value, picked.dtype, s.dtype)
                elif all(isinstance(a, Scalar) for a in args):
                    self.literal[s.dst] = _evaluate(s)
            case CastTo():
                if s.arg in self.literal:
                    known = self.literal[s.arg]
                    if cast_is_step(s.dtype) or s.dst in self.exact:
                        known = _exact(known)
                    self.literal[s.dst] = _literal(known.value, known.dtype, s.dtype)
                elif s.dtype is DType.BOOL and (c := self._mask_of(s.arg)) is not None:
                    self.renames[s.dst] = c
                    return None
        if isinstance(s, (Compute, CastTo, Load, IndexValue)):
            self.defs[s.dst] = s
            self.types[s.dst] = s.dtype
        elif isinstance(s, Init):
            self.types[s.acc] = s.dtype
        return s

    def _mask_of(self, name: str) -> str | None:
        """c where `name` is where(c, a, 0) with c a bool and a a nonzero literal."""
        d = self.defs.get(name)
        if not (isinstance(d, Compute) and d.op is EwOp.WHERE):
            return None
        c, a, b = d.args
        if (isinstance(c, str) and self.types.get(c) is DType.BOOL and isinstance(a, Scalar)
                and isinstance(b, Scalar) and a.value != 0 and b.value == 0):
            return c
        return None


def _evaluate(s: Compute) -> Scalar:
    """An op's value as the interpreter computes it: in its type's compute type (f16 and bf16
    as float32), rounded only by a cast or a store."""
    args = [to_compute(a.value, a.dtype) for a in s.args]
    with np.errstate(all="ignore"):
        value = apply_op(s.op, args, s.dtype)
    return Scalar(_python(value, s.dtype), s.dtype)


def _exact(known: Scalar) -> Scalar:
    """A computed 16-bit literal rounded to its type (others as they are)."""
    if not known.dtype.is_narrow_float:
        return known
    return _literal(known.value, known.dtype, known.dtype)


def _literal(value, source: DType, dtype: DType) -> Scalar:
    """`value` (of type `source`) cast to `dtype`, as the interpreter casts."""
    converted = round_to(to_compute(value, source), dtype)
    return Scalar(_python(converted, dtype), dtype)


def _python(value, dtype: DType):
    v = np.asarray(value).item()
    if dtype is DType.BOOL:
        return bool(v)
    return float(v) if dtype.is_float else int(v)
