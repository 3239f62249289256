"""The printer's text and the numpy interpreter's semantics."""

import numpy as np
import torch
import torch.nn as nn

from emmy.dtypes import DType
from emmy.symbolic import var
from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.interp import run
from emmy.tensor_ir.ir import EwOp, ReduceOp, TensorType
from emmy.tensor_ir.lower import lower
from emmy.tensor_ir.printer import print_program
from emmy.torch_ir.capture import capture

RMSNORM = """\
program rmsnorm
  weight = load("weight") : f32[2048]
  x = input("x") : f32[32,2048]
  v0 = multiply(x, x) : f32[32,2048]
  v1 = reduce_sum(v0, axes=[1]) : f32[32]
  v2 = index_map(v1, [a0]) : f32[32,1]
  v3 = divide(v2, 2048.0) : f32[32,1]
  v4 = add(v3, 1.1920928955078125e-07) : f32[32,1]
  v5 = rsqrt(v4) : f32[32,1]
  v6 = index_map(v5, [a0, 0]) : f32[32,2048]
  v7 = multiply(x, v6) : f32[32,2048]
  v8 = index_map(weight, [a1]) : f32[32,2048]
  v9 = multiply(v7, v8) : f32[32,2048]
  return v9
"""


class _RMS(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(2048)

    def forward(self, x):
        return self.norm(x)


def test_rmsnorm_prints_as_its_arithmetic_steps():
    program = lower(capture(nn.RMSNorm(2048), (torch.randn(32, 2048),), name="rmsnorm"))
    assert print_program(program) == RMSNORM


def test_printout_is_deterministic():
    a = print_program(lower(capture(nn.Linear(3, 2), (torch.randn(4, 3),))))
    b = print_program(lower(capture(nn.Linear(3, 2), (torch.randn(4, 3),))))
    assert a == b


def test_scan_iota_cast_and_literals_print():
    b = Builder("p")
    x = b.input("x", TensorType((2, 3), DType.F16))
    s = b.scan(ReduceOp.SUM, b.cast(x, DType.F32), 1, reverse=True, exclusive=True)
    m = b.ew(EwOp.WHERE, b.ew(EwOp.LT, b.iota((2, 3), 1), 2), s, float("-inf"))
    text = print_program(b.finish([m]))
    assert "v0 = cast(x) : f32[2,3]" in text
    assert "v1 = scan_sum(v0, axis=1, reverse, exclusive) : f32[2,3]" in text
    assert "v2 = iota(axis=1) : i64[2,3]" in text
    assert "v4 = where(v3, v1, -inf) : f32[2,3]" in text


def test_interp_index_map_reads_the_right_elements():
    b = Builder("p")
    x = b.input("x", TensorType((3, 4), DType.F32))
    y = b.index_map(x, (2, 3), [var("a1"), var("a0") * 2 + 1])
    (out,) = run(b.finish([y]), {"x": np.arange(12, dtype=np.float32).reshape(3, 4)})
    assert out.tolist() == [[1, 5, 9], [3, 7, 11]]


def test_interp_exclusive_and_reverse_scans():
    b = Builder("p")
    x = b.input("x", TensorType((4,), DType.F32))
    outs = [b.scan(ReduceOp.SUM, x, 0, exclusive=True), b.scan(ReduceOp.SUM, x, 0, reverse=True),
            b.scan(ReduceOp.PROD, x, 0, reverse=True, exclusive=True)]
    got = run(b.finish(outs), {"x": np.array([1, 2, 3, 4], np.float32)})
    assert [g.tolist() for g in got] == [[0, 1, 3, 6], [10, 9, 7, 4], [24, 12, 4, 1]]


def test_interp_argmax_over_several_axes_is_the_row_major_position():
    b = Builder("p")
    x = b.input("x", TensorType((2, 2, 3), DType.F32))
    r = b.reduce(ReduceOp.ARGMAX, x, [1, 2])
    data = np.zeros((2, 2, 3), np.float32)
    data[0, 1, 2] = data[1, 0, 1] = 1
    (out,) = run(b.finish([r]), {"x": data})
    assert out.tolist() == [5, 1]


def test_interp_rounds_bf16_results():
    b = Builder("p")
    x = b.input("x", TensorType((1,), DType.BF16))
    y = b.ew(EwOp.ADD, x, 1.0 / 3)
    (out,) = run(b.finish([y]), {"x": torch.zeros(1, dtype=torch.bfloat16)})
    assert out[0] == torch.tensor(1.0 / 3).to(torch.bfloat16).float().item()


def test_params_come_from_program_values():
    model = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    program = lower(capture(model, (x,)))
    assert set(program.values) == {"weight", "bias"}
    (out,) = run(program, {"input": x})
    assert np.allclose(out, model(x).detach().numpy(), atol=1e-5)
