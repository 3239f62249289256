"""Place a kernel's DAG nodes into its loop nest: each at the outermost loop binding its
free variables (loop-invariant placement, as a property of construction).

There is one block per loop variable (None: the kernel's body). Output loops are nested in
`order_loops`' order, each starting after the statements of its parent block; a reduction
puts its Init and its loops in the block its free variables select, and its body inside. So
RMSNorm becomes `for a0 { acc = init; reduce a1 {…}; v = rsqrt(…); for a2 { store } }`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from math import prod

from emmy.errors import InternalError
from emmy.loop_ir.inline import (Dag, NCast, NCompute, NIndex, NLoad, NReduce, NScan, children)
from emmy.loop_ir.ir import (Accum, CastTo, Compute, IndexValue, Init, Load, Loop, LoopKind, Stmt,
                             Store)


def order_loops(dag: Dag, roots: list[int], out_vars: tuple[str, ...],
                scan_var: str | None) -> list[str]:
    """Output axes ordered so that each reduction's free variables form a prefix where possible.

    Smaller variable sets go first (a per-row statistic before a per-element one); the scan
    axis, when there is one, is innermost.
    """
    candidates = set(out_vars) - {scan_var}
    sets = {dag.free[n] for n in dag.reductions(roots) if dag.free[n] <= candidates}
    order: list[str] = []
    for s in sorted(sets, key=lambda s: (len(s), sorted(out_vars.index(v) for v in s))):
        order += [v for v in out_vars if v in s and v not in order]
    order += [v for v in out_vars if v not in order and v != scan_var]
    return order + ([scan_var] if scan_var else [])


@dataclass(frozen=True, slots=True)
class _Open:
    """A placeholder for the loop over `var`, filled in when the blocks are assembled."""

    var: str


class Placer:
    """Places DAG nodes into blocks, one block per loop variable (None: the kernel's body)."""

    def __init__(self, dag: Dag, order: list[str], scan_var: str | None, reverse: bool):
        self.dag = dag
        self.order = order
        self.blocks: dict[str | None, list] = {None: []}
        self.chain: dict[str, tuple[str, ...]] = {}
        self.loops: dict[str, tuple[int, LoopKind, bool]] = {}
        for k, v in enumerate(order):
            self.chain[v] = tuple(order[:k + 1])
            self.blocks[v] = []
            kind = LoopKind.SCAN if v == scan_var else LoopKind.PARALLEL
            self.loops[v] = (dag.extents[v], kind, reverse and v == scan_var)
        self.names: dict[int, str] = {}
        self.counts: Counter[str] = Counter()
        self.pending: list[tuple[str, Accum]] = []  # exclusive scans fold after the store
        self.placed: list[tuple[int, str | None]] = []  # reductions and their blocks
        self.scan_acc: str | None = None  # the accumulator of the scan loop, if any

    def run(self, roots: list[int], buffers: tuple[str, ...], index) -> tuple[Stmt, ...]:
        values = [self.emit(r) for r in roots]
        inner = self.order[-1] if self.order else None
        for buffer, value in zip(buffers, values):
            self.blocks[inner].append(Store(buffer, index, value))
        for var, accum in self.pending:
            self.blocks[var].append(accum)
        return self.assemble(None)

    def emit(self, n: int) -> str:
        """The name of node `n`'s value, emitting it and what it reads first (depth first, by
        hand: long chains must not exhaust Python's recursion limit)."""
        stack = [(n, False)]
        while stack:
            m, ready = stack.pop()
            if m in self.names:
                continue
            node = self.dag.nodes[m]
            if ready:
                self.names[m] = self.leave(m, node)
                continue
            if isinstance(node, NReduce):
                self.open_loops(m, node)  # its body is placed inside its loops
            elif isinstance(node, NScan):
                self.start_scan(node)
            stack.append((m, True))
            stack.extend((c, False) for c in reversed(children(node)) if c not in self.names)
        return self.names[n]

    def leave(self, m: int, node) -> str:
        """Emit one node whose operands are emitted; returns its value's name."""
        key = self.block_of(self.dag.free[m])
        args = {c: self.names[c] for c in children(node)}
        match node:
            case NLoad():
                dyn = tuple(args[c] for c in node.dyn)
                return self.put(key, "in", lambda d: Load(d, node.buffer, node.index, node.dtype,
                                                          dyn))
            case NCompute():
                ops = tuple(args[a] if isinstance(a, int) else a for a in node.args)
                return self.put(key, "v", lambda d: Compute(d, node.op, ops, node.dtype))
            case NCast():
                return self.put(key, "v", lambda d: CastTo(d, args[node.arg], node.dtype))
            case NIndex():
                return self.put(key, "v", lambda d: IndexValue(d, node.expr, node.dtype))
            case NReduce():
                return self.close_loops(m, node, key, args[node.value])
            case NScan():
                return self.fold_scan(node, args[node.value])
        raise InternalError(f"unknown DAG node {node!r}")

    def block_of(self, free: frozenset[str]) -> str | None:
        """The block of the innermost loop binding one of `free`; it must bind all of them."""
        if not free:
            return None
        deepest = max(sorted(free), key=lambda v: len(self.chain[v]))
        if not free <= set(self.chain[deepest]):
            raise InternalError(f"loop variables {sorted(free)} are not nested in one another")
        return deepest

    def put(self, key: str | None, prefix: str, make) -> str:
        dst = self.fresh(prefix)
        self.blocks[key].append(make(dst))
        return dst

    def open_loops(self, m: int, node: NReduce) -> None:
        """Bind a reduction's loop variables inside the block where the reduction lands."""
        outer = self.block_of(self.dag.free[m])
        for var, extent in node.loops:
            self.chain[var] = (self.chain[outer] if outer else ()) + (var,)
            self.blocks[var] = []
            self.loops[var] = (extent, LoopKind.REDUCE, False)
            outer = var

    def close_loops(self, m: int, node: NReduce, key: str | None, value: str) -> str:
        """Fold the body's value; the Init and the loop nest go to the reduction's block."""
        acc = self.fresh("acc")
        names = [v for v, _ in node.loops]
        self.blocks[names[-1]].append(Accum(acc, node.op, value, node.position))
        for parent, child in reversed(list(zip(names, names[1:]))):
            self.blocks[parent].append(_Open(child))
        self.blocks[key] += [Init(acc, node.op, node.dtype), _Open(names[0])]
        self.placed.append((m, key))
        return acc

    def start_scan(self, node: NScan) -> None:
        """The scan's accumulator starts in the block around the scan loop."""
        chain = self.chain[node.var]
        acc = self.fresh("acc")
        self.scan_acc = acc
        self.blocks[chain[-2] if len(chain) > 1 else None].append(Init(acc, node.op, node.dtype))

    def fold_scan(self, node: NScan, value: str) -> str:
        accum = Accum(self.scan_acc, node.op, value)
        if node.exclusive:
            self.pending.append((node.var, accum))  # the store reads the value before the fold
        else:
            self.blocks[node.var].append(accum)
        return self.scan_acc

    def fresh(self, prefix: str) -> str:
        name = f"{prefix}{self.counts[prefix]}"
        self.counts[prefix] += 1
        return name

    def assemble(self, key: str | None) -> tuple[Stmt, ...]:
        out: list[Stmt] = []
        for item in self.blocks[key]:
            out.append(self.loop(item.var) if isinstance(item, _Open) else item)
        at = self.order.index(key) + 1 if key in self.order else (0 if key is None else None)
        if at is not None and at < len(self.order):
            out.append(self.loop(self.order[at]))
        return tuple(out)

    def loop(self, var: str) -> Loop:
        extent, kind, reverse = self.loops[var]
        return Loop(var, extent, kind, self.assemble(var), reverse)

    def statements(self):
        for block in self.blocks.values():
            yield from (s for s in block if not isinstance(s, _Open))

    def recomputed(self) -> dict[str, tuple[int, int]]:
        """Per reduction (the Tensor IR tensor it computes): how many copies the kernel has,
        and the largest factor by which one runs more often than the reduction has distinct
        values."""
        worst: dict[str, tuple[int, int]] = {}  # source -> (copies, largest factor)
        for n, key in self.placed:
            node = self.dag.nodes[n]
            runs = prod(self.dag.extents[v] for v in (self.chain[key] if key else ()))
            distinct = prod(self.dag.extents[v] for v in self.dag.free[n])
            copies, factor = worst.get(node.source, (0, 1))
            worst[node.source] = (copies + 1, max(factor, runs // max(distinct, 1)))
        return worst

    def recompute_notes(self, kernel: str) -> list[str]:
        """Say which reductions run more often than they have distinct values (one note per
        reduction: how many copies the kernel has, and the worst factor)."""
        return [f"reduction `{source}` is recomputed up to {factor}x in `{kernel}`"
                + (f" ({copies} copies)" if copies > 1 else "")
                + ": a consumer reads it inside loops it does not depend on (PLACE=cut in Tile "
                  "IR stores it once: the default where a matrix-product template does not tile "
                  "the chain)"
                for source, (copies, factor) in self.recomputed().items() if factor > 1]
