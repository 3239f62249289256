"""Programs to lower (from torch, or built by hand) and the check that Loop IR agrees with
the Tensor IR reference; plus small constructors for writing kernels by hand."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from emmy import symbolic
from emmy.dtypes import DType, to_torch, tolerance
from emmy.loop_ir import interp
from emmy.loop_ir.ir import (Buffer, Compute, EwOp, Kernel, Load, Loop, LoopKind, LoopProgram,
                             Store)
from emmy.loop_ir.lower import lower
from emmy.loop_ir.verify import verify
from emmy.tensor_ir import interp as tensor_interp
from emmy.tensor_ir.ir import Program, TensorType
from emmy.tensor_ir.lower import lower as lower_graph
from emmy.torch_ir.capture import capture

F32 = DType.F32


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def from_torch(model, *inputs, name: str = "t") -> tuple[Program, dict]:
    """The Tensor IR of `model(*inputs)` and the feeds (inputs and parameters) by name."""
    model = model if isinstance(model, nn.Module) else Fn(model)
    graph = capture(model.eval(), inputs, name=name)
    program = lower_graph(graph)
    feeds = {p.name: v for p, v in zip(graph.inputs, inputs)} | dict(program.values)
    return program, feeds


def check(program: Program, feeds: dict, **options) -> LoopProgram:
    """Lower, verify every kernel, and compare the interpreter with the Tensor IR reference."""
    lp = lower(program, **options)
    for k in lp.kernels:
        verify(k)
    got = interp.run(lp, feeds)
    want = tensor_interp.run(program, feeds)
    assert len(got) == len(want)
    for b, g, w in zip(lp.outputs, got, want):
        assert_close(g, w, b.type.dtype, b.name)
    return lp


def check_torch(model, *inputs, **options) -> LoopProgram:
    return check(*from_torch(model, *inputs), **options)


def assert_close(got: np.ndarray, want: np.ndarray, dtype: DType, what: str = "output") -> None:
    atol, rtol = tolerance(dtype)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if got.dtype == np.bool_ or want.dtype == np.bool_:
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), atol=atol,
                               rtol=rtol, err_msg=what)


def random_feeds(program: Program, seed: int = 0) -> dict:
    """Random inputs for every input of a hand-built program (as torch tensors)."""
    gen = torch.Generator().manual_seed(seed)
    feeds = {}
    for d in program.inputs:
        t = torch.randn(d.type.shape, generator=gen, dtype=torch.float64)
        feeds[d.name] = t.to(to_torch(d.type.dtype)) if d.type.dtype.is_float else \
            (t * 4).to(to_torch(d.type.dtype))
    return feeds


# ---- writing kernels by hand ----------------------------------------------------------------

def v(name: str) -> symbolic.Lin:
    return symbolic.var(name)


def buf(name: str, *shape: int, dtype: DType = F32) -> Buffer:
    return Buffer(name, TensorType(tuple(shape), dtype))


def load(dst: str, buffer: str, *index, dtype: DType = F32) -> Load:
    return Load(dst, buffer, tuple(symbolic.lin(i) for i in index), dtype)


def op(dst: str, name: EwOp, *args, dtype: DType = F32) -> Compute:
    return Compute(dst, name, tuple(args), dtype)


def store(buffer: str, value: str, *index) -> Store:
    return Store(buffer, tuple(symbolic.lin(i) for i in index), value)


def loop(var: str, extent: int, *body, kind: LoopKind = LoopKind.PARALLEL,
         reverse: bool = False) -> Loop:
    return Loop(var, extent, kind, tuple(body), reverse)


def reduce(var: str, extent: int, *body) -> Loop:
    return Loop(var, extent, LoopKind.REDUCE, tuple(body))


def kernel(inputs, outputs, *body, name: str = "k") -> Kernel:
    return Kernel(name=name, inputs=tuple(inputs), outputs=tuple(outputs), body=tuple(body))


def run_kernel(k: Kernel, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run one kernel as a program of its own."""
    lp = LoopProgram(name="p", inputs=k.inputs, intermediates=(), outputs=k.outputs,
                     kernels=(k,))
    return interp.run(lp, feeds)

