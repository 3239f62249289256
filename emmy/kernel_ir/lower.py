"""Lower scheduled Tile IR kernels to Kernel IR.

A job (one iteration of the grid) goes to a worker of `lanes` threads (WORK). The folds directly
in the job's body are spread over the lanes: lane l takes the V-element vectors at l*V,
l*V + lanes*V, …, N of them per step (TILE), with N independent accumulator chains; a reduce
fold then combines chains and lanes (REDUCE); loads of a staged buffer go through shared memory
(STAGE). Folds nested deeper run serially inside one lane. Statements outside folds are computed
by every lane alike; stores outside folds are made by lane 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from emmy.dtypes import DType
from emmy.kernel_ir import ir as K
from emmy.loop_ir.ir import Accum, CastTo, Compute, IndexValue, Init, Load, Store
from emmy.schedule.decisions import Decisions
from emmy.schedule.facts import offset, stride_along
from emmy.symbolic import Lin, floordiv, lin, mod, render, substitute, var
from emmy.tensor_ir.ir import ReduceOp, Scalar
from emmy.tile_ir.apply import Applied, Part
from emmy.tile_ir.ir import Fold, FoldKind, Item, KernelKind, TileKernel
from emmy.tile_ir.values import value_types

ARG_OPS = (ReduceOp.ARGMAX, ReduceOp.ARGMIN)


def ctype(t: DType) -> str:
    """The C type a value of this type is computed in (half types compute in float)."""
    return t.compute.c_name


def lower_applied(name: str, applied: Applied) -> K.KProgram:
    """All the launches a row makes of one kernel."""
    functions = tuple(lower_part(p) for p in applied.parts)
    launches = tuple(K.Launch(f.name, tuple(p.name for p in f.params)) for f in functions)
    temps = tuple((b.name, b.type.dtype.c_name, b.type.numel) for b in applied.temporaries)
    return K.KProgram(name=name, functions=functions, launches=launches, temporaries=temps,
                      zero_fill=applied.zero_fill)


@dataclass
class _Fn:
    """What lowering one kernel needs at hand."""

    k: TileKernel
    d: Decisions
    types: dict[str, DType]
    shapes: dict[str, tuple[int, ...]]
    bounds: dict[str, int]
    stage: dict[str, str] = field(default_factory=dict)       # buffer -> shared array
    stage_index: dict[str, tuple[Lin, ...]] = field(default_factory=dict)  # pattern, axis -> "i"
    filled: set[str] = field(default_factory=set)      # staged rows already in shared memory
    filling: set[str] = field(default_factory=set)
    shared: list[K.SharedArray] = field(default_factory=list)
    shared_top: int = 0
    counter: int = 0

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}{self.counter}"

    def alloc(self, name: str, c: str, count: int, size: int) -> K.SharedArray:
        arr = K.SharedArray(name, c, count, self.shared_top)
        self.shared_top += (count * size + 15) // 16 * 16
        self.shared.append(arr)
        return arr


def lower_part(part: Part) -> K.KFunction:
    k, d = part.kernel, part.decisions
    buffers = (*k.inputs, *k.outputs)
    fn = _Fn(k, d, value_types(k.body), {b.name: b.type.shape for b in buffers},
             {a.var: a.extent for a in k.grid})
    params = tuple(K.Param(b.name, b.type.dtype.c_name, False) for b in k.inputs) + \
        tuple(K.Param(b.name, b.type.dtype.c_name, True) for b in k.outputs)
    if k.kind is KernelKind.MAP:
        body, grid = _lower_map(fn)
    else:
        body, grid = _lower_jobs(fn)
    prologue = tuple(fn.shared)
    return K.KFunction(name=k.name, params=params, grid=grid, threads=d.work.threads,
                       shared_bytes=fn.shared_top, body=prologue + body, row=str(part.row))


# --- map kernels ----------------------------------------------------------------------------

def _lower_map(fn: _Fn) -> tuple[tuple[K.KStmt, ...], int]:
    """One thread per V-element vector of the flattened grid, N vectors per thread."""
    k, T, V, N = fn.k, fn.d.work.threads, fn.d.tile.vec, fn.d.tile.n
    total = k.jobs // V
    grid = max(1, -(-total // (T * N)))
    fn.bounds |= {"tid": T, "bid": grid, "s": N, "vid": total, "e": k.jobs}
    out: list[K.KStmt] = []
    for s in range(N):
        vid = f"vid{s}" if N > 1 else "vid"
        fn.bounds[vid] = total
        body: list[K.KStmt] = [K.Index("e", var(vid) * V, wide=True)]
        body += _decode(fn, "e", k.grid, k.jobs)
        last = k.grid[-1].var if k.grid else None
        body += _group(fn, k.body, last, var(last) if last else lin(0), V)
        stmt = [K.Index(vid, (var("bid") * N + s) * T + var("tid"), wide=True)]
        if total % (T * N) or s:
            stmt.append(K.If(f"{vid} < {total}", tuple(body)))
        else:
            stmt += body
        out += stmt
    return tuple(out), grid


def _decode(fn: _Fn, flat: str, axes, extent_total: int) -> list[K.KStmt]:
    """Coordinates of a flat row-major index over `axes`."""
    out, stride = [], extent_total
    fn.bounds[flat] = extent_total
    for a in axes:
        stride //= a.extent
        e = floordiv(var(flat), stride, fn.bounds)
        e = mod(e, a.extent, fn.bounds) if stride * a.extent < extent_total else e
        out.append(K.Index(a.var, e))
    return out


# --- job kernels (rows, scans) --------------------------------------------------------------

def _lower_jobs(fn: _Fn) -> tuple[tuple[K.KStmt, ...], int]:
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
    head += _decode(fn, "job", k.grid, k.jobs)
    if fn.d.stage is not None and fn.d.stage.kind == "smem":
        head += _plan_stage(fn)
    if L > 32:
        fn.alloc("scratch", "unsigned char", 16 * L, 1)
    body: list[K.KStmt] = []
    for item in k.body:
        if isinstance(item, Fold):
            body += _lane_fold(fn, item)
        else:
            body += _scalar(fn, item, "", {}, lane0_stores=L > 1)
    if J > 1 and k.jobs % J:
        return tuple(head[:2]) + (K.If(f"job < {k.jobs}", tuple(head[2:] + body)),), grid
    return tuple(head + body), grid


def _plan_stage(fn: _Fn) -> list[K.KStmt]:
    """Shared-memory rows for the buffers read by a reduce fold and again later (STAGE=smem)."""
    from emmy.schedule.facts import facts

    f = facts(fn.k)
    J = fn.d.work.jobs_per_block
    out: list[K.KStmt] = []
    for name in f.reused:
        pattern, extent = _stage_pattern(fn, name)
        if pattern is None:
            continue
        c = ctype(_buffer_dtype(fn, name))
        arr = fn.alloc(f"stage_{name}", c, J * extent, 8 if c == "double" else 4)
        fn.stage[name] = arr.name
        fn.stage_index[name] = pattern
        fn.bounds[f"stage_extent_{name}"] = extent
    if fn.stage and fn.d.stage.is_async:
        fn.filled |= set(fn.stage)
        out += _async_fill(fn)
    return out


def _buffer_dtype(fn: _Fn, name: str) -> DType:
    return next(b.type.dtype for b in (*fn.k.inputs, *fn.k.outputs) if b.name == name)


def _elem(fn: _Fn, name: str) -> str:
    return _buffer_dtype(fn, name).c_name


def _stage_pattern(fn: _Fn, name: str):
    """The index at which every direct fold loads `name`, with its axis as `i`; else None."""
    pattern, extent = None, None
    for f in fn.k.folds:
        for item in f.body:
            if isinstance(item, Load) and item.buffer == name:
                p = tuple(substitute(e, {f.axis.var: var("i")}, {**fn.bounds, "i": f.axis.extent})
                          for e in item.index)
                if pattern is None:
                    pattern, extent = p, f.axis.extent
                elif p != pattern or f.axis.extent != extent:
                    return None, None
    return pattern, extent


def _async_fill(fn: _Fn) -> list[K.KStmt]:
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


def _lane_fold(fn: _Fn, f: Fold) -> list[K.KStmt]:
    if f.kind is FoldKind.SCAN and fn.d.work.lanes > 1:
        return _warp_scan(fn, f)
    L, V, N = fn.d.work.lanes, fn.d.tile.vec, fn.d.tile.n
    if f.kind is FoldKind.SCAN:
        V = N = 1
    E = f.axis.extent
    out: list[K.KStmt] = []
    chains = {init.acc: [f"{init.acc}_c{n}" for n in range(N)] for init in f.accs}
    for init in f.accs:
        for c in chains[init.acc]:
            out += _init(c, init)
    it = fn.fresh("it")
    fn.bounds[it] = E
    step_body: list[K.KStmt] = []
    for n in range(N):
        base = var(it) + n * L * V
        rename = {init.acc: chains[init.acc][n] for init in f.accs}
        group = _group(fn, f.body, f.axis.var, base, V, accs=rename,
                       reverse_extent=E if f.reverse else None, tag=f"_c{n}" if N > 1 else "")
        if E % (L * V * N) or n and E < L * V * N:
            step_body.append(K.If(f"{it} + {n * L * V} < {E}", tuple(group)))
        else:
            step_body += group
    out.append(K.For(it, var("lane") * V, lin(E), L * V * N, tuple(step_body)))
    for init in f.accs:
        c0 = chains[init.acc][0]
        for other in chains[init.acc][1:]:
            out.append(K.Fold(c0, init.op, other, None))
    if L > 1 and f.accs:
        out.append(K.LaneCombine(tuple((chains[i.acc][0], i.op, ctype(i.dtype)) for i in f.accs),
                                 L, fn.d.reduce.method if fn.d.reduce else "shuffle",
                                 "scratch" if L > 32 else None))
    for init in f.accs:
        op = "argpos" if init.op in ARG_OPS else "copy"
        out.append(K.Let(init.acc, ctype(fn.types[init.acc]), op, (chains[init.acc][0],)))
    for name in fn.filling:
        fn.filled.add(name)
    fn.filling.clear()
    return out


def _init(name: str, init: Init) -> list[K.KStmt]:
    return [K.Let(name, ctype(init.dtype), "identity", (init.op.value,), mutable=True)]


def _warp_scan(fn: _Fn, f: Fold) -> list[K.KStmt]:
    """A warp scans its row in chunks of 32: shuffle scan of each chunk plus the carry."""
    (init,) = f.accs
    E, acc = f.axis.extent, init.acc
    c = ctype(init.dtype)
    carry = f"{acc}_carry"
    out: list[K.KStmt] = [K.Let(carry, c, "identity", (init.op.value,), mutable=True)]
    chunk = fn.fresh("chunk")
    fn.bounds[chunk] = E
    at = f"{chunk}_i"
    pos = lin(E - 1) - var(at) if f.reverse else var(at)
    accum_at = next(i for i, s in enumerate(f.body) if isinstance(s, Accum) and s.acc == acc)
    accum: Accum = f.body[accum_at]
    before, after = f.body[:accum_at], f.body[accum_at + 1:]
    reads_acc = _depends_on(before, acc)
    value_part = tuple(s for s in before if s not in reads_acc)
    env = {f.axis.var: pos}
    inner: list[K.KStmt] = [K.Index(at, var(chunk) + var("lane")),
                            K.Let(f"{at}_ok", "bool", "literal", (f"{at} < {E}",))]
    fn.bounds[at] = E + 31
    # Out-of-range lanes read a valid element and fold the identity in its place.
    safe = f"{chunk}_s"
    inner.append(K.Let(safe, "int", "literal", (f"{at}_ok ? {at} : {E - 1}",)))
    fn.bounds[safe] = E
    safe_env = {f.axis.var: lin(E - 1) - var(safe) if f.reverse else var(safe)}
    inner += _stmts(fn, value_part, "", safe_env, lane0_stores=False)
    v, ident = f"{accum.value}_in", f"{acc}_id"
    inner.append(K.Let(ident, c, "identity", (init.op.value,)))
    inner.append(K.Let(v, c, "where", (f"{at}_ok", accum.value, ident)))
    inner.append(K.ScanLanes(v, init.op, c, carry, f"{acc}_incl", f"{acc}_excl"))
    guarded = _stmts(fn, tuple(reads_acc), "", env, lane0_stores=False, accs={acc: f"{acc}_excl"})
    guarded += _stmts(fn, after, "", env, lane0_stores=False, accs={acc: f"{acc}_incl"})
    inner.append(K.If(f"{at}_ok", tuple(guarded)))
    out.append(K.For(chunk, lin(0), lin(E), 32, tuple(inner)))
    out.append(K.Let(acc, c, "copy", (carry,)))
    return out


def _depends_on(items, name: str) -> list:
    """The items that read `name`, directly or through values computed from it."""
    tainted, out = {name}, []
    for s in items:
        reads = _reads(s)
        if reads & tainted:
            out.append(s)
            if hasattr(s, "dst"):
                tainted.add(s.dst)
    return out


def _reads(s) -> set[str]:
    match s:
        case Compute(args=args):
            return {a for a in args if isinstance(a, str)}
        case CastTo(arg=a):
            return {a}
        case Store(value=v):
            return {v}
        case Accum(acc=a, value=v):
            return {a, v}
    return set()


# --- element groups -------------------------------------------------------------------------

def _group(fn: _Fn, items: tuple[Item, ...], axis: str | None, base: Lin, V: int, *,
           accs: dict[str, str] | None = None, reverse_extent: int | None = None,
           tag: str = "") -> list[K.KStmt]:
    """V consecutive elements along `axis` from `base`: contiguous accesses become vectors."""
    accs = accs or {}
    local = set(value_types(items))

    def at(v: int) -> dict[str, Lin]:
        if axis is None:
            return {}
        pos = base + v
        return {axis: lin(reverse_extent - 1) - pos if reverse_extent else pos}
    if V == 1:
        return _stmts(fn, items, tag, at(0), lane0_stores=False, accs=accs, local=local, axis=axis)
    vec_loads, vec_stores = {}, {}
    for s in items:
        if isinstance(s, (Load, Store)) and _contiguous(fn, s, axis) and not reverse_extent:
            (vec_loads if isinstance(s, Load) else vec_stores)[id(s)] = s
    out: list[K.KStmt] = []
    for s in items:
        if id(s) in vec_loads:
            names = tuple(f"{s.dst}{tag}_{v}" for v in range(V))
            out += _load(fn, s, names, at(0), axis)
    rest = tuple(s for s in items if id(s) not in vec_loads and id(s) not in vec_stores)
    for v in range(V):
        out += _stmts(fn, rest, f"{tag}_{v}", at(v), lane0_stores=False, accs=accs, local=local,
                      axis=axis)
    for s in items:
        if id(s) in vec_stores:
            idx = tuple(substitute(e, at(0), fn.bounds) for e in s.index)
            out.append(K.GlobalStore(s.buffer, _elem(fn, s.buffer), offset(idx, fn.shapes[s.buffer]),
                                     tuple(f"{s.value}{tag}_{v}" for v in range(V))))
    return out


def _contiguous(fn: _Fn, s: Load | Store, axis: str | None) -> bool:
    return axis is not None and stride_along(offset(s.index, fn.shapes[s.buffer]), axis) == 1


def _load(fn: _Fn, s: Load, names: tuple[str, ...], env, axis: str | None) -> list[K.KStmt]:
    """A global load, or a read of the staged row when the access follows its pattern."""
    idx = tuple(substitute(e, env, fn.bounds) for e in s.index)
    c = ctype(s.dtype)
    direct = K.GlobalLoad(names, c, s.buffer, offset(idx, fn.shapes[s.buffer]))
    if s.buffer not in fn.stage or axis is None or _pattern(fn, s, axis) != fn.stage_index[s.buffer]:
        return [direct]
    extent = fn.bounds[f"stage_extent_{s.buffer}"]
    where = var("slot") * extent + env[axis]
    if s.buffer in fn.filled:
        return [K.SharedLoad(names, c, fn.stage[s.buffer], where)]
    fn.filling.add(s.buffer)
    return [direct, K.SharedStore(fn.stage[s.buffer], where, names)]


def _pattern(fn: _Fn, s: Load, axis: str) -> tuple[Lin, ...]:
    """The load's index with its fold axis named `i`."""
    bounds = {**fn.bounds, "i": fn.bounds.get(axis, 1 << 30)}
    return tuple(substitute(e, {axis: var("i")}, bounds) for e in s.index)


def _stmts(fn: _Fn, items, suffix: str, env: dict[str, Lin], *, lane0_stores: bool,
           accs: dict[str, str] | None = None, local: set[str] | None = None,
           axis: str | None = None) -> list[K.KStmt]:
    """Statements for one element: names in `local` get `suffix`, `accs` renames accumulators."""
    local = set(value_types(tuple(items))) if local is None else local
    out: list[K.KStmt] = []
    for s in items:
        out += _scalar(fn, s, suffix, env, lane0_stores=lane0_stores, accs=accs or {},
                       local=local, axis=axis)
    return out


def _scalar(fn: _Fn, s: Item, suffix: str, env: dict[str, Lin], *, lane0_stores: bool,
            accs: dict[str, str] | None = None, local: set[str] = frozenset(),
            axis: str | None = None) -> list[K.KStmt]:
    """One Loop IR statement for one element."""
    accs = accs or {}

    def name(n: str) -> str:
        if n in accs:
            return accs[n]
        return n + suffix if n in local else n

    def arg(a) -> str:
        return _literal(a) if isinstance(a, Scalar) else name(a)
    def index(idx):
        return tuple(substitute(e, env, fn.bounds) for e in idx)
    match s:
        case Load():
            return _load(fn, s, (name(s.dst),), env, axis)
        case Compute():
            return [K.Let(name(s.dst), ctype(s.dtype), s.op.value, tuple(arg(a) for a in s.args))]
        case CastTo():
            return [K.Let(name(s.dst), ctype(s.dtype), "cast", (name(s.arg),))]
        case IndexValue():
            return [K.Let(name(s.dst), ctype(s.dtype), "index", (_c_index(substitute(s.expr, env, fn.bounds)),))]
        case Init():
            return _init(name(s.acc), s)
        case Accum():
            pos = substitute(s.position, env, fn.bounds) if s.position is not None else None
            return [K.Fold(name(s.acc), s.op, name(s.value), pos)]
        case Store():
            off = offset(index(s.index), fn.shapes[s.buffer])
            if fn.k.atomic:
                st = K.AtomicAdd(s.buffer, _elem(fn, s.buffer), off, name(s.value))
            else:
                st = K.GlobalStore(s.buffer, _elem(fn, s.buffer), off, (name(s.value),))
            return [K.If("lane == 0", (st,))] if lane0_stores else [st]
        case Fold():
            return _serial_fold(fn, s, suffix, env, accs, local)
    raise AssertionError(f"unexpected item {s!r}")


def _serial_fold(fn: _Fn, f: Fold, suffix: str, env, accs, local) -> list[K.KStmt]:
    """A fold nested inside a lane's work: a plain loop."""
    out: list[K.KStmt] = []
    names = {i.acc: accs.get(i.acc, i.acc + suffix if i.acc in local else i.acc) for i in f.accs}
    for init in f.accs:
        out += _init(names[init.acc], init)
    loop_var = f"{f.axis.var}{suffix}"
    fn.bounds[loop_var] = f.axis.extent
    pos = lin(f.axis.extent - 1) - var(loop_var) if f.reverse else var(loop_var)
    body = _stmts(fn, f.body, suffix, {**env, f.axis.var: pos}, lane0_stores=False,
                  accs={**accs, **names}, local=local)
    out.append(K.For(loop_var, lin(0), lin(f.axis.extent), 1, tuple(body)))
    out += _finish(f.accs, names, fn)
    return out


def _finish(inits, names: dict[str, str], fn: _Fn) -> list[K.KStmt]:
    """After a fold: argmax/argmin accumulators read back as their position."""
    return [K.Let(names[i.acc], "long long", "argpos", (names[i.acc],))
            for i in inits if i.op in ARG_OPS]


def _literal(a: Scalar) -> str:
    if isinstance(a.value, bool):
        return "true" if a.value else "false"
    if a.dtype.is_float:
        v = float(a.value)
        if v != v:
            return "EM_NAN"
        if v in (float("inf"), float("-inf")):
            return "EM_INF" if v > 0 else "(-EM_INF)"
        text = repr(v)
        return text if a.dtype.compute is DType.F64 else f"{text}f"
    return f"{int(a.value)}LL" if a.dtype is DType.I64 else str(int(a.value))


def _c_index(e: Lin) -> str:
    return render(e)
