"""`check`: capture a module (or function), lower it, run the Tensor IR, compare with eager."""

import numpy as np
import pytest
import torch
import torch.nn as nn

from emmy.dtypes import as_stored, from_torch, tolerance
from emmy.tensor_ir.interp import run
from emmy.tensor_ir.lower import lower
from emmy.tensor_ir.semantics import as_numpy
from emmy.torch_ir.capture import capture


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def outputs_of(value) -> list[torch.Tensor]:
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in outputs_of(v)]
    return [value]


def assert_matches(got: np.ndarray, want: torch.Tensor, what: str = "output") -> None:
    want = as_stored(want.detach())      # a complex output as (re, im) pairs, as emmy's
    atol, rtol = tolerance(from_torch(want.dtype))
    expected = as_numpy(want)            # bf16 and 8-bit floats as f32
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    with np.errstate(invalid="ignore"):         # a signaling NaN (bits read as a float)
        np.testing.assert_allclose(got.astype(np.float64) if got.dtype != np.bool_ else got,
                                   expected.astype(np.float64) if expected.dtype != np.bool_
                                   else expected, atol=atol, rtol=rtol, err_msg=what)


def check_module(model, *inputs, name: str = "t"):
    """Lower `model(*inputs)` and assert every output matches eager; returns the Program."""
    model = model if isinstance(model, nn.Module) else Fn(model)
    model.eval()
    graph = capture(model, inputs, name=name)
    program = lower(graph)
    got = run(program, {p.name: v for p, v in zip(graph.inputs, inputs)})
    with torch.no_grad():
        want = outputs_of(model(*inputs))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_matches(g, w, f"output {i}")
    return program


@pytest.fixture
def check():
    torch.manual_seed(0)
    return check_module
