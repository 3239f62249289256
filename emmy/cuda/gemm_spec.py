"""What a matrix-product kernel template is given: the problem (sizes, operand layouts) and the
configuration a schedule row chose. Shared by the templates (emmy.cuda.gemm for mma.sync and
SIMT, emmy.cuda.gemm_sm90 for wgmma) and by the compiler stage that fills them from Tile IR.

Conventions
- The product is C[bz, m, n] = sum_k A[bz, m, k] * B[bz, k, n], accumulated in f32.
- An operand is addressed by two element strides and a batch offset, so transposed and
  permuted operands need no copy: A[bz, m, k] = a[batch_offset(bz) + m*stride_outer + k*stride_k]
  and B[bz, k, n] = b[batch_offset(bz) + n*stride_outer + k*stride_k]; or it is gathered: the
  compiler gives a function computing each element (see Gather).
- A template writes no output itself: it calls the epilogue, which returns C statements for one
  output element (the compiler's fused bias / activation / residual / store), once per element
  of C inside the bounds check.
- A template's body is the inside of a kernel function whose signature the CUDA emitter prints
  (`extern "C" __global__ void __launch_bounds__(threads[, min_blocks]) name(params)`); in
  scope are `const int tid = threadIdx.x`, `const long long bid = blockIdx.x`, the parameters
  by buffer name, and, when smem_bytes > 0, `extern __shared__ __align__(16) unsigned char
  emmy_smem[]`. Grids are one-dimensional: a template decodes bid itself (batch, tile, split),
  or, with a persistent grid, walks its tiles from bid in steps of gridDim.x.
- Where a thread holds neighbouring output columns it may store them with the epilogue's pair
  form (pair_of below) instead of calling the epilogue per element.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# Split reductions' scratch, by the names the templates' bodies use: PARTIAL, the f32 partial
# results (combine and last modes); TICKETS, per output tile (attention: per query block) the
# int count of blocks that have stored their partials (last mode: zero before the first launch
# and after each).
PARTIAL = "emmy_partial"
TICKETS = "emmy_tickets"


def last_block_lines(tickets: str, slot: str, count: int) -> list[str]:
    """C statements after a block has stored its partials (split_mode "last": the products',
    split-KV attention's and the row kernels' splits): fence them, take a ticket at
    tickets[slot] (thread `tid` 0, the vote by __syncthreads_or); every block but the one that
    takes the count-th returns, and that one fences again (the other blocks' partials are then
    visible to it) and leaves the ticket at zero for the next launch. What follows runs in the
    last block alone."""
    return ["__threadfence();   // this block's partials, before its ticket",
            "__syncthreads();",
            "{",
            "  int em_last = 0;",
            f"  if (tid == 0) em_last = atomicAdd({tickets} + ({slot}), 1) == {count - 1};",
            "  if (!__syncthreads_or(em_last)) return;",
            "}",
            "__threadfence();   // the other blocks' partials, after their tickets",
            f"if (tid == 0) {tickets}[{slot}] = 0;   // for the next launch"]

# epilogue(bz, row, col, acc) -> C statements storing one output element; the arguments are C
# expressions (64-bit batch index, int row in 0..m, int col in 0..n, the f32 accumulator value).
Epilogue = Callable[[str, str, str, str], list[str]]
# pair(bz, row, col, acc0, acc1) -> C statements storing the elements at columns col and col + 1
# (col even, both inside the bounds) with two-element vector accesses, or None when this
# epilogue cannot (an access could start misaligned, or the stores are atomic). An epilogue
# may carry one as its `pair` attribute; templates whose threads hold neighbouring columns
# (the mma.sync and wgmma accumulator fragments) ask pair_of(epilogue) first.
PairEpilogue = Callable[[str, str, str, str, str], "list[str] | None"]


# gather(outer, k) -> (C statements, C expression): an operand element the compiler computes
# (an implicit GEMM: a convolution's input under its window, zero in the padding) at row
# (column) `outer` and reduction index `k` of batch `bz`, both inside the matrix; the
# expression's type is float (f16/bf16 values are widened, exactly).
Gather = Callable[[str, str], "tuple[list[str], str]"]


@dataclass(frozen=True)
class WindowGather:
    """A gathered operand in window form (emmy.tile_ir.window): element (outer, k) is
    `all(lo_i <= o_i + k_i < hi_i) ? buffer[base + k_offset] : 0`, where (base, o_i) depend
    on the row (column) and the batch only, and (k_offset, k_i) on k only. The template
    tabulates the k side in shared memory once per block (one int2 per k: the offset, and
    each k_i - lo of `k_bounds` packed into one word) and computes the outer side per thread."""

    buffer: str
    # flat outer index (C) -> (statements, base offset, the o_i of the ranges); `bz` in scope
    outer: Callable[[str], "tuple[list[str], str, tuple[str, ...]]"]
    # k (C) -> (the k offset, the k_i of the ranges with a k side)
    k: Callable[[str], "tuple[str, tuple[str, ...]]"]
    ranges: tuple[tuple["int | None", "int | None", bool], ...]  # (lo, hi, has a k side)
    k_bounds: tuple[tuple[int, int], ...]   # [min, max] of each k_i, in order


@dataclass(frozen=True)
class VectorGather:
    """A computed operand (emmy.tile_ir.contract: a dequantized weight) read `width` elements
    at a time: one vector load of the `width` consecutive raw elements of its main load
    (consecutive along the tile's columns, every vector aligned: GemmOperand.vector), then
    each element computed from its raw value."""

    buffer: str           # the raw buffer
    ctype: str            # its C element type ("signed char")
    width: int
    # (outer, k) -> (statements, the raw element's offset in `buffer`); `bz` in scope
    offset: Callable[[str, str], "tuple[list[str], str]"]
    # (outer, k, j) -> (statements, value) of element j of the vector at (outer, k): at k + j
    # where the tiles' columns run along k, else at outer + j; its raw value is `gm_raw[j]`
    element: Callable[[str, str, int], "tuple[list[str], str]"]
    # paired (GemmOperand.paired): (outer, k, j) -> (statements, the name of a __half2 /
    # __nv_bfloat162 of elements j and j + 1), the raw vector's words in `gm_raww`
    pair: "Callable[[str, str, int], tuple[list[str], str]] | None" = None
    # paired: (outer, k) -> statements once a vector, before its pairs (whose statements may
    # read what they define: a zero point word, a vector of scales)
    prologue: "Callable[[str, str], list[str]] | None" = None


def pair_of(epilogue: Epilogue) -> PairEpilogue | None:
    return getattr(epilogue, "pair", None)


@dataclass(frozen=True)
class StoredTile:
    """Where an epilogue's one store puts output element (bz, row, col):
    buffer[bz * batch_stride + row * row_stride + col], of C type `ctype`."""

    buffer: str
    ctype: str
    row_stride: int
    batch_stride: int


# The staged form of an epilogue, for templates that stage the output tile in shared memory
# and store it whole (TMA): (bz, row, col, v0, v1, dst) -> the statements of pair_of's form,
# with the pair's two elements stored at `dst` (a pointer of the output's element type)
# instead of their place in the output.
StagedEpilogue = Callable[[str, str, str, str, str, str], "list[str]"]


def staged_of(epilogue: Epilogue) -> "tuple[StoredTile, StagedEpilogue] | None":
    """The epilogue's output tile and staged form, where it has one: it stores two 16-bit
    elements of one row-major output once, unconditionally (emmy.kernel_ir.elements
    .element_staged)."""
    form = getattr(epilogue, "staged", None)
    return form() if form is not None else None


ELEMENT_BYTES = {"__half": 2, "__nv_bfloat16": 2, "float": 4}


@dataclass(frozen=True)
class GemmOperand:
    buffer: str           # the kernel parameter's name
    ctype: str            # "__half" | "__nv_bfloat16" | "float"
    stride_outer: int     # A: elements from row m to m+1; B: from column n to n+1
    stride_k: int         # elements from k to k+1
    batch_offset: str     # C expression (long long) of batch `bz`'s first element, e.g. "bz * 4096LL"
    batch_stride: int | None = 0  # the offset as a stride: 0 when the operand is not batched
                                  # (or broadcast over the batch), None when not affine in bz
    gathered: bool = False  # its elements come from a Gather (element by element, synchronous
                            # copies); the strides then only say which way its tiles are laid
                            # out (stride_k 1: k-major)
    windowed: bool = False  # gathered through a WindowGather: a table of one int2 per k in
                            # shared memory
    start: int = 0          # elements before batch 0's first element in the buffer (a slice's
                            # offset): 16-byte copies need it aligned too
    computed: bool = False  # gathered: arithmetic on loads (a dequantized int8 weight) rather
                            # than a window over one tensor
    read_bytes: int = 0     # bytes of memory an element reads, where not its itemsize (a
                            # computed operand's: its int8 weight's one byte)
    vector: int = 1         # a computed operand's elements fetched this many at a time along
                            # its tiles' columns (VectorGather), where every vector is aligned
    paired: bool = False    # a vector computed two elements at a time on 16-bit pairs
                            # (emmy.tile_ir.contract.pair_kinds: 8-bit raw data, 16-bit math)
    packing: int = 1        # a computed operand's elements a raw element holds (int4
                            # weights two to a byte: 2)

    @property
    def itemsize(self) -> int:
        return ELEMENT_BYTES[self.ctype]

    @property
    def bytes_read(self) -> float:
        """Bytes of memory one element costs to read (half a byte for an int4 weight)."""
        return self.read_bytes / self.packing if self.read_bytes else self.itemsize

    def raw_bytes(self, elements: int) -> int:
        """Bytes of a computed operand's raw data holding `elements` elements (a whole
        number of raw elements: vectors and tiles are)."""
        return elements * self.read_bytes // self.packing

    @property
    def k_contiguous(self) -> bool:
        return self.stride_k == 1

    @property
    def outer_contiguous(self) -> bool:
        return self.stride_outer == 1


@dataclass(frozen=True)
class GemmProblem:
    m: int
    n: int
    k: int
    batch: int
    a: GemmOperand
    b: GemmOperand

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


@dataclass(frozen=True)
class GemmConfig:
    inst: str             # "mma": mma.sync m16n8k16 (f16/bf16 -> f32); "simt": f32 FFMA;
                          # "tf32": mma.sync m16n8k8 on tf32-rounded f32 operands;
                          # "wgmma": wgmma.mma_async (sm_90a, emmy.cuda.gemm_sm90)
    bm: int               # block tile
    bn: int
    bk: int
    wm: int               # warps along M and along N (threads = 32 * wm * wn)
    wn: int
    stages: int           # 1: synchronous loads into one shared buffer; 2..4: a cp.async ring
    split: int = 1        # blocks sharing one output tile's K range
    split_mode: str = ""  # "atomic" (epilogue adds into zeroed outputs) | "combine" (see below)
                          # | "last" (the last block of a tile sums the partials: gemm.py)
    group: int = 1        # launch order: 1 row-major over tiles; G > 1 grouped by G tile rows
    tma: bool = False     # wgmma only: operands loaded by TMA (else cp.async)
    cluster_m: int = 1    # TMA only: thread-block clusters of cluster_m x cluster_n tiles that
    cluster_n: int = 1    # share the operand tile they have in common (multicast copies)
    tma_store: bool = False  # TMA only: the output tile staged in shared memory (the epilogue's
                             # staged form, staged_of) and stored by TMA

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn

    @property
    def partial_sums(self) -> bool:
        """The product's blocks store f32 partial sums (split_mode combine or last)."""
        return self.split_mode in ("combine", "last")

    @property
    def cluster(self) -> int:
        return self.cluster_m * self.cluster_n


@dataclass(frozen=True)
class Body:
    """A template's output: the lines inside the function, and how to launch it."""

    lines: tuple[str, ...]
    grid: int
    threads: int
    smem_bytes: int
    min_blocks: int = 0   # 1: the kernel is declared __launch_bounds__(threads, 1) (a register
                          # cap at entry, which setmaxnreg needs); 0: __launch_bounds__(threads)
    cluster: int = 1      # > 1: blocks form clusters of this many along x (__cluster_dims__)
    persistent: bool = False  # the blocks walk the work in steps of gridDim.x, so any grid (a
                              # multiple of the cluster) computes it all; `grid` is the largest
                              # useful one, and a launch may use fewer blocks
