"""The cost model: the time of each launch from the work its Tile IR does, the code its row
made (Kernel IR), the ptxas report and the target table. It runs on any machine and every
figure it gives is `modeled`, never `measured`; it exists to rank rows, not to replace timing.

Per launch (one Kernel IR function with its LaunchSpec):

  work        loads, stores and arithmetic counted on the launch's Tile IR kernel (the row's
              part): accesses = jobs × extents of the folds around the access; distinct
              elements = product of the extents of the index's variables (capped by its range).
  traffic     each global load's bytes go to DRAM, L2 or L1 (`_classify`), with
              l2_hit(d) = 1 for a reuse distance d <= usable L2, 0 from 2× it, linear between:
                first read of a buffer      distinct bytes; from L2 by l2_hit(bytes touched
                                            since an earlier launch touched it), else DRAM
                a later pass re-reading it  (STAGE=direct) from L2 by l2_hit(window), window =
                                            rows the resident jobs touch (shared rows once)
                repeats within a pass       L1 when the buffer is small, else L2 by l2_hit(size)
              a pass reading a staged row from shared memory (STAGE=smem) moves no global bytes.
              Uncoalesced accesses (neighbouring threads in different 32-byte sectors) move a
              whole sector per access at L2, unless each lane walks its own contiguous run.
  occupancy   blocks per SM from threads, registers, shared memory (occupancy.py), and waves:
              full waves, then a tail wave with fewer blocks (fewer bytes in flight, fewer SMs).
  per wave    the wave does its share f = blocks in the wave / grid of the work, in seconds:
                bandwidth   f × bytes / rate for DRAM (reads + writes at DRAM_EFFICIENCY × peak),
                            L2 (all traffic, L2_OVER_DRAM × DRAM peak), and the busy SMs' ports
                concurrency f × Σ_groups (dram × DRAM_LATENCY + l2 × L2_LATENCY) / in flight,
                            in flight = min(lanes × bytes per lane, busy SMs × per-SM cap)
                            (Little's law: a pass moves at most its bytes in flight per latency)
                chain       one block's dependent steps: fold chains, lane combines, barriers
                compute     f × instructions / (busy SMs × issue rate × efficiency); the same
                            for the FP32 pipe, FP64 and the special-function units
              t_wave = max(bandwidth, compute, concurrency + chain) + same-address atomics
  launch      Σ_waves count × t_wave + target.launch_overhead_s; zero-filled outputs add one
              memset launch each; a program's launches add up, L2 contents carried between them.

The limiter names the term that took the most time: "memory" (a bandwidth), "latency" (too
few bytes in flight, or a dependent chain), "compute", or "launch" (the overhead dominates).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from emmy.cuda.emit import emit_program
from emmy.cuda.nvrtc import Resources, compile_cuda
from emmy.cuda.program import LaunchSpec
from emmy.dtypes import DType
from emmy.kernel_ir import ir as K
from emmy.kernel_ir.lower import lower_applied
from emmy.loop_ir.ir import Accum, CastTo, Compute, IndexValue, Load, Store
from emmy.runtime.occupancy import Occupancy, occupancy, waves
from emmy.schedule.facts import offset
from emmy.schedule.row import Row, parse
from emmy.schedule.targets import Target
from emmy.symbolic import Sym, bounds_of
from emmy.tensor_ir.ir import EwOp, ReduceOp
from emmy.tile_ir.apply import Part, apply_row
from emmy.tile_ir.ir import Fold, FoldKind, KernelKind, TileKernel
from emmy.tile_ir.values import value_types

METHOD = "modeled"

# --- memory system ------------------------------------------------------------------------
DRAM_LATENCY_S = 700e-9          # loaded HBM round trip (600-800 ns on H100/H200); Little's law
L2_LATENCY_S = 300e-9            # loaded L2 hit round trip (~260 cycles unloaded, more under load)
DRAM_EFFICIENCY = 0.90           # best fraction of peak DRAM bandwidth a stream reaches
L2_OVER_DRAM = 2.0               # L2 bandwidth as a multiple of DRAM bandwidth (H100: ~2-2.5x)
SM_PORT_BYTES_PER_CYCLE = 64     # one SM's L1<->L2 bandwidth; binds when few SMs are busy
SM_MAX_BYTES_IN_FLIGHT = 64 * 1024  # outstanding global-load bytes one SM can track
L2_USABLE_FRACTION = 0.75        # share of L2 that holds reusable lines (set conflicts, writes)
L1_REUSE_BYTES = 64 * 1024       # a buffer this small, re-read within a pass, stays in L1
SECTOR_BYTES = 32                # the unit L1 and L2 move: a warp's request costs whole sectors
LOOP_ITERATIONS_IN_FLIGHT = 2    # a lane loop's loads overlap the next iteration's (unrolling)
CP_ASYNC_IN_FLIGHT = 4           # cp.async copies a lane keeps in flight while filling a row
ATOMIC_SAME_ADDRESS_S = 1e-9     # one atomic to an address at L2; same-address atomics serialize
# --- arithmetic ---------------------------------------------------------------------------
ISSUE_PER_SM_PER_CYCLE = 4       # warp instructions per SM per cycle (4 schedulers)
SFU_LANES_PER_SM = 16            # special-function results per SM per cycle (sm_80, sm_90)
FP64_RATE_FRACTION = 0.5         # FP64 at half the FP32 rate on both targets (datasheets)
COMPUTE_EFFICIENCY = 0.8         # best fraction of peak issue a real instruction mix reaches
WARPS_FOR_FULL_ISSUE = 8         # warps per SM needed to hide ALU latency between instructions
LOOP_OVERHEAD_INSTRUCTIONS = 3   # per lane-loop iteration: increment, compare, branch
MAP_INDEX_INSTRUCTIONS = 8       # per map-thread vector: flat index, decode (mul.hi/shift), guard
HALF_CONVERT_INSTRUCTIONS = 1    # per f16/bf16 element loaded or stored (convert to/from f32)
# --- latency of one block's dependent chain (cycles) --------------------------------------
FOLD_OP_CYCLES = 4               # dependent FP32 add/max: one fold step on one chain
SHUFFLE_STEP_CYCLES = 30         # shfl.sync + combine, dependent
SMEM_STEP_CYCLES = 30            # st.shared / ld.shared round trip
BARRIER_CYCLES = 40              # __syncthreads once every warp has arrived

# FP32-pipe instructions and special-function (MUFU) operations per element of each op, for
# the libdevice sequences CUDA compiles them to without fast-math (estimates to calibrate).
_SPECIAL: dict[EwOp, tuple[int, int]] = {
    EwOp.DIV: (8, 1), EwOp.RECIPROCAL: (3, 1), EwOp.EXP: (4, 1), EwOp.EXPM1: (10, 1),
    EwOp.LOG: (6, 1), EwOp.LOG1P: (10, 1), EwOp.SQRT: (3, 1), EwOp.RSQRT: (1, 1),
    EwOp.SIN: (12, 1), EwOp.COS: (12, 1), EwOp.TANH: (8, 1), EwOp.SIGMOID: (8, 2),
    EwOp.ERF: (14, 0), EwOp.POW: (20, 2),
}
_FOLD_INSTRUCTIONS = {ReduceOp.ARGMAX: 3, ReduceOp.ARGMIN: 3}   # compare, select value, index


# --- results -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LaunchEstimate:
    """The modeled time of one launch and the figures it came from."""

    kernel: str                      # the Tile IR kernel the launch belongs to
    function: str
    seconds: float
    bytes_dram: int                  # reads and writes that reach DRAM
    bytes_l2: int                    # reads served by L2 (beyond the DRAM bytes, which pass it too)
    flops: int                       # FP32-pipe + FP64 + special-function operations
    occupancy: float                 # active warps / max warps per SM
    blocks_per_sm: int
    waves: int
    limiter: str                     # memory | compute | latency | launch
    resources: Resources | None
    grid: int = 0
    threads: int = 0
    breakdown: tuple[tuple[str, float], ...] = ()   # seconds per term, summed over waves
    method: str = METHOD


@dataclass(frozen=True, slots=True)
class ProgramEstimate:
    """The launches of a program in order and their total."""

    launches: tuple[LaunchEstimate, ...]
    seconds: float
    target: str
    method: str = METHOD

    def by_kernel(self) -> dict[str, float]:
        """Seconds per Tile IR kernel (its launches and memsets together)."""
        out: dict[str, float] = {}
        for launch in self.launches:
            out[launch.kernel] = out.get(launch.kernel, 0.0) + launch.seconds
        return out


# --- work: counted on the Tile IR part -----------------------------------------------------

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
    t = _Tally(values=value_types(k.body))
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
    for f, global_buffers in zip(folds, direct):
        _lane_fold(k, f, d, base, global_buffers, t)
    t.chain += sum(_combine_cycles(c) for c in code.combines) + code.barriers * BARRIER_CYCLES
    return _work(t, k.jobs, d.work.jobs_per_block)


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
        V = N = 1
        lanes = min(L, 32)                       # a warp scans chunks of 32
        trips = E / lanes
        steps = math.log2(lanes)
        t.chain += math.ceil(trips) * (steps * SHUFFLE_STEP_CYCLES if lanes > 1 else FOLD_OP_CYCLES)
        t.instructions += k.jobs * E * 2 * steps             # a shuffle and a combine per step
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
                _arith(t, n, *_SPECIAL.get(item.op, (1, 0)), f64=item.dtype is DType.F64)
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
    if ty.dtype.itemsize == 2:
        per += HALF_CONVERT_INSTRUCTIONS
    return per


def _combine_cycles(c: K.LaneCombine) -> float:
    """Latency of combining accumulators across a job's lanes (one combine per accumulator)."""
    warp = math.log2(min(c.lanes, 32)) * SHUFFLE_STEP_CYCLES
    if c.lanes <= 32:
        each = warp
    elif c.method == "smem":
        each = 2 * BARRIER_CYCLES + math.log2(c.lanes) * (SMEM_STEP_CYCLES + BARRIER_CYCLES)
    else:
        each = warp + 2 * BARRIER_CYCLES + SMEM_STEP_CYCLES + c.lanes / 32 * FOLD_OP_CYCLES
    return each * len(c.accs)


# --- traffic: where the bytes come from ----------------------------------------------------

def l2_hit(distance: float, usable: float) -> float:
    """Hit fraction of a re-read after `distance` bytes went through L2 (reuse distance):
    all hits up to the usable size, none from twice it, linear between (a pure LRU cache
    would fall off a cliff at the size; L2's hashing and replacement soften it)."""
    if distance <= usable:
        return 1.0
    return max(0.0, (2 * usable - distance) / usable) if usable else 0.0


def _window(work: Work, resident_jobs: int) -> float:
    """Bytes the resident jobs touch together: per-job rows times the jobs, shared rows once."""
    sizes: dict[str, float] = {}
    for g in work.groups:
        for ld in g.loads:
            n = min(ld.distinct, ld.per_job * resident_jobs) * ld.itemsize
            sizes[ld.buffer] = max(sizes.get(ld.buffer, 0.0), n)
    for s in work.stores:
        n = min(s.distinct, s.per_job * resident_jobs) * s.itemsize
        sizes[s.buffer] = sizes.get(s.buffer, 0.0) + n
    return sum(sizes.values())


class L2Residency:
    """Buffers earlier launches touched, least recent first: what L2 may still hold."""

    def __init__(self, usable_bytes: float):
        self.usable = usable_bytes
        self._recent: dict[str, int] = {}

    def hit(self, buffer: str, size: int) -> float:
        """Fraction of `buffer` still in L2, by the bytes touched since it was (`l2_hit`)."""
        if buffer not in self._recent:
            return 0.0
        names = list(self._recent)
        since = sum(self._recent[n] for n in names[names.index(buffer) + 1:])
        return l2_hit(since + size, self.usable)

    def touch(self, buffer: str, size: int) -> None:
        self._recent.pop(buffer, None)
        self._recent[buffer] = size


@dataclass(frozen=True, slots=True)
class _GroupTraffic:
    """One group's bytes by level, and what a lane keeps in flight beyond L1."""

    dram: float
    l2: float
    in_flight_per_lane: float       # bytes of this group's loads outstanding beyond L1


@dataclass(frozen=True, slots=True)
class Traffic:
    """A launch's bytes by level, given the L2 state and the jobs resident at once."""

    groups: tuple[_GroupTraffic, ...]
    dram_read: float
    l2_read: float
    write: float
    atomic: float                   # atomic read-modify-write bytes at L2
    atomic_chain: float             # most atomics to one address
    overfetch: float                # sector bytes moved at L2 beyond the useful ones
    touched: tuple[tuple[str, int], ...]


def _classify(work: Work, resident_jobs: int, target: Target, l2: L2Residency) -> Traffic:
    """Where each load's bytes come from, in pass order (see the module docstring)."""
    usable = target.l2_bytes * L2_USABLE_FRACTION
    window = _window(work, resident_jobs)
    reread_hit = l2_hit(window, usable)
    overfetch_total = 0.0
    seen: set[str] = set()
    touched: dict[str, int] = {}
    out = []
    for g in work.groups:
        dram = l2_bytes = in_flight = overfetch = 0.0
        for ld in g.loads:
            A, F = ld.accesses * ld.itemsize, ld.distinct * ld.itemsize
            hit = reread_hit if ld.buffer in seen else l2.hit(ld.buffer, F)
            seen.add(ld.buffer)
            touched[ld.buffer] = max(touched.get(ld.buffer, 0), F)
            d, c = F * (1 - hit), F * hit
            extra = max(0.0, A - F)
            if F > L1_REUSE_BYTES:
                repeat_hit = l2_hit(F, usable)
                d, c = d + extra * (1 - repeat_hit), c + extra * repeat_hit
            dram, l2_bytes = dram + d, l2_bytes + c
            overfetch += (d + c) * (ld.overfetch - 1)
            in_flight += ld.in_flight * ((d + c) / A if A else 0.0)
        out.append(_GroupTraffic(dram, l2_bytes, in_flight))
        overfetch_total += overfetch
    write = atomic = 0.0
    chain = 0.0
    written: dict[str, float] = {}
    for s in work.stores:
        written[s.buffer] = written.get(s.buffer, 0) + s.distinct * s.itemsize
        if s.atomic:
            atomic += 2 * s.accesses * s.itemsize
            chain = max(chain, s.accesses / s.distinct)
    for name, size in written.items():
        write += size
        touched[name] = max(touched.get(name, 0), int(size))
    return Traffic(tuple(out), sum(g.dram for g in out), sum(g.l2 for g in out), write, atomic,
                   chain, overfetch_total, tuple(touched.items()))


# --- time ----------------------------------------------------------------------------------

_LIMITER = {"dram": "memory", "l2": "memory", "sm port": "memory", "latency": "latency",
            "issue": "compute", "fp32": "compute", "fp64": "compute", "sfu": "compute",
            "atomics": "memory"}


def estimate_launch(work: Work, spec, resources: Resources | None, target: Target,
                    l2: L2Residency | None = None, *, kernel: str = "") -> LaunchEstimate:
    """Model one launch (`spec`: a LaunchSpec) of a function whose work is `work`."""
    l2 = l2 if l2 is not None else L2Residency(target.l2_bytes * L2_USABLE_FRACTION)
    occ = occupancy(spec.threads, spec.shared_bytes, resources, target)
    if occ.blocks_per_sm == 0:
        return _unlaunchable(kernel, spec, occ, resources)
    resident = min(work.jobs, occ.blocks_per_sm * target.sm_count * work.jobs_per_block)
    traffic = _classify(work, resident, target, l2)
    spill = 0.0
    if resources and (resources.spill_store_bytes or resources.spill_load_bytes):
        spill = ((resources.spill_store_bytes + resources.spill_load_bytes) * spec.grid
                 * spec.threads * max(1.0, work.lane_loop_trips))
    totals: dict[str, float] = {}
    seconds = 0.0
    plan = waves(spec.grid, occ, target)
    for wave in plan:
        terms = _wave_terms(work, traffic, spill, wave, spec, occ, target)
        atomics = terms.pop("atomics")
        # a block waits for its loads, then runs its dependent steps
        terms["latency"] = terms.pop("concurrency") + terms.pop("chain")
        worst = max(terms, key=terms.get)
        t = terms[worst] + atomics
        seconds += wave.count * t
        totals[worst] = totals.get(worst, 0.0) + wave.count * terms[worst]
        if atomics:
            totals["atomics"] = totals.get("atomics", 0.0) + wave.count * atomics
    for name, size in traffic.touched:
        l2.touch(name, size)
    limiter = _LIMITER[max(totals, key=totals.get)] if totals else "launch"
    if target.launch_overhead_s >= seconds:
        limiter = "launch"
    breakdown = tuple(sorted(totals.items())) + (("launch", target.launch_overhead_s),)
    return LaunchEstimate(
        kernel=kernel, function=spec.function, seconds=seconds + target.launch_overhead_s,
        bytes_dram=round(traffic.dram_read + traffic.write), bytes_l2=round(traffic.l2_read),
        flops=round(work.fp32 + work.fp64 + work.sfu), occupancy=occ.fraction,
        blocks_per_sm=occ.blocks_per_sm, waves=sum(w.count for w in plan), limiter=limiter,
        resources=resources, grid=spec.grid, threads=spec.threads, breakdown=breakdown)


def _wave_terms(work: Work, traffic: Traffic, spill: float, wave, spec, occ: Occupancy,
                target: Target) -> dict[str, float]:
    """Seconds one wave needs by each limit (the wave does its share of the launch's work)."""
    f = wave.blocks / spec.grid
    lanes = wave.blocks * spec.threads
    clock = target.clock_hz
    all_bytes = traffic.dram_read + traffic.l2_read + traffic.write
    cap = wave.sms * SM_MAX_BYTES_IN_FLIGHT
    concurrency = 0.0
    for g in traffic.groups:
        if g.dram or g.l2:
            in_flight = min(lanes * g.in_flight_per_lane, cap)
            concurrency += (f * (g.dram * DRAM_LATENCY_S + g.l2 * L2_LATENCY_S)
                            / max(in_flight, 1e-9))
    warps_per_sm = wave.blocks_per_sm * occ.warps_per_block
    efficiency = COMPUTE_EFFICIENCY * min(1.0, warps_per_sm / WARPS_FOR_FULL_ISSUE)
    fp32_lanes = target.fp32_flops / 2 / target.sm_count / clock
    per_cycle = wave.sms * clock * efficiency
    return {
        "dram": f * (traffic.dram_read + traffic.write)
        / (target.dram_bytes_per_s * DRAM_EFFICIENCY),
        "l2": f * (all_bytes + traffic.overfetch + traffic.atomic + spill)
        / (target.dram_bytes_per_s * L2_OVER_DRAM),
        "sm port": f * (all_bytes + traffic.overfetch + spill)
        / (wave.sms * SM_PORT_BYTES_PER_CYCLE * clock),
        "concurrency": concurrency,
        "issue": f * work.instructions / target.warp_size / (per_cycle * ISSUE_PER_SM_PER_CYCLE),
        "fp32": f * work.fp32 / (per_cycle * fp32_lanes),
        "fp64": f * work.fp64 / (per_cycle * fp32_lanes * FP64_RATE_FRACTION),
        "sfu": f * work.sfu / (per_cycle * SFU_LANES_PER_SM),
        "chain": work.chain_cycles / clock,
        "atomics": f * traffic.atomic_chain * ATOMIC_SAME_ADDRESS_S,
    }


def _unlaunchable(kernel: str, spec, occ: Occupancy, resources) -> LaunchEstimate:
    """A block that fits on no SM (registers or shared memory): never finishes."""
    return LaunchEstimate(kernel=kernel, function=spec.function, seconds=math.inf, bytes_dram=0,
                          bytes_l2=0, flops=0, occupancy=0.0, blocks_per_sm=0, waves=0,
                          limiter=f"unlaunchable ({occ.limiter})", resources=resources,
                          grid=spec.grid, threads=spec.threads)


def memset_estimate(kernel: str, buffer: str, size: int, target: Target) -> LaunchEstimate:
    """Zeroing a buffer before an atomic launch: one more launch writing `size` bytes."""
    t = size / (target.dram_bytes_per_s * DRAM_EFFICIENCY)
    limiter = "launch" if target.launch_overhead_s >= t else "memory"
    return LaunchEstimate(kernel=kernel, function=f"memset {buffer}",
                          seconds=t + target.launch_overhead_s, bytes_dram=size, bytes_l2=0,
                          flops=0, occupancy=0.0, blocks_per_sm=0, waves=1, limiter=limiter,
                          resources=None,
                          breakdown=(("dram", t), ("launch", target.launch_overhead_s)))


# --- resources -----------------------------------------------------------------------------

_RESOURCES: dict[tuple[str, str], dict[str, Resources]] = {}
_RESOURCES_KEPT = 4096           # sources whose reports stay in memory (a search's worth)


def resources_of(source: str, target: Target, *, nvrtc: bool = True) -> dict[str, Resources]:
    """ptxas's report per function of `source` (NVRTC, cached in memory by source hash).
    Without `nvrtc` none: occupancy then ignores registers (a quick, rougher estimate)."""
    if not nvrtc:
        return {}
    key = (hashlib.sha256(source.encode()).hexdigest(), target.name)
    if key not in _RESOURCES:
        result = compile_cuda(source, target)
        if not result.ok:
            raise RuntimeError(f"NVRTC could not compile the kernel for {target.name}:\n"
                               f"{result.log}")
        if len(_RESOURCES) >= _RESOURCES_KEPT:
            _RESOURCES.clear()
        _RESOURCES[key] = dict(result.resources)
    return _RESOURCES[key]


# --- programs, kernels, rows ---------------------------------------------------------------

def _unit_launches(tk: TileKernel, row: Row, kp: K.KProgram, source: str, target: Target,
                   zero_fill: Iterable[str], l2: L2Residency, *, nvrtc: bool = True
                   ) -> list[LaunchEstimate]:
    """The estimates of one Tile IR kernel's launches under `row`, memsets first."""
    applied = apply_row(tk, row, target)
    functions = {f.name: f for f in kp.functions}
    parts = {p.kernel.name: p for p in applied.parts}
    res = resources_of(source, target, nvrtc=nvrtc)
    sizes = {b.name: b.type.numel * b.type.dtype.itemsize for b in tk.outputs}
    out = [memset_estimate(tk.name, name, sizes.get(name, 0), target) for name in zero_fill]
    for launch in kp.launches:
        fn = functions[launch.function]
        spec = LaunchSpec(fn.name, fn.grid, fn.threads, fn.shared_bytes, launch.args)
        work = launch_work(parts[fn.name], fn)
        out.append(estimate_launch(work, spec, res.get(fn.name), target, l2, kernel=tk.name))
    return out


def estimate_program(prog, target: Target, materialized) -> ProgramEstimate:
    """Model a CudaProgram; `materialized` is the "kernel" stage it was emitted from."""
    scheduled = materialized.scheduled
    l2 = L2Residency(target.l2_bytes * L2_USABLE_FRACTION)
    launches: list[LaunchEstimate] = []
    for tk, kp, unit in zip(scheduled.program.kernels, materialized.kernels, prog.units):
        launches += _unit_launches(tk, scheduled.rows[tk.name], kp, unit.source, target,
                                   unit.zero_fill, l2)
    return ProgramEstimate(tuple(launches), sum(e.seconds for e in launches), target.name)


def estimate_compiled(results: Mapping[str, Any]) -> ProgramEstimate:
    """Model the result of `compile_to(workload, "cuda", options)`."""
    scheduled = results["tile"]
    return estimate_program(results["cuda"], scheduled.target, results["kernel"])


def estimate_kernel(tk: TileKernel, row: Row | str, target: Target, *, nvrtc: bool = True
                    ) -> ProgramEstimate:
    """Model one Tile IR kernel under `row` on its own (its inputs start outside L2)."""
    row = parse(row) if isinstance(row, str) else row
    kp = lower_applied(tk.name, apply_row(tk, row, target))
    l2 = L2Residency(target.l2_bytes * L2_USABLE_FRACTION)
    source = emit_program(kp) if nvrtc else ""
    launches = _unit_launches(tk, row, kp, source, target, kp.zero_fill, l2, nvrtc=nvrtc)
    return ProgramEstimate(tuple(launches), sum(e.seconds for e in launches), target.name)


_SCHEDULED: dict[int, tuple[Any, Any]] = {}


def _tile_kernel(source, kernel_name: str, target: Target) -> TileKernel:
    """The Tile IR kernel `kernel_name` of a workload, a Scheduled, a TileProgram or a kernel."""
    if isinstance(source, TileKernel):
        return source
    program = getattr(source, "program", source)
    if not hasattr(program, "kernels"):            # a Workload: lift it once per object
        if id(source) not in _SCHEDULED:
            from emmy.pipeline import Options, compile_to

            tile = compile_to(source, "tile", Options(target=target.name))["tile"]
            _SCHEDULED[id(source)] = (source, tile)
        program = _SCHEDULED[id(source)][1].program
    kernels = {k.name: k for k in program.kernels}
    if kernel_name == "" and len(kernels) == 1:
        return next(iter(kernels.values()))
    if kernel_name not in kernels:
        raise KeyError(f"no kernel `{kernel_name}`; the kernels are {', '.join(kernels)}")
    return kernels[kernel_name]


def estimate_row(source, kernel_name: str, row_text: str, target: Target, *,
                 nvrtc: bool = True) -> float:
    """Modeled seconds of one kernel under one row. `source`: a Workload, the "tile" stage
    (Scheduled), a TileProgram or a TileKernel; "" names the only kernel."""
    from emmy.schedule.space import Space

    tk = _tile_kernel(source, kernel_name, target)
    row = parse(row_text)
    refusals = Space(tk, target).check(row)
    if refusals:
        raise ValueError(f"row `{row_text}` is illegal for `{tk.name}`: "
                         + "; ".join(str(r) for r in refusals))
    return estimate_kernel(tk, row, target, nvrtc=nvrtc).seconds


def rank_rows(tk: TileKernel, rows: Iterable[Row | str], target: Target, *, nvrtc: bool = True
              ) -> list[tuple[Row, float]]:
    """Rows fastest first by modeled seconds (ties keep the given order)."""
    scored = []
    for row in rows:
        row = parse(row) if isinstance(row, str) else row
        scored.append((row, estimate_kernel(tk, row, target, nvrtc=nvrtc).seconds))
    return sorted(scored, key=lambda rs: rs[1])


def format_estimate(est: ProgramEstimate) -> str:
    """One line per launch and a total, every figure labelled modeled."""
    lines = []
    for e in est.launches:
        lines.append(f"{e.function:<32} {e.seconds * 1e6:10.2f} us  {e.limiter:<8} "
                     f"dram {e.bytes_dram / 2**20:9.2f} MiB  l2 {e.bytes_l2 / 2**20:9.2f} MiB  "
                     f"occupancy {e.occupancy:4.0%} ({e.blocks_per_sm} blocks/SM, "
                     f"{e.waves} wave{'s' if e.waves != 1 else ''})")
    lines.append(f"{'total':<32} {est.seconds * 1e6:10.2f} us  ({est.method} for {est.target})")
    return "\n".join(lines)
