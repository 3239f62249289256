"""Lower Tensor IR to Loop IR: one loop nest per kernel, after fusion by inlining.

    plan_fusion   fuse.py     which tensors are stored, which kernel computes each
    Inliner       inline.py   a kernel's stored elements as one scalar expression DAG
    Placer        place.py    each DAG node at the outermost loop binding its variables
    normalize     normalize.py  the canonical form (CSE, operand order, hoisting, names)

When a kernel would grow past MAX_NODES (inlining copies a reduction per index it is read
at, which can compound), one more tensor is stored and the program is planned again. So is an
attention's scores product kept fused (`attention_scores`) whose kernel no flash template takes
(Tile IR's recognizer decides: a key operand not read along a contiguous head dimension, say,
as in softmax(x @ W) @ E with W stored (in, out)): fused, every output element would compute
its row's scores again.
"""

from __future__ import annotations

from collections import Counter

from emmy import symbolic
from emmy.loop_ir.fuse import (KernelPlan, attention_operands, attention_scores,
                               compared_extrema, elementwise_operands, gathered_reads,
                               normalized_operands, plan_fusion, recomputed_products,
                               recomputed_statistics, reduced_products, scaled_products,
                               shared_statistics, windowed_reads)
from emmy.loop_ir.inline import Dag, Inliner, KernelTooLarge
from emmy.loop_ir.ir import Buffer, Kernel, Load, LoopProgram
from emmy.loop_ir.names import kernel_name
from emmy.loop_ir.normalize import normalize
from emmy.loop_ir.place import Placer, order_loops
from emmy.tensor_ir.builder import operands
from emmy.tensor_ir.ir import IndexMap, Input, Program, Reduce


MAX_NODES = 1024  # DAG nodes (about statements) one kernel may reach before something is stored


def lower(p: Program, *, normalized: bool = True) -> LoopProgram:
    """Fuse, build one kernel per group of stored tensors, normalize each kernel (unless
    `normalized` is false: then the kernels are as built, for comparison)."""
    defs = {d.name: d for d in p.defs}
    plan, built = _build_within_budget(p)
    names = {d.name: d.name for d in p.inputs} | plan.buffers
    outputs = set(p.outputs)
    return LoopProgram(
        name=p.name,
        inputs=tuple(Buffer(d.name, d.type) for d in p.inputs),
        intermediates=tuple(Buffer(names[n], defs[n].type) for n in plan.stored if n not in outputs),
        outputs=tuple(Buffer(names[n], defs[n].type) for n in p.outputs),
        kernels=tuple(normalize(k) if normalized else k for k, _ in built),
        notes=plan.notes + tuple(n for _, extra in built for n in extra), tf32=p.tf32)


def _build_within_budget(p: Program, memo: dict | None = None):
    """Plan and build every kernel; while one passes MAX_NODES, store one more tensor; while an
    attention's scores are fused into a kernel no flash template takes, store them. `memo`
    holds the kernels built so far (by what each build read)."""
    defs = {d.name: d for d in p.defs}
    forced: dict[str, str] = (windowed_reads(p) | reduced_products(p) | attention_operands(p)
                              | gathered_reads(p) | normalized_operands(p)
                              | elementwise_operands(p) | scaled_products(p))
    scores = attention_scores(p)
    flashless: set[str] = set()
    budget: int | None = MAX_NODES
    # Each pass plans again and builds every kernel; a kernel whose build reads the same
    # things as in an earlier pass is taken from that pass (a long chain, an unrolled
    # recurrence, stores one tensor per pass: without this, passes x kernels builds).
    memo = {} if memo is None else memo
    flash: dict[tuple, bool] = {}
    while True:
        plan = plan_fusion(p, forced)
        names = {d.name: d.name for d in p.inputs} | plan.buffers
        # a kernel storing only tensors of no elements has nothing to do: none is built
        kernels = [kp for kp in plan.kernels
                   if not all(0 in defs[r].type.shape for r in kp.roots)]
        single = len(kernels) == 1
        loaded_all = set(plan.stored) | {d.name for d in p.inputs}
        try:
            built, unflashed, uses, reruns = [], set(), [], []
            for i, kp in enumerate(kernels):
                name = kernel_name(i, defs[kp.roots[0]], p.name, single)
                frontier = _frontier(defs, kp.roots, loaded_all)
                key = (kp, name, budget, tuple(names[r] for r in kp.roots),
                       tuple((n, names[n]) for n in sorted(frontier)))
                if key not in memo:
                    inlined: Counter[str] = Counter()
                    rerun: dict[str, tuple[int, int]] = {}
                    memo[key] = (build_kernel(p, kp, set(plan.stored), name, names, budget,
                                              inlined, rerun), inlined, rerun)
                kernel, inlined, rerun = memo[key]
                built.append(kernel)
                uses.append(inlined)
                reruns.append(rerun)
                fused = {scores[n] for n in scores.keys() & inlined.keys()} - set(plan.stored)
                if fused and key not in flash:
                    flash[key] = _flash(kernel[0])
                if fused and not flash[key]:
                    unflashed |= fused
            recomputed = {n: why for n, why in (recomputed_products(p, uses)
                                                | recomputed_statistics(p, reruns)
                                                | shared_statistics(p, uses, set(plan.stored))
                                                | compared_extrema(
                                                    p, uses, [kp.roots for kp in kernels],
                                                    set(plan.stored))).items()
                          if n not in plan.stored}
            if recomputed:
                forced |= recomputed
                continue
            if not unflashed:
                return plan, built
            for name in sorted(unflashed):
                forced[name] = ("attention's scores, which no flash template takes here (Tile "
                                "IR's recognizer refused the fused kernel): stored, they are a "
                                "matrix-product kernel; inlined, every output element would "
                                "compute its row's scores again")
            flashless |= unflashed    # their softmax is an operand like any other now
            forced = normalized_operands(p, frozenset(flashless)) | forced
        except KernelTooLarge as e:
            cut = choose_cut(p, e.uses, set(plan.stored))
            if cut is None:
                budget = None  # nothing worth storing: accept the large kernel
                continue
            for cut, uses in _cuts_ahead(p, kp, cut, e.uses, set(plan.stored), budget):
                forced[cut] = (f"inlined, it would be computed at {uses} different indices "
                               f"in one kernel, which would pass {MAX_NODES} statements")


def _cuts_ahead(p: Program, kp: KernelPlan, cut: str, uses, stored: set[str], budget: int,
                limit: int = 512):
    """`cut` and its count of uses, then the cuts the next passes would make in the same
    kernel while it still passes the budget with those stored (an unrolled recurrence whose
    outputs one kernel stacks stores each step's state in one pass, not in one pass of
    planning and building the whole program per step)."""
    stored = set(stored)
    for _ in range(limit):
        yield cut, uses[cut]
        stored.add(cut)
        loaded = stored | {d.name for d in p.inputs}
        try:
            build_kernel(p, kp, stored, "probe", {n: n for n in loaded | set(kp.roots)},
                         budget)
            return
        except KernelTooLarge as e:
            uses = e.uses
        cut = choose_cut(p, uses, stored)
        if cut is None:
            return


def _frontier(defs, roots, loaded: set[str]) -> frozenset[str]:
    """The loaded tensors a kernel computing `roots` reads: what its build depends on, besides
    the roots themselves (the definitions between are then the same too)."""
    seen, out, todo = set(roots), set(), list(roots)
    while todo:
        for a in operands(defs[todo.pop()]):
            if a in seen:
                continue
            seen.add(a)
            if a in loaded:
                out.add(a)
            else:
                todo.append(a)
    return frozenset(out)


def _flash(k: Kernel) -> bool:
    """Whether Tile IR lifts the kernel to a flash-attention kernel."""
    from emmy.tile_ir.ir import KernelKind
    from emmy.tile_ir.lift import lift_kernel

    return lift_kernel(normalize(k)).kind is KernelKind.ATTENTION


def build_kernel(p: Program, kp: KernelPlan, stored: set[str], name: str,
                 buffers: dict[str, str], budget: int | None = None,
                 inlined: Counter[str] | None = None,
                 recomputed: dict[str, tuple[int, int]] | None = None
                 ) -> tuple[Kernel, list[str]]:
    """The (unnormalized) kernel computing `kp.roots`, and notes on what it recomputes;
    `buffers` names the buffer of each input and stored tensor; `inlined`, when given, counts
    the indices at which the kernel computes each definition; `recomputed`, when given, gets
    the placer's count of how often each reduction runs past its distinct values."""
    defs = {d.name: d for d in p.defs}
    shape = defs[kp.roots[0]].type.shape
    out_vars = tuple(f"o{i}" for i in range(len(shape)))
    dag = Dag(dict(zip(out_vars, shape)))
    loaded = (stored - set(kp.roots)) | {d.name for d in p.inputs}
    inliner = Inliner(p, {n: buffers[n] for n in loaded}, kp.scan, out_vars, dag, budget)
    identity = tuple(symbolic.var(v) for v in out_vars)
    roots = [inliner.value(r, identity) for r in kp.roots]
    if inlined is not None:
        inlined.update(inliner.uses)
    scan_var = out_vars[defs[kp.scan].axis] if kp.scan else None
    order = order_loops(dag, roots, out_vars, scan_var)
    placer = Placer(dag, order, scan_var, defs[kp.scan].reverse if kp.scan else False)
    body = placer.run(roots, tuple(buffers[r] for r in kp.roots), identity)
    reads = {s.buffer for s in placer.statements() if isinstance(s, Load)}
    kernel = Kernel(name=name,
                    inputs=tuple(Buffer(buffers[d.name], d.type) for d in p.defs
                                 if d.name in loaded and buffers[d.name] in reads),
                    outputs=tuple(Buffer(buffers[r], defs[r].type) for r in kp.roots),
                    body=body)
    if recomputed is not None:
        recomputed.update(placer.recomputed())
    return kernel, placer.recompute_notes(name)


def choose_cut(p: Program, uses, stored: set[str]) -> str | None:
    """The tensor to store when a kernel grows too large: the latest one that holds a
    reduction and that the kernel computes at several indices (not an index_map: storing its
    operand does the same with less memory); failing that, the latest one computed at several
    indices from data (an element-wise chain: the cell states of an unrolled LSTM, read by
    every later step and by the stack of its outputs), not from positions alone."""
    heavy: set[str] = set()
    data: set[str] = set()
    for d in p.defs:
        if isinstance(d, Input) or d.name in stored or data.intersection(operands(d)):
            data.add(d.name)
        if d.name not in stored and (isinstance(d, Reduce) or heavy.intersection(operands(d))):
            heavy.add(d.name)
    for pool in (heavy, data - stored):
        cuts = [d.name for d in p.defs if d.name in pool and uses.get(d.name, 0) > 1
                and not isinstance(d, (IndexMap, Input))]
        if cuts:
            return cuts[-1]
    return None
