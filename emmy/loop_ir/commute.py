"""Canonical operand order for commutative ops, by the structure of what each operand computes.

`add(x+x, y)` and `add(y, x+x)` both become `add(y, x+x)`: operands are sorted by a structural
key of their defining expressions (loads first, then index values, accumulators, casts,
arithmetic; literals last), never by SSA names, so the order does not depend on how the
program was written. Loop variables enter keys as (kind, depth, extent), not by name.

A key is flat: (rank, label, type, digest), the digest hashing the keys of the operands, so
keys are cheap to compare however deep the expression.
"""

from __future__ import annotations

import dataclasses
import hashlib

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


CYCLE = (8, "cycle", "", "")  # an accumulator read while folding into itself


class StructuralKeys:
    """Keys that compare what values compute: `of(operand)` is (rank, label, type, digest)."""

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
            return (9, str(a.dtype), repr(a.value), "")
        if a not in self._memo:
            self._fill(a)
        return self._memo[a]

    def _fill(self, name: str) -> None:
        """Compute the keys `name` depends on, operands first (by hand, not by recursion)."""
        stack, started = [name], set()
        while stack:
            n = stack[-1]
            if n in self._memo:
                stack.pop()
                continue
            if n not in started:
                started.add(n)
                todo = [d for d in self._operands(n) if d not in self._memo and d not in started]
                if todo:
                    stack.extend(todo)
                    continue
            stack.pop()
            self._memo[n] = self._compute(n)

    def _operands(self, name: str) -> list[str]:
        s = self.defs.get(name)
        match s:
            case Init():
                return [f.value for f in self.folds.get(name, ())]
            case CastTo():
                return [s.arg]
            case Compute():
                return [a for a in s.args if isinstance(a, str)]
            case Load():
                return list(s.dyn)
        return []

    def _key(self, a: str | Scalar) -> tuple:
        return self.of(a) if isinstance(a, Scalar) else self._memo.get(a, CYCLE)

    def _compute(self, name: str) -> tuple:
        s = self.defs.get(name)
        match s:
            case Load():
                index = tuple(self.lin(e) for e in s.index)
                dyn = tuple(self._key(a) for a in s.dyn)
                return _flat(1, s.buffer, s.dtype, (index, dyn) if dyn else index)
            case IndexValue():
                return _flat(2, "", s.dtype, self.lin(s.expr))
            case Init():
                folds = tuple((self._key(f.value), self.lin(f.position) if f.position else ())
                              for f in self.folds.get(name, ()))
                return _flat(3, str(s.op), s.dtype, folds)
            case CastTo():
                return _flat(4, "", s.dtype, self._key(s.arg))
            case Compute():
                args = [self._key(a) for a in s.args]
                if s.op in COMMUTATIVE:
                    args.sort()
                return _flat(5, str(s.op), s.dtype, tuple(args))
        return (7, name, "", "")  # not defined in the kernel

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


def _flat(rank: int, label: str, dtype, content) -> tuple:
    digest = hashlib.sha256(repr((rank, label, str(dtype), content)).encode()).hexdigest()[:16]
    return (rank, label, str(dtype), digest)
