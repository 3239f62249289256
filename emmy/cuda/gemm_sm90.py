"""The Hopper (sm_90a) matrix-product template: wgmma.mma_async with both operands in shared
memory, f32 accumulators in registers (see emmy.cuda.gemm_spec for the interface).

A block computes a bm x bn tile of C with bm/64 consumer warpgroups; consumer w owns rows
64w..64w+63 and issues one wgmma m64n{bn}k16 per 16 of K. Operands reach shared memory through
a ring of `stages` buffers filled with 16-byte cp.async copies, each placed at its address in the
128-byte-swizzled layout that the wgmma descriptors name (bk = 64: one 128-byte row of 2-byte
elements). Per stage and operand, for R = bm (A) or bn (B) rows:

  K-major  (k contiguous in global memory): R rows of 128 bytes (64 k); 8-row groups of 1024
           bytes one after another (SBO = 1024); the 16-byte chunk c of row r lands at chunk
           c ^ (r % 8). A K step of 16 moves the descriptor's start by 32 bytes.
  MN-major (m or n contiguous): per 64 of M/N an atom column of 64 k-rows x 128 bytes (8 KiB,
           LBO = 8192), 8 k-rows per 1024 bytes (SBO = 1024); chunk c of k-row r lands at
           c ^ (r % 8). A K step of 16 moves the start by 2048 bytes.

Copies past the edges of A and B (ragged m, n, k) are zero-filled, so the products are exact
and only the epilogue checks bounds. The pipeline keeps one wgmma group in flight (with 3 or
more stages): in iteration kt a thread waits for its copies of tile kt, fences them into the
async proxy, meets the block at a barrier (after which every warpgroup has finished the wgmmas
of tile kt-2), refills that slot with tile kt+stages-2, and issues tile kt's four wgmmas. With
2 stages nothing stays in flight and the refill is tile kt+1 into tile kt-1's slot.

A computed operand (an int8 weight dequantized, its rows whole aligned vectors of 8:
emmy.tile_ir.contract) is not copied: cp.async brings its raw vectors into a ring of their own
(after the stages), and once tile kt has landed each thread computes its 16-byte chunks of it
(emmy.cuda.gemm.computed_lambdas) into the swizzled places a copy would fill, zero past the
edges, and fences them into the async proxy; a second barrier precedes tile kt's wgmmas, and
tile kt-1's, still in flight, overlap the computing. TMA staging is refused.

With config.tma, a producer warpgroup (threads 0..127, before the bm/64 consumer warpgroups)
loads the same layouts with the copy engine instead: one thread waits for a slot to be empty,
announces the stage's bytes on its `full` mbarrier and issues the TMA copies (3-d tensor maps:
the contiguous dimension, the other one, batch; 128-byte swizzle, zeros outside the tensor);
consumers wait on `full`, issue the wgmmas, and once the next tile's wgmmas are issued and the
previous tile's have finished (wait_group 1), each consumer warp arrives on that tile's `empty`
mbarrier. The grid is persistent: min(output tiles, SMs) blocks, block b taking tiles b,
b + gridDim.x, ...; producer and consumers count k-tiles across tiles, so the ring's slots and
phases carry on and the producer fills the next tile's stages during this tile's epilogue. With
two consumer warpgroups the kernel is declared __launch_bounds__(384, 1) and setmaxnreg moves
registers from the producer (40 a thread) to the consumers (232). The body is then a TmaBody:
the kernel takes one extra parameter per tensor map, `const EmmyTensorMap* __restrict__
<name>`, and the runtime fills them before the launch (emmy.cuda.program.TensorMapSpec).

Clusters (TMA only; config.cluster_m x cluster_n = 2x1 or 1x2): the blocks 2c and 2c+1 form
cluster c (__cluster_dims__(2, 1, 1)) and take the same work units, CM x CN neighbouring tiles,
block `rank` the tile at rank along m (2x1) or n (1x2). The two tiles share one operand tile
(B's with 2x1, A's with 1x2): each block's producer copies half of it with one multicast TMA
copy into both blocks' stage (K-major: half of the rows; MN-major: half of the atom columns, or
of the k-rows for a 64-wide tile) and its own other operand as before, so each `full` barrier
still expects the whole stage. A slot is then written by both producers, so each consumer warp
frees it on both blocks' `empty` barriers (arrival count: the cluster's consumer warps). The
barriers are initialised before a cluster barrier, and a cluster barrier at the end keeps a block
from leaving while its peer may still copy into it or arrive on its barriers. A spare tile (an
odd tile count along the cluster's direction) is computed on zeros (the copies past the tensor
read zeros) and stores nothing. The shared operand is read from L2 once per cluster instead of
once per block.

Epilogue: a thread's accumulators come in pairs of neighbouring columns; where the epilogue
has a pair form (emmy.cuda.gemm_spec.pair_of) each pair is one vector store. A warp's store
then writes 16 bytes into each of 8 rows. With config.tma_store (TMA only; an epilogue that
stores one 16-bit row-major output, emmy.cuda.gemm_spec.staged_of) the tile goes through
shared memory instead: each consumer warpgroup has a buffer of 64-row x 64-column boxes after
the stage ring (as many as fit, up to its 64 x bn; the 128-byte swizzle, so that a warp's 4-byte
writes of 8 rows fall in 32 different banks), writes its pairs there in rounds of the buffer's
width, fences them into the async proxy, meets its warpgroup at a named barrier, and one thread
stores the boxes by TMA (the copy engine clips what lies past the output) and commits them as a
bulk group; before a round overwrites the buffer that thread waits until the last round's
stores have read it. The consumers then go on to the next tile while the copy engine writes.

Emitted sources must include HEADER (emmy_sm90.cuh) after emmy_kernel.cuh.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from emmy.cuda.gemm import STORAGE, _indent, computed_lambdas, raw_vector
from emmy.cuda.gemm_spec import (ELEMENT_BYTES, Body, Epilogue, GemmConfig, GemmOperand,
                                 GemmProblem, StagedEpilogue, StoredTile, VectorGather, pair_of,
                                 staged_of)
from emmy.cuda.program import TensorMapSpec

HEADER = "emmy_sm90.cuh"
WGMMA_N = (64, 128, 256)           # the N of the wgmma shapes emmy_sm90.cuh issues
BK = 64                            # 128 bytes of 2-byte elements: one swizzled row
SMEM_LIMIT = 227 * 1024            # sm_90a's dynamic shared memory per block (opt-in)
ALIGN_SLACK = 1024                 # the 128-byte swizzle pattern repeats on 1024-byte boundaries
ATOM_BYTES = 8192                  # MN-major: one 64-wide column of 64 k-rows
_CTYPES = ("__half", "__nv_bfloat16")
CLUSTERS = ((1, 1), (2, 1), (1, 2))  # (cluster_m, cluster_n) the TMA form builds
MULTICAST_MASK = "0x3"               # both blocks of a cluster of 2


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class TmaBody(Body):
    """A body that reads its operands through TMA tensor maps: the kernel's signature adds
    `const EmmyTensorMap* __restrict__ <name>` for each (after the buffers), and the launch
    passes them (LaunchSpec.tensor_maps)."""

    tensor_maps: tuple[TensorMapSpec, ...] = ()


def smem_bytes_sm90(problem: GemmProblem, config: GemmConfig) -> int:
    """Dynamic shared memory of one block: the stage ring (and with TMA its two mbarriers per
    stage; for a computed operand the ring of its raw bytes; with a TMA store the output
    boxes), plus room to align it to 1024."""
    ring = _ring_and_barriers(problem, config)
    return ring + config.bm // 64 * store_boxes(config, ring) * BOX_BYTES


def _ring_and_barriers(problem: GemmProblem, config: GemmConfig) -> int:
    barriers = 16 * config.stages if config.tma else 0
    raw = config.stages * (_ring_bytes(problem.a, config.bm) + _ring_bytes(problem.b, config.bn))
    return config.stages * (config.bm + config.bn) * BK * 2 + raw + barriers + ALIGN_SLACK


BOX_BYTES = 64 * 64 * 2      # one 64x64 box of the output tile (16-bit), staged for a TMA store


def store_boxes(config: GemmConfig, ring: int) -> int:
    """Output boxes per consumer warpgroup with config.tma_store: as many as fit beside `ring`
    bytes (the stage ring and its barriers), halving from the warpgroup's whole 64 x bn, at
    least one (0 without a TMA store)."""
    if not config.tma_store:
        return 0
    boxes, groups = config.bn // 64, config.bm // 64
    while boxes > 1 and ring + groups * boxes * BOX_BYTES > SMEM_LIMIT:
        boxes //= 2
    return boxes


def constraints_sm90(problem: GemmProblem, config: GemmConfig, target_name: str) -> list[str]:
    """Why this template cannot run `problem` with `config` on `target_name` (empty: it can)."""
    why: list[str] = []
    if target_name != "sm_90a":
        why.append(f"wgmma needs the sm_90a target, not {target_name}")
    if config.inst != "wgmma":
        why.append(f"the sm_90a template issues wgmma, but the config asks for {config.inst!r}")
    a, b = problem.a, problem.b
    if a.ctype not in _CTYPES or b.ctype != a.ctype:
        why.append(f"wgmma here multiplies f16 by f16 or bf16 by bf16; A is {a.ctype} and B is "
                   f"{b.ctype}")
    if config.bm not in (64, 128):
        why.append(f"bm must be 64 per consumer warpgroup, 64 or 128; got {config.bm}")
    elif config.threads != 2 * config.bm:
        why.append(f"bm={config.bm} takes {config.bm // 64} warpgroups ({2 * config.bm} threads), "
                   f"but wm*wn = {config.wm}*{config.wn} warps make {config.threads} threads")
    if config.bn not in WGMMA_N:
        why.append(f"bn must be a wgmma N this template issues ({', '.join(map(str, WGMMA_N))}); "
                   f"got {config.bn}")
    if config.bk != BK:
        why.append(f"bk must be {BK} (one 128-byte swizzled row of 2-byte elements); got "
                   f"{config.bk}")
    if not 2 <= config.stages <= 4:
        why.append(f"stages must be 2 to 4 (the ring of shared-memory stages); got "
                   f"{config.stages}")
    if config.split != 1:
        why.append(f"the wgmma template does not split K (split must be 1); got {config.split}")
    if config.group < 1:
        why.append(f"group must be at least 1; got {config.group}")
    if (config.cluster_m, config.cluster_n) not in CLUSTERS:
        why.append(f"clusters are 1x1, 2x1 (two tile rows share B's tile) or 1x2 (two tile "
                   f"columns share A's tile); got {config.cluster_m}x{config.cluster_n}")
    elif config.cluster > 1 and not config.tma:
        why.append("clusters share their TMA copies (multicast): they need TMA staging")
    if config.tma_store and not config.tma:
        why.append("the output tile is stored by TMA from the consumers' buffers beside the TMA "
                   "ring: a TMA store needs TMA staging")
    for name, op, outer in (("A", a, "m"), ("B", b, "n")):
        why += _gathered_refusals(name, op, config)
        why += _operand_refusals(name, op, outer, problem.batch)
        if config.tma and not op.batch_stride and not _ZERO_BASED.fullmatch(op.batch_offset):
            why.append(f"with TMA, operand {name} must start at its buffer's first element and "
                       f"step by a batch stride; its batch offset is {op.batch_offset!r}")
    if (need := smem_bytes_sm90(problem, config)) > SMEM_LIMIT:
        store = (f" and {config.bm // 64} staged 64x64 output box(es)" if config.tma_store
                 else "")
        why.append(f"{config.stages} stages of {config.bm}x{BK} + {config.bn}x{BK}{store} need "
                   f"{need} bytes of shared memory, over the {SMEM_LIMIT} a block may have")
    return why


# Batch offsets a tensor map can express without a stride: zero at bz = 0.
_ZERO_BASED = re.compile(r"\s*(0(LL)?|\(?bz\)?\s*\*\s*\d+(LL)?)\s*")


def _gathered_refusals(name: str, op: GemmOperand, c: GemmConfig) -> list[str]:
    """A gathered operand's tiles are made by the threads, not copied: only a computed one
    (an int8 weight dequantized) whose tiles' 16-byte chunks each come from one aligned vector
    of 8 raw elements, with cp.async staging (its raw bytes in a ring of their own)."""
    if not op.gathered:
        return []
    if not op.computed:
        return [f"operand {name} is gathered element by element (an implicit GEMM's); the "
                f"wgmma template's tiles come in 16-byte chunks: use mma"]
    why = []
    if op.vector != 8:
        why.append(f"operand {name} is computed one element at a time (its rows are not whole "
                   f"aligned vectors of 8 raw elements); the wgmma template computes 16-byte "
                   f"chunks: use mma")
    if c.tma:
        why.append(f"operand {name} is computed (a dequantized weight): TMA copies tiles "
                   f"untouched; use STAGE=async:N")
    return why


def _operand_refusals(name: str, op: GemmOperand, outer: str, batch: int) -> list[str]:
    """An operand must be contiguous along k (K-major) or along m / n (MN-major), and every
    16-byte copy must start 16-byte aligned (the other stride and the batch stride multiples
    of 8 elements)."""
    if op.k_contiguous:
        other, label = op.stride_outer, f"{outer}-stride"
    elif op.outer_contiguous:
        other, label = op.stride_k, "k-stride"
    else:
        return [f"operand {name} has no unit stride (stride_{outer}={op.stride_outer}, "
                f"stride_k={op.stride_k}); wgmma tiles are copied in 16-byte runs along k or "
                f"along {outer}"]
    why = []
    if other % 8:
        why.append(f"operand {name}'s {label} {other} is not a multiple of 8 elements, so its "
                   f"16-byte copies would not be 16-byte aligned")
    if batch > 1 and (op.batch_stride is None or op.batch_stride % 8):
        why.append(f"operand {name}'s batch offset must be a batch stride that is a multiple of "
                   f"8 elements (16-byte aligned copies); got batch_stride={op.batch_stride}")
    return why


def gemm_sm90_body(problem: GemmProblem, config: GemmConfig, epilogue: Epilogue, *,
                   sm_count: int, gather: dict[str, VectorGather] | None = None) -> Body:
    """The kernel body for `problem` with `config` (which constraints_sm90 accepted); a TmaBody
    when config.tma, whose grid is persistent: min(tiles, sm_count) blocks walk the tiles.
    `gather` has the computed operands' element functions ("a", "b"): see
    _cp_async_mainloop."""
    p, c = problem, config
    gather = gather or {}
    tiles_m, tiles_n = _cdiv(p.m, c.bm), _cdiv(p.n, c.bn)
    tiles = p.batch * tiles_m * tiles_n
    ta, tb = int(not p.a.k_contiguous), int(not p.b.k_contiguous)
    a_bytes = c.bm * BK * 2
    head = [
        f"// emmy gemm_sm90: C[bz] ({p.m}x{p.n}) = A[bz] ({p.m}x{p.k}) @ B[bz] ({p.k}x{p.n}), "
        f"batch {p.batch}; tile {c.bm}x{c.bn}x{BK}, {c.bm // 64} consumer warpgroup(s), "
        f"{c.stages}-stage {'TMA' if c.tma else 'cp.async'} ring, wgmma m64n{c.bn}k16 "
        f"(A {'MN' if ta else 'K'}-major, B {'MN' if tb else 'K'}-major)",
        f"constexpr int M = {p.m}, N = {p.n}, KT = {_cdiv(p.k, BK)};",
        f"constexpr int BM = {c.bm}, BN = {c.bn}, BK = {BK}, STAGES = {c.stages};",
        f"constexpr int TILES_M = {tiles_m}, TILES_N = {tiles_n};",
        f"constexpr long long TILES = {tiles}LL;",
        f"constexpr unsigned STAGE = {a_bytes + c.bn * BK * 2}u;",
        "// the stage ring, aligned to the 1024-byte period of the 128-byte swizzle",
        "unsigned char* const smem = emmy_smem + ((1024u - (sm90_smem_addr(emmy_smem) & 1023u)) "
        "& 1023u);",
        "const unsigned smem_addr = sm90_smem_addr(smem);",
    ]
    bf16 = "true" if p.a.ctype == "__nv_bfloat16" else "false"
    wgmmas = [
        "  wgmma_fence();",
        "#pragma unroll",
        "  for (int j = 0; j < 4; ++j)",
        f"    wgmma_m64k16<{c.bn}, {bf16}, {ta}, {tb}>(acc, a_desc + slot + j * "
        f"{2048 >> 4 if ta else 32 >> 4}, b_desc + slot + j * {2048 >> 4 if tb else 32 >> 4}, 1);",
        "  wgmma_commit();",
    ]
    consumer = [
        f"const int cw = tid / 128{' - 1' if c.tma else ''};  // this consumer warpgroup: rows "
        "64cw.. of the tile",
        _descriptor("a_desc", "smem_addr + 8192u * cw", ta),
        _descriptor("b_desc", f"smem_addr + {a_bytes}u", tb),
        f"float acc[{c.bn // 2}];",
    ]
    zero = ["#pragma unroll", f"for (int i = 0; i < {c.bn // 2}; ++i) acc[i] = 0.f;"]
    store = _store_lines(p, c, epilogue)
    if not c.tma:
        raw = {x: raw_vector(op, gather[x]) for x, op in (("a", p.a), ("b", p.b)) if op.computed}
        computed = [line for x, op in (("a", p.a), ("b", p.b)) if op.computed
                    for line in computed_lambdas(x, op, gather[x])]
        if computed:    # outside _private: the element functions name the kernel's buffers
            computed = ["// the computed operands' element functions (emmy.cuda.gemm)",
                        f"const long long bz = {PREFIX}bz;",
                        f"using gm_t = {STORAGE[p.a.ctype]};", *computed]
        lines = [*_private(head + _decode("bid", c)), *computed,
                 *_private(consumer + zero + _cp_async_mainloop(p, c, wgmmas, raw)
                           + _drained(c)), *store]
        return Body(lines=_buffers(lines, p), grid=tiles, threads=2 * c.bm,
                    smem_bytes=smem_bytes_sm90(p, c))
    if c.cluster > 1:
        units = p.batch * _cdiv(tiles_m, c.cluster_m) * _cdiv(tiles_n, c.cluster_n)
        head += [
            f"constexpr int CM = {c.cluster_m}, CN = {c.cluster_n};   // tiles per cluster along "
            "m and n",
            f"constexpr int UNITS_M = {_cdiv(tiles_m, c.cluster_m)}, UNITS_N = "
            f"{_cdiv(tiles_n, c.cluster_n)};",
            f"constexpr long long UNITS = {units}LL;     // clusters' worth of tiles",
            "const int rank = int(cluster_ctarank());   // this block's place in its cluster",
            f"const long long cid = bid / {c.cluster}, clusters = gridDim.x / {c.cluster};",
        ]
        grid = c.cluster * min(units, sm_count // c.cluster)
    else:
        grid = min(tiles, sm_count)
    staged = None
    if c.tma_store:
        staged = staged_of(epilogue)
        if staged is None:
            raise ValueError("config.tma_store needs an epilogue with a staged form (one store "
                             "of a 16-bit row-major output: emmy.cuda.gemm_spec.staged_of)")
        boxes = store_boxes(c, _ring_and_barriers(p, c))
        head += [f"constexpr unsigned BOXES = {boxes}u;   // 64x64 output boxes per consumer "
                 "warpgroup, after the ring",
                 f"constexpr unsigned OUT = {c.bm // 64 * boxes * BOX_BYTES}u;"]
        store = _staged_store_lines(p, c, *staged, boxes)
    setup, producer, consume = _tma_mainloop(p, c, wgmmas)
    regs = _REGISTERS.get(2 * c.bm + 128)
    give = [f"setmaxnreg_dec<{regs[0]}>();   // the producer needs few registers"] if regs else []
    take = [f"setmaxnreg_inc<{regs[1]}>();   // the consumers hold the accumulators"] \
        if regs else []
    consumers = [*_private(consumer + ["int it = 0;                 // k-tiles consumed so far",
                                       _walk(c)]
                           + _indent(_decode("w", c) + zero + consume
                                     + _drained(c, release=True))),
                 *_indent(store), "}"]
    if staged is not None:
        consumers.append("if (tid % 128 == 0) tma_store_wait<0>();   // the tile's stores have "
                         "read the buffer before the block's shared memory goes")
    lines = [*_private(head + setup),
             "if (tid < 128) {                     // the producer warpgroup",
             *_indent(give + _private(producer)), "} else {                             "
             "// the consumer warpgroups", *_indent(take + consumers), "}"]
    if c.cluster > 1:
        lines.append("cluster_sync();   // no block leaves while its peer may still copy into its "
                     "shared memory or arrive on its barriers")
    return TmaBody(lines=_buffers(lines, p), grid=grid, threads=2 * c.bm + 128,
                   smem_bytes=smem_bytes_sm90(p, c),
                   tensor_maps=_tensor_maps(p, c) + _output_map(p, staged[0] if staged else None),
                   min_blocks=1 if regs else 0, cluster=c.cluster, persistent=True)


# Threads per block -> (producer, consumer) registers per thread for setmaxnreg: with two
# consumer warpgroups and __launch_bounds__(384, 1) each thread starts with 168 (65,536 / 384,
# rounded down to 8); the producer gives back 128, the consumers take 64 more each (232: the
# 128 accumulators of m64n256 and room for the addresses). One consumer warpgroup (256
# threads) already gets 255 at entry.
_REGISTERS = {384: (40, 232)}


def _walk(c: GemmConfig) -> str:
    """The persistent loop over work units: tiles, or with clusters the clusters' units of
    CM x CN tiles (a cluster's blocks take the same units)."""
    if c.cluster > 1:
        return "for (long long w = cid; w < UNITS; w += clusters) {"
    return "for (long long w = bid; w < TILES; w += gridDim.x) {"


def _decode(index: str, c: GemmConfig) -> list[str]:
    """(bz, tm, tn, m0, n0) of work unit `index` (batch-major, then the raster within a batch);
    with clusters the raster orders the units and the block's rank picks its tile in one."""
    if c.cluster == 1:
        return [f"const long long bz = {index} / (TILES_M * TILES_N);",
                f"const int tile = int({index} % (TILES_M * TILES_N));",
                *_raster(c.group), "const int m0 = tm * BM, n0 = tn * BN;"]
    return [f"const long long bz = {index} / (UNITS_M * UNITS_N);",
            f"const int tile = int({index} % (UNITS_M * UNITS_N));",
            *_raster(c.group, "UNITS_M", "UNITS_N", "um", "un"),
            "const int tm = um * CM + rank % CM, tn = un * CN + rank / CM;",
            "const int m0 = tm * BM, n0 = tn * BN;"]


def _release(c: GemmConfig, slot: str, when: str = "tid % 32 == 0") -> str:
    """A consumer warp frees slot `slot` of the ring: on its own `empty` barrier and, in a
    cluster, on the peer's too (the peer's producer multicasts into this block's slot)."""
    if c.cluster > 1:
        return (f"if ({when}) {{ mbar_arrive(&empty[{slot}]); "
                f"mbar_arrive_cluster(&empty[{slot}], rank ^ 1); }}")
    return f"if ({when}) mbar_arrive(&empty[{slot}]);"


def _drained(c: GemmConfig, release: bool = False) -> list[str]:
    """After a tile's last k-tile: its wgmmas are done (with TMA the consumer warps then free
    the last slot), and the accumulators may be read."""
    out = ["wgmma_wait<0>();"]
    if release:
        out.append(_release(c, "(it - 1) % STAGES"))
    return out + ["wgmma_fence_acc(acc);"]


def _edge_conds(p: GemmProblem, c: GemmConfig) -> list[str]:
    """The tests that an element (wg_row, wg_col) is inside the output, where some tile is not
    whole: ragged m or n, or a cluster's spare tile (past the last tile row or column)."""
    return ([f"{PREFIX}row < {PREFIX}M"] if p.m % c.bm or _cdiv(p.m, c.bm) % c.cluster_m
            else []) + \
           ([f"{PREFIX}col < {PREFIX}N"] if p.n % c.bn or _cdiv(p.n, c.bn) % c.cluster_n
            else [])


def _staged_store_lines(p: GemmProblem, c: GemmConfig, tile: StoredTile,
                        staged: StagedEpilogue, boxes: int) -> list[str]:
    """A consumer warpgroup's epilogue through its BOXES output boxes and TMA stores (see the
    module's docstring): round r covers the warpgroup's columns 64*BOXES*r.., each thread's
    pairs written at their swizzled place (row lrow's 16-byte chunk j at j ^ (lrow % 8)), then
    one thread stores the boxes. Elements outside the output are not computed (the store
    clips them)."""
    P = PREFIX
    rounds = c.bn // 64 // boxes
    conds = _edge_conds(p, c)
    acc = f"{P}acc[4 * ({8 * boxes} * {P}r + {P}i) + 2 * {P}h"
    dst = (f"reinterpret_cast<{tile.ctype}*>({P}cbuf + {P}i / 8 * {BOX_BYTES}u + {P}lrow * 128u "
           f"+ (unsigned({P}i % 8 ^ {P}lrow % 8) << 4) + 4u * unsigned(tid % 4))")
    pair = staged(f"{P}bz", f"{P}row", f"{P}col", f"{acc}]", f"{acc} + 1]", dst)
    inner = [f"const int {P}lrow = {P}srow + 8 * {P}h;",
             f"const int {P}row = {P}m0 + 64 * {P}cw + {P}lrow, {P}col = {P}n0 + "
             f"{64 * boxes} * {P}r + 8 * {P}i + 2 * (tid % 4);",
             *([f"if ({' && '.join(conds)}) {{", *_indent(pair), "}"] if conds else pair)]
    issue = ["if (tid % 128 == 0) {",
             "  #pragma unroll",
             f"  for (int {P}b = 0; {P}b < {boxes}; ++{P}b)",
             f"    tma_store_3d({P}tmap_c, {P}n0 + 64 * ({boxes} * {P}r + {P}b), {P}m0 + 64 * "
             f"{P}cw, int({P}bz), {P}cbuf + {P}b * {BOX_BYTES}u);",
             "  tma_store_commit();",
             "}"]
    return [
        f"// the tile through shared memory: {rounds} round(s) of {boxes} 64x64 box(es) per "
        "warpgroup, stored by TMA",
        f"const int {P}srow = 16 * (tid % 128 / 32) + tid % 32 / 4;   // this thread's first row "
        "of the warpgroup's 64",
        f"unsigned char* const {P}cbuf = {P}smem + {P}STAGES * {P}STAGE + {P}cw * {P}BOXES * "
        f"{BOX_BYTES}u;",
        "#pragma unroll",
        f"for (int {P}r = 0; {P}r < {rounds}; ++{P}r) {{",
        "  if (tid % 128 == 0) tma_store_wait_read<0>();   // the last stores have read the "
        "buffer",
        f"  warpgroup_bar({P}cw);",
        "  #pragma unroll",
        f"  for (int {P}i = 0; {P}i < {8 * boxes}; ++{P}i) {{",
        "    #pragma unroll",
        f"    for (int {P}h = 0; {P}h < 2; ++{P}h) {{",
        *_indent(inner, 3),
        "    }",
        "  }",
        "  tma_store_fence();            // the writes are visible to the copy engine ...",
        f"  warpgroup_bar({P}cw);         // ... every thread's",
        *_indent(issue),
        "}",
    ]


def _output_map(p: GemmProblem, tile: StoredTile | None) -> tuple[TensorMapSpec, ...]:
    """The output's 3-d tensor map for a TMA store: (columns, rows, batch), 64x64 boxes."""
    if tile is None:
        return ()
    size = ELEMENT_BYTES[tile.ctype]
    return (TensorMapSpec(PREFIX + "tmap_c", tile.buffer, tile.ctype, (p.n, p.m, p.batch),
                          (tile.row_stride * size,
                           (tile.batch_stride or tile.row_stride * p.m) * size),
                          (64, 64, 1), swizzle=1),)


def _store_lines(p: GemmProblem, c: GemmConfig, epilogue: Epilogue) -> list[str]:
    """The epilogue over a consumer thread's accumulators: acc[4i + 2h + cc] is C[row0 + 8h]
    [col0 + 8i + cc] (the wgmma D fragment), neighbouring columns stored together where the
    epilogue has a pair form."""
    conds = _edge_conds(p, c)
    out = _private([
        "// acc[4i + 2h + c] is C[row0 + 8h][col0 + 8i + c] (the wgmma D fragment)",
        "const int row0 = m0 + 64 * cw + 16 * (tid % 128 / 32) + tid % 32 / 4;",
        "const int col0 = n0 + 2 * (tid % 4);",
    ])
    pair = pair_of(epilogue)
    acc = f"{PREFIX}acc[4 * {PREFIX}i + 2 * {PREFIX}h"
    two = None if pair is None or p.n % 2 else \
        pair(f"{PREFIX}bz", f"{PREFIX}row", f"{PREFIX}col", f"{acc}]", f"{acc} + 1]")
    if two is not None:
        loops = [("i", c.bn // 8), ("h", 2)]
        inner = [f"const int {PREFIX}row = {PREFIX}row0 + 8 * {PREFIX}h, {PREFIX}col = "
                 f"{PREFIX}col0 + 8 * {PREFIX}i;"]
        stmts = two
    else:
        loops = [("i", c.bn // 8), ("h", 2), ("c", 2)]
        inner = [f"const int {PREFIX}row = {PREFIX}row0 + 8 * {PREFIX}h, {PREFIX}col = "
                 f"{PREFIX}col0 + 8 * {PREFIX}i + {PREFIX}c;"]
        stmts = epilogue(f"{PREFIX}bz", f"{PREFIX}row", f"{PREFIX}col",
                         f"{acc} + {PREFIX}c]")
    body = inner + ([f"if ({' && '.join(conds)}) {{", *_indent(stmts), "}"] if conds else stmts)
    for name, count in reversed(loops):
        body = ["#pragma unroll", f"for (int {PREFIX}{name} = 0; {PREFIX}{name} < {count}; "
                f"++{PREFIX}{name}) {{", *_indent(body), "}"]
    return out + body


def _cp_async_mainloop(p: GemmProblem, c: GemmConfig, wgmmas: list[str],
                       raw: dict[str, str] | None = None) -> list[str]:
    """All threads copy (cp.async) and multiply (`wgmmas`: one k-tile's wgmma issue). A
    computed operand (`raw`: "a" / "b" -> the C type of its raw vector) has its raw bytes
    copied into a ring of their own instead, alongside the other operand's tile, and each
    tile computed into its stage (swizzled as a copy would place it) once they have landed."""
    raw = raw or {}
    threads = 2 * c.bm
    inflight = 1 if c.stages >= 3 else 0          # wgmma groups left running across iterations
    ahead = c.stages - 1 - inflight               # k-tiles being copied while one is multiplied
    ops = (("a", p.a, c.bm, "m0", "M", "0", _BUFFER_A),
           ("b", p.b, c.bn, "n0", "N", str(c.bm * BK * 2), _BUFFER_B))
    setup = [f"const {op.ctype}* __restrict__ g{x} = {buf} + ({op.batch_offset});"
             for x, op, *_, buf in ops if x not in raw]
    load, compute = [], []
    for x, op, rows, origin, extent, base, _ in ops:
        setup += _copy_setup(x, op, rows, origin, extent, threads)
        if x not in raw:
            load += _copy(x, op, rows, origin, extent, threads, p, base)
            continue
        outer, k, ok, at = _computed_chunk(x, op, rows, origin, extent, threads, p)
        ring = f"smem + {_ring_offset(p, c, x)} + (kt % {c.stages}) * {_ring_bytes(op, rows)}"
        copy = f"em_cp_async<{op.raw_bytes(8)}>({ring} + {at}, gm_{x}_raw({outer}, {k}));"
        value = f"gm_{x}_vec({outer}, {k}, *reinterpret_cast<const {raw[x]}*>({ring} + {at}))"
        n = _chunks(rows, threads)
        load += ["#pragma unroll",
                 f"for (int i = 0; i < {n}; ++i) {f'if ({ok}) ' if ok else ''}{copy}"]
        compute += ["#pragma unroll",
                    f"for (int i = 0; i < {n}; ++i)",
                    f"  *reinterpret_cast<EmVec<8, gm_t>*>(s + {base} + "
                    f"{_chunk_dst(x, op, rows, threads)}) = "
                    f"{f'({ok}) ? {value} : EmVec<8, gm_t>{{}}' if ok else value};"]
    setup += [
        "// copies tile kt of A and B into slot kt % STAGES (zero past the edges)"
        f"{'; a computed operand its raw bytes into their ring' if raw else ''}",
        "auto load = [&](int kt) {",
        f"  unsigned char* const s = smem + (kt % {c.stages}) * STAGE;",
        f"  const int k0 = kt * {BK};",
        *_indent(load),
        "};",
    ]
    computed = []
    if raw:
        setup += ["// computes tile kt of the computed operand from its raw bytes into its slot",
                  "auto compute = [&](int kt) {",
                  f"  unsigned char* const s = smem + (kt % {c.stages}) * STAGE;",
                  f"  const int k0 = kt * {BK};",
                  *_indent(compute),
                  "};"]
        computed = ["  compute(kt);",
                    "  fence_proxy_async_shared();   // the computed tile, visible to wgmma",
                    "  __syncthreads();"]
    return setup + [
        "#pragma unroll",
        f"for (int t = 0; t < {ahead}; ++t) {{",
        "  if (t < KT) load(t);",
        "  cp_async_commit();",
        "}",
        "for (int kt = 0; kt < KT; ++kt) {",
        f"  cp_async_wait<{ahead - 1}>();      // this thread's copies of tile kt have landed",
        "  fence_proxy_async_shared();   // ... and are visible to wgmma (the async proxy)",
        f"  __syncthreads();              // everyone's have; the wgmmas of tile kt-{inflight + 1} "
        "are done",
        f"  if (kt + {ahead} < KT) load(kt + {ahead});",
        "  cp_async_commit();",
        *computed,
        f"  const uint64_t slot = uint64_t((kt % {c.stages}) * STAGE) >> 4;",
        *wgmmas,
        f"  wgmma_wait<{inflight}>();",
        "}",
    ]


def _ring_bytes(op: GemmOperand, rows: int) -> int:
    """One stage of a computed operand's raw ring: its rows x 64 raw elements."""
    return op.raw_bytes(rows * BK) if op.computed else 0


def _ring_offset(p: GemmProblem, c: GemmConfig, x: str) -> int:
    """Byte offset of operand x's raw ring in the aligned shared memory: after the stages (and
    A's ring)."""
    return c.stages * ((c.bm + c.bn) * BK * 2 + (x == "b") * _ring_bytes(p.a, c.bm))


def _tma_mainloop(p: GemmProblem, c: GemmConfig,
                  wgmmas: list[str]) -> tuple[list[str], list[str], list[str]]:
    """A producer thread copies by TMA, the consumer warpgroups multiply (`wgmmas`: one k-tile's
    wgmma issue). Both walk the same tiles (w = bid, bid + gridDim.x, ...) and count k-tiles
    across them (`it`), so slot it % STAGES and its phase carry on from tile to tile, and the
    producer fills the ring for the next tile while the consumers run this one's epilogue.
    Returns the barriers' setup (all threads), the producer warpgroup's lines, and the lines
    of one consumer k-tile."""
    a_loads = _tma_loads("tmap_a", p.a, c.bm, "m0", "0", shared=c.cluster_n > 1)
    b_loads = _tma_loads("tmap_b", p.b, c.bn, "n0", str(c.bm * BK * 2), shared=c.cluster_m > 1)
    warps = f"{c.bm // 16}" if c.cluster == 1 else f"{c.cluster} * {c.bm // 16}"
    setup = [
        "uint64_t* const full = reinterpret_cast<uint64_t*>(smem + STAGES * STAGE"
        + (" + OUT);" if c.tma_store else ");"),
        "uint64_t* const empty = full + STAGES;",
        "if (tid == 0) {",
        "  for (int s = 0; s < STAGES; ++s) {",
        "    mbar_init(&full[s], 1);              // the producer's arrive.expect_tx",
        f"    mbar_init(&empty[s], {warps});            // one arrival per consumer warp"
        + (" of the cluster" if c.cluster > 1 else ""),
        "  }",
        "  mbar_init_fence();",
        "}",
        "__syncthreads();" if c.cluster == 1 else
        "cluster_sync_after_init();   // the cluster's barriers are ready before any copy "
        "reaches them",
    ]
    producer = [
        "if (tid == 0) {                      // one thread of the producer warpgroup copies",
        f"  tma_map_acquire({PREFIX}tmap_a);      // the maps as the host wrote them",
        f"  tma_map_acquire({PREFIX}tmap_b);",
        "  int it = 0;",
        "  " + _walk(c),
        *("    " + line for line in _decode("w", c)),
        "    for (int kt = 0; kt < KT; ++kt, ++it) {",
        "      const int s = it % STAGES, k0 = kt * BK;",
        "      mbar_wait(&empty[s], ((it / STAGES) & 1) ^ 1);   // the consumers are done with "
        "the slot" + (" (the cluster's: the copies land in both blocks)" if c.cluster > 1 else ""),
        "      mbar_arrive_expect_tx(&full[s], STAGE);",
        "      unsigned char* const dst = smem + s * STAGE;",
        *("      " + line for line in a_loads + b_loads),
        "    }",
        "  }",
        "}",
    ]
    consumer = [
        "for (int kt = 0; kt < KT; ++kt, ++it) {",
        "  const int s = it % STAGES;",
        "  mbar_wait(&full[s], (it / STAGES) & 1);     // k-tile kt has landed",
        "  const uint64_t slot = uint64_t(s * STAGE) >> 4;",
        *wgmmas,
        "  wgmma_wait<1>();                     // k-tile kt-1's wgmmas are done: free its slot",
        "  " + _release(c, "(it - 1) % STAGES", "kt > 0 && tid % 32 == 0"),
        "}",
    ]
    return setup, producer, consumer


def _tma_loads(tmap: str, op: GemmOperand, rows: int, origin: str, base: str,
               shared: bool = False) -> list[str]:
    """The TMA copies of one operand's k-tile (K-major: one box of 64 k x rows; MN-major: one
    box of 64 (m or n) x 64 k per 8 KiB atom column). `shared`: the operand's tile is the same
    for both blocks of the cluster; each copies its half (_shared_half) to both."""
    name = PREFIX + tmap
    batch = "int(bz)" if op.batch_stride else "0"       # 0: one matrix for every batch
    if shared:
        return [f"tma_load_3d_multicast(dst + {base} + {at}, {name}, {c0}, {c1}, {batch}, "
                f"&full[s], {MULTICAST_MASK});" for at, c0, c1 in _shared_half(op, rows, origin)]
    if op.k_contiguous:
        return [f"tma_load_3d(dst + {base}, {name}, k0, {origin}, {batch}, &full[s]);"]
    return [f"tma_load_3d(dst + {base} + {ATOM_BYTES * j}, {name}, {origin} + {64 * j}, k0, "
            f"{batch}, &full[s]);" for j in range(rows // 64)]


def _shared_half(op: GemmOperand, rows: int, origin: str) -> list[tuple[str, str, str]]:
    """The copies of the half of a shared operand tile that block `rank` makes: (byte offset in
    the stage, coordinate 0, coordinate 1) each. K-major: rows/2 rows of 128 bytes; MN-major:
    rows/128 atom columns, or for a 64-wide tile its k-rows 32 rank.. (4 KiB, whole swizzle
    periods, so either half keeps the layout of the whole)."""
    if op.k_contiguous:
        return [(f"rank * {rows // 2 * 128}", "k0", f"{origin} + rank * {rows // 2}")]
    if rows >= 128:
        per = rows // 128                                # atom columns per block
        return [(f"(rank * {per} + {j}) * {ATOM_BYTES}" if per > 1 else f"rank * {ATOM_BYTES}",
                 f"{origin} + (rank * {per} + {j}) * 64" if per > 1 else f"{origin} + rank * 64",
                 "k0") for j in range(per)]
    return [("rank * 4096", origin, "k0 + rank * 32")]


def _box(op: GemmOperand, rows: int, shared: bool) -> tuple[int, int]:
    """The tensor map's box for one copy of an operand (see _tma_loads / _shared_half)."""
    if op.k_contiguous:
        return BK, rows // 2 if shared else rows
    return 64, 32 if shared and rows == 64 else BK


def _tensor_maps(p: GemmProblem, c: GemmConfig) -> tuple[TensorMapSpec, ...]:
    """The operands' 3-d tensor maps: (contiguous dimension, the other, batch); an operand
    that is not batched (or is broadcast over the batch) has one batch."""
    maps = []
    for tmap, op, outer, rows, shared in (("tmap_a", p.a, p.m, c.bm, c.cluster_n > 1),
                                          ("tmap_b", p.b, p.n, c.bn, c.cluster_m > 1)):
        size = op.itemsize
        box = _box(op, rows, shared)
        if op.k_contiguous:
            dims, other = (p.k, outer), op.stride_outer
        else:
            dims, other = (outer, p.k), op.stride_k
        batches, batch_stride = (p.batch, op.batch_stride) if op.batch_stride else (1, 0)
        maps.append(TensorMapSpec(PREFIX + tmap, op.buffer, op.ctype, (*dims, batches),
                                  (other * size, (batch_stride or other * dims[1]) * size),
                                  (*box, 1), swizzle=1))
    return tuple(maps)


# The body's own names, given a prefix so that they cannot clash with the kernel's parameters
# (buffer names) or with the epilogue's statements.
PREFIX = "wg_"
_LOCALS = re.compile(r"\b(M|N|KT|BM|BN|BK|STAGES|TILES|TILES_M|TILES_N|STAGE|bz|w|it|tile|first|rows|in_group|tm|tn|m0|n0|"
                     r"CM|CN|UNITS|UNITS_M|UNITS_N|um|un|rank|cid|clusters|BOXES|OUT|"
                     r"ga|gb|smem|smem_addr|[ab]_(?:row|chunk|src|dst|kb|nb|desc)|load|compute|s|k0|acc|t|"
                     r"kt|slot|j|row0|col0|i|h|c|row|col|bytes|cw|full|empty|dst)\b")


# The operands' buffers in the body's lines until _buffers names them (after _private, so that
# a buffer called like one of the body's names keeps its own).
_BUFFER_A, _BUFFER_B = "@A@", "@B@"


def _buffers(lines: list[str], p: GemmProblem) -> tuple[str, ...]:
    return tuple(line.replace(_BUFFER_A, p.a.buffer).replace(_BUFFER_B, p.b.buffer)
                 for line in lines)


def _private(lines: list[str]) -> list[str]:
    """`lines` with the body's names prefixed (comments left alone)."""
    out = []
    for line in lines:
        code, sep, comment = line.partition("//")
        out.append(_LOCALS.sub(lambda m: PREFIX + m.group(1), code) + sep + comment)
    return out


def _raster(group: int, rows_name: str = "TILES_M", cols_name: str = "TILES_N",
            tm: str = "tm", tn: str = "tn") -> list[str]:
    """(tm, tn) from the block's tile index: row-major, or grouped by `group` tile rows (each
    group of rows is walked column by column, so neighbouring blocks share B's tiles)."""
    if group == 1:
        return [f"const int {tm} = tile / {cols_name}, {tn} = tile % {cols_name};"]
    return [f"const int first = tile / ({group} * {cols_name}) * {group};",
            f"const int rows = {rows_name} - first < {group} ? {rows_name} - first : {group};",
            f"const int in_group = tile % ({group} * {cols_name});",
            f"const int {tm} = first + in_group % rows, {tn} = in_group / rows;"]


def _descriptor(name: str, start: str, mn_major: int) -> str:
    """Slot 0's descriptor, K step 0: 128-byte swizzle, SBO 1024; LBO is the MN-major atom
    column stride (K-major swizzled layouts ignore it; 16 is the documented 'assumed 1')."""
    lbo = ATOM_BYTES if mn_major else 16
    return f"const uint64_t {name} = wgmma_desc({start}, {lbo}u, 1024u, WGMMA_SWIZZLE_128B);"


def _chunks(rows: int, threads: int) -> int:
    """16-byte copies per thread for one operand's tile: rows x 64 elements, 8 per copy."""
    return rows * BK // 8 // threads


def _copy_setup(x: str, op: GemmOperand, rows: int, origin: str, extent: str,
                threads: int) -> list[str]:
    """Per-thread constants of the copies (the row or k-row and the chunk a thread owns).

    K-major: thread t copies chunk t % 8 (k 8c..8c+7) of rows t/8 + i*(threads/8).
    MN-major: with C = rows/8 chunks per k-row, thread t copies chunk t % C (8 of m or n) of
    k-rows t/C + i*(threads/C). Either way the row's swizzle phase (row % 8) is the thread's."""
    if op.k_contiguous:
        return [f"const int {x}_row = tid / 8, {x}_chunk = tid % 8;",
                *([] if op.computed else
                  [f"const {op.ctype}* const {x}_src = g{x} + (long long)({origin} + {x}_row) * "
                   f"{op.stride_outer}LL + 8 * {x}_chunk;"]),
                f"const unsigned {x}_dst = {x}_row * 128u + ((({x}_chunk ^ {x}_row) & 7u) << 4);"]
    per_row = rows // 8
    lines = [f"const int {x}_row = tid / {per_row}, {x}_chunk = tid % {per_row};",
             *([] if op.computed else
               [f"const {op.ctype}* const {x}_src = g{x} + (long long){x}_row * {op.stride_k}LL + "
                f"{origin} + 8 * {x}_chunk;"])]
    if threads // per_row % 8 == 0:                      # the same swizzle phase for every copy
        lines.append(f"const unsigned {x}_dst = ({x}_chunk / 8) * {ATOM_BYTES}u + ({x}_row / 8) "
                     f"* 1024u + ({x}_row % 8) * 128u + (((({x}_chunk % 8) ^ {x}_row) & 7u) << 4);")
    return lines


def _copy(x: str, op: GemmOperand, rows: int, origin: str, extent: str, threads: int,
          p: GemmProblem, base: str) -> list[str]:
    """The copies of one operand's tile for k-tile k0 into stage `s` (at byte `base`)."""
    n = _chunks(rows, threads)
    full_rows = {"M": p.m, "N": p.n}[extent] % rows == 0
    dst = f"s + {base} + {_chunk_dst(x, op, rows, threads)}"
    if op.k_contiguous:
        step = threads // 8                              # rows between a thread's copies
        row_ok = "true" if full_rows else f"{origin} + {x}_row + {step} * i < {extent}"
        if p.k % BK == 0:
            nbytes = "16"
        else:
            nbytes = f"{x}_kb >= 8 ? 16 : ({x}_kb > 0 ? 2 * {x}_kb : 0)"
        lines = [] if p.k % BK == 0 else [f"const int {x}_kb = {p.k} - k0 - 8 * {x}_chunk;"]
        src = f"{x}_src + k0 + {step * op.stride_outer}LL * i"
    else:
        per_row = rows // 8
        step = threads // per_row                        # k-rows between a thread's copies
        row_ok = "true" if p.k % BK == 0 else f"k0 + {x}_row + {step} * i < {p.k}"
        if full_rows:
            nbytes = "16"
            lines = []
        else:
            nbytes = f"{x}_nb >= 8 ? 16 : ({x}_nb > 0 ? 2 * {x}_nb : 0)"
            lines = [f"const int {x}_nb = {extent} - {origin} - 8 * {x}_chunk;"]
        src = f"{x}_src + (long long)k0 * {op.stride_k}LL + {step * op.stride_k}LL * i"
    if row_ok == "true" and nbytes == "16":
        copy = f"cp_async_16({dst}, {src});"
        return lines + ["#pragma unroll", f"for (int i = 0; i < {n}; ++i) {copy}"]
    return lines + [
        "#pragma unroll",
        f"for (int i = 0; i < {n}; ++i) {{",
        f"  const int bytes = {row_ok} ? ({nbytes}) : 0;",
        f"  cp_async_16_zfill({dst}, bytes ? {src} : g{x}, bytes);",
        "}",
    ]


def _chunk_dst(x: str, op: GemmOperand, rows: int, threads: int) -> str:
    """The swizzled byte offset in its stage of a thread's i-th 16-byte chunk of an operand's
    tile (see _copy_setup)."""
    if op.k_contiguous:
        return f"{x}_dst + {threads // 8 * 128} * i"
    step = threads // (rows // 8)                        # k-rows between a thread's chunks
    if step % 8 == 0:
        return f"{x}_dst + {step // 8 * 1024} * i"
    kr = f"({x}_row + {step} * i)"                       # the swizzle phase changes with i
    return (f"({x}_chunk / 8) * {ATOM_BYTES}u + {kr} / 8 * 1024u + {kr} % 8 * 128u + "
            f"(((({x}_chunk % 8) ^ {kr}) & 7u) << 4)")


def _computed_chunk(x: str, op: GemmOperand, rows: int, origin: str, extent: str, threads: int,
                    p: GemmProblem) -> tuple[str, str, str, str]:
    """A computed operand's i-th chunk of a thread for k-tile k0 (8 elements from one vector
    of 8 raw ones): (its outer index, its k, the test that it is inside the matrix ("" when
    every one is), the raw vector's byte offset in its stage of the raw ring)."""
    raw, v = op.raw_bytes(BK), op.raw_bytes(8)
    if op.k_contiguous:
        row = f"({x}_row + {threads // 8} * i)"
        outer, k = f"{origin} + {row}", f"k0 + 8 * {x}_chunk"
        ok = ([f"{outer} < {extent}"] if {"M": p.m, "N": p.n}[extent] % rows else []) + \
            ([f"{k} < {p.k}"] if p.k % BK else [])
        at = f"{row} * {raw} + {x}_chunk * {v}"
    else:
        kr = f"({x}_row + {threads // (rows // 8)} * i)"
        outer, k = f"{origin} + 8 * {x}_chunk", f"k0 + {kr}"
        ok = ([f"{k} < {p.k}"] if p.k % BK else []) + \
            ([f"{outer} < {extent}"] if {"M": p.m, "N": p.n}[extent] % rows else [])
        at = f"{kr} * {op.raw_bytes(rows)} + {x}_chunk * {v}"
    return outer, k, " && ".join(ok), at
