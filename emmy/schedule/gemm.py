"""The decision points of a contraction (a matrix product with a fused epilogue).

    WORK    warps:WMxWN            WM x WN warps per block, each owning a (BM/WM) x (BN/WN) tile
    TILE    mma:BMxBNxBK           block tile on tensor cores: mma.sync m16n8k16, f16/bf16 -> f32
            simt:BMxBNxBK          block tile on CUDA cores: f32 FFMA, register micro-tiles
            wgmma:BMxBNxBK         block tile on Hopper's warpgroup mma (sm_90a)
    REDUCE  serial | split:S:atomic | split:S:combine | split:S:last
                                                        S blocks share one tile's K range
    STAGE   smem | async:N | tma:N  synchronous copies into one shared buffer, a cp.async ring of
            tma:N:cluster:CMxCN    N stages, or TMA copies completing on mbarriers (wgmma only),
            tma:N[...]:store       optionally shared by a thread-block cluster of 2x1 tiles (B's
                                   tile copied once for both, multicast) or 1x2 (A's), and with
                                   :store the output tile staged in shared memory and stored by
                                   TMA (an epilogue that stores one 16-bit output); a
                                   gathered operand (an implicit GEMM's) goes through registers
                                   one K tile ahead in an async:N ring; a computed one's raw
                                   bytes (whole aligned vectors) have their own cp.async ring
                                   at async:3 and async:4, N - 2 K tiles ahead (on wgmma tiles
                                   at any async:N, as far ahead as the other operand's)
    RASTER  row | group:G          tile launch order: row-major, or G tile rows at a time (L2 reuse)
    PLACE   fuse | cut             only for a product with a computed operand (an int8 weight
                                   dequantized): the template computes its elements as it copies
                                   them, or (cut) a map kernel stores it and the product reads it,
                                   each of the two then scheduled by its own row; decided first,
                                   and with cut this kernel's other decisions are unused

Each rule below refuses one thing with its reason; the last one asks the template itself
(emmy.cuda.gemm / gemm_sm90), so whatever the space lists, the template builds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from emmy.cuda.gemm_spec import ELEMENT_BYTES, GemmConfig, GemmOperand, GemmProblem
from emmy.dtypes import DType
from emmy.memo import ByIdentity
from emmy.schedule.decisions import Reduce, read_reduce
from emmy.schedule.rules import Rule
from emmy.schedule.targets import Target
from emmy.symbolic import FloorDiv, Sym, floordiv, lin, mod, render, var

KIB = 1024
_WARPS = ("1x1", "1x2", "2x1", "2x2", "1x4", "4x1", "2x4", "4x2", "4x4")
_MMA = tuple(f"mma:{m}x{n}x{k}" for m in (32, 64, 128, 256) for n in (32, 64, 128, 256)
             for k in (16, 32, 64))
_SIMT = tuple(f"simt:{m}x{n}x{k}" for m in (32, 64, 128) for n in (32, 64, 128) for k in (8, 16, 32))
_WGMMA = tuple(f"wgmma:{m}x{n}x64" for m in (64, 128) for n in (64, 128, 256))
_TF32 = tuple(f"tf32:{m}x{n}x{k}" for m in (32, 64, 128, 256) for n in (32, 64, 128, 256)
              for k in (16, 32))

GRAMMAR: dict[str, tuple[str, ...]] = {
    "WORK": tuple(f"warps:{w}" for w in _WARPS),
    "TILE": _MMA + _SIMT + _WGMMA + _TF32,
    "REDUCE": ("serial", *(f"split:{s}:{how}" for s in (2, 4, 8, 16)
                           for how in ("atomic", "combine", "last"))),
    "STAGE": ("smem", "async:2", "async:3", "async:4", "tma:3", "tma:4",
              *(f"tma:{n}:cluster:{c}" for n in (3, 4) for c in ("2x1", "1x2")),
              *(f"tma:{n}{c}:store" for n in (3, 4) for c in ("", ":cluster:2x1", ":cluster:1x2"))),
    "RASTER": ("row", "group:4", "group:8"),
    "PLACE": ("fuse", "cut"),
}
GRAMMAR_TEXT = {
    "WORK": "warps:WMxWN  (warps along M and N: " + " ".join(_WARPS) + ")",
    "TILE": "mma:BMxBNxBK | simt:BMxBNxBK | wgmma:BMxBNx64 | tf32:BMxBNxBK  (block tile; mma "
            "BM,BN in 32..256, BK 16|32|64; simt BM,BN in 32..128, BK 8|16|32; wgmma BM 64|128, "
            "BN 64|128|256; tf32 (f32 operands on tensor cores, only where the workload allows "
            "tf32) BM,BN in 32..256, BK 16|32)",
    "REDUCE": "serial | split:S:atomic | split:S:combine | split:S:last  (S in 2,4,8,16; "
              "combine: a second kernel sums the S partial products; last: the last of a "
              "tile's S blocks to finish sums them, in split order, and runs the epilogue)",
    "STAGE": "smem | async:N (N = 2,3,4 cp.async stages) | tma:N (N = 3,4; wgmma only) | "
             "tma:N:cluster:2x1 | tma:N:cluster:1x2 (clusters of two blocks on neighbouring "
             "tiles along m / n; each copies half of the operand tile they share, B / A, "
             "into both: TMA multicast), each optionally ending :store (the output tile "
             "staged in shared memory and stored by TMA; an epilogue storing one 16-bit "
             "row-major output)",
    "RASTER": "row | group:G  (G = 4, 8 tile rows per group)",
    "PLACE": "fuse | cut  (a computed operand: made as the tiles are copied, or stored by a "
             "kernel of its own, the two then with their own rows)",
}
# Measured on an H200 at 4096^3 (f16): wgmma 128x256x64 with 4 cp.async stages reached about
# 595 TFLOP/s (its TMA form about 610, before the TMA form became persistent with setmaxnreg),
# mma.sync 128x256x64 on 2x4 warps with 3 stages about 390; the rest are fallbacks for smaller
# problems and older targets (no wgmma or TMA before sm_90a). The output tile stored by TMA
# (tma:4:store, where the epilogue stores one 16-bit output) took 4096^3 from 200.8 to 184.6 us
# (cuBLAS 181.0) and a 16 x 1024^3 bmm from 70.9 to 52.8 (2026-12-04, `emmy bench --suite
# matmul`); clusters of 2x1 on top of it gain under 1%.
PREFERRED = {
    "WORK": ("warps:2x4", "warps:2x2", "warps:1x1"),
    "TILE": ("wgmma:128x256x64", "mma:128x256x64", "tf32:128x128x32", "mma:128x128x32",
             "mma:64x64x32", "tf32:64x64x16",
             "simt:128x128x16", "simt:64x64x16", "simt:32x32x8", "mma:32x32x16"),
    "REDUCE": ("serial",),
    "STAGE": ("tma:4:store", "tma:4", "tma:4:cluster:2x1", "async:4", "async:3", "async:2",
              "smem"),
    "RASTER": ("group:8", "group:4", "row"),
    "PLACE": ("fuse", "cut"),
}
# with PLACE=cut the kernel's other decisions are unused: each reads this value
CUT_ROW = {"WORK": "warps:1x1", "TILE": "mma:32x32x16", "REDUCE": "serial", "STAGE": "smem",
           "RASTER": "row"}


def prefer(key: str, order: tuple[str, ...], c: "GemmCtx") -> tuple[str, ...]:
    """The default's TILE order for this product: the tiles that cover no more than the
    output's next power of two along m and n first (a 128-row tile over 64 rows computes
    half padding), each group in PREFERRED's order. With a computed operand (a dequantized
    weight), tiles whose share of it a thread can hold in registers come first in each
    group: only they take a cp.async ring (STAGE=async:N), without which every K step waits
    for its weight tile (wgmma tiles hold none: they compute it straight into a stage)."""
    if key != "TILE":
        return order
    m, n = _ceil_pow2(c.problem.m), _ceil_pow2(c.problem.n)
    threads = 32 * c.work[0] * c.work[1] if c.work else 0

    def held_too_many(t: GemmTile) -> bool:
        from emmy.cuda.gemm import MAX_HELD_ELEMENTS

        return threads > 0 and t.inst != "wgmma" and any(
            op.computed and outer * t.bk > MAX_HELD_ELEMENTS * threads
            for op, outer in ((c.problem.a, t.bm), (c.problem.b, t.bn)))

    return tuple(sorted(order, key=lambda v: (not (read_tile(v).bm <= m and read_tile(v).bn <= n),
                                              held_too_many(read_tile(v)))))


@dataclass(frozen=True, slots=True)
class GemmTile:
    inst: str
    bm: int
    bn: int
    bk: int


@dataclass(frozen=True, slots=True)
class GemmStage:
    kind: str        # smem | async | tma
    stages: int
    cluster: tuple[int, int] = (1, 1)   # tma only: tiles per cluster along m and n
    store: bool = False                 # tma only: the output tile stored by TMA


def read_work(value: str) -> tuple[int, int]:
    wm, wn = value.split(":")[1].split("x")
    return int(wm), int(wn)


def read_tile(value: str) -> GemmTile:
    m = re.fullmatch(r"(mma|simt|wgmma|tf32):(\d+)x(\d+)x(\d+)", value)
    assert m, value
    return GemmTile(m[1], int(m[2]), int(m[3]), int(m[4]))


def read_stage(value: str) -> GemmStage:
    if value == "smem":
        return GemmStage("smem", 1)
    kind, n, *rest = value.split(":")
    store = rest[-1:] == ["store"]
    if store:
        rest = rest[:-1]
    if rest:                                 # tma:N:cluster:CMxCN
        cm, cn = rest[1].split("x")
        return GemmStage(kind, int(n), (int(cm), int(cn)), store)
    return GemmStage(kind, int(n), store=store)


def read_raster(value: str) -> int:
    return 1 if value == "row" else int(value.split(":")[1])


READ = {"WORK": read_work, "TILE": read_tile, "REDUCE": read_reduce, "STAGE": read_stage,
        "RASTER": read_raster, "PLACE": lambda v: v == "cut"}
FIELD = {"WORK": "work", "TILE": "tile", "REDUCE": "reduce", "STAGE": "stage", "RASTER": "raster",
         "PLACE": "cut"}
KEYS = ("WORK", "TILE", "REDUCE", "STAGE", "RASTER")


def keys_of(kernel) -> tuple[str, ...]:
    """The kernel's decision points, in the order they are made: PLACE first where it splits
    the kernel in two (a computed operand, emmy.tile_ir.cut)."""
    from emmy.tile_ir.cut import splits

    return ("PLACE", *KEYS) if splits(kernel) else KEYS


@dataclass(frozen=True)
class GemmCtx:
    kernel: str
    problem: GemmProblem
    plain_store: bool          # the epilogue stores the accumulator as it is (split:atomic)
    out_f32: bool
    target: Target
    allow_tf32: bool = False   # the workload lets its f32 products round operands to tf32
    tile_kernel: object = field(default=None, compare=False, repr=False)  # for stage.store
    work: tuple[int, int] | None = None
    tile: GemmTile | None = None
    reduce: Reduce | None = None
    stage: GemmStage | None = None
    raster: int | None = None
    cut: bool = False          # PLACE=cut: two kernels, this one's other decisions unused


def config_of(c: GemmCtx) -> GemmConfig:
    """The template configuration of a complete context."""
    wm, wn = c.work
    r = c.reduce
    return GemmConfig(inst=c.tile.inst, bm=c.tile.bm, bn=c.tile.bn, bk=c.tile.bk, wm=wm, wn=wn,
                      stages=c.stage.stages, split=r.split if r.method == "split" else 1,
                      split_mode=r.combine if r.method == "split" else "",
                      group=c.raster, tma=c.stage.kind == "tma",
                      cluster_m=c.stage.cluster[0], cluster_n=c.stage.cluster[1],
                      tma_store=c.stage.store)


# --- problem ----------------------------------------------------------------------------------

def problem_of(con) -> GemmProblem:
    """The template's view of a Contraction (emmy.tile_ir.contract): sizes and operand layouts.
    The batch axes flatten into one index `bz` (outermost first)."""
    def operand(op) -> GemmOperand:
        if op.gathered:     # strides that lay its tiles out the nearer way in memory
            extent = (con.m if op is con.a else con.n).extent
            vector = vector_width(con, op)
            return GemmOperand(buffer=op.buffer, ctype=op.dtype.c_name,
                               stride_outer=con.k.extent if op.k_major else 1,
                               stride_k=1 if op.k_major else extent, batch_offset="0",
                               gathered=True, windowed=op.window is not None,
                               computed=op.computed, read_bytes=op.load.dtype.itemsize,
                               vector=vector, paired=vector % 4 == 0 and op.paired,
                               packing=op.packing)
        strides = {a.name: c for a, c in op.offset.terms}
        bounds = {"bz": max(con.batch_size, 1)}
        off, rest = lin(op.offset.const), con.batch_size
        for ax in con.batch:
            rest //= ax.extent
            off = off + mod(floordiv(var("bz"), rest, bounds), ax.extent, bounds) * strides.get(ax.var, 0)
        coefs = [strides.get(ax.var, 0) for ax in con.batch]
        inner = coefs[-1] if coefs else 0
        flat = all(c == inner * _after(con.batch, i) for i, c in enumerate(coefs))
        if flat and op.offset.const == 0:       # the common cases, spelled plainly
            text = f"bz * {inner}LL" if inner else "0"
        else:
            text = f"(long long)({render(off)})"
        return GemmOperand(buffer=op.buffer, ctype=op.dtype.c_name,
                           stride_outer=strides.get(op.outer, 0), stride_k=strides[con.k.var],
                           batch_offset=text, batch_stride=inner if flat else None,
                           start=op.offset.const)
    return GemmProblem(m=con.m.extent, n=con.n.extent, k=con.k.extent,
                       batch=max(con.batch_size, 1), a=operand(con.a), b=operand(con.b))


def vector_width(con, op) -> int:
    """Elements of a computed operand fetched at once (emmy.cuda.gemm_spec.VectorGather): as
    many as 16 bytes of its raw data or of the stored elements hold (8 int8 weights; 8 int4
    weights, two to a byte, from 4 bytes), where its raw elements are consecutive along its
    tiles' columns (k for a k-major tile, its one outer axis otherwise; an int4 weight's
    bytes along k // 2, or GPTQ's int32 words of eight at k // 8, one after another or
    strided, or AWQ's words at n // 8 along n), every vector starts aligned (each other
    stride, the offset and that extent multiples of its raw elements), and the columns'
    extent is whole vectors; else 1."""
    if not op.computed:
        return 1
    pack = op.packing
    width = min(16 // op.load.dtype.itemsize * pack, 16 // op.dtype.itemsize)
    raw = width // pack
    along = con.k if op.k_major else (None if op.parts else (con.m if op is con.a else con.n))
    if along is None or raw == 0 or along.extent % width or op.offset.const % raw:
        return 1
    strides: dict[str, int] = {}
    for a, c in op.offset.terms:
        if isinstance(a, Sym):
            strides[a.name] = c
        elif not (pack > 1 and isinstance(a, FloorDiv) and a.den == pack
                  and (c == 1 or raw == 1) and a.num == var(along.var)):
            return 1        # an offset no vector walks (a gather, a window)
    if strides.get(along.var, 1 if pack > 1 else 0) != 1 or \
            any(c % raw for v, c in strides.items() if v != along.var):
        return 1
    return width


def _after(batch, i: int) -> int:
    out = 1
    for ax in batch[i + 1:]:
        out *= ax.extent
    return out


# --- rules ------------------------------------------------------------------------------------

def _itemsize(c: GemmCtx) -> int:
    return ELEMENT_BYTES[c.problem.a.ctype]


def threads_per_block(c: GemmCtx) -> str | None:
    wm, wn = c.work
    if 32 * wm * wn > c.target.max_threads_per_block:
        return f"{32 * wm * wn} threads > {c.target.max_threads_per_block} per block"
    return None


def instruction_types(c: GemmCtx) -> str | None:
    t = c.problem.a.ctype
    if c.tile.inst in ("mma", "wgmma") and t not in ("__half", "__nv_bfloat16"):
        return (f"{c.tile.inst} multiplies f16/bf16 operands (f32 accumulate); this product's "
                f"operands are {_dtype_name(t)}: use simt")
    if c.tile.inst == "tf32" and t != "float":
        return (f"tf32 tiles multiply f32 operands; this product's operands are "
                f"{_dtype_name(t)}: use mma")
    if c.tile.inst == "simt" and t != "float":
        return (f"simt tiles multiply f32 operands; this product's operands are "
                f"{_dtype_name(t)}: use mma (tensor cores)")
    return None


def tf32_allowed(c: GemmCtx) -> str | None:
    if c.tile.inst == "tf32" and not c.allow_tf32:
        return ("tf32 rounds the f32 operands to 10 mantissa bits (about 1e-3 relative error), "
                "more than an f32 check allows; a workload that accepts it says so with "
                "torch.set_float32_matmul_precision(\"high\") in its file")
    return None


def instruction_set(c: GemmCtx) -> str | None:
    if c.tile.inst == "wgmma" and not c.target.has_wgmma:
        return f"wgmma is an sm_90a instruction; {c.target.name} has none"
    gathered = [n for n, op in (("A", c.problem.a), ("B", c.problem.b))
                if op.gathered and not op.computed]
    if c.tile.inst == "wgmma" and gathered:
        return (f"the wgmma template reads tiles that cp.async or TMA copy as 16-byte chunks; "
                f"operand {gathered[0]} is gathered element by element: use mma")
    single = [n for n, op in (("A", c.problem.a), ("B", c.problem.b))
              if op.computed and op.vector != 8]
    if c.tile.inst == "wgmma" and single:
        return (f"the wgmma template computes its tiles 16-byte chunks at a time, each from one "
                f"vector of 8 raw elements; operand {single[0]} is computed one element at a "
                f"time (its rows are not whole aligned vectors of 8): use mma")
    if c.tile.inst in ("mma", "tf32") and not c.target.has_mma_sync:
        return f"mma.sync m16n8k16 needs sm_80 or later; {c.target.name} has none"
    return None


def warp_tile(c: GemmCtx) -> str | None:
    wm, wn = c.work
    t = c.tile
    if t.bm % wm or t.bn % wn:
        return f"the {t.bm}x{t.bn} block tile does not split over {wm}x{wn} warps"
    m, n = t.bm // wm, t.bn // wn
    if t.inst in ("mma", "tf32") and (m % 16 or n % 16):
        return (f"each warp's {m}x{n} tile must be a multiple of 16x16 (mma m16n8k16 atoms, "
                f"B fragments in pairs)")
    if t.inst == "wgmma" and (wm * wn) % 4:
        return "wgmma is issued by warpgroups of 4 warps: WM x WN must be a multiple of 4"
    if t.inst == "simt" and (m * n) % 32:
        return f"each warp's {m}x{n} tile must give its 32 lanes equal micro-tiles"
    return None


def accumulator_registers(c: GemmCtx) -> str | None:
    wm, wn = c.work
    per_thread = c.tile.bm * c.tile.bn // (32 * wm * wn)
    limit = 128 if c.tile.inst != "simt" else 64
    if per_thread > limit:
        return (f"{per_thread} f32 accumulators per thread > {limit}: the tile would spill "
                f"registers; use more warps or a smaller tile")
    return None


def tile_fits_problem(c: GemmCtx) -> str | None:
    p, t = c.problem, c.tile
    most_m, most_n = max(32, 2 * _ceil_pow2(p.m)), max(32, 2 * _ceil_pow2(p.n))
    if t.bm > most_m or t.bn > most_n:
        return (f"a {t.bm}x{t.bn} tile over a {p.m}x{p.n} output is mostly padding; use a "
                f"tile of at most {most_m}x{most_n}")
    if t.bk > max(16, 2 * _ceil_pow2(p.k)):
        return f"BK={t.bk} is more than twice K={p.k}"
    return None


def split_range(c: GemmCtx) -> str | None:
    r = c.reduce
    if r.method != "split":
        return None
    if r.split * c.tile.bk > c.problem.k:
        return (f"split:{r.split} gives each block fewer than BK={c.tile.bk} of K={c.problem.k}")
    if r.combine == "atomic" and not (c.plain_store and c.out_f32):
        return ("split:S:atomic adds partial sums into the output, so the epilogue must store "
                "the f32 accumulator as it is; use split:S:combine")
    if c.tile.inst == "wgmma":
        return "the wgmma template does not split K"
    return None


def stage_kind(c: GemmCtx) -> str | None:
    s = c.stage
    if s.kind == "tma" and c.tile.inst != "wgmma":
        return "TMA staging feeds wgmma tiles only; use async:N"
    if s.kind == "async" and not c.target.has_cp_async:
        return f"cp.async needs sm_80 or later; {c.target.name} has none"
    return None


def stage_alignment(c: GemmCtx) -> str | None:
    if c.stage.kind == "smem":
        return None
    for name, op in (("A", c.problem.a), ("B", c.problem.b)):
        if op.computed and c.stage.kind != "async":
            return (f"operand {name} is computed (a dequantized weight: each element made from "
                    f"its raw bytes as its tile is filled), so {c.stage.kind} copies, which move "
                    f"tiles untouched, cannot fill it; use STAGE=async:N (its raw bytes by "
                    f"cp.async){' or smem' if c.tile.inst != 'wgmma' else ''}")
        if op.gathered and c.stage.kind != "async":
            return (f"operand {name} is gathered (each element computed, as a convolution's "
                    f"window with its padding), so its tiles are copied element by element: "
                    f"{c.stage.kind} copies need affine 16-byte chunks; use STAGE=smem or "
                    f"async:N (the other operand by cp.async, the gathered one through "
                    f"registers one tile ahead)")
    for name, op in (("A", c.problem.a), ("B", c.problem.b)):
        if op.gathered:
            continue
        start = op.start
        if start * op.itemsize % 16:
            return (f"cp.async copies 16-byte chunks; operand {name} starts {start} elements "
                    f"({start * op.itemsize} bytes) into its buffer, off a 16-byte boundary "
                    f"(use STAGE=smem)")
        contiguous = op.stride_k == 1 or op.stride_outer == 1
        row = (op.stride_outer if op.stride_k == 1 else op.stride_k) * op.itemsize
        if not contiguous:
            return f"cp.async copies 16-byte chunks; operand {name} has no contiguous dimension"
        if row % 16:
            return (f"cp.async copies 16-byte chunks; operand {name}'s rows start every {row} "
                    f"bytes, not a multiple of 16 (use STAGE=smem)")
    return None


def stage_cluster(c: GemmCtx) -> str | None:
    cm, cn = c.stage.cluster
    if cm * cn == 1:
        return None
    p, t = c.problem, c.tile
    tiles, axis = (-(-p.m // t.bm), "m") if cm > 1 else (-(-p.n // t.bn), "n")
    if tiles < 2:
        return (f"a cluster of {cm}x{cn} tiles shares copies between neighbouring tiles along "
                f"{axis}, but the {p.m}x{p.n} output has one {t.bm}x{t.bn} tile along {axis}; "
                f"use tma:{c.stage.stages}{':store' if c.stage.store else ''}")
    return None


def stage_store(c: GemmCtx) -> str | None:
    if not c.stage.store:
        return None
    if c.stage.kind != "tma":
        return "the output tile is stored by TMA beside the TMA ring: :store needs tma:N"
    return _UNSTAGED(c.tile_kernel, None, lambda: unstaged(c.tile_kernel))


def held_registers(c: GemmCtx) -> str | None:
    """An async ring holds a gathered operand's next tile in registers: a few per thread."""
    if c.stage.kind != "async":
        return None
    from emmy.cuda.gemm import held_problems

    reasons = held_problems(c.problem, config_of(c))
    return reasons[0] if reasons else None


def shared_budget(c: GemmCtx) -> str | None:
    from emmy.cuda.gemm import raw_ring

    t, s, p = c.tile, c.stage, c.problem
    per_stage = (t.bm + t.bn) * (t.bk + 16 // _itemsize(c)) * _itemsize(c)
    config = config_of(c)
    ring = sum(op.raw_bytes(outer * t.bk) for op, outer in ((p.a, t.bm), (p.b, t.bn))
               if raw_ring(op, config))
    need = (per_stage + ring) * s.stages
    if need > c.target.shared_per_block_optin:
        raw = f" (+ {_kib(ring)} of raw bytes)" if ring else ""
        return (f"{s.stages} stage(s) x {_kib(per_stage)}{raw} = {_kib(need)} shared memory > "
                f"{_kib(c.target.shared_per_block_optin)} per block on {c.target.name}")
    return None


def template_builds(c: GemmCtx) -> str | None:
    """Anything else the template cannot build (its own constraints, in its own words)."""
    reasons = template_constraints(c.problem, config_of(c), c.target.name)
    return reasons[0] if reasons else None


def template_constraints(problem: GemmProblem, config: GemmConfig, target: str) -> list[str]:
    if config.inst == "wgmma":
        from emmy.cuda import gemm_sm90

        return gemm_sm90.constraints_sm90(problem, config, target)
    from emmy.cuda import gemm

    return gemm.constraints(problem, config, target)


def _unused(key: str):
    def check(c: GemmCtx) -> str | None:
        if not c.cut or getattr(c, FIELD[key]) == READ[key](CUT_ROW[key]):
            return None
        return (f"PLACE=cut makes `{c.kernel}` two kernels ({c.kernel}_cut0 stores the "
                f"computed operand, {c.kernel}_cut1 is the product), each scheduled by its own "
                f"row; this kernel's {key} is unused and reads {key}={CUT_ROW[key]}")
    return check


def _fused_only(rule: Rule) -> Rule:
    return Rule(rule.name, rule.key, lambda c: None if c.cut else rule.check(c))


_FUSED_RULES = (
    Rule("work.threads_per_block", "WORK", threads_per_block),
    Rule("tile.instruction_types", "TILE", instruction_types),
    Rule("tile.tf32_allowed", "TILE", tf32_allowed),
    Rule("tile.instruction_set", "TILE", instruction_set),
    Rule("tile.warp_tile", "TILE", warp_tile),
    Rule("tile.accumulator_registers", "TILE", accumulator_registers),
    Rule("tile.fits_problem", "TILE", tile_fits_problem),
    Rule("reduce.split_range", "REDUCE", split_range),
    Rule("stage.kind", "STAGE", stage_kind),
    Rule("stage.alignment", "STAGE", stage_alignment),
    Rule("stage.cluster", "STAGE", stage_cluster),
    Rule("stage.store", "STAGE", stage_store),
    Rule("stage.held_registers", "STAGE", held_registers),
    Rule("stage.shared_budget", "STAGE", shared_budget),
    Rule("raster.template_builds", "RASTER", template_builds),
)
_CUT_RULES = tuple(Rule(f"place.cut_unused_{key.lower()}", key, _unused(key)) for key in CUT_ROW)
RULES = _CUT_RULES + tuple(_fused_only(r) for r in _FUSED_RULES)


def _ceil_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _kib(n: int) -> str:
    return f"{n / KIB:g} KiB" if n >= KIB else f"{n} B"


def _dtype_name(ctype: str) -> str:
    return {"__half": "f16", "__nv_bfloat16": "bf16", "float": "f32"}.get(ctype, ctype)


def make_ctx(kernel, target: Target) -> GemmCtx:
    con = kernel.contract
    outs = kernel.outputs
    return GemmCtx(kernel.name, problem_of(con), con.plain_store,
                   all(b.type.dtype is DType.F32 for b in outs), target,
                   allow_tf32=con.allow_tf32, tile_kernel=kernel)


_UNSTAGED = ByIdentity()   # unstaged(kernel), asked only of rows with :store


def unstaged(kernel) -> str | None:
    """Why the product's epilogue cannot stage its output tile for a TMA store, or None: it
    must store two 16-bit elements of one row-major output once, unconditionally
    (emmy.cuda.gemm_spec.staged_of), its rows and batches 16-byte aligned (a tensor map's
    strides)."""
    from emmy.cuda.gemm_spec import staged_of
    from emmy.kernel_ir.gemm import make_epilogue

    form = staged_of(make_epilogue(kernel))
    if form is None:
        return ("the epilogue does not store one 16-bit row-major output once per element "
                "(a TMA store writes whole tiles of one such output): drop :store")
    tile = form[0]
    if tile.row_stride % 8 or tile.batch_stride % 8:
        return (f"the output's rows start every {tile.row_stride} elements and its batches "
                f"every {tile.batch_stride}: a TMA store needs multiples of 8 (16 bytes); "
                f"drop :store")
    return None
