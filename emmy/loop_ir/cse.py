"""Common-subexpression elimination within scope, and load deduplication (its special case).

A pure statement equal to one already in scope (same op, same operands, same type; for a load
the same buffer and index) is dropped and its uses read the earlier value. Accumulators change,
so an operand that names one is versioned: each fold (and each loop that folds) starts a new
version, and only equal versions match.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from emmy.loop_ir.dataflow import PURE, modified, rename_reads
from emmy.loop_ir.ir import Accum, CastTo, Compute, IndexValue, Kernel, Load, Loop, Stmt


def dedupe_loads(k: Kernel) -> Kernel:
    """Loads of the same buffer at the same index, in scope, become one load."""
    return _merge(k, (Load,))


def eliminate_common_subexpressions(k: Kernel) -> Kernel:
    """Equal pure statements in scope become one (loads, arithmetic, casts, index values)."""
    return _merge(k, PURE)


def _merge(k: Kernel, kinds: tuple[type, ...]) -> Kernel:
    body = _block(k.body, {}, kinds, {}, Counter())
    return dataclasses.replace(k, body=body)


def _block(body: tuple[Stmt, ...], outer: dict, kinds, renames: dict[str, str],
           versions: Counter) -> tuple[Stmt, ...]:
    table = dict(outer)  # what this block sees: the outer scope, then its own statements
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Loop):
            folded = modified(s)
            versions.update(folded)  # inside the loop the accumulators differ from before it
            inner = _block(s.body, table, kinds, renames, versions)
            versions.update(folded)  # and after it they differ from inside it
            out.append(dataclasses.replace(s, body=inner))
            continue
        s = rename_reads(s, renames)
        if isinstance(s, Accum):
            versions[s.acc] += 1
        if isinstance(s, kinds):
            key = _key(s, versions)
            if key in table:
                renames[s.dst] = table[key]
                continue
            table[key] = s.dst
        out.append(s)
    return tuple(out)


def _key(s: Stmt, versions: Counter) -> tuple:
    """What a pure statement computes, independent of the name it defines."""
    match s:
        case Load():
            return ("load", s.buffer, s.index, s.dtype, tuple((a, versions[a]) for a in s.dyn))
        case Compute():
            args = tuple((a, versions[a]) if isinstance(a, str) else ("lit", repr(a.value), a.dtype)
                         for a in s.args)
            return ("compute", s.op, args, s.dtype)
        case CastTo():
            return ("cast", (s.arg, versions[s.arg]), s.dtype)
        case IndexValue():
            return ("index", s.expr, s.dtype)
    raise TypeError(f"not a pure statement: {s!r}")
