"""Matrix-product kernel templates: mma.sync (f16/bf16 operands, f32 accumulators), mma.sync
on TF32 (f32 operands rounded to tf32, f32 accumulators) and SIMT FFMA (f32), for the problems
and configurations of emmy.cuda.gemm_spec.

    gemm_body(problem, config, epilogue)  the lines inside the kernel, its grid, block, smem
    combine_body(problem, config, epilogue)  split_mode "combine": the kernel that sums the
                                              partial products and runs the epilogue
    constraints(problem, config, target_name)  why a configuration cannot be built (empty: it can)
    smem_bytes(problem, config)            dynamic shared memory of gemm_body's kernel

How one block computes its bm x bn output tile (every size is a compile-time constant):
- bid decodes to (batch bz, split s, tile); the tile index maps to (tile_m, tile_n) row-major
  over the tiles (group 1) or in groups of `group` tile rows walked column by column (group
  G > 1, for L2 reuse of the B columns; the last group may be shorter).
- Split s owns the K tiles [s*KT/split, (s+1)*KT/split) of the KT = ceil(k/bk) tiles.
- Each K tile of A (bm x bk) and B (bk x bn) is staged in shared memory in the operand's own
  contiguous order: "k-major" (rows = m or n, k contiguous) when stride_k is the smaller stride,
  "outer-major" (rows = k) otherwise; rows are padded by 16 bytes where that makes the row
  pitch an odd number of 16-byte units, so 8 rows read together hit 8 different bank groups
  (tf32's k-major tiles: by 32 bytes where that makes the pitch an odd number of 32-byte
  units, so the 4 rows x 8 bytes a half warp reads hit 32 different banks).
- stages 1: every thread copies its share of the tile synchronously (16-byte vectors when the
  operand's rows are 16-byte aligned, else element by element), with predicates that zero-fill
  outside the matrix, so any shape works. A gathered operand (an implicit GEMM's) is read
  element by element through the compiler's function for one element (gm_a_at / gm_b_at;
  in window form from a per-block table of its k side), all of a thread's loads into
  registers first, then stored (gm_fetch / gm_put).
  stages 2..4: a ring of cp.async copies (zfill at the ragged edges), `stages - 1` tiles in
  flight while one is computed, one barrier per K tile; a gathered operand's next tile is
  fetched into registers before a tile's mma and stored after them.
- mma: each warp owns a (bm/wm) x (bn/wn) warp tile of m16n8k16 atoms with f32 accumulators in
  registers; fragments come from ldmatrix (x4 for A, x4 pairs / x2 for B; .trans where the
  shared tile is outer-major for A or n-contiguous for B). With cp.async the fragments are read
  one k step ahead, across K tiles too: the barrier that publishes tile i+1 sits before tile
  i's last k step, so its mma overlap the next tile's first ldmatrix (on an H200 this took
  128x256x32 from 258 to 365 TFLOP/s).
- tf32: the same warp tiles of m16n8k8 atoms (f32 accumulators as mma), pipelined one k step
  ahead like mma; fragments come from plain shared loads (ldmatrix moves 16-bit elements),
  rounded by cvt.rna.tf32.f32. A and B read each k step in one permuted order (a lane's k t
  and t + 4 at 2t and 2t + 1), so k-major tiles give a lane's two k in one 8-byte load.
- simt: each lane owns a tm x tn micro-tile whose rows (and columns) come in vectors of up to 4
  strided across the warp's lanes, read from shared memory as 16-byte vectors.
- The epilogue is called once per output element inside the bounds; with split_mode
  "combine" the f32 partial sum goes to `emmy_partial[s][bz][m][n]` instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from emmy.cuda.gemm_spec import (PARTIAL, TICKETS, Body, Epilogue, Gather, GemmConfig,
                                 GemmOperand, GemmProblem, VectorGather, WindowGather,
                                 last_block_lines, pair_of)
from emmy.schedule.targets import TARGETS

CHUNK_BYTES = 16              # one cp.async / one vector copy
MMA_K = 16                    # m16n8k16
TF32_K = 8                    # m16n8k8 (tf32)
MAX_STAGES = 4
MAX_MMA_ACCUMULATORS = 128    # f32 accumulators per thread: more leaves too few registers
MAX_SIMT_ACCUMULATORS = 64
MAX_HELD_ELEMENTS = 32        # a gathered tile's elements a thread holds in registers
SIMT_K_STEP = 4               # the SIMT loop reads 4 k at a time (one 16-byte vector)
COMBINE_THREADS = 256
MAX_GRID = 2**31 - 1
SPLIT_MODES = ("atomic", "combine", "last")
STORAGE = {"__half": "unsigned short", "__nv_bfloat16": "unsigned short", "float": "float"}
# a gathered element (a float expression holding an exact f16/bf16/f32 value) as storage bits
BITS = {"__half": "__half_as_ushort(__float2half({}))",
        "__nv_bfloat16": "__bfloat16_as_ushort(__float2bfloat16({}))", "float": "{}"}
TABLE_ENTRY_BYTES = 8         # a window table's entry: int2 (k offset, packed window positions)
MMA_FN = {"__half": "mma_m16n8k16_f16f32", "__nv_bfloat16": "mma_m16n8k16_bf16f32"}
TENSOR_CORE = ("mma", "tf32")  # warp tiles of 16x8 mma.sync atoms
INSTS = ("mma", "tf32", "simt")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _ll(x: int) -> str:
    """An integer literal that keeps 64-bit arithmetic where it may need it."""
    return f"{x}LL" if abs(x) >= 2**31 else str(x)


# --- geometry ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Tile:
    """One operand's tile in one shared-memory stage: `rows` x `cols` elements, `cols`
    contiguous, rows `ld` elements apart; and the global elements it holds."""

    label: str            # "A" | "B"
    name: str             # prefix of the emitted variables: "a" | "b"
    op: GemmOperand
    outer: str            # "m" | "n"
    outer_extent: int     # M | N
    outer_tile: int       # bm | bn
    k: int
    bk: int
    batch: int
    threads: int
    tf32: bool = False    # fragments read element by element (tf32): see pad

    @property
    def k_major(self) -> bool:
        """Rows are m (or n), k contiguous: when stride_k is 1, or the smaller stride."""
        s = self.op
        if s.stride_k == 1 or s.stride_outer == 1:
            return s.stride_k == 1
        return abs(s.stride_k) <= abs(s.stride_outer)

    @property
    def rows(self) -> int:
        return self.outer_tile if self.k_major else self.bk

    @property
    def cols(self) -> int:
        return self.bk if self.k_major else self.outer_tile

    @property
    def row_dim(self) -> str:
        return self.outer if self.k_major else "k"

    @property
    def col_dim(self) -> str:
        return "k" if self.k_major else self.outer

    @property
    def row_stride(self) -> int:
        """Global elements between consecutive rows of the tile."""
        return self.op.stride_outer if self.k_major else self.op.stride_k

    @property
    def col_stride(self) -> int:
        return self.op.stride_k if self.k_major else self.op.stride_outer

    @property
    def row_extent(self) -> int:
        return self.outer_extent if self.k_major else self.k

    @property
    def col_extent(self) -> int:
        return self.k if self.k_major else self.outer_extent

    @property
    def itemsize(self) -> int:
        return self.op.itemsize

    @property
    def chunk(self) -> int:
        """Elements per 16-byte chunk."""
        return CHUNK_BYTES // self.itemsize

    @property
    def pad(self) -> int:
        """Padding elements per row: the row pitch becomes an odd number of 16-byte units; for
        tf32's k-major tiles an odd number of 32-byte units (8 mod 16 floats), as each half
        warp reads 8 bytes at (row g, k 2t) for g < 4, t < 4: rows 8 banks apart."""
        if self.tf32 and self.k_major:
            return 0 if self.cols % 16 == 8 else 8 + (-self.cols) % 8
        units = self.cols * self.itemsize // CHUNK_BYTES
        return self.chunk if units % 2 == 0 else 0

    @property
    def ld(self) -> int:
        return self.cols + self.pad

    @property
    def elems(self) -> int:
        return self.rows * self.ld

    def chunk_problems(self) -> list[str]:
        """Why 16-byte chunks of this operand are not 16-byte aligned (empty: they are)."""
        s, b = self.op, self.itemsize
        if s.gathered:
            return [f"{self.label} is gathered element by element"]
        if self.col_stride != 1:
            return [f"{self.label} has no contiguous dimension (stride_{self.outer}="
                    f"{s.stride_outer}, stride_k={s.stride_k})"]
        out = []
        if s.start * b % CHUNK_BYTES:
            out.append(f"{self.label} starts {s.start} elements ({s.start * b} bytes) into its "
                       f"buffer, off a {CHUNK_BYTES}-byte boundary")
        if self.row_stride * b % CHUNK_BYTES:
            out.append(f"{self.label}'s {self.row_dim}-rows are {self.row_stride * b} bytes "
                       f"apart ({self.row_stride} x {b} B), not a multiple of {CHUNK_BYTES}")
        if self.batch > 1 and s.batch_stride is None:
            out.append(f"{self.label}'s batch offset `{s.batch_offset}` is not a known stride")
        elif self.batch > 1 and s.batch_stride * b % CHUNK_BYTES:
            out.append(f"{self.label}'s batches are {s.batch_stride * b} bytes apart "
                       f"({s.batch_stride} x {b} B), not a multiple of {CHUNK_BYTES}")
        return out

    @property
    def vec(self) -> int:
        """Elements each copy moves: a 16-byte chunk when aligned, else 1; a gathered
        operand's, its vector width (a computed operand's VectorGather, else 1)."""
        if self.op.gathered:
            return self.op.vector
        return self.chunk if not self.chunk_problems() else 1

    @property
    def held_elements(self) -> int:
        """A thread's elements of one tile (a gathered operand's, held in registers)."""
        return self.iters * self.vec

    @property
    def per_row(self) -> int:
        return self.cols // self.vec

    @property
    def copies(self) -> int:
        return self.rows * self.per_row

    @property
    def iters(self) -> int:
        return _ceil_div(self.copies, self.threads)

    @property
    def uniform(self) -> bool:
        """Every copy of a thread sits in the same column (rows `threads/per_row` apart)."""
        return self.threads % self.per_row == 0 and not self.op.gathered


@dataclass(frozen=True)
class _SimtLanes:
    """How a SIMT warp's 32 lanes cover its warp tile: lm x ln lanes, each a tm x tn
    micro-tile made of vectors of vm rows (vn columns) strided lm*vm (ln*vn) apart."""

    lm: int
    ln: int
    tm: int
    tn: int

    @property
    def vm(self) -> int:
        return 4 if self.tm % 4 == 0 else 2 if self.tm % 2 == 0 else 1

    @property
    def vn(self) -> int:
        return 4 if self.tn % 4 == 0 else 2 if self.tn % 2 == 0 else 1


def _simt_lanes(wtm: int, wtn: int) -> _SimtLanes | None:
    """The lane grid giving the squarest micro-tile (vectors of 4 preferred), or None."""
    options = []
    for lm in (1, 2, 4, 8, 16, 32):
        ln = 32 // lm
        if wtm % lm or wtn % ln:
            continue
        tm, tn = wtm // lm, wtn // ln
        options.append(((tm % 4 != 0) + (tn % 4 != 0), max(tm, tn) / min(tm, tn), lm > ln,
                        _SimtLanes(lm, ln, tm, tn)))
    return min(options, key=lambda o: o[:3])[3] if options else None


@dataclass(frozen=True)
class _Plan:
    """Everything derived from (problem, config) that the checks and the emitter share."""

    p: GemmProblem
    c: GemmConfig

    @property
    def tiles_m(self) -> int:
        return _ceil_div(self.p.m, self.c.bm)

    @property
    def tiles_n(self) -> int:
        return _ceil_div(self.p.n, self.c.bn)

    @property
    def tiles(self) -> int:
        return self.tiles_m * self.tiles_n

    @property
    def k_tiles(self) -> int:
        return _ceil_div(self.p.k, self.c.bk)

    @property
    def grid(self) -> int:
        return self.p.batch * self.c.split * self.tiles

    @property
    def wtm(self) -> int:
        return self.c.bm // self.c.wm

    @property
    def wtn(self) -> int:
        return self.c.bn // self.c.wn

    @cached_property
    def a(self) -> _Tile:
        p, c = self.p, self.c
        return _Tile("A", "a", p.a, "m", p.m, c.bm, p.k, c.bk, p.batch, c.threads,
                     c.inst == "tf32")

    @cached_property
    def b(self) -> _Tile:
        p, c = self.p, self.c
        return _Tile("B", "b", p.b, "n", p.n, c.bn, p.k, c.bk, p.batch, c.threads,
                     c.inst == "tf32")

    @cached_property
    def lanes(self) -> _SimtLanes | None:
        return _simt_lanes(self.wtm, self.wtn)

    @property
    def stage_elems(self) -> int:
        return self.a.elems + self.b.elems

    @property
    def table_entries(self) -> int:
        """k per window table: the most K of one split (its K tiles, at most K)."""
        return min(self.p.k, _ceil_div(self.k_tiles, self.c.split) * self.c.bk)

    @property
    def stages_bytes(self) -> int:
        return _ceil_div(self.c.stages * self.stage_elems * self.a.itemsize, 16) * 16

    def table_offset(self, t: _Tile) -> int:
        """Byte offset of operand t's window table: after the stages (and A's table)."""
        before = self.a.op.windowed and t is self.b
        return self.stages_bytes + before * TABLE_ENTRY_BYTES * self.table_entries

    def raw_ring(self, t: _Tile) -> bool:
        return raw_ring(t.op, self.c)

    def ring_bytes(self, t: _Tile) -> int:
        """One stage of t's raw ring: its tile of raw elements, unpadded (each thread's
        vectors are consecutive, 8 or 16 bytes apart: no bank conflicts)."""
        return t.op.raw_bytes(t.rows * t.cols) if self.raw_ring(t) else 0

    def ring_offset(self, t: _Tile) -> int:
        """Byte offset of t's raw ring: after the stages, the window tables (and A's ring)."""
        tables = sum(u.op.windowed for u in (self.a, self.b))
        before = self.stages_bytes + tables * TABLE_ENTRY_BYTES * self.table_entries
        return before + (t is self.b) * self.c.stages * self.ring_bytes(self.a)

    @property
    def smem_bytes(self) -> int:
        tables = sum(t.op.windowed for t in (self.a, self.b))
        rings = self.c.stages * (self.ring_bytes(self.a) + self.ring_bytes(self.b))
        if not tables and not rings:
            return self.c.stages * self.stage_elems * self.a.itemsize
        return self.stages_bytes + tables * TABLE_ENTRY_BYTES * self.table_entries + rings


# --- what can be built ------------------------------------------------------------------------

def _kib(n: int) -> str:
    return f"{n / 1024:g} KiB"


def _shape_problems(p: GemmProblem, c: GemmConfig) -> list[str]:
    """Target-independent reasons (problem, config) cannot be built; empty when it can."""
    if c.inst == "wgmma":
        return ["wgmma configurations are built by emmy.cuda.gemm_sm90, not this template"]
    if c.inst not in INSTS:
        return [f"unknown instruction kind `{c.inst}` (mma, tf32 or simt)"]
    out = []
    if min(p.m, p.n, p.k, p.batch) < 1:
        out.append(f"empty problem {p.batch} x {p.m} x {p.n} x {p.k}")
    if min(c.bm, c.bn, c.bk, c.wm, c.wn, c.stages, c.split, c.group) < 1:
        return out + ["tile sizes, warps, stages, split and group must be positive"]
    if p.a.ctype != p.b.ctype:
        out.append(f"A and B must have one element type, got {p.a.ctype} and {p.b.ctype}")
    if c.inst == "mma" and p.a.ctype not in MMA_FN:
        out.append(f"mma needs f16/bf16 operands, got {p.a.ctype}")
    if c.inst in ("simt", "tf32") and (p.a.ctype, p.b.ctype) != ("float", "float"):
        out.append(f"{c.inst} needs float operands, got {p.a.ctype} and {p.b.ctype}")
    if c.tma:
        out.append("TMA loads belong to wgmma configurations")
    if c.threads > 1024:
        out.append(f"{c.wm} x {c.wn} warps = {c.threads} threads > 1024 per block")
    if c.bm % c.wm or c.bn % c.wn:
        out.append(f"block tile {c.bm}x{c.bn} does not split into {c.wm} x {c.wn} warps")
        return out
    plan = _Plan(p, c)
    wtm, wtn = plan.wtm, plan.wtn
    if c.inst in TENSOR_CORE:
        k_step = MMA_K if c.inst == "mma" else TF32_K
        if wtm % 16 or wtn % 8:
            out.append(f"warp tile {wtm}x{wtn} is not a multiple of the 16x8 {c.inst} atom")
        if c.bk % k_step:
            out.append(f"bk={c.bk} is not a multiple of the {c.inst}'s k step {k_step}")
        if wtm * wtn // 32 > MAX_MMA_ACCUMULATORS:
            out.append(f"warp tile {wtm}x{wtn} needs {wtm * wtn // 32} f32 accumulators per "
                       f"thread > {MAX_MMA_ACCUMULATORS} (register pressure)")
    if c.inst == "simt":
        lanes = plan.lanes
        if lanes is None:
            out.append(f"warp tile {wtm}x{wtn} does not split over 32 lanes")
        elif lanes.tm * lanes.tn > MAX_SIMT_ACCUMULATORS:
            out.append(f"micro-tile {lanes.tm}x{lanes.tn} per thread > "
                       f"{MAX_SIMT_ACCUMULATORS} accumulators (register pressure)")
        if c.bk % SIMT_K_STEP or c.bm % 4 or c.bn % 4:
            out.append(f"simt tiles must be multiples of 4 floats (16 bytes), got "
                       f"{c.bm}x{c.bn}x{c.bk}")
    if c.stages > MAX_STAGES:
        out.append(f"{c.stages} stages > {MAX_STAGES}")
    if c.stages > 1 and p.a.ctype in STORAGE:
        for t in (plan.a, plan.b):
            if not t.op.gathered:
                out += [f"cp.async copies 16-byte chunks: {why}" for why in t.chunk_problems()]
        out += held_problems(p, c)
    if c.split > 1 and c.split_mode not in SPLIT_MODES:
        out.append(f"split {c.split} needs split_mode atomic or combine, got `{c.split_mode}`")
    if c.split_mode and c.split_mode not in SPLIT_MODES:
        out.append(f"unknown split_mode `{c.split_mode}`")
    if c.split > plan.k_tiles:
        out.append(f"split {c.split} > {plan.k_tiles} K tiles (k={p.k}, bk={c.bk}): "
                   f"some blocks would have no K range")
    if plan.grid > MAX_GRID:
        out.append(f"grid of {plan.grid} blocks > {MAX_GRID}")
    return out


def held_problems(p: GemmProblem, c: GemmConfig) -> list[str]:
    """Why a cp.async ring cannot hold a gathered operand's next tile in registers (a few per
    thread); empty when it can or there is no ring."""
    if c.stages <= 1 or c.inst == "wgmma":   # the wgmma template computes straight into a stage
        return []
    plan = _Plan(p, c)
    return [f"async:{c.stages} holds the next {t.outer_tile}x{c.bk} tile of gathered operand "
            f"{t.label} in registers: {t.held_elements} elements per thread > {MAX_HELD_ELEMENTS}; use "
            f"a smaller tile, more warps or STAGE=smem"
            for t in (plan.a, plan.b) if t.op.gathered and t.held_elements > MAX_HELD_ELEMENTS]


def target_problems(inst: str, threads: int, stages: int, target_name: str):
    """(the target, what it lacks for `inst` with `threads` threads and `stages` copy stages);
    the target is None when the name is unknown. Shared with emmy.cuda.chain."""
    target = TARGETS.get(target_name)
    if target is None:
        return None, [f"unknown target `{target_name}` (known: {', '.join(TARGETS)})"]
    out = []
    if inst == "mma" and not (target.has_mma_sync and target.has_ldmatrix):
        out.append(f"{target_name} has no mma.sync / ldmatrix")
    if inst == "tf32" and not target.has_mma_sync:
        out.append(f"{target_name} has no mma.sync (tf32 needs sm_80+)")
    if stages > 1 and not target.has_cp_async:
        out.append(f"{target_name} has no cp.async")
    if threads > target.max_threads_per_block:
        out.append(f"{threads} threads > {target.max_threads_per_block} on {target_name}")
    return target, out


def constraints(problem: GemmProblem, config: GemmConfig, target_name: str) -> list[str]:
    """Plain-English reasons `config` cannot be built for `problem` on `target_name`; empty
    when it can (and then the kernel is correct for every input)."""
    out = _shape_problems(problem, config)
    target, missing = target_problems(config.inst, config.threads, config.stages, target_name)
    out += missing
    if out or config.inst not in INSTS:
        return out
    plan = _Plan(problem, config)
    limit = target.shared_per_block_optin
    if plan.smem_bytes > limit:
        ring = plan.ring_bytes(plan.a) + plan.ring_bytes(plan.b)
        out.append(f"shared memory {config.stages} stages x {_kib(plan.stage_elems * plan.a.itemsize)}"
                   f"{f' (+ {_kib(ring)} of raw bytes each)' if ring else ''}"
                   f" = {_kib(plan.smem_bytes)} > {_kib(limit)} per block on {target_name}")
    return out


def smem_bytes(problem: GemmProblem, config: GemmConfig) -> int:
    """Dynamic shared memory of gemm_body's kernel: `stages` copies of the padded A and B tiles."""
    return _Plan(problem, config).smem_bytes


def raw_ring(op: GemmOperand, c: GemmConfig) -> bool:
    """A computed operand whose raw vectors come through their own cp.async ring: on a wgmma
    row always (emmy.cuda.gemm_sm90: as far ahead as the other operand's tiles, each tile
    computed into its stage once it has landed); on an mma.sync row with three stages or more
    (`stages - 2` K tiles of raw bytes in flight, each tile computed from shared memory into
    the f16 stage one K step before its mma read it; with fewer stages, or element by element,
    its loads are in flight for one K step)."""
    return op.computed and op.vector > 1 and \
        (c.inst == "wgmma" or (c.stages >= 3 and c.inst in TENSOR_CORE))


def raw_vector(op: GemmOperand, g: VectorGather) -> str:
    """The C type of a computed operand's raw vector: its words where it is paired."""
    if op.paired:
        return f"EmVec<{op.raw_bytes(op.vector) // 4}, uint32_t>"
    return f"EmVec<{op.vector // op.packing}, {g.ctype}>"


def computed_lambdas(name: str, op: GemmOperand, g: VectorGather) -> list[str]:
    """A computed operand's element functions, for both templates: gm_<name>_raw(outer, k) is
    the address of the raw vector at (outer, k) (one aligned load, or a cp.async of it into a
    raw ring), gm_<name>_vec(outer, k, raw) computes its elements k .. k + vec - 1 from it, one
    at a time or (g.pair) two at a time on 16-bit pairs from its words. `bz` and `gm_t` (the
    16-bit storage type) must be in scope."""
    v = op.vector
    lines, off = g.offset("gm_o", "gm_kk")
    raw = raw_vector(op, g)
    if g.pair is not None:
        arg, body = "gm_raww", (g.prologue("gm_o", "gm_kk") if g.prologue else [])
        for j in range(0, v, 2):
            stmts, value = g.pair("gm_o", "gm_kk", j)
            body += ["{", *_indent(stmts), f"  memcpy(&gm_v.x[{j}], &{value}, 4);", "}"]
    else:
        arg, body = "gm_rawv", [f"const {g.ctype}* gm_raw = gm_rawv.x;"]
        for j in range(v):
            stmts, value = g.element("gm_o", "gm_kk", j)
            body += ["{", *_indent(stmts), f"  gm_v.x[{j}] = {BITS[op.ctype].format(value)};",
                     "}"]
    return [f"auto gm_{name}_raw = [&](int gm_o, int gm_kk) -> const {raw}* {{",
            *_indent(lines),
            f"  return reinterpret_cast<const {raw}*>({g.buffer} + ({off}));",
            "};",
            f"auto gm_{name}_vec = [&](int gm_o, int gm_kk, const {raw} {arg}) -> "
            f"EmVec<{v}, gm_t> {{",
            f"  EmVec<{v}, gm_t> gm_v;",
            *_indent(body),
            "  return gm_v;",
            "};"]


# --- emission ---------------------------------------------------------------------------------

def _indent(lines: list[str], depth: int = 1) -> list[str]:
    return [("  " * depth + line) if line else line for line in lines]


def _unrolled(var: str, count: int, body: list[str]) -> list[str]:
    """`for var in range(count)` fully unrolled by the compiler (no loop when count is 1)."""
    if count == 1:
        return ["{", f"  const int {var} = 0;", *_indent(body), "}"]
    return ["#pragma unroll", f"for (int {var} = 0; {var} < {count}; ++{var}) {{",
            *_indent(body), "}"]


class _Emitter:
    """Prints gemm_body's lines for one (problem, config, epilogue)."""

    def __init__(self, p: GemmProblem, c: GemmConfig, epilogue: Epilogue,
                 gather: dict[str, Gather | WindowGather] | None = None):
        self.p, self.c, self.epilogue = p, c, epilogue
        self.plan = _Plan(p, c)
        self.gather = gather or {}
        for t in (self.plan.a, self.plan.b):
            assert t.op.gathered == (t.name in self.gather), f"operand {t.label}: gather"

    def decode(self) -> list[str]:
        """bz, gm_split, the tile origin (gm_m0, gm_n0) and the K tiles [gm_kt0, +gm_nk)."""
        p, c, plan = self.p, self.c, self.plan
        tiles, tn = plan.tiles, plan.tiles_n
        out = ["// this block's output tile, split and batch (the tile index varies fastest)",
               f"const int gm_tile = (int)(bid % {tiles});"]
        out.append(f"const int gm_split = (int)(bid / {tiles} % {c.split});" if c.split > 1
                   else "const int gm_split = 0;")
        out.append(f"const long long bz = bid / {tiles * c.split};" if p.batch > 1
                   else "const long long bz = 0;")
        if c.group == 1:
            out += [f"const int gm_tm = gm_tile / {tn}, gm_tn = gm_tile % {tn};"]
        else:
            g = c.group
            out += [f"// grouped order: {g} tile rows at a time, column by column in the group",
                    f"const int gm_first = gm_tile / {g * tn} * {g};",
                    f"const int gm_rows = min({plan.tiles_m} - gm_first, {g});",
                    f"const int gm_in = gm_tile % {g * tn};",
                    "const int gm_tm = gm_first + gm_in % gm_rows, gm_tn = gm_in / gm_rows;"]
        out.append(f"const int gm_m0 = gm_tm * {c.bm}, gm_n0 = gm_tn * {c.bn};")
        if c.split > 1:
            kt = plan.k_tiles
            out += [f"// split gm_split owns K tiles [s*{kt}/{c.split}, (s+1)*{kt}/{c.split})",
                    f"const int gm_kt0 = gm_split * {kt} / {c.split};",
                    f"const int gm_nk = (gm_split + 1) * {kt} / {c.split} - gm_kt0;"]
        else:
            out.append(f"const int gm_kt0 = 0, gm_nk = {plan.k_tiles};")
        return out

    def copy_setup(self, t: _Tile) -> list[str]:
        """The operand's typed pointer at this batch, and this thread's first copy; for a
        gathered operand the function computing one element (`gm_a_at(outer, k)`)."""
        n, vec = t.name, t.vec
        if t.op.gathered and isinstance(self.gather[n], WindowGather):
            return self.window_setup(t, self.gather[n])
        if t.op.gathered and isinstance(self.gather[n], VectorGather):
            ring = [f"unsigned char* gm_{n}_ring = emmy_smem + {self.plan.ring_offset(t)};"
                    f"   // {self.c.stages} stages of {self.plan.ring_bytes(t)} raw bytes"] \
                if self.plan.raw_ring(t) else []
            return self.vector_setup(t, self.gather[n]) + ring
        if t.op.gathered:
            lines, value = self.gather[n]("gm_o", "gm_kk")
            return [f"// {t.label}: {t.rows} {t.row_dim}-rows x {t.cols} {t.col_dim} per stage, "
                    f"gathered: {t.iters} elements per thread, each computed by",
                    f"auto gm_{n}_at = [&](int gm_o, int gm_kk) -> gm_t {{",
                    *_indent(lines), f"  return {BITS[t.op.ctype].format(value)};", "};"]
        out = [f"// {t.label}: {t.rows} {t.row_dim}-rows x {t.cols} {t.col_dim} (contiguous) per "
               f"stage, {t.iters} copies of {vec} element(s) per thread",
               f"const gm_t* __restrict__ gm_{n} = reinterpret_cast<const gm_t*>({t.op.buffer})"
               f" + ({t.op.batch_offset});"]
        if t.uniform:
            origin = {"m": "gm_m0", "n": "gm_n0", "k": "0"}
            out += [f"const int gm_{n}_r = tid / {t.per_row}, gm_{n}_c = tid % {t.per_row}"
                    f" * {vec};",
                    f"// at K tile 0; K tile kt is {t.bk * t.op.stride_k} * kt elements further",
                    f"const gm_t* gm_{n}_thr = gm_{n} + (long long)({origin[t.row_dim]} + gm_{n}_r)"
                    f" * {_ll(t.row_stride)} + (long long)({origin[t.col_dim]} + gm_{n}_c) * "
                    f"{_ll(t.col_stride)};"]
        return out

    def vector_setup(self, t: _Tile, g: VectorGather) -> list[str]:
        """A computed operand fetched `vec` elements at a time (computed_lambdas)."""
        how = "two at a time on 16-bit pairs" if g.pair is not None else "one at a time"
        ring = " through a cp.async ring of the raw bytes" if self.plan.raw_ring(t) else ""
        return [f"// {t.label}: {t.rows} {t.row_dim}-rows x {t.cols} {t.col_dim} per stage, "
                f"from one vector of {t.vec} {g.buffer} elements ({t.iters} vectors per thread)"
                f"{ring}, computed {how}", *computed_lambdas(t.name, t.op, g)]

    def window_setup(self, t: _Tile, w: WindowGather) -> list[str]:
        """A windowed operand: the block tabulates the k side of its K range in shared memory
        (the offset, and the window positions packed into one word), and gm_<n>_at(outer, k)
        combines it with the outer side (which a thread's fixed tile column makes
        loop-invariant)."""
        n, plan, bk = t.name, self.plan, t.bk
        entries = plan.table_entries
        k_off, k_parts = w.k("g_k")
        fields, shift, packed = [], 0, []
        for (lo, hi), k_i in zip(w.k_bounds, k_parts):
            bits = max(1, (hi - lo).bit_length())
            fields.append((shift, (1 << bits) - 1, lo))
            packed.append(f"(unsigned)({k_i} - ({lo})) << {shift}" if shift
                          else f"(unsigned)({k_i} - ({lo}))")
            shift += bits
        out = [f"// {t.label}: {t.rows} {t.row_dim}-rows x {t.cols} {t.col_dim} per stage, "
               f"gathered through a window: {t.iters} elements per thread, each "
               f"all(lo <= o_i + k_i < hi) ? {w.buffer}[base(o) + offset(k)] : 0",
               "// k side, per k of this block's K range: (offset(k), the k_i packed)",
               f"int2* gm_{n}_tab = reinterpret_cast<int2*>(emmy_smem + "
               f"{plan.table_offset(t)});",
               f"for (int gm_t = tid; gm_t < min({entries}, {t.k} - gm_kt0 * {bk}); "
               f"gm_t += {t.threads}) {{",
               f"  const int g_k = gm_kt0 * {bk} + gm_t;",
               f"  gm_{n}_tab[gm_t] = make_int2({k_off}, "
               f"(int)({' | '.join(packed) if packed else '0u'}));",
               "}",
               "__syncthreads();",
               f"const gm_t* __restrict__ gm_{n} = reinterpret_cast<const gm_t*>({w.buffer});"]
        lines, base, o_parts = w.outer("gm_o")
        conds, it = [], iter(fields)
        for (lo, hi, has_k), o_i in zip(w.ranges, o_parts):
            e = f"({o_i})"
            if has_k:
                sh, mask, k_lo = next(it)
                e = f"({o_i} + (int)((unsigned)gm_e.y >> {sh} & {mask}u) + ({k_lo}))"
            if lo is not None and hi is not None:
                conds.append(f"(unsigned)({e} - ({lo})) < {hi - lo}u")
            else:
                conds += ([f"{e} >= {lo}"] if lo is not None else []) + \
                         ([f"{e} < {hi}"] if hi is not None else [])
        if conds:   # `&`, not `&&`: no branch per test, one predicated load
            value = [f"const bool gm_in = {' & '.join(f'({c})' for c in conds)};",
                     f"return gm_in ? gm_{n}[{base} + gm_e.x] : gm_t(0);"]
        else:
            value = [f"return gm_{n}[{base} + gm_e.x];"]
        return out + [f"auto gm_{n}_at = [&](int gm_o, int gm_kk) -> gm_t {{",
                      *_indent(lines),
                      f"  const int2 gm_e = gm_{n}_tab[gm_kk - gm_kt0 * {bk}];",
                      *_indent(value), "};"]

    def gathered_fetch(self, t: _Tile, kt: str, dst: str | None = None,
                       ring: str | None = None) -> list[str]:
        """A gathered operand's K tile kt into registers gm_<n>_reg (or, dst given, straight
        into the shared tile there): each thread computes its elements (gm_r, gm_c) of the
        tile with gm_<n>_at, zero outside the matrix; `ring` given, from the raw vectors in
        that stage of the raw ring rather than from global memory."""
        outer, k, ok = self._tile_element(t, kt)
        if t.vec > 1:     # whole vectors: the columns' extent is a multiple of the width
            kind = raw_vector(t.op, self.gather[t.name])
            raw = f"*gm_{t.name}_raw({outer}, {k})" if ring is None else \
                f"*reinterpret_cast<const {kind}*>({self._raw_slot(t, ring)})"
            at, zero = f"gm_{t.name}_vec({outer}, {k}, {raw})", f"EmVec<{t.vec}, gm_t>{{}}"
        else:
            at, zero = f"gm_{t.name}_at({outer}, {k})", "gm_t(0)"
        value = f"({ok}) ? {at} : {zero}" if ok else at
        to = self._shared_slot(t, dst) if dst else f"gm_{t.name}_reg[gm_it]"
        return self._gathered_rounds(t, [f"{to} = {value};"])

    @staticmethod
    def _tile_element(t: _Tile, kt: str) -> tuple[str, str, str]:
        """(outer index, k, the test that it is inside the matrix: "" when every one is) of a
        thread's element (gm_r, gm_c) of K tile kt."""
        origin = {"m": "gm_m0", "n": "gm_n0", "k": f"{kt} * {t.bk}"}
        row_i, col_i = f"{origin[t.row_dim]} + gm_r", f"{origin[t.col_dim]} + gm_c"
        outer, k = (row_i, col_i) if t.row_dim == t.outer else (col_i, row_i)
        ok = " && ".join(([f"{row_i} < {t.row_extent}"] if t.row_extent % t.rows else []) +
                         ([f"{col_i} < {t.col_extent}"] if t.col_extent % t.cols else []))
        return outer, k, ok

    def _raw_slot(self, t: _Tile, stage: str) -> str:
        """The address of a thread's raw vector (gm_r, gm_c) in stage `stage` of t's raw ring."""
        row, op = t.op.raw_bytes(t.cols), t.op
        col = f"gm_c * {op.read_bytes}" if op.packing == 1 else \
            f"gm_c / {op.packing} * {op.read_bytes}"
        return f"gm_{t.name}_ring + {stage} * {t.rows * row} + gm_r * {row} + {col}"

    def ring_copy(self, t: _Tile, kt: str, stage: str) -> list[str]:
        """cp.async of a thread's raw vectors of K tile kt into stage `stage` of t's raw ring
        (none outside the matrix: ring_fetch zeroes those elements)."""
        outer, k, ok = self._tile_element(t, kt)
        copy = (f"em_cp_async<{t.op.raw_bytes(t.vec)}>({self._raw_slot(t, stage)}, "
                f"gm_{t.name}_raw({outer}, {k}));")
        return self._gathered_rounds(t, [f"if ({ok}) {copy}" if ok else copy])

    def gathered_put(self, t: _Tile, dst: str) -> list[str]:
        """Store the registers gathered_fetch filled into the shared tile at dst."""
        return self._gathered_rounds(t, [f"{self._shared_slot(t, dst)} = gm_{t.name}_reg[gm_it];"])

    @staticmethod
    def _shared_slot(t: _Tile, dst: str) -> str:
        """A thread's element (a vector of them: one aligned store) of the shared tile."""
        if t.vec > 1:
            return f"*reinterpret_cast<EmVec<{t.vec}, gm_t>*>(&{dst}[gm_r * {t.ld} + gm_c])"
        return f"{dst}[gm_r * {t.ld} + gm_c]"

    @staticmethod
    def _gathered_rounds(t: _Tile, body: list[str]) -> list[str]:
        """`body` for each of a thread's elements (gm_r, gm_c) of a gathered tile."""
        if t.copies % t.threads:   # the last round of copies does not fill every thread
            body = [f"if (gm_r < {t.rows}) {{", *_indent(body), "}"]
        v = f" * {t.vec}" if t.vec > 1 else ""
        if t.threads % t.per_row == 0:   # a thread's column is the same in every round
            where = [f"const int gm_r = tid / {t.per_row} + gm_it * {t.threads // t.per_row}, "
                     f"gm_c = tid % {t.per_row}{v};"]
        else:
            where = [f"const int gm_i = tid + gm_it * {t.threads};",
                     f"const int gm_r = gm_i / {t.per_row}, gm_c = gm_i % {t.per_row}{v};"]
        return _unrolled("gm_it", t.iters, where + body)

    def copy(self, t: _Tile, kt: str, dst: str, asynchronous: bool) -> list[str]:
        """Copy K tile `kt` of operand `t` into the shared tile at `dst` (a gm_t*): each thread
        copies chunks (gm_r, gm_c..gm_c+vec) of the tile, zero-filling outside the matrix."""
        assert not t.op.gathered, "a gathered operand goes through gm_fetch / gm_put"
        n, vec, b = t.name, t.vec, t.itemsize
        origin = {"m": "gm_m0", "n": "gm_n0", "k": f"{kt} * {t.bk}"}
        row_o, col_o = origin[t.row_dim], origin[t.col_dim]
        if t.uniform:
            step = t.threads // t.per_row
            pre = [f"const gm_t* gm_{n}_src = gm_{n}_thr + (long long){kt} * "
                   f"{_ll(t.bk * t.op.stride_k)};"]
            where = [f"const int gm_r = gm_{n}_r + gm_it * {step}, gm_c = gm_{n}_c;"]
            src = f"gm_{n}_src + gm_it * {step * t.row_stride}LL"
        else:
            pre = []
            where = [f"const int gm_i = tid + gm_it * {t.threads};",
                     f"const int gm_r = gm_i / {t.per_row}, gm_c = gm_i % {t.per_row} * {vec};"]
            src = (f"gm_{n} + (long long)({row_o} + gm_r) * {_ll(t.row_stride)} + "
                   f"(long long)({col_o} + gm_c) * {_ll(t.col_stride)}")
        body = [f"const gm_t* gm_src = {src};", f"gm_t* gm_dst = {dst} + gm_r * {t.ld} + gm_c;"]
        row_ragged = t.row_extent % t.rows != 0
        col_ragged = t.col_extent % t.cols != 0
        row_ok = f"{row_o} + gm_r < {t.row_extent}"
        count = f"min(max({t.col_extent} - ({col_o} + gm_c), 0), {vec})" if col_ragged \
            else str(vec)
        checked = [f"const int gm_n = {f'({row_ok}) ? {count} : 0' if row_ragged else count};"]
        if asynchronous:
            if not row_ragged and not col_ragged:
                body.append("cp_async_16(gm_dst, gm_src);")
            else:
                body += [*checked, "// copies gm_n elements and zero-fills the rest of the 16 bytes",
                         f"cp_async_16_zfill(gm_dst, gm_n > 0 ? gm_src : gm_{n}, gm_n * {b});"]
        elif vec > 1:
            vector = "*reinterpret_cast<uint4*>(gm_dst) = *reinterpret_cast<const uint4*>(gm_src);"
            if not row_ragged and not col_ragged:
                body.append(vector)
            else:
                body += [*checked, f"if (gm_n == {vec}) {{", f"  {vector}", "} else {",
                         "  #pragma unroll",
                         f"  for (int gm_e = 0; gm_e < {vec}; ++gm_e)",
                         "    gm_dst[gm_e] = gm_e < gm_n ? gm_src[gm_e] : gm_t(0);", "}"]
        else:
            ok = " && ".join(([row_ok] if row_ragged else []) +
                             ([f"{col_o} + gm_c < {t.col_extent}"] if col_ragged else []))
            body.append(f"*gm_dst = ({ok}) ? *gm_src : gm_t(0);" if ok else "*gm_dst = *gm_src;")
        if t.copies % t.threads:   # the last round of copies does not fill every thread
            body = [f"if (gm_r < {t.rows}) {{", *_indent(body), "}"]
        return pre + _unrolled("gm_it", t.iters, where + body)

    def load_lambda(self, asynchronous: bool) -> list[str]:
        """`gm_load(kt, stage)`: copies (or starts copying) K tile kt of A and B. A gathered
        operand is loaded apart: `gm_fetch(kt)` loads all of a thread's elements into
        registers, then `gm_put(stage)` stores them (one after the other, each element's
        store would wait for its load: the stores may alias the window table). With one
        buffer the fetch precedes the barrier that frees it; with a cp.async ring it precedes
        the tile's mma, which then run while the loads are in flight. A computed operand with
        a raw ring (raw_ring) has gm_load start copying its raw vectors, and
        `gm_ring_fetch(kt, stage)` / `gm_ring_put(stage)` compute its tile from them."""
        a, b = self.plan.a, self.plan.b
        kind = "cp.async" if asynchronous else "synchronous"
        held = [t for t in (a, b) if self._held(t)]
        ringed = [t for t in (a, b) if self.plan.raw_ring(t)]
        apart = [t.label for t in held] + [f"{t.label}'s raw bytes" for t in ringed]
        out = [f"// {kind} copy of K tile `kt` of A and B into shared stage `stage`"
               f"{' (' + ', '.join(apart) + ' apart)' if apart else ''}",
               "auto gm_load = [&](int kt, int stage) {",
               f"  gm_t* gm_as = gm_smem + stage * {self.plan.stage_elems};",
               f"  gm_t* gm_bs = gm_as + {a.elems};"]
        for t, dst in ((a, "gm_as"), (b, "gm_bs")):
            if t in ringed:
                out += _indent(["{", *_indent(self.ring_copy(t, "kt", "stage")), "}"])
            elif t.op.gathered and t not in held:   # too many to hold: element by element
                out += _indent(["{", *_indent(self.gathered_fetch(t, "kt", dst)), "}"])
            elif t not in held:
                out += _indent(["{", *_indent(self.copy(t, "kt", dst, asynchronous)), "}"])
        out.append("};")
        out += [f"{'gm_t' if t.vec == 1 else f'EmVec<{t.vec}, gm_t>'} gm_{t.name}_reg[{t.iters}];"
                f"   // {t.label}'s gathered elements of the next tile" for t in held + ringed]
        for fetch, put, ts, ring in (("gm_fetch = [&](int kt)", "gm_put", held, None),
                                     ("gm_ring_fetch = [&](int kt, int stage)", "gm_ring_put",
                                      ringed, "stage")):
            if ts:
                out += [f"auto {fetch} {{",
                        *_indent([line for t in ts for line in
                                  ["{", *_indent(self.gathered_fetch(t, "kt", ring=ring)), "}"]]),
                        "};",
                        f"auto {put} = [&](int stage) {{",
                        f"  gm_t* gm_as = gm_smem + stage * {self.plan.stage_elems};",
                        f"  gm_t* gm_bs = gm_as + {a.elems};",
                        *_indent([line for t in ts for line in
                                  ["{", *_indent(self.gathered_put(t, f"gm_{t.name}s")), "}"]]),
                        "};"]
        return out

    def _held(self, t: _Tile) -> bool:
        """Operand t's tiles pass through registers (gm_fetch / gm_put): a gathered one,
        always in a cp.async ring, with one buffer when a thread's share is small enough (one
        with a raw ring through gm_ring_fetch / gm_ring_put instead)."""
        return t.op.gathered and (self.c.stages > 1 or t.held_elements <= MAX_HELD_ELEMENTS) \
            and not self.plan.raw_ring(t)

    @property
    def held(self) -> bool:
        return self._held(self.plan.a) or self._held(self.plan.b)

    def main_loop(self, compute: list[str]) -> list[str]:
        """The K loop around `compute` (which reads the stage at gm_as / gm_bs): one buffer
        for stages 1, else a cp.async ring with one barrier per K tile."""
        c, plan = self.c, self.plan
        stage_ptrs = [f"const gm_t* gm_as = gm_smem + gm_stage * {plan.stage_elems};",
                      f"const gm_t* gm_bs = gm_as + {plan.a.elems};"]
        if c.stages == 1:
            fetch, put = (["  gm_fetch(gm_kt0 + gm_i);   // in flight through the barrier"],
                          ["  gm_put(0);"]) if self.held else ([], [])
            return [*self.load_lambda(False),
                    "// one shared buffer: copy, barrier, compute, barrier",
                    "for (int gm_i = 0; gm_i < gm_nk; ++gm_i) {",
                    *fetch,
                    "  if (gm_i > 0) __syncthreads();",
                    "  gm_load(gm_kt0 + gm_i, 0);",
                    *put,
                    "  __syncthreads();",
                    "  const int gm_stage = 0;",
                    *_indent(stage_ptrs), *_indent(compute), "}"]
        s = c.stages
        put = ["  gm_put(gm_next);   // the gathered tile fetched before the compute"] \
            if self.held else []
        return [*self.load_lambda(True),
                f"// a ring of {s} stages: tiles i+1 .. i+{s - 1} are in flight while tile i is "
                "computed",
                *self.prologue(),
                f"int gm_stage = 0, gm_next = {s - 1};",
                "for (int gm_i = 0; gm_i < gm_nk; ++gm_i) {",
                f"  cp_async_wait<{s - 2}>();  // tile gm_i has landed (this thread's copies)",
                "  __syncthreads();             // everyone's copies landed; stage gm_next is free",
                f"  if (gm_i + {s - 1} < gm_nk) gm_load(gm_kt0 + gm_i + {s - 1}, gm_next);",
                "  cp_async_commit();",
                *self.fetch(),
                *_indent(["{", *_indent(stage_ptrs), *_indent(compute), "}"]),
                *put,
                f"  gm_stage = gm_stage == {s - 1} ? 0 : gm_stage + 1;",
                f"  gm_next = gm_next == {s - 1} ? 0 : gm_next + 1;",
                "}"]

    def fetch(self) -> list[str]:
        """At the top of K step gm_i: the gathered elements of tile gm_i + stages - 1 (past
        the end, the last tile again: no branch around the loads, and stage gm_next, which
        gm_put then fills, is read by no later step)."""
        if not self.held:
            return []
        return [f"  gm_fetch(gm_kt0 + min(gm_i + {self.c.stages - 1}, gm_nk - 1));"]

    def prologue(self) -> list[str]:
        """The ring's first `stages - 1` tiles (a gathered operand's stored at once)."""
        s = self.c.stages
        put = " gm_fetch(gm_kt0 + gm_s); gm_put(gm_s);" if self.held else ""
        return [f"for (int gm_s = 0; gm_s < {s - 1}; ++gm_s) {{",
                f"  if (gm_s < gm_nk) {{ gm_load(gm_kt0 + gm_s, gm_s);{put} }}",
                "  cp_async_commit();",
                "}"]

    def store(self, row: str, col: str, acc: str) -> list[str]:
        """One output element: the epilogue (or the partial sum) inside the bounds."""
        p, c = self.p, self.c
        if c.partial_sums:
            stmts = [f"{PARTIAL}[((gm_split * {p.batch}LL + bz) * {p.m} + {row}) * {p.n}LL + "
                     f"{col}] = {acc};"]
        else:
            stmts = list(self.epilogue("bz", row, col, acc))
        conds = ([f"{row} < {p.m}"] if p.m % c.bm else []) + \
                ([f"{col} < {p.n}"] if p.n % c.bn else [])
        if not conds:
            return stmts
        return [f"if ({' && '.join(conds)}) {{", *_indent(stmts), "}"]

    @property
    def k_step(self) -> int:
        return TF32_K if self.c.inst == "tf32" else MMA_K

    def tf32_fragments(self) -> tuple[list[str], Callable[[str, str, str], list[str]]]:
        """The lane's fragment offsets, and the loads of the m16n8k8 tf32 fragments, rounded
        to tf32. The mma sums over its 8 k in any order, so A and B agree on a permutation of
        each k step that makes a lane's two k adjacent: logical k t and t + 4 (a0/a2, a1/a3,
        b0/b1 of lane 4g + t) sit at k 2t and 2t + 1 of the tile. A k-major tile then gives
        both in one 8-byte load, an outer-major tile one 4-byte load each."""
        plan = self.plan
        a, b = plan.a, plan.b
        mi, nj = plan.wtm // 16, plan.wtn // 8
        out = ["// m16n8k8 tf32 fragments of lane 4g + t: its k t and t + 4 are read at k 2t, "
               "2t + 1",
               "const int gm_lg = gm_lane / 4, gm_lt2 = gm_lane % 4 * 2;"]
        if a.k_major:
            out.append(f"const int gm_a_frag = (gm_wm0 + gm_lg) * {a.ld} + gm_lt2;")
            a_i, a_k = 16 * a.ld, TF32_K
        else:
            out.append(f"const int gm_a_frag = gm_lt2 * {a.ld} + gm_wm0 + gm_lg;")
            a_i, a_k = 16, TF32_K * a.ld
        if b.k_major:
            out.append(f"const int gm_b_frag = (gm_wn0 + gm_lg) * {b.ld} + gm_lt2;")
            b_j, b_k = 8 * b.ld, TF32_K
        else:
            out.append(f"const int gm_b_frag = gm_lt2 * {b.ld} + gm_wn0 + gm_lg;")
            b_j, b_k = 8, TF32_K * b.ld

        def fragments(af: str, bf: str, ks: str) -> list[str]:
            a_at = f"gm_as + gm_a_frag + gm_i * {a_i} + {ks} * {a_k}"
            b_at = f"gm_bs + gm_b_frag + gm_j * {b_j} + {ks} * {b_k}"
            if a.k_major:    # rows g and g + 8 (a0, a2 and a1, a3), two k each
                a_loads = ["float gm_x[4];",
                           f"em_vload({a_at}, gm_x[0], gm_x[2]);",
                           f"em_vload({a_at} + {8 * a.ld}, gm_x[1], gm_x[3]);",
                           *[f"{af}[gm_i][{r}] = to_tf32(gm_x[{r}]);" for r in range(4)]]
            else:            # a_r at row g + 8(r%2), k 2t + r/2
                a_loads = [f"{af}[gm_i][{r}] = to_tf32(*({a_at} + {8 * (r % 2) + (r // 2) * a.ld}"
                           "));" for r in range(4)]
            if b.k_major:
                b_loads = ["float gm_y[2];", f"em_vload({b_at}, gm_y[0], gm_y[1]);",
                           *[f"{bf}[gm_j][{r}] = to_tf32(gm_y[{r}]);" for r in range(2)]]
            else:            # b_r at k 2t + r
                b_loads = [f"{bf}[gm_j][{r}] = to_tf32(*({b_at} + {r * b.ld}));"
                           for r in range(2)]
            return [*_unrolled("gm_i", mi, a_loads), *_unrolled("gm_j", nj, b_loads)]

        return out, fragments

    def mma(self) -> list[str]:
        """Warp tiles of m16n8k16 atoms (fragments by ldmatrix) or of m16n8k8 tf32 atoms
        (fragments by plain shared loads), then the epilogue."""
        c, plan = self.c, self.plan
        mi, nj = plan.wtm // 16, plan.wtn // 8
        out = ["const int gm_lane = tid % 32, gm_warp = tid / 32;",
               f"const int gm_wm0 = gm_warp / {c.wn} * {plan.wtm}, gm_wn0 = gm_warp % {c.wn} * "
               f"{plan.wtn};"]
        if c.inst == "tf32":
            setup, fragments = self.tf32_fragments()
            out += setup
            fn = "mma_m16n8k8_tf32"
        else:
            setup, fragments = self.ldmatrix_fragments()
            out += setup
            fn = MMA_FN[self.p.a.ctype]
        out.append(f"float gm_acc[{mi}][{nj}][4] = {{}};  // (16 x 8 atom i, j), c0..c3")
        mmas = _unrolled("gm_i", mi, _unrolled("gm_j", nj, [
            f"{fn}(gm_acc[gm_i][gm_j], gm_af[gm_i], gm_bf[gm_j], gm_acc[gm_i][gm_j]);"]))
        if c.stages == 1:
            compute = _unrolled("gm_ks", c.bk // self.k_step, [
                f"unsigned gm_af[{mi}][4], gm_bf[{nj}][2];",
                *fragments("gm_af", "gm_bf", "gm_ks"), *mmas])
            out += self.main_loop(compute)
        else:
            out += self.mma_pipelined(fragments, mmas, mi, nj)
        out += ["// accumulator c_r of atom (i, j): row 16i + lane/4 + 8(r/2), column 8j + "
                "2(lane%4) + r%2",
                "const int gm_row0 = gm_m0 + gm_wm0 + gm_lane / 4;",
                "const int gm_col0 = gm_n0 + gm_wn0 + 2 * (gm_lane % 4);"]
        pair = None if c.partial_sums else self.epilogue
        return out + fragment_stores(self.p, c, self.store, pair, "gm_acc", mi, nj)

    def ldmatrix_fragments(self) -> tuple[list[str], Callable[[str, str, str], list[str]]]:
        """The lane's ldmatrix addresses, and the ldmatrix loads of the m16n8k16 fragments."""
        plan = self.plan
        a, b = plan.a, plan.b
        mi, nj = plan.wtm // 16, plan.wtn // 8
        a_trans, b_trans = not a.k_major, not b.k_major
        out = ["// ldmatrix: lane 8j+r addresses row r of 8x8 matrix j",
               "const int gm_mat = gm_lane / 8, gm_mrow = gm_lane % 8;"]
        # A's matrices j = 0..3: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15)
        if a.k_major:
            out.append(f"const int gm_a_frag = (gm_wm0 + 8 * (gm_mat % 2) + gm_mrow) * {a.ld} + "
                       "8 * (gm_mat / 2);")
            a_i, a_k = 16 * a.ld, 16
        else:
            out.append(f"const int gm_a_frag = (8 * (gm_mat / 2) + gm_mrow) * {a.ld} + gm_wm0 + "
                       "8 * (gm_mat % 2);")
            a_i, a_k = 16, 16 * a.ld
        # B's matrices j = 0..3: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
        if b.k_major:
            out.append(f"const int gm_b_frag = (gm_wn0 + 8 * (gm_mat / 2) + gm_mrow) * {b.ld} + "
                       "8 * (gm_mat % 2);")
            b_j, b_k = 16 * b.ld, 16
        else:
            out.append(f"const int gm_b_frag = (8 * (gm_mat % 2) + gm_mrow) * {b.ld} + gm_wn0 + "
                       "8 * (gm_mat / 2);")
            b_j, b_k = 16, 16 * b.ld
        tr_a, tr_b = "_trans" if a_trans else "", "_trans" if b_trans else ""

        def fragments(af: str, bf: str, ks: str) -> list[str]:
            """ldmatrix the A and B fragments of k step `ks` of the stage at gm_as / gm_bs."""
            pairs = _unrolled("gm_j", nj // 2, [
                "unsigned gm_r4[4];",
                f"ldmatrix_x4{tr_b}(gm_r4, gm_bs + gm_b_frag + gm_j * {b_j} + {ks} * {b_k});",
                f"{bf}[2 * gm_j][0] = gm_r4[0];", f"{bf}[2 * gm_j][1] = gm_r4[1];",
                f"{bf}[2 * gm_j + 1][0] = gm_r4[2];", f"{bf}[2 * gm_j + 1][1] = gm_r4[3];"]) \
                if nj >= 2 else []
            odd = [f"ldmatrix_x2{tr_b}({bf}[{nj - 1}], gm_bs + gm_b_frag + {nj // 2 * b_j} + "
                   f"{ks} * {b_k});"] if nj % 2 else []
            return [*_unrolled("gm_i", mi, [f"ldmatrix_x4{tr_a}({af}[gm_i], gm_as + gm_a_frag + "
                                            f"gm_i * {a_i} + {ks} * {a_k});"]), *pairs, *odd]

        return out, fragments

    def mma_pipelined(self, fragments: Callable[[str, str, str], list[str]], mmas: list[str],
                      mi: int, nj: int) -> list[str]:
        """The cp.async ring with fragments one k step ahead: the next tile's first
        fragments are read before the current tile's last mma."""
        c, plan = self.c, self.plan
        s, ks_n = c.stages, c.bk // self.k_step
        copy_next = _unrolled("gm_i", mi, _unrolled("gm_e", 4, [
            "gm_af[gm_i][gm_e] = gm_an[gm_i][gm_e];"])) + \
            _unrolled("gm_j", nj, _unrolled("gm_e", 2, ["gm_bf[gm_j][gm_e] = gm_bn[gm_j][gm_e];"]))
        put = ["  gm_put(gm_next);   // the gathered tile fetched at the top"] \
            if self.held else []
        ring = any(plan.raw_ring(t) for t in (plan.a, plan.b))
        # with a raw ring, tile i + 1 is computed from its raw bytes during step i: the wait
        # leaves one tile fewer in flight, so that those of tile i + 2 have landed by then
        wait = s - 3 if ring else s - 2
        first, ahead = [], []
        if ring:
            first = ["if (gm_nk > 0) {   // tile 0 computed from its raw bytes",
                     "  gm_ring_fetch(gm_kt0, 0);",
                     "  gm_ring_put(0);",
                     "}",
                     "__syncthreads();"]
            # past the end, a stale raw stage into a stage no later step reads (no branch)
            ahead = [f"const int gm_after = gm_stage == {s - 1} ? 0 : gm_stage + 1;",
                     "gm_ring_fetch(gm_kt0 + min(gm_i + 1, gm_nk - 1), gm_after);"]
            put += ["  gm_ring_put(gm_after);   // tile gm_i + 1, read after the barrier"]
        return [*self.load_lambda(True),
                *self.prologue(),
                f"cp_async_wait<{wait}>();",
                "__syncthreads();",
                *first,
                f"int gm_stage = 0, gm_next = {s - 1};",
                "const gm_t* gm_as = gm_smem;",
                f"const gm_t* gm_bs = gm_smem + {plan.a.elems};",
                f"unsigned gm_af[{mi}][4], gm_bf[{nj}][2], gm_an[{mi}][4], gm_bn[{nj}][2];",
                *fragments("gm_af", "gm_bf", "0"),
                "for (int gm_i = 0; gm_i < gm_nk; ++gm_i) {",
                f"  if (gm_i + {s - 1} < gm_nk) gm_load(gm_kt0 + gm_i + {s - 1}, gm_next);",
                "  cp_async_commit();",
                *self.fetch(),
                *_indent(ahead),
                *_indent(_unrolled("gm_ks", ks_n, [
                    f"if (gm_ks == {ks_n - 1}) {{",
                    *put,
                    f"  cp_async_wait<{wait}>();",
                    "  __syncthreads();",
                    f"  gm_stage = gm_stage == {s - 1} ? 0 : gm_stage + 1;",
                    f"  gm_next = gm_next == {s - 1} ? 0 : gm_next + 1;",
                    f"  gm_as = gm_smem + gm_stage * {plan.stage_elems};",
                    f"  gm_bs = gm_as + {plan.a.elems};",
                    "}",
                    *fragments("gm_an", "gm_bn", f"((gm_ks + 1) % {ks_n})"),
                    *mmas, *copy_next])),
                "}"]

    def simt(self) -> list[str]:
        """Per-thread micro-tiles of FFMA over 16-byte fragment reads, then the epilogue."""
        c, plan = self.c, self.plan
        a, b, ln = plan.a, plan.b, plan.lanes
        assert ln is not None
        tm, tn, vm, vn = ln.tm, ln.tn, ln.vm, ln.vn
        sm, sn = ln.lm * vm, ln.ln * vn     # distance between a thread's row (column) vectors
        out = ["const int gm_lane = tid % 32, gm_warp = tid / 32;",
               f"// lanes {ln.lm} x {ln.ln}; micro-tile {tm} x {tn}: vectors of {vm} rows "
               f"{sm} apart, of {vn} columns {sn} apart",
               f"const int gm_am = gm_warp / {c.wn} * {plan.wtm} + gm_lane / {ln.ln} * {vm};",
               f"const int gm_bn = gm_warp % {c.wn} * {plan.wtn} + gm_lane % {ln.ln} * {vn};",
               f"float gm_acc[{tm}][{tn}] = {{}};"]

        def frag(t: _Tile, arr: str, base: str, count: int, v: int, stride: int) -> list[str]:
            """Fill arr[q][e] with 4 k steps of this thread's `count` rows (columns) of t."""
            if not t.k_major:   # shared [k][outer]: vectors along the outer dimension
                outs = ", ".join(f"{arr}[gm_q][gm_g * {v} + {e}]" for e in range(v))
                return _unrolled("gm_q", SIMT_K_STEP, _unrolled("gm_g", count // v, [
                    f"em_vload(gm_{t.name}s + (gm_kk + gm_q) * {t.ld} + {base} + gm_g * {stride}, "
                    f"{outs});"]))
            outs = ", ".join(f"{arr}[{q}][gm_e]" for q in range(SIMT_K_STEP))
            return _unrolled("gm_e", count, [        # shared [outer][k]: vectors along k
                f"em_vload(gm_{t.name}s + ({base} + gm_e / {v} * {stride} + gm_e % {v}) * {t.ld}"
                f" + gm_kk, {outs});"])

        compute = ["#pragma unroll",
                   f"for (int gm_kk = 0; gm_kk < {c.bk}; gm_kk += {SIMT_K_STEP}) {{",
                   f"  float gm_af[{SIMT_K_STEP}][{tm}], gm_bf[{SIMT_K_STEP}][{tn}];",
                   *_indent(frag(a, "gm_af", "gm_am", tm, vm, sm)),
                   *_indent(frag(b, "gm_bf", "gm_bn", tn, vn, sn)),
                   *_indent(_unrolled("gm_q", SIMT_K_STEP, _unrolled("gm_i", tm, _unrolled(
                       "gm_j", tn, ["gm_acc[gm_i][gm_j] = fmaf(gm_af[gm_q][gm_i], "
                                    "gm_bf[gm_q][gm_j], gm_acc[gm_i][gm_j]);"])))),
                   "}"]
        out += self.main_loop(compute)
        out += _unrolled("gm_i", tm, _unrolled("gm_j", tn, [
            f"const int gm_row = gm_m0 + gm_am + gm_i / {vm} * {sm} + gm_i % {vm};",
            f"const int gm_col = gm_n0 + gm_bn + gm_j / {vn} * {sn} + gm_j % {vn};",
            *self.store("gm_row", "gm_col", "gm_acc[gm_i][gm_j]")]))
        return out

    def lines(self) -> list[str]:
        """The whole body: a summary comment, the decode, the copies' setup, the product."""
        p, c, plan = self.p, self.c, self.plan
        a, b = plan.a, plan.b
        lay = {True: "k-major", False: "outer-major"}
        head = [f"// emmy gemm ({c.inst}): C[{p.batch}] ({p.m} x {p.n}) = A ({p.m} x {p.k}, "
                f"{p.a.ctype}) @ B ({p.k} x {p.n}); block {c.bm}x{c.bn}x{c.bk}, warps "
                f"{c.wm}x{c.wn}, {c.stages} stage(s), split {c.split}"
                f"{' ' + c.split_mode if c.split > 1 else ''}, group {c.group}",
                f"// shared A {lay[a.k_major]} (+{a.pad} pad), B {lay[b.k_major]} (+{b.pad} pad)",
                f"using gm_t = {STORAGE[p.a.ctype]};   // element bits in global and shared "
                "memory",
                "gm_t* gm_smem = reinterpret_cast<gm_t*>(emmy_smem);"]
        head += self.decode() + self.copy_setup(a) + self.copy_setup(b)
        body = self.mma() if c.inst in TENSOR_CORE else self.simt()
        return head + body + (self.last_block() if c.split_mode == "last" else [])

    def last_block(self) -> list[str]:
        """split_mode "last": once a block has stored its partial sums, it takes a ticket for
        its tile; the block taking the last one adds the tile's `split` partials in split order
        (the same sum whichever block finishes last: deterministic) and runs the epilogue, so no
        second kernel is launched. The fences order each block's partial stores before its
        ticket, and the last block's reads after the tickets; it reads through L2 (__ldcg) and
        leaves its tile's ticket at zero for the next launch."""
        p, c, plan = self.p, self.c, self.plan
        cells, s = c.bm * c.bn, c.split
        conds = ([f"gm_row < {p.m}"] if p.m % c.bm else []) + \
            ([f"gm_col < {p.n}"] if p.n % c.bn else [])
        total = f"gm_sum += __ldcg({PARTIAL} + ((gm_s * {p.batch}LL + bz) * {p.m} + gm_row) * " \
            f"{p.n}LL + gm_col);"
        element = ["float gm_sum = 0.0f;",
                   "#pragma unroll", f"for (int gm_s = 0; gm_s < {s}; ++gm_s) {total}",
                   *self.epilogue("bz", "gm_row", "gm_col", "gm_sum")]
        if conds:
            element = [f"if ({' && '.join(conds)}) {{", *_indent(element), "}"]
        element.insert(0, f"const int gm_row = gm_m0 + gm_e / {c.bn}, gm_col = gm_n0 + gm_e % "
                          f"{c.bn};")
        return [f"// split {s}, last block: the tile's partials summed by its last block",
                f"const long long gm_slot = bz * {plan.tiles} + gm_tile;",
                *last_block_lines(TICKETS, "gm_slot", s),
                f"for (int gm_e = tid; gm_e < {cells}; gm_e += {c.threads}) {{",
                *_indent(element), "}"]


def fragment_stores(p, c, store: Callable[[str, str, str], list[str]], epilogue: Epilogue | None,
                    acc: str, mi: int, nj: int) -> list[str]:
    """The epilogue over a warp's m16n8 accumulators acc[i][j][r] (row gm_row0 + 16i + 8(r/2),
    column gm_col0 + 8j + r%2): `store(row, col, value)` per element, or, where `epilogue`
    has a pair form (gemm_spec.pair_of) and n is even, one pair of neighbouring columns per
    (i, j, r/2) inside the bounds of p's m x n (tile c.bm x c.bn)."""
    pair = pair_of(epilogue) if epilogue is not None and p.n % 2 == 0 else None
    two = pair("bz", "gm_row", "gm_col", f"{acc}[gm_i][gm_j][2 * gm_h]",
               f"{acc}[gm_i][gm_j][2 * gm_h + 1]") if pair is not None else None
    if two is None:
        return _unrolled("gm_i", mi, _unrolled("gm_j", nj, _unrolled("gm_q", 4, [
            "const int gm_row = gm_row0 + 16 * gm_i + 8 * (gm_q / 2);",
            "const int gm_col = gm_col0 + 8 * gm_j + gm_q % 2;",
            *store("gm_row", "gm_col", f"{acc}[gm_i][gm_j][gm_q]")])))
    conds = (["gm_row < " + str(p.m)] if p.m % c.bm else []) + \
            (["gm_col < " + str(p.n)] if p.n % c.bn else [])
    if conds:
        two = [f"if ({' && '.join(conds)}) {{", *_indent(two), "}"]
    return _unrolled("gm_i", mi, _unrolled("gm_j", nj, _unrolled("gm_h", 2, [
        "const int gm_row = gm_row0 + 16 * gm_i + 8 * gm_h;",
        "const int gm_col = gm_col0 + 8 * gm_j;", *two])))


def gemm_body(problem: GemmProblem, config: GemmConfig, epilogue: Epilogue,
              gather: dict[str, Gather | WindowGather] | None = None) -> Body:
    """The body of the kernel computing C = A @ B tile by tile and calling `epilogue` on each
    element (split_mode "combine": writing f32 partial sums to `emmy_partial` instead);
    `gather` has the element functions of the gathered operands ("a", "b").
    Raises ValueError for a configuration _shape_problems refuses."""
    problems = _shape_problems(problem, config)
    if problems:
        raise ValueError("cannot build this gemm: " + "; ".join(problems))
    plan = _Plan(problem, config)
    lines = _Emitter(problem, config, epilogue, gather).lines()
    return Body(tuple(lines), plan.grid, config.threads, plan.smem_bytes)


def combine_body(problem: GemmProblem, config: GemmConfig, epilogue: Epilogue) -> Body:
    """split_mode "combine": the kernel that sums the `split` partial products of
    `emmy_partial` ([split][batch][m][n] f32) and calls `epilogue` once per element; each
    thread handles 4 consecutive columns (float4 loads) when n % 4 == 0, else one element."""
    p, s = problem, config.split
    total = p.batch * p.m * p.n
    v = 4 if p.n % 4 == 0 else 1
    threads = min(COMBINE_THREADS, max(32, _ceil_div(_ceil_div(total, v), 32) * 32))
    grid = _ceil_div(_ceil_div(total, v), threads)
    outs = ", ".join(f"gm_part[{e}]" for e in range(v))
    lines = [f"// emmy gemm combine: C[{p.batch}] ({p.m} x {p.n}) = the sum of {s} partial "
             f"products, {v} element(s) per thread",
             f"const long long gm_e = (bid * {threads} + tid) * {v}LL;",
             f"if (gm_e >= {total}LL) return;",
             f"const long long bz = gm_e / {p.m * p.n}LL;",
             f"const int gm_rem = (int)(gm_e % {p.m * p.n}LL);",
             f"const int gm_row = gm_rem / {p.n}, gm_col = gm_rem % {p.n};",
             f"float gm_sum[{v}] = {{}};",
             *_unrolled("gm_s", s, [
                 f"float gm_part[{v}];",
                 f"em_vload({PARTIAL} + gm_s * {total}LL + gm_e, {outs});",
                 *_unrolled("gm_v", v, ["gm_sum[gm_v] += gm_part[gm_v];"])]),
             *_unrolled("gm_v", v, ["const int gm_c = gm_col + gm_v;",
                                    *epilogue("bz", "gm_row", "gm_c", "gm_sum[gm_v]")])]
    return Body(tuple(lines), grid, threads, 0)
