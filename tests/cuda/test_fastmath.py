"""Cheaper arithmetic in the generic kernels: staged rows read as vectors, a division by a
row's value made one reciprocal, NaN-propagating max in one instruction, and the hardware's
approximate exp (and sigmoid) in kernels whose floating-point data is all 16-bit
(emmy/kernel_ir/fastmath.py). Each is checked for what it emits, and against torch on the
emulator; the device versions of the fast functions against numpy on a GPU."""

from __future__ import annotations

import re

import numpy as np
import pytest

from emmy.check import check_cuda_program
from emmy.cuda.emulate.run import build_and_run
from emmy.cuda.nvrtc import compile_cuda
from emmy.frontend.workload import load_expr
from emmy.pipeline import Options, compile_to
from emmy.schedule.targets import get_target

SOFTMAX = "nn.Softmax(dim=-1)(torch.randn(6, 512{dtype}) * 8)"
ROW = "WORK=block:128 TILE=v4x1 REDUCE=shuffle STAGE=smem:async PLACE=fuse"


def compiled(expr: str, row: str | None = ROW, target: str = "sm_90a"):
    w = load_expr(expr)
    results = compile_to(w, "cuda", Options(target=target, rows={"": row} if row else {}))
    return w, results


def source(expr: str, row: str | None = ROW) -> str:
    return "\n".join(u.source for u in compiled(expr, row)[1]["cuda"].units)


def checked(expr: str, row: str | None = ROW) -> str:
    """The program's source, after its emulated run matched torch."""
    w, results = compiled(expr, row)
    report, run = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None and report.ok, (run, report)
    return "\n".join(u.source for u in results["cuda"].units)


# --- which kernels take the fast functions -----------------------------------------------------

@pytest.mark.parametrize("dtype, fast", [(", dtype=torch.bfloat16", True),
                                         (", dtype=torch.float16", True), ("", False)])
def test_only_16_bit_kernels_take_the_fast_exp(dtype, fast):
    text = checked(SOFTMAX.format(dtype=dtype))
    assert ("em_fast_exp(" in text) is fast
    assert ("em_exp(" in text) is not fast


def test_a_kernel_writing_f32_keeps_the_accurate_functions():
    """bf16 in, f32 out: the output's precision asks for the library exp."""
    text = checked("(lambda x: torch.softmax(x.float(), dim=-1))"
                   "(torch.randn(6, 512, dtype=torch.bfloat16) * 8)")
    assert "em_fast_" not in text and "em_exp(" in text


def test_a_bf16_elementwise_chain_with_sigmoid_and_exp_matches_torch():
    """sigmoid and exp take the fast forms; tanh and log keep the library's (their
    approximations' errors are not relative everywhere: fastmath.py)."""
    expr = ("(lambda x, y: torch.sigmoid(y) * torch.tanh(x) + torch.log(x.abs() + 1e-3) "
            "- torch.exp(-y))(torch.randn(8, 256, dtype=torch.bfloat16) * 4, "
            "torch.randn(8, 256, dtype=torch.bfloat16) * 4)")
    text = checked(expr, None)
    assert "em_fast_sigmoid(" in text and "em_fast_exp(" in text
    assert "em_tanh(" in text and "em_log(" in text


def test_a_half_precision_epilogue_takes_the_fast_sigmoid():
    """A tensor-core product's epilogue in an f16 kernel: SiLU through the fast sigmoid, and
    GELU's tanh form through the library tanh, checked against torch."""
    expr = ("(lambda x, w: F.silu(x @ w) + F.gelu(x @ w, approximate='tanh'))"
            "(torch.randn(64, 128).half(), torch.randn(128, 64).half())")
    text = checked(expr, None)
    assert "em_fast_sigmoid(" in text and "em_tanh(" in text and "mma_m16n8k16" in text


@pytest.mark.parametrize("expr", [
    "nn.LogSoftmax(dim=-1)(torch.randn(6, 512, dtype=torch.float16) * 30)",
    "nn.Softmax(dim=-1)(torch.randn(6, 512, dtype=torch.bfloat16) * 100)",
])
def test_wide_rows_of_16_bit_softmax_match_torch(expr):
    """Scores far apart (x * 100): most exps underflow, the largest are exactly 1."""
    assert "em_fast_" in checked(expr)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_nvrtc_accepts_the_fast_functions(target):
    expr = ("(lambda x: torch.sigmoid(x) * torch.exp(x) + torch.log_softmax(x, -1))"
            "(torch.randn(8, 256, dtype=torch.float16))")
    _, results = compiled(expr, None, target)
    for unit in results["cuda"].units:
        result = compile_cuda(unit.source, get_target(target))
        assert result.ok, result.log


# --- reciprocals and vector reads ------------------------------------------------------------

def test_softmax_divides_once_a_row():
    text = checked(SOFTMAX.format(dtype=""))
    assert text.count("em_reciprocal(") == 1
    assert not re.search(r"/ acc\d", text), "a division by the row sum is left in the loop"
    assert re.search(r"\* acc\d+_rcp", text)


def test_two_folds_dividing_by_one_value_share_its_reciprocal():
    """x / s is recomputed in the max pass and the output pass: one reciprocal, declared once."""
    expr = ("(lambda x: (lambda a: a - a.amax(-1, keepdim=True))"
            "(x / x.abs().sum(-1, keepdim=True)))(torch.randn(6, 512))")
    text = checked(expr)
    assert text.count("em_reciprocal(") == 1


def test_staged_rows_are_read_as_vectors():
    text = checked(SOFTMAX.format(dtype=", dtype=torch.bfloat16"))
    assert re.search(r"em_vload\(stage_\w+ \+ \(", text)
    assert not re.search(r"em_cvt<float>\(stage_", text)
    text = checked("nn.RMSNorm(512)(torch.randn(6, 512))",
                   "WORK=block:64 TILE=v2x2 REDUCE=smem STAGE=smem PLACE=fuse")
    assert re.search(r"em_vstore\(stage_\w+ \+ \(", text)     # filled by the first pass
    assert re.search(r"em_vload\(stage_\w+ \+ \(", text)


def test_bf16_softmax_sass_has_no_division_or_slow_exp_in_its_loops():
    """No expf range fix-ups (comparisons against -126), no IEEE division (the row's one
    reciprocal is 1 / s, not x / y), and max as FMNMX.NAN."""
    from emmy.cuda.sass import cuobjdump, disassemble

    if cuobjdump() is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")
    _, results = compiled(SOFTMAX.format(dtype=", dtype=torch.bfloat16").replace("512", "8192"))
    sass = disassemble(compile_cuda(results["cuda"].units[0].source, get_target("sm_90a")).cubin)
    assert "FMNMX.NAN" in sass
    assert "-126" not in sass
    assert "FCHK" not in sass          # the check every IEEE division x / y begins with


def test_the_cost_model_counts_what_the_kernel_computes():
    """bf16 softmax over 8192-wide rows: compute-bound with the library exp and a division an
    element; with two ex2.approx and a multiplication an element it is memory-bound."""
    from emmy.runtime import costmodel as cm

    expr = "nn.Softmax(dim=-1)(torch.empty(8192, 8192, dtype=torch.bfloat16))"
    (k,) = compile_to(load_expr(expr), "tile")["tile"].program.kernels
    (launch,) = cm.estimate_kernel(k, ROW, get_target("sm_90a")).launches
    assert launch.limiter == "memory"


# --- legal => correct for 16-bit row kernels ---------------------------------------------------

CORE = ["softmax", "log_softmax", "rmsnorm", "layernorm", "elementwise_chain"]


def _sampled(name: str, dtype: str, per_kernel: int, where=None):
    from pathlib import Path

    from emmy.bench.suites import cast_workload
    from emmy.frontend.workload import load_file
    from emmy.verify import verify_rows

    examples = Path(__file__).resolve().parents[2] / "examples"
    w = cast_workload(load_file(examples / f"{name}.py"), dtype)
    results = verify_rows(w, per_kernel=per_kernel, seed=11, where=where)
    assert results
    assert not [r for r in results if r.verdict != "ok"]


@pytest.mark.parametrize("name", CORE)
def test_sampled_bf16_rows_of_the_core_examples_are_correct(name):
    from tests.rows import without_clusters

    _sampled(name, "bf16", 2, without_clusters)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("name", CORE)
def test_legal_16_bit_rows_of_the_core_examples_are_correct(name, dtype):
    _sampled(name, dtype, 20)


@pytest.mark.parametrize("example, row", [
    ("attention_half", "WORK=warps:4 TILE=flash:128x32 REDUCE=serial STAGE=async:2"),
    ("attention_half", "WORK=warps:8 TILE=wgmma:128x64 REDUCE=serial STAGE=tma:2:overlap"),
    ("attention", "WORK=warps:4 TILE=simt:64x32 REDUCE=serial STAGE=async:2"),
])
def test_flash_attention_exponentials_are_one_ex2_each(example, row):
    """The online softmax's 2^x: ex2.approx.ftz alone (ex2_approx), without the range check
    and predicated multiplications exp2f wraps it in for subnormal results."""
    from pathlib import Path

    from emmy.cuda.sass import cuobjdump, disassemble
    from emmy.frontend.workload import load_file

    if cuobjdump() is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")
    path = Path(__file__).resolve().parents[2] / "examples" / f"{example}.py"
    w = load_file(path, (("seq_len", 256), ("head_dim", 64)))
    (unit,) = compile_to(w, "cuda", Options(rows={"": row}, db=None))["cuda"].units
    sass = disassemble(compile_cuda(unit.source, get_target("sm_90a")).cubin)
    assert "MUFU.EX2" in sass and "-126" not in sass


# --- the fast functions themselves -------------------------------------------------------------

KERNEL = r"""
#include "emmy_kernel.cuh"
extern "C" __global__ void fast(float* out, const float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[0 * n + i] = em_fast_exp(x[i]);
  out[1 * n + i] = em_fast_sigmoid(x[i]);
  out[2 * n + i] = em_maximum(x[i], x[n - 1 - i]);
  out[3 * n + i] = em_minimum(x[i], x[n - 1 - i]);
}
"""


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.uniform(-20, 20, 500), rng.uniform(-1, 1, 200),
                        rng.uniform(1e-6, 1e3, 200), [0.0, -0.0, 88.0, 89.0, -87.0, -104.0,
                                                      -120.0, 1e-40, np.inf, -np.inf, np.nan]])
    return x.astype(np.float32)


def _assert_close_to_accurate(x: np.ndarray, out: np.ndarray):
    """Relative error of exp and sigmoid under 2^-21 + |x| 2^-24 (fastmath.py's bound, with
    ex2.approx's own 2 ulp), their limits, and max / min propagating NaN."""
    n = len(x)
    exp, sig, mx, mn = out.reshape(4, n).astype(np.float64)
    xd = x.astype(np.float64)
    with np.errstate(all="ignore"):
        want = {"exp": np.exp(xd), "sigmoid": 1 / (1 + np.exp(-xd))}
    bound = np.abs(xd) * 2.0 ** -24 + 2.0 ** -21
    for name, got in (("exp", exp), ("sigmoid", sig)):
        w = want[name]
        ok = np.isfinite(xd) & (np.abs(w) < 3e38) & (np.abs(w) > 1e-30)  # f32's normal range
        err = np.abs(got[ok] - w[ok]) / np.abs(w[ok])
        assert np.all(err <= bound[ok]), (name, x[ok][np.argmax(err / bound[ok])])
    assert exp[x == np.inf][0] == np.inf and exp[x == -np.inf][0] == 0
    assert exp[x == -104.0][0] == 0.0             # subnormal result, flushed
    assert np.isnan(exp[np.isnan(x)]).all() and np.isnan(sig[np.isnan(x)]).all()
    assert sig[x == -np.inf][0] == 0 and sig[x == np.inf][0] == 1
    assert sig[x == -120.0][0] == 0               # exp(120) overflows: 1 / inf is 0
    other = x[::-1]
    assert np.isnan(mx[np.isnan(x) | np.isnan(other)]).all()
    assert np.isnan(mn[np.isnan(x) | np.isnan(other)]).all()
    keep = ~(np.isnan(x) | np.isnan(other))
    np.testing.assert_array_equal(mx[keep], np.maximum(x[keep], other[keep]))
    np.testing.assert_array_equal(mn[keep], np.minimum(x[keep], other[keep]))


def test_fast_functions_on_the_emulator():
    x = _inputs()
    out = np.full(4 * len(x), np.nan, np.float32)
    r = build_and_run(KERNEL, "fast", (len(x) + 127) // 128, 128, 0, [out, x, len(x)])
    assert r.ok, r.log
    _assert_close_to_accurate(x, out)


@pytest.mark.gpu
def test_fast_functions_on_the_gpu():
    from tests.cuda.gpu import run_on_gpu

    x = _inputs()
    out = np.full(4 * len(x), np.nan, np.float32)
    run_on_gpu(KERNEL, "fast", (len(x) + 127) // 128, 128, 0, [out, x, np.int32(len(x))])
    _assert_close_to_accurate(x, out)
