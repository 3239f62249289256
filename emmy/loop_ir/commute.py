"""Canonical operand order for commutative ops, by the structure of what each operand computes.

`add(x+x, y)` and `add(y, x+x)` both become `add(y, x+x)`: operands are sorted by a structural
key of their defining expressions (loads first, then index values, accumulators, casts,
arithmetic; literals last), never by SSA names, so the order does not depend on how the
program was written. Loop variables enter keys as (kind, depth, extent), not by name.
"""

from __future__ import annotations

import dataclasses

from emmy.loop_ir.ir import (Accum, CastTo, Compute, IndexValue, Init, Kernel, Load, Loop, Scalar,
                             Stmt)
from emmy.symbolic import FloorDiv, Lin, Mod, Sym
from emmy.tensor_ir.ir import COMMUTATIVE


def order_commutative_operands(k: Kernel) -> Kernel:
    """Sort the operands of add, multiply, maximum, minimum, eq, ne, and, or."""
    keys = StructuralKeys(k.body)
    return dataclasses.replace(k, body=_sort_block(k.body, keys))


def _sort_block(body: tuple[Stmt, ...], keys: "StructuralKeys") -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Loop):
            s = dataclasses.replace(s, body=_sort_block(s.body, keys))
        elif isinstance(s, Compute) and s.op in COMMUTATIVE:
            s = dataclasses.replace(s, args=tuple(sorted(s.args, key=keys.of)))
        out.append(s)
    return tuple(out)


class StructuralKeys:
    """Keys that compare what values compute: `of(operand)` is a nested tuple."""

    def __init__(self, body: tuple[Stmt, ...]):
        self.defs: dict[str, Stmt] = {}
        self.folds: dict[str, list[Accum]] = {}
        self.loop_vars: dict[str, str] = {}
        self._memo: dict[str, tuple] = {}
        self._scan(body, 0)

    def _scan(self, body: tuple[Stmt, ...], depth: int) -> None:
        for s in body:
            match s:
                case Loop():
                    self.loop_vars[s.var] = f"{s.kind}{depth}x{s.extent}{'r' if s.reverse else ''}"
                    self._scan(s.body, depth + 1)
                case Accum():
                    self.folds.setdefault(s.acc, []).append(s)
                case Init():
                    self.defs[s.acc] = s
                case Load() | Compute() | CastTo() | IndexValue():
                    self.defs[s.dst] = s

    def of(self, a: str | Scalar) -> tuple:
        if isinstance(a, Scalar):
            return (9, str(a.dtype), repr(a.value))
        if a not in self._memo:
            self._memo[a] = (8, "cycle")  # an accumulator read while folding into itself
            self._memo[a] = self._compute(a)
        return self._memo[a]

    def _compute(self, name: str) -> tuple:
        s = self.defs.get(name)
        match s:
            case Load():
                return (1, s.buffer, tuple(self.lin(e) for e in s.index), str(s.dtype))
            case IndexValue():
                return (2, self.lin(s.expr), str(s.dtype))
            case Init():
                folds = tuple((self.of(f.value), self.lin(f.position) if f.position else ())
                              for f in self.folds.get(name, ()))
                return (3, str(s.op), str(s.dtype), folds)
            case CastTo():
                return (4, str(s.dtype), self.of(s.arg))
            case Compute():
                args = [self.of(a) for a in s.args]
                if s.op in COMMUTATIVE:
                    args.sort()
                return (5, str(s.op), str(s.dtype), tuple(args))
        return (7, name)  # not defined in the kernel

    def lin(self, e: Lin) -> tuple:
        terms = sorted((self._atom(atom), coef) for atom, coef in e.terms)
        return (tuple(terms), e.const)

    def _atom(self, atom) -> tuple:
        match atom:
            case Sym():
                return ("s", self.loop_vars.get(atom.name, atom.name))
            case FloorDiv():
                return ("d", self.lin(atom.num), atom.den)
            case Mod():
                return ("m", self.lin(atom.num), atom.den)
        raise TypeError(f"not an index atom: {atom!r}")

