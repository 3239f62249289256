"""Gathered operands in window form (emmy.tile_ir.window): each convolution's input operand is
rebuilt from its Window alone, as the implicit GEMM's matrix, and the product with the
weights must be the convolution torch computes."""

import numpy as np
import pytest
import torch

from emmy.dtypes import DType
from emmy.frontend.workload import load_expr
from emmy.loop_ir.ir import Compute, IndexValue, Load
from emmy.pipeline import compile_to
from emmy.symbolic import Mod, evaluate, mod, var
from emmy.tensor_ir.ir import EwOp, Scalar
from emmy.tile_ir.ir import KernelKind
from emmy.tile_ir.printer import print_kernel
from emmy.tile_ir.window import window


def contraction(expr: str):
    (k,) = [k for k in compile_to(load_expr(expr), "tile")["tile"].program.kernels
            if k.kind is KernelKind.CONTRACT]
    return k, k.contract


def matrix(k, con, x: np.ndarray) -> np.ndarray:
    """B[bz, k, n] from the window alone: the ranges decide zero or the input element at
    outer + k offset."""
    op = con.b
    w = op.window
    parts = op.parts or (con.n,)
    env = {}
    n = np.arange(con.n.extent)
    rest = con.n.extent
    for ax in parts:
        rest //= ax.extent
        env[ax.var] = n // rest % ax.extent
    kk = np.arange(con.k.extent)[:, None]
    out = []
    flat = x.reshape(-1)
    for bz in range(max(con.batch_size, 1)):
        benv, rest = dict(env), max(con.batch_size, 1)
        for ax in con.batch:
            rest //= ax.extent
            benv[ax.var] = bz // rest % ax.extent
        benv[con.k.var] = kk
        ok = np.ones((con.k.extent, con.n.extent), dtype=bool)
        for r in w.ranges:
            e = evaluate(r.outer, benv) + evaluate(r.k, benv)
            if r.lo is not None:
                ok &= e >= r.lo
            if r.hi is not None:
                ok &= e < r.hi
        at = evaluate(w.outer, benv) + evaluate(w.k, benv)
        at = np.broadcast_to(at, ok.shape)
        out.append(np.where(ok, flat[np.where(ok, at, 0)], 0.0))
    return np.stack(out)


@pytest.mark.parametrize("module, shape, n_ranges", [
    ("nn.Conv2d(3, 16, 3, padding=1, bias=False)", (2, 3, 7, 9), 2),
    ("nn.Conv2d(8, 16, 3, stride=2, padding=1, dilation=2, bias=False)", (2, 8, 11, 10), 2),
    ("nn.Conv1d(4, 16, 5, padding=2, bias=False)", (2, 4, 20), 1),
    ("nn.Conv3d(4, 16, 3, padding=1, bias=False)", (2, 4, 5, 5, 5), 3),
    ("nn.Conv2d(16, 32, 3, groups=2, padding=1, bias=False)", (2, 16, 6, 6), 2),
    ("nn.Conv2d(8, 16, 3, bias=False)", (2, 8, 6, 6), 0),          # no padding: no test
    ("nn.Conv2d(8, 16, (1, 3), padding=(0, 1), bias=False)", (2, 8, 4, 6), 1),
])
def test_a_convolutions_window_rebuilds_its_implicit_gemm(module, shape, n_ranges):
    torch.manual_seed(0)
    conv = eval(module, {"nn": torch.nn})
    x = torch.randn(*shape)
    k, con = contraction(f"{module}(torch.randn{shape})")
    w = con.b.window
    assert w is not None and len(w.ranges) == n_ranges
    assert "through a window" in print_kernel(k)
    b = matrix(k, con, x.numpy().astype(np.float64))
    weight = conv.weight.detach().double()
    groups = conv.groups
    out = conv.double()(x.double()).detach()
    oc = weight.shape[0] // groups
    for g in range(groups):
        wg = weight[g * oc:(g + 1) * oc].reshape(oc, -1).numpy()
        got = wg @ b[g if con.batch else 0]        # (oc, B*spatial)
        want = out[:, g * oc:(g + 1) * oc].transpose(0, 1).reshape(oc, -1).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("module, shape", [
    ("nn.Conv2d(8, 16, 3, padding=1, padding_mode='circular')", (2, 8, 6, 6)),
    ("nn.ConvTranspose2d(8, 16, 3, stride=2, padding=1)", (2, 8, 5, 6)),
])
def test_gathers_that_are_no_window_keep_their_statements(module, shape):
    """A circular pad reads (i + k) mod H for every position, and a transposed convolution's
    input position is a division by the stride: neither splits into an outer and a k side."""
    _, con = contraction(f"{module}(torch.randn{shape})")
    gathered = [op for op in (con.a, con.b) if op.gathered and op.buffer == "input"]
    assert gathered and all(op.window is None for op in gathered)


I64, BOOL = DType.I64, DType.BOOL


def _items(mask_hi: int | None):
    """where(0 <= o + k - 1 < mask_hi, load x[(o + k + 5) % 6], 0) over o in 0..6, k in 0..3."""
    items = [IndexValue("v0", var("o") + var("k"), I64),
             Compute("v1", EwOp.SUB, ("v0", Scalar(1, I64)), I64),
             Compute("v2", EwOp.GE, ("v1", Scalar(0, I64)), BOOL)]
    mask = "v2"
    if mask_hi is not None:
        items += [Compute("v3", EwOp.LT, ("v1", Scalar(mask_hi, I64)), BOOL),
                  Compute("v4", EwOp.AND, ("v2", "v3"), BOOL)]
        mask = "v4"
    wrapped = mod(var("o") + var("k") + 5, 6, {"o": 6, "k": 3})
    assert isinstance(wrapped.terms[0][0], Mod)
    items += [Load("x0", "x", (wrapped,), DType.F32),
              Compute("x1", EwOp.WHERE, (mask, "x0", Scalar(0.0, DType.F32)), DType.F32)]
    return items


def test_a_wrapped_index_unwraps_only_where_the_mask_bounds_it():
    bounds = {"o": 6, "k": 3}
    w = window(_items(6), "x1", {"x": (6,)}, "k", {"o"}, bounds)
    # 0 <= o + k - 1 < 6 puts o + k + 5 in [6, 12): the offset is o + k - 1
    assert (w.outer, w.k) == (var("o") - 1, var("k"))
    # without the upper bound the wrap can be either period: no window
    assert window(_items(None), "x1", {"x": (6,)}, "k", {"o"}, bounds) is None
