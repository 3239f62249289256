"""Kernel identity: equal for equivalent kernels, different otherwise, stable across runs."""

import os
import subprocess
import sys
import textwrap

import torch
import torch.nn.functional as F

from emmy.loop_ir.identity import identity_text, kernel_id
from emmy.tensor_ir.ir import EwOp

from .programs import buf, check_torch, kernel, load, loop, op, store, v


def only_kernel_id(model, *inputs):
    (k,) = check_torch(model, *inputs).kernels
    return kernel_id(k)


def test_equivalent_programs_get_the_same_identity():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    assert only_kernel_id(lambda x, y: x + x + y, x, y) == only_kernel_id(lambda x, y: y + (x + x), x, y)
    # the same kernel with its arguments swapped: identity names buffers by position
    assert only_kernel_id(lambda x, y: x - y, x, y) == only_kernel_id(lambda x, y: y - x, x, y)
    w = torch.randn(6, 8)
    assert only_kernel_id(lambda x, w: F.linear(x, w), x, w) == only_kernel_id(lambda x, w: x @ w.T, x, w)


def test_different_programs_get_different_identities():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    ids = {
        only_kernel_id(lambda x, y: x + y, x, y),
        only_kernel_id(lambda x, y: x * y, x, y),
        only_kernel_id(lambda x, y: x - y, x, y),
        only_kernel_id(lambda x, y: x - y * 2, x, y),
        only_kernel_id(lambda x, y: x + y, torch.randn(4, 9), torch.randn(4, 9)),
        only_kernel_id(lambda x, y: x + y, x.double(), y.double()),
        only_kernel_id(lambda x: torch.softmax(x, -1), x),
        only_kernel_id(lambda x: torch.softmax(x, 0), x),
    }
    assert len(ids) == 8


def test_names_of_the_kernel_and_its_buffers_do_not_matter():
    def k(name, inp, out, var):
        return kernel([buf(inp, 4)], [buf(out, 4)], loop(
            var, 4, load("a", inp, v(var)), op("b", EwOp.EXP, "a"), store(out, "b", v(var))),
            name=name)

    assert kernel_id(k("k0_exp", "x", "y", "i")) == kernel_id(k("k7_other", "p", "q", "j"))
    assert "in0" in identity_text(k("k", "x", "y", "i"))


SAMPLE = textwrap.dedent("""
    from emmy.dtypes import DType
    from emmy.loop_ir.identity import kernel_id
    from emmy.loop_ir.lower import lower
    from emmy.loop_ir.printer import print_program
    from emmy.tensor_ir.builder import Builder
    from emmy.tensor_ir.ir import EwOp, ReduceOp, TensorType

    def sample():
        b = Builder("sample")
        x = b.input("x", TensorType((3, 5), DType.F32))
        y = b.input("y", TensorType((5,), DType.F32))
        e = b.ew(EwOp.EXP, b.ew(EwOp.SUB, x, b.reduce(ReduceOp.MAX, x, [1], keepdim=True)))
        soft = b.ew(EwOp.MUL, b.ew(EwOp.DIV, e, b.reduce(ReduceOp.SUM, e, [1], keepdim=True)), y)
        total = b.reduce(ReduceOp.SUM, b.scan(ReduceOp.SUM, b.ew(EwOp.ADD, x, y), 1), [1])
        return lower(b.finish([soft, total]))
    """)


def test_lowering_and_identity_are_the_same_in_another_process():
    namespace = {}
    exec(SAMPLE, namespace)
    here = namespace["sample"]()
    code = SAMPLE + "lp = sample()\nprint(print_program(lp), end='')\n"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=os.getcwd(), check=True)
    assert out.stdout == namespace["print_program"](here)
    assert len(here.kernels) == 3
