"""Queries over Loop IR statements: what a statement defines, reads and modifies.

The passes (normalize, interp, printer) share these so that the scoping rules of the IR are
written once: SSA values are defined by Load / Compute / CastTo / IndexValue, accumulators by
Init and changed by Accum; a Loop reads whatever its body reads from outside it.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Mapping

from emmy import symbolic
from emmy.loop_ir.ir import (Accum, CastTo, Compute, IndexValue, Init, Load, Loop, Stmt, Store)

PURE = (Load, Compute, CastTo, IndexValue)  # statements with no effect besides their value


def defined(s: Stmt) -> str | None:
    """The name a statement defines (a value, or an accumulator for Init)."""
    match s:
        case Load() | Compute() | CastTo() | IndexValue():
            return s.dst
        case Init():
            return s.acc
    return None


def reads(s: Stmt) -> tuple[str, ...]:
    """The names a statement reads directly (an Accum reads its value, not its accumulator)."""
    match s:
        case Compute():
            return tuple(a for a in s.args if isinstance(a, str))
        case CastTo():
            return (s.arg,)
        case Store():
            return (s.value,)
        case Accum():
            return (s.value,)
        case Load():
            return s.dyn
        case Loop():
            return free_reads(s.body)
    return ()


def free_reads(body: tuple[Stmt, ...]) -> tuple[str, ...]:
    """Names a block reads but does not define, in order of first use."""
    seen: dict[str, None] = {}
    local: set[str] = set()
    for s in body:
        for name in reads(s):
            if name not in local:
                seen.setdefault(name, None)
        name = defined(s)
        if name is not None:
            local.add(name)
    return tuple(seen)


def modified(s: Stmt) -> frozenset[str]:
    """Accumulators a statement folds into (for a Loop: anywhere in its body)."""
    match s:
        case Accum():
            return frozenset((s.acc,))
        case Loop():
            return frozenset().union(*(modified(t) for t in s.body))
    return frozenset()


def has_store(s: Stmt) -> bool:
    match s:
        case Store():
            return True
        case Loop():
            return any(has_store(t) for t in s.body)
    return False


def index_exprs(s: Stmt) -> tuple[symbolic.Lin, ...]:
    """The index expressions a statement evaluates directly (a load's may also name its
    gathered values, `@k`: see `loop_vars`)."""
    match s:
        case Load() | Store():
            return s.index
        case IndexValue():
            return (s.expr,)
        case Accum() if s.position is not None:
            return (s.position,)
    return ()


def loop_vars(e: symbolic.Lin) -> frozenset[str]:
    """The loop variables an index expression uses (not a load's gathered values, `@k`)."""
    return frozenset(v for v in e.free_vars() if not v.startswith("@"))


def walk(body: tuple[Stmt, ...]) -> Iterator[Stmt]:
    """Every statement, loops before their bodies, in program order."""
    for s in body:
        yield s
        if isinstance(s, Loop):
            yield from walk(s.body)


def loops(body: tuple[Stmt, ...]) -> Iterator[Loop]:
    return (s for s in walk(body) if isinstance(s, Loop))


def rename_reads(s: Stmt, names: Mapping[str, str]) -> Stmt:
    """The statement with its read names (not its definition) replaced through `names`."""
    if not names:
        return s
    match s:
        case Compute():
            args = tuple(names.get(a, a) if isinstance(a, str) else a for a in s.args)
            return dataclasses.replace(s, args=args) if args != s.args else s
        case CastTo() if s.arg in names:
            return dataclasses.replace(s, arg=names[s.arg])
        case Store() if s.value in names:
            return dataclasses.replace(s, value=names[s.value])
        case Accum() if s.value in names:
            return dataclasses.replace(s, value=names[s.value])
        case Load() if names.keys() & set(s.dyn):
            return dataclasses.replace(s, dyn=tuple(names.get(a, a) for a in s.dyn))
        case Loop():
            return dataclasses.replace(s, body=tuple(rename_reads(t, names) for t in s.body))
    return s


def loop_extents(body: tuple[Stmt, ...]) -> dict[str, int]:
    """The extent of every loop variable in `body`, nested loops included."""
    out: dict[str, int] = {}
    for s in body:
        if isinstance(s, Loop):
            out[s.var] = s.extent
            out.update(loop_extents(s.body))
    return out
