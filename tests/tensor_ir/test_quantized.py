"""Quantization ops as PT2E and torch.ao leave them in a model: `quantized_decomposed`'s quantize
and dequantize (per tensor with numbers or tensors as parameters, per channel, per token,
dynamic parameters from choose_qparams) and the learnable (LSQ) fake quantization, through the
Tensor IR interpreter and the emitted CUDA on the emulator, against eager, exactly."""

import numpy as np
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)
import torch.nn as nn

from emmy.frontend.workload import Workload
from emmy.tensor_ir.interp import run
from emmy.tensor_ir.lower import lower
from emmy.torch_ir.capture import capture
from tests.tensor_ir.emitted import assert_workload_cuda_matches_eager

qd = torch.ops.quantized_decomposed


class PT2E(nn.Module):
    """convert_pt2e's Q/DQ pairs around a linear layer: the activation per tensor (static
    numbers, and a dynamic scale and zero point as tensors), the weight per output channel."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        w = torch.randn(16, 32, generator=g)
        self.register_buffer("w_scale", w.abs().amax(1) / 127)
        self.register_buffer("w_zero", torch.zeros(16, dtype=torch.int64))
        self.register_buffer("w_q", torch.round(w / self.w_scale[:, None]).to(torch.int8))

    def forward(self, x):
        q = qd.quantize_per_tensor(x, 0.05, 3, -128, 127, torch.int8)
        a = qd.dequantize_per_tensor(q, 0.05, 3, -128, 127, torch.int8)
        scale, zero = qd.choose_qparams.tensor(x, -128, 127, 1e-5, torch.int8)
        dq = qd.dequantize_per_tensor.tensor(
            qd.quantize_per_tensor.tensor(x, scale, zero, -128, 127, torch.int8),
            scale, zero, -128, 127, torch.int8)
        w = qd.dequantize_per_channel(self.w_q, self.w_scale, self.w_zero, 0, -128, 127,
                                      torch.int8)
        wq = qd.quantize_per_channel(w, self.w_scale, self.w_zero, 0, -128, 127, torch.int8)
        return q, a @ w.t(), dq, wq, scale, zero


class Learnable(nn.Module):
    """torch.ao's _LearnableFakeQuantize: a learned scale, and a float zero point rounded half
    to even (2.5 -> 2) and clamped, per tensor and per channel."""

    def __init__(self):
        super().__init__()
        self.s = nn.Parameter(torch.tensor([0.07]))
        self.z = nn.Parameter(torch.tensor([2.5]))
        self.sc = nn.Parameter(torch.linspace(0.02, 0.1, 16))
        self.zc = nn.Parameter(torch.linspace(-9.5, 9.5, 16))

    def forward(self, x):
        return (torch._fake_quantize_learnable_per_tensor_affine(x, self.s, self.z, 0, 255, 1.0),
                torch._fake_quantize_learnable_per_tensor_affine(x, self.s, self.z * 100, -128,
                                                                 127, 0.5),
                torch._fake_quantize_learnable_per_channel_affine(x, self.sc, self.zc, 1, -8, 7,
                                                                  1.0))


def _equal_in_the_interpreter(model, x):
    """Quantized values and parameters exactly; a product's sums to f32's rounding (one level
    of a quantized value apart would be 1e-2 here)."""
    got = run(lower(capture(model, (x,))), {"x": x})
    for out, want in zip(got, model(x)):
        want = want.detach().numpy()
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6, atol=1e-5)
        if want.dtype.kind in "iu":
            np.testing.assert_array_equal(np.asarray(out), want)


def test_pt2e_quantize_and_dequantize_interpret_as_eager():
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(1)) * 3
    _equal_in_the_interpreter(PT2E().eval(), x)


def test_pt2e_quantize_and_dequantize_emit_cuda_that_matches_eager():
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(2)) * 3
    assert_workload_cuda_matches_eager(Workload("pt2e", PT2E().eval(), (x,), "", "<test>"))


def test_learnable_fake_quantization_interprets_and_emits_as_eager():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(3)) * 3
    _equal_in_the_interpreter(Learnable().eval(), x)
    assert_workload_cuda_matches_eager(Workload("lsq", Learnable().eval(), (x,), "", "<test>"))
