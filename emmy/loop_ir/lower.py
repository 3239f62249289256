"""Lower Tensor IR to Loop IR: one loop nest per kernel, after fusion by inlining.

For each kernel of the fusion plan, the stored tensors' elements become one expression DAG
(`inline.py`); then each DAG node is placed at the outermost loop where all its free variables
are bound. Output loops come in an order that lets reductions sit as far out as possible, so
RMSNorm's row statistic is folded once per row, before the loop over the row's columns:

    for a0 { acc = init; reduce a1 {…}; v = rsqrt(…); for a2 { store } }

A loop over an output axis starts only after the statements that do not depend on it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from math import prod

from emmy import symbolic
from emmy.errors import InternalError
from emmy.loop_ir.fuse import KernelPlan, plan_fusion
from emmy.loop_ir.inline import Dag, Inliner, NCast, NCompute, NIndex, NLoad, NReduce, NScan
from emmy.loop_ir.ir import (Accum, Buffer, CastTo, Compute, IndexValue, Init, Kernel, Load, Loop,
                             LoopKind, LoopProgram, Stmt, Store)
from emmy.loop_ir.names import kernel_name
from emmy.loop_ir.normalize import normalize
from emmy.tensor_ir.ir import Program


def lower(p: Program, *, normalized: bool = True) -> LoopProgram:
    """Fuse, build one kernel per group of stored tensors, normalize each kernel (unless
    `normalized` is false: then the kernels are as built, for comparison)."""
    plan = plan_fusion(p)
    defs = {d.name: d for d in p.defs}
    notes = list(plan.notes)
    kernels = []
    single = len(plan.kernels) == 1
    names = {d.name: d.name for d in p.inputs} | plan.buffers
    for i, kp in enumerate(plan.kernels):
        name = kernel_name(i, defs[kp.roots[0]], p.name, single)
        kernel, extra = build_kernel(p, kp, set(plan.stored), name, names)
        kernels.append(normalize(kernel) if normalized else kernel)
        notes += extra
    outputs = set(p.outputs)
    return LoopProgram(
        name=p.name,
        inputs=tuple(Buffer(d.name, d.type) for d in p.inputs),
        intermediates=tuple(Buffer(names[n], defs[n].type) for n in plan.stored if n not in outputs),
        outputs=tuple(Buffer(names[n], defs[n].type) for n in p.outputs),
        kernels=tuple(kernels),
        notes=tuple(notes))


def build_kernel(p: Program, kp: KernelPlan, stored: set[str], name: str,
                 buffers: dict[str, str]) -> tuple[Kernel, list[str]]:
    """The (unnormalized) kernel computing `kp.roots`, and notes on what it recomputes;
    `buffers` names the buffer of each input and stored tensor."""
    defs = {d.name: d for d in p.defs}
    shape = defs[kp.roots[0]].type.shape
    out_vars = tuple(f"o{i}" for i in range(len(shape)))
    dag = Dag(dict(zip(out_vars, shape)))
    loaded = (stored - set(kp.roots)) | {d.name for d in p.inputs}
    inliner = Inliner(p, {n: buffers[n] for n in loaded}, kp.scan, out_vars, dag)
    identity = tuple(symbolic.var(v) for v in out_vars)
    roots = [inliner.value(r, identity) for r in kp.roots]
    scan_var = out_vars[defs[kp.scan].axis] if kp.scan else None
    order = order_loops(dag, roots, out_vars, scan_var)
    emitter = _Emitter(dag, order, scan_var, defs[kp.scan].reverse if kp.scan else False)
    body = emitter.run(roots, tuple(buffers[r] for r in kp.roots), identity)
    reads = {s.buffer for s in emitter.statements() if isinstance(s, Load)}
    kernel = Kernel(name=name,
                    inputs=tuple(Buffer(buffers[n], defs[n].type) for n in loaded
                                 if buffers[n] in reads),
                    outputs=tuple(Buffer(buffers[r], defs[r].type) for r in kp.roots),
                    body=body)
    return kernel, emitter.recompute_notes(name)


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


class _Emitter:
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

    def run(self, roots: list[int], buffers: tuple[str, ...], index) -> tuple[Stmt, ...]:
        values = [self.emit(r) for r in roots]
        inner = self.order[-1] if self.order else None
        for buffer, value in zip(buffers, values):
            self.blocks[inner].append(Store(buffer, index, value))
        for var, accum in self.pending:
            self.blocks[var].append(accum)
        return self.assemble(None)

    def emit(self, n: int) -> str:
        if n in self.names:
            return self.names[n]
        node, key = self.dag.nodes[n], self.block_of(self.dag.free[n])
        match node:
            case NLoad():
                dst = self.put(key, "in", lambda d: Load(d, node.buffer, node.index, node.dtype))
            case NCompute():
                args = tuple(self.emit(a) if isinstance(a, int) else a for a in node.args)
                dst = self.put(key, "v", lambda d: Compute(d, node.op, args, node.dtype))
            case NCast():
                arg = self.emit(node.arg)
                dst = self.put(key, "v", lambda d: CastTo(d, arg, node.dtype))
            case NIndex():
                dst = self.put(key, "v", lambda d: IndexValue(d, node.expr, node.dtype))
            case NReduce():
                dst = self.reduce(n, node, key)
            case NScan():
                dst = self.scan(node)
            case _:
                raise InternalError(f"unknown DAG node {node!r}")
        self.names[n] = dst
        return dst

    def block_of(self, free: frozenset[str]) -> str | None:
        """The block of the innermost loop binding one of `free`; it must bind all of them."""
        if not free:
            return None
        deepest = max(sorted(free), key=lambda v: len(self.chain[v]))
        if not free <= set(self.chain[deepest]):
            raise InternalError(f"loop variables {sorted(free)} are not nested in one another")
        return deepest

    def put(self, key: str | None, prefix: str, make) -> str:
        dst = f"{prefix}{self.counts[prefix]}"
        self.counts[prefix] += 1
        self.blocks[key].append(make(dst))
        return dst

    def reduce(self, n: int, node: NReduce, key: str | None) -> str:
        acc = f"acc{self.counts['acc']}"
        self.counts["acc"] += 1
        outer = key
        for var, extent in node.loops:
            self.chain[var] = (self.chain[outer] if outer else ()) + (var,)
            self.blocks[var] = []
            self.loops[var] = (extent, LoopKind.REDUCE, False)
            outer = var
        value = self.emit(node.value)
        self.blocks[outer].append(Accum(acc, node.op, value, node.position))
        names = [v for v, _ in node.loops]
        for parent, child in reversed(list(zip(names, names[1:]))):
            self.blocks[parent].append(_Open(child))
        self.blocks[key] += [Init(acc, node.op, node.dtype), _Open(names[0])]
        self.placed.append((n, key))
        return acc

    def scan(self, node: NScan) -> str:
        acc = f"acc{self.counts['acc']}"
        self.counts["acc"] += 1
        chain = self.chain[node.var]
        self.blocks[chain[-2] if len(chain) > 1 else None].append(Init(acc, node.op, node.dtype))
        accum = Accum(acc, node.op, self.emit(node.value))
        if node.exclusive:
            self.pending.append((node.var, accum))  # the store reads the value before the fold
        else:
            self.blocks[node.var].append(accum)
        return acc

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

    def recompute_notes(self, kernel: str) -> list[str]:
        """Say which reductions run more often than they have distinct values."""
        notes = []
        for n, key in self.placed:
            node = self.dag.nodes[n]
            runs = prod(self.dag.extents[v] for v in (self.chain[key] if key else ()))
            distinct = prod(self.dag.extents[v] for v in self.dag.free[n])
            if runs > distinct:
                notes.append(f"reduction `{node.source}` is recomputed {runs // distinct}x in "
                             f"`{kernel}`: its consumer reads it inside loops it does not depend "
                             f"on (fused by default; PLACE=cut in Tile IR would store it once)")
        return notes

