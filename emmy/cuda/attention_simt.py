"""Fused attention forward for f32 q, k and v on CUDA cores (FlashAttention's algorithm, FMA
instead of mma): the same problem and interface as emmy.cuda.attention (mask, grouped k and v,
attn_mask bias; `store(bz, h, row, col, value)` once per output element), for programs that
compute attention in f32, which neither tensor-core template takes.

The kernel
- Grid and block order, shared Q, K and V tiles (rows padded by 16 bytes), their copies (16-byte
  cp.async, ragged rows zero-filled; one stage synchronous, two double-buffered), the causal
  block and warp skipping and where the -inf mask starts: as emmy.cuda.attention.
- Lanes: lane = 8 r + c. The 4 row groups r of a warp own TM query rows each (the warp 4 TM);
  the 8 key lanes c of a row group split each key block: lane c holds the scores of keys c + 8 n
  (n < TN = bkv / 8) and the output columns of 16-byte chunks c + 8 n (n < NC = ceil(d / 32)).
- S = Q K^T: per 4 dims, TM float4 reads of Q (one address per quarter-warp: a broadcast) and
  TN of K (8 rows a quarter-warp, 16 bytes apart in banks: conflict-free), TM TN 4 FMAs.
- Online softmax in the log2 domain (as emmy.cuda.attention): a row's max over its 8 key lanes
  by 3 xor shuffles; P = exp2(S * scale * log2(e) - m) written to the warp's rows of a shared
  P tile (the warp alone reads them: __syncwarp), l kept per lane until the epilogue.
- O += P V: per 4 keys, TM float4 reads of P (broadcast) and 4 NC of V (8 consecutive chunks a
  quarter-warp), 16 TM NC FMAs.
- At the end out = O / l (NaN where l == 0, as the program computes it).

Registers: TM (4 NC + TN + 4) floats of state a thread (MAX_REGISTERS, MAX_REGISTERS_SM90). The
kernel is declared __launch_bounds__(threads, 1): with the thread count alone, ptxas held some of
them to 128 registers, 4 blocks of 128 threads an SM, and spilled 8-32 bytes to get there."""

from __future__ import annotations

from emmy.cuda.attention import (LOG2E, AttentionConfig, AttentionProblem, Store, _Emitter,
                                 _float, _indent, _qblocks, bias_scores, mask_keys,
                                 operand_refusals, round_scores, shared_refusals,
                                 split_refusals)
from emmy.cuda.gemm_spec import Body

PAD = 4                  # floats added to each shared tile row (16 bytes)
MAX_D = 256
KEY_LANES = 8            # lanes sharing a row group's keys (and its output columns)
MAX_ROWS = 8             # query rows a thread owns
# Per-thread f32 state allowed (O, S and the P values of 4 keys): d 128 with 4 rows a thread
# and 32 keys a step holds 96, with 8 rows 192. Every legal configuration of d 32..256 (the rows
# of the schedule space) compiles for sm_80 and sm_90a without spills (test_attention_simt,
# marked slow). Above 160 ptxas is at its 255 registers and some spill 4-176 bytes (NVRTC 13.0,
# 2026-11-30): at 64 keys a step, where d is not a multiple of 32, and d 128 with 8 rows a
# thread on sm_80; that one compiles without spills on sm_90a, where the limit is
# MAX_REGISTERS_SM90 at 32 keys a step and d a multiple of 32 (8 rows a thread halve the
# shared-memory reads per FMA, which the cost model says bound the kernel).
MAX_REGISTERS = 160
MAX_REGISTERS_SM90 = 192


def _layout(p: AttentionProblem, c: AttentionConfig) -> tuple[int, int, int]:
    """(TM, TN, NC): query rows, keys of a key block and 16-byte output chunks a thread owns."""
    return c.bq // (4 * c.warps), c.bkv // KEY_LANES, -(-p.d // (4 * KEY_LANES))


def smem_bytes(p: AttentionProblem, c: AttentionConfig) -> int:
    """Q, `stages` K and V tiles (rows of d + PAD floats) and the P tile (bq x (bkv + PAD))."""
    return ((c.bq + 2 * c.stages * c.bkv) * (p.d + PAD) + c.bq * (c.bkv + PAD)) * 4


def state_registers(p: AttentionProblem, c: AttentionConfig) -> int:
    tm, tn, nc = _layout(p, c)
    return tm * (4 * nc + tn + 4)


def constraints_simt(problem: AttentionProblem, config: AttentionConfig,
                     target_name: str) -> list[str]:
    """Plain-English reasons `config` cannot be built for `problem` on the target (empty: OK)."""
    p, c = problem, config
    why: list[str] = []
    if c.inst != "simt":
        why.append(f"this template runs on CUDA cores (inst 'simt'); inst {c.inst!r} is a "
                   f"tensor-core template's")
    why += operand_refusals(p, ("float",))
    if p.dv != p.d:
        why.append(f"q . k over {p.d} and v over {p.dv}: this template reads q, k and v at one "
                   f"head dimension (flash:BQxBKV, on f16/bf16, takes two)")
    if p.d % 4 or not 4 <= p.d <= MAX_D:
        why.append(f"head dimension {p.d} is not a multiple of 4 in 4..{MAX_D} (float4 rows)")
    if c.warps < 1 or c.warps > 32:
        why.append(f"{c.warps} warps: a block has 1 to 32")
    elif c.bq % (4 * c.warps) or not 1 <= c.bq // (4 * c.warps) <= MAX_ROWS:
        why.append(f"bq {c.bq} over {c.warps} warps: each warp's 4 row groups own 1 to "
                   f"{MAX_ROWS} query rows each, so bq is 4 x warps x (1..{MAX_ROWS})")
    if c.bkv < KEY_LANES or c.bkv % KEY_LANES:
        why.append(f"bkv {c.bkv} is not a positive multiple of {KEY_LANES} (the key lanes)")
    if c.stages not in (1, 2):
        why.append(f"stages {c.stages}: the template has 1 (synchronous) or 2 (double buffer)")
    if why:
        return why
    if 32 * c.warps < p.d // 4:
        why.append(f"{32 * c.warps} threads copy a tile row of {p.d // 4} 16-byte chunks: use "
                   f"at least {p.d // 128} warps")
    why += split_refusals(p, c.bkv, c.splits)
    why += shared_refusals(smem_bytes(p, c), target_name)
    wide = target_name == "sm_90a" and c.bkv <= 32 and p.d % 32 == 0
    limit = MAX_REGISTERS_SM90 if wide else MAX_REGISTERS
    if (regs := state_registers(p, c)) > limit:
        why.append(f"each thread would hold {regs} f32 values (O, S and P for its rows), over "
                   f"the {limit} that leave room in 255 registers for the rest"
                   + ("" if wide else f" (on sm_90a {MAX_REGISTERS_SM90} at up to 32 keys a "
                                      f"step, d a multiple of 32)"))
    return why


def attention_simt_body(problem: AttentionProblem, config: AttentionConfig, store: Store) -> Body:
    """The kernel body (see the module docstring) and its launch: grid, threads, smem bytes."""
    if why := constraints_simt(problem, config, "sm_90a"):
        raise ValueError("attention config cannot be built: " + "; ".join(why))
    return Body(lines=tuple(_SimtEmitter(problem, config).lines(store)),
                grid=problem.batch * problem.heads * _qblocks(problem, config) * config.splits,
                threads=config.threads, smem_bytes=smem_bytes(problem, config), min_blocks=1)


class _SimtEmitter(_Emitter):
    vec = 4
    pad = PAD
    warp_rows = "FA_TM * 4"

    # the thread's query row m: in the block, and in the sequence
    ROW = "fa_w0 + fa_r * FA_TM + m"
    SEQ_ROW = "fa_wq0 + fa_r * FA_TM + m"

    def layout_constants(self) -> list[str]:
        tm, tn, nc = _layout(self.p, self.c)
        return [f"constexpr int FA_TM = {tm}, FA_TN = {tn};   // query rows, keys a thread owns",
                f"constexpr int FA_NC = {nc}, FA_D4 = {self.p.d // 4};   // its 16-byte output "
                f"chunks; chunks a row",
                f"constexpr int FA_PP = {self.c.bkv + PAD};   // the P tile's row pitch"]

    def lane_roles(self) -> list[str]:
        return ["const int fa_r = fa_lane / 8, fa_c = fa_lane % 8;   // row group, key lane"]

    def more_tiles(self, start: str) -> list[str]:
        return [f"float* const fa_ps = {start};   // [bq][FA_PP]: P, each warp its own rows"]

    def state(self) -> list[str]:
        return [
            "float fa_m[FA_TM], fa_l[FA_TM];   // running max (log2 domain), this lane's sum",
            "float fa_o[FA_TM][FA_NC][4];",
            "#pragma unroll",
            "for (int m = 0; m < FA_TM; ++m) {",
            "  fa_m[m] = -EMMY_INF_F32;",
            "  fa_l[m] = 0.f;",
            "  #pragma unroll",
            "  for (int n = 0; n < FA_NC; ++n) "
            "fa_o[m][n][0] = fa_o[m][n][1] = fa_o[m][n][2] = fa_o[m][n][3] = 0.f;",
            "}",
        ]

    def scores(self) -> list[str]:
        return [
            "float fa_s[FA_TM][FA_TN];",
            "#pragma unroll",
            "for (int m = 0; m < FA_TM; ++m)",
            "  #pragma unroll",
            "  for (int n = 0; n < FA_TN; ++n) fa_s[m][n] = 0.f;",
            "#pragma unroll",
            "for (int kk = 0; kk < FA_D4; ++kk) {",
            "  float4 fa_a[FA_TM], fa_b[FA_TN];",
            "  #pragma unroll",
            "  for (int m = 0; m < FA_TM; ++m)",
            f"    fa_a[m] = *reinterpret_cast<const float4*>(fa_qs + ({self.ROW}) * FA_P"
            " + kk * 4);",
            "  #pragma unroll",
            "  for (int n = 0; n < FA_TN; ++n)",
            "    fa_b[n] = *reinterpret_cast<const float4*>(fa_kt + (fa_c + n * 8) * FA_P"
            " + kk * 4);",
            "  #pragma unroll",
            "  for (int m = 0; m < FA_TM; ++m)",
            "    #pragma unroll",
            "    for (int n = 0; n < FA_TN; ++n) {",
            "      fa_s[m][n] = fmaf(fa_a[m].x, fa_b[n].x, fa_s[m][n]);",
            "      fa_s[m][n] = fmaf(fa_a[m].y, fa_b[n].y, fa_s[m][n]);",
            "      fa_s[m][n] = fmaf(fa_a[m].z, fa_b[n].z, fa_s[m][n]);",
            "      fa_s[m][n] = fmaf(fa_a[m].w, fa_b[n].w, fa_s[m][n]);",
            "    }",
            "}",
        ]

    def mask(self) -> list[str]:
        """As emmy.cuda.attention's: the scale first where the softmax cannot take it, the
        bias, then -inf from key block fa_kmask on for keys past sk and, when causal, after the
        query. Element (m, n) is query row fa_r TM + m of the warp, key c + 8 n of the block."""
        loops = ["for (int m = 0; m < FA_TM; ++m)", "for (int n = 0; n < FA_TN; ++n)"]
        lines = round_scores(self.p, "fa_s[m][n]", loops)
        if self.p.scaled_first:
            lines += ["#pragma unroll", loops[0], "  #pragma unroll",
                      "  " + loops[1] + f" fa_s[m][n] *= {_float(self.p.scale * LOG2E)};"]
        lines += bias_scores(self.p, "fa", "fa_s[m][n]", loops, self.SEQ_ROW,
                             "kb * FA_BKV + fa_c + n * 8")
        return lines + mask_keys(self.p, self.c.bkv, "fa", "kb", "fa_s[m][n]", loops, [
            "// this lane's first key in the block, and that key minus the lane's first row",
            "const int fa_kl = kb * FA_BKV + fa_c, fa_kq = fa_kl - (fa_wq0 + fa_r * FA_TM);"],
            "n * 8", "m")

    def softmax(self) -> list[str]:
        """Per row: the new max over the row group's 8 key lanes, alpha = exp2(m_old - m_new)
        rescales l and O, P = exp2(S * FA_C - m_new) into the shared P tile, l += this lane's
        part of the row sum. A row with no visible key yet subtracts 0 (no inf - inf)."""
        return [
            "#pragma unroll",
            "for (int m = 0; m < FA_TM; ++m) {",
            "  float fa_mx = -EMMY_INF_F32;",
            "  #pragma unroll",
            "  for (int n = 0; n < FA_TN; ++n) fa_mx = fmaxf(fa_mx, fa_s[m][n]);",
            "  fa_mx = fmaxf(fa_mx, __shfl_xor_sync(0xffffffffu, fa_mx, 1));",
            "  fa_mx = fmaxf(fa_mx, __shfl_xor_sync(0xffffffffu, fa_mx, 2));",
            "  fa_mx = fmaxf(fa_mx, __shfl_xor_sync(0xffffffffu, fa_mx, 4));",
            "  const float fa_new = fmaxf(fa_m[m], fa_mx * FA_C);",
            "  const float fa_base = fa_new == -EMMY_INF_F32 ? 0.f : fa_new;",
            "  const float fa_alpha = ex2_approx(fa_m[m] - fa_base);",
            "  fa_m[m] = fa_new;",
            "  float fa_sum = 0.f;",
            "  #pragma unroll",
            "  for (int n = 0; n < FA_TN; ++n) {",
            "    const float fa_p = ex2_approx(fmaf(fa_s[m][n], FA_C, -fa_base));",
            "    fa_sum += fa_p;",
            f"    fa_ps[({self.ROW}) * FA_PP + fa_c + n * 8] = fa_p;",
            "  }",
            "  fa_l[m] = fa_l[m] * fa_alpha + fa_sum;",
            "  #pragma unroll",
            "  for (int n = 0; n < FA_NC; ++n) {",
            "    fa_o[m][n][0] *= fa_alpha;",
            "    fa_o[m][n][1] *= fa_alpha;",
            "    fa_o[m][n][2] *= fa_alpha;",
            "    fa_o[m][n][3] *= fa_alpha;",
            "  }",
            "}",
            "__syncwarp();   // the row group's P, written by its 8 lanes, is read by each",
        ]

    def pv(self) -> list[str]:
        """O += P V, 4 keys at a time: the rows' P as float4 (one address a quarter-warp), then
        per key this lane's 16-byte chunks of V's row. Where d is not a multiple of 32 the last
        chunk exists only in some lanes."""
        ragged = (self.p.d // 4) % KEY_LANES != 0
        chunk = "fa_c + n * 8"
        fma = [f"const float4 fa_v = *reinterpret_cast<const float4*>(fa_vt + (j4 * 4 + j) * "
               f"FA_P + ({chunk}) * 4);",
               "#pragma unroll",
               "for (int m = 0; m < FA_TM; ++m) {",
               "  fa_o[m][n][0] = fmaf(fa_pr[m][j], fa_v.x, fa_o[m][n][0]);",
               "  fa_o[m][n][1] = fmaf(fa_pr[m][j], fa_v.y, fa_o[m][n][1]);",
               "  fa_o[m][n][2] = fmaf(fa_pr[m][j], fa_v.z, fa_o[m][n][2]);",
               "  fa_o[m][n][3] = fmaf(fa_pr[m][j], fa_v.w, fa_o[m][n][3]);",
               "}"]
        if ragged:
            fma = [f"if (n < FA_NC - 1 || {chunk} < FA_D4) {{", *_indent(fma, 1), "}"]
        return [
            "#pragma unroll",
            "for (int j4 = 0; j4 < FA_BKV / 4; ++j4) {",
            "  float fa_pr[FA_TM][4];",
            "  #pragma unroll",
            "  for (int m = 0; m < FA_TM; ++m) {",
            f"    const float4 fa_p4 = *reinterpret_cast<const float4*>(fa_ps + ({self.ROW}) * "
            f"FA_PP + j4 * 4);",
            "    fa_pr[m][0] = fa_p4.x;",
            "    fa_pr[m][1] = fa_p4.y;",
            "    fa_pr[m][2] = fa_p4.z;",
            "    fa_pr[m][3] = fa_p4.w;",
            "  }",
            "  #pragma unroll",
            "  for (int j = 0; j < 4; ++j)",
            "    #pragma unroll",
            "    for (int n = 0; n < FA_NC; ++n) {",
            *_indent(fma, 3),
            "    }",
            "}",
        ]

    def epilogue(self, store: Store, partial: bool = False) -> list[str]:
        """Each row's l summed over its 8 key lanes, then out = O / l (NaN where l == 0, as the
        program gives) through `store` for the rows inside sq and the columns inside d.
        `partial`: split-KV's (emmy.cuda.attention's partial_epilogue)."""
        stmts = store("fa_bz", "fa_h", "fa_row", "fa_col", "fa_val")
        inv, *lse = self.row_total("fa_row", "fa_c == 0", "fa_m[m]", partial)
        return [
            "#pragma unroll",
            "for (int m = 0; m < FA_TM; ++m) {",
            "  float fa_sum = fa_l[m];",
            "  fa_sum += __shfl_xor_sync(0xffffffffu, fa_sum, 1);",
            "  fa_sum += __shfl_xor_sync(0xffffffffu, fa_sum, 2);",
            "  fa_sum += __shfl_xor_sync(0xffffffffu, fa_sum, 4);",
            f"  const float fa_inv = {inv}",
            f"  const int fa_row = {self.SEQ_ROW};",
            *("  " + line for line in lse),
            "  #pragma unroll",
            "  for (int n = 0; n < FA_NC; ++n)",
            "    #pragma unroll",
            "    for (int e = 0; e < 4; ++e) {",
            "      const int fa_col = (fa_c + n * 8) * 4 + e;",
            "      const float fa_val = fa_o[m][n][e] * fa_inv;",
            "      if (fa_row < FA_SQ && fa_col < FA_D) {",
            *["        " + s for s in stmts],
            "      }",
            "    }",
            "}",
        ]
