"""Hopper wgmma: the CPU emulation of wgmma.mma_async (emmy_sm90.cuh) against numpy, for every
shared-memory layout a descriptor can name, and the sm_90a matrix-product template
(emmy.cuda.gemm_sm90, cp.async and TMA loads) on the emulator, through NVRTC, and (marked gpu)
on the hardware, where the same layouts, products and tensor maps are checked."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from emmy.cuda.emulate.run import build_and_run
from emmy.cuda.gemm_sm90 import HEADER, TmaBody, constraints_sm90, gemm_sm90_body
from emmy.cuda.gemm_spec import GemmConfig, GemmOperand, GemmProblem, StoredTile
from emmy.cuda.nvrtc import compile_cuda
from emmy.cuda.sass import cuobjdump, disassemble
from emmy.schedule.targets import get_target
from tests.cuda.gpu import run_on_gpu, seconds, torch_launcher

rng = np.random.default_rng(90)

# --- one wgmma on a shared-memory image the test lays out -------------------------------------

PROBE = r"""
#include "emmy_kernel.cuh"
#include "emmy_sm90.cuh"

// One warpgroup: `image` is copied to 1024-aligned dynamic shared memory, one wgmma runs on the
// descriptors (their start addresses relative to that copy), every thread writes its N/2
// accumulators to out[thread][...]. With accumulate, D starts as 0.25 * (i % 8) in register i.
template <int N, bool BF16, int TA, int TB>
__device__ void probe(float* out, const unsigned char* image, int bytes, long long da,
                      long long db, int accumulate) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int t = threadIdx.x;
    unsigned char* s = smem + ((1024 - (sm90_smem_addr(smem) & 1023)) & 1023);
    for (int i = t; i < bytes; i += 128) s[i] = image[i];
    fence_proxy_async_shared();
    __syncthreads();
    const uint64_t base = sm90_smem_addr(s) >> 4;
    float d[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) d[i] = accumulate ? 0.25f * (i % 8) : 0.f;
    wgmma_fence_acc(d);
    wgmma_fence();
    wgmma_m64k16<N, BF16, TA, TB>(d, uint64_t(da) + base, uint64_t(db) + base, accumulate);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_acc(d);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) out[t * (N / 2) + i] = d[i];
}

"""
PROBE += "".join(
    f'extern "C" __global__ void __launch_bounds__(128) probe_{n}_{kind}_{ta}{tb}(\n'
    f"    float* out, const unsigned char* image, int bytes, long long da, long long db,\n"
    f"    int accumulate) {{\n"
    f"    probe<{n}, {str(kind == 'bf16').lower()}, {ta}, {tb}>(out, image, bytes, da, db, "
    f"accumulate);\n}}\n"
    for n in (64, 128, 256) for kind in ("f16", "bf16") for ta in (0, 1) for tb in (0, 1))

SWIZZLE = {"none": 0, "128B": 1, "64B": 2, "32B": 3}
WIDTH = {"none": 16, "128B": 128, "64B": 64, "32B": 32}


def sixteen_bit(kind, shape):
    """Random values exactly representable in the 16-bit format, as (float64 values, raw bits)."""
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "f16":
        h = x.astype(np.float16)
        return h.astype(np.float64), h.view(np.uint16)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64), bits


def swizzled(addr, mode):
    """A W-byte swizzle: the 16-byte chunk index (bits 4..) XOR the row in the 8-row pattern
    (bits 7..), over the absolute shared-memory address."""
    if mode == "none":
        return addr
    mask = WIDTH[mode] // 16 - 1
    return addr ^ (((addr >> 7) & mask) << 4)


class Layout:
    """Where a tile stores operand element (mn, k), k < 16, and the descriptor that says so.

    K-major: the 16 k of a row are contiguous (at k_offset within a swizzled row, to exercise
    K steps inside a 128-byte row); MN-major: mn is contiguous. `mn_outer` picks which of the
    two repeats (8-row groups / atoms along MN, or along K) lies further apart in memory."""

    def __init__(self, mode: str, mn_major: bool, rows: int, k_offset: int = 0,
                 mn_outer: bool = True):
        self.mode, self.mn_major, self.rows = mode, mn_major, rows
        w = WIDTH[mode]
        self.start = 2 * k_offset if not mn_major else 0
        if not mn_major and mode != "none":
            # rows of w bytes, 8-row patterns of 8w bytes one after another
            self.sbo, self.lbo = 8 * w, 0
            self.bytes = rows * w
        elif not mn_major:
            # 8x8 core matrices of 128 bytes: 2 along K, rows/8 along MN
            self.sbo, self.lbo = (256, 128) if mn_outer else (128, 128 * rows // 8)
            self.bytes = rows * 32
        elif mode != "none":
            # atoms of (w/2 mn) x (8 k): w/2-element runs of mn per k row
            atoms = 2 * rows // w
            self.lbo, self.sbo = (16 * w, 8 * w) if mn_outer else (8 * w, 8 * w * atoms)
            self.bytes = 2 * rows * 16
        else:
            # core matrices of 8 mn x 8 k rows of 16 bytes
            self.sbo, self.lbo = (256, 128) if mn_outer else (128, 128 * rows // 8)
            self.bytes = rows * 32

    def offset(self, mn: int, k: int) -> int:
        w = WIDTH[self.mode]
        if not self.mn_major and self.mode != "none":
            logical = self.start + (mn // 8) * self.sbo + (mn % 8) * w + 2 * k
        elif not self.mn_major:
            logical = (mn // 8) * self.sbo + (k // 8) * self.lbo + (mn % 8) * 16 + (k % 8) * 2
        elif self.mode != "none":
            logical = (2 * mn // w) * self.lbo + (k // 8) * self.sbo + (k % 8) * w + (2 * mn) % w
        else:
            logical = (mn // 8) * self.sbo + (k // 8) * self.lbo + (k % 8) * 16 + (mn % 8) * 2
        return swizzled(logical, self.mode)

    def descriptor(self, base: int) -> int:
        """The 64-bit descriptor as a signed integer (the kernel takes a long long)."""
        d = (((base + self.start) >> 4) | (self.lbo >> 4) << 16 | (self.sbo >> 4) << 32
             | SWIZZLE[self.mode] << 62)
        return d - (1 << 64) if d >> 63 else d


def d_position(thread, i):
    """Where accumulator i of warpgroup thread `thread` sits in the 64xN result."""
    w, lane = divmod(thread, 32)
    g, q = divmod(lane, 4)
    chunk, rest = divmod(i, 4)
    h, c = divmod(rest, 2)
    return 16 * w + g + 8 * h, 8 * chunk + 2 * q + c


def probe_case(kind, n, a_layout, b_layout, accumulate):
    """The kernel name, its arguments, and the expected 64xN result."""
    a, a_bits = sixteen_bit(kind, (64, 16))
    b, b_bits = sixteen_bit(kind, (16, n))
    a_base = 0
    b_base = (a_layout.bytes + a_layout.start + 1023) // 1024 * 1024
    image = np.zeros(b_base + b_layout.bytes + b_layout.start + 64, np.uint16)
    for m in range(64):
        for k in range(16):
            image[(a_base + a_layout.offset(m, k)) // 2] = a_bits[m, k]
    for col in range(n):
        for k in range(16):
            image[(b_base + b_layout.offset(col, k)) // 2] = b_bits[k, col]
    image = image.view(np.uint8).copy()
    expected = a @ b
    if accumulate:
        init = np.zeros((64, n))
        for t in range(128):
            for i in range(n // 2):
                init[d_position(t, i)] = 0.25 * (i % 8)
        expected = expected + init
    name = f"probe_{n}_{kind}_{int(a_layout.mn_major)}{int(b_layout.mn_major)}"
    out = np.zeros((128, n // 2), np.float32)
    args = [out, image, image.size, a_layout.descriptor(a_base), b_layout.descriptor(b_base),
            int(accumulate)]
    return name, args, expected, image.size + 1024


def gather_d(out, n):
    d = np.zeros((64, n))
    for t in range(128):
        for i in range(n // 2):
            d[d_position(t, i)] = out[t, i]
    return d


def test_d_layout_covers_each_element_once():
    for n in (64, 128, 256):
        seen = sorted(d_position(t, i) for t in range(128) for i in range(n // 2))
        assert seen == [(r, c) for r in range(64) for c in range(n)]


def test_layouts_place_each_element_once():
    for mode in SWIZZLE:
        for mn_major in (False, True):
            for outer in (True, False):
                lay = Layout(mode, mn_major, 64, k_offset=16 if mode == "128B" else 0,
                             mn_outer=outer)
                offsets = {lay.offset(mn, k) for mn in range(64) for k in range(16)}
                assert len(offsets) == 64 * 16 and all(o % 2 == 0 for o in offsets)


def emulate(name, args, smem):
    r = build_and_run(PROBE, name, 1, 128, smem, args)
    assert r.ok, f"{r.status}: {r.log}"


LAYOUT_CASES = [(mode, a_mn, b_mn, outer) for mode in SWIZZLE for a_mn in (False, True)
                for b_mn in (False, True) for outer in (True, False)]


@pytest.mark.parametrize("mode,a_mn,b_mn,outer", LAYOUT_CASES)
def test_emulated_wgmma_reads_every_layout(mode, a_mn, b_mn, outer):
    k_offset = {"128B": 32, "64B": 16}.get(mode, 0)
    a_layout = Layout(mode, a_mn, 64, k_offset, outer)
    b_layout = Layout(mode, b_mn, 64, k_offset, not outer)
    name, args, expected, smem = probe_case("f16", 64, a_layout, b_layout, accumulate=outer)
    emulate(name, args, smem)
    np.testing.assert_allclose(gather_d(args[0], 64), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["f16", "bf16"])
@pytest.mark.parametrize("n", [64, 128, 256])
def test_emulated_wgmma_shapes_and_types(kind, n):
    a_layout = Layout("128B", False, 64, 16)
    b_layout = Layout("128B", n == 128, n, 16 if n != 128 else 0)
    name, args, expected, smem = probe_case(kind, n, a_layout, b_layout, accumulate=True)
    emulate(name, args, smem)
    np.testing.assert_allclose(gather_d(args[0], n), expected, rtol=1e-5, atol=1e-5)


MISUSE = r"""
#include "emmy_kernel.cuh"
#include "emmy_sm90.cuh"

// mode 0: no wgmma.fence; 1: warps pass different descriptors; 2: accumulators read before
// the wait (they still hold the old values); 3: a 96-thread block.
extern "C" __global__ void misuse(float* out, int mode) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int t = threadIdx.x;
    for (int i = t; i < 8192; i += blockDim.x) smem[i] = 0x3c;  // f16 bits 0x3c3c ~ 1.06
    __syncthreads();
    const uint64_t desc = wgmma_desc(sm90_smem_addr(smem), 0, 1024, WGMMA_SWIZZLE_128B);
    float d[32] = {};
    if (mode != 0) wgmma_fence();
    wgmma_m64k16<64, false, 0, 0>(d, desc + (mode == 1 ? (t / 32) * 2 : 0), desc, 0);
    wgmma_commit();
    out[t] = d[0];
    wgmma_wait<0>();
    out[blockDim.x + t] = d[0];
}
"""


@pytest.mark.parametrize("mode,message", [(0, "before any wgmma.fence"),
                                          (1, "reach different wgmma"),
                                          (3, "threads are running")])
def test_emulator_refuses_wgmma_misuse(mode, message):
    threads = 96 if mode == 3 else 128
    out = np.zeros(2 * threads, np.float32)
    r = build_and_run(MISUSE, "misuse", 1, threads, 8192, [out, mode])
    assert r.status == "error" and message in r.log, r.log


def test_accumulators_change_only_at_the_wait():
    out = np.zeros(256, np.float32)
    r = build_and_run(MISUSE, "misuse", 1, 128, 8192, [out, 2])
    assert r.ok, r.log
    value = float(np.float16(np.frombuffer(b"\x3c\x3c", np.float16)[0])) ** 2 * 16
    assert (out[:128] == 0).all()
    np.testing.assert_allclose(out[128:], value, rtol=1e-6)


def test_probe_compiles_for_sm90a_with_wgmma():
    r = compile_cuda(PROBE, get_target("sm_90a"), ptx=True)
    assert r.ok, r.log
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in r.ptx
    for kernel, res in r.resources.items():
        assert res.spill_store_bytes == 0 and res.spill_load_bytes == 0, (kernel, res)


# --- on a GPU: the hardware reads the same layouts --------------------------------------------

def gpu_probe_args(args):
    """The probe's arguments with the two descriptors typed 64-bit for the launch."""
    return [*args[:3], np.int64(args[3]), np.int64(args[4]), args[5]]


@pytest.mark.gpu
@pytest.mark.parametrize("mode,a_mn,b_mn,outer", LAYOUT_CASES)
def test_gpu_wgmma_reads_every_layout_like_the_emulator(mode, a_mn, b_mn, outer):
    k_offset = {"128B": 32, "64B": 16}.get(mode, 0)
    a_layout = Layout(mode, a_mn, 64, k_offset, outer)
    b_layout = Layout(mode, b_mn, 64, k_offset, not outer)
    name, args, expected, smem = probe_case("f16", 64, a_layout, b_layout, accumulate=outer)
    run_on_gpu(PROBE, name, 1, 128, smem, gpu_probe_args(args))
    np.testing.assert_allclose(gather_d(args[0], 64), expected, rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["f16", "bf16"])
@pytest.mark.parametrize("n", [64, 128, 256])
def test_gpu_wgmma_shapes_and_types(kind, n):
    a_layout = Layout("128B", False, 64, 16)
    b_layout = Layout("128B", n == 128, n, 16 if n != 128 else 0)
    name, args, expected, smem = probe_case(kind, n, a_layout, b_layout, accumulate=True)
    run_on_gpu(PROBE, name, 1, 128, smem, gpu_probe_args(args))
    np.testing.assert_allclose(gather_d(args[0], n), expected, rtol=1e-3, atol=1e-3)


# --- the template -----------------------------------------------------------------------------

CTYPE = {"f16": "__half", "bf16": "__nv_bfloat16"}


def operand(name, kind, outer, k, mn_major, batch, pad=0):
    """An operand stored [batch][outer][k] (K-major) or [batch][k][outer] (MN-major), with
    `pad` extra elements at the end of each contiguous run; batch 0: one matrix that every
    batch shares (broadcast)."""
    if mn_major:
        run, count = outer + pad, k
        strides = dict(stride_outer=1, stride_k=run)
    else:
        run, count = k + pad, outer
        strides = dict(stride_outer=run, stride_k=1)
    size = run * count
    offset = f"bz * {size}LL" if batch else "0LL"
    return GemmOperand(name, CTYPE[kind], batch_offset=offset,
                       batch_stride=size if batch > 1 else 0, **strides), size


def gemm_case(kind, m, n, k, batch=1, a_mn=False, b_mn=True, pad=0, b_shared=False):
    """A problem, its operands' storage (raw bits) and the float64 product."""
    b_batch = 1 if b_shared else batch
    a_op, a_size = operand("x", kind, m, k, a_mn, batch, pad)
    b_op, b_size = operand("w", kind, n, k, b_mn, 0 if b_shared else batch, pad)
    a, a_bits = sixteen_bit(kind, (batch, m, k))
    b, b_bits = sixteen_bit(kind, (b_batch, k, n))
    a_store = np.zeros((batch, a_size), np.uint16)
    b_store = np.zeros((b_batch, b_size), np.uint16)
    def place(store, z, op, bits):
        """bits is [outer][k]: element (o, kk) goes to o*stride_outer + kk*stride_k."""
        o, kk = np.meshgrid(np.arange(bits.shape[0]), np.arange(bits.shape[1]), indexing="ij")
        store[z, o * op.stride_outer + kk * op.stride_k] = bits

    for z in range(batch):
        place(a_store, z, a_op, a_bits[z])
    for z in range(b_batch):
        place(b_store, z, b_op, b_bits[z].T)
    problem = GemmProblem(m, n, k, batch, a_op, b_op)
    expected = np.einsum("zmk,zkn->zmn", a, np.broadcast_to(b, (batch, k, n)))
    return problem, a_store, b_store, expected


def store_epilogue(m, n, pair=False):
    """Stores into out[bz][m][n]; with `pair`, also the two-column form (gemm_spec.pair_of)."""
    def one(bz, row, col, acc):
        return [f"out[({bz}) * {m * n}LL + (long long)({row}) * {n} + ({col})] = {acc};"]

    def two(bz, row, col, acc0, acc1):
        return [f"em_vstore_st(out + (({bz}) * {m * n}LL + (long long)({row}) * {n} + ({col})), "
                f"{acc0}, {acc1});"]
    if pair:
        one.pair = two
    return one


def staged_epilogue(m, n, ctype):
    """Stores into a 16-bit out[bz][m][n], with the staged form a TMA store takes
    (gemm_spec.staged_of): the pair written at the template's `dst`."""
    def one(bz, row, col, acc):
        return [f"out[({bz}) * {m * n}LL + (long long)({row}) * {n} + ({col})] = "
                f"em_cvt<{ctype}>({acc});"]

    def staged(bz, row, col, acc0, acc1, dst):
        return [f"em_vstore({dst}, {acc0}, {acc1});"]
    one.staged = lambda: (StoredTile("out", ctype, n, m * n), staged)
    return one


SMS = 2   # the persistent (TMA) grid on the emulator: 2 blocks walk every case's tiles


def gemm_source(problem, body, name="gemm", out="float"):
    a, b = problem.a, problem.b
    params = (f"{out}* __restrict__ out, const {a.ctype}* __restrict__ {a.buffer}, "
              f"const {b.ctype}* __restrict__ {b.buffer}")
    if isinstance(body, TmaBody):
        params += "".join(f", const EmmyTensorMap* __restrict__ {t.name}"
                          for t in body.tensor_maps)
    return "\n".join([
        '#include "emmy_kernel.cuh"', f'#include "{HEADER}"',
        f'extern "C" __global__ void __launch_bounds__({body.threads}'
        f'{", 1" if body.min_blocks else ""})'
        f'{f" EMMY_CLUSTER_DIMS({body.cluster}, 1, 1)" if body.cluster > 1 else ""} '
        f'{name}({params}) {{',
        "  const int tid = threadIdx.x;", "  const long long bid = blockIdx.x;",
        "  extern __shared__ __align__(16) unsigned char emmy_smem[];",
        *("  " + line for line in body.lines), "}", ""])


def config(bm, bn, stages, group=1, **kw):
    return GemmConfig("wgmma", bm, bn, 64, wm=bm // 16, wn=1, stages=stages, group=group, **kw)


GEMM_CASES = {
    # name: (kind, m, n, k, batch, A MN-major, B MN-major, pad, bm, bn, stages, group[, B shared])
    "square_f16": ("f16", 128, 128, 128, 1, False, True, 0, 128, 128, 3, 1),
    "ragged_bf16": ("bf16", 100, 72, 128, 1, False, False, 0, 64, 64, 2, 1),
    "batched_mn_major": ("f16", 64, 256, 192, 2, True, True, 0, 128, 256, 4, 1),
    "ragged_k_grouped": ("bf16", 300, 136, 200, 1, False, True, 0, 128, 128, 3, 2),
    "padded_k": ("f16", 64, 64, 100, 1, False, False, 4, 64, 64, 3, 1),
    "wide_one_warpgroup": ("bf16", 96, 200, 64, 2, True, False, 0, 64, 256, 3, 1),
    "broadcast_b": ("f16", 72, 64, 128, 3, False, True, 0, 128, 64, 2, 1, True),
}


# Thread-block clusters (TMA multicast of the shared operand's halves): name -> (cluster_m,
# cluster_n, a GEMM_CASES tuple). Odd tile counts leave a cluster a spare tile; 64-wide shared
# MN-major tiles are split along k; the emulator runs 4 "SMs", i.e. 2 clusters.
CLUSTER_CASES = {
    "c2x1_k_major": (2, 1, ("f16", 256, 128, 192, 1, False, False, 0, 128, 128, 3, 1)),
    "c2x1_mn64_odd_ragged": (2, 1, ("bf16", 300, 64, 200, 1, False, True, 0, 64, 64, 2, 2)),
    "c2x1_mn256_batched": (2, 1, ("f16", 192, 256, 128, 2, True, True, 0, 64, 256, 4, 1)),
    "c1x2_k_major": (1, 2, ("bf16", 100, 200, 320, 1, False, False, 0, 64, 64, 4, 1)),
    "c1x2_mn128_broadcast_b": (1, 2, ("f16", 128, 136, 96, 3, True, True, 0, 128, 64, 3, 2,
                                      True)),
    "c1x2_mn64_padded": (1, 2, ("f16", 60, 128, 100, 1, True, False, 4, 64, 64, 2, 1)),
}
CLUSTER_SMS = 4


def build_gemm(case, tma=False):
    """The case's problem, body, source, arguments (tensor maps over arguments 1 and 2 last,
    with TMA) and expected result; a CLUSTER_CASES case is a TMA one."""
    cluster, sms = (1, 1), SMS
    if case in CLUSTER_CASES:
        *cluster, spec = CLUSTER_CASES[case]
        tma, sms = True, CLUSTER_SMS
    else:
        spec = GEMM_CASES[case]
    kind, m, n, k, batch, a_mn, b_mn, pad, bm, bn, stages, group, *shared = spec
    problem, a_store, b_store, expected = gemm_case(kind, m, n, k, batch, a_mn, b_mn, pad,
                                                    b_shared=bool(shared))
    cfg = config(bm, bn, stages, group, tma=tma, cluster_m=cluster[0], cluster_n=cluster[1])
    assert constraints_sm90(problem, cfg, "sm_90a") == []
    body = gemm_sm90_body(problem, cfg, store_epilogue(m, n, pair=n % 2 == 0), sm_count=sms)
    out = np.full((batch, m, n), np.nan, np.float32)
    args = [out, a_store, b_store]
    if tma:
        args += [t.emulator_arg(1 + i) for i, t in enumerate(body.tensor_maps)]
    return problem, body, gemm_source(problem, body), args, expected


@pytest.mark.parametrize("tma", [False, True], ids=["cp_async", "tma"])
@pytest.mark.parametrize("case", sorted(GEMM_CASES))
def test_emulated_gemm_matches_numpy(case, tma):
    problem, body, source, args, expected = build_gemm(case, tma)
    r = build_and_run(source, "gemm", body.grid, body.threads, body.smem_bytes, args,
                      timeout=300)
    assert r.ok, f"{r.status}: {r.log}"
    np.testing.assert_allclose(args[0], expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("case", sorted(CLUSTER_CASES))
def test_emulated_cluster_gemm_matches_numpy(case):
    """Clusters of two blocks, each copying half of the tile they share into both (TMA
    multicast) and freeing a slot on both blocks' empty barriers, walking 2 clusters' units."""
    problem, body, source, args, expected = build_gemm(case)
    assert body.cluster == 2 and body.grid in (2, CLUSTER_SMS)    # one or two clusters
    assert "tma_load_3d_multicast" in source and "mbar_arrive_cluster" in source
    r = build_and_run(source, "gemm", body.grid, body.threads, body.smem_bytes, args,
                      timeout=300, cluster=body.cluster)
    assert r.ok, f"{r.status}: {r.log}"
    np.testing.assert_allclose(args[0], expected, rtol=1e-4, atol=1e-3)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much])
@given(kind=st.sampled_from(["f16", "bf16"]), m=st.integers(1, 300), n8=st.integers(1, 40),
       k8=st.integers(1, 40), batch=st.integers(1, 2), a_mn=st.booleans(), b_mn=st.booleans(),
       tile=st.sampled_from([(64, 64), (64, 128), (128, 64), (128, 128), (64, 256)]),
       stages=st.integers(2, 4), group=st.sampled_from([1, 2, 8]),
       cluster=st.sampled_from([(1, 1), (2, 1), (1, 2)]))
def test_random_tma_products_match_numpy(kind, m, n8, k8, batch, a_mn, b_mn, tile, stages,
                                         group, cluster):
    """The TMA form, with and without clusters, on random shapes and layouts (ragged m, n
    and k tails, odd tile counts, batches), against numpy on the emulator."""
    n, k = 8 * n8, 8 * k8
    if a_mn and m % 8:                   # an M-contiguous A needs 16-byte rows
        m += 8 - m % 8
    problem, a_store, b_store, expected = gemm_case(kind, m, n, k, batch, a_mn, b_mn)
    cfg = config(*tile, stages, group, tma=True, cluster_m=cluster[0], cluster_n=cluster[1])
    assume(constraints_sm90(problem, cfg, "sm_90a") == [])
    body = gemm_sm90_body(problem, cfg, store_epilogue(m, n, pair=True), sm_count=CLUSTER_SMS)
    out = np.full((batch, m, n), np.nan, np.float32)
    args = [out, a_store, b_store, *(t.emulator_arg(1 + i) for i, t in
                                     enumerate(body.tensor_maps))]
    r = build_and_run(gemm_source(problem, body), "gemm", body.grid, body.threads,
                      body.smem_bytes, args, timeout=300, cluster=body.cluster)
    assert r.ok, f"{r.status}: {r.log}"
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)


# The output tile stored by TMA (config.tma_store): GEMM_CASES and CLUSTER_CASES names, from
# one round of whole 64x64 boxes (square_f16) to two rounds of two boxes (batched_mn_major:
# 128x256 tiles, 4 stages), ragged edges, spare cluster tiles, one consumer warpgroup.
STORE_CASES = ("square_f16", "ragged_k_grouped", "batched_mn_major", "wide_one_warpgroup",
               "broadcast_b", "c2x1_mn64_odd_ragged", "c1x2_mn128_broadcast_b")


def build_stored_gemm(case):
    """build_gemm's case with config.tma_store and a 16-bit output of the operands' type."""
    cluster, sms, spec = (1, 1), SMS, GEMM_CASES.get(case)
    if case in CLUSTER_CASES:
        *cluster, spec = CLUSTER_CASES[case]
        sms = CLUSTER_SMS
    kind, m, n, k, batch, a_mn, b_mn, pad, bm, bn, stages, group, *shared = spec
    problem, a_store, b_store, expected = gemm_case(kind, m, n, k, batch, a_mn, b_mn, pad,
                                                    b_shared=bool(shared))
    cfg = config(bm, bn, stages, group, tma=True, cluster_m=cluster[0], cluster_n=cluster[1],
                 tma_store=True)
    assert constraints_sm90(problem, cfg, "sm_90a") == []
    body = gemm_sm90_body(problem, cfg, staged_epilogue(m, n, CTYPE[kind]), sm_count=sms)
    out = np.full((batch, m, n), 0xFFFF, np.uint16)           # NaN in both 16-bit types
    args = [out, a_store, b_store, *(t.emulator_arg(i) for i, t in
                                     enumerate(body.tensor_maps, start=1))]
    # the output's map is over argument 0
    args[-1] = body.tensor_maps[-1].emulator_arg(0)
    return problem, body, gemm_source(problem, body, out=CTYPE[kind]), args, expected, kind


def as_float(bits, kind):
    if kind == "f16":
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("case", STORE_CASES)
def test_emulated_tma_store_gemm_matches_numpy(case):
    """The tile staged in shared memory (swizzled boxes) and stored by TMA, which clips the
    edges: every element written once, rounded to the output's type, nothing past it."""
    problem, body, source, args, expected, kind = build_stored_gemm(case)
    assert "tma_store_3d" in source and "warpgroup_bar" in source
    assert body.tensor_maps[-1].buffer == "out" and body.tensor_maps[-1].box == (64, 64, 1)
    r = build_and_run(source, "gemm", body.grid, body.threads, body.smem_bytes, args,
                      timeout=300, cluster=body.cluster)
    assert r.ok, f"{r.status}: {r.log}"
    tol = 2 ** -8 if kind == "f16" else 2 ** -7
    np.testing.assert_allclose(as_float(args[0], kind), expected, rtol=tol,
                               atol=tol * np.abs(expected).max())


def test_tma_store_boxes_fit_beside_the_ring():
    """128x256 tiles: 4 stages leave room for two boxes a warpgroup (two rounds), 3 stages
    for all four; the shared memory asked for holds ring, boxes and barriers."""
    from emmy.cuda.gemm_sm90 import SMEM_LIMIT, smem_bytes_sm90, store_boxes

    problem = large_problem()
    for stages, boxes in ((4, 2), (3, 4)):
        cfg = config(128, 256, stages, tma=True, tma_store=True)
        assert constraints_sm90(problem, cfg, "sm_90a") == []
        plain = smem_bytes_sm90(problem, config(128, 256, stages, tma=True))
        assert store_boxes(cfg, plain) == boxes
        assert smem_bytes_sm90(problem, cfg) == plain + 2 * boxes * 8192 <= SMEM_LIMIT
    assert any("TMA staging" in w for w in
               constraints_sm90(problem, config(128, 256, 4, tma_store=True), "sm_90a"))


def test_emulator_catches_a_buffer_overwritten_before_its_store_read_it():
    """The emulated TMA store reads shared memory at the wait that covers it: a kernel that
    rewrites the box before waiting stores what it wrote last, and one that exits without
    waiting fails the launch."""
    from emmy.cuda.gemm_sm90 import _output_map

    tile = StoredTile("out", "__half", 64, 0)
    problem = large_problem()
    spec = _output_map(GemmProblem(64, 64, 64, 1, problem.a, problem.b), tile)[0]
    def source(body):
        return "\n".join([
            '#include "emmy_kernel.cuh"', f'#include "{HEADER}"',
            'extern "C" __global__ void k(__half* out, const EmmyTensorMap* map) {',
            "  extern __shared__ __align__(16) unsigned char emmy_smem[];",
            "  __half* box = reinterpret_cast<__half*>(emmy_smem);",
            "  const int t = threadIdx.x;", *body, "}", ""])
    fill = "  for (int e = t; e < 4096; e += 128) box[e] = __float2half(float({v}));"
    store = ["  tma_store_fence(); warpgroup_bar(0);",
             "  if (t == 0) { tma_store_3d(map, 0, 0, 0, emmy_smem); tma_store_commit(); }"]
    early = [fill.format(v=1), *store, "  warpgroup_bar(0);", fill.format(v=2),
             "  warpgroup_bar(0);", "  if (t == 0) tma_store_wait<0>();"]
    out = np.zeros((64, 64), np.uint16)
    r = build_and_run(source(early), "k", 1, 128, 8192, [out, spec.emulator_arg(0)])
    assert r.ok, r.log
    assert (out.view(np.float16) == 2).all()
    late = [fill.format(v=1), *store]
    r = build_and_run(source(late), "k", 1, 128, 8192, [np.zeros((64, 64), np.uint16),
                                                       spec.emulator_arg(0)])
    assert not r.ok and "never waited for" in r.log


def test_cluster_copies_add_up_to_the_stage():
    """The copies that land in one block per stage (its own operand, both halves of the shared
    one) are the STAGE bytes its full barrier expects."""
    for case, (cm, cn, spec) in CLUSTER_CASES.items():
        problem, body, *_ = build_gemm(case)
        bm, bn = spec[8], spec[9]
        maps = {t.name: t for t in body.tensor_maps}
        box = {name: np.prod(t.box) * 2 for name, t in maps.items()}
        loads = [line for line in body.lines if "tma_load_3d" in line]
        landed = sum(box[next(n for n in maps if n in line)] * (2 if "multicast" in line else 1)
                     for line in loads)
        assert landed == (bm + bn) * 64 * 2, case


MAIN_CONFIGS = {  # the configurations meant for large products: (bm, bn, stages)
    "128x256x64_s4": (128, 256, 4),
    "128x128x64_s4": (128, 128, 4),
    "128x256x64_s3": (128, 256, 3),
    "64x256x64_s4": (64, 256, 4),
}


def large_problem(kind="f16", size=4096, b_mn=True):
    a_op, _ = operand("x", kind, size, size, False, 1)
    b_op, _ = operand("w", kind, size, size, b_mn, 1)
    return GemmProblem(size, size, size, 1, a_op, b_op)


@pytest.mark.parametrize("tma", [False, True], ids=["cp_async", "tma"])
@pytest.mark.parametrize("name", sorted(MAIN_CONFIGS))
@pytest.mark.parametrize("b_mn", [True, False])
def test_main_configs_compile_without_spills(name, b_mn, tma):
    problem = large_problem(b_mn=b_mn)
    cfg = config(*MAIN_CONFIGS[name], group=8, tma=tma)
    assert constraints_sm90(problem, cfg, "sm_90a") == []
    body = gemm_sm90_body(problem, cfg, store_epilogue(problem.m, problem.n), sm_count=132)
    r = compile_cuda(gemm_source(problem, body), get_target("sm_90a"), ptx=True)
    assert r.ok, r.log
    res = r.resources_of("gemm")
    assert res.spill_store_bytes == 0 and res.spill_load_bytes == 0 and res.stack_bytes == 0, res
    assert "wgmma.mma_async" in r.ptx
    assert not re.search(r"C751[0-9]", r.log), r.log    # ptxas kept the wgmmas pipelined
    assert ("cp.async.bulk.tensor.3d" if tma else "cp.async.cg") in r.ptx
    # the producer acquires the tensor maps the host wrote before copying through them
    assert ("fence.proxy.tensormap::generic.acquire.gpu" in r.ptx) == tma


@pytest.mark.parametrize("cluster", [(1, 1), (2, 1)], ids=["1x1", "2x1"])
@pytest.mark.parametrize("name", ["128x256x64_s4", "128x256x64_s3", "64x256x64_s4"])
def test_tma_store_configs_compile_without_spills(name, cluster):
    """The staged epilogue keeps the wgmmas pipelined and spills nothing; its stores are
    cp.async.bulk.tensor from shared memory, after a proxy fence and a named barrier."""
    problem = large_problem()
    cfg = config(*MAIN_CONFIGS[name], group=8, tma=True, tma_store=True,
                 cluster_m=cluster[0], cluster_n=cluster[1])
    assert constraints_sm90(problem, cfg, "sm_90a") == []
    body = gemm_sm90_body(problem, cfg, staged_epilogue(problem.m, problem.n, "__half"),
                          sm_count=132)
    r = compile_cuda(gemm_source(problem, body, out="__half"), get_target("sm_90a"), ptx=True)
    assert r.ok, r.log
    res = r.resources_of("gemm")
    assert res.spill_store_bytes == 0 and res.spill_load_bytes == 0 and res.stack_bytes == 0, res
    assert not re.search(r"C751[0-9]", r.log), r.log
    for instruction in ("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group",
                        "fence.proxy.async.shared::cta", "bar.sync", "cp.async.bulk.wait_group.read"):
        assert instruction in r.ptx, instruction


@pytest.mark.parametrize("cluster", [(2, 1), (1, 2)], ids=["2x1", "1x2"])
@pytest.mark.parametrize("bn", [256, 128])
def test_cluster_configs_compile_without_spills(bn, cluster):
    problem = large_problem()
    cfg = config(128, bn, 4, group=8, tma=True, cluster_m=cluster[0], cluster_n=cluster[1])
    assert constraints_sm90(problem, cfg, "sm_90a") == []
    body = gemm_sm90_body(problem, cfg, store_epilogue(problem.m, problem.n), sm_count=132)
    assert body.cluster == 2 and body.grid == 132
    r = compile_cuda(gemm_source(problem, body), get_target("sm_90a"), ptx=True)
    assert r.ok, r.log
    assert "C7508" not in r.log and not re.search(r"C751[0-9]", r.log), r.log
    res = r.resources_of("gemm")
    assert res.spill_store_bytes == 0 and res.spill_load_bytes == 0 and res.stack_bytes == 0, res
    assert ".explicitcluster" in r.ptx and ".reqnctapercluster 2, 1, 1" in r.ptx
    assert "multicast::cluster" in r.ptx and "mapa.shared::cluster" in r.ptx
    assert "barrier.cluster.arrive.relaxed.aligned" in r.ptx     # after the barriers' init


@pytest.mark.skipif(cuobjdump() is None, reason="cuobjdump (and nvdisasm) not installed")
@pytest.mark.parametrize("tma", [False, True], ids=["cp_async", "tma"])
def test_sass_uses_hgmma(tma):
    """HGMMA, nothing in local memory, neighbouring f32 outputs stored 8 bytes at a time; with
    TMA (two consumer warpgroups) the register hand-over is kept (USETMAXREG), the
    producer copies with UTMALDG, the grid is persistent, and the mbarrier waits have their
    timeout (a trap instead of a hang)."""
    problem = large_problem()
    body = gemm_sm90_body(problem, config(128, 256, 4, group=8, tma=tma),
                          store_epilogue(problem.m, problem.n, pair=True), sm_count=132)
    r = compile_cuda(gemm_source(problem, body), get_target("sm_90a"))
    assert r.ok, r.log
    assert "C7508" not in r.log                          # setmaxnreg not ignored
    sass = disassemble(r.cubin)
    assert "HGMMA.64x256x16.F32" in sass
    assert "LDL" not in sass and "STL" not in sass      # nothing in local memory
    stores = re.findall(r"\bSTG\.E[.\w]*", sass)
    assert stores and set(stores) == {"STG.E.64"}, sorted(set(stores))
    assert ("USETMAXREG" in sass and "UTMALDG" in sass) == tma
    assert ("BPT.TRAP" in sass) == tma       # an mbarrier wait that never ends traps
    assert body.grid == (132 if tma else (4096 // 128) * (4096 // 256))
    assert body.min_blocks == int(tma)


@pytest.mark.skipif(cuobjdump() is None, reason="cuobjdump (and nvdisasm) not installed")
def test_cluster_sass_multicasts():
    """A 2x1 cluster row: B's halves copied with multicast TMA, A's with plain TMA, cluster
    barriers at the start and the end, the register hand-over kept."""
    problem = large_problem()
    body = gemm_sm90_body(problem, config(128, 256, 4, group=8, tma=True, cluster_m=2),
                          store_epilogue(problem.m, problem.n, pair=True), sm_count=132)
    r = compile_cuda(gemm_source(problem, body), get_target("sm_90a"))
    assert r.ok, r.log
    assert "C7508" not in r.log
    sass = disassemble(r.cubin)
    assert "UTMALDG.3D.MULTICAST" in sass and re.search(r"UTMALDG\.3D\s", sass)
    assert "UCGABAR_ARV" in sass and "UCGABAR_WAIT" in sass
    # the consumers' remote arrives (release.cta) bring no GPU-wide fence into the main loop,
    # nor does the barrier after the mbarriers' initialisation (a relaxed arrive): the only
    # one comes with the final cluster barrier
    assert "SYNCS.ARRIVE.TRANS64.RED" in sass
    assert sass.count("UCGABAR_ARV") == 2 and sass.count("MEMBAR.ALL.GPU") <= 1
    assert "USETMAXREG" in sass and "HGMMA.64x256x16.F32" in sass
    assert "LDL" not in sass and "STL" not in sass


def test_constraints_refuse_what_the_template_cannot_do():
    problem = large_problem()
    ok = config(128, 256, 4)
    assert constraints_sm90(problem, ok, "sm_90a") == []
    assert any("sm_90a" in w for w in constraints_sm90(problem, ok, "sm_80"))
    bad = {
        "bm must be 64": config(96, 128, 3),
        "bn must be a wgmma N": config(128, 96, 3),
        "bk must be 64": GemmConfig("wgmma", 128, 128, 32, 8, 1, 3),
        "stages must be 2 to 4": config(128, 128, 5),
        "does not split K": config(128, 128, 3, split=2, split_mode="atomic"),
        "threads": GemmConfig("wgmma", 128, 128, 64, 4, 1, 3),
        "shared memory": config(128, 256, 5),
        "clusters are 1x1, 2x1": config(128, 128, 3, tma=True, cluster_m=2, cluster_n=2),
        "need TMA staging": config(128, 128, 3, cluster_m=2),
    }
    for words, cfg in bad.items():
        why = constraints_sm90(problem, cfg, "sm_90a")
        assert any(words in w for w in why), (words, why)
    f32 = GemmOperand("x", "float", 4096, 1, "0")
    assert any("f16 by f16" in w for w in
               constraints_sm90(GemmProblem(64, 64, 64, 1, f32, problem.b), ok, "sm_90a"))
    odd = GemmOperand("x", "__half", 4100, 1, "0")
    assert any("multiple of 8" in w for w in
               constraints_sm90(GemmProblem(64, 64, 4100, 1, odd, problem.b), ok, "sm_90a"))
    strided = GemmOperand("x", "__half", 2, 8192, "0")
    assert any("no unit stride" in w for w in
               constraints_sm90(GemmProblem(64, 64, 64, 1, strided, problem.b), ok, "sm_90a"))
    batched = GemmOperand("x", "__half", 64, 1, "(bz % 3) * 4096LL", batch_stride=None)
    assert any("batch" in w for w in
               constraints_sm90(GemmProblem(64, 64, 64, 4, batched, problem.b), ok, "sm_90a"))
    offset = GemmOperand("x", "__half", 64, 1, "128LL")
    offset_problem = GemmProblem(64, 64, 64, 1, offset, problem.b)
    assert constraints_sm90(offset_problem, ok, "sm_90a") == []
    assert any("TMA" in w for w in
               constraints_sm90(offset_problem, config(128, 256, 4, tma=True), "sm_90a"))


# --- the template on a GPU --------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("tma", [False, True], ids=["cp_async", "tma"])
@pytest.mark.parametrize("case", sorted(GEMM_CASES))
def test_gpu_gemm_matches_numpy(case, tma):
    problem, body, source, args, expected = build_gemm(case, tma)
    run_on_gpu(source, "gemm", body.grid, body.threads, body.smem_bytes, args)
    np.testing.assert_allclose(args[0], expected, rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("tma", [False, True], ids=["cp_async", "tma"])
@pytest.mark.parametrize("name", sorted(MAIN_CONFIGS))
def test_gpu_gemm_4096_speed(name, tma):
    """Correct at 4096^3 f16 (against torch in f32), and the speed it reaches, printed."""
    gemm_4096_speed(config(*MAIN_CONFIGS[name], group=8, tma=tma),
                    f"{name}{' TMA' if tma else ''}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CLUSTER_CASES))
def test_gpu_cluster_gemm_matches_numpy(case):
    problem, body, source, args, expected = build_gemm(case)
    run_on_gpu(source, "gemm", body.grid, body.threads, body.smem_bytes, args)
    np.testing.assert_allclose(args[0], expected, rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("cluster", [(2, 1), (1, 2)], ids=["2x1", "1x2"])
@pytest.mark.parametrize("bn", [256, 128])
def test_gpu_cluster_gemm_4096_speed(bn, cluster):
    gemm_4096_speed(config(128, bn, 4, group=8, tma=True, cluster_m=cluster[0],
                           cluster_n=cluster[1]),
                    f"128x{bn}x64_s4 TMA cluster {cluster[0]}x{cluster[1]}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", STORE_CASES)
def test_gpu_tma_store_gemm_matches_numpy(case):
    problem, body, source, args, expected, kind = build_stored_gemm(case)
    run_on_gpu(source, "gemm", body.grid, body.threads, body.smem_bytes, args)
    tol = 2 ** -8 if kind == "f16" else 2 ** -7
    np.testing.assert_allclose(as_float(args[0], kind), expected, rtol=tol,
                               atol=tol * np.abs(expected).max())


@pytest.mark.gpu
@pytest.mark.parametrize("store", [False, True], ids=["registers", "tma_store"])
@pytest.mark.parametrize("stages,cluster", [(4, (1, 1)), (4, (2, 1)), (3, (2, 1))],
                         ids=["s4", "s4_c2x1", "s3_c2x1"])
def test_gpu_gemm_4096_f16_out_speed(stages, cluster, store):
    """A 16-bit output (as `emmy bench`'s products have): the epilogue from registers against
    the tile staged in shared memory and stored by TMA."""
    gemm_4096_speed(config(128, 256, stages, group=8, tma=True, cluster_m=cluster[0],
                           cluster_n=cluster[1], tma_store=store),
                    f"128x256x64_s{stages} TMA cluster {cluster[0]}x{cluster[1]} f16 out"
                    f"{' TMA store' if store else ''}", half_out=True)


def gemm_4096_speed(cfg, label, half_out=False):
    import torch

    from emmy.runtime.gpu import encode_tensor_map

    problem = large_problem()
    tma = cfg.tma
    size = problem.m
    epilogue = staged_epilogue(size, size, "__half") if half_out else \
        store_epilogue(size, size, pair=True)
    if half_out and not cfg.tma_store:
        epilogue.pair = lambda bz, row, col, a0, a1: [
            f"em_vstore_st(out + ((long long)({row}) * {size} + ({col})), {a0}, {a1});"]
    body = gemm_sm90_body(problem, cfg, epilogue, sm_count=132)
    x = torch.randn(size, size, device="cuda", dtype=torch.float16)
    w = torch.randn(size, size, device="cuda", dtype=torch.float16)
    out = torch.empty(size, size, device="cuda",
                      dtype=torch.float16 if half_out else torch.float32)
    tensors = [out, x, w]
    if tma:
        by_name = {"x": x, "w": w, "out": out}
        tensors += [torch.frombuffer(bytearray(encode_tensor_map(t, by_name[t.buffer].data_ptr())),
                                     dtype=torch.uint8).cuda() for t in body.tensor_maps]
    launch = torch_launcher(gemm_source(problem, body, out="__half" if half_out else "float"),
                            "gemm", body.grid, body.threads, body.smem_bytes, tensors)
    launch()
    torch.cuda.synchronize()
    expected = x.float() @ w.float()
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=0.25 if half_out else 5e-2)
    ours = seconds(launch)
    theirs = seconds(lambda: torch.matmul(x, w))
    flops = problem.flops
    print(f"\n{label}: {flops / ours / 1e12:.0f} TFLOP/s ({ours * 1e3:.3f} ms); torch.matmul "
          f"{flops / theirs / 1e12:.0f} TFLOP/s ({theirs * 1e3:.3f} ms); "
          f"{launch.resources}")
