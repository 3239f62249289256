"""The model of a tiled matrix product (a contraction kernel's launches).

Per launch: the blocks run in waves over the SMs (occupancy from ptxas's registers, the
shared memory and the threads); each block computes a BM x BN tile over its K range in BK
steps. A step costs the larger of its arithmetic (the tile's FLOPs at the SM's share of the
instruction's rate) and its copies (the step's operand bytes at the SM's share of the
bandwidth that serves them); with one shared buffer (STAGE=smem) the copy latency is paid on
every step as well, with a cp.async/TMA ring of N stages it is hidden behind N-1 steps. A
gathered operand (an implicit GEMM) also pays the instructions computing each element, added
to the step with one buffer, overlapped with the mma (one step ahead) in a ring.
Operand bytes come from DRAM once per wave for each distinct tile row of A and tile column
of B the wave touches (the launch order decides how many: row-major waves touch few rows and
many columns, grouped waves a square-ish patch), from L2 for the rest.
"""

from __future__ import annotations

import math

from emmy.cuda.gemm import raw_ring
from emmy.cuda.gemm_spec import GemmConfig, GemmProblem
from emmy.cuda.nvrtc import Resources
from emmy.runtime.costmodel.constants import (DRAM_EFFICIENCY, DRAM_LATENCY_S, L2_OVER_DRAM,
                                              METHOD)
from emmy.runtime.buffers import dtype_of_c
from emmy.runtime.costmodel.timing import LaunchEstimate
from emmy.runtime.occupancy import occupancy
from emmy.schedule.targets import Target

# Fraction of the datasheet rate each instruction path reaches in a well-fed main loop. sm_90a:
# calibrated on an H200 (BENCHMARKS.md, 2026-11-30): mma.sync's best 4096^3 rows ran at 380-410
# TFLOP/s of 989, wgmma at about 610, SIMT f32 at 39 of 67; flash attention at about 300.
# sm_80: estimates (mma.sync is Ampere's peak path).
INSTRUCTION_EFFICIENCY = {("mma", "sm_90a"): 0.40, ("mma", "sm_80"): 0.85,
                          ("wgmma", "sm_90a"): 0.62, ("simt", "sm_90a"): 0.59,
                          ("simt", "sm_80"): 0.75, ("tf32", "sm_90a"): 0.40,
                          ("tf32", "sm_80"): 0.85}
# flash attention's mma rate once its exponentials and shared-memory reads are counted apart
# (fit to the best measured H200 row, 4 x 32 x 4096 x 128 fp16, 2026-11-30)
ATTENTION_EFFICIENCY = {"sm_90a": 0.51, "sm_80": 0.7}
# the wgmma attention template (sm_90a): an assumption (the wgmma product's measured 0.62),
# see estimate_attention_launch
WGMMA_ATTENTION_EFFICIENCY = 0.62
# ASSUMPTION, not measured: the f32 attention template on CUDA cores (emmy.cuda.attention_simt)
# runs its FMAs at the rate the SIMT matrix-product template measured on an H200 (0.59 of the
# FP32 peak), with its shared-memory reads and exponentials counted apart. Recalibrate once it
# has been timed.
SIMT_ATTENTION_EFFICIENCY = 0.59
# ASSUMPTION, not measured: what the wgmma attention rows that copy with cp.async (every
# consumer thread copies) spend per key step on it, that warp-specialized rows (STAGE=tma:...,
# one producer thread issuing TMA copies) do not: each warp-wide 16-byte cp.async instruction
# with its address arithmetic and zero-fill select takes about this many issue cycles of one of
# an SM's 4 schedulers, and the step's two block barriers (wait_group + fence + __syncthreads)
# about ATTENTION_BARRIER_CYCLES of the block's time. Recalibrate once both forms are timed.
ATTENTION_CP_ASYNC_ISSUE_CYCLES = 8
ATTENTION_BARRIER_CYCLES = 40
# Instructions one thread issues per element of a gathered operand's tile (an implicit GEMM's
# index arithmetic, padding test, scalar load and shared store), counted (not timed) in the
# SASS of the ResNet 3x3 f16 row `WORK=warps:2x4 TILE=mma:64x64x32 STAGE=smem` (sm_90a, NVRTC
# 13.0, 2026-11-30): its K loop has 325 instructions with the per-element statements and 140
# in window form (emmy.tile_ir.window), for 8 elements a thread and about 25 instructions of
# mma, ldmatrix, barriers and the weights' copy. ASSUMPTION, not measured: an SM issues 4 warp
# instructions per clock to them. Recalibrate once a convolution row is timed.
GATHER_INSTRUCTIONS_PER_ELEMENT = 37
WINDOW_INSTRUCTIONS_PER_ELEMENT = 14
# A computed operand's (an int8 weight dequantized, w.half() * scale): its load, conversion,
# arithmetic and shared store, in instructions a thread issues an element beyond the plain
# product's K step. Counted (not timed) in the SASS by bench/dequant_sass.py (sm_90a, NVRTC 13.0,
# 2026-12-03; int8 256 x 512 -> 256 at WORK=warps:2x2 TILE=mma:64x64x32, 16 weights a thread, 75
# instructions a K step for the plain f16 product): fetched 8 at a time (one 8-byte load, one
# 16-byte shared store: GemmOperand.vector) and converted one at a time (an I2F each) 3.56; on
# f16 pairs (GemmOperand.paired: PRMT, HADD2, HMUL2 a pair, no conversion) 1.56, on bf16 pairs
# (through f32: PRMT, FADD an element) 3.06; element by element (rows not whole vectors of 8:
# 146 a K step, counted by hand) 4.5. A raw ring (STAGE=async:3 and 4, emmy.cuda.gemm.raw_ring:
# the bytes copied by cp.async, then read from shared memory) adds about 0.6 (0.63 on pairs,
# 0.44 unpaired); a wgmma row (emmy.cuda.gemm_sm90: each tile computed into its swizzled stage
# between two barriers; 128x128x64 at 1024 x 4096 -> 4096) 1.55 (3.11 on f16 pairs). int4
# weights two to a byte, less 8, times a scale per group of 128 (GemmOperand.packing 2: a word's
# nibbles split once, then PRMT, LOP3, HSUB2 and HMUL2 a pair, the scale loaded once a vector)
# 3.25 on f16 or bf16 pairs (3.69 through a raw ring, 4.48 on a wgmma row). GPTQ's int32 words
# of eight with a zero point per group of 128 packed along n (2026-12-03, 256 x 512 -> 256, raw
# ring): 4.5 on f16 pairs (the zero point an IMAD a vector into em_4x2's bias), 20.1 computed one
# at a time as before pairs took the zero point (32.1 with a zero point every 4 k, which pairs
# cannot take): int4 unpacking the pairs do not recognise costs COMPUTED_UNPAIRED_NIBBLE.
# AWQ's words of eight along n in its interleaved order, zero points packed the same way
# (2026-12-03, the same row): 5.56 on f16 pairs (a shift and a LOP3 for the pair's nibbles and
# again for its zero points, the zero point word and the 8 scales one load a vector), 8.31 when
# each pair loaded its zero word and scales; charged as the other int4 pairs.
COMPUTED_INSTRUCTIONS_PER_ELEMENT = 4.5
COMPUTED_UNPAIRED_NIBBLE_INSTRUCTIONS_PER_ELEMENT = 20
COMPUTED_VECTOR_INSTRUCTIONS_PER_ELEMENT = 3.56
COMPUTED_PAIR_INSTRUCTIONS_PER_ELEMENT = {"__half": 1.56, "__nv_bfloat16": 3.06}
COMPUTED_NIBBLE_PAIR_INSTRUCTIONS_PER_ELEMENT = 3.25
COMPUTED_RING_EXTRA_INSTRUCTIONS_PER_ELEMENT = 0.6
COMPUTED_WGMMA_EXTRA_INSTRUCTIONS_PER_ELEMENT = 1.55
# I2F issues at 16 results a clock an SM on sm_80 and sm_90 (the CUDA C++ Programming Guide's
# arithmetic-instruction throughput table: "all other type conversions"), an eighth of the
# rate of the integer and half2 instructions around it: the conversions, not the issue slots,
# bound an unpaired computed operand. (F2FP, the pack of two floats to f16x2, is counted as an
# ordinary instruction: ASSUMPTION, the table does not list it.)
CONVERSIONS_PER_CLOCK = 16
COMPUTED_CONVERSIONS_PER_ELEMENT = 1
SMEM_BYTES_PER_CLOCK = 128       # one SM's shared-memory bandwidth (32 banks x 4 bytes)
STEP_OVERHEAD_CYCLES = 40        # per K step: barrier, address updates, loop
EPILOGUE_CYCLES_PER_ELEMENT = 2  # per output element per thread-share: epilogue and store
# A wgmma tile's epilogue from registers: each warp's pair store writes 16 bytes into each of 8
# rows (8 lines), and the tile's consumers store while no wgmma runs. Measured on an H200
# (2026-12-04, `emmy bench --suite matmul`, 128x256 tiles, 16-bit outputs): 4096^3 products
# 200.8 us against 184.6 with the tile stored by TMA, a 16 x 1024^3 bmm 70.9 against 52.8:
# about 4 us a tile, some 1.7 clocks per line written. Stored by TMA, the consumers only
# write the tile into shared memory (one wavefront per warp write: ASSUMPTION, the swizzle
# keeps them free of bank conflicts) and the copy engine stores it while the next tile runs.
WGMMA_EPILOGUE_CYCLES_PER_LINE = 1.7


def _gather_instructions(op, c: GemmConfig) -> float:
    """Instructions one thread issues per element of a gathered operand's tile."""
    if op.windowed:
        return WINDOW_INSTRUCTIONS_PER_ELEMENT
    if not op.computed:
        return GATHER_INSTRUCTIONS_PER_ELEMENT
    ring = 0 if not raw_ring(op, c) else COMPUTED_WGMMA_EXTRA_INSTRUCTIONS_PER_ELEMENT \
        if c.inst == "wgmma" else COMPUTED_RING_EXTRA_INSTRUCTIONS_PER_ELEMENT
    if op.paired:
        return ring + (COMPUTED_NIBBLE_PAIR_INSTRUCTIONS_PER_ELEMENT if op.packing > 1
                       else COMPUTED_PAIR_INSTRUCTIONS_PER_ELEMENT[op.ctype])
    if op.packing > 1:
        return ring + COMPUTED_UNPAIRED_NIBBLE_INSTRUCTIONS_PER_ELEMENT
    return ring + (COMPUTED_VECTOR_INSTRUCTIONS_PER_ELEMENT if op.vector > 1
                   else COMPUTED_INSTRUCTIONS_PER_ELEMENT)


def _tiles_ahead(op, c: GemmConfig) -> int:
    """K tiles of an operand in flight while one is multiplied (a ring of two stages or more):
    a gathered tile's, in registers, one whatever the depth; a computed operand's raw ring's
    `stages - 2` on an mma.sync row and as many as the other operand's on a wgmma row."""
    if not op.gathered or (raw_ring(op, c) and c.inst == "wgmma"):
        return c.stages - 1
    return c.stages - 2 if raw_ring(op, c) else 1


def _does_not_fit(kernel: str, function: str, grid: int, threads: int,
                  resources: Resources | None) -> LaunchEstimate:
    """A launch whose block fits on no SM (registers, shared memory or threads)."""
    return LaunchEstimate(kernel, function, math.inf, 0, 0, 0, 0.0, 0, 0, "resources",
                          resources, grid, threads)


def _waves(grid: int, occ, target: Target) -> tuple[int, float]:
    """Waves of `grid` blocks over the SMs, and the share of the last wave's slots in use."""
    resident = min(grid, occ.blocks_per_sm * target.sm_count)
    waves = -(-grid // resident)
    return waves, grid / (waves * resident)


def _epilogue_cycles(c: GemmConfig, threads: int) -> float:
    """Clocks one tile's epilogue keeps its block from multiplying."""
    if c.inst != "wgmma":
        return c.bm * c.bn / threads * EPILOGUE_CYCLES_PER_ELEMENT
    warp_writes = c.bm * c.bn / 2 / 32          # pairs of neighbouring columns, a warp at a time
    if c.tma_store:
        return warp_writes
    return warp_writes * 8 * WGMMA_EPILOGUE_CYCLES_PER_LINE


def _rate(c: GemmConfig, p: GemmProblem, t: Target) -> float:
    if c.inst == "simt":
        peak = t.fp32_flops
    elif c.inst == "tf32":
        peak = t.tf32_tensor_flops
    else:
        peak = t.bf16_tensor_flops if p.a.ctype == "__nv_bfloat16" else t.fp16_tensor_flops
    return peak * INSTRUCTION_EFFICIENCY.get((c.inst, t.name), 0.6)


def estimate_gemm_launch(kernel: str, function: str, p: GemmProblem, c: GemmConfig, grid: int,
                         threads: int, smem: int, resources: Resources | None,
                         target: Target) -> LaunchEstimate:
    """The main-loop launch of a tiled product: one work unit per output tile, batch and K
    split; `grid` blocks take one unit each, or (a persistent grid, fewer blocks than units)
    walk them, which costs the same waves of units."""
    occ = occupancy(threads, smem, resources, target)
    if occ.blocks_per_sm == 0:
        return _does_not_fit(kernel, function, grid, threads, resources)
    tiles_m, tiles_n = -(-p.m // c.bm), -(-p.n // c.bn)
    units = max(grid, p.batch * tiles_m * tiles_n * c.split)
    k_range = -(-p.k // c.split)
    steps = -(-k_range // c.bk)
    item = 2 if p.a.ctype != "float" else 4
    item_a, item_b = p.a.bytes_read, p.b.bytes_read     # what an element costs to read
    clock = target.clock_hz
    per_sm_rate = _rate(c, p, target) / target.sm_count
    concurrent = occ.blocks_per_sm
    # one K step of one block, with `concurrent` blocks sharing the SM
    step_flops = 2 * c.bm * c.bn * c.bk
    compute_s = step_flops * concurrent / per_sm_rate
    # a cluster copies the operand tile its blocks share once (TMA multicast): each block
    # reads half of it through L2
    step_bytes = (c.bm / c.cluster_n * item_a + c.bn / c.cluster_m * item_b) * c.bk
    resident = min(units, concurrent * target.sm_count)
    l2_bw = target.dram_bytes_per_s * L2_OVER_DRAM
    dram_bw = target.dram_bytes_per_s * DRAM_EFFICIENCY
    # distinct operand tiles one wave touches, by the launch order
    per_batch = max(1, resident // max(1, c.split))
    if c.group > 1:
        rows = min(tiles_m, c.group, per_batch)
        cols = min(tiles_n, -(-per_batch // rows))
    else:
        cols = min(tiles_n, per_batch)
        rows = min(tiles_m, -(-per_batch // tiles_n))
    dram_fraction = min(1.0, (rows * c.bm * item_a + cols * c.bn * item_b)
                        / max(1, per_batch * (c.bm * item_a + c.bn * item_b)))
    bytes_step_all = step_bytes * resident
    copy_s = max(bytes_step_all * dram_fraction / dram_bw, bytes_step_all / l2_bw)
    overhead_s = STEP_OVERHEAD_CYCLES / clock
    gathered = sum(outer * _gather_instructions(op, c) for op, outer in ((p.a, c.bm), (p.b, c.bn))
                   if op.gathered)
    conversions = sum(outer * COMPUTED_CONVERSIONS_PER_ELEMENT
                      for op, outer in ((p.a, c.bm), (p.b, c.bn)) if op.computed and not op.paired)
    gather_s = concurrent * c.bk * max(gathered / (32 * 4), conversions / CONVERSIONS_PER_CLOCK) \
        / clock
    if c.stages <= 1:
        step_s = compute_s + copy_s + gather_s + DRAM_LATENCY_S / 2 + overhead_s
    else:
        ahead = min(_tiles_ahead(op, c) for op in (p.a, p.b))
        step_s = max(compute_s, copy_s, gather_s, DRAM_LATENCY_S / ahead) + overhead_s
    waves = -(-units // resident)
    epilogue_s = _epilogue_cycles(c, threads) / clock
    out_bytes = p.batch * p.m * p.n * (4 if c.split_mode else item)
    # split:S:last: after the last wave, each tile's last block waits for its ticket (a round
    # trip to memory) and reads the tile's S partial planes from L2 at one SM's share of it
    fixup_s = c.split * c.bm * c.bn * 4 / (l2_bw / target.sm_count) + DRAM_LATENCY_S + \
        epilogue_s if c.split_mode == "last" else 0.0
    seconds = waves * (steps * step_s + epilogue_s) + out_bytes / dram_bw + fixup_s \
        + target.launch_overhead_s
    flops = 2 * p.batch * tiles_m * c.bm * tiles_n * c.bn * steps * c.bk * c.split
    operand_bytes = p.batch * (p.m * p.k * item_a + p.k * p.n * item_b)
    reads = operand_bytes * (tiles_n + tiles_m) / 2
    limiter = "compute" if compute_s >= copy_s else "memory"
    breakdown = (("compute", waves * steps * compute_s), ("copies", waves * steps * copy_s),
                 *((("gather", waves * steps * gather_s),) if gathered else ()),
                 *((("last block", fixup_s),) if fixup_s else ()),
                 ("launch", target.launch_overhead_s))
    return LaunchEstimate(kernel=kernel, function=function, seconds=seconds,
                          bytes_dram=round(operand_bytes + out_bytes), bytes_l2=round(reads),
                          flops=flops, occupancy=occ.fraction, blocks_per_sm=concurrent,
                          waves=waves, limiter=limiter, resources=resources, grid=grid,
                          threads=threads, breakdown=breakdown, method=METHOD)


def estimate_combine_launch(kernel: str, function: str, p: GemmProblem, c: GemmConfig,
                            grid: int, threads: int, target: Target) -> LaunchEstimate:
    """The split-K combine: read S partial planes, write the output once."""
    n = p.batch * p.m * p.n
    moved = n * 4 * c.split + n * 4
    seconds = moved / (target.dram_bytes_per_s * DRAM_EFFICIENCY) + target.launch_overhead_s
    return LaunchEstimate(kernel=kernel, function=function, seconds=seconds, bytes_dram=moved,
                          bytes_l2=0, flops=n * c.split, occupancy=1.0, blocks_per_sm=0,
                          waves=1, limiter="memory", resources=None, grid=grid,
                          threads=threads, breakdown=(("dram", seconds),), method=METHOD)


def estimate_attention_launch(kernel: str, function: str, p, c, grid: int, threads: int,
                              smem: int, resources: Resources | None,
                              target: Target) -> LaunchEstimate:
    """Flash attention: Q K^T and P V on mma.sync (4 B H Sq Sk D FLOPs, about half of them under
    a causal mask), the softmax's exponentials on the special-function units, every warp reading
    each K and V tile from shared memory (so fewer query rows per warp cost more), spills
    re-read every key step; K and V read once per query block (from L2 after the first), q, k, v
    and the output from DRAM, an attn_mask's element per score from L2. The wgmma template
    (c.inst == "wgmma", sm_90a) runs the products at the wgmma rate, and each consumer warpgroup
    (64 rows) has its wgmmas read the K and V tiles and its Q rows from shared memory once per
    key step; its overlapped schedule (c.overlap) hides the exponentials behind the products (an
    assumption, see below). Its cp.async rows also pay the consumers' copy issue and barriers
    per key step; the warp-specialized rows (c.tma: a TMA producer warpgroup) do not (an
    assumption, see ATTENTION_CP_ASYNC_ISSUE_CYCLES). The f32 template (c.inst == "simt") runs
    its products as FMAs (SIMT_ATTENTION_EFFICIENCY, an assumption) and counts the wavefronts of
    its warps' shared-memory reads of Q, K, P and V and its writes of P.
    Split-KV rows (c.splits > 1) give each block a run of the key blocks (`steps` of them) and
    add the combine launch (estimate_attention_combine), or (split_mode "last") the last block
    of each query block's combine: its ticket's round trip to memory, then the S partial
    outputs of its rows read from L2 at one SM's share of it. K and V stream from DRAM at no more
    than the blocks running at once keep in flight (their K/V stages over DRAM_LATENCY_S,
    Little's law): a decoding step's few unsplit blocks cannot pull the HBM's bandwidth."""
    if function.endswith("_combine"):
        return estimate_attention_combine(kernel, function, p, c, grid, threads, target)
    occ = occupancy(threads, smem, resources, target)
    if occ.blocks_per_sm == 0:
        return _does_not_fit(kernel, function, grid, threads, resources)
    heads = p.batch * p.heads
    q_blocks = -(-p.sq // c.bq)
    kblocks = -(-p.sk // c.bkv)
    steps = -(-kblocks // c.splits)                          # key blocks a block walks
    visible = 0.5 + 0.5 / q_blocks if p.causal else 1.0     # key blocks a query block reads
    wgmma = getattr(c, "inst", "mma") == "wgmma"
    # query rows computed: under one query block, the mma.sync and simt warps wholly past sq
    # skip the key loop
    warp_rows = c.bq // c.warps
    rows = (-(-p.sq // warp_rows) * warp_rows if p.sq < c.bq and not wgmma
            else q_blocks * c.bq)
    dd = p.d + p.dv                  # q . k's head dimension and v's (MLA's differ)
    flops = 2 * heads * rows * (kblocks * c.bkv) * dd * visible
    busy = rows / (q_blocks * warp_rows)                     # warps computing, a block
    peak = target.bf16_tensor_flops if p.q.ctype == "__nv_bfloat16" else target.fp16_tensor_flops
    simt = getattr(c, "inst", "mma") == "simt"
    if simt:
        rate = target.fp32_flops * SIMT_ATTENTION_EFFICIENCY      # an assumption (above)
    elif wgmma:
        # ASSUMPTION, not measured: the wgmma attention template (emmy.cuda.attention_sm90) has
        # not run on a GPU yet; its products are taken at the rate the wgmma matrix-product
        # template measured on an H200 (0.62 of the peak), with exponentials and shared-memory
        # reads counted apart as for mma.sync. Recalibrate once it has been timed.
        rate = peak * WGMMA_ATTENTION_EFFICIENCY
    else:
        rate = peak * ATTENTION_EFFICIENCY.get(target.name, 0.3)
    exps = heads * rows * kblocks * c.bkv * visible
    sfu_rate = 16 * target.sm_count * target.clock_hz                     # exp2 per second
    waves, wave_eff = _waves(grid, occ, target)
    wave_eff *= min(1.0, grid / target.sm_count)     # a grid under one block an SM leaves SMs idle
    if simt:
        # a warp's shared-memory cycles a key step: 16-byte reads return 128 bytes a cycle, so 4
        # cycles each for K and V (8 addresses a row group), 2 for Q and P (one address a row
        # group: pairs of lanes read alike, which halves it), 1 for each 4-byte write of P
        from emmy.cuda.attention_simt import KEY_LANES

        tm, tn, nc = c.bq // (4 * c.warps), c.bkv // KEY_LANES, -(-p.d // 32)
        wavefronts = (p.d // 4 * (2 * tm + 4 * tn) + c.bkv // 4 * 2 * tm + 4 * c.bkv * nc
                      + tm * tn)
        smem_read = grid * busy * steps * visible * wavefronts * SMEM_BYTES_PER_CLOCK
    elif wgmma:    # K and V, and the warpgroup's 64 Q rows, per warpgroup and key step
        smem_read = grid * (c.warps // 4) * steps * visible * (2 * c.bkv + 64) * p.d * 2
    else:
        smem_read = grid * busy * steps * visible * c.bkv * dd * 2  # K and V, per warp
    smem_s = smem_read / (SMEM_BYTES_PER_CLOCK * target.sm_count * target.clock_hz)
    spills = 0.0
    if resources and (resources.spill_store_bytes or resources.spill_load_bytes):
        spilled = (resources.spill_store_bytes + resources.spill_load_bytes) * grid * threads
        spills = spilled * steps * visible / (target.dram_bytes_per_s * L2_OVER_DRAM)
    copy_s = 0.0
    if wgmma and not getattr(c, "tma", False):
        # K and V of a key step in 16-byte copies, 32 to a warp instruction, spread over an
        # SM's 4 schedulers; plus the step's barriers (see ATTENTION_CP_ASYNC_ISSUE_CYCLES)
        warp_copies = 2 * c.bkv * p.d * 2 / 16 / 32
        cycles = warp_copies * ATTENTION_CP_ASYNC_ISSUE_CYCLES / 4 + ATTENTION_BARRIER_CYCLES
        copy_s = grid * steps * visible * cycles / (target.sm_count * target.clock_hz)
    if wgmma and getattr(c, "overlap", False):
        # ASSUMPTION, not measured: the overlapped schedule (STAGE=...:overlap) issues S of a
        # key block together with P V of the one before and runs the softmax while P V does,
        # so a warpgroup's exponentials run while its products do: the slower of the two, not
        # their sum. Recalibrate once both forms have been timed on a GPU.
        compute_s = (max(flops / rate, exps / sfu_rate) + smem_s + spills + copy_s) / wave_eff
    else:
        compute_s = (flops / rate + exps / sfu_rate + smem_s + spills + copy_s) / wave_eff
    item = 4 if simt else 2
    kv_heads = heads // max(p.k.group, 1)
    io = (heads * p.sq + kv_heads * p.sk) * dd * item      # q, out; k, v
    # K and V again for each query block after the first read (from L2)
    reread = max(0.0, (heads * q_blocks * kblocks * visible * c.bkv - kv_heads * p.sk)
                 * dd * item)
    if getattr(p, "bias", None) is not None:
        # attn_mask: every score reads its bias or mask element (element by element in the
        # fragment layout, through L1/L2: a broadcast mask is re-read, not re-fetched)
        reread += exps * dtype_of_c(p.bias.ctype).itemsize
    running = min(grid, occ.blocks_per_sm * target.sm_count)
    in_flight = running * c.stages * c.bkv * dd * item / DRAM_LATENCY_S
    dram_rate = min(target.dram_bytes_per_s * DRAM_EFFICIENCY, in_flight)
    memory_s = io / dram_rate + reread / (target.dram_bytes_per_s * L2_OVER_DRAM)
    latency_s = 0.0 if c.stages > 1 else waves * steps * visible * DRAM_LATENCY_S / 2
    fixup_s = 0.0
    if c.splits > 1 and c.split_mode == "last":
        l2_share = target.dram_bytes_per_s * L2_OVER_DRAM / target.sm_count
        block_rows = min(c.bq, p.sq)            # the last block combines its rows inside sq
        fixup_s = c.splits * block_rows * (p.dv + 1) * 4 / l2_share + DRAM_LATENCY_S
    seconds = max(compute_s, memory_s) + latency_s + fixup_s + target.launch_overhead_s
    return LaunchEstimate(kernel=kernel, function=function, seconds=seconds, bytes_dram=io,
                          bytes_l2=round(reread), flops=round(flops), occupancy=occ.fraction,
                          blocks_per_sm=occ.blocks_per_sm, waves=waves,
                          limiter="compute" if compute_s >= memory_s else "memory",
                          resources=resources, grid=grid, threads=threads,
                          breakdown=(("compute", compute_s), ("shared memory", smem_s),
                                     ("copy issue", copy_s), ("spills", spills),
                                     ("memory", memory_s),
                                     ("latency", latency_s),
                                     *((("last block", fixup_s),) if fixup_s else ()),
                                     ("launch", target.launch_overhead_s)),
                          method=METHOD)


def estimate_attention_combine(kernel: str, function: str, p, c, grid: int, threads: int,
                               target: Target) -> LaunchEstimate:
    """The split-KV combine: read each split's outputs and row log-sum-exp (f32), write the
    output once."""
    rows = p.batch * p.heads * p.sq
    item = 4 if p.q.ctype == "float" else 2
    moved = c.splits * rows * (p.dv + 1) * 4 + rows * p.dv * item
    seconds = moved / (target.dram_bytes_per_s * DRAM_EFFICIENCY) + target.launch_overhead_s
    return LaunchEstimate(kernel=kernel, function=function, seconds=seconds, bytes_dram=moved,
                          bytes_l2=0, flops=3 * rows * p.dv * c.splits, occupancy=1.0,
                          blocks_per_sm=0, waves=1, limiter="memory", resources=None, grid=grid,
                          threads=threads, breakdown=(("dram", seconds),), method=METHOD)


def estimate_chain_launch(kernel: str, function: str, p, c, grid: int, threads: int,
                          smem: int, resources: Resources | None,
                          target: Target) -> LaunchEstimate:
    """A back-to-back product: every block recomputes its rows' slice of the intermediate
    (2 M K1 K2 FLOPs per column tile of the output) and multiplies it into its tile (2 M K2 N
    over the grid); operands from DRAM once, their re-reads from L2."""
    occ = occupancy(threads, smem, resources, target)
    if occ.blocks_per_sm == 0:
        return _does_not_fit(kernel, function, grid, threads, resources)
    tiles_m, tiles_n = -(-p.m // c.bm), -(-p.n // c.bn)
    flops = 2 * p.batch * (tiles_m * c.bm) * (p.k1 * p.k2 * tiles_n + p.k2 * tiles_n * c.bn)
    item = 4 if p.a.ctype == "float" else 2
    if c.inst == "simt":
        rate = target.fp32_flops * INSTRUCTION_EFFICIENCY.get(("simt", target.name), 0.6)
    else:
        peak = target.bf16_tensor_flops if p.a.ctype == "__nv_bfloat16" else target.fp16_tensor_flops
        rate = peak * INSTRUCTION_EFFICIENCY.get(("mma", target.name), 0.6)
    waves, wave_eff = _waves(grid, occ, target)
    compute_s = flops / rate / wave_eff
    io = p.batch * (p.m * p.k1 + p.k1 * p.k2 + p.k2 * p.n + p.m * p.n) * item
    reread = p.batch * (p.m * p.k1 * tiles_n + p.k1 * p.k2 * tiles_m * tiles_n
                        + p.k2 * p.n * tiles_m) * item
    memory_s = io / (target.dram_bytes_per_s * DRAM_EFFICIENCY) + \
        reread / (target.dram_bytes_per_s * L2_OVER_DRAM)
    latency_s = waves * (-(-p.k2 // c.bk2)) * (-(-p.k1 // c.bk1)) * DRAM_LATENCY_S / 4
    seconds = max(compute_s, memory_s) + latency_s + target.launch_overhead_s
    return LaunchEstimate(kernel=kernel, function=function, seconds=seconds, bytes_dram=io,
                          bytes_l2=reread, flops=flops, occupancy=occ.fraction,
                          blocks_per_sm=occ.blocks_per_sm, waves=waves,
                          limiter="compute" if compute_s >= memory_s else "memory",
                          resources=resources, grid=grid, threads=threads,
                          breakdown=(("compute", compute_s), ("memory", memory_s),
                                     ("latency", latency_s), ("launch", target.launch_overhead_s)),
                          method=METHOD)
