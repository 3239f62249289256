"""The decision points of a fused chain of two products (kind `chain`, emmy.tile_ir.chain):

    PLACE   fuse | cut              one back-to-back kernel (emmy.cuda.chain) that recomputes
                                    each row block's slice of the intermediate for every output
                                    column tile, or two kernels with the intermediate in memory,
                                    each then scheduled by its own row
    WORK    warps:WMxWN             warps per block (fused only)
    TILE    simt|mma:BMxBNxBK1xBK2  output tile, K1 step of the intermediate's product, K2 chunk
                                    of the intermediate kept in shared memory (fused only)

PLACE is decided first: with PLACE=cut this kernel's own WORK and TILE are unused, and the one
value each may take says so. The last rule asks the template itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from emmy.schedule.rules import Rule
from emmy.schedule.targets import Target

_WARPS = ("1x1", "1x2", "2x1", "2x2", "2x4", "4x2")
_TILES = tuple(f"{inst}:{m}x{n}x{k1}x{k2}" for inst, k1s in (("simt", (8, 16, 32)),
                                                              ("mma", (16, 32)))
               for m in (32, 64, 128) for n in (32, 64, 128) for k1 in k1s for k2 in (16, 32, 64))
GRAMMAR: dict[str, tuple[str, ...]] = {
    "WORK": tuple(f"warps:{w}" for w in _WARPS),
    "TILE": _TILES,
    "PLACE": ("fuse", "cut"),
}
GRAMMAR_TEXT = {
    "WORK": "warps:WMxWN  (warps along M and N: " + " ".join(_WARPS) + ")",
    "TILE": "simt|mma:BMxBNxBK1xBK2  (output tile BM,BN in 32..128; BK1 the first product's K "
            "step, simt 8|16|32, mma 16|32; BK2 = 16|32|64 columns of the intermediate per chunk)",
    "PLACE": "fuse | cut  (one back-to-back kernel, or two kernels with their own rows)",
}
KEYS = ("PLACE", "WORK", "TILE")          # the order decisions are made (rows print canonically)
CUT_ROW = {"WORK": GRAMMAR["WORK"][0], "TILE": GRAMMAR["TILE"][0]}
PREFERRED = {"PLACE": ("fuse", "cut"), "WORK": ("warps:2x2", "warps:1x1"),
             "TILE": ("mma:64x64x32x32", "simt:64x64x16x32", "mma:32x32x16x16",
                      "simt:32x32x8x16")}


@dataclass(frozen=True, slots=True)
class ChainTile:
    inst: str
    bm: int
    bn: int
    bk1: int
    bk2: int


def read_work(value: str) -> tuple[int, int]:
    wm, wn = value.split(":")[1].split("x")
    return int(wm), int(wn)


def read_tile(value: str) -> ChainTile:
    m = re.fullmatch(r"(simt|mma):(\d+)x(\d+)x(\d+)x(\d+)", value)
    assert m, value
    return ChainTile(m[1], int(m[2]), int(m[3]), int(m[4]), int(m[5]))


READ = {"PLACE": lambda v: v == "cut", "WORK": read_work, "TILE": read_tile}
FIELD = {"PLACE": "cut", "WORK": "work", "TILE": "tile"}


@dataclass(frozen=True)
class ChainCtx:
    kernel: str
    problem: object              # emmy.cuda.chain.ChainProblem
    half: bool                   # f16/bf16 operands, the intermediate rounded to their type
    target: Target
    cut: bool | None = None
    work: tuple[int, int] | None = None
    tile: ChainTile | None = None


def problem_of(fc):
    """The template's view of a FusedChain: sizes and operand layouts (emmy.schedule.gemm's)."""
    from emmy.cuda.chain import ChainProblem
    from emmy.schedule.gemm import problem_of as gemm_problem

    f, s = fc.first.contract, fc.second.contract
    first, second = gemm_problem(f), gemm_problem(s)
    # by the operand, not its buffer: one buffer may be two operands ((x @ x) @ z), each read
    # in its own layout
    pairs = ((f.a, first.a), (f.b, first.b), (s.a, second.a), (s.b, second.b))

    def layout(op):
        return next(g for o, g in pairs if o is op)

    return ChainProblem(m=fc.i.extent, k1=f.k.extent, k2=fc.k2.extent, n=fc.j.extent,
                        batch=first.batch, a=layout(fc.a), b=layout(fc.b), c=layout(fc.c))


def config_of(c: ChainCtx):
    from emmy.cuda.chain import ChainConfig

    t = c.tile
    return ChainConfig(inst=t.inst, bm=t.bm, bn=t.bn, bk1=t.bk1, bk2=t.bk2, wm=c.work[0],
                       wn=c.work[1])


def make_ctx(kernel, target: Target) -> ChainCtx:
    return ChainCtx(kernel.name, problem_of(kernel.chain), kernel.chain.half, target)


# --- rules ------------------------------------------------------------------------------------

def _unused(key: str):
    def check(c: ChainCtx) -> str | None:
        value = {"WORK": f"warps:{c.work[0]}x{c.work[1]}" if c.work else None,
                 "TILE": (f"{c.tile.inst}:{c.tile.bm}x{c.tile.bn}x{c.tile.bk1}x{c.tile.bk2}"
                          if c.tile else None)}[key]
        if c.cut and value != CUT_ROW[key]:
            return (f"PLACE=cut makes `{c.kernel}` two matrix products ({c.kernel}_cut0 and "
                    f"{c.kernel}_cut1), each scheduled by its own row; this kernel's {key} is "
                    f"unused and reads {key}={CUT_ROW[key]}")
        return None
    return check


def threads_per_block(c: ChainCtx) -> str | None:
    if c.cut:
        return None
    wm, wn = c.work
    if 32 * wm * wn > c.target.max_threads_per_block:
        return f"{32 * wm * wn} threads > {c.target.max_threads_per_block} per block"
    return None


def instruction_types(c: ChainCtx) -> str | None:
    if c.cut:
        return None
    if c.tile.inst == "mma" and not c.half:
        return ("mma needs f16/bf16 operands and an intermediate the program rounds to their "
                "type; this chain is f32: use simt")
    if c.tile.inst == "simt" and c.problem.a.ctype != "float":
        return "simt tiles multiply f32 operands; this chain is f16/bf16: use mma"
    return None


def tile_fits_problem(c: ChainCtx) -> str | None:
    if c.cut:
        return None
    p, t = c.problem, c.tile
    most = {"BM": (t.bm, p.m, 32), "BN": (t.bn, p.n, 32), "BK1": (t.bk1, p.k1, 16),
            "BK2": (t.bk2, p.k2, 16)}
    for name, (size, extent, floor) in most.items():
        limit = max(floor, 2 * _ceil_pow2(extent))
        if size > limit:
            return (f"{name}={size} over an extent of {extent} is mostly padding; at most "
                    f"{limit}")
    return None


def _ceil_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def template_builds(c: ChainCtx) -> str | None:
    if c.cut:
        return None
    from emmy.cuda.chain import constraints

    reasons = constraints(c.problem, config_of(c), c.target.name)
    return reasons[0] if reasons else None


RULES = (
    Rule("work.unused_after_cut", "WORK", _unused("WORK")),
    Rule("work.threads_per_block", "WORK", threads_per_block),
    Rule("tile.unused_after_cut", "TILE", _unused("TILE")),
    Rule("tile.instruction_types", "TILE", instruction_types),
    Rule("tile.fits_problem", "TILE", tile_fits_problem),
    Rule("tile.template_builds", "TILE", template_builds),
)
