"""Matrix products and attention: one product + sum form, checked against eager PyTorch."""

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from emmy.frontend.workload import Workload
from emmy.kernel_ir.printer import print_program as print_kernel
from emmy.tensor_ir.ir import Elementwise, IndexMap, Reduce
from emmy.tensor_ir.lower import lower
from emmy.tensor_ir.printer import print_program
from emmy.torch_ir.capture import capture
from tests.tensor_ir.emitted import assert_workload_cuda_matches_eager

r = torch.randn

PRODUCTS = {
    "mm": (torch.mm, (r(5, 3), r(3, 4))),
    "bmm": (torch.bmm, (r(2, 5, 3), r(2, 3, 4))),
    "matmul_broadcast": (torch.matmul, (r(2, 1, 5, 3), r(4, 3, 6))),
    "matmul_3d_2d": (torch.matmul, (r(2, 5, 3), r(3, 4))),
    "matvec": (torch.matmul, (r(5, 3), r(3))),
    "vecmat": (torch.matmul, (r(3), r(3, 4))),
    "dot": (torch.matmul, (r(7), r(7))),
    "mv": (torch.mv, (r(5, 3), r(3))),
    "transposed_a": (lambda a, b: a.T @ b, (r(3, 5), r(3, 4))),
    "transposed_both": (lambda a, b: a.t() @ b.t(), (r(3, 5), r(4, 3))),
    "matrix_scalar": (lambda a, s: a * s, (r(5, 3), r(()))),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0), (r(4), r(5, 3), r(3, 4))),
    "baddbmm": (torch.baddbmm, (r(2, 5, 4), r(2, 5, 3), r(2, 3, 4))),
    "einsum": (lambda a, b: torch.einsum("bij,bjk->bik", a, b), (r(2, 5, 3), r(2, 3, 4))),
    "einsum_trace": (lambda a: torch.einsum("ii", a), (r(4, 4),)),
    # an ellipsis (torchvision's hsv2rgb: "...ijk,...xijk->...xjk"), broadcast across the
    # operands, and in the implicit output
    "einsum_ellipsis": (lambda a, b: (torch.einsum("...ij,...jk->...ik", a, b),
                                      torch.einsum("...ij,...jk", a[0], b),
                                      torch.einsum("...i,...i->...", a, a)),
                        (r(3, 1, 2, 4), r(5, 4, 6))),
    "chained": (lambda a, b, c: (a @ b) @ c, (r(4, 5), r(5, 6), r(6, 3))),
}


@pytest.mark.parametrize("name", PRODUCTS)
def test_product(check, name):
    fn, inputs = PRODUCTS[name]
    check(fn, *inputs)


def test_linear_with_bias_and_relu(check):
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU())
    check(model, r(3, 4, 8))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_matmul_accumulates_in_f32(check, dtype):
    program = check(torch.mm, r(8, 64).to(dtype), r(64, 5).to(dtype))
    (reduce,) = [d for d in program.defs if isinstance(d, Reduce)]
    assert str(reduce.type.dtype) == "f32"


def test_matmul_is_index_maps_product_and_sum_over_the_last_axis():
    program = lower(capture(_Fn(torch.mm), (r(5, 3), r(3, 4))))
    kinds = [type(d).__name__ for d in program.defs]
    assert kinds == ["Input", "Input", "IndexMap", "IndexMap", "Elementwise", "Reduce"]
    product = next(d for d in program.defs if isinstance(d, Elementwise))
    assert product.type.shape == (5, 4, 3)
    reduce = next(d for d in program.defs if isinstance(d, Reduce))
    assert reduce.axes == (2,)
    maps = [d for d in program.defs if isinstance(d, IndexMap)]
    assert [", ".join(map(str, m.index)) for m in maps] == ["a0, a2", "a2, a1"]


class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


class _Transposed(nn.Module):
    """`x @ w.t()` (or `torch.matmul(x, w.T)`) with the weight a parameter, like nn.Linear's."""

    def __init__(self, weight, spelling):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.spelling = spelling

    def forward(self, x):
        if self.spelling == "t":
            return x @ self.weight.t()
        return torch.matmul(x, self.weight.T)


def _body(program) -> str:
    """The printout without input lines, inputs renamed in order of first use."""
    lines = [line for line in print_program(program).splitlines()[1:]
             if "input(" not in line and "load(" not in line]
    text = "\n".join(lines)
    names = [d.name for d in program.inputs]
    first_use = sorted(names, key=lambda n: re.search(rf"\b{n}\b", text).start())
    for i, name in enumerate(first_use):
        text = re.sub(rf"\b{name}\b", f"in{i}", text)
    return text


@pytest.mark.parametrize("spelling", ["t", "T"])
@pytest.mark.parametrize("shape", [(4, 3), (2, 4, 3)])
def test_linear_and_matmul_reach_the_same_tensor_ir(spelling, shape):
    linear = nn.Linear(3, 2, bias=False)
    x = r(*shape)
    direct = _Transposed(linear.weight.detach().clone(), spelling)
    a = lower(capture(linear, (x,)))
    b = lower(capture(direct, (x,)))
    assert _body(a) == _body(b)
    assert "multiply" in _body(a) and "reduce_sum" in _body(a)
    product = next(d for d in a.defs if isinstance(d, Elementwise))
    assert product.type.shape == shape[:-1] + (2, 3)


def test_linear_and_matmul_with_a_user_weight_print_the_same():
    linear = nn.Linear(3, 2, bias=False)
    x = r(4, 3)
    a = lower(capture(linear, (x,)))
    b = lower(capture(_Fn(lambda x, w: x @ w.t()), (x, linear.weight.detach().clone())))
    assert _body(a) == _body(b)


ATTENTION = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "scale": dict(scale=0.3),
    "causal_scale": dict(is_causal=True, scale=0.2),
}


@pytest.mark.parametrize("name", ATTENTION)
def test_sdpa(check, name):
    q, k, v = r(2, 3, 6, 8), r(2, 3, 6, 8), r(2, 3, 6, 8)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **ATTENTION[name]), q, k, v)


def test_sdpa_cross_attention_with_masks(check):
    q, k, v = r(2, 2, 5, 8), r(2, 2, 7, 8), r(2, 2, 7, 4)
    bool_mask = torch.rand(5, 7) > 0.3
    bool_mask[:, 0] = True
    float_mask = r(2, 1, 5, 7)
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v,
          bool_mask)
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v,
          float_mask)


def test_sdpa_grouped_query_attention(check):
    q, k, v = r(1, 4, 5, 8), r(1, 2, 5, 8), r(1, 2, 5, 8)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), q, k, v)


def test_causal_mask_is_an_iota_comparison(check):
    program = check(lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True),
                    r(1, 1, 4, 8))
    kinds = {type(d).__name__ for d in program.defs}
    assert "Iota" in kinds
    assert any(getattr(d, "op", None) is not None and str(d.op) == "le" for d in program.defs)


def test_half_attention(check):
    q = r(1, 2, 16, 8).to(torch.float16)
    check(lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True), q)


@pytest.mark.parametrize("expr", ["(x @ x) @ z", "(x @ y) @ x", "(x @ x.t()) @ x",
                                  "torch.relu(x.t() @ y) @ x"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_chained_products_reading_one_buffer_twice(expr, dtype):
    """One buffer as two operands of a fused chain, each read in its own layout (the chain
    once took both layouts from whichever operand came last)."""
    n = 24 if dtype is torch.float32 else 32

    def fn(x, y, z):
        return eval(expr)

    inputs = tuple(r(n, n).to(dtype) for _ in range(3))
    w = Workload("chain", _Fn(fn).eval(), inputs, source=expr, origin="<test>")
    stages = assert_workload_cuda_matches_eager(w)
    kernels = "\n".join(print_kernel(k) for k in stages["kernel"].kernels)
    assert "chained products" in kernels, "not the fused chain: tests nothing"
