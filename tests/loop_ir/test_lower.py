"""Lowering to loop nests: what fuses into one kernel, and where each statement lands."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from emmy import symbolic
from emmy.dtypes import DType
from emmy.loop_ir.dataflow import walk
from emmy.loop_ir.ir import Init, Load, Loop, LoopKind, Store

from .programs import check_torch


def loops_of(body):
    return [s for s in walk(body) if isinstance(s, Loop)]


def kinds(body):
    return [s.kind for s in loops_of(body)]


def test_rmsnorm_is_one_kernel_whose_statistic_is_an_accumulator():
    lp = check_torch(nn.RMSNorm(64), torch.randn(8, 64))
    assert len(lp.kernels) == 1 and lp.intermediates == ()
    (k,) = lp.kernels
    (rows,) = k.body  # for a0: the row statistic, then the loop over the row's columns
    assert rows.kind is LoopKind.PARALLEL and rows.extent == 8
    assert isinstance(rows.body[0], Init)
    assert [s.kind for s in rows.body if isinstance(s, Loop)] == [LoopKind.REDUCE,
                                                                  LoopKind.PARALLEL]
    assert isinstance(rows.body[-1], Loop) and rows.body[-1].kind is LoopKind.PARALLEL
    stores = [s for s in walk(k.body) if isinstance(s, Store)]
    assert [s.buffer for s in stores] == [lp.outputs[0].name]  # nothing else goes to memory


def test_softmax_log_softmax_and_layer_norm_are_one_kernel_each():
    x = torch.randn(4, 32)
    for model in (lambda x: F.softmax(x, -1), lambda x: F.log_softmax(x, -1), nn.LayerNorm(32)):
        lp = check_torch(model, x)
        assert len(lp.kernels) == 1 and lp.intermediates == ()
        (rows,) = lp.kernels[0].body
        assert rows.extent == 4  # the statistics sit in the row loop, before the column loop


def test_softmax_over_the_first_axis_puts_the_column_loop_outside():
    lp = check_torch(lambda x: F.softmax(x, 0), torch.randn(6, 5))
    (cols,) = lp.kernels[0].body
    assert cols.extent == 5 and isinstance(cols.body[0], Init)


def test_exp_of_negation_is_one_loop_nest_with_one_load_and_one_store():
    lp = check_torch(lambda x: torch.exp(-x), torch.randn(4, 16))
    (k,) = lp.kernels
    assert kinds(k.body) == [LoopKind.PARALLEL, LoopKind.PARALLEL]
    stmts = list(walk(k.body))
    assert sum(isinstance(s, Load) for s in stmts) == 1
    assert sum(isinstance(s, Store) for s in stmts) == 1


def test_chained_matmuls_fuse_by_default_and_say_what_is_recomputed():
    a, b, c = torch.randn(4, 8), torch.randn(8, 6), torch.randn(6, 5)
    lp = check_torch(lambda a, b, c: (a @ b) @ c, a, b, c)
    assert len(lp.kernels) == 1 and lp.intermediates == ()
    assert kinds(lp.kernels[0].body) == [LoopKind.PARALLEL, LoopKind.PARALLEL,
                                         LoopKind.REDUCE, LoopKind.REDUCE]
    assert any("recomputed up to 5x" in n and "PLACE=cut" in n for n in lp.notes)


def test_attention_is_one_kernel_where_a_flash_template_takes_it():
    """f16/bf16 and f32 attention stays one kernel (a flash template's); over an f32 head
    dimension no template takes (not a multiple of 4), fused, each output element would compute
    its row's scores again: they are stored."""
    q, k, v = (torch.randn(1, 2, 8, 16).half() for _ in range(3))
    for causal in (False, True):
        for x in ((q, k, v), tuple(t.float() for t in (q, k, v))):
            lp = check_torch(lambda q, k, v: F.scaled_dot_product_attention(
                q, k, v, is_causal=causal), *x)
            assert len(lp.kernels) == 1 and lp.intermediates == ()
    q, k, v = (torch.randn(1, 2, 8, 6) for _ in range(3))
    lp = check_torch(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v)
    assert len(lp.kernels) == 2 and lp.intermediates[0].type.shape == (1, 2, 8, 8)


def test_a_small_mlp_is_one_kernel():
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    lp = check_torch(model, torch.randn(4, 16))
    assert len(lp.kernels) == 1


def test_layouts_become_index_arithmetic():
    x = torch.randn(4, 16)
    check_torch(lambda x: x.reshape(8, 8).t().reshape(2, 32).sum(0), x)
    check_torch(lambda x, y: torch.cat([x, y], 1), x, torch.randn(4, 3))
    check_torch(lambda x: torch.flip(x, [1])[:, 2:9] * 2, x)
    check_torch(lambda x: torch.tril(x), torch.randn(5, 5))


def test_full_reductions_have_no_output_loop():
    lp = check_torch(lambda x: x.sum(), torch.randn(4, 16))
    (k,) = lp.kernels
    assert isinstance(k.body[0], Init) and kinds(k.body) == [LoopKind.REDUCE, LoopKind.REDUCE]
    lp = check_torch(lambda x: torch.argmax(x), torch.randn(4, 16))
    assert lp.outputs[0].type.shape == ()


def test_half_precision_and_mixed_types():
    x = torch.randn(4, 16)
    check_torch(lambda x: F.softmax(x, -1), x.half())
    check_torch(nn.RMSNorm(16).to(torch.bfloat16), x.bfloat16())
    check_torch(lambda x: (x * 3 + 1) // 2, torch.randint(-5, 5, (4, 4)))
    check_torch(lambda x: x.masked_fill(x > 0, 0.0).sum(-1), x)


def test_lowering_without_normalization_is_also_correct():
    lp = check_torch(nn.LayerNorm(16), torch.randn(4, 16), normalized=False)
    assert lp.kernels[0].name == "k0_t"


def test_a_kernel_that_would_grow_too_large_stores_a_tensor_and_says_why():
    def alternating(x):  # each softmax reads its input three times, along the other axis
        for i in range(8):
            x = torch.softmax(x, i % 2)
        return x

    lp = check_torch(alternating, torch.randn(5, 6))
    assert len(lp.kernels) >= 2 and len(lp.intermediates) == len(lp.kernels) - 1
    assert any("materialized as" in n and "would pass 1024 statements" in n for n in lp.notes)


def test_an_unrolled_recurrence_builds_each_kernel_about_once():
    """A kernel that passes the budget stores one more tensor of the chain, and then the next
    while the same kernel still passes it, before planning again: an unrolled recurrence is
    cut in a pass or two, not one pass per step. The kernels whose builds read the same things
    as in an earlier pass are taken from it, and the result is the one building every kernel
    afresh in every pass gives."""
    import emmy.loop_ir.lower as lower_module
    from emmy.tensor_ir.lower import lower as to_tensor_ir
    from emmy.torch_ir.capture import capture

    torch.manual_seed(0)
    lstm, x = nn.LSTM(4, 8).eval(), torch.randn(12, 2, 4)
    lp = check_torch(lstm, x)
    graph = capture(lstm, (x,), name="t")
    program = to_tensor_ir(graph)

    class Forgetful(dict):  # a memo that never holds anything
        def __contains__(self, key):
            return False

    builds, plans = [], []
    real, plan = lower_module.build_kernel, lower_module.plan_fusion
    try:
        lower_module.build_kernel = lambda *a, **k: builds.append(1) or real(*a, **k)
        lower_module.plan_fusion = lambda *a, **k: plans.append(1) or plan(*a, **k)
        _, remembered = lower_module._build_within_budget(program)
        n_remembered, n_plans = len(builds), len(plans)
        _, afresh = lower_module._build_within_budget(program, Forgetful())
    finally:
        lower_module.build_kernel, lower_module.plan_fusion = real, plan
    assert [k for k, _ in remembered] == [k for k, _ in afresh]
    assert len(lp.kernels) == len(remembered) >= 12          # a kernel per step at least
    assert n_remembered <= 3 * len(remembered)
    assert n_plans <= 4, n_plans


def test_without_a_reduction_to_store_the_cut_is_a_data_chain_not_a_position():
    """An element-wise chain computed at several indices (an unrolled LSTM's cell states, read
    by each later step and by the stack of its outputs) is stored when no reduction is left to
    store; tensors computed from positions alone (iota, its comparisons) and views are not."""
    from emmy.loop_ir.lower import choose_cut
    from emmy.tensor_ir.builder import Builder
    from emmy.tensor_ir.ir import EwOp, TensorType

    b = Builder("chain")
    x = b.input("x", TensorType((4, 8), DType.F32))
    c2 = b.ew(EwOp.MUL, b.ew(EwOp.TANH, x), x)
    view = b.index_map(c2, (8, 4), [symbolic.var("a1"), symbolic.var("a0")])
    out = b.ew(EwOp.WHERE, b.ew(EwOp.LT, b.iota((8, 4), 0), 3), view, 0.0)
    p = b.finish([out])
    x, c1, c2, view, _, step, _ = (d.name for d in p.defs)   # the names `finish` gave them
    uses = {x: 3, c1: 2, c2: 2, view: 2, step: 5}
    assert choose_cut(p, uses, stored=set()) == c2
    assert choose_cut(p, uses, stored={c2}) == c1
    assert choose_cut(p, {x: 3, step: 5, view: 2}, stored=set()) is None


@pytest.mark.slow
def test_a_two_layer_lstm_over_32_steps_lowers_within_the_budget():
    """Layer 2 reads the stack of layer 1's outputs at every step; with the products stored,
    only cell states are left to cut (before, the kernel was accepted whole and its build ran
    for minutes in gigabytes)."""
    torch.manual_seed(0)
    lp = check_torch(nn.LSTM(3, 4, num_layers=2).eval(), torch.randn(32, 2, 3))
    assert 64 <= len(lp.kernels) <= 4 * 64
