"""Sequential SSA renaming: loads in0, in1, …, values v0, v1, …, accumulators acc0, …, loop
variables a0, a1, … in order of appearance. The kernel's inputs follow their first load."""

from __future__ import annotations

import dataclasses
from collections import Counter

from emmy import symbolic
from emmy.loop_ir.ir import (Accum, CastTo, Compute, IndexValue, Init, Kernel, Load, Loop, Stmt,
                             Store)


def rename_ssa(k: Kernel) -> Kernel:
    """Rename every definition and loop variable in order; order inputs by first load."""
    renamer = _Renamer()
    body = renamer.block(k.body)
    order = {b: i for i, b in enumerate(renamer.loaded)}
    inputs = tuple(sorted((b for b in k.inputs if b.name in order), key=lambda b: order[b.name]))
    return dataclasses.replace(k, inputs=inputs, body=body)


class _Renamer:
    def __init__(self):
        self.names: dict[str, str] = {}
        self.vars: dict[str, symbolic.Lin] = {}
        self.bounds: dict[str, int] = {}
        self.counts: Counter[str] = Counter()
        self.loaded: dict[str, None] = {}

    def fresh(self, old: str, prefix: str) -> str:
        new = f"{prefix}{self.counts[prefix]}"
        self.counts[prefix] += 1
        self.names[old] = new
        return new

    def arg(self, a):
        return self.names.get(a, a) if isinstance(a, str) else a

    def index(self, e: symbolic.Lin) -> symbolic.Lin:
        return symbolic.substitute(e, self.vars, self.bounds)

    def block(self, body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
        return tuple(self.stmt(s) for s in body)

    def stmt(self, s: Stmt) -> Stmt:
        match s:
            case Loop():
                var = f"a{self.counts['a']}"
                self.counts["a"] += 1
                self.vars[s.var] = symbolic.var(var)
                self.bounds[var] = s.extent
                return dataclasses.replace(s, var=var, body=self.block(s.body))
            case Load():
                self.loaded.setdefault(s.buffer, None)
                index = tuple(self.index(e) for e in s.index)
                dyn = tuple(self.arg(a) for a in s.dyn)
                return dataclasses.replace(s, dst=self.fresh(s.dst, "in"), index=index, dyn=dyn)
            case Compute():
                args = tuple(self.arg(a) for a in s.args)
                return dataclasses.replace(s, dst=self.fresh(s.dst, "v"), args=args)
            case CastTo():
                return dataclasses.replace(s, dst=self.fresh(s.dst, "v"), arg=self.arg(s.arg))
            case IndexValue():
                return dataclasses.replace(s, dst=self.fresh(s.dst, "v"), expr=self.index(s.expr))
            case Init():
                return dataclasses.replace(s, acc=self.fresh(s.acc, "acc"))
            case Accum():
                position = self.index(s.position) if s.position is not None else None
                return dataclasses.replace(s, acc=self.arg(s.acc), value=self.arg(s.value),
                                           position=position)
            case Store():
                index = tuple(self.index(e) for e in s.index)
                return dataclasses.replace(s, index=index, value=self.arg(s.value))
        raise TypeError(f"not a Loop IR statement: {s!r}")
