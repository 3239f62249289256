"""TF32 tensor cores: to_tf32 and mma_m16n8k8_tf32 of emmy_intrinsics.cuh follow the PTX ISA
(cvt.rna rounding; "Matrix Fragments for mma.m16n8k8", .tf32 layouts, checked against numpy),
and emmy.cuda.gemm's inst "tf32" computes f32 products on them: against numpy on the CPU
emulator for every operand layout, stage count, split mode and ragged shapes; its main
configuration compiles for sm_80 and sm_90a without spills; constraints() refuses it for
non-f32 operands.

References: the product of the tf32-rounded operands in float64 (the emulator sums exactly and
rounds once, so it is met to ~1e-7), and the exact product of the f32 operands (tf32 keeps 11
significant bits: ~1e-3 relative error)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from emmy.cuda.emulate.run import build, build_and_run
from emmy.cuda.gemm import combine_body, constraints, gemm_body, smem_bytes
from emmy.cuda.gemm_spec import Body, GemmConfig, GemmOperand, GemmProblem
from emmy.cuda.nvrtc import compile_cuda
from emmy.schedule.targets import get_target
from test_gemm import kernel_source, program  # the same wrapper emmy.cuda.emit prints

rng = np.random.default_rng(1988)
LANES = np.arange(32)
F = "float"
TIGHT = 1e-5        # against the product of the tf32-rounded operands
TF32_LEVEL = 5e-3   # against the exact product of the f32 operands


def tf32(x: np.ndarray) -> np.ndarray:
    """x rounded to 11 significant bits, ties away from zero (cvt.rna.tf32.f32), for normal
    and zero x: computed from frexp, not from the bits."""
    x = np.asarray(x, np.float64)
    m, e = np.frexp(x)                                  # |m| in [0.5, 1)
    r = np.sign(m) * np.floor(np.abs(m) * 2.0**11 + 0.5)
    return np.ldexp(r, e - 11).astype(np.float32)


# --- the intrinsics ------------------------------------------------------------------------------

INTRINSICS = r"""
#include "emmy_intrinsics.cuh"

// out[i] = to_tf32(in[i]): the register bits
extern "C" __global__ void tf32_round(unsigned* out, const float* in, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = to_tf32(in[i]);
}

// Fragments given in the documented layout: frags[lane] = a0..a3, b0, b1 (tf32 bits);
// C holds 1, 2, 3, 4 in every lane's c0..c3.
extern "C" __global__ void mma_tf32_frag(float* d, const unsigned* frags) {
    const int lane = threadIdx.x;
    const unsigned* f = frags + 6 * lane;
    unsigned a[4] = {f[0], f[1], f[2], f[3]};
    unsigned b[2] = {f[4], f[5]};
    float c[4] = {1.f, 2.f, 3.f, 4.f};
    mma_m16n8k8_tf32(c, a, b, c);
    for (int i = 0; i < 4; ++i) d[4 * lane + i] = c[i];
}

// One warp: C(16x8) = A(16x8, row-major f32) @ B(8x8, row-major [k][n] f32), each lane loading
// its fragment elements and rounding them with to_tf32.
extern "C" __global__ void mma_tf32_tile(float* c, const float* a, const float* b) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    unsigned af[4], bf[2];
    for (int i = 0; i < 4; ++i) af[i] = to_tf32(a[(g + 8 * (i % 2)) * 8 + t + 4 * (i / 2)]);
    for (int i = 0; i < 2; ++i) bf[i] = to_tf32(b[(t + 4 * i) * 8 + g]);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    mma_m16n8k8_tf32(acc, af, bf, acc);
    for (int i = 0; i < 4; ++i) c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = acc[i];
}
"""


# the documented layouts (PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32),
# g = lane/4, t = lane%4
def a_position(lane, i):
    g, t = lane // 4, lane % 4
    return g + 8 * (i % 2), t + 4 * (i // 2)


def b_position(lane, i):
    g, t = lane // 4, lane % 4
    return t + 4 * i, g


def c_position(lane, i):
    g, t = lane // 4, lane % 4
    return g + 8 * (i // 2), 2 * t + i % 2


def emulate(kernel: str, args: list, threads: int = 32) -> None:
    r = build_and_run(INTRINSICS, kernel, 1, threads, 0, args)
    assert r.ok, f"{r.status}: {r.log[-4000:]}"


def test_layouts_cover_each_element_once():
    assert sorted(a_position(l, i) for l in LANES for i in range(4)) == \
        [(r, k) for r in range(16) for k in range(8)]
    assert sorted(b_position(l, i) for l in LANES for i in range(2)) == \
        [(k, n) for k in range(8) for n in range(8)]
    assert sorted(c_position(l, i) for l in LANES for i in range(4)) == \
        [(r, n) for r in range(16) for n in range(8)]


def test_to_tf32_rounds_to_nearest_ties_away():
    ulp = 2.0**-10                                     # tf32's ulp at 1
    special = np.array([1 + ulp / 2, -(1 + ulp / 2),   # ties: away from zero
                        1 + 5 * ulp / 2, -(1 + 5 * ulp / 2),   # ties where even would go down
                        1 + ulp / 2 - 2.0**-23, 1 + ulp / 2 + 2.0**-23,
                        2 - 2.0**-23,                  # rounds up into the next binade
                        0.0, -0.0, 1.0, 3.0e38, -3.0e38, 1.2e-38], np.float32)
    x = np.concatenate([special, rng.standard_normal(1000).astype(np.float32) *
                        np.float32(2.0) ** rng.integers(-60, 60, 1000).astype(np.float32)])
    out = np.zeros(x.size, np.uint32)
    emulate("tf32_round", [out, x, x.size], threads=64)
    assert (out & 0x1FFF == 0).all(), "the low 13 bits are not zero"
    np.testing.assert_array_equal(out.view(np.float32), tf32(x))
    assert out.view(np.float32)[0] == 1 + ulp and out.view(np.float32)[3] == -(1 + 3 * ulp)
    # past the largest finite tf32: inf; inf and NaN stay so
    edge = np.array([np.finfo(np.float32).max, np.inf, -np.inf, np.nan], np.float32)
    out = np.zeros(edge.size, np.uint32)
    emulate("tf32_round", [out, edge, edge.size])
    got = out.view(np.float32)
    assert got[0] == np.inf and got[1] == np.inf and got[2] == -np.inf and np.isnan(got[3])


def test_mma_fragments_match_numpy():
    a = tf32(rng.standard_normal((16, 8)))
    b = tf32(rng.standard_normal((8, 8)))
    frags = np.zeros((32, 6), np.uint32)
    for lane in LANES:
        frags[lane, :4] = [a[a_position(lane, i)].view(np.uint32) for i in range(4)]
        frags[lane, 4:] = [b[b_position(lane, i)].view(np.uint32) for i in range(2)]
    d = np.zeros((32, 4), np.float32)
    emulate("mma_tf32_frag", [d, frags])
    got, c = np.zeros((16, 8)), np.zeros((16, 8))
    for lane in LANES:
        for i in range(4):
            got[c_position(lane, i)] = d[lane, i]
            c[c_position(lane, i)] = i + 1
    expected = a.astype(np.float64) @ b.astype(np.float64) + c
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_mma_tile_rounds_f32_operands():
    a = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal((8, 8)).astype(np.float32)
    c = np.zeros((16, 8), np.float32)
    emulate("mma_tf32_tile", [c, a, b])
    rounded = tf32(a).astype(np.float64) @ tf32(b).astype(np.float64)
    np.testing.assert_allclose(c, rounded, rtol=1e-6, atol=1e-6)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(c - exact).max() > 1e-5, "the operands were not rounded to tf32"
    np.testing.assert_allclose(c, exact, rtol=0, atol=1e-2)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_intrinsics_compile(target):
    result = compile_cuda(INTRINSICS, get_target(target))
    assert result.ok, result.log


# --- the template ------------------------------------------------------------------------------
# kernels are printed as emmy.cuda.emit prints them, by test_gemm's helpers

@dataclass(frozen=True)
class Layout:
    stride_outer: int
    stride_k: int
    batch_stride: int


def layout(kind: str, outer: int, k: int, pad: int) -> Layout:
    """k: rows of k contiguous; outer: outer contiguous; strided: every other element of
    k-contiguous rows; `pad` elements after each batch."""
    if kind == "strided":
        return Layout(2 * k, 2, 2 * outer * k + pad)
    return Layout(k, 1, outer * k + pad) if kind == "k" else Layout(1, outer, outer * k + pad)


def store(values: np.ndarray, lay: Layout) -> np.ndarray:
    """A flat buffer holding values[bz, outer, k]; NaN between rows and batches."""
    batch, outer, k = values.shape
    buf = np.full(batch * lay.batch_stride, np.nan, np.float32)
    z, o, kk = np.meshgrid(np.arange(batch), np.arange(outer), np.arange(k), indexing="ij")
    buf[z * lay.batch_stride + o * lay.stride_outer + kk * lay.stride_k] = values
    return buf


@dataclass
class Case:
    name: str
    m: int
    n: int
    k: int
    config: GemmConfig
    a_kind: str = "k"        # A row-major (k contiguous) | "outer": m contiguous
    b_kind: str = "outer"    # B row-major K x N (n contiguous) | "k": k contiguous
    batch: int = 1
    pad: int = 0

    def __post_init__(self):
        self.a_layout = layout(self.a_kind, self.m, self.k, self.pad)
        self.b_layout = layout(self.b_kind, self.n, self.k, self.pad)

        def operand(buf: str, lay: Layout) -> GemmOperand:
            return GemmOperand(buf, F, lay.stride_outer, lay.stride_k,
                               f"bz * {lay.batch_stride}LL",
                               lay.batch_stride if self.batch > 1 else 0)

        self.problem = GemmProblem(self.m, self.n, self.k, self.batch,
                                   operand("a", self.a_layout), operand("b", self.b_layout))

    @property
    def mode(self) -> str:
        return self.config.split_mode if self.config.split > 1 else ""

    def epilogue(self, bz: str, row: str, col: str, acc: str) -> list[str]:
        at = f"{bz} * {self.m * self.n}LL + (long long)({row}) * {self.n} + ({col})"
        return [f"atomicAdd(c + {at}, {acc});"] if self.mode == "atomic" else [f"c[{at}] = {acc};"]

    def bodies(self) -> dict[str, Body]:
        out = {self.name: gemm_body(self.problem, self.config, self.epilogue)}
        if self.mode == "combine":
            out[self.name + "__combine"] = combine_body(self.problem, self.config, self.epilogue)
        return out

    def params(self, kernel: str) -> list[tuple[str, str, bool]]:
        if kernel.endswith("__combine"):
            return [(F, "emmy_partial", False), (F, "c", True)]
        partial = [(F, "emmy_partial", True)] if self.mode == "combine" else []
        return [(F, "a", False), (F, "b", False), *partial, (F, "c", True)]

    def source(self) -> list[str]:
        return [kernel_source(k, body, self.params(k)) for k, body in self.bodies().items()]


def cfg(bm, bn, bk, wm, wn, stages, **kw) -> GemmConfig:
    return GemmConfig("tf32", bm, bn, bk, wm, wn, stages, **kw)


CASES = [
    # every layout of A and B, every stage count
    Case("tf32_kn_s3", 128, 128, 64, cfg(64, 64, 32, 2, 2, 3)),
    Case("tf32_mn_s2", 128, 128, 64, cfg(64, 64, 16, 2, 2, 2), a_kind="outer"),
    Case("tf32_kk_s4", 64, 128, 96, cfg(64, 64, 8, 2, 2, 4), b_kind="k"),
    Case("tf32_mk_s1", 128, 64, 64, cfg(64, 64, 32, 2, 2, 1), a_kind="outer", b_kind="k"),
    # ragged shapes: element-wise synchronous loads; cp.async zero-fill at the edges
    Case("tf32_ragged", 127, 255, 63, cfg(64, 64, 32, 2, 2, 1)),
    Case("tf32_ragged_mk", 127, 255, 63, cfg(64, 64, 16, 2, 2, 1), a_kind="outer", b_kind="k"),
    Case("tf32_ragged_async", 127, 121, 68, cfg(64, 64, 32, 2, 2, 3), b_kind="k"),
    Case("tf32_strided", 64, 32, 40, cfg(32, 32, 8, 1, 1, 1), a_kind="strided"),
    # the main configuration (4 k steps a tile, 8 warps)
    Case("tf32_main", 128, 256, 96, cfg(128, 128, 32, 2, 4, 3, group=8)),
    # batches at padded offsets, grouped raster, odd n atoms per warp (24 = 3 x 8)
    Case("tf32_batched", 64, 96, 48, cfg(32, 48, 16, 2, 2, 3, group=4), batch=3, pad=8),
    # split K
    Case("tf32_combine", 64, 64, 160, cfg(64, 64, 32, 2, 2, 2, split=2, split_mode="combine"),
         b_kind="k", batch=2),
    Case("tf32_atomic", 64, 64, 96, cfg(32, 32, 16, 1, 2, 3, split=3, split_mode="atomic")),
]
BY_NAME = {c.name: c for c in CASES}


@pytest.fixture(scope="module")
def source() -> str:
    text = program([k for case in CASES for k in case.source()])
    built = build(text, CASES[0].name)
    assert built.binary is not None, built.log[-4000:]
    return text


def run(source: str, name: str, body: Body, args: list) -> None:
    r = build_and_run(source, name, body.grid, body.threads, body.smem_bytes, args)
    assert r.ok, f"{name}: {r.status}: {r.log[-4000:]}"


@pytest.mark.parametrize("name", list(BY_NAME))
def test_matches_numpy(source, name):
    case = BY_NAME[name]
    a = rng.standard_normal((case.batch, case.m, case.k)).astype(np.float32)
    bt = rng.standard_normal((case.batch, case.n, case.k)).astype(np.float32)
    rounded = tf32(a).astype(np.float64) @ tf32(bt).astype(np.float64).transpose(0, 2, 1)
    exact = a.astype(np.float64) @ bt.astype(np.float64).transpose(0, 2, 1)
    c = np.zeros(exact.size, np.float32) if case.mode == "atomic" else \
        np.full(exact.size, np.nan, np.float32)
    inputs = [store(a, case.a_layout), store(bt, case.b_layout)]
    bodies = case.bodies()
    if case.mode == "combine":
        partial = np.full(case.config.split * exact.size, np.nan, np.float32)
        run(source, name, bodies[name], [*inputs, partial, c])
        run(source, name + "__combine", bodies[name + "__combine"], [partial, c])
    else:
        run(source, name, bodies[name], [*inputs, c])
    assert np.isfinite(c).all(), f"{np.isnan(c).sum()} outputs not written"
    got = c.reshape(exact.shape)
    err = np.linalg.norm(got - rounded) / np.linalg.norm(rounded)
    assert err < TIGHT, f"relative L2 error {err:.2e} against the tf32-rounded product"
    err = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    assert err < TF32_LEVEL, f"relative L2 error {err:.2e} against the f32 product"
    assert err > 1e-5, "no tf32 rounding: the operands reached the mma unrounded"


def test_cases_are_buildable_and_cover_the_options():
    for case in CASES:
        assert constraints(case.problem, case.config, "sm_90a") == [], case.name
        assert constraints(case.problem, case.config, "sm_80") == [], case.name
    assert {c.config.stages for c in CASES} == {1, 2, 3, 4}
    assert {(c.a_kind, c.b_kind) for c in CASES} >= \
        {("k", "outer"), ("outer", "outer"), ("k", "k"), ("outer", "k")}
    assert {c.mode for c in CASES} >= {"atomic", "combine"}


# --- the main configuration compiles without spills ---------------------------------------------

M4K = 4096
MAIN = {   # name: (B k-contiguous, config)
    "tf32_128x128x32_w2x4_s3": (False, cfg(128, 128, 32, 2, 4, 3, group=8)),
    "tf32_128x128x32_w2x4_s3_bk": (True, cfg(128, 128, 32, 2, 4, 3, group=8)),
    "tf32_128x256x16_w2x4_s4": (False, cfg(128, 256, 16, 2, 4, 4, group=8)),
}


def main_problem(b_k_contiguous: bool) -> GemmProblem:
    b = GemmOperand("b", F, M4K, 1, "0") if b_k_contiguous else GemmOperand("b", F, 1, M4K, "0")
    return GemmProblem(M4K, M4K, M4K, 1, GemmOperand("a", F, M4K, 1, "0"), b)


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_main_configs_compile_without_spills(target):
    kernels = []
    for name, (bk, config) in MAIN.items():
        problem = main_problem(bk)
        assert constraints(problem, config, target) == []
        body = gemm_body(problem, config,
                         lambda bz, r, c, acc: [f"c[(long long)({r}) * {M4K} + ({c})] = {acc};"])
        kernels.append(kernel_source(name, body, [(F, "a", False), (F, "b", False),
                                                  (F, "c", True)]))
    result = compile_cuda(program(kernels), get_target(target))
    assert result.ok, result.log
    for name in MAIN:
        res = result.resources_of(name)
        assert res.spill_store_bytes == res.spill_load_bytes == res.stack_bytes == 0, (name, res)
        assert res.registers <= 255


# --- constraints ---------------------------------------------------------------------------------

def square(ctype=F, n=256, b_ctype=None) -> GemmProblem:
    return GemmProblem(n, n, n, 1, GemmOperand("a", ctype, n, 1, "0"),
                       GemmOperand("b", b_ctype or ctype, 1, n, "0"))


GOOD = cfg(128, 128, 32, 2, 4, 3)


@pytest.mark.parametrize("problem, config, message", [
    (square("__half"), GOOD, "tf32 needs float operands, got __half"),
    (square("__nv_bfloat16"), GOOD, "tf32 needs float operands, got __nv_bfloat16"),
    (square(F, b_ctype="__half"), GOOD, "one element type"),
    (square(), cfg(80, 64, 32, 2, 2, 3), "warp tile 40x32 is not a multiple of the 16x8 tf32"),
    (square(), cfg(128, 128, 12, 2, 2, 3), "bk=12 is not a multiple of the tf32's k step 8"),
    (square(), cfg(128, 128, 32, 2, 1, 3), "256 f32 accumulators"),
    (square(), cfg(128, 256, 64, 2, 4, 4), "> 227 KiB per block on sm_90a"),
    (GemmProblem(127, 255, 63, 1, GemmOperand("a", F, 63, 1, "0"),
                 GemmOperand("b", F, 1, 255, "0")), GOOD,
     "cp.async copies 16-byte chunks: A's m-rows are 252 bytes apart (63 x 4 B)"),
    (square(), cfg(128, 128, 32, 2, 2, 5), "5 stages > 4"),
])
def test_constraints_refuse(problem, config, message):
    reasons = constraints(problem, config, "sm_90a")
    assert any(message in r for r in reasons), reasons


def test_constraints_accept_and_smem_bytes():
    problem = square()
    assert constraints(problem, GOOD, "sm_90a") == [] == constraints(problem, GOOD, "sm_80")
    # A k-major: 128 rows of 32 + 8 pad floats (an odd number of 32-byte units); B n-major:
    # 32 rows of 128 + 4 pad floats (an odd number of 16-byte units)
    assert smem_bytes(problem, GOOD) == 3 * (128 * 40 + 32 * 132) * 4
    with pytest.raises(ValueError, match="tf32 needs float operands"):
        gemm_body(square("__half"), GOOD, lambda *_: [])


# --- on a GPU: the emulated cases through NVRTC and the driver -----------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tf32_kn_s3", "tf32_mk_s1", "tf32_ragged_async",
                                  "tf32_batched", "tf32_combine", "tf32_main"])
def test_gpu_matches_numpy(name):
    import cupy

    case = BY_NAME[name]
    a = rng.standard_normal((case.batch, case.m, case.k)).astype(np.float32)
    bt = rng.standard_normal((case.batch, case.n, case.k)).astype(np.float32)
    rounded = tf32(a).astype(np.float64) @ tf32(bt).astype(np.float64).transpose(0, 2, 1)
    compiled = compile_cuda(program(case.source()), get_target("sm_90a"))
    assert compiled.ok, compiled.log
    module = cupy.cuda.Module()
    module.load(compiled.cubin)
    arrays = {"a": cupy.asarray(store(a, case.a_layout)),
              "b": cupy.asarray(store(bt, case.b_layout)),
              "c": cupy.full(rounded.size, 0 if case.mode == "atomic" else np.nan, np.float32),
              "emmy_partial": cupy.full(case.config.split * rounded.size, np.nan, np.float32)}
    for kname, body in case.bodies().items():
        fn = module.get_function(kname)
        if body.smem_bytes > 48 * 1024:
            cupy.cuda.driver.funcSetAttribute(fn.ptr, 8, body.smem_bytes)
        fn((body.grid,), (body.threads,), [arrays[p] for _, p, _ in case.params(kname)],
           shared_mem=body.smem_bytes)
    got = cupy.asnumpy(arrays["c"]).reshape(rounded.shape)
    assert np.isfinite(got).all()
    err = np.linalg.norm(got - rounded) / np.linalg.norm(rounded)
    assert err < TIGHT, f"relative L2 error {err:.2e} against the tf32-rounded product"
