"""The lowering driver: unsupported ops are user errors naming the op and the line."""

import pytest
import torch
import torch.nn as nn

from emmy.errors import UnsupportedOp, UserError
from emmy.tensor_ir.lower import SUPPORTED_OPS, lower
from emmy.torch_ir.capture import capture
from emmy.torch_ir.ir import Graph, InputKind, Node, Placeholder, Ref, TensorType
from emmy.dtypes import DType
from tests.tensor_ir.conftest import Fn


class _Unsupported(nn.Module):
    def forward(self, x):
        return torch.histogram(x, bins=4)[0]  # torch has no decomposition of it either


def test_unsupported_op_names_the_op_and_the_source_line():
    with pytest.raises(UnsupportedOp) as info:
        lower(capture(_Unsupported(), (torch.randn(4, 5),)))
    assert info.value.op == "histogram.bin_ct"
    assert "return torch.histogram(x, bins=4)[0]" in str(info.value)
    assert "emmy ops" in info.value.hint
    assert isinstance(info.value, UserError)


def test_unsupported_arguments_are_reported_as_the_op():
    class Drop(nn.Module):
        def forward(self, q):
            return nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5)

    with pytest.raises(UnsupportedOp, match="dropout_p") as info:
        lower(capture(Drop(), (torch.randn(1, 1, 4, 8),)))
    # the op is in `emmy ops`; only these arguments are refused, so no hint points there
    assert info.value.hint is None


def test_hand_built_graph_without_types():
    t = TensorType((4, 8), DType.F16)
    graph = Graph("g", (Placeholder("x", InputKind.INPUT, t),),
                  (Node(name="y", op="softmax.int", args=(Ref("x"), 1)),), (Ref("y"),))
    program = lower(graph)
    assert str(program.get(program.outputs[0]).type) == "f16[4,8]"  # opmath casts back


def test_supported_ops_is_sorted_and_covers_the_families():
    assert SUPPORTED_OPS == sorted(SUPPORTED_OPS)
    for name in ["rms_norm", "linear", "softmax.int", "scaled_dot_product_attention", "cumsum",
                 "cross_entropy_loss", "view", "getitem", "add.Tensor", "gelu", "max.dim"]:
        assert name in SUPPORTED_OPS


def test_bitwise_ops_on_integers_work_on_the_bits_and_on_booleans_stay_logical():
    class And(nn.Module):
        def forward(self, x):
            return x & 3, (x > 2) & (x < 5), ~x, ~(x > 2)

    program = lower(capture(And(), (torch.arange(6),)))
    ops = [str(program.get(o).op) for o in program.outputs]
    assert ops == ["bitand", "and", "bitnot", "not"]


def test_einsum_with_an_ellipsis_is_written_out():
    from emmy.tensor_ir.interp import run

    class Ein(nn.Module):
        def forward(self, x):
            return torch.einsum("...ij->...ji", x)

    x = torch.randn(2, 3, 4)
    (got,) = run(lower(capture(Ein(), (x,))), {"x": x})
    assert (got == x.transpose(-1, -2).numpy()).all()


def test_foreach_ops_apply_their_op_to_each_tensor_of_their_lists(check):
    """torch._foreach_* (torch.optim's multi-tensor Adam): list, scalar, scalar-list and unary
    forms, and addcmul's value given positionally."""
    def adam(p0, p1, g0, g1, m0, m1, v0, v1):
        params, grads, ms, vs = [p0, p1], [g0, g1], [m0, m1], [v0, v1]
        ms = torch._foreach_lerp(ms, grads, 0.1)
        vs = torch._foreach_add(torch._foreach_mul(vs, 0.999), torch._foreach_mul(grads, grads),
                                alpha=0.001)
        denom = torch._foreach_add(torch._foreach_sqrt(vs), 1e-8)
        params = torch._foreach_sub(params, torch._foreach_mul(torch._foreach_div(ms, denom),
                                                               [1e-3, 2e-3]))
        params = torch._foreach_addcmul(params, ms, vs, 0.5)
        return (*params, *torch._foreach_norm(grads, 2), *torch._foreach_pow(vs, 0.5),
                *torch._foreach_maximum(ms, vs))

    shapes = [(16, 8), (8,)] * 4
    check(adam, *(torch.rand(s) if i >= 6 else torch.randn(s) for i, s in enumerate(shapes)))


def test_in_place_foreach_ops_on_copies_are_functionalized(check):
    """`torch._foreach_mul_(ps, 0.5)` returns nothing and updates the list's tensors: the graph is
    functionalized first, and later reads read the updated tensors."""
    def step(a, b):
        ps = [a.clone(), b.clone()]
        torch._foreach_mul_(ps, 0.5)
        torch._foreach_add_(ps, [a, b], alpha=2.0)
        return ps[0] + 1, ps[1]

    check(step, torch.randn(4), torch.randn(3))


def test_in_place_foreach_ops_on_inputs_update_them():
    def step(a, b):
        torch._foreach_mul_([a, b], 0.5)
        return a + b.sum()

    g = capture(Fn(step), (torch.randn(4), torch.randn(3)))
    assert g.updates == ("input:0", "input:1")
