"""The printed form: a golden RMSNorm, and the shape of each kind of line."""

import torch
import torch.nn as nn

from emmy.loop_ir.identity import kernel_id
from emmy.loop_ir.printer import print_kernel, print_program

from .programs import check_torch

RMSNORM = """\
program rmsnorm(weight: f32[8], x: f32[2,8]) -> (out0: f32[2,8])

kernel k0_rmsnorm(x: f32[2,8], weight: f32[8]) -> (out0: f32[2,8])  # id {id}
  for a0 in 0..2
    acc0 = init(add) : f32
    reduce a1 in 0..8
      in0 = load x[a0, a1]
      v0 = multiply(in0, in0)
      acc0 <- add(acc0, v0)
    v1 = divide(acc0, 8.0)
    v2 = add(v1, 1e-06)
    v3 = rsqrt(v2)
    for a2 in 0..8
      in1 = load weight[a2]
      in2 = load x[a0, a2]
      v4 = multiply(in2, v3)
      v5 = multiply(in1, v4)
      out0[a0, a2] = v5
"""


def test_rmsnorm_prints_as_one_kernel():
    from .programs import from_torch
    from emmy.loop_ir.lower import lower

    program, _ = from_torch(nn.RMSNorm(8, eps=1e-6), torch.randn(2, 8), name="rmsnorm")
    lp = lower(program)
    assert print_program(lp) == RMSNORM.format(id=kernel_id(lp.kernels[0]))


def test_scans_argmax_casts_and_notes_print_readably():
    lp = check_torch(lambda x: (torch.flip(torch.cumsum(torch.flip(x, [1]), 1), [1]).sum(1),
                                torch.argmax(x.half(), 1)), torch.randn(3, 5))
    text = print_program(lp)
    assert "scan a1 in 0..5 (reverse)" in text
    assert "acc0 <- argmax(acc0, v0 @ a1)" in text
    assert ": f16" in text
    assert "# note: scan `" in text
    assert text.count("\nkernel ") == len(lp.kernels)
    for k in lp.kernels:
        assert print_kernel(k).startswith(f"kernel {k.name}(")
