"""Work: what one launch does, independent of the machine's state. Loads, stores and
arithmetic are counted on the launch's Tile IR kernel (the row's part); which passes read
global memory, what cp.async fills, the lane combines and barriers come from the Kernel IR
function it became."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping

from emmy.dtypes import DType
from emmy.kernel_ir import ir as K
from emmy.kernel_ir.elements import exact_values
from emmy.kernel_ir.fastmath import reciprocal_divisions, sixteen_bit
from emmy.loop_ir.ir import Accum, CastTo, Compute, IndexValue, Load, Store
from emmy.runtime.costmodel.constants import (BARRIER_CYCLES, CLUSTER_BARRIER_CYCLES,
                                              CP_ASYNC_IN_FLIGHT, DSMEM_LOAD_CYCLES,
                                              FOLD_OP_CYCLES, HALF_CONVERT_INSTRUCTIONS,
                                              LOOP_ITERATIONS_IN_FLIGHT,
                                              LOOP_OVERHEAD_INSTRUCTIONS,
                                              MAP_INDEX_INSTRUCTIONS, SECTOR_BYTES,
                                              SHUFFLE_STEP_CYCLES, SMEM_STEP_CYCLES)
from emmy.schedule.facts import offset
from emmy.symbolic import Sym, bounds_of
from emmy.tensor_ir.ir import EwOp, ReduceOp
from emmy.tile_ir.apply import Part
from emmy.tile_ir.ir import Fold, FoldKind, KernelKind, TileKernel
from emmy.tile_ir.values import value_types

# FP32-pipe instructions and special-function (MUFU) operations per element of each op, for
# the libdevice sequences CUDA compiles them to without fast-math (estimates to calibrate).
_SPECIAL: dict[EwOp, tuple[int, int]] = {
    EwOp.DIV: (8, 1), EwOp.RECIPROCAL: (3, 1), EwOp.EXP: (4, 1), EwOp.EXPM1: (10, 1),
    EwOp.LOG: (6, 1), EwOp.LOG1P: (10, 1), EwOp.SQRT: (3, 1), EwOp.RSQRT: (1, 1),
    EwOp.SIN: (12, 1), EwOp.COS: (12, 1), EwOp.TANH: (8, 1), EwOp.SIGMOID: (8, 2),
    EwOp.ERF: (14, 0), EwOp.POW: (20, 2), EwOp.TAN: (20, 2), EwOp.ASIN: (16, 1),
    EwOp.ACOS: (16, 1), EwOp.ATAN: (14, 1), EwOp.ATAN2: (20, 2), EwOp.SINH: (10, 1),
    EwOp.FMOD: (20, 2),
    EwOp.COSH: (10, 1), EwOp.ASINH: (14, 2), EwOp.ACOSH: (14, 2), EwOp.ATANH: (12, 1),
    EwOp.LGAMMA: (30, 2),
    EwOp.DIGAMMA: (40, 2),
    EwOp.ERFINV: (30, 2),
}
# ... and in kernels whose floating-point data is all 16-bit, which take the approximations
# (emmy/kernel_ir/fastmath.py): ex2.approx, and an approximate reciprocal for sigmoid.
_FAST: dict[EwOp, tuple[int, int]] = {EwOp.EXP: (1, 1), EwOp.SIGMOID: (2, 2)}
_FOLD_INSTRUCTIONS = {ReduceOp.ARGMAX: 3, ReduceOp.ARGMIN: 3,   # compare, select value, index
                      ReduceOp.LOGADDEXP: 24}   # max, min, exp, log1p and the infinities' tests


@dataclass(frozen=True, slots=True)
class _Load:
    """One global load of a body, counted over the launch."""

    buffer: str
    itemsize: int
    accesses: int         # element accesses over the launch
    distinct: int         # distinct elements over the launch
    per_job: int          # distinct elements one job reads
    in_flight: float      # bytes one lane has outstanding for this load when it misses L1
    overfetch: float      # sectors moved at L2 per useful byte (1: coalesced)


@dataclass(frozen=True, slots=True)
class _Group:
    """Loads issued together by a lane: one loop body (a pass), or a straight-line body."""

    name: str
    loads: tuple[_Load, ...]        # global loads only


@dataclass(frozen=True, slots=True)
class _Store:
    """One store of a body, counted over the launch."""

    buffer: str
    itemsize: int
    accesses: int
    distinct: int
    per_job: int
    atomic: bool


@dataclass(frozen=True, slots=True)
class Work:
    """What one launch does, independent of the machine's state."""

    groups: tuple[_Group, ...]
    stores: tuple[_Store, ...]
    fp32: float                     # FP32-pipe instructions (FP32 arithmetic, compares, casts)
    fp64: float
    sfu: float
    instructions: float             # all thread instructions (arithmetic, memory, loop, index)
    chain_cycles: float             # one block's dependent chain
    jobs: int
    jobs_per_block: int
    lane_loop_trips: float          # most iterations of one lane loop (for spills)
    # REDUCE=split:K:last: the dependent cycles of a job's last block after its ticket (its fold
    # of the K partials over the lanes, their combine, the barriers), paid once after the last
    # wave with the ticket's and the partials' round trips (timing.estimate_launch)
    finish_cycles: float = 0.0


@dataclass
class _Tally:
    """Mutable sums while walking a part."""

    groups: list[_Group] = field(default_factory=list)
    stores: list[_Store] = field(default_factory=list)
    fp32: float = 0.0
    fp64: float = 0.0
    sfu: float = 0.0
    instructions: float = 0.0
    chain: float = 0.0
    trips: float = 1.0
    values: Mapping[str, DType] = field(default_factory=dict)   # SSA value types of the body
    fast: bool = False              # the kernel takes the approximate functions


@dataclass(frozen=True, slots=True)
class _Scope:
    """Where a body runs: extents in scope, how often, and how lanes walk through memory."""

    extents: Mapping[str, int]
    grid_vars: frozenset[str]
    executions: int                 # times each item runs over the launch
    threads: int = 1                # threads sharing those executions
    redundancy: int = 1             # lanes computing the same scalar (job statements)
    vector: int = 1                 # V when accesses contiguous along `axis` are vectors
    axis: str | None = None
    lane_var: str | None = None     # the variable adjacent threads of a warp differ in
    lane_step: int = 1              # … by this much
    walk_var: str | None = None     # the variable one lane's consecutive iterations step
    per_lane: int = 1               # elements a lane handles per iteration
    iterations_in_flight: float = 1.0
    global_buffers: frozenset[str] | None = None   # None: every load is global


@dataclass(frozen=True, slots=True)
class _Code:
    """What the Kernel IR shows about a job function: which passes read which buffers."""

    direct_global: tuple[frozenset[str], ...]   # per lane loop, buffers loaded from global
    fill: frozenset[str]                         # buffers cp.async copies into shared memory
    combines: tuple[K.LaneCombine, ...]
    barriers: int


def _code(fn: K.KFunction) -> _Code:
    passes: list[frozenset[str]] = []
    fill: set[str] = set()
    combines: list[K.LaneCombine] = []
    barriers = 0

    def top(stmts):
        nonlocal barriers
        for s in stmts:
            if isinstance(s, K.If):
                top(s.body)
            elif isinstance(s, K.For):
                copies = _find(s, K.CpAsync)
                if copies:
                    fill.update(c.buffer for c in copies)
                else:
                    passes.append(frozenset(_direct_loads(s.body)))
            elif isinstance(s, K.LaneCombine):
                combines.append(s)
            elif isinstance(s, K.Barrier):
                barriers += 1
    top(fn.body)
    return _Code(tuple(passes), frozenset(fill), tuple(combines), barriers)


def _find(s, kind) -> list:
    if isinstance(s, kind):
        return [s]
    return [x for child in getattr(s, "body", ()) for x in _find(child, kind)]


def _direct_loads(stmts) -> set[str]:
    """Buffers a loop body loads from global memory, not counting nested loops."""
    out: set[str] = set()
    for s in stmts:
        if isinstance(s, K.GlobalLoad):
            out.add(s.buffer)
        elif isinstance(s, K.If):
            out |= _direct_loads(s.body)
    return out


def launch_work(part: Part, fn: K.KFunction) -> Work:
    """Count the work of one launch: `part` is its Tile IR kernel, `fn` the code it became."""
    k, d = part.kernel, part.decisions
    t = _Tally(values=value_types(k.body), fast=sixteen_bit(k))
    grid = {a.var: a.extent for a in k.grid}
    last = k.grid[-1].var if k.grid else None
    base = _Scope(grid, frozenset(grid), k.jobs)
    V, N, L = d.tile.vec, d.tile.n, d.work.lanes
    if k.kind is KernelKind.MAP:
        scope = replace(base, threads=max(1, k.jobs // (V * N)), vector=V, axis=last,
                        lane_var=last, lane_step=V, per_lane=V * N)
        t.groups.append(_Group("map", _items(k, k.body, scope, types_of(k), t)))
        t.instructions += k.jobs / V * MAP_INDEX_INSTRUCTIONS
        return _work(t, k.jobs, d.work.threads)
    code = _code(fn)
    folds = k.folds
    direct = code.direct_global if len(code.direct_global) == len(folds) else (None,) * len(folds)
    for name in sorted(code.fill):
        _fill_group(k, name, d, base, t)
    job = replace(base, threads=k.jobs * L, redundancy=L, lane_var=last if L == 1 else None)
    scalars = tuple(i for i in k.body if not isinstance(i, Fold))
    t.groups.append(_Group("job", _items(k, scalars, job, types_of(k), t)))
    for f, global_buffers in zip(folds, direct):     # counted as lowered: x / s as x * (1/s)
        _lane_fold(k, reciprocal_divisions(f, t.values, exact_values(k))[0], d, base,
                   global_buffers, t)
    t.chain += sum(_combine_cycles(c) for c in code.combines) + code.barriers * BARRIER_CYCLES
    work = _work(t, k.jobs, d.work.jobs_per_block)
    last = [s for s in fn.body if isinstance(s, K.LastBlock)]
    if last:
        steps = math.ceil(last[0].count / L)
        cycles = (steps * FOLD_OP_CYCLES + 3 * BARRIER_CYCLES
                  + sum(_combine_cycles(c) for c in _find(last[0], K.LaneCombine)))
        work = replace(work, finish_cycles=cycles)
    return work


def types_of(k: TileKernel) -> dict:
    return {b.name: b.type for b in (*k.inputs, *k.outputs)}


def _work(t: _Tally, jobs: int, jobs_per_block: int) -> Work:
    groups = tuple(g for g in t.groups if g.loads)
    return Work(groups, tuple(t.stores), t.fp32, t.fp64, t.sfu, t.instructions, t.chain,
                jobs, jobs_per_block, t.trips)


def _lane_fold(k: TileKernel, f: Fold, d, base: _Scope, global_buffers, t: _Tally):
    """A fold spread over a job's lanes: one lane loop, its loads one group."""
    L, V, N = d.work.lanes, d.tile.vec, d.tile.n
    E = f.axis.extent
    if f.kind is FoldKind.SCAN:
        # a warp (a block) scans chunks of lanes x n: n folds a lane, then the lanes' totals
        n = N if L > 1 else 1
        V = N = 1
        trips = E / (L * n)
        steps = math.log2(min(L, 32))
        step = steps * SHUFFLE_STEP_CYCLES if L > 1 else FOLD_OP_CYCLES
        if L > 32:      # the warps' totals: stored, scanned by the first warp, read; 3 barriers
            step += steps * SHUFFLE_STEP_CYCLES + 2 * SMEM_STEP_CYCLES + 3 * BARRIER_CYCLES
            t.instructions += k.jobs * E / n * 4 / 32             # a warp's total, its prefix
        if n > 1:       # each element: its fold into the lane's, and the lane's prefix added
            step += n * FOLD_OP_CYCLES
            t.instructions += k.jobs * E * 3
        t.chain += math.ceil(trips) * step
        t.instructions += k.jobs * E / n * 2 * steps         # a shuffle and a combine per step
    else:
        trips = E / (L * V * N)
        if f.accs:
            t.chain += math.ceil(trips) * V * FOLD_OP_CYCLES + (N - 1) * FOLD_OP_CYCLES
    last = k.grid[-1].var if k.grid else None
    across = L == 1                              # a job per thread: neighbours are other jobs
    scope = replace(base, extents={**base.extents, f.axis.var: E}, executions=k.jobs * E,
                    threads=k.jobs * L, vector=1 if f.reverse else V, axis=f.axis.var,
                    lane_var=last if across else f.axis.var, lane_step=1 if across else V,
                    walk_var=f.axis.var if across else None, per_lane=V * N,
                    iterations_in_flight=min(trips, LOOP_ITERATIONS_IN_FLIGHT),
                    global_buffers=global_buffers)
    loads = _items(k, f.body, scope, types_of(k), t)
    t.instructions += k.jobs * E / (V * N) * LOOP_OVERHEAD_INSTRUCTIONS
    t.trips = max(t.trips, trips)
    t.groups.append(_Group(f"{f.kind} {f.axis.var}", loads))


def _fill_group(k: TileKernel, name: str, d, base: _Scope, t: _Tally):
    """cp.async copies of a staged row (STAGE=smem:async): the row's one global read."""
    L, V = d.work.lanes, d.tile.vec
    for f in k.folds:
        found = [i for i in f.body if isinstance(i, Load) and i.buffer == name]
        if found:
            E = f.axis.extent
            scope = replace(base, extents={**base.extents, f.axis.var: E}, executions=k.jobs * E,
                            vector=V, axis=f.axis.var, lane_var=f.axis.var, lane_step=V,
                            per_lane=V, iterations_in_flight=min(E / (L * V), CP_ASYNC_IN_FLIGHT))
            t.instructions += k.jobs * E / V * (1 + LOOP_OVERHEAD_INSTRUCTIONS)
            t.groups.append(_Group(f"fill {name}", (_load(found[0], scope, types_of(k)),)))
            return


def _items(k: TileKernel, items, scope: _Scope, types, t: _Tally) -> tuple[_Load, ...]:
    """Count the items of one body; nested folds become groups of their own."""
    loads: list[_Load] = []
    n = scope.executions * scope.redundancy
    for item in items:
        match item:
            case Load():
                if scope.global_buffers is None or item.buffer in scope.global_buffers:
                    loads.append(_load(item, scope, types))
                t.instructions += n * _access_instructions(item, scope, types)
            case Store():
                t.stores.append(_store(item, scope, types, k.atomic))
                t.instructions += scope.executions * _access_instructions(item, scope, types)
            case Compute():
                costs = _FAST if t.fast and item.op in _FAST else _SPECIAL
                _arith(t, n, *costs.get(item.op, (1, 0)), f64=item.dtype is DType.F64)
            case CastTo() | IndexValue():
                _arith(t, n, 1, 0, f64=False)
            case Accum():
                _arith(t, n, _FOLD_INSTRUCTIONS.get(item.op, 1), 0,
                       f64=t.values.get(item.acc) is DType.F64)
            case Fold():
                _serial_fold(k, item, scope, types, t)
    return tuple(loads)


def _arith(t: _Tally, n: float, pipe: int, sfu: int, *, f64: bool):
    if f64:
        t.fp64 += n * pipe
    else:
        t.fp32 += n * pipe
    t.sfu += n * sfu
    t.instructions += n * (pipe + sfu)


def _serial_fold(k: TileKernel, f: Fold, outer: _Scope, types, t: _Tally):
    """A fold nested inside one lane's work: a plain loop the lane runs for each element."""
    E = f.axis.extent
    scope = replace(outer, extents={**outer.extents, f.axis.var: E},
                    executions=outer.executions * E, vector=1, axis=None, walk_var=f.axis.var,
                    per_lane=1, iterations_in_flight=min(E, LOOP_ITERATIONS_IN_FLIGHT),
                    global_buffers=None)
    loads = _items(k, f.body, scope, types, t)
    if f.accs:     # one lane's serial steps: its share of the executions
        t.chain += scope.executions * scope.redundancy / scope.threads * FOLD_OP_CYCLES
    t.instructions += scope.executions * outer.redundancy * LOOP_OVERHEAD_INSTRUCTIONS
    t.groups.append(_Group(f"serial {f.axis.var}", loads))


def _distinct(index, shape, extents: Mapping[str, int], skip: frozenset[str] = frozenset()) -> int:
    """Distinct elements an access touches as the variables in scope (less `skip`) range."""
    off = offset(index, shape)
    numel = math.prod(shape)
    n = math.prod(extents.get(v, 1) for v in off.free_vars() - skip)
    if not skip:
        lo, hi = bounds_of(off, {v: extents.get(v, 1) for v in off.free_vars()})
        n = min(n, hi - lo + 1)
    return max(1, min(n, numel))


def _load(item: Load, scope: _Scope, types) -> _Load:
    ty = types[item.buffer]
    in_flight, overfetch = _pattern(item, scope, types)
    return _Load(item.buffer, ty.dtype.itemsize, scope.executions,
                 _distinct(item.index, ty.shape, scope.extents),
                 _distinct(item.index, ty.shape, scope.extents, scope.grid_vars),
                 in_flight, overfetch)


def _store(item: Store, scope: _Scope, types, atomic: bool) -> _Store:
    ty = types[item.buffer]
    return _Store(item.buffer, ty.dtype.itemsize, scope.executions,
                  _distinct(item.index, ty.shape, scope.extents),
                  _distinct(item.index, ty.shape, scope.extents, scope.grid_vars), atomic)


def _coefficient(item: Load | Store, var: str | None, types) -> int:
    """The offset's coefficient of `var` (0 when absent or only inside a floor/mod atom)."""
    if var is None:
        return 0
    ty = types[item.buffer]
    return abs(dict(offset(item.index, ty.shape).terms).get(Sym(var), 0))


def _pattern(item: Load, scope: _Scope, types) -> tuple[float, float]:
    """Bytes a lane keeps in flight for this load, and its sector over-fetch at L2.

    Coalesced (adjacent threads touch adjacent or equal addresses): the lane's own bytes.
    Not coalesced, but each lane walks its own contiguous run (a job per thread over a
    row): every miss brings a whole 32-byte sector the lane's next iterations find in L1.
    Neither: each access moves a sector for `vector × itemsize` useful bytes."""
    size = types[item.buffer].dtype.itemsize
    vector = scope.vector if scope.axis and _coefficient(item, scope.axis, types) == 1 else 1
    access = vector * size
    in_flight = scope.per_lane * size * scope.iterations_in_flight
    stride = _coefficient(item, scope.lane_var, types) * scope.lane_step * size
    if stride <= access:
        return in_flight, 1.0
    if scope.walk_var and _coefficient(item, scope.walk_var, types) == 1:
        return max(in_flight, SECTOR_BYTES), 1.0
    return in_flight, max(1.0, SECTOR_BYTES / access)


def _access_instructions(item: Load | Store, scope: _Scope, types) -> float:
    """Instructions per element: 1/V when the access is a V-wide vector, plus conversions."""
    ty = types[item.buffer]
    per = 1.0
    if scope.axis is not None and scope.vector > 1 and _coefficient(item, scope.axis, types) == 1:
        per = 1.0 / scope.vector
    if ty.dtype.is_narrow_float:
        per += HALF_CONVERT_INSTRUCTIONS
    return per


def _combine_cycles(c: K.LaneCombine) -> float:
    """Latency of combining accumulators across a job's lanes (one combine per accumulator),
    and across its cluster's blocks: a cluster barrier, then the blocks' values (the kernel's
    final cluster barrier, as its blocks exit, counts as a block barrier)."""
    warp = math.log2(min(c.lanes, 32)) * SHUFFLE_STEP_CYCLES
    if c.lanes <= 32:
        each = warp
    elif c.method == "smem":
        each = 2 * BARRIER_CYCLES + math.log2(c.lanes) * (SMEM_STEP_CYCLES + BARRIER_CYCLES)
    else:
        each = warp + 2 * BARRIER_CYCLES + SMEM_STEP_CYCLES + c.lanes / 32 * FOLD_OP_CYCLES
    if c.cluster > 1:      # one cluster barrier for all the accs, then each reads C values
        each += c.cluster * FOLD_OP_CYCLES
        return each * len(c.accs) + CLUSTER_BARRIER_CYCLES + DSMEM_LOAD_CYCLES
    return each * len(c.accs)

