"""Kernel IR for job kernels (rows and scans): a worker of `lanes` threads per job; the folds
directly in the job's body spread over the lanes, then combine (REDUCE), with rows staged in
shared memory when the row asks (STAGE)."""

from __future__ import annotations

from dataclasses import replace

from emmy.kernel_ir import ir as K
from emmy.kernel_ir.context import ARG_OPS, Fn, buffer_dtype, ctype, decode
from emmy.kernel_ir.elements import exact_values, group, init_acc, scalar, stmts
from emmy.kernel_ir.fastmath import reciprocal_divisions
from emmy.loop_ir.ir import Accum, Load
from emmy.schedule.decisions import Tile
from emmy.schedule.facts import facts, offset
from emmy.symbolic import floordiv, lin, mod, render, substitute, var
from emmy.tile_ir.ir import Fold, FoldKind
from emmy.tile_ir.values import used, value_types


def lower_jobs(fn: Fn) -> tuple[tuple[K.KStmt, ...], int]:
    k, w = fn.k, fn.d.work
    L, J = w.lanes, w.jobs_per_block
    grid = -(-k.jobs // J)
    fn.bounds |= {"tid": w.threads, "bid": grid}
    head: list[K.KStmt] = []
    if J > 1:
        head.append(K.Index("slot", floordiv(var("tid"), L, fn.bounds)))
        head.append(K.Index("job", var("bid") * J + var("slot"), wide=True))
        fn.bounds |= {"slot": J}
    else:
        head.append(K.Index("slot", lin(0)))
        head.append(K.Index("job", var("bid"), wide=True))
        fn.bounds["slot"] = 1
    head.append(K.Index("lane", mod(var("tid"), L, fn.bounds) if L < w.threads else var("tid")))
    fn.bounds |= {"lane": L, "job": k.jobs}
    head += decode(fn, "job", k.grid, k.jobs)
    if fn.d.stage is not None and fn.d.stage.kind == "smem":
        head += _plan_stage(fn)
    if L > 32:
        fn.alloc("scratch", "unsigned char", 16 * L, 1)
    if k.cluster > 1:      # two sets of slots, one for each accumulator of a fold
        fn.alloc("cluster_scratch", "unsigned char", 2 * 16 * _most_accs(k), 1)
    body: list[K.KStmt] = []
    for item in k.body:
        if isinstance(item, Fold):
            body += _lane_fold(fn, item)
        else:
            body += scalar(fn, item, "", {}, lane0_stores=L > 1)
    if fn.cluster_combines:     # no block exits while another may still read its slots
        body.append(K.Barrier("cluster"))
    if k.finish:
        body.append(_last_block(fn))
    if J > 1 and k.jobs % J:
        return tuple(head[:2]) + (K.If(f"job < {k.jobs}", tuple(head[2:] + body)),), grid
    return tuple(head + body), grid


def _last_block(fn: Fn) -> K.LastBlock:
    """REDUCE=split:K:last: the block of slice s (the grid's last, fastest axis) of its job
    has stored its partials; the last of the job's K blocks to take its ticket folds the K
    partials over its lanes one at a time (v1x1: K need not be a multiple of the row's
    vector) and runs the statements after the fold, as the combine kernel would."""
    k = fn.k
    K_ = k.grid[-1].extent
    saved, fn.d = fn.d, replace(fn.d, tile=Tile(1, 1))
    body: list[K.KStmt] = []
    for item in k.finish:
        if isinstance(item, Fold):
            body += _lane_fold(fn, item)
        else:
            body += scalar(fn, item, "", {}, lane0_stores=fn.d.work.lanes > 1)
    fn.d = saved
    return K.LastBlock(k.tickets, floordiv(var("job"), K_, fn.bounds), K_, tuple(body))


def _stop(f: Fold, loop: str, out: list[K.KStmt]) -> str:
    """Where the lanes' loop over `f` stops: its extent, or for a slice whose fold has a
    `limit` (the last of a ragged split or cluster) `<loop>_stop` = min(extent, limit)."""
    if f.limit is None:
        return str(f.axis.extent)
    out.append(K.Let(f"{loop}_stop", "int", "literal",
                     (f"min({f.axis.extent}, (int)({render(f.limit)}))",)))
    return f"{loop}_stop"


def _most_accs(k) -> int:
    return max((len(f.accs) for f in k.folds), default=1)


def _plan_stage(fn: Fn) -> list[K.KStmt]:
    """Shared-memory rows for the buffers read by a reduce fold and again later (STAGE=smem)."""
    f = facts(fn.k)
    J = fn.d.work.jobs_per_block
    out: list[K.KStmt] = []
    for name in f.reused:
        pattern, extent = _stage_pattern(fn, name)
        if pattern is None:
            continue
        # The row is kept in the buffer's own element type (what cp.async copies, and what the
        # shared-memory budget counts); reads convert to the compute type.
        dtype = buffer_dtype(fn, name)
        arr = fn.alloc(f"stage_{name}", dtype.c_name, J * extent, dtype.itemsize)
        fn.stage[name] = arr.name
        fn.stage_index[name] = pattern
        fn.bounds[f"stage_extent_{name}"] = extent
    if fn.stage and fn.d.stage.is_async:
        fn.filled |= set(fn.stage)
        out += _async_fill(fn)
    return out


def _stage_pattern(fn: Fn, name: str):
    """The index at which every direct fold loads `name`, with its axis as `i`; else None."""
    pattern, extent = None, None
    for f in fn.k.folds:
        for item in f.body:
            if isinstance(item, Load) and item.buffer == name:
                if item.dyn:
                    return None, None   # a gathered row: which one is known only at run time
                p = tuple(substitute(e, {f.axis.var: var("i")}, {**fn.bounds, "i": f.axis.extent})
                          for e in item.index)
                if pattern is None:
                    pattern, extent = p, f.axis.extent
                elif p != pattern or f.axis.extent != extent:
                    return None, None
    return pattern, extent


def _async_fill(fn: Fn) -> list[K.KStmt]:
    """cp.async every staged row into shared memory, with the lanes' own access pattern."""
    L, V = fn.d.work.lanes, fn.d.tile.vec
    copies: list[K.KStmt] = []
    for name, arr in fn.stage.items():
        extent = fn.bounds[f"stage_extent_{name}"]
        i = fn.fresh("c")
        idx = tuple(substitute(e, {"i": var(i)}, fn.bounds | {i: extent}) for e in fn.stage_index[name])
        copies.append(K.For(i, var("lane") * V, lin(extent), L * V, (
            K.CpAsync(arr, var("slot") * extent + var(i), name,
                      offset(idx, fn.shapes[name]), V),)))
    return copies + [K.CpAsyncWaitAll(), K.Barrier("warp" if fn.d.work.lanes <= 32 else "block")]


def _lane_fold(fn: Fn, f: Fold, prefix: bool = False) -> list[K.KStmt]:
    """The lanes fold their elements (N chains each), then combine across the job's lanes and,
    in a cluster, across its blocks: every block gets the whole fold, or with `prefix` the
    fold of the blocks before it in rank order (and of all of them as `<acc>_all`)."""
    out: list[K.KStmt] = []
    f = _reciprocals(fn, f, out)
    if f.kind is FoldKind.SCAN and fn.d.work.lanes > 1:
        return out + _warp_scan(fn, f)
    L, V, N = fn.d.work.lanes, fn.d.tile.vec, fn.d.tile.n
    if f.kind is FoldKind.SCAN:
        V = N = 1
    E = f.axis.extent
    chains = {init.acc: [f"{init.acc}_c{n}" for n in range(N)] for init in f.accs}
    for init in f.accs:
        for c in chains[init.acc]:
            out += init_acc(c, init)
    it = fn.fresh("it")
    fn.bounds[it] = E
    stop = _stop(f, it, out)
    step_body: list[K.KStmt] = []
    for n in range(N):
        base = var(it) + n * L * V
        rename = {init.acc: chains[init.acc][n] for init in f.accs}
        part = group(fn, f.body, f.axis.var, base, V, accs=rename,
                     reverse_extent=E if f.reverse else None, tag=f"_c{n}" if N > 1 else "")
        if E % (L * V * N) or n and (E < L * V * N or f.limit is not None):
            step_body.append(K.If(f"{it} + {n * L * V} < {stop}", tuple(part)))
        else:
            step_body += part
    out.append(K.For(it, var("lane") * V, var(stop) if f.limit is not None else lin(E),
                     L * V * N, tuple(step_body)))
    for init in f.accs:
        c0 = chains[init.acc][0]
        for other in chains[init.acc][1:]:
            out.append(K.Fold(c0, init.op, other, None))
    if L > 1 and f.accs:
        method = fn.d.reduce.method if fn.d.reduce else "shuffle"
        cluster, slot = fn.k.cluster if f.shared else 1, 0
        if cluster > 1:    # alternate sets of slots (see K.LaneCombine)
            slot = fn.cluster_combines % 2 * 16 * _most_accs(fn.k)
            fn.cluster_combines += 1
        out.append(K.LaneCombine(tuple((chains[i.acc][0], i.op, ctype(i.dtype)) for i in f.accs),
                                 L, "shuffle" if method == "cluster" else method,
                                 "scratch" if L > 32 else None, cluster,
                                 "cluster_scratch" if cluster > 1 else None, slot, prefix))
    for init in f.accs:
        op = "argpos" if init.op in ARG_OPS else "copy"
        out.append(K.Let(init.acc, ctype(init.dtype if prefix else fn.types[init.acc]), op,
                         (chains[init.acc][0],)))
    for name in fn.filling:
        fn.filled.add(name)
    fn.filling.clear()
    return out




def _reciprocals(fn: Fn, f: Fold, out: list[K.KStmt]) -> Fold:
    """The fold with its divisions by values computed before it made multiplications
    (fastmath.reciprocal_divisions); each reciprocal is computed once, appended to `out`."""
    f, made = reciprocal_divisions(f, fn.types, exact_values(fn.k))
    for divisor, compute in made.items():
        if divisor not in fn.reciprocals:
            fn.reciprocals.add(divisor)
            out += scalar(fn, compute, "", {}, lane0_stores=False)
    return f


def _warp_scan(fn: Fn, f: Fold) -> list[K.KStmt]:
    """A warp (a block) scans its row in chunks of lanes x n elements (TILE=v1xN): each lane
    folds its n consecutive elements in order, the lanes' totals are scanned by shuffles (and,
    across a block's warps, through shared memory) continuing from the carry, and each element
    takes its lane's prefix combined with its own running value."""
    (init,) = f.accs
    E, acc, L, N = f.axis.extent, init.acc, fn.d.work.lanes, fn.d.tile.n
    c = ctype(init.dtype)
    carry = f"{acc}_carry"
    accum_at = next(i for i, s in enumerate(f.body) if isinstance(s, Accum) and s.acc == acc)
    accum: Accum = f.body[accum_at]
    before, after = f.body[:accum_at], f.body[accum_at + 1:]
    reads_acc = _depends_on(before, acc)
    value_part = tuple(s for s in before if s not in reads_acc)
    out: list[K.KStmt] = []
    last = f"{E - 1}"            # the last element: the axis' or its slice's
    if f.shared:
        # A cluster's block scans its slice continuing from the blocks before it: a first pass
        # folds the slice's total, the cluster combines the totals into each block's prefix.
        total = f"{acc}_tot"
        out += _lane_fold(fn, replace(f, kind=FoldKind.REDUCE,
                                      accs=(replace(init, acc=total),),
                                      body=value_part + (replace(accum, acc=total),)),
                          prefix=True)
        out.append(K.Let(carry, c, "copy", (total,), mutable=True))
    else:
        out.append(K.Let(carry, c, "identity", (init.op.value,), mutable=True))
    chunk = fn.fresh("chunk")
    fn.bounds[chunk] = E
    end = _stop(f, chunk, out)
    if f.limit is not None:
        last = f"{end} - 1"
    local = set(value_types(f.body))          # the element's own values: one set a j
    run = f"{acc}_run"              # a lane's own running value (n > 1)
    inner: list[K.KStmt] = [K.Let(run, c, "identity", (init.op.value,), mutable=True)] \
        if N > 1 else []
    ends: list[tuple[str, str, dict]] = []    # each element's (ok, suffix, env)
    for j in range(N):
        tag = f"_j{j}" if N > 1 else ""
        at = f"{chunk}_i{tag}"
        inner += [K.Index(at, var(chunk) + var("lane") * N + j),
                  K.Let(f"{at}_ok", "bool", "literal", (f"{at} < {end}",))]
        fn.bounds[at] = E + L * N - 1
        # Out-of-range lanes read a valid element and fold the identity in its place.
        safe = f"{chunk}_s{tag}"
        inner.append(K.Let(safe, "int", "literal", (f"{at}_ok ? {at} : {last}",)))
        fn.bounds[safe] = E
        safe_env = {f.axis.var: lin(E - 1) - var(safe) if f.reverse else var(safe)}
        inner += stmts(fn, value_part, tag, safe_env, lane0_stores=False, local=local)
        value = accum.value + tag if accum.value in local else accum.value
        v, ident = f"{accum.value}_in{tag}", f"{acc}_id{tag}"
        inner.append(K.Let(ident, c, "identity", (init.op.value,)))
        inner.append(K.Let(v, c, "where", (f"{at}_ok", value, ident)))
        if N > 1:
            inner += [K.Let(f"{acc}_before{tag}", c, "copy", (run,)),
                      K.Fold(run, init.op, v, None), K.Let(f"{acc}_upto{tag}", c, "copy", (run,))]
        ends.append((f"{at}_ok", tag, {f.axis.var: lin(E - 1) - var(at) if f.reverse
                                       else var(at)}))
    inner.append(K.ScanLanes(run if N > 1 else v, init.op, c, carry, f"{acc}_incl",
                             f"{acc}_excl", L, "scratch" if L > 32 else None))
    for ok, tag, env in ends:
        excl, incl = f"{acc}_excl", f"{acc}_incl"
        guarded: list[K.KStmt] = []
        if N > 1:       # the lane's prefix, then its own elements up to this one
            excl, incl = f"{acc}_excl{tag}_all", f"{acc}_incl{tag}_all"
            for name, part in ((excl, "before"), (incl, "upto")):
                guarded += [K.Let(name, c, "copy", (f"{acc}_excl",), mutable=True),
                            K.Fold(name, init.op, f"{acc}_{part}{tag}", None)]
        guarded += stmts(fn, tuple(reads_acc), tag, env, lane0_stores=False, accs={acc: excl},
                         local=local)
        guarded += stmts(fn, after, tag, env, lane0_stores=False, accs={acc: incl}, local=local)
        inner.append(K.If(ok, tuple(guarded)))
    out.append(K.For(chunk, lin(0), var(end) if f.limit is not None else lin(E), L * N,
                     tuple(inner)))
    # the scan's final value: in a cluster, the whole row's (every block's total)
    # (the total pass's one chain, `<acc>_tot_c0`, holds the prefix, `..._all` the total)
    out.append(K.Let(acc, c, "copy", (f"{acc}_tot_c0_all" if f.shared else carry,)))
    return out


def _depends_on(items, name: str) -> list:
    """The items that read `name`, directly or through values computed from it."""
    tainted, out = {name}, []
    for s in items:
        if used((s,)) & tainted:
            out.append(s)
            if hasattr(s, "dst"):
                tainted.add(s.dst)
    return out
