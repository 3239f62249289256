"""8-bit floats (torch.float8_e4m3fn, torch.float8_e5m2) as storage types: casts to them round
as torch does (e4m3 saturating at 448, e5m2 overflowing to infinity), reads widen exactly, and
every computation is f32's. Fake quantization, fp8 weights under a tensor-core product, fp8
inputs and outputs, through the Tensor IR interpreter, the emitted CUDA on the emulator and the
checking harness, against eager."""

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from emmy.bench.harness import check_program, is_discrete
from emmy.dtypes import DType, from_torch, rounded
from emmy.frontend.workload import Workload
from emmy.pipeline import compile_to
from emmy.tensor_ir.interp import run
from emmy.tensor_ir.lower import lower
from emmy.torch_ir.capture import capture
from tests.tensor_ir.emitted import assert_sampled_rows_match_eager, \
    assert_workload_cuda_matches_eager

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


class FakeQuant(nn.Module):
    """Per-tensor scaled e4m3 fake quantization (Transformer Engine's recipe), the quantized
    tensor itself, and an unscaled e5m2 cast whose large values overflow to infinity."""

    def forward(self, x):
        scale = 448.0 / x.abs().amax().clamp(min=1e-12)
        q = (x * scale).clamp(-448, 448).to(E4M3)
        return q.to(torch.float32) / scale, q, (x * 3e4).to(E5M2), (x * 1e3).to(E4M3)


class BlockQuant(nn.Module):
    """fp8 activations in, dequantized by a per-row scale, SiLU, then quantized again in blocks
    of 32 with a scale per block (DeepSeek-V3's 1 x 128 activation tiles, smaller)."""

    def forward(self, x8, s):
        y = F.silu(x8.float() * s)
        blocks = y.view(y.shape[0], -1, 32)
        scale = blocks.abs().amax(-1, keepdim=True).clamp(min=1e-4) / 448.0
        return (blocks / scale).to(E4M3).view_as(y), scale.squeeze(-1)


class Fp8Linear(nn.Module):
    """e4m3 weights with a scale per output channel, dequantized to bf16 under the product."""

    def __init__(self, k: int, n: int, weights: torch.dtype = E4M3):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        w = torch.randn(n, k, generator=g) * 0.05
        scale = w.abs().amax(dim=1, keepdim=True) / 448.0
        self.register_buffer("w8", (w / scale).to(weights))
        self.register_buffer("scale", scale.to(torch.bfloat16))

    def forward(self, x):
        return F.linear(x, self.w8.to(torch.bfloat16) * self.scale)


def _fake_quant_inputs():
    x = torch.randn(48, 40, generator=torch.Generator().manual_seed(3))
    x[0, :6] = torch.tensor([float("inf"), -float("inf"), 20.0, -20.0, 1e-9, 0.0])
    return (x,)


def test_the_types_are_named_once():
    assert from_torch(E4M3) is DType.F8E4M3 and from_torch(E5M2) is DType.F8E5M2
    assert DType.F8E4M3.itemsize == 1 and DType.F8E4M3.compute is DType.F32
    assert DType.F8E5M2.is_narrow_float and not DType.F32.is_narrow_float
    assert DType.F8E4M3.c_name == "__nv_fp8_e4m3"


def test_rounding_on_the_numpy_side_is_torchs():
    x = torch.tensor([0.0, 1.0, 1.06, 464.0, 465.0, 1e6, -1e6, 2.0 ** -10, 57344.0, 61440.0,
                      float("inf"), float("nan")])
    for dtype, torch_type in ((DType.F8E4M3, E4M3), (DType.F8E5M2, E5M2)):
        np.testing.assert_array_equal(rounded(x.numpy(), dtype), x.to(torch_type).float().numpy())


def test_fake_quantization_interprets_as_eager_bit_for_bit():
    model, inputs = FakeQuant(), _fake_quant_inputs()
    out = run(lower(capture(model, inputs)), {"x": inputs[0].numpy()})
    want = model(*inputs)
    for got, w in zip(out, want):
        np.testing.assert_array_equal(np.asarray(got), w.float().numpy())


def test_fake_quantization_emits_cuda_that_matches_eager():
    stages = assert_workload_cuda_matches_eager(
        Workload("fake_quant", FakeQuant(), _fake_quant_inputs(), "", "<test>"))
    source = "".join(u.source for u in stages["cuda"].units)
    assert "__nv_fp8_e4m3" in source and "__nv_fp8_e5m2" in source


def test_quantized_outputs_are_the_same_bytes_as_eager():
    from emmy.check import check_cuda_program

    w = Workload("fake_quant", FakeQuant(), _fake_quant_inputs(), "", "<test>")
    stages = compile_to(w, "cuda")
    report, failed = check_cuda_program(w, stages["torch"], stages["cuda"])
    assert report is not None, failed.log[-2000:]
    narrow = [o for o in report.outputs if o.dtype in (DType.F8E4M3, DType.F8E5M2)]
    assert len(narrow) == 3 and all(o.max_abs == 0 for o in narrow), report.outputs


def test_fp8_inputs_and_block_scales_pass_the_harness_on_fresh_inputs():
    x8 = torch.randn(8, 128, generator=torch.Generator().manual_seed(1)).to(E4M3)
    w = Workload("block_quant", BlockQuant(), (x8, torch.rand(8, 1) + 0.5), "", "<test>")
    stages = compile_to(w, "cuda")
    check = check_program(w, stages["torch"], stages["cuda"], device="cpu", seeds=(0, 1))
    assert check.verdict == "ok", check.reasons
    assert {c.seed for c in check.cases} == {0, 1}
    # an fp8 input starts no computation at its precision (each use widens it exactly): the
    # f32 scales are held to f32's tolerance, not e4m3's
    from emmy.check import check_cuda_program

    report, _ = check_cuda_program(w, stages["torch"], stages["cuda"])
    assert report.ok and report.outputs[1].rtol == 1e-4, report.outputs


@pytest.mark.parametrize("weights", [E4M3, E5M2])
def test_fp8_weights_dequantize_under_a_tensor_core_product(weights):
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    stages = assert_workload_cuda_matches_eager(
        Workload("fp8_linear", Fp8Linear(64, 32, weights), (x,), "", "<test>"))
    assert any("mma_m16n8k16_bf16f32" in u.source for u in stages["cuda"].units)


def test_sampled_rows_of_an_fp8_softmax_match_eager():
    assert_sampled_rows_match_eager(
        "F.softmax(torch.randn(8, 256).to(torch.float8_e4m3fn).float() * 0.5, dim=-1)"
        ".to(torch.float8_e5m2)", per_kernel=3, seed=0)


def test_whole_fp8_values_are_discrete_for_fresh_draws():
    assert is_discrete(torch.tensor([1.0, -2.0, 0.0]).to(E4M3))
    assert not is_discrete(torch.tensor([1.5, 0.25]).to(E5M2))


class ScaledMM(nn.Module):
    """torchao's float8 inference: the activation quantized per row with a dynamic scale,
    e4m3 weights scaled per output channel, torch._scaled_mm with a bias, bf16 out; and a
    per-tensor product to an fp8 output."""

    def __init__(self, k: int = 64, n: int = 48):
        super().__init__()
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(4)) * 0.05
        w_scale = w.abs().amax(dim=1, keepdim=True) / 448.0
        self.register_buffer("w8", (w / w_scale).to(E4M3))
        self.register_buffer("w_scale", w_scale.t().contiguous())
        self.bias = nn.Parameter(torch.randn(n).to(torch.bfloat16))

    def forward(self, x):
        x_scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / 448.0
        x8 = (x.float() / x_scale).clamp(-448, 448).to(E4M3)
        rowwise = torch._scaled_mm(x8, self.w8.t(), scale_a=x_scale, scale_b=self.w_scale,
                                   bias=self.bias, out_dtype=torch.bfloat16)
        # in range: past 448, torch's CPU product gives NaN where its casts saturate, as emmy
        # does (and __nv_cvt_float_to_fp8 with __NV_SATFINITE)
        one = torch.tensor(0.01)
        return rowwise, torch._scaled_mm(x8, self.w8.t(), scale_a=one, scale_b=one)


def test_scaled_mm_runs_on_bf16_tensor_cores_with_its_scales_in_the_epilogue():
    """The dynamic per-row scale is stored (a vector the product's epilogue loads, not a
    reduction inside the product's kernel), so the product is an mma.sync template over the
    fp8 operands widened to bf16 (exact)."""
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    stages = assert_workload_cuda_matches_eager(Workload("scaled_mm", ScaledMM(), (x,), "",
                                                         "<test>"))
    units = stages["cuda"].units       # the scale, x quantized, both products (one CSE'd)
    assert len(units) == 3 and "mma_m16n8k16_bf16f32" in units[-1].source
    assert any("a product's epilogue" in n for n in stages["loop"].notes)


def test_an_older_torchs_nan_past_448_is_emitted_where_that_torch_is_installed(monkeypatch):
    """Before torch saturated e4m3 (pytorch/pytorch#178817), a value rounding past 448 (from
    464 up) and an infinity became NaN. Where the installed torch does that, the kernels are
    emitted to (EmE4m3Nan<0> specialized): on the emulator and through NVRTC."""
    import emmy.cuda.emit as emit
    from emmy.cuda.nvrtc import compile_cuda
    from emmy.runtime.cpu import run_program
    from emmy.schedule.targets import get_target
    from emmy.frontend.workload import load_expr

    x = torch.tensor([1.0, 447.0, 460.0, 464.0, 464.5, 470.0, -500.0, 1e6, float("inf"),
                      -float("inf"), float("nan"), 2.0 ** -12]).repeat(4)
    workload = load_expr("(lambda x: (x * 1.0).to(torch.float8_e4m3fn))(torch.randn(48))")
    monkeypatch.setattr(emit, "e4m3_overflow_is_nan", lambda: True)
    prog = compile_to(workload, "cuda")["cuda"]
    (unit,) = prog.units
    assert "struct EmE4m3Nan<0> { static constexpr bool value = true; }" in unit.source
    got = run_program(prog, {"x": x})
    assert got.ok, got
    saturated = x.to(E4M3).float()
    expected = torch.where(x.abs() > 464, float("nan"), saturated)
    np.testing.assert_array_equal(np.asarray(got.outputs[0], np.float32), expected.numpy())
    assert compile_cuda(unit.source, get_target("sm_90a")).ok
    monkeypatch.setattr(emit, "e4m3_overflow_is_nan", lambda: False)
    assert "EmE4m3Nan" not in compile_to(workload, "cuda")["cuda"].units[0].source

