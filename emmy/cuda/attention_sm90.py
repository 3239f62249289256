"""Fused attention forward on Hopper's warpgroup mma (sm_90a), FlashAttention-3 style core.

out[bz, h, i, :] = sum_j softmax_j(q[bz, h, i, :] . k[bz, h/g, j, :] * scale + mask[i, j]) v[bz, h/g, j, :]

(mask, g, rounded scores and attn_mask bias as emmy.cuda.attention). Same interface
as emmy.cuda.attention: the body is the inside of a kernel with `tid`, `bid`, the operands'
buffers and `emmy_smem` in scope; each output element goes through `store(bz, h, row, col,
value)`. Emitted sources must include HEADER (emmy_sm90.cuh) after emmy_kernel.cuh.

The kernel
- Grid and block order as emmy.cuda.attention: one block per (batch, head, query block of bq
  rows), a head's query blocks together, the longest (causal) first.
- A block has bq / 64 consumer warpgroups (128 threads each); warpgroup w owns query rows
  64w..64w+63 of the block. Every thread also copies (cp.async); there is no producer
  warpgroup.
- Shared memory (aligned to 1024, the period of the 128-byte swizzle) holds the Q tile and
  `stages` K and V tiles. Every tile of R rows x d (2-byte elements) is stored as d/64 blocks
  (one per 64 columns) of R rows x 128 bytes; the 16-byte chunk c of row r of a block lies at
  r * 128 + ((c ^ r % 8) << 4). That is the K-major 128-byte-swizzled layout for Q (A of
  S = Q K^T) and K (B of S, k = head dim), SBO = 1024, a k16 step 32 bytes further and the next
  64 of k in the next block; and for V, the B operand of O = P V with k = key and n = head
  dim contiguous, it is the MN-major layout: an atom column of bkv k-rows per 64 of n
  (LBO = bkv * 128), 8 k-rows per 1024 bytes (SBO), a k16 step 2048 bytes further.
- Per key block, each warpgroup: S (64 x bkv, f32 in registers, the wgmma D fragment: thread
  t, warp w = t/32 of the warpgroup, g = lane/4, q = lane%4 holds s[4i + 2h + c] = S[16w + g +
  8h][8i + 2q + c]) = Q K^T by d/16 wgmma m64n{bkv}k16 (both operands in shared memory);
  masks it (from the first block that crosses the warpgroup's diagonal, or the last one when
  sk is ragged); the online softmax in the log2 domain (row max over the quad, alpha =
  exp2(m_old - m_new) rescales l and O, P = exp2(S * scale * log2(e) - m_new)), P rounded to
  16 bits straight into the A registers of O += P V: for keys 16kk..16kk+15, register r is
  pack(s[8kk + 2r], s[8kk + 2r + 1]) (rows g, g + 8 for r even, odd; keys 2q, 2q + 8 for
  r < 2, >= 2: the layout the PTX ISA gives wgmma's register A fragment); then bkv/16 wgmma
  m64n{d}k16 with A in registers and V from shared memory. Each product is waited for at
  once (wgmma.wait_group 0); with two warpgroups one's softmax overlaps the other's wgmmas.
- Copies: 16-byte cp.async into the swizzled layout, rows past a ragged sq / sk zero-filled;
  stages == 2: key block kb + 1 is copied while kb is computed; each thread fences its
  landed copies into the async proxy (fence.proxy.async) before the barrier that hands them to
  the wgmmas.
- Causal: the block stops after the key block of its last query row; a warpgroup skips key
  blocks wholly above its 64 rows.

The overlapped schedule (config.overlap, row STAGE=async:2:overlap; FlashAttention-3's
intra-warpgroup pipelining, in its order; needs stages == 2)
- One S buffer; P of the block before stays in the A registers. Block 0: S_0 = Q K_0^T
  (waited for at once), its softmax, P_0. Then a step per key block kb = 1 .. nkb - 1:
    cp_async_wait<0> (K_kb and V_kb-1, copied a step before, have landed),
    fence.proxy.async, __syncthreads (every warpgroup is past S_kb-1 and P V_kb-2);
    copy K_kb+1 into K slot (kb + 1) & 1 and V_kb into V slot kb & 1; commit
    issue S_kb = Q K_kb^T, then O += P_kb-1 V_kb-1 (two wgmma groups)
    wgmma_wait<1>: S_kb done; mask, softmax part 1 (row max, alpha, P = exp2(..) in place
    of S_kb, l) while P V runs
    wgmma_wait<0>: P V done; O *= alpha, P_kb to 16 bits into the A registers
  and after the loop, once V of the last block has landed, its P V. Nothing is in flight
  across the loop's back edge and no wgmma is issued under a condition: either makes ptxas
  serialize every wgmma of the kernel (C7514 / C7517 / C7518; the first version, which issued
  S_kb+1 before the softmax of kb and let P V run on into the next step, drew them).
- The prologue copies {Q, K_0} and {K_1, V_0}; each copy has a step to land.
- Causal: every warpgroup computes the block's fw_nkb key blocks (a warpgroup-dependent count
  would put the wgmmas under a condition); the blocks wholly above a warpgroup's rows are
  masked to -inf and add nothing (at most one per query block, with bq 128 and bkv 64).
- Registers: O (d/2) + S (bkv/2) + P (bkv/4), as the plain loop: MAX_ACCUMULATORS. The
  key-block count is hidden from the compiler (an empty asm), which otherwise splits
  iterations apart for a constant count.

Warp specialization (config.tma, rows STAGE=tma:2 and tma:2:overlap; FlashAttention-3's
producer warpgroup)
- Threads 0..127 are a producer warpgroup, placed before the bq / 64 consumer warpgroups
  (consumer w is threads 128 (w + 1)..; same rows, descriptors and products as above). Thread
  0 alone issues every copy by TMA (cp.async.bulk.tensor.4d): 4-d tensor maps over q, k and v
  (head dim, sequence, head, batch; runtime-filled kernel parameters fw_tmap_{q,k,v}), boxes
  of 64 head-dim elements (128 bytes, the 128-byte swizzle) x bq or bkv rows, one box per 64
  columns into the layout above; rows past sq / sk read zeros (and count towards the bytes).
- mbarriers after the tiles: Q full; per slot s of the 2-stage ring K full, V full (count 1:
  the producer's arrive.expect_tx of the tile's bytes, then the copies' complete_tx) and K
  empty, V empty (count: the consumer warps; lane 0 of each warp arrives, after __syncwarp,
  once the wgmma.wait_group that ends the products reading the slot has returned). Key block
  kb uses slot kb & 1 in phase (kb / 2) & 1; the producer waits on the empty barrier's phase
  before ((kb / 2) & 1 ^ 1, complete on a new barrier) before it refills a slot, and loads
  K kb then V kb, so the consumers' S may start before V lands.
- Consumers wait on full barriers, never copy and never meet at __syncthreads. The plain loop
  releases K after S's wait and V after P V's. The overlapped one (config.overlap) follows
  FlashAttention-3's order instead of the cp.async form's: per step, S kb = Q K_kb^T and
  O += P_kb-1 V_kb-1 are issued together (one S buffer; P of the block before is already in
  the A registers), wait<1> ends S (K slot kb freed), the softmax of kb runs while P V does,
  wait<0> ends P V (V slot kb - 1 freed), then O *= alpha and P kb into the A registers.
  Block 0's S and softmax come before the loop and the last block's P V after it, so no wgmma
  is issued under a condition or left in flight across the back edge (either makes ptxas
  serialize every wgmma of the kernel: C7514 / C7517 / C7518).
- Causal: a warpgroup computes its fw_wnkb blocks (a count per warpgroup bounds a loop, which
  ptxas accepts; it only refuses wgmmas under a condition), then waits for and releases the
  blocks it skips, so every phase of an empty barrier sees every warp (and no arrival runs
  ahead into a later phase).
- Registers: two consumer warpgroups (384 threads) are declared __launch_bounds__(384, 1),
  168 registers each at entry; setmaxnreg gives the producer 40 and the consumers 232
  (TMA_REGISTERS), and ptxas allocates the consumers' code within 232 (d 256 with bkv 64
  reaches R224 without spills). That takes mbar_wait's timeout out of line
  (emmy_sm90.cuh): with its __trap() inline, ptxas held the consumers to the entry 168 and
  the overlapped d 128 / bkv 128 kernel spilled 248 bytes with every wgmma serialized (C7512).
  One consumer warpgroup (256 threads) has 255 at entry and no setmaxnreg.
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.cuda.attention import (DTYPES, LOG2E, AttentionConfig, AttentionProblem, Store, _float,
                                 _indent, _qblocks, bias_scores, mask_keys, operand_refusals,
                                 round_scores)
from emmy.cuda.gemm_spec import Body
from emmy.cuda.gemm_sm90 import TmaBody
from emmy.cuda.program import TensorMapSpec

HEADER = "emmy_sm90.cuh"
SMEM_LIMIT = 227 * 1024         # sm_90a's dynamic shared memory per block (opt-in)
ALIGN_SLACK = 1024              # room to align the tiles to the 1024-byte swizzle period
BQ = (64, 128)                  # 64 query rows per consumer warpgroup, one or two of them
BKV = (64, 128)                 # the N of the S wgmma (a shape emmy_sm90.cuh issues)
MAX_D = 256
PV_N = (64, 128, 256)           # the N (= d) of P V's register-A wgmma that emmy_sm90.cuh issues
# f32 accumulators per thread (O: d/2, S: bkv/2). d 128 with bkv 128 (128) compiles without
# spills; 160 (d 256, bkv 64) is the most allowed.
MAX_ACCUMULATORS = 160
# Warp specialization (config.tma): threads -> (producer, consumer) registers per thread for
# setmaxnreg. Two consumer warpgroups and the producer (384 threads) under
# __launch_bounds__(384, 1) start at 168 (65,536 / 384, rounded down to 8); the producer gives
# back to 40, the consumers take 232 (128 x 40 + 256 x 232 = 64,512 <= 65,536). One consumer
# warpgroup (256 threads) starts at 255 already: no setmaxnreg (as emmy.cuda.gemm_sm90).
TMA_REGISTERS = {384: (40, 232)}
TMA_BARRIERS = 9                # Q full; K full, V full, K empty, V empty per stage (2 stages)
TMA_MAX_STRIDE_BYTES = 1 << 40  # cuTensorMapEncodeTiled: global strides below 2^40 bytes
TMA_MAX_DIM = 1 << 32           # ... and dimensions up to 2^32 elements


@dataclass(frozen=True)
class WgmmaAttentionConfig(AttentionConfig):
    """AttentionConfig with this template's schedule options: overlap (STAGE=async:2:overlap)
    issues S of key block j + 1 before the softmax of block j; tma (STAGE=tma:2, tma:2:overlap)
    adds a producer warpgroup that loads Q, K and V by TMA (module docstring)."""
    inst: str = "wgmma"
    overlap: bool = False
    tma: bool = False


def overlapped(config: AttentionConfig) -> bool:
    return bool(getattr(config, "overlap", False))


def specialized(config: AttentionConfig) -> bool:
    """Warp-specialized: a TMA producer warpgroup (STAGE=tma:2...)."""
    return bool(getattr(config, "tma", False))


def block_threads(config: AttentionConfig) -> int:
    """The consumer warps, plus the producer warpgroup when specialized."""
    return 32 * config.warps + (128 if specialized(config) else 0)


def smem_bytes(problem: AttentionProblem, config: AttentionConfig) -> int:
    """The Q tile and `stages` K and V tiles (no padding: swizzled), plus alignment slack (and
    the mbarriers when specialized)."""
    rows = config.bq + 2 * config.stages * config.bkv
    return rows * problem.d * 2 + ALIGN_SLACK + (8 * TMA_BARRIERS if specialized(config) else 0)


def tma_refusals(p: AttentionProblem) -> list[str]:
    """What a 4-d tensor map (head dim, sequence, head, batch) of each operand cannot
    describe: a dimension of more than one index with stride 0 (broadcast: TMA strides are
    positive multiples of 16 bytes), strides of 2^40 bytes or more, extents over 2^32."""
    why: list[str] = []
    for name, op, seq in (("q", p.q, p.sq), ("k", p.k, p.sk), ("v", p.v, p.sk)):
        for axis, extent, stride in (("batch", p.batch, op.strides[0]),
                                     ("head", -(-p.heads // op.group), op.strides[1]),
                                     ("sequence", seq, op.strides[2])):
            if extent > 1 and stride <= 0:
                why.append(f"{name}'s {axis} stride is {stride} over {extent} indices: a TMA "
                           f"tensor map's strides are positive multiples of 16 bytes (a "
                           f"broadcast operand cannot be described)")
            elif 2 * stride >= TMA_MAX_STRIDE_BYTES:
                why.append(f"{name}'s {axis} stride {2 * stride} B is over the tensor map's "
                           f"2^40 bytes")
        if max(p.batch, p.heads, seq, p.d) > TMA_MAX_DIM:
            why.append(f"{name} has an extent over the tensor map's 2^32 elements")
    return why


def accumulator_registers(problem: AttentionProblem, config: AttentionConfig) -> int:
    """f32 accumulators per thread: O (d/2) and S (bkv/2), overlapped or not."""
    return problem.d // 2 + config.bkv // 2


def constraints_sm90(problem: AttentionProblem, config: AttentionConfig,
                     target_name: str) -> list[str]:
    """Plain-English reasons this template cannot run `problem` with `config` (empty: it can)."""
    p, c = problem, config
    why: list[str] = []
    if target_name != "sm_90a":
        why.append(f"wgmma attention needs the sm_90a target, not {target_name}")
    if c.splits != 1:
        why.append(f"{c.splits} splits: the wgmma template has no split-KV (flash: and simt: "
                   f"tiles do)")
    why += operand_refusals(p)
    if p.dv != p.d:
        why.append(f"q . k over {p.d} and v over {p.dv}: this template reads q, k and v at one "
                   f"head dimension (flash:BQxBKV takes two)")
    if p.d % 64 or not 64 <= p.d <= MAX_D:
        why.append(f"head dimension {p.d} is not a multiple of 64 in 64..{MAX_D} (whole "
                   f"128-byte swizzled rows; P V's wgmma has N = d)")
    elif p.d not in PV_N:
        why.append(f"head dimension {p.d}: P V's wgmma would have N = {p.d}; emmy_sm90.cuh "
                   f"issues N = 64, 128 or 256")
    if c.bq not in BQ:
        why.append(f"bq {c.bq}: 64 query rows per consumer warpgroup, 64 or 128")
    elif c.warps != c.bq // 16:
        why.append(f"bq {c.bq} takes {c.bq // 64} warpgroup(s) = {c.bq // 16} warps, not "
                   f"{c.warps}")
    if c.bkv not in BKV:
        why.append(f"bkv {c.bkv}: the S wgmma's N, 64 or 128")
    if specialized(c) and c.stages != 2:
        why.append(f"stages {c.stages}: the TMA producer fills a ring of 2 K/V stages")
    elif c.stages not in (1, 2):
        why.append(f"stages {c.stages}: 1 (synchronous) or 2 (cp.async double buffer)")
    elif overlapped(c) and c.stages != 2:
        why.append(f"the overlapped schedule issues S of key block j + 1 while block j's "
                   f"products still read their K/V slot: it needs the 2-stage cp.async ring, "
                   f"not {c.stages} stage(s)")
    if specialized(c):
        why += tma_refusals(p)
    if why:
        return why
    if (need := smem_bytes(p, c)) > SMEM_LIMIT:
        why.append(f"shared memory {need} B ({need / 1024:.1f} KiB) for Q and {c.stages} K/V "
                   f"stage(s) is over sm_90a's {SMEM_LIMIT // 1024} KiB per block")
    if (regs := accumulator_registers(p, c)) > MAX_ACCUMULATORS:
        why.append(f"each thread would hold {regs} f32 accumulators (O: d/2, S: bkv/2), over "
                   f"the {MAX_ACCUMULATORS} that leave room in 255 registers for P and the rest")
    return why


def attention_sm90_body(problem: AttentionProblem, config: AttentionConfig,
                        store: Store) -> Body:
    """The kernel body (see the module docstring) and its launch: grid, threads, smem bytes."""
    if why := constraints_sm90(problem, config, "sm_90a"):
        raise ValueError("wgmma attention config cannot be built: " + "; ".join(why))
    if specialized(config):
        threads = block_threads(config)
        return TmaBody(lines=tuple(_Emitter(problem, config).tma_lines(store)),
                       grid=problem.batch * problem.heads * _qblocks(problem, config),
                       threads=threads, smem_bytes=smem_bytes(problem, config),
                       tensor_maps=tensor_maps(problem, config),
                       min_blocks=1 if threads in TMA_REGISTERS else 0)
    return Body(lines=tuple(_Emitter(problem, config).lines(store)),
                grid=problem.batch * problem.heads * _qblocks(problem, config),
                threads=32 * config.warps, smem_bytes=smem_bytes(problem, config))


TMAPS = ("fw_tmap_q", "fw_tmap_k", "fw_tmap_v")


def tensor_maps(p: AttentionProblem, c: AttentionConfig) -> tuple[TensorMapSpec, ...]:
    """The 4-d tensor maps of q, k and v: (head dim, sequence, head, batch), boxes of 64
    head-dim elements (128 bytes: the 128-byte swizzle) by bq (q) or bkv (k, v) rows; rows past
    the sequence read zeros. A dimension of one index takes the stride the one below it spans
    (it is never stepped; TMA wants a positive multiple of 16 bytes)."""
    maps = []
    for tmap, op, seq, rows in zip(TMAPS, (p.q, p.k, p.v), (p.sq, p.sk, p.sk),
                                   (c.bq, c.bkv, c.bkv)):
        dims = (p.d, seq, -(-p.heads // op.group), p.batch)     # k, v: their own heads
        strides: list[int] = []
        below = 2 * p.d                          # bytes spanned by the head dimension
        for extent, stride in zip(dims[1:], (op.strides[2], op.strides[1], op.strides[0])):
            step = 2 * stride if extent > 1 else below
            strides.append(step)
            below = step * extent
        maps.append(TensorMapSpec(tmap, op.buffer, op.ctype, dims, tuple(strides),
                                  (64, rows, 1, 1), swizzle=1, offset=op.const))
    return tuple(maps)


class _Emitter:
    """Prints the body's C; names start with fw_ (no clash with buffers or the store's)."""

    def __init__(self, p: AttentionProblem, c: AttentionConfig):
        self.p, self.c = p, c
        self.t = p.q.ctype
        self.bf16 = "true" if self.t == "__nv_bfloat16" else "false"
        self.pack = DTYPES[self.t][1]
        self.threads = 32 * c.warps
        self.kv_bytes = c.bkv * p.d * 2
        self.overlap = overlapped(c)

    # --- warp specialization (STAGE=tma:2, tma:2:overlap) --------------------------------------

    def tma_lines(self, store: Store) -> list[str]:
        """The producer warpgroup (threads 0..127) and the consumers (module docstring)."""
        p, c = self.p, self.c
        qb = _qblocks(p, c)
        causal_blocks = self.visited_blocks()
        q_bytes = c.bq * p.d * 2
        regs = TMA_REGISTERS.get(block_threads(c))
        head = [
            f"// attention (wgmma, sm_90a, warp-specialized): {p.batch}x{p.heads} heads, sq "
            f"{p.sq}, sk {p.sk}, d {p.d}, {'causal' if p.causal else 'no mask'}; bq {c.bq} "
            f"({c.bq // 64} consumer warpgroup(s) after a TMA producer warpgroup), bkv {c.bkv}, "
            f"{c.stages} stages{'; the softmax of block j overlaps P V of block j - 1' if self.overlap else ''}",
            *self.constants(),
            "const int fw_wg = tid / 128 - 1;   // this consumer warpgroup (-1: the producer)",
            *self.block_ids(qb),
            f"{'' if self.overlap else 'const '}int fw_nkb = {causal_blocks};   // key blocks "
            f"this block visits",
            "// the tiles, aligned to the 1024-byte period of the 128-byte swizzle",
            "unsigned char* const fw_smem = emmy_smem + ((1024u - (sm90_smem_addr(emmy_smem) & "
            "1023u)) & 1023u);",
            f"constexpr unsigned FW_KOFF = {q_bytes}u, FW_VOFF = "
            f"{q_bytes + c.stages * self.kv_bytes}u, FW_KV = {self.kv_bytes}u;",
            "// mbarriers: [0] Q full; [1 + s] K full, [3 + s] V full (the producer's",
            "// arrive.expect_tx and the TMA bytes); [5 + s] K empty, [7 + s] V empty (one arrival",
            "// per consumer warp once the wgmmas reading slot s are done)",
            "uint64_t* const fw_bar = reinterpret_cast<uint64_t*>(fw_smem + FW_VOFF + "
            f"{c.stages} * FW_KV);",
            "if (tid == 0) {",
            "  for (int i = 0; i < 5; ++i) mbar_init(&fw_bar[i], 1);",
            f"  for (int i = 5; i < {TMA_BARRIERS}; ++i) mbar_init(&fw_bar[i], {c.warps});",
            "  mbar_init_fence();",
            "}",
            "__syncthreads();",
        ]
        give = [f"setmaxnreg_dec<{regs[0]}>();   // the producer needs few registers"] \
            if regs else []
        take = [f"setmaxnreg_inc<{regs[1]}>();   // the consumers hold the accumulators"] \
            if regs else []
        return [*head,
                "if (tid < 128) {   // the producer warpgroup",
                *_indent(give + self.tma_producer(), 1),
                "} else {           // the consumer warpgroups",
                *_indent(take + self.tma_consumer() + self.epilogue(store), 1),
                "}"]

    def tma_boxes(self, tmap: str, at: str, row0: str, rows: int, bar: str) -> list[str]:
        """The TMA copies of one tile (`rows` rows from `row0`) into fw_smem + `at`: one box of
        64 head-dim elements per 64 columns, block j at j * rows * 128 bytes."""
        op = {"fw_tmap_q": self.p.q, "fw_tmap_k": self.p.k, "fw_tmap_v": self.p.v}[tmap]
        return [f"tma_load_4d(fw_smem + {at}{f' + {j * rows * 128}u' if j else ''}, {tmap}, "
                f"{64 * j}, {row0}, {op.head('fw_h')}, int(fw_bz), {bar});"
                for j in range(self.p.d // 64)]

    def tma_producer(self) -> list[str]:
        """One thread: Q once, then K and V of each key block into slot kb & 1 once the
        consumers have released it (use kb / 2 of the slot waits on the empty barrier's
        phase (kb / 2 + 1) & 1: the phase before, which a new barrier counts as complete)."""
        c = self.c
        return [
            "if (tid == 0) {   // one thread issues every copy",
            *(f"  tma_map_acquire({t});   // the map as the host wrote it" for t in TMAPS),
            f"  mbar_arrive_expect_tx(&fw_bar[0], {c.bq * self.p.d * 2}u);",
            *_indent(self.tma_boxes("fw_tmap_q", "0u", "fw_q0", c.bq, "&fw_bar[0]"), 1),
            "  for (int kb = 0; kb < fw_nkb; ++kb) {",
            "    const int fw_st = kb & 1;",
            "    const unsigned fw_ph = unsigned(kb >> 1) & 1u, fw_at = unsigned(fw_st) * FW_KV;",
            "    mbar_wait(&fw_bar[5 + fw_st], fw_ph ^ 1u);   // every consumer warp is done "
            "with K kb - 2",
            "    mbar_arrive_expect_tx(&fw_bar[1 + fw_st], FW_KV);",
            *_indent(self.tma_boxes("fw_tmap_k", "FW_KOFF + fw_at", "kb * FW_BKV", c.bkv,
                                    "&fw_bar[1 + fw_st]"), 2),
            "    mbar_wait(&fw_bar[7 + fw_st], fw_ph ^ 1u);   // ... and with V kb - 2",
            "    mbar_arrive_expect_tx(&fw_bar[3 + fw_st], FW_KV);",
            *_indent(self.tma_boxes("fw_tmap_v", "FW_VOFF + fw_at", "kb * FW_BKV", c.bkv,
                                    "&fw_bar[3 + fw_st]"), 2),
            "  }",
            "}",
        ]

    @staticmethod
    def release(bar: str) -> list[str]:
        """This warp is done with a slot (its wgmmas reading it have completed): lane 0 arrives
        on the slot's empty barrier once the whole warp is past its wait."""
        return ["__syncwarp();", f"if (fw_lane == 0) mbar_arrive(&fw_bar[{bar}]);"]

    def tma_consumer(self) -> list[str]:
        """A consumer warpgroup: descriptors, accumulators, the key loop over the blocks it
        computes (fw_wnkb), then the blocks it skips (causal): it still waits for each and
        releases it, so that every phase of the empty barriers sees all consumer warps."""
        p = self.p
        wnkb = ("FW_CAUSAL && (fw_wq0 + 63) / FW_BKV + 1 < fw_nkb ? (fw_wq0 + 63) / FW_BKV + 1 "
                ": fw_nkb")
        out = [
            "const int fw_wq0 = fw_q0 + 64 * fw_wg;   // the warpgroup's first query row",
            "const int fw_rq0 = fw_wq0 + 16 * fw_warp + fw_g;   // this thread's row (and + 8)",
            # as the cp.async overlapped loop: a constant trip count lets nvcc split iterations
            *(['asm volatile("" : "+r"(fw_nkb));   // opaque: see the template'] if self.overlap
              else []),
            *self.first_masked(),
            "const unsigned fw_base = sm90_smem_addr(fw_smem);",
            *self.descriptors(),
            *self.online_state(),
            f"const int fw_wnkb = {wnkb if p.causal else 'fw_nkb'};   // key blocks this "
            f"warpgroup computes",
            "mbar_wait(&fw_bar[0], 0u);   // Q has landed",
        ]
        out += self.tma_overlap_loop() if self.overlap else self.tma_key_loop()
        if p.causal:
            out += ["// the key blocks above this warpgroup's rows: wait for each (so that no",
                    "// arrival runs ahead into a later phase) and release it",
                    "for (int kb = fw_wnkb; kb < fw_nkb; ++kb) {",
                    "  const unsigned fw_ph = unsigned(kb >> 1) & 1u;",
                    "  mbar_wait(&fw_bar[1 + (kb & 1)], fw_ph);",
                    *_indent(self.release("5 + (kb & 1)"), 1),
                    "  mbar_wait(&fw_bar[3 + (kb & 1)], fw_ph);",
                    *_indent(self.release("7 + (kb & 1)"), 1),
                    "}"]
        return out

    def tma_key_loop(self) -> list[str]:
        """Per key block: wait for K, S = Q K^T (waited for), release K; the mask and softmax;
        wait for V, O += P V (waited for), release V."""
        return [
            "for (int kb = 0; kb < fw_wnkb; ++kb) {",
            "  const int fw_st = kb & 1;",
            "  const unsigned fw_ph = unsigned(kb >> 1) & 1u;",
            "  const unsigned fw_stage = unsigned(fw_st) * FW_KV;",
            "  mbar_wait(&fw_bar[1 + fw_st], fw_ph);   // K kb has landed",
            *_indent(self.scores(), 1),
            *_indent(self.release("5 + fw_st"), 1),
            *_indent([*self.mask(), *self.softmax()], 1),
            "  mbar_wait(&fw_bar[3 + fw_st], fw_ph);   // V kb has landed",
            *_indent(self.pv(), 1),
            *_indent(self.release("7 + fw_st"), 1),
            "}",
        ]

    def tma_overlap_loop(self) -> list[str]:
        """FlashAttention-3's intra-warpgroup pipelining on the producer's barriers, in its
        order: S_kb = Q K_kb^T and O += P_kb-1 V_kb-1 are issued together, the softmax of S_kb
        runs while P V does, and both are waited for within the step, so no wgmma is in flight
        across the loop's back edge and none is issued under a condition (ptxas serializes the
        wgmmas of a kernel where either happens: C7514 / C7517 / C7518). Block 0's S and
        softmax come before the loop, the last block's P V after it. One S buffer."""
        body = [
            "const int fw_st = kb & 1, fw_pst = fw_st ^ 1;   // slots of kb and kb - 1",
            "const unsigned fw_ph = unsigned(kb >> 1) & 1u, fw_pph = unsigned((kb - 1) >> 1) & 1u;",
            "mbar_wait(&fw_bar[1 + fw_st], fw_ph);   // K kb has landed",
            *self.issue_scores("fw_s", "unsigned(fw_st) * FW_KV"),
            "mbar_wait(&fw_bar[3 + fw_pst], fw_pph);   // V kb - 1 has landed",
            *self.issue_pv("unsigned(fw_pst) * FW_KV"),
            "wgmma_wait<1>();   // S kb done (P V of kb - 1 may still run)",
            "wgmma_fence_acc(fw_s);",
            *self.release("5 + fw_st"),
            *self.mask("fw_s", "kb"),
            *self.softmax_exp("fw_s"),
            "wgmma_wait<0>();   // P V of kb - 1 done",
            *self.release("7 + fw_pst"),
            *self.softmax_apply("fw_s"),
        ]
        return [
            "float fw_s[FW_BKV / 2], fw_alpha[2];",
            "unsigned fw_p[FW_BKV / 16][4];",
            "mbar_wait(&fw_bar[1], 0u);   // K 0 has landed",
            *self.issue_scores("fw_s", "0u"),
            "wgmma_wait<0>();",
            "wgmma_fence_acc(fw_s);",
            *self.release("5"),
            *self.mask("fw_s", "0"),
            *self.softmax_exp("fw_s"),
            *self.softmax_apply("fw_s"),
            "#pragma unroll 1",
            "for (int kb = 1; kb < fw_wnkb; ++kb) {",
            *_indent(body, 1),
            "}",
            "{   // the last block's P V",
            "  const int fw_st = (fw_wnkb - 1) & 1;",
            "  mbar_wait(&fw_bar[3 + fw_st], unsigned((fw_wnkb - 1) >> 1) & 1u);   // V has "
            "landed",
            *_indent(self.issue_pv("unsigned(fw_st) * FW_KV"), 1),
            "  wgmma_wait<0>();",
            "  wgmma_fence_acc(fw_o);",
            "  #pragma unroll",
            "  for (int kk = 0; kk < FW_BKV / 16; ++kk) wgmma_fence_a(fw_p[kk]);",
            *_indent(self.release("7 + fw_st"), 1),
            "}",
        ]

    @staticmethod
    def visited_blocks() -> str:
        """The key blocks a block visits: all, or under the causal mask up to the block of its
        last query row in range."""
        last = "(fw_q0 + FW_BQ < FW_SQ ? fw_q0 + FW_BQ : FW_SQ) - 1"
        return (f"FW_CAUSAL && ({last}) / FW_BKV + 1 < FW_KBLOCKS ? "
                f"({last}) / FW_BKV + 1 : FW_KBLOCKS")

    def constants(self) -> list[str]:
        """The sizes and the softmax factor, as constexprs."""
        p, c = self.p, self.c
        return [
            f"constexpr int FW_SQ = {p.sq}, FW_D = {p.d};",
            *([f"constexpr int FW_SK = {p.sk};"] if p.sk % c.bkv else []),
            f"constexpr int FW_BQ = {c.bq}, FW_BKV = {c.bkv};",
            f"constexpr int FW_KBLOCKS = {-(-p.sk // c.bkv)};",
            f"constexpr bool FW_CAUSAL = {'true' if p.causal else 'false'};",
            "// the softmax exponent's factor: scale * log2(e), or 1 where S is scaled first",
            f"constexpr float FW_C = {'1.f' if p.scaled_first else _float(p.scale * LOG2E)};",
        ]

    def block_ids(self, qb: int) -> list[str]:
        """The thread's warp, lane and fragment position; the block's query block (the
        longest first), batch and head."""
        return [
            "const int fw_warp = tid % 128 / 32, fw_lane = tid % 32;",
            "const int fw_g = fw_lane / 4, fw_t = fw_lane % 4;   // D fragment row, column pair",
            f"const int fw_q0 = ({qb} - 1 - int(bid % {qb})) * FW_BQ;",
            f"const long long fw_bh = bid / {qb};",
            f"const long long fw_bz = fw_bh / {self.p.heads};",
            f"const int fw_h = int(fw_bh % {self.p.heads});",
        ]

    # --- the cp.async forms ----------------------------------------------------------------------

    def lines(self, store: Store) -> list[str]:
        if self.overlap:
            return [*self.prologue(), *self.overlap_loop(), *self.epilogue(store)]
        return [*self.prologue(), *self.key_loop(), *self.epilogue(store)]

    # --- setup ---------------------------------------------------------------------------------

    def prologue(self) -> list[str]:
        p, c = self.p, self.c
        qb = _qblocks(p, c)
        causal_blocks = self.visited_blocks()
        q_bytes = c.bq * p.d * 2
        out = [
            f"// attention (wgmma, sm_90a): {p.batch}x{p.heads} heads, sq {p.sq}, sk {p.sk}, "
            f"d {p.d}, {'causal' if p.causal else 'no mask'}; bq {c.bq} ({c.bq // 64} consumer "
            f"warpgroup(s)), bkv {c.bkv}, {c.stages} stage(s)"
            f"{'; the softmax of block j overlaps P V of block j - 1' if self.overlap else ''}",
            *self.constants(),
            "const int fw_wg = tid / 128;   // this consumer warpgroup: query rows 64 fw_wg..",
            *self.block_ids(qb),
            "const int fw_wq0 = fw_q0 + 64 * fw_wg;   // the warpgroup's first query row",
            "const int fw_rq0 = fw_wq0 + 16 * fw_warp + fw_g;   // this thread's row (and + 8)",
            f"{'' if self.overlap else 'const '}int fw_nkb = {causal_blocks};   // key blocks "
            f"this block visits",
            # with a constant trip count nvcc splits the overlapped loop's iterations apart and
            # runs out of registers (d 128, bkv 64: 255 and spills; opaque: 185, none)
            *(['asm volatile("" : "+r"(fw_nkb));   // opaque: see the template'] if self.overlap
              else []),
            *self.first_masked(),
            "// the tiles, aligned to the 1024-byte period of the 128-byte swizzle",
            "unsigned char* const fw_smem = emmy_smem + ((1024u - (sm90_smem_addr(emmy_smem) & "
            "1023u)) & 1023u);",
            "const unsigned fw_base = sm90_smem_addr(fw_smem);",
            f"constexpr unsigned FW_KOFF = {q_bytes}u, FW_VOFF = "
            f"{q_bytes + c.stages * self.kv_bytes}u, FW_KV = {self.kv_bytes}u;",
            *self.descriptors(),
            *self.copy_setup(),
            *self.load("0u", "q", "fw_q0", "FW_SQ" if p.sq % c.bq else None, c.bq),
        ]
        if self.overlap:
            return out + self.overlap_prologue()
        if c.stages == 2:
            out += self.load_kv("0", "0")
        out += [
            "cp_async_commit();",
            *self.online_state(),
        ]
        return out

    @staticmethod
    def online_state() -> list[str]:
        """The online softmax's running max and sum of this thread's two rows, and O = 0."""
        return [
            "float fw_m[2] = {-EMMY_INF_F32, -EMMY_INF_F32};   // rows fw_rq0, + 8 (log2 domain)",
            "float fw_l[2] = {0.f, 0.f};   // this thread's part of each row's sum",
            "float fw_o[FW_D / 2];",
            "#pragma unroll",
            "for (int i = 0; i < FW_D / 2; ++i) fw_o[i] = 0.f;",
        ]

    def descriptors(self) -> list[str]:
        """The wgmma descriptors of Q, K and V at k step 0 of stage 0 (fw_base: the tiles)."""
        return [
            "// descriptors at k step 0 of stage 0: Q (this warpgroup's 64 rows) and K K-major,",
            "// V N-contiguous (MN-major: an atom column of FW_BKV keys per 64 of d)",
            "const uint64_t fw_qdesc = wgmma_desc(fw_base + 8192u * fw_wg, 16u, 1024u, "
            "WGMMA_SWIZZLE_128B);",
            "const uint64_t fw_kdesc = wgmma_desc(fw_base + FW_KOFF, 16u, 1024u, "
            "WGMMA_SWIZZLE_128B);",
            f"const uint64_t fw_vdesc = wgmma_desc(fw_base + FW_VOFF, {self.c.bkv * 128}u, 1024u, "
            "WGMMA_SWIZZLE_128B);",
        ]

    def first_masked(self) -> list[str]:
        """fw_kmask: the first key block where this warpgroup needs a mask (as the mma.sync
        template's fa_kmask, for the warpgroup's first row)."""
        p, c = self.p, self.c
        ragged = p.sk % c.bkv != 0
        if p.causal and ragged:
            first = ("(fw_wq0 + 1) / FW_BKV < FW_KBLOCKS - 1 ? (fw_wq0 + 1) / FW_BKV : "
                     "FW_KBLOCKS - 1")
        elif p.causal:
            first = "(fw_wq0 + 1) / FW_BKV"
        elif ragged:
            first = "FW_KBLOCKS - 1"
        else:
            return []
        return [f"const int fw_kmask = {first};"]

    @property
    def chunks(self) -> int:
        """16-byte chunks in one tile row."""
        return self.p.d // 8

    @property
    def rows_per_pass(self) -> int:
        return self.threads // self.chunks

    def copy_setup(self) -> list[str]:
        """Thread tid copies chunk fw_ce of tile rows fw_cr + i * rows_per_pass; fw_{q,k,v}g
        point at its chunk of row 0 of the (batch, head)."""
        p = self.p
        out = [f"// copies: this thread's 16-byte chunk fw_ce of tile rows fw_cr + i * "
               f"{self.rows_per_pass}",
               f"const int fw_cr = tid / {self.chunks}, fw_ce = tid % {self.chunks};"]
        for name, op in (("q", p.q), ("k", p.k), ("v", p.v)):
            s = op.strides
            out.append(f"const {self.t}* const fw_{name}g = {op.buffer} + {op.const}LL + "
                       f"fw_bz * {s[0]}LL"
                       f" + {op.head('fw_h')} * {s[1]}LL + fw_cr * {s[2]}LL + fw_ce * 8;")
        if self.rows_per_pass % 8 == 0:
            out.append("const unsigned fw_sw = (unsigned(fw_ce % 8 ^ fw_cr % 8)) << 4;   "
                       "// the chunk's swizzled place in its row")
        return out

    def load(self, at: str, name: str, row0: str, limit: str | None, rows: int) -> list[str]:
        """cp.async of `rows` sequence rows from `row0` of operand `name` into the swizzled
        tile at byte `at` of fw_smem; rows at or past `limit` (None: all inside) zero-filled."""
        op = getattr(self.p, name)
        rpp = self.rows_per_pass
        passes = rows // rpp
        block = f"fw_ce / 8 * {rows * 128}u"
        if rpp % 8 == 0:
            dst = f"fw_smem + {at} + {block} + (fw_cr + fw_i * {rpp}) * 128u + fw_sw"
        else:
            dst = (f"fw_smem + {at} + {block} + (fw_cr + fw_i * {rpp}) * 128u + "
                   f"((unsigned(fw_ce % 8 ^ (fw_cr + fw_i * {rpp}) % 8)) << 4)")
        stride = op.strides[2]
        if limit is not None:
            copy = [f"const bool fw_in = {row0} + fw_cr + fw_i * {rpp} < {limit};",
                    f"cp_async_16_zfill({dst}, fw_{name}g + (fw_in ? {row0} + fw_i * {rpp} : "
                    f"-fw_cr) * {stride}LL, fw_in ? 16 : 0);"]
        else:
            copy = [f"cp_async_16({dst}, fw_{name}g + ({row0} + fw_i * {rpp}) * {stride}LL);"]
        return ["#pragma unroll", f"for (int fw_i = 0; fw_i < {passes}; ++fw_i) {{",
                *_indent(copy, 1), "}"]

    def load_kv(self, block: str, stage: str, which: str = "kv") -> list[str]:
        """K and / or V (`which`) of key block `block` into slot `stage` of their ring."""
        row0 = f"({block}) * FW_BKV"
        limit = "FW_SK" if self.p.sk % self.c.bkv else None
        out = []
        if "k" in which:
            out += self.load(f"FW_KOFF + ({stage}) * FW_KV", "k", row0, limit, self.c.bkv)
        if "v" in which:
            out += self.load(f"FW_VOFF + ({stage}) * FW_KV", "v", row0, limit, self.c.bkv)
        return out

    # --- the key loop --------------------------------------------------------------------------

    def key_loop(self) -> list[str]:
        c = self.c
        out = ["for (int kb = 0; kb < fw_nkb; ++kb) {"]
        if c.stages == 2:
            out += ["  // copy key block kb + 1 into the other buffer; wait for block kb",
                    "  if (kb + 1 < fw_nkb) {",
                    *_indent(self.load_kv("kb + 1", "(kb + 1) & 1"), 2),
                    "  }",
                    "  cp_async_commit();",
                    "  cp_async_wait<1>();",
                    "  const unsigned fw_stage = unsigned(kb & 1) * FW_KV;"]
        else:
            out += [*_indent(self.load_kv("kb", "0"), 1),
                    "  cp_async_commit();",
                    "  cp_async_wait<0>();",
                    "  const unsigned fw_stage = 0u;"]
        out += ["  fence_proxy_async_shared();   // this thread's copies, visible to wgmma",
                "  __syncthreads();              // ... and everyone's"]
        work = [*self.scores(), *self.mask(), *self.softmax(), *self.pv()]
        if self.p.causal:
            work = ["// skip a key block wholly above this warpgroup's rows (warpgroup-uniform)",
                    "if (kb * FW_BKV <= fw_wq0 + 63) {", *_indent(work, 1), "}"]
        out += [*_indent(work, 1),
                "  __syncthreads();   // every warpgroup is done with this buffer before it is "
                "refilled",
                "}"]
        return out

    def scores(self) -> list[str]:
        """S = Q K^T: d/16 wgmma m64n{bkv}k16; k step kk is byte 32 (kk % 4) of block kk / 4."""
        return ["float fw_s[FW_BKV / 2];", *self.issue_scores("fw_s", "fw_stage"),
                "wgmma_wait<0>();", "wgmma_fence_acc(fw_s);"]

    def issue_scores(self, s: str, stage: str) -> list[str]:
        """Issue and commit (one wgmma group) S = Q K^T into `s` from K slot byte `stage`."""
        c = self.c
        return [
            "wgmma_fence();",
            "#pragma unroll",
            "for (int kk = 0; kk < FW_D / 16; ++kk)",
            f"  wgmma_m64k16<FW_BKV, {self.bf16}, 0, 0>({s}, fw_qdesc + uint64_t((kk / 4 * "
            f"{c.bq * 128} + kk % 4 * 32) >> 4), fw_kdesc + uint64_t(({stage} + kk / 4 * "
            f"{c.bkv * 128} + kk % 4 * 32) >> 4), kk > 0);",
            "wgmma_commit();",
        ]

    def mask(self, s: str = "fw_s", kb: str = "kb") -> list[str]:
        """S rounded to 16 bits where the program rounds it; a scale <= 0 or a bias: S
        multiplied here (FW_C is then 1) and the bias added or the mask tensor applied. From
        block fw_kmask on, -inf for
        keys past sk and (causal) keys after the row; s[4i + 2h + c] is row fw_rq0 + 8h, key
        kb * bkv + 8i + 2 fw_t + c."""
        lines = round_scores(self.p, f"{s}[i]", ["for (int i = 0; i < FW_BKV / 2; ++i)"])
        lines += [] if not self.p.scaled_first else [
            "#pragma unroll",
            f"for (int i = 0; i < FW_BKV / 2; ++i) {s}[i] *= {_float(self.p.scale * LOG2E)};",
        ]
        loops = ["for (int i = 0; i < FW_BKV / 8; ++i)", "for (int e = 0; e < 4; ++e)"]
        lines += bias_scores(self.p, "fw", f"{s}[4 * i + e]", loops,
                             "fw_rq0 + e / 2 * 8", f"{kb} * FW_BKV + 8 * i + 2 * fw_t + e % 2")
        return lines + mask_keys(
            self.p, self.c.bkv, "fw", kb, f"{s}[4 * i + e]", loops,
            [f"const int fw_kl = {kb} * FW_BKV + 2 * fw_t, fw_kq = fw_kl - fw_rq0;"],
            "8 * i + e % 2", "e / 2 * 8")

    def softmax(self) -> list[str]:
        """The online softmax of rows fw_rq0 + 8h; P into fw_p[kk][r], the register A
        fragment of keys 16kk..16kk+15 (r = h + 2 (i % 2) for n8 column tile i = 2kk + i % 2)."""
        pk = self.pack
        return [
            "unsigned fw_p[FW_BKV / 16][4];",
            "#pragma unroll",
            "for (int h = 0; h < 2; ++h) {",
            "  float fw_mx = -EMMY_INF_F32;",
            "  #pragma unroll",
            "  for (int i = 0; i < FW_BKV / 8; ++i)",
            "    fw_mx = fmaxf(fw_mx, fmaxf(fw_s[4 * i + 2 * h], fw_s[4 * i + 2 * h + 1]));",
            "  fw_mx = fmaxf(fw_mx, __shfl_xor_sync(0xffffffffu, fw_mx, 1));",
            "  fw_mx = fmaxf(fw_mx, __shfl_xor_sync(0xffffffffu, fw_mx, 2));",
            "  const float fw_new = fmaxf(fw_m[h], fw_mx * FW_C);",
            "  const float fw_base = fw_new == -EMMY_INF_F32 ? 0.f : fw_new;",
            "  const float fw_alpha = ex2_approx(fw_m[h] - fw_base);",
            "  fw_m[h] = fw_new;",
            "  float fw_sum = 0.f;",
            "  #pragma unroll",
            "  for (int i = 0; i < FW_BKV / 8; ++i) {",
            "    const float fw_p0 = ex2_approx(fmaf(fw_s[4 * i + 2 * h], FW_C, -fw_base));",
            "    const float fw_p1 = ex2_approx(fmaf(fw_s[4 * i + 2 * h + 1], FW_C, -fw_base));",
            "    fw_sum += fw_p0 + fw_p1;",
            f"    fw_p[i / 2][h + 2 * (i % 2)] = {pk}(fw_p0, fw_p1);",
            "  }",
            "  fw_l[h] = fw_l[h] * fw_alpha + fw_sum;",
            "  #pragma unroll",
            "  for (int j = 0; j < FW_D / 8; ++j) {",
            "    fw_o[4 * j + 2 * h] *= fw_alpha;",
            "    fw_o[4 * j + 2 * h + 1] *= fw_alpha;",
            "  }",
            "}",
        ]

    def pv(self) -> list[str]:
        """O += P V: bkv/16 wgmma m64n{d}k16, A (P) in registers, V's k step 2048 bytes."""
        return [
            "wgmma_fence_acc(fw_o);",
            "wgmma_fence();",
            "#pragma unroll",
            "for (int kk = 0; kk < FW_BKV / 16; ++kk)",
            f"  wgmma_m64k16_rs<FW_D, {self.bf16}, 1>(fw_o, fw_p[kk], fw_vdesc + "
            "uint64_t((fw_stage + kk * 2048) >> 4), 1);",
            "wgmma_commit();",
            "wgmma_wait<0>();",
            "wgmma_fence_acc(fw_o);",
            "#pragma unroll",
            "for (int kk = 0; kk < FW_BKV / 16; ++kk) wgmma_fence_a(fw_p[kk]);",
        ]

    # --- the overlapped key loop (STAGE=async:2:overlap) ---------------------------------------

    def overlap_prologue(self) -> list[str]:
        """Copy groups {Q, K 0} and {K 1, V 0}; once the first has landed, block 0's S =
        Q K_0^T (waited for at once), its softmax, and P 0 into the A registers."""
        return [
            *self.load_kv("0", "0", "k"),
            "cp_async_commit();",
            "if (fw_nkb > 1) {",
            *_indent(self.load_kv("1", "1", "k"), 1),
            "}",
            *self.load_kv("0", "0", "v"),
            "cp_async_commit();",
            *self.online_state(),
            "float fw_s[FW_BKV / 2], fw_alpha[2];",
            "unsigned fw_p[FW_BKV / 16][4];   // P of the block before, the A of its P V",
            "cp_async_wait<1>();             // Q and K 0",
            "fence_proxy_async_shared();",
            "__syncthreads();",
            *self.issue_scores("fw_s", "0u"),
            "wgmma_wait<0>();",
            "wgmma_fence_acc(fw_s);",
            *self.mask("fw_s", "0"),
            *self.softmax_exp("fw_s"),
            *self.softmax_apply("fw_s"),
        ]

    def overlap_loop(self) -> list[str]:
        """Steps 1 .. fw_nkb - 1 (the module docstring), then the last block's P V."""
        return [
            "#pragma unroll 1",
            "for (int kb = 1; kb < fw_nkb; ++kb) {",
            *_indent(self.overlap_step(), 1),
            "}",
            "// the last block's P V, once its V has landed",
            "cp_async_wait<0>();",
            "fence_proxy_async_shared();",
            "__syncthreads();",
            *self.issue_pv("unsigned((fw_nkb - 1) & 1) * FW_KV"),
            "wgmma_wait<0>();",
            "wgmma_fence_acc(fw_o);",
            "#pragma unroll",
            "for (int kk = 0; kk < FW_BKV / 16; ++kk) wgmma_fence_a(fw_p[kk]);",
        ]

    def overlap_step(self) -> list[str]:
        """Key block kb: one barrier hands over K kb and V kb - 1 (copied a step before) and
        frees K slot (kb + 1) & 1 (S kb - 1 done) and V slot kb & 1 (P V kb - 2 done) for K
        kb + 1 and V kb; then S kb and P V kb - 1 issued together, the softmax of kb between
        their waits."""
        return [
            "cp_async_wait<0>();             // K kb and V kb - 1 (this thread's copies)",
            "fence_proxy_async_shared();",
            "__syncthreads();                // everyone's; S kb - 1 and P V kb - 2 are done",
            "if (kb + 1 < fw_nkb) {",
            *_indent(self.load_kv("kb + 1", "(kb + 1) & 1", "k"), 1),
            "}",
            *self.load_kv("kb", "kb & 1", "v"),
            "cp_async_commit();",
            *self.issue_scores("fw_s", "unsigned(kb & 1) * FW_KV"),
            *self.issue_pv("unsigned((kb - 1) & 1) * FW_KV"),
            "wgmma_wait<1>();   // S kb done (P V of kb - 1 may still run)",
            "wgmma_fence_acc(fw_s);",
            *self.mask("fw_s", "kb"),
            *self.softmax_exp("fw_s"),
            "wgmma_wait<0>();   // P V of kb - 1 done",
            *self.softmax_apply("fw_s"),
        ]

    def softmax_exp(self, s: str) -> list[str]:
        """The online softmax's first half, in registers only (O and P may still be read by
        the P V of the block before): row max, fw_alpha, P = exp2(...) in place of S, l."""
        return [
            "#pragma unroll",
            "for (int h = 0; h < 2; ++h) {",
            "  float fw_mx = -EMMY_INF_F32;",
            "  #pragma unroll",
            "  for (int i = 0; i < FW_BKV / 8; ++i)",
            f"    fw_mx = fmaxf(fw_mx, fmaxf({s}[4 * i + 2 * h], {s}[4 * i + 2 * h + 1]));",
            "  fw_mx = fmaxf(fw_mx, __shfl_xor_sync(0xffffffffu, fw_mx, 1));",
            "  fw_mx = fmaxf(fw_mx, __shfl_xor_sync(0xffffffffu, fw_mx, 2));",
            "  const float fw_new = fmaxf(fw_m[h], fw_mx * FW_C);",
            "  const float fw_base = fw_new == -EMMY_INF_F32 ? 0.f : fw_new;",
            "  fw_alpha[h] = ex2_approx(fw_m[h] - fw_base);",
            "  fw_m[h] = fw_new;",
            "  float fw_sum = 0.f;",
            "  #pragma unroll",
            "  for (int i = 0; i < FW_BKV / 8; ++i) {",
            f"    {s}[4 * i + 2 * h] = ex2_approx(fmaf({s}[4 * i + 2 * h], FW_C, -fw_base));",
            f"    {s}[4 * i + 2 * h + 1] = ex2_approx(fmaf({s}[4 * i + 2 * h + 1], FW_C, -fw_base));",
            f"    fw_sum += {s}[4 * i + 2 * h] + {s}[4 * i + 2 * h + 1];",
            "  }",
            "  fw_l[h] = fw_l[h] * fw_alpha[h] + fw_sum;",
            "}",
        ]

    def softmax_apply(self, s: str) -> list[str]:
        """The second half, once the P V before is done: O *= alpha, P (16-bit) into the A
        registers (as softmax())."""
        return [
            "wgmma_fence_acc(fw_o);",
            "#pragma unroll",
            "for (int kk = 0; kk < FW_BKV / 16; ++kk) wgmma_fence_a(fw_p[kk]);",
            "#pragma unroll",
            "for (int h = 0; h < 2; ++h) {",
            "  #pragma unroll",
            "  for (int j = 0; j < FW_D / 8; ++j) {",
            "    fw_o[4 * j + 2 * h] *= fw_alpha[h];",
            "    fw_o[4 * j + 2 * h + 1] *= fw_alpha[h];",
            "  }",
            "  #pragma unroll",
            "  for (int i = 0; i < FW_BKV / 8; ++i)",
            f"    fw_p[i / 2][h + 2 * (i % 2)] = {self.pack}({s}[4 * i + 2 * h], "
            f"{s}[4 * i + 2 * h + 1]);",
            "}",
        ]

    def issue_pv(self, stage: str) -> list[str]:
        """Issue and commit (one wgmma group) O += P V from V slot byte `stage`."""
        return [
            "wgmma_fence_acc(fw_o);",
            "wgmma_fence();",
            "#pragma unroll",
            "for (int kk = 0; kk < FW_BKV / 16; ++kk)",
            f"  wgmma_m64k16_rs<FW_D, {self.bf16}, 1>(fw_o, fw_p[kk], fw_vdesc + "
            f"uint64_t(({stage} + kk * 2048) >> 4), 1);",
            "wgmma_commit();",
        ]

    def epilogue(self, store: Store) -> list[str]:
        """Each row's l summed over its quad; out = O / l (where l == 0, NaN as softmax gives,
        or 0 for a `zero_empty` problem) for rows < sq;
        o[4j + 2h + c] is row fw_rq0 + 8h, column 8j + 2 fw_t + c."""
        stmts = store("fw_bz", "fw_h", "fw_row", "fw_col", "fw_val")
        return [
            "float fw_inv[2];",
            "#pragma unroll",
            "for (int h = 0; h < 2; ++h) {",
            "  float fw_sum = fw_l[h];",
            "  fw_sum += __shfl_xor_sync(0xffffffffu, fw_sum, 1);",
            "  fw_sum += __shfl_xor_sync(0xffffffffu, fw_sum, 2);",
            "  fw_inv[h] = fw_sum > 0.f ? 1.f / fw_sum : 0.f;" if self.p.zero_empty
            else "  fw_inv[h] = 1.f / fw_sum;",
            "}",
            "#pragma unroll",
            "for (int j = 0; j < FW_D / 8; ++j)",
            "  #pragma unroll",
            "  for (int e = 0; e < 4; ++e) {",
            "    const int fw_row = fw_rq0 + e / 2 * 8;",
            "    const int fw_col = 8 * j + 2 * fw_t + e % 2;",
            "    const float fw_val = fw_o[4 * j + e] * fw_inv[e / 2];",
            "    if (fw_row < FW_SQ) {",
            *["      " + s for s in stmts],
            "    }",
            "  }",
        ]
