"""The matrix-product templates of emmy.cuda.gemm: results against numpy (float64) on the CPU
emulator for every operand layout, stage count, split mode, raster order and instruction kind;
the main configurations compile for sm_80 and sm_90a without spills; constraints() refuses
what the templates cannot build.

All emulated kernels are printed into two sources, each built once (in parallel) for the module;
every test then runs its own kernel from the cached programs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pytest

from emmy.cuda.emulate.run import build, build_and_run
from emmy.cuda.gemm import combine_body, constraints, gemm_body, smem_bytes
from emmy.cuda.gemm_spec import Body, GemmConfig, GemmOperand, GemmProblem
from emmy.cuda.nvrtc import compile_cuda
from emmy.schedule.targets import get_target

NUMPY = {"__half": np.float16, "__nv_bfloat16": np.uint16, "float": np.float32}
NAN_FILL = {"__half": np.nan, "__nv_bfloat16": 0x7FC0, "float": np.nan}   # bf16: the bits
TOLERANCE = {"__half": 1e-2, "__nv_bfloat16": 1e-2, "float": 1e-5}


def kernel_source(name: str, body: Body, params: list[tuple[str, str, bool]]) -> str:
    """One kernel as emmy.cuda.emit prints it: `params` are (ctype, name, is_output)."""
    plist = ", ".join(f"{c}* __restrict__ {n}" if out else f"const {c}* __restrict__ {n}"
                      for c, n, out in params)
    lines = [f'extern "C" __global__ void __launch_bounds__({body.threads}) {name}({plist}) {{',
             "  const int tid = threadIdx.x;",
             "  const long long bid = blockIdx.x;"]
    if body.smem_bytes:
        lines.append("  extern __shared__ __align__(16) unsigned char emmy_smem[];")
    return "\n".join(lines + ["  " + line for line in body.lines] + ["}", ""])


def program(kernels: list[str]) -> str:
    return "\n".join(['#include "emmy_kernel.cuh"', "", *kernels])


# --- operands: logical values, their storage, the GemmOperand that addresses it ---------------

@dataclass(frozen=True)
class Layout:
    """How an operand X[bz, outer, k] is stored: element strides and a padded batch stride.
    Padding between rows and batches holds NaN, so reading it spoils the result."""

    stride_outer: int
    stride_k: int
    batch_stride: int

    def size(self, batch: int) -> int:
        return batch * self.batch_stride


def layout(kind: str, outer: int, k: int, pad: int = 0, ld: int = 0) -> Layout:
    """k: rows of k contiguous (A row-major, B = w.t()); outer: outer contiguous (A
    transposed, B row-major); strided: every other element of k-contiguous rows."""
    if kind == "k":
        ld = ld or k
        return Layout(ld, 1, outer * ld + pad)
    if kind == "outer":
        ld = ld or outer
        return Layout(1, ld, k * ld + pad)
    assert kind == "strided"
    return Layout(2 * k, 2, 2 * outer * k + pad)


def rounded(values: np.ndarray, ctype: str) -> tuple[np.ndarray, np.ndarray]:
    """(what the kernel reads: storage dtype, the same values as float64)."""
    if ctype == "__nv_bfloat16":
        bits = (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    stored = values.astype(NUMPY[ctype])
    return stored, stored.astype(np.float64)


def store(values: np.ndarray, lay: Layout, ctype: str) -> np.ndarray:
    """A flat buffer holding values[bz, outer, k] at bz*batch_stride + o*so + k*sk, NaN elsewhere."""
    batch, outer, k = values.shape
    buf = np.full(lay.size(batch), NAN_FILL[ctype], dtype=NUMPY[ctype])
    z, o, kk = np.meshgrid(np.arange(batch), np.arange(outer), np.arange(k), indexing="ij")
    buf[z * lay.batch_stride + o * lay.stride_outer + kk * lay.stride_k] = values
    return buf


# --- the emulated cases ------------------------------------------------------------------------

rng = np.random.default_rng(2024)


@dataclass
class Case:
    """One product: C[bz] = A[bz] @ B[bz] (+ bias, relu) through gemm_body's kernel."""

    name: str
    m: int
    n: int
    k: int
    ctype: str
    config: GemmConfig
    a_kind: str = "k"                 # A stored with k contiguous (row-major)
    b_kind: str = "outer"             # B stored with n contiguous (row-major K x N)
    batch: int = 1
    pad: int = 0                      # extra elements after each batch
    a_ld: int = 0                     # A's row pitch when it is a slice of wider rows
    bias_relu: bool = False
    problem: GemmProblem = field(init=False)

    def __post_init__(self):
        self.a_layout = layout(self.a_kind, self.m, self.k, self.pad, self.a_ld)
        self.b_layout = layout(self.b_kind, self.n, self.k, self.pad)

        def operand(buf: str, lay: Layout) -> GemmOperand:
            return GemmOperand(buf, self.ctype, lay.stride_outer, lay.stride_k,
                               f"bz * {lay.batch_stride}LL",
                               lay.batch_stride if self.batch > 1 else 0)

        self.problem = GemmProblem(self.m, self.n, self.k, self.batch,
                                   operand("a", self.a_layout), operand("b", self.b_layout))

    @property
    def mode(self) -> str:
        return self.config.split_mode if self.config.split > 1 else ""

    @property
    def combine_name(self) -> str:
        return self.name + "__combine"

    def epilogue(self, bz: str, row: str, col: str, acc: str) -> list[str]:
        at = f"{bz} * {self.m * self.n}LL + (long long)({row}) * {self.n} + ({col})"
        if self.mode == "atomic":
            return [f"atomicAdd(c + {at}, {acc});"]
        if self.bias_relu:
            return [f"const float e_v = {acc} + bias[{col}];", f"c[{at}] = fmaxf(e_v, 0.0f);"]
        return [f"c[{at}] = {acc};"]

    def params(self, combine: bool = False) -> list[tuple[str, str, bool]]:
        if combine:
            out = [("float", "emmy_partial", False)]
        else:
            out = [(self.ctype, "a", False), (self.ctype, "b", False)]
            out += [("float", "emmy_partial", True)] if self.mode == "combine" else []
        return out + [("float", "bias", False)] * self.bias_relu + [("float", "c", True)]

    def bodies(self) -> dict[str, Body]:
        out = {self.name: gemm_body(self.problem, self.config, self.epilogue)}
        if self.mode == "combine":
            out[self.combine_name] = combine_body(self.problem, self.config, self.epilogue)
        return out

    def source(self) -> list[str]:
        return [kernel_source(name, body, self.params(name == self.combine_name))
                for name, body in self.bodies().items()]


def cfg(inst, bm, bn, bk, wm, wn, stages, **kw) -> GemmConfig:
    return GemmConfig(inst, bm, bn, bk, wm, wn, stages, **kw)


H, BF, F = "__half", "__nv_bfloat16", "float"
CASES = [
    # f16 / bf16 mma: every layout of A and B, with every stage count
    Case("f16_kn_s3", 128, 128, 64, H, cfg("mma", 64, 64, 32, 2, 2, 3)),
    Case("f16_mn_s1", 128, 128, 64, H, cfg("mma", 64, 64, 32, 2, 2, 1), a_kind="outer"),
    Case("f16_kk_s4", 128, 128, 192, H, cfg("mma", 64, 64, 64, 2, 2, 4), b_kind="k"),
    Case("f16_mk_s2", 128, 128, 64, H, cfg("mma", 64, 64, 32, 2, 2, 2), a_kind="outer",
         b_kind="k"),
    Case("bf16_kn_s2", 128, 128, 64, BF, cfg("mma", 64, 64, 32, 2, 2, 2)),
    Case("bf16_mk_s4", 128, 128, 64, BF, cfg("mma", 64, 64, 16, 2, 2, 4), a_kind="outer",
         b_kind="k"),
    # f32 simt: every layout, every stage count
    Case("f32_kn_s2", 128, 128, 64, F, cfg("simt", 64, 64, 16, 2, 2, 2)),
    Case("f32_mn_s3", 128, 128, 64, F, cfg("simt", 64, 64, 8, 2, 2, 3), a_kind="outer"),
    Case("f32_kk_s1", 128, 128, 64, F, cfg("simt", 64, 64, 16, 2, 2, 1), b_kind="k"),
    Case("f32_mk_s4", 128, 128, 64, F, cfg("simt", 32, 64, 8, 1, 2, 4), a_kind="outer",
         b_kind="k"),
    # ragged shapes with synchronous element-wise loads
    Case("f16_ragged", 127, 255, 63, H, cfg("mma", 64, 64, 32, 2, 2, 1)),
    Case("bf16_ragged_mk", 127, 255, 63, BF, cfg("mma", 64, 64, 32, 2, 2, 1), a_kind="outer",
         b_kind="k"),
    Case("f32_ragged", 127, 255, 63, F, cfg("simt", 64, 64, 16, 2, 2, 1), a_kind="outer"),
    # ragged m, n with cp.async zero-fill; a K slice whose last chunk is partial (60 of 64)
    Case("f16_ragged_async", 127, 121, 64, H, cfg("mma", 64, 64, 32, 2, 2, 3), b_kind="k"),
    Case("f16_k_slice", 64, 64, 60, H, cfg("mma", 64, 64, 32, 2, 2, 3), a_ld=64),
    Case("f16_k_slice_s1", 64, 64, 60, H, cfg("mma", 64, 64, 32, 2, 2, 1), a_ld=64),
    # neither stride 1: element-wise loads
    Case("f16_strided", 64, 64, 48, H, cfg("mma", 32, 32, 16, 1, 1, 1), a_kind="strided"),
    # batches at padded offsets, grouped raster with a partial last group, odd n atoms (x2)
    Case("f16_batched", 64, 96, 64, H, cfg("mma", 32, 48, 32, 2, 2, 4, group=4), batch=3,
         pad=8),
    Case("f32_batched", 60, 64, 40, F, cfg("simt", 32, 32, 8, 1, 2, 2), batch=2, pad=4,
         b_kind="k"),
    Case("bf16_group4", 160, 64, 32, BF, cfg("mma", 32, 32, 32, 1, 2, 2, group=4)),
    # split K
    Case("f16_atomic", 64, 64, 160, H, cfg("mma", 64, 64, 32, 2, 2, 3, split=3,
                                             split_mode="atomic"), batch=2),
    Case("f16_combine", 64, 64, 160, H, cfg("mma", 64, 64, 32, 2, 2, 2, split=2,
                                              split_mode="combine"), b_kind="k", batch=2),
    Case("f32_combine", 60, 62, 100, F, cfg("simt", 32, 32, 16, 1, 1, 1, split=4,
                                              split_mode="combine")),
    # a fused epilogue: bias and relu
    Case("f16_bias_relu", 96, 64, 64, H, cfg("mma", 64, 64, 32, 2, 2, 3), bias_relu=True),
    Case("f32_bias_relu", 64, 64, 32, F, cfg("simt", 64, 32, 16, 2, 1, 2), bias_relu=True),
]
BY_NAME = {c.name: c for c in CASES}
SOURCES = 2


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    """Case name -> the program holding its kernels; the programs are built here, in parallel."""
    groups = [CASES[i::SOURCES] for i in range(SOURCES)]
    texts = [program([k for case in g for k in case.source()]) for g in groups]
    with ThreadPoolExecutor(SOURCES) as pool:
        built = list(pool.map(lambda gt: build(gt[1], gt[0][0].name), zip(groups, texts)))
    for b in built:
        assert b.binary is not None, b.log[-4000:]
    return {case.name: text for g, text in zip(groups, texts) for case in g}


def run(source: str, name: str, body: Body, args: list) -> None:
    r = build_and_run(source, name, body.grid, body.threads, body.smem_bytes, args)
    assert r.ok, f"{name}: {r.status}: {r.log[-4000:]}"


@pytest.mark.parametrize("name", list(BY_NAME))
def test_matches_numpy(sources, name):
    case = BY_NAME[name]
    shape = (case.batch, case.m, case.k)
    a_val, a_ref = rounded(rng.standard_normal(shape), case.ctype)
    bt_val, bt_ref = rounded(rng.standard_normal((case.batch, case.n, case.k)), case.ctype)
    expected = a_ref @ bt_ref.transpose(0, 2, 1)
    bias = rng.standard_normal(case.n).astype(np.float32)
    if case.bias_relu:
        expected = np.maximum(expected + bias, 0)
    c = np.zeros(expected.size, np.float32) if case.mode == "atomic" else \
        np.full(expected.size, np.nan, np.float32)
    inputs = [store(a_val, case.a_layout, case.ctype), store(bt_val, case.b_layout, case.ctype)]
    tail = [bias] * case.bias_relu + [c]
    bodies = case.bodies()
    if case.mode == "combine":
        partial = np.full(case.config.split * expected.size, np.nan, np.float32)
        run(sources[name], name, bodies[name], [*inputs, partial, *tail])
        run(sources[name], case.combine_name, bodies[case.combine_name], [partial, *tail])
    else:
        run(sources[name], name, bodies[name], [*inputs, *tail])
    assert np.isfinite(c).all(), f"{np.isnan(c).sum()} outputs not written"
    got = c.reshape(expected.shape)
    err = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert err < TOLERANCE[case.ctype], f"relative L2 error {err:.2e}"


def test_cases_are_buildable_and_cover_the_options():
    for case in CASES:
        assert constraints(case.problem, case.config, "sm_90a") == [], case.name
    configs = [c.config for c in CASES]
    assert {(c.inst, c.stages) for c in configs} >= {(i, s) for i in ("mma", "simt")
                                                     for s in (1, 2, 3, 4)}
    assert {(c.a_kind, c.b_kind) for c in CASES if c.config.inst == "mma"} >= \
        {("k", "outer"), ("outer", "outer"), ("k", "k"), ("outer", "k")}
    assert {c.split_mode for c in configs} >= {"atomic", "combine"}
    assert {c.group for c in configs} >= {1, 4}


# --- the main configurations compile without spills -------------------------------------------

M4K = 4096
MAIN = {   # name: (operand type, B k-contiguous, config)
    "mma_128x256x64_w2x4_s3": (H, False, cfg("mma", 128, 256, 64, 2, 4, 3, group=8)),
    "mma_128x256x32_w2x4_s4": (BF, True, cfg("mma", 128, 256, 32, 2, 4, 4, group=8)),
    "mma_256x128x32_w4x2_s3": (H, True, cfg("mma", 256, 128, 32, 4, 2, 3, group=8)),
    "mma_128x128x64_w2x2_s3": (BF, False, cfg("mma", 128, 128, 64, 2, 2, 3, group=8)),
    "mma_128x128x32_w2x2_s4": (H, False, cfg("mma", 128, 128, 32, 2, 2, 4, group=8)),
    "simt_128x128x16_w2x4_s3": (F, False, cfg("simt", 128, 128, 16, 2, 4, 3, group=8)),
    "simt_128x128x8_w2x4_s3": (F, True, cfg("simt", 128, 128, 8, 2, 4, 3, group=8)),
}


def main_problem(ctype: str, b_k_contiguous: bool) -> GemmProblem:
    b = GemmOperand("b", ctype, M4K, 1, "0") if b_k_contiguous else \
        GemmOperand("b", ctype, 1, M4K, "0")
    return GemmProblem(M4K, M4K, M4K, 1, GemmOperand("a", ctype, M4K, 1, "0"), b)


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_main_configs_compile_without_spills(target):
    kernels = []
    for name, (ctype, bk, config) in MAIN.items():
        problem = main_problem(ctype, bk)
        assert constraints(problem, config, target) == []
        body = gemm_body(problem, config,
                         lambda bz, r, c, acc: [f"c[(long long)({r}) * {M4K} + ({c})] = {acc};"])
        kernels.append(kernel_source(name, body, [(ctype, "a", False), (ctype, "b", False),
                                                  ("float", "c", True)]))
    result = compile_cuda(program(kernels), get_target(target))
    assert result.ok, result.log
    for name in MAIN:
        res = result.resources_of(name)
        assert res.spill_store_bytes == res.spill_load_bytes == res.stack_bytes == 0, (name, res)
        assert res.registers <= 255


# --- constraints ---------------------------------------------------------------------------------

def square(ctype=H, n=256, a=None, b=None, batch=1) -> GemmProblem:
    a = a or GemmOperand("a", ctype, n, 1, "0")
    b = b or GemmOperand("b", ctype, 1, n, "0")
    return GemmProblem(n, n, n, batch, a, b)


GOOD = cfg("mma", 128, 128, 32, 2, 2, 3)


@pytest.mark.parametrize("problem, config, target, message", [
    (square(F), GOOD, "sm_90a", "mma needs f16/bf16 operands, got float"),
    (square(H), cfg("simt", 64, 64, 8, 2, 2, 2), "sm_90a", "simt needs float operands"),
    (square(H, b=GemmOperand("b", BF, 1, 256, "0")), GOOD, "sm_90a", "one element type"),
    (square(), cfg("mma", 80, 64, 32, 2, 2, 3), "sm_90a",
     "warp tile 40x32 is not a multiple of the 16x8 mma atom"),
    (square(), cfg("mma", 128, 128, 24, 2, 2, 3), "sm_90a", "bk=24 is not a multiple"),
    (square(), cfg("mma", 128, 128, 32, 2, 1, 3), "sm_90a", "256 f32 accumulators"),
    (square(), cfg("mma", 256, 256, 32, 8, 8, 3), "sm_90a", "2048 threads > 1024"),
    (square(), cfg("mma", 256, 256, 64, 4, 4, 4), "sm_90a", "> 227 KiB per block on sm_90a"),
    (square(), cfg("mma", 128, 256, 64, 2, 4, 4), "sm_80", "> 163 KiB per block on sm_80"),
    (GemmProblem(127, 255, 63, 1, GemmOperand("a", H, 63, 1, "0"),
                 GemmOperand("b", H, 1, 255, "0")), GOOD, "sm_90a",
     "cp.async copies 16-byte chunks: A's m-rows are 126 bytes apart (63 x 2 B)"),
    (square(a=GemmOperand("a", H, 512, 2, "0")), GOOD, "sm_90a",
     "A has no contiguous dimension"),
    (square(batch=2, a=GemmOperand("a", H, 256, 1, "bz * 65540LL", 65540)), GOOD, "sm_90a",
     "A's batches are 131080 bytes apart"),
    (square(batch=2, a=GemmOperand("a", H, 256, 1, "idx[bz]", None)), GOOD, "sm_90a",
     "not a known stride"),
    (square(), cfg("mma", 128, 128, 32, 2, 2, 5), "sm_90a", "5 stages > 4"),
    (square(), cfg("mma", 128, 128, 32, 2, 2, 3, split=2), "sm_90a", "needs split_mode"),
    (square(), cfg("mma", 128, 128, 32, 2, 2, 3, split=16, split_mode="atomic"), "sm_90a",
     "split 16 > 8 K tiles"),
    (square(), cfg("wgmma", 128, 128, 64, 1, 1, 3), "sm_90a", "gemm_sm90"),
    (square(), GOOD, "sm_70", "unknown target"),
])
def test_constraints_refuse(problem, config, target, message):
    reasons = constraints(problem, config, target)
    assert any(message in r for r in reasons), reasons


def test_constraints_accept_and_smem_bytes():
    problem = square()
    assert constraints(problem, GOOD, "sm_90a") == [] == constraints(problem, GOOD, "sm_80")
    # A: 128 rows of 32 + 8 pad halves; B: 32 rows of 128 + 8 pad halves; 3 stages
    assert smem_bytes(problem, GOOD) == 3 * (128 * 40 + 32 * 136) * 2
    # stages 1 takes any shape: unaligned rows load element by element
    ragged = GemmProblem(127, 255, 63, 1, GemmOperand("a", H, 63, 1, "0"),
                         GemmOperand("b", H, 1, 255, "0"))
    assert constraints(ragged, cfg("mma", 64, 64, 32, 2, 2, 1), "sm_90a") == []
    with pytest.raises(ValueError, match="mma needs f16/bf16"):
        gemm_body(square(F), GOOD, lambda *_: [])


# --- on a GPU: the emulated cases through NVRTC and the driver -----------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("name", ["f16_kn_s3", "bf16_mk_s4", "f16_ragged", "f16_batched",
                                  "f16_combine", "f32_mn_s3", "f16_bias_relu"])
def test_gpu_matches_numpy(name):
    import cupy

    case = BY_NAME[name]
    a_val, a_ref = rounded(rng.standard_normal((case.batch, case.m, case.k)), case.ctype)
    bt_val, bt_ref = rounded(rng.standard_normal((case.batch, case.n, case.k)), case.ctype)
    expected = a_ref @ bt_ref.transpose(0, 2, 1)
    bias = rng.standard_normal(case.n).astype(np.float32)
    if case.bias_relu:
        expected = np.maximum(expected + bias, 0)
    bodies = case.bodies()
    compiled = compile_cuda(program(case.source()), get_target("sm_90a"))
    assert compiled.ok, compiled.log
    module = cupy.cuda.Module()
    module.load(compiled.cubin)
    arrays = {"a": cupy.asarray(store(a_val, case.a_layout, case.ctype)),
              "b": cupy.asarray(store(bt_val, case.b_layout, case.ctype)),
              "bias": cupy.asarray(bias),
              "c": cupy.full(expected.size, 0 if case.mode == "atomic" else np.nan, np.float32),
              "emmy_partial": cupy.full(case.config.split * expected.size, np.nan, np.float32)}
    for kname, body in bodies.items():
        fn = module.get_function(kname)
        if body.smem_bytes > 48 * 1024:
            cupy.cuda.driver.funcSetAttribute(fn.ptr, 8, body.smem_bytes)
        args = [arrays[p] for _, p, _ in case.params(kname == case.combine_name)]
        fn((body.grid,), (body.threads,), args, shared_mem=body.smem_bytes)
    got = cupy.asnumpy(arrays["c"]).reshape(expected.shape)
    assert np.isfinite(got).all()
    err = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert err < TOLERANCE[case.ctype], f"relative L2 error {err:.2e}"
