"""A fused chain of two matrix products computed tile by tile ("back-to-back GEMM"):

    O[bz, m, n] = epilogue( sum_k2 H[bz, m, k2] * C[bz, k2, n] )
    H[bz, m, k2] = mid( sum_k1 A[bz, m, k1] * B[bz, k1, k2] )

H never goes to global memory: each block owns a bm x bn tile of O and walks K2 in chunks of
bk2. Per chunk it computes the bm x bk2 chunk of H (its own loop over K1 in bk1 steps through
shared memory), applies `mid` to each element (zero outside [0, m) x [0, k2): mid(0) need not
be 0), writes the chunk to shared memory, copies C's bk2 x bn tile next to it and accumulates
chunk @ C-tile into registers; at the end `epilogue` runs once per output element in bounds.
H is recomputed for every BN tile of a row block.

    chain_body(problem, config, mid, epilogue)   the lines inside the kernel, grid, block, smem
    constraints(problem, config, target_name)    why a configuration cannot be built (empty: it can)
    smem_bytes(problem, config)                  dynamic shared memory of chain_body's kernel

Conventions (emmy.cuda.gemm_spec): A[bz,m,k1] = a[a.batch_offset + m*a.stride_outer +
k1*a.stride_k], B[bz,k1,k2] = b[... + k2*b.stride_outer + k1*b.stride_k], C[bz,k2,n] =
c[... + n*c.stride_outer + k2*c.stride_k]. The body is the inside of a kernel whose signature
the emitter prints (`tid`, `bid`, the buffers by name, `emmy_smem`); grid = batch *
ceil(m/bm) * ceil(n/bn), one-dimensional, the n tile fastest (the blocks sharing an A row
block run together); threads = 32 * wm * wn.

How a block works (every size a compile-time constant, one shared buffer, synchronous copies
with emmy.cuda.gemm's copy code: 16-byte vectors where an operand's rows are 16-byte aligned,
else element by element, zero-filled outside the matrices, so any shape and stride works):
- shared memory: A tile (bm x bk1), B tile (bk2 x bk1), the H chunk (bm x bk2), C tile
  (bk2 x bn), each in its operand's contiguous order with gemm.py's padding.
- the same wm x wn warp grid covers both products: warp tiles (bm/wm) x (bk2/wn) for the H
  chunk and (bm/wm) x (bn/wn) for O; both accumulator sets are counted against the register
  budget (the H accumulators live during the chunk, the O ones throughout).
- inst "simt" (f32): per-lane micro-tiles of FFMA over 16-byte shared reads (as gemm.py's
  simt); the H chunk is stored transposed ([k2][m]) so both products read it as vectors.
- inst "mma" (f16/bf16): m16n8k16 mma.sync with ldmatrix fragments, f32 accumulators; the H
  chunk is rounded to the operands' type ([m][k2] in shared memory), which the integrator
  only picks when the program itself rounds H to that type.
- barriers: per K1 tile one before the copy (not the chunk's first) and one after; per chunk
  one after writing H and C (the next chunk's first K1 barrier orders the reuse of H and C).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

from emmy.cuda.gemm import (MAX_GRID, MMA_FN, MMA_K, SIMT_K_STEP, STORAGE, _ceil_div, _Emitter,
                            _indent, _kib, _simt_lanes, _SimtLanes, _Tile, _unrolled,
                            fragment_stores, target_problems)
from emmy.cuda.gemm_spec import Body, Epilogue, GemmOperand

# mid(bz, row, col, acc) -> (C statements, C expression of the float value of H at (row, col));
# the arguments are C expressions (long long batch, int row < m, int col < k2, f32 inner sum).
# The statements and the expression are emitted together inside their own { } block.
Mid = Callable[[str, str, str, str], tuple[list[str], str]]

INSTS = ("simt", "mma")
MAX_MMA_ACCUMULATORS = 128    # f32 accumulators per thread, H chunk and O together
MAX_SIMT_ACCUMULATORS = 48    # H and O micro-tiles together: 32 + 32 spilled under ptxas
REGISTER_FILE = 65536         # 32-bit registers per SM: a block of T threads gets <= 65536 / T
MAX_REGISTERS = 255
OTHER_REGISTERS = 64          # besides the accumulators: fragments, addresses, loop state
PACK = {"__half": "pack_f16x2", "__nv_bfloat16": "pack_bf16x2"}


@dataclass(frozen=True)
class ChainProblem:
    m: int
    k1: int
    k2: int
    n: int
    batch: int
    a: GemmOperand        # A[bz, m, k1]: stride_outer along m, stride_k along k1
    b: GemmOperand        # B[bz, k1, k2]: stride_outer along k2, stride_k along k1
    c: GemmOperand        # C[bz, k2, n]: stride_outer along n, stride_k along k2

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.k2 * (self.k1 + self.n)


@dataclass(frozen=True)
class ChainConfig:
    inst: str             # "simt" (f32 FFMA) | "mma" (f16/bf16 mma.sync m16n8k16, f32 accumulate)
    bm: int               # block tile of O: bm x bn
    bn: int
    bk1: int              # K1 step of the H chunk's product
    bk2: int              # K2 chunk: columns of H computed (and kept in shared memory) at a time
    wm: int               # warps along M and along N (threads = 32 * wm * wn)
    wn: int

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn


# --- geometry ---------------------------------------------------------------------------------

class _Plan:
    """Everything derived from (problem, config) that the checks and the emitter share."""

    def __init__(self, p: ChainProblem, c: ChainConfig):
        self.p, self.c = p, c
        t = c.threads
        self.a = _Tile("A", "a", p.a, "m", p.m, c.bm, p.k1, c.bk1, p.batch, t)
        # B's outer dimension is k2: its "n" origin is the chunk's first k2 (see _Emitter)
        self.b = _Tile("B", "b", p.b, "n", p.k2, c.bk2, p.k1, c.bk1, p.batch, t)
        self.cn = _Tile("C", "cn", p.c, "n", p.n, c.bn, p.k2, c.bk2, p.batch, t)
        # the H chunk: [m][k2] (k-major) for mma's ldmatrix, [k2][m] for simt's vector reads
        h_op = GemmOperand("emmy_h", p.a.ctype, 1, c.bm, "0") if c.inst == "simt" else \
            GemmOperand("emmy_h", p.a.ctype, c.bk2, 1, "0")
        self.h = _Tile("H", "h", h_op, "m", p.m, c.bm, p.k2, c.bk2, p.batch, t)

    @property
    def tiles_m(self) -> int:
        return _ceil_div(self.p.m, self.c.bm)

    @property
    def tiles_n(self) -> int:
        return _ceil_div(self.p.n, self.c.bn)

    @property
    def grid(self) -> int:
        return self.p.batch * self.tiles_m * self.tiles_n

    @property
    def wtm(self) -> int:
        return self.c.bm // self.c.wm

    @property
    def wtn1(self) -> int:          # the H chunk's warp tile: wtm x wtn1
        return self.c.bk2 // self.c.wn

    @property
    def wtn2(self) -> int:          # O's warp tile: wtm x wtn2
        return self.c.bn // self.c.wn

    @property
    def lanes1(self) -> _SimtLanes | None:
        return _simt_lanes(self.wtm, self.wtn1)

    @property
    def lanes2(self) -> _SimtLanes | None:
        return _simt_lanes(self.wtm, self.wtn2)

    @property
    def offsets(self) -> tuple[int, int, int, int]:
        """Element offsets of the A, B, H and C tiles in shared memory."""
        a = 0
        b = a + self.a.elems
        h = b + self.b.elems
        cn = h + self.h.elems
        return a, b, h, cn

    @property
    def elems(self) -> int:
        return self.offsets[3] + self.cn.elems

    @property
    def smem_bytes(self) -> int:
        return self.elems * self.a.itemsize


# --- what can be built ------------------------------------------------------------------------

def _shape_problems(p: ChainProblem, c: ChainConfig) -> list[str]:
    """Target-independent reasons (problem, config) cannot be built; empty when it can."""
    if c.inst not in INSTS:
        return [f"unknown instruction kind `{c.inst}` (simt or mma)"]
    out = []
    if min(p.m, p.k1, p.k2, p.n, p.batch) < 1:
        out.append(f"empty problem {p.batch} x {p.m} x {p.k1} x {p.k2} x {p.n}")
    if min(c.bm, c.bn, c.bk1, c.bk2, c.wm, c.wn) < 1:
        return out + ["tile sizes and warps must be positive"]
    types = {p.a.ctype, p.b.ctype, p.c.ctype}
    if len(types) > 1:
        out.append(f"A, B and C must have one element type, got {p.a.ctype}, {p.b.ctype} and "
                   f"{p.c.ctype}")
    if any(t not in STORAGE for t in types):
        out.append(f"unsupported element type among {sorted(types)}")
    if c.inst == "mma" and p.a.ctype not in MMA_FN:
        out.append(f"mma needs f16/bf16 operands, got {p.a.ctype}")
    if c.inst == "simt" and types != {"float"}:
        out.append(f"simt needs float operands, got {p.a.ctype}, {p.b.ctype} and {p.c.ctype}")
    if c.threads > 1024:
        out.append(f"{c.wm} x {c.wn} warps = {c.threads} threads > 1024 per block")
    if c.bm % c.wm or c.bn % c.wn or c.bk2 % c.wn:
        out.append(f"block tile {c.bm}x{c.bn} (H chunk {c.bm}x{c.bk2}) does not split into "
                   f"{c.wm} x {c.wn} warps")
        return out
    plan = _Plan(p, c)
    wtm, wtn1, wtn2 = plan.wtm, plan.wtn1, plan.wtn2
    if c.inst == "mma":
        if wtm % 16 or wtn1 % 8 or wtn2 % 8:
            out.append(f"warp tiles {wtm}x{wtn1} (H) and {wtm}x{wtn2} (O) are not multiples of "
                       "the 16x8 mma atom")
        if c.bk1 % MMA_K or c.bk2 % MMA_K:
            out.append(f"bk1={c.bk1} and bk2={c.bk2} must be multiples of the mma's k step "
                       f"{MMA_K}")
        acc = (wtm * wtn1 + wtm * wtn2) // 32
        if acc > MAX_MMA_ACCUMULATORS:
            out.append(f"warp tiles {wtm}x{wtn1} (H) + {wtm}x{wtn2} (O) need {acc} f32 "
                       f"accumulators per thread > {MAX_MMA_ACCUMULATORS} (register pressure)")
    else:
        l1, l2 = plan.lanes1, plan.lanes2
        if l1 is None or l2 is None:
            out.append(f"warp tiles {wtm}x{wtn1} (H) and {wtm}x{wtn2} (O) do not split over "
                       "32 lanes")
        elif l1.tm * l1.tn + l2.tm * l2.tn > MAX_SIMT_ACCUMULATORS:
            out.append(f"micro-tiles {l1.tm}x{l1.tn} (H) + {l2.tm}x{l2.tn} (O) per thread > "
                       f"{MAX_SIMT_ACCUMULATORS} accumulators (register pressure)")
        if c.bm % 4 or c.bn % 4 or c.bk1 % SIMT_K_STEP or c.bk2 % SIMT_K_STEP:
            out.append(f"simt tiles must be multiples of 4 floats (16 bytes), got bm {c.bm}, "
                       f"bn {c.bn}, bk1 {c.bk1}, bk2 {c.bk2}")
    acc = _accumulators(plan)
    budget = min(MAX_REGISTERS, REGISTER_FILE // c.threads)
    if acc is not None and acc + OTHER_REGISTERS > budget:
        out.append(f"{acc} accumulators + ~{OTHER_REGISTERS} other registers per thread > "
                   f"{budget} registers a thread may have in a block of {c.threads} threads")
    if plan.grid > MAX_GRID:
        out.append(f"grid of {plan.grid} blocks > {MAX_GRID}")
    return out


def _accumulators(plan: _Plan) -> int | None:
    """f32 accumulators per thread (H chunk and O together); None when the tiles do not fit."""
    if plan.c.inst == "mma":
        return (plan.wtm * plan.wtn1 + plan.wtm * plan.wtn2) // 32
    l1, l2 = plan.lanes1, plan.lanes2
    return None if l1 is None or l2 is None else l1.tm * l1.tn + l2.tm * l2.tn


def constraints(problem: ChainProblem, config: ChainConfig, target_name: str) -> list[str]:
    """Plain-English reasons `config` cannot be built for `problem` on `target_name`; empty
    when it can (and then the kernel is correct for every input)."""
    out = _shape_problems(problem, config)
    target, missing = target_problems(config.inst, config.threads, 1, target_name)
    out += missing
    if out:
        return out
    plan = _Plan(problem, config)
    limit = target.shared_per_block_optin
    if plan.smem_bytes > limit:
        out.append(f"shared memory {_kib(plan.smem_bytes)} (A, B, H chunk and C tiles) > "
                   f"{_kib(limit)} per block on {target_name}")
    return out


def smem_bytes(problem: ChainProblem, config: ChainConfig) -> int:
    """Dynamic shared memory of chain_body's kernel: the padded A, B, H-chunk and C tiles."""
    return _Plan(problem, config).smem_bytes


# --- emission ---------------------------------------------------------------------------------

def _block(lines: list[str]) -> list[str]:
    return ["{", *_indent(lines), "}"]


class _ChainEmitter:
    def __init__(self, p: ChainProblem, c: ChainConfig, mid: Mid, epilogue: Epilogue):
        self.p, self.c, self.mid, self.epilogue = p, c, mid, epilogue
        self.plan = _Plan(p, c)

    # copies reuse gemm.py's (they read only the tile they are given)
    def setup(self, t: _Tile) -> list[str]:
        return _Emitter.copy_setup(None, t)          # type: ignore[arg-type]

    def copy(self, t: _Tile, kt: str, dst: str) -> list[str]:
        return _Emitter.copy(None, t, kt, dst, False)  # type: ignore[arg-type]

    def h_value(self, var: str, row: str, col: str, acc: str) -> list[str]:
        """`float var` = mid of H at local (row, col) of the chunk; 0 outside the matrix."""
        p, c = self.p, self.c
        stmts, expr = self.mid("bz", "ch_row", "ch_col", acc)
        conds = ([f"ch_row < {p.m}"] if p.m % c.bm else []) + \
                ([f"ch_col < {p.k2}"] if p.k2 % c.bk2 else [])
        inner = [*stmts, f"{var} = {expr};"]
        if conds:
            inner = [f"if ({' && '.join(conds)}) {{", *_indent(inner), "}"]
        return [f"float {var} = 0.0f;",
                *_block([f"const int ch_row = gm_m0 + ({row}), ch_col = ch_k0 + ({col});",
                         *inner])]

    def store(self, row: str, col: str, acc: str) -> list[str]:
        p, c = self.p, self.c
        stmts = list(self.epilogue("bz", row, col, acc))
        conds = ([f"{row} < {p.m}"] if p.m % c.bm else []) + \
                ([f"{col} < {p.n}"] if p.n % c.bn else [])
        if not conds:
            return stmts
        return [f"if ({' && '.join(conds)}) {{", *_indent(stmts), "}"]

    # --- simt ---------------------------------------------------------------------------------

    @staticmethod
    def simt_frag(t: _Tile, ptr: str, arr: str, base: str, count: int, v: int,
                  stride: int) -> list[str]:
        """arr[q][e] = 4 k steps (from gm_kk) of this thread's `count` rows (columns) of t."""
        if not t.k_major:   # shared [k][outer]: vectors along the outer dimension
            outs = ", ".join(f"{arr}[gm_q][gm_g * {v} + {e}]" for e in range(v))
            return _unrolled("gm_q", SIMT_K_STEP, _unrolled("gm_g", count // v, [
                f"em_vload({ptr} + (gm_kk + gm_q) * {t.ld} + {base} + gm_g * {stride}, {outs});"]))
        outs = ", ".join(f"{arr}[{q}][gm_e]" for q in range(SIMT_K_STEP))
        return _unrolled("gm_e", count, [       # shared [outer][k]: vectors along k
            f"em_vload({ptr} + ({base} + gm_e / {v} * {stride} + gm_e % {v}) * {t.ld} + gm_kk, "
            f"{outs});"])

    def simt_lane_origin(self, ln: _SimtLanes, wtn: int, pre: str) -> list[str]:
        c, plan = self.c, self.plan
        return [f"// lanes {ln.lm} x {ln.ln}; micro-tile {ln.tm} x {ln.tn}",
                f"const int {pre}_am = gm_warp / {c.wn} * {plan.wtm} + gm_lane / {ln.ln} * "
                f"{ln.vm};",
                f"const int {pre}_bn = gm_warp % {c.wn} * {wtn} + gm_lane % {ln.ln} * {ln.vn};"]

    def simt_product(self, ln: _SimtLanes, pre: str, at: _Tile, a_ptr: str, bt: _Tile,
                     b_ptr: str, bk: int, acc: str) -> list[str]:
        tm, tn, vm, vn = ln.tm, ln.tn, ln.vm, ln.vn
        sm, sn = ln.lm * vm, ln.ln * vn
        return ["#pragma unroll",
                f"for (int gm_kk = 0; gm_kk < {bk}; gm_kk += {SIMT_K_STEP}) {{",
                f"  float gm_af[{SIMT_K_STEP}][{tm}], gm_bf[{SIMT_K_STEP}][{tn}];",
                *_indent(self.simt_frag(at, a_ptr, "gm_af", f"{pre}_am", tm, vm, sm)),
                *_indent(self.simt_frag(bt, b_ptr, "gm_bf", f"{pre}_bn", tn, vn, sn)),
                *_indent(_unrolled("gm_q", SIMT_K_STEP, _unrolled("gm_i", tm, _unrolled(
                    "gm_j", tn, [f"{acc}[gm_i][gm_j] = fmaf(gm_af[gm_q][gm_i], gm_bf[gm_q][gm_j], "
                                 f"{acc}[gm_i][gm_j]);"])))),
                "}"]

    @staticmethod
    def simt_at(ln: _SimtLanes, pre: str) -> tuple[str, str]:
        """Local (row, column) of micro-tile element (gm_i, gm_j)."""
        sm, sn = ln.lm * ln.vm, ln.ln * ln.vn
        return (f"{pre}_am + gm_i / {ln.vm} * {sm} + gm_i % {ln.vm}",
                f"{pre}_bn + gm_j / {ln.vn} * {sn} + gm_j % {ln.vn}")

    # --- mma ----------------------------------------------------------------------------------

    def mma_product(self, at: _Tile, a_ptr: str, bt: _Tile, b_ptr: str, wtn: int, bk: int,
                    acc: str) -> list[str]:
        """acc += (a tile @ b tile) over bk for this warp's wtm x wtn tile, by ldmatrix + mma."""
        plan, c = self.plan, self.c
        mi, nj = plan.wtm // 16, wtn // 8
        fake = SimpleNamespace(plan=SimpleNamespace(a=at, b=bt, wtm=plan.wtm, wtn=wtn))
        setup, fragments = _Emitter.ldmatrix_fragments(fake)   # type: ignore[arg-type]
        fn = MMA_FN[self.p.a.ctype]
        return [f"const gm_t* gm_as = {a_ptr};", f"const gm_t* gm_bs = {b_ptr};",
                f"const int gm_wm0 = gm_warp / {c.wn} * {plan.wtm}, gm_wn0 = gm_warp % {c.wn} * "
                f"{wtn};",
                *setup,
                *_unrolled("gm_ks", bk // MMA_K, [
                    f"unsigned gm_af[{mi}][4], gm_bf[{nj}][2];",
                    *fragments("gm_af", "gm_bf", "gm_ks"),
                    *_unrolled("gm_i", mi, _unrolled("gm_j", nj, [
                        f"{fn}({acc}[gm_i][gm_j], gm_af[gm_i], gm_bf[gm_j], {acc}[gm_i][gm_j]);"]))
                ])]

    # --- the whole body -----------------------------------------------------------------------

    def lines(self) -> list[str]:
        p, c, plan = self.p, self.c, self.plan
        a, b, h, cn = plan.a, plan.b, plan.h, plan.cn
        oa, ob, oh, oc = plan.offsets
        lay = {True: "k-major", False: "outer-major"}
        tiles = plan.tiles_m * plan.tiles_n
        k1_tiles, chunks = _ceil_div(p.k1, c.bk1), _ceil_div(p.k2, c.bk2)
        out = [f"// emmy chain ({c.inst}): O[{p.batch}] ({p.m} x {p.n}) = epilogue(mid(A ({p.m} "
               f"x {p.k1}) @ B ({p.k1} x {p.k2})) @ C ({p.k2} x {p.n})), {p.a.ctype}",
               f"// block {c.bm}x{c.bn}, bk1 {c.bk1}, H chunk {c.bm}x{c.bk2}, warps {c.wm}x{c.wn}",
               f"// shared A {lay[a.k_major]}, B {lay[b.k_major]}, H {lay[h.k_major]}, C "
               f"{lay[cn.k_major]}",
               f"using gm_t = {STORAGE[p.a.ctype]};   // element bits in global and shared memory",
               "gm_t* gm_smem = reinterpret_cast<gm_t*>(emmy_smem);",
               f"gm_t* ch_as = gm_smem + {oa};",
               f"gm_t* ch_bs = gm_smem + {ob};",
               f"gm_t* ch_hs = gm_smem + {oh};",
               f"gm_t* ch_cs = gm_smem + {oc};",
               f"const int gm_tile = (int)(bid % {tiles});",
               f"const long long bz = bid / {tiles};" if p.batch > 1 else
               "const long long bz = 0;",
               f"const int gm_m0 = gm_tile / {plan.tiles_n} * {c.bm}, gm_n0 = gm_tile % "
               f"{plan.tiles_n} * {c.bn};",
               "const int gm_lane = tid % 32, gm_warp = tid / 32;",
               *self.setup(a), *self.setup(cn)]
        simt = c.inst == "simt"
        if simt:
            l1, l2 = plan.lanes1, plan.lanes2
            assert l1 is not None and l2 is not None
            out += self.simt_lane_origin(l1, plan.wtn1, "ch1")
            out += self.simt_lane_origin(l2, plan.wtn2, "ch2")
            out.append(f"float ch_acc[{l2.tm}][{l2.tn}] = {{}};")
            acc1_decl = f"float ch_hacc[{l1.tm}][{l1.tn}] = {{}};"
        else:
            mi, nj1, nj2 = plan.wtm // 16, plan.wtn1 // 8, plan.wtn2 // 8
            out.append(f"float ch_acc[{mi}][{nj2}][4] = {{}};  // O: (16 x 8 atom i, j), c0..c3")
            acc1_decl = f"float ch_hacc[{mi}][{nj1}][4] = {{}};  // the H chunk"

        # product 1: the H chunk
        if simt:
            compute1 = self.simt_product(l1, "ch1", a, "ch_as", b, "ch_bs", c.bk1, "ch_hacc")
        else:
            compute1 = self.mma_product(a, "ch_as", b, "ch_bs", plan.wtn1, c.bk1, "ch_hacc")
        chunk = [f"const int ch_k0 = ch_j * {c.bk2};   // the chunk's first k2",
                 acc1_decl,
                 f"for (int ch_kt = 0; ch_kt < {k1_tiles}; ++ch_kt) {{",
                 "  if (ch_kt > 0) __syncthreads();",
                 *_indent(_block(self.copy(a, "ch_kt", "ch_as"))),
                 *_indent(_block(["const int gm_n0 = ch_k0;   // B's outer origin: the chunk",
                                  *self.setup(b), *self.copy(b, "ch_kt", "ch_bs")])),
                 "  __syncthreads();",
                 *_indent(_block(compute1)),
                 "}",
                 "// mid(H) into shared memory (0 outside the matrix); C's tile of the chunk"]
        # write H
        if simt:
            row, col = self.simt_at(l1, "ch1")
            chunk += _unrolled("gm_i", l1.tm, _unrolled("gm_j", l1.tn, [
                *self.h_value("ch_h", row, col, "ch_hacc[gm_i][gm_j]"),
                f"ch_hs[({col}) * {h.ld} + {row}] = ch_h;"]))
        else:
            pack = PACK[p.a.ctype]
            chunk += [f"const int ch_r0 = gm_warp / {c.wn} * {plan.wtm} + gm_lane / 4;",
                      f"const int ch_c0 = gm_warp % {c.wn} * {plan.wtn1} + 2 * (gm_lane % 4);"]
            chunk += _unrolled("gm_i", mi, _unrolled("gm_j", nj1, _unrolled("gm_q", 2, [
                "const int ch_r = ch_r0 + 16 * gm_i + 8 * gm_q, ch_c = ch_c0 + 8 * gm_j;",
                *self.h_value("ch_h0", "ch_r", "ch_c", "ch_hacc[gm_i][gm_j][2 * gm_q]"),
                *self.h_value("ch_h1", "ch_r", "ch_c + 1", "ch_hacc[gm_i][gm_j][2 * gm_q + 1]"),
                f"*reinterpret_cast<unsigned*>(ch_hs + ch_r * {h.ld} + ch_c) = "
                f"{pack}(ch_h0, ch_h1);"])))
        chunk += _block(self.copy(cn, "ch_j", "ch_cs"))
        chunk.append("__syncthreads();")
        # product 2: O += H chunk @ C tile
        if simt:
            chunk += _block(self.simt_product(l2, "ch2", h, "ch_hs", cn, "ch_cs", c.bk2,
                                              "ch_acc"))
        else:
            chunk += _block(self.mma_product(h, "ch_hs", cn, "ch_cs", plan.wtn2, c.bk2,
                                             "ch_acc"))
        out += [f"for (int ch_j = 0; ch_j < {chunks}; ++ch_j) {{", *_indent(chunk), "}"]

        # epilogue
        if simt:
            row, col = self.simt_at(l2, "ch2")
            out += _unrolled("gm_i", l2.tm, _unrolled("gm_j", l2.tn, [
                f"const int gm_row = gm_m0 + {row};", f"const int gm_col = gm_n0 + {col};",
                *self.store("gm_row", "gm_col", "ch_acc[gm_i][gm_j]")]))
        else:
            out += ["// accumulator c_r of atom (i, j): row 16i + lane/4 + 8(r/2), column 8j + "
                    "2(lane%4) + r%2",
                    f"const int gm_row0 = gm_m0 + gm_warp / {c.wn} * {plan.wtm} + gm_lane / 4;",
                    f"const int gm_col0 = gm_n0 + gm_warp % {c.wn} * {plan.wtn2} + "
                    "2 * (gm_lane % 4);"]
            out += fragment_stores(p, c, self.store, self.epilogue, "ch_acc", mi, nj2)
        return out


def chain_body(problem: ChainProblem, config: ChainConfig, mid: Mid, epilogue: Epilogue) -> Body:
    """The body of the kernel computing O = epilogue(mid(A @ B) @ C) tile by tile, H never in
    global memory. Raises ValueError for a configuration _shape_problems refuses."""
    problems = _shape_problems(problem, config)
    if problems:
        raise ValueError("cannot build this chain: " + "; ".join(problems))
    plan = _Plan(problem, config)
    lines = _ChainEmitter(problem, config, mid, epilogue).lines()
    return Body(tuple(lines), plan.grid, config.threads, plan.smem_bytes)
