"""The decision points of an attention kernel (f16/bf16 or f32 q, k, v; emmy.tile_ir.attention),
built as one flash-attention kernel: a block of queries walks the keys once, with the softmax
as an online fold that rescales its running sum and output.

    WORK    warps:W              W warps per block (4 or 8), each owning BQ/W query rows
    TILE    flash:BQxBKV         BQ queries per block, BKV keys per step (mma.sync for Q K^T
                                 and P V, f32 accumulate)
            wgmma:BQxBKV         sm_90a only: Hopper's warpgroup mma (emmy.cuda.attention_sm90):
                                 BQ = 64 per consumer warpgroup (64 or 128, so WORK = BQ/16
                                 warps), BKV = 64 | 128 keys per step; S = Q K^T with both
                                 operands in shared memory, O += P V with P in registers
            simt:BQxBKV          f32 q, k, v (the only tiles for them): FMA on CUDA cores
                                 (emmy.cuda.attention_simt); a warp's 4 row groups own BQ/(4W)
                                 query rows each, its 8 key lanes split each key block
    STAGE   smem | async:2       K/V tiles copied synchronously, or double-buffered by cp.async
            async:2:overlap      wgmma tiles only: the double buffer with FlashAttention-3's
                                 intra-warpgroup pipelining: a warpgroup issues S_j = Q K^T and
                                 P_{j-1} V_{j-1} together and runs the softmax of block j while
                                 P V does
            tma:2 | tma:2:overlap
                                 wgmma tiles only: FlashAttention-3's warp specialization: a
                                 producer warpgroup (128 more threads, before the consumers)
                                 loads Q once and K/V into a 2-stage ring by TMA on full/empty
                                 mbarriers (4-d tensor maps: stage.tma_tensor_maps), the
                                 consumers only compute; with :overlap each issues S_j and
                                 P_{j-1} V_{j-1} together and runs the softmax of block j while
                                 P V does (FlashAttention-3's order: one S buffer, nothing in
                                 flight across steps). Two consumer warpgroups: setmaxnreg 40 / 232,
                                 __launch_bounds__(384, 1)
    REDUCE  serial               one block walks all of its query block's keys
            split:S:combine      split-KV (FlashDecoding): S blocks per query block, each over
                                 a run of ceil(key blocks / S) key blocks, write their output
                                 and row log-sum-exp to an f32 scratch; a second kernel
                                 weighs and sums them. For problems with fewer (batch, head,
                                 query block)s than SMs: a decoding step (one query a head)
                                 is one block per key/value head unsplit. flash: and simt:
                                 tiles only
            split:S:last         the same split, one kernel: the last of a query block's S
                                 blocks to take its ticket (an atomic count) weighs and sums
                                 the partials (in split order: the same sums every run)

The last rule asks the template (emmy.cuda.attention or .attention_sm90) itself, so a listed
row always builds.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from emmy.schedule.rules import Rule
from emmy.schedule.targets import Target

KIB = 1024
SPLITS = (2, 4, 8, 16, 32)
GRAMMAR: dict[str, tuple[str, ...]] = {
    "WORK": ("warps:4", "warps:8"),
    "TILE": (*(f"flash:{q}x{kv}" for q in (64, 128) for kv in (32, 64, 128)),
             *(f"wgmma:{q}x{kv}" for q in (64, 128) for kv in (64, 128)),
             *(f"simt:{q}x{kv}" for q in (32, 64, 128) for kv in (32, 64))),
    "REDUCE": ("serial", *(f"split:{s}:{how}" for s in SPLITS for how in ("combine", "last"))),
    "STAGE": ("smem", "async:2", "async:2:overlap", "tma:2", "tma:2:overlap"),
}
GRAMMAR_TEXT = {
    "WORK": "warps:4 | warps:8  (warps per block)",
    "TILE": "flash:BQxBKV | wgmma:BQxBKV | simt:BQxBKV  (BQ = 64 | 128 queries per block; "
            "BKV = 32 | 64 | 128 keys per step for flash (mma.sync), 64 | 128 for wgmma (sm_90a, "
            "BQ/16 warps); simt (f32 operands, CUDA cores): BQ = 32 | 64 | 128, BKV = 32 | 64)",
    "REDUCE": "serial | split:S:combine | split:S:last  (S = 2 | 4 | 8 | 16 | 32 blocks share "
              "a query block's keys: split-KV, for few heads or one query a head; combine: a "
              "second kernel combines their outputs, last: the last of the S blocks to finish "
              "does; flash: and simt: tiles)",
    "STAGE": "smem | async:2 | async:2:overlap | tma:2 | tma:2:overlap  (K/V copies: "
             "synchronous, or a cp.async double buffer; overlap, wgmma only: S_j issued with "
             "P_{j-1} V_{j-1}, the softmax of block j runs while P V does; tma, wgmma only: a "
             "producer warpgroup loads Q, K and V by TMA on mbarriers)",
}
# Measured on an H200 (4 x 32 heads x 4096 x 128, f16 and bf16, 2026-12-04): on sm_90a the
# wgmma rows in FlashAttention-3's order, 128 queries on two consumer warpgroups, 128 keys a
# step, fed by a TMA producer warpgroup with the softmax of one key block overlapping P V of
# the one before (WORK=warps:8 TILE=wgmma:128x128 STAGE=tma:2:overlap) were fastest: 1.14 ms
# causal and 1.89 ms full against 1.95 and 3.61 ms for the best mma.sync row, which stays the
# default where there is no wgmma (sm_80): 128 queries on 4 warps (32 rows a warp), 32 keys
# (d = 128) or 64-128 (d = 64) a step, double-buffered. Up to 64 queries a head (a decoding
# step) keep the mma.sync order, whose split-KV rows were timed there (20 us for Llama-3-8B's
# step); no wgmma row has been timed on such a problem.
# f32 (simt tiles): 64 queries on 4 warps (4 rows a thread), 32 keys a step.
PREFERRED = {"WORK": ("warps:4", "warps:8"),
             "TILE": ("flash:128x32", "flash:128x64", "flash:64x64", "simt:64x32", "simt:32x32"),
             "REDUCE": ("serial",),
             "STAGE": ("async:2", "smem")}
HOPPER_PREFERRED = {"WORK": ("warps:8", "warps:4"),
                    "TILE": ("wgmma:128x128", "wgmma:128x64", *PREFERRED["TILE"]),
                    "STAGE": ("tma:2:overlap", "async:2:overlap", "tma:2", *PREFERRED["STAGE"])}
KEYS = ("WORK", "TILE", "REDUCE", "STAGE")


@dataclass(frozen=True, slots=True)
class FlashStage:
    stages: int              # smem -> 1, async:2 -> 2
    overlap: bool = False    # :overlap (wgmma tiles): softmax j while P V of block j - 1 runs
    tma: bool = False        # tma:2[:overlap] (wgmma tiles): a TMA producer warpgroup


@dataclass(frozen=True, slots=True)
class FlashTile:
    bq: int
    bkv: int
    inst: str = "mma"        # flash:... -> "mma" (mma.sync); wgmma:... -> "wgmma"; simt:...


def read_work(value: str) -> int:
    return int(value.split(":")[1])


def read_tile(value: str) -> FlashTile:
    m = re.fullmatch(r"(flash|wgmma|simt):(\d+)x(\d+)", value)
    assert m, value
    return FlashTile(int(m[2]), int(m[3]), "mma" if m[1] == "flash" else m[1])


@dataclass(frozen=True, slots=True)
class FlashReduce:
    splits: int = 1          # serial -> 1, split:S:... -> S
    mode: str = "combine"    # split:S:combine | split:S:last


def read_reduce(value: str) -> FlashReduce:
    if value == "serial":
        return FlashReduce()
    _, count, mode = value.split(":")
    return FlashReduce(int(count), mode)


def read_stage(value: str) -> FlashStage:
    if value == "smem":
        return FlashStage(1)
    parts = value.split(":")
    return FlashStage(int(parts[1]), parts[2:] == ["overlap"], parts[0] == "tma")


READ = {"WORK": read_work, "TILE": read_tile, "REDUCE": read_reduce, "STAGE": read_stage}
FIELD = {"WORK": "warps", "TILE": "tile", "REDUCE": "reduce", "STAGE": "stage"}


@dataclass(frozen=True)
class FlashCtx:
    kernel: str
    problem: object              # emmy.cuda.attention.AttentionProblem
    target: Target
    warps: int | None = None
    tile: FlashTile | None = None
    reduce: FlashReduce | None = None
    stage: FlashStage | None = None

    @property
    def splits(self) -> int | None:
        return self.reduce.splits if self.reduce else None

    @property
    def split_mode(self) -> str:
        return self.reduce.mode if self.reduce else "combine"

    @property
    def stages(self) -> int | None:
        return self.stage.stages if self.stage else None

    @property
    def overlap(self) -> bool:
        return bool(self.stage and self.stage.overlap)

    @property
    def tma(self) -> bool:
        return bool(self.stage and self.stage.tma)


def config_of(c: FlashCtx):
    from emmy.cuda.attention import AttentionConfig

    if c.tile.inst == "wgmma":
        from emmy.cuda.attention_sm90 import WgmmaAttentionConfig

        return WgmmaAttentionConfig(bq=c.tile.bq, bkv=c.tile.bkv, warps=c.warps,
                                    stages=c.stages, overlap=c.overlap, tma=c.tma,
                                    splits=c.splits or 1, split_mode=c.split_mode)
    return AttentionConfig(bq=c.tile.bq, bkv=c.tile.bkv, warps=c.warps, stages=c.stages,
                           inst=c.tile.inst,      # "mma" or "simt" (emmy.cuda.attention_simt)
                           splits=c.splits or 1, split_mode=c.split_mode)


def merged_batch_stride(att, offset) -> int | None:
    """The element stride of the batch axes before the head axis taken as one axis (row-major,
    as the template's grid and the output's store count them) in `offset`: the innermost one's,
    where each outer one steps over all of the next (or none of it, a broadcast); None where
    they are not one axis in memory. 0 without such axes."""
    coef = {a.name: c for a, c in offset.terms}
    lead = att.batch[:-1]
    for outer, inner in zip(lead, lead[1:]):
        if coef.get(outer.var, 0) != coef.get(inner.var, 0) * inner.extent:
            return None
    return coef.get(lead[-1].var, 0) if lead else 0


def problem_of(att):
    """The template's view of an Attention (emmy.tile_ir.attention): its batch axes before the
    head axis are one batch axis (flash_ok has checked they can be)."""
    from emmy.cuda.attention import AttentionProblem, AttnBias, AttnOperand

    def strides(offset, inner: tuple[str, str]) -> tuple[int, int, int, int]:
        """Element strides of (batch, head, *inner) in `offset` (0 where it does not vary)."""
        coef = {a.name: c for a, c in offset.terms}
        head = coef.get(att.batch[-1].var, 0) if att.batch else 0
        batch = merged_batch_stride(att, offset) or 0
        return batch, head, coef.get(inner[0], 0), coef.get(inner[1], 0)

    def operand(op) -> AttnOperand:
        return AttnOperand(op.buffer, op.dtype.c_name, strides(op.offset, ("s", "d")), op.group,
                           op.offset.const)

    def bias(b) -> AttnBias | None:
        return None if b is None else AttnBias(b.kind, b.buffer, b.dtype.c_name,
                                               strides(b.offset, ("qi", "kj")), b.offset.const,
                                               b.rounded)

    ext = [ax.extent for ax in att.batch]
    batch, heads = math.prod(ext[:-1]), (ext[-1] if ext else 1)
    p = AttentionProblem(batch=batch, heads=heads, sq=att.query.extent, sk=att.keys,
                         d=att.dim, v_dim=att.dim_v, q=operand(att.q), k=operand(att.k),
                         v=operand(att.v),
                         scale=att.scale, causal=att.causal,
                         rounded=att.rounded.c_name if att.rounded else None,
                         bias=bias(att.bias), zero_empty=att.zero_empty)
    g = p.k.group
    if p.sq == 1 and g > 1 and p.v.group == g and not p.causal:
        # one query a head, g query heads per key/value head: the g queries of a key/value
        # head are g query rows of one problem head, so its keys and values are read once for
        # all g (not once per query head), in one block. Query head h * g + r is row r of
        # head h: q's (and a mask's) head stride becomes its row stride, g of them its head's.
        def rows(strides):
            return (strides[0], strides[1] * g, strides[1], strides[3])
        p = dataclasses.replace(
            p, heads=heads // g, sq=g, query_heads=g,
            q=dataclasses.replace(p.q, strides=rows(p.q.strides)),
            k=dataclasses.replace(p.k, group=1), v=dataclasses.replace(p.v, group=1),
            bias=p.bias and dataclasses.replace(p.bias, strides=rows(p.bias.strides)))
    return p


def make_ctx(kernel, target: Target) -> FlashCtx:
    return FlashCtx(kernel.name, problem_of(kernel.attention), target)


def prefer(key: str, order: tuple[str, ...], c: FlashCtx) -> tuple[str, ...]:
    """The default's order: on a target with wgmma, 16-bit operands and more than 64 queries a
    head, for the attention a GPU has checked the wgmma template on (_checked_on_hopper),
    FlashAttention-3's row first (HOPPER_PREFERRED; a row it cannot take falls back to
    mma.sync's order). Where the
    queries of a head fill no more than 64 rows (a decoding step's one, or its query heads of
    one key/value head), 64-row tiles first. (Its REDUCE, serial or split, the cost model
    picks: emmy.schedule.space.Space._default.)"""
    if key == "TILE" and c.problem.sq <= 64:
        return tuple(sorted(order, key=lambda v: read_tile(v).bq > 64))
    if key in HOPPER_PREFERRED and c.target.has_wgmma and c.problem.sq > 64 and \
            c.problem.q.ctype != "float" and _checked_on_hopper(c.problem):
        return HOPPER_PREFERRED[key]
    return order


def _checked_on_hopper(p) -> bool:
    """The attention the wgmma template has run on a GPU (an H200, 2026-12-04): causal or not,
    either layout, head dimension 64 or 128. Under an attn_mask, with scores rounded to 16 bits,
    query heads folded onto a key/value head or a v of its own width, its rows are legal and
    pass the emulator, but stay off the default until a GPU has checked them too."""
    return p.bias is None and p.rounded is None and p.query_heads == 1 and \
        p.v_dim in (0, p.d) and p.d in (64, 128)


# --- rules ------------------------------------------------------------------------------------

def threads_per_block(c: FlashCtx) -> str | None:
    threads = 32 * c.warps + (128 if c.tma else 0)     # tma: the producer warpgroup too
    if threads > c.target.max_threads_per_block:
        return f"{threads} threads > {c.target.max_threads_per_block} per block"
    return None


def tile_text(t: FlashTile) -> str:
    """How a row writes the tile, and what it runs on."""
    name, runs = {"mma": ("flash", "mma.sync"), "wgmma": ("wgmma", "wgmma"),
                  "simt": ("simt", "CUDA cores")}[t.inst]
    return f"{name}:{t.bq}x{t.bkv} ({runs})"


def operand_type(c: FlashCtx) -> str | None:
    f32 = c.problem.q.ctype == "float"
    name = tile_text(c.tile).split(" ")[0]
    if f32 and c.tile.inst != "simt":
        return (f"{name} multiplies f16/bf16 on tensor cores; q, k and v are f32: use "
                f"simt:BQxBKV (CUDA cores)")
    if not f32 and c.tile.inst == "simt":
        return (f"{name} is the f32 template (CUDA cores); q, k and v are "
                f"{c.problem.q.ctype}: use flash:BQxBKV (mma.sync) or wgmma:BQxBKV")
    return None


def wgmma_target(c: FlashCtx) -> str | None:
    if c.tile.inst == "wgmma" and not c.target.has_wgmma:
        return f"wgmma is an sm_90a instruction; {c.target.name} has none (use flash:BQxBKV)"
    return None


def wgmma_warpgroups(c: FlashCtx) -> str | None:
    if c.tile.inst == "wgmma" and c.warps != c.tile.bq // 16:
        return (f"wgmma:{c.tile.bq}x{c.tile.bkv} runs {c.tile.bq // 64} consumer warpgroup(s) "
                f"of 4 warps, each owning 64 query rows: use WORK=warps:{c.tile.bq // 16}")
    return None


def wgmma_head_dim(c: FlashCtx) -> str | None:
    from emmy.cuda.attention_sm90 import MAX_D, PV_N

    d = c.problem.d
    if c.problem.dv != d:
        return None          # v_head_dim: the wgmma template reads one head dimension
    if c.tile.inst == "wgmma" and (d % 64 or not 64 <= d <= MAX_D):
        return (f"head dimension {d}: wgmma attention stores Q, K and V in whole 128-byte "
                f"swizzled rows (64 elements), so d must be a multiple of 64 in 64..{MAX_D}; "
                f"use flash:BQxBKV")
    if c.tile.inst == "wgmma" and d not in PV_N:
        return (f"head dimension {d}: P V's wgmma has N = d, and emmy_sm90.cuh issues N = "
                f"{', '.join(map(str, PV_N))}; use flash:BQxBKV")
    return None


def v_head_dim(c: FlashCtx) -> str | None:
    p = c.problem
    if p.dv != p.d and c.tile.inst != "mma":
        return (f"q . k over a head dimension of {p.d} and v over {p.dv}: "
                f"{tile_text(c.tile)} reads q, k and v at one; use flash:BQxBKV (mma.sync)")
    return None


def wgmma_registers(c: FlashCtx) -> str | None:
    from emmy.cuda.attention_sm90 import MAX_ACCUMULATORS

    if c.tile.inst != "wgmma":
        return None
    regs = c.problem.d // 2 + c.tile.bkv // 2
    if regs > MAX_ACCUMULATORS:
        return (f"each thread would hold {regs} f32 accumulators (O: d/2 = {c.problem.d // 2}, "
                f"S: bkv/2 = {c.tile.bkv // 2}), over the {MAX_ACCUMULATORS} that compile "
                f"without spills; use fewer keys per step")
    return None


def rows_per_warp(c: FlashCtx) -> str | None:
    if c.tile.inst == "wgmma":
        return None          # wgmma_warpgroups: a warpgroup owns 64 rows
    if c.tile.inst == "simt":
        from emmy.cuda.attention_simt import MAX_ROWS

        rows = c.tile.bq / (4 * c.warps)
        if rows != int(rows) or not 1 <= rows <= MAX_ROWS:
            return (f"{c.warps} warps share {c.tile.bq} query rows: a warp's 4 row groups own "
                    f"1 to {MAX_ROWS} rows each, so BQ is 4 x warps x (1..{MAX_ROWS})")
        return None
    if c.tile.bq % (16 * c.warps):
        return (f"{c.warps} warps share {c.tile.bq} query rows: each warp needs a multiple of "
                f"16 rows (the mma m16 atom)")
    return None


def async_copies(c: FlashCtx) -> str | None:
    if c.stages > 1 and not c.target.has_cp_async:
        return f"cp.async needs sm_80 or later; {c.target.name} has none"
    return None


def tma_wgmma(c: FlashCtx) -> str | None:
    if not c.tma:
        return None
    if c.tile.inst != "wgmma":
        return (f"STAGE=tma:... adds a TMA producer warpgroup to the wgmma template; "
                f"{tile_text(c.tile)} copies with cp.async: use STAGE=async:2, or a "
                f"wgmma:BQxBKV tile on sm_90a")
    if not c.target.has_tma:
        return f"TMA copies need sm_90 or later; {c.target.name} has none"
    return None


def tma_tensor_maps(c: FlashCtx) -> str | None:
    if not (c.tma and c.tile.inst == "wgmma"):
        return None
    from emmy.cuda.attention_sm90 import tma_refusals

    why = tma_refusals(c.problem)
    return (why[0] + "; use STAGE=async:2 (cp.async copies)") if why else None


def split_template(c: FlashCtx) -> str | None:
    if (c.splits or 1) > 1 and c.tile.inst == "wgmma":
        return (f"split-KV is built for flash:BQxBKV and simt:BQxBKV tiles; "
                f"{tile_text(c.tile)} has none: use REDUCE=serial")
    return None


def split_keys(c: FlashCtx) -> str | None:
    from emmy.cuda.attention import split_refusals

    why = split_refusals(c.problem, c.tile.bkv, c.splits or 1)
    return why[0] if why else None


def overlap_wgmma(c: FlashCtx) -> str | None:
    if c.overlap and c.tile.inst != "wgmma":
        return (f"STAGE=async:2:overlap pipelines wgmma groups (P V of the block before in "
                f"flight during the softmax); {tile_text(c.tile)} has none: use "
                f"STAGE=async:2, or a wgmma:BQxBKV tile on sm_90a")
    return None


def wgmma_shared(c: FlashCtx) -> str | None:
    if c.tile.inst != "wgmma":
        return None
    from emmy.cuda.attention_sm90 import smem_bytes

    need = smem_bytes(c.problem, config_of(c))
    if need > c.target.shared_per_block_optin:
        return (f"Q ({c.tile.bq} rows) and {c.stages} stage(s) of K and V ({c.tile.bkv} rows "
                f"each) of d = {c.problem.d} need {need / KIB:.1f} KiB of shared memory > "
                f"{c.target.shared_per_block_optin // KIB} KiB per block on {c.target.name}")
    return None


def template_builds(c: FlashCtx) -> str | None:
    if c.tile.inst == "wgmma":
        from emmy.cuda.attention_sm90 import constraints_sm90 as constraints
    elif c.tile.inst == "simt":
        from emmy.cuda.attention_simt import constraints_simt as constraints
    else:
        from emmy.cuda.attention import constraints

    reasons = constraints(c.problem, config_of(c), c.target.name)
    return reasons[0] if reasons else None


RULES = (
    Rule("work.threads_per_block", "WORK", threads_per_block),
    Rule("tile.operand_type", "TILE", operand_type),
    Rule("tile.wgmma_target", "TILE", wgmma_target),
    Rule("tile.wgmma_warpgroups", "TILE", wgmma_warpgroups),
    Rule("tile.v_head_dim", "TILE", v_head_dim),
    Rule("tile.wgmma_head_dim", "TILE", wgmma_head_dim),
    Rule("tile.wgmma_registers", "TILE", wgmma_registers),
    Rule("tile.rows_per_warp", "TILE", rows_per_warp),
    Rule("reduce.split_template", "REDUCE", split_template),
    Rule("reduce.split_keys", "REDUCE", split_keys),
    Rule("stage.async", "STAGE", async_copies),
    Rule("stage.tma_wgmma", "STAGE", tma_wgmma),
    Rule("stage.tma_tensor_maps", "STAGE", tma_tensor_maps),
    Rule("stage.overlap_wgmma", "STAGE", overlap_wgmma),
    Rule("stage.wgmma_shared", "STAGE", wgmma_shared),
    Rule("stage.template_builds", "STAGE", template_builds),
)
