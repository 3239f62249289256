"""The back-to-back matrix-product template of emmy.cuda.chain: results against numpy (float64)
on the CPU emulator (ragged sizes, batches at padded offsets, every operand layout, a mid with a
bias and relu, an epilogue with a bias; f32 simt, f16 and bf16 mma with H rounded to the type);
the main configurations compile for sm_80 and sm_90a without spills; constraints() refuses
what the template cannot build.

All emulated kernels are printed into two sources, each built once (in parallel) for the module."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pytest

from emmy.cuda.chain import ChainConfig, ChainProblem, chain_body, constraints, smem_bytes
from emmy.cuda.emulate.run import build, build_and_run
from emmy.cuda.gemm_spec import Body, GemmOperand
from emmy.cuda.nvrtc import compile_cuda
from emmy.schedule.targets import get_target
from tests.cuda.test_gemm import Layout, kernel_source, layout, program, rounded, store

H, BF, F = "__half", "__nv_bfloat16", "float"
TOLERANCE = {H: 1e-2, BF: 2e-2, F: 1e-5}


@dataclass
class Case:
    """O[bz] = epilogue(mid(A[bz] @ B[bz]) @ C[bz]) through chain_body's kernel."""

    name: str
    m: int
    k1: int
    k2: int
    n: int
    ctype: str
    config: ChainConfig
    a_kind: str = "k"          # A (m x k1) stored row-major
    b_kind: str = "outer"      # B (k1 x k2) stored row-major (k2 contiguous)
    c_kind: str = "outer"      # C (k2 x n) stored row-major (n contiguous)
    batch: int = 1
    pad: int = 0               # extra (NaN) elements after each batch
    mid_bias: bool = False     # H = relu(A @ B + hbias) + hbias / 4: mid(0) != 0, and NaN
                               # past k2 (hbias is NaN-padded): H there must not be computed
    out_bias: bool = False     # O = H @ C + obias[n]
    problem: ChainProblem = field(init=False)

    def __post_init__(self):
        self.layouts = {"a": layout(self.a_kind, self.m, self.k1, self.pad),
                        "b": layout(self.b_kind, self.k2, self.k1, self.pad),
                        "c": layout(self.c_kind, self.n, self.k2, self.pad)}

        def operand(buf: str, lay: Layout) -> GemmOperand:
            return GemmOperand(buf, self.ctype, lay.stride_outer, lay.stride_k,
                               f"bz * {lay.batch_stride}LL",
                               lay.batch_stride if self.batch > 1 else 0)

        ops = {k: operand(k, lay) for k, lay in self.layouts.items()}
        self.problem = ChainProblem(self.m, self.k1, self.k2, self.n, self.batch,
                                    ops["a"], ops["b"], ops["c"])

    def mid(self, bz: str, row: str, col: str, acc: str) -> tuple[list[str], str]:
        if self.mid_bias:
            return ([f"const float md_v = {acc} + hbias[{col}];"],
                    f"fmaxf(md_v, 0.0f) + 0.25f * hbias[{col}]")
        return [], acc

    def epilogue(self, bz: str, row: str, col: str, acc: str) -> list[str]:
        at = f"{bz} * {self.m * self.n}LL + (long long)({row}) * {self.n} + ({col})"
        value = f"{acc} + obias[{col}]" if self.out_bias else acc
        return [f"o[{at}] = {value};"]

    def params(self) -> list[tuple[str, str, bool]]:
        return ([(self.ctype, k, False) for k in "abc"] +
                [("float", "hbias", False)] * self.mid_bias +
                [("float", "obias", False)] * self.out_bias + [("float", "o", True)])

    def body(self) -> Body:
        return chain_body(self.problem, self.config, self.mid, self.epilogue)

    def source(self) -> str:
        return kernel_source(self.name, self.body(), self.params())


def cfg(inst, bm, bn, bk1, bk2, wm, wn) -> ChainConfig:
    return ChainConfig(inst, bm, bn, bk1, bk2, wm, wn)


CASES = [
    # f32 simt: ragged everything, element-wise copies (rows not 16-byte aligned)
    Case("f32_ragged", 33, 70, 45, 50, F, cfg("simt", 32, 32, 8, 16, 1, 2)),
    Case("f32_ragged_bias", 33, 70, 45, 50, F, cfg("simt", 64, 32, 4, 8, 2, 1), a_kind="outer",
         b_kind="k", c_kind="k", mid_bias=True, out_bias=True),
    # batches at padded offsets, aligned vector copies, several chunks and K1 tiles
    Case("f32_batched", 64, 48, 96, 64, F, cfg("simt", 32, 32, 16, 32, 1, 2), batch=3, pad=4,
         mid_bias=True, out_bias=True),
    Case("f32_batched_t", 40, 32, 64, 36, F, cfg("simt", 64, 64, 8, 16, 2, 2), batch=2, pad=8,
         a_kind="outer", c_kind="k"),
    # f16 / bf16 mma, H rounded to the operand type
    Case("f16_ragged", 33, 70, 45, 50, H, cfg("mma", 32, 32, 16, 32, 2, 2), mid_bias=True,
         out_bias=True),
    Case("f16_batched_t", 64, 64, 96, 48, H, cfg("mma", 64, 48, 32, 32, 2, 2), batch=2, pad=8,
         a_kind="outer", b_kind="k", c_kind="k"),
    Case("bf16_ragged", 50, 40, 70, 33, BF, cfg("mma", 64, 32, 32, 64, 4, 1), b_kind="k",
         mid_bias=True),
    Case("bf16_batched", 48, 32, 64, 64, BF, cfg("mma", 32, 64, 16, 16, 2, 2), batch=2, pad=8,
         a_kind="outer", out_bias=True),
]
BY_NAME = {c.name: c for c in CASES}
SOURCES = 2
rng = np.random.default_rng(7)


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    groups = [CASES[i::SOURCES] for i in range(SOURCES)]
    texts = [program([case.source() for case in g]) for g in groups]
    with ThreadPoolExecutor(SOURCES) as pool:
        built = list(pool.map(lambda gt: build(gt[1], gt[0][0].name), zip(groups, texts)))
    for b in built:
        assert b.binary is not None, b.log[-4000:]
    return {case.name: text for g, text in zip(groups, texts) for case in g}


def round_to(values: np.ndarray, ctype: str) -> np.ndarray:
    return rounded(values, ctype)[1] if ctype != F else values


@pytest.mark.parametrize("name", list(BY_NAME))
def test_matches_numpy(sources, name):
    case = BY_NAME[name]
    z, t = case.batch, case.ctype
    scale = 1 / np.sqrt(case.k1)
    a_val, a_ref = rounded(rng.standard_normal((z, case.m, case.k1)), t)
    bt_val, bt_ref = rounded(rng.standard_normal((z, case.k2, case.k1)) * scale, t)
    ct_val, ct_ref = rounded(rng.standard_normal((z, case.n, case.k2)), t)
    hbias = np.full(case.k2 + 64, np.nan, np.float32)
    hbias[:case.k2] = rng.standard_normal(case.k2) + 0.5
    obias = rng.standard_normal(case.n).astype(np.float32)
    h = a_ref @ bt_ref.transpose(0, 2, 1)
    if case.mid_bias:
        h = np.maximum(h + hbias[:case.k2], 0) + 0.25 * hbias[:case.k2]
    expected = round_to(h, t) @ ct_ref.transpose(0, 2, 1)
    if case.out_bias:
        expected = expected + obias
    o = np.full(expected.size, np.nan, np.float32)
    args = [store(a_val, case.layouts["a"], t), store(bt_val, case.layouts["b"], t),
            store(ct_val, case.layouts["c"], t)] + [hbias] * case.mid_bias + \
        [obias] * case.out_bias + [o]
    body = case.body()
    assert body.grid == z * -(-case.m // case.config.bm) * -(-case.n // case.config.bn)
    r = build_and_run(sources[name], name, body.grid, body.threads, body.smem_bytes, args)
    assert r.ok, f"{name}: {r.status}: {r.log[-4000:]}"
    assert np.isfinite(o).all(), f"{np.isnan(o).sum()} outputs not written"
    got = o.reshape(expected.shape)
    err = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert err < TOLERANCE[t], f"relative L2 error {err:.2e}"


def test_cases_are_buildable_and_cover_the_options():
    for case in CASES:
        assert constraints(case.problem, case.config, "sm_90a") == [], case.name
        assert constraints(case.problem, case.config, "sm_80") == [], case.name
    for ctype in (F, H, BF):
        assert len({c.config for c in CASES if c.ctype == ctype}) >= 2
    assert {(c.a_kind, c.b_kind, c.c_kind) for c in CASES} >= {("k", "outer", "outer"),
                                                                ("outer", "k", "k")}


# --- the main configurations compile without spills -------------------------------------------

MAIN = {   # name: (operand type, config)
    "chain_mma_128x128_k32_c64_w4x2": (H, cfg("mma", 128, 128, 32, 64, 4, 2)),
    "chain_mma_64x128_k32_c64_w2x2": (BF, cfg("mma", 64, 128, 32, 64, 2, 2)),
    "chain_simt_64x64_k16_c32_w2x2": (F, cfg("simt", 64, 64, 16, 32, 2, 2)),
    "chain_simt_128x64_k8_c32_w4x2": (F, cfg("simt", 128, 64, 8, 32, 4, 2)),
}
MAIN_SIZE = 1024


def main_problem(ctype: str) -> ChainProblem:
    s = MAIN_SIZE
    return ChainProblem(s, 256, s, 256, 1, GemmOperand("a", ctype, 256, 1, "0"),
                        GemmOperand("b", ctype, 256, 1, "0"), GemmOperand("c", ctype, 1, s, "0"))


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_main_configs_compile_without_spills(target):
    kernels = []
    for name, (ctype, config) in MAIN.items():
        problem = main_problem(ctype)
        assert constraints(problem, config, target) == []
        body = chain_body(problem, config,
                          lambda bz, r, c, acc: ([f"const float md_v = {acc} + hb[{c}];"],
                                                 "fmaxf(md_v, 0.0f)"),
                          lambda bz, r, c, acc: [f"o[(long long)({r}) * 256 + ({c})] = {acc};"])
        kernels.append(kernel_source(name, body, [(ctype, "a", False), (ctype, "b", False),
                                                  (ctype, "c", False), ("float", "hb", False),
                                                  ("float", "o", True)]))
    result = compile_cuda(program(kernels), get_target(target))
    assert result.ok, result.log
    for name in MAIN:
        res = result.resources_of(name)
        assert res.spill_store_bytes == res.spill_load_bytes == res.stack_bytes == 0, (name, res)
        assert res.registers <= 255


# --- constraints ---------------------------------------------------------------------------------

def square(ctype=H, s=256, batch=1, c_type=None) -> ChainProblem:
    return ChainProblem(s, s, s, s, batch, GemmOperand("a", ctype, s, 1, "0"),
                        GemmOperand("b", ctype, 1, s, "0"),
                        GemmOperand("c", c_type or ctype, 1, s, "0"))


GOOD = cfg("mma", 128, 128, 32, 64, 4, 2)


@pytest.mark.parametrize("problem, config, target, message", [
    (square(F), GOOD, "sm_90a", "mma needs f16/bf16 operands, got float"),
    (square(H), cfg("simt", 64, 64, 16, 32, 2, 2), "sm_90a", "simt needs float operands"),
    (square(H, c_type=BF), GOOD, "sm_90a", "one element type"),
    (square(), cfg("mma", 96, 128, 32, 64, 4, 2), "sm_90a",
     "warp tiles 24x32 (H) and 24x64 (O) are not multiples of the 16x8 mma atom"),
    (square(), cfg("mma", 128, 128, 24, 64, 4, 2), "sm_90a", "bk1=24 and bk2=64 must be"),
    (square(), cfg("mma", 128, 256, 32, 64, 2, 2), "sm_90a", "need 320 f32 accumulators"),
    (square(F), cfg("simt", 128, 128, 16, 64, 2, 2), "sm_90a", "> 48 accumulators"),
    (square(F), cfg("simt", 64, 64, 8, 64, 2, 2), "sm_90a", "micro-tiles 8x4 (H) + 8x4 (O)"),
    (square(), cfg("mma", 128, 256, 32, 64, 4, 4), "sm_90a",
     "80 accumulators + ~64 other registers per thread > 128 registers a thread may have in a "
     "block of 512 threads"),
    (square(F), cfg("simt", 64, 64, 6, 32, 2, 2), "sm_90a", "multiples of 4 floats"),
    (square(), cfg("mma", 128, 128, 32, 64, 1, 3), "sm_90a", "does not split into 1 x 3 warps"),
    (square(), cfg("mma", 256, 256, 32, 64, 16, 4), "sm_90a", "2048 threads > 1024"),
    (square(s=2048), cfg("mma", 128, 128, 512, 64, 4, 2), "sm_90a",
     "> 227 KiB per block on sm_90a"),
    (square(s=2048), cfg("mma", 128, 128, 384, 64, 4, 2), "sm_80",
     "> 163 KiB per block on sm_80"),
    (square(), GOOD, "sm_70", "unknown target"),
    (square(), cfg("wgmma", 128, 128, 64, 64, 1, 1), "sm_90a", "unknown instruction kind"),
])
def test_constraints_refuse(problem, config, target, message):
    reasons = constraints(problem, config, target)
    assert any(message in r for r in reasons), reasons


def test_constraints_accept_and_smem_bytes():
    problem = square()
    assert constraints(problem, GOOD, "sm_90a") == [] == constraints(problem, GOOD, "sm_80")
    # A 128 x (32 + 8), B (k2 contiguous: k1 rows) 32 x (64 + 8), H 128 x (64 + 8), C (n
    # contiguous: k2 rows) 64 x (128 + 8) halves
    assert smem_bytes(problem, GOOD) == (128 * 40 + 32 * 72 + 128 * 72 + 64 * 136) * 2
    with pytest.raises(ValueError, match="mma needs f16/bf16"):
        chain_body(square(F), GOOD, lambda *_: ([], "0.0f"), lambda *_: [])
