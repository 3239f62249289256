"""Canonical statement order: each block is re-emitted from its effects, depth first.

The effects of a block (stores, folds into accumulators of an enclosing block, and loops that
contain either) keep their order. Everything else is emitted just before its first reader,
operands in their (canonical) order, so two programs that differ only in the order of
independent statements get the same body. An accumulator is read after its last fold and
folded after its earlier reads; statements nothing needs are dropped.
"""

from __future__ import annotations

import dataclasses

from emmy.loop_ir.dataflow import defined, has_store, modified, reads
from emmy.loop_ir.ir import Accum, Init, Kernel, Loop, Stmt, Store


def order_statements(k: Kernel) -> Kernel:
    """Re-emit every block in canonical order (inner blocks first)."""
    return dataclasses.replace(k, body=_block(k.body))


def _block(body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    body = tuple(dataclasses.replace(s, body=_block(s.body)) if isinstance(s, Loop) else s
                 for s in body)
    deps = _dependencies(body)
    local_accs = {s.acc for s in body if isinstance(s, Init)}
    out: list[int] = []
    done: set[int] = set()

    def visit(i: int) -> None:
        stack = [(i, iter(deps[i]))]
        done.add(i)
        while stack:
            j, rest = stack[-1]
            nxt = next((d for d in rest if d not in done), None)
            if nxt is None:
                stack.pop()
                out.append(j)
            else:
                done.add(nxt)
                stack.append((nxt, iter(deps[nxt])))

    for i, s in enumerate(body):
        if _is_effect(s, local_accs) and i not in done:
            visit(i)
    return tuple(body[i] for i in out)


def _is_effect(s: Stmt, local_accs: set[str]) -> bool:
    match s:
        case Store():
            return True
        case Accum():
            return s.acc not in local_accs
        case Loop():
            return has_store(s) or bool(modified(s) - local_accs)
    return False


def _dependencies(body: tuple[Stmt, ...]) -> list[list[int]]:
    """For each statement, the earlier statements of the block it must follow, in order."""
    value_at: dict[str, int] = {}        # value -> the statement defining it
    writer: dict[str, int] = {}          # accumulator -> its latest Init or fold
    readers: dict[str, list[int]] = {}   # accumulator -> reads since that write
    accs = {s.acc for s in body if isinstance(s, Init)} | {a for s in body for a in modified(s)}
    deps: list[list[int]] = []
    for i, s in enumerate(body):
        mine: list[int] = []
        for name in reads(s):
            if name in value_at:
                mine.append(value_at[name])
            elif name in writer:
                mine.append(writer[name])
        for acc in sorted(modified(s)):
            if acc in writer:
                mine.append(writer[acc])
            mine += readers.get(acc, [])
        deps.append(mine)
        for name in reads(s):
            if name in accs:
                readers.setdefault(name, []).append(i)
        name = defined(s)
        if isinstance(s, Init):
            writer[s.acc] = i
            readers[s.acc] = []
        elif name is not None:
            value_at[name] = i
        for acc in modified(s):
            writer[acc] = i
            readers[acc] = []
    return deps
