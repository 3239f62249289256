"""Writes at data-dependent positions (scatter, scatter_add, scatter_reduce, index_copy,
index_add, index_fill, index_put), unrolled and as reductions over the writes: against eager
through the Tensor IR and Loop IR interpreters and the emitted CUDA on the CPU emulator."""

import numpy as np
import pytest
import torch

from emmy.check import check_cuda_program
from emmy.errors import UnsupportedOp
from emmy.frontend.workload import Workload
from emmy.loop_ir import interp as loop_interp
from emmy.loop_ir.lower import lower as lower_loops
from emmy.pipeline import compile_to
from emmy.tensor_ir.interp import run
from emmy.tensor_ir.lower import lower
from emmy.torch_ir.capture import capture
from tests.tensor_ir.conftest import Fn, assert_matches


def _top(x, k):
    return torch.topk(x, k, dim=-1).indices


CASES = {
    # a top-k mask and a dense gate (an MoE router's): distinct positions per row
    "scatter_value_mask": (lambda x: torch.zeros_like(x).scatter_(1, _top(x, 3), 1.0),
                           lambda: (torch.randn(6, 16),)),
    "scatter_src_gate": (lambda x: torch.zeros_like(x).scatter(1, _top(x, 2),
                                                               torch.softmax(x, -1)[:, :2]),
                         lambda: (torch.randn(5, 8),)),
    # repeated positions: the last write wins (torch's CPU loop)
    "scatter_repeated": (lambda x, i, s: x.scatter(1, i, s),
                         lambda: (torch.randn(3, 5), torch.tensor([[1, 1], [0, 4], [2, 2]]),
                                  torch.randn(3, 2))),
    "scatter_dim0": (lambda x, i, s: torch.scatter(x, 0, i, s),
                     lambda: (torch.randn(7, 4), torch.randint(0, 7, (3, 4)),
                              torch.randn(5, 6))),
    "scatter_add_repeated": (lambda x, i, s: x.scatter_add(1, i, s),
                             lambda: (torch.randn(3, 6), torch.randint(0, 6, (3, 9)),
                                      torch.randn(3, 9))),
    "scatter_add_f16": (lambda x, i, s: x.scatter_add(-1, i, s),
                        lambda: (torch.randn(4, 6).half(), torch.randint(0, 6, (4, 3)),
                                 torch.randn(4, 3).half())),
    "index_add": (lambda x, i, s: x.index_add(1, i, s, alpha=0.5),
                  lambda: (torch.randn(2, 7, 3), torch.tensor([6, 0, 6, 2]),
                           torch.randn(2, 4, 3))),
    "index_copy": (lambda x, i, s: x.index_copy(0, i, s),
                   lambda: (torch.randn(6, 4), torch.tensor([5, 1, 3]), torch.randn(3, 4))),
    "index_fill_wraps": (lambda x, i: x.index_fill(1, i, -2.5),
                         lambda: (torch.randn(3, 6), torch.tensor([-1, 2]))),
    # past SCATTER_LIMIT positions a row: reductions over the writes
    "scatter_add_many": (lambda x, i, s: x.scatter_add(1, i, s),
                         lambda: (torch.randn(3, 16), torch.randint(0, 16, (3, 70)),
                                  torch.randn(3, 70))),
    "scatter_many_last_wins": (lambda x, i, s: x.scatter(0, i, s),
                               lambda: (torch.randn(9, 4), torch.randint(0, 9, (50, 4)),
                                        torch.randn(60, 5))),
    "scatter_value_many": (lambda x, i: x.scatter(1, i, -1.5),
                           lambda: (torch.randn(2, 40), torch.randint(0, 40, (2, 45)))),
    "index_add_many": (lambda x, i, s: x.index_add(0, i, s, alpha=2),
                       lambda: (torch.randint(-9, 9, (20, 3)), torch.randint(0, 20, (64,)),
                                torch.randint(-9, 9, (64, 3)))),
    "index_copy_many": (lambda x, i, s: x.index_copy(1, i, s),
                        lambda: (torch.randn(2, 50), torch.randperm(50)[:40],
                                 torch.randn(2, 40))),
    "index_put_many_wraps": (lambda x, i, v: x.index_put((i,), v),
                             lambda: (torch.randn(30), torch.randint(-30, 30, (40,)),
                                      torch.randn(40))),
    # scatter_reduce, with and without the tensor's own values
    "scatter_reduce_amax": (lambda x, i, s: x.scatter_reduce(1, i, s, "amax"),
                            lambda: (torch.randn(3, 8), torch.randint(0, 8, (3, 12)),
                                     torch.randn(3, 12))),
    "scatter_reduce_amin_alone": (
        lambda x, i, s: x.scatter_reduce(0, i, s, "amin", include_self=False),
        lambda: (torch.randn(10), torch.randint(0, 10, (6,)), torch.randn(6))),
    "scatter_reduce_sum_alone": (
        lambda x, i, s: x.scatter_reduce(0, i, s, "sum", include_self=False),
        lambda: (torch.randn(10), torch.randint(0, 10, (40,)), torch.randn(40))),
    "scatter_reduce_prod": (lambda x, i, s: x.scatter_reduce(1, i, s, "prod"),
                            lambda: (torch.randn(3, 8), torch.randint(0, 8, (3, 10)),
                                     torch.rand(3, 10) + 0.5)),
    "scatter_reduce_mean": (lambda x, i, s: x.scatter_reduce(0, i, s, "mean"),
                            lambda: (torch.randn(10, 2), torch.randint(0, 10, (30, 2)),
                                     torch.randn(30, 2))),
    # integers: the mean rounds down (-3.5 is -4), as torch's does
    "scatter_reduce_mean_int_alone": (
        lambda x, i, s: x.scatter_reduce(0, i, s, "mean", include_self=False),
        lambda: (torch.randint(-50, 50, (10,)), torch.randint(0, 10, (30,)),
                 torch.randint(-50, 50, (30,)))),
    "scatter_reduce_arg_multiply": (lambda x, i, s: x.scatter(1, i, s, reduce="multiply"),
                                    lambda: (torch.randn(3, 8), torch.randint(0, 8, (3, 5)),
                                             torch.randn(3, 5))),
    # index_reduce: scatter_reduce with each slice's position spread over it
    "index_reduce_amax_alone": (
        lambda x, i, s: x.index_reduce(0, i, s, "amax", include_self=False),
        lambda: (torch.randn(6, 5), torch.randint(0, 6, (20,)), torch.randn(20, 5))),
    "index_reduce_mean": (lambda x, i, s: x.index_reduce(1, i, s, "mean"),
                          lambda: (torch.randn(3, 6), torch.randint(0, 6, (9,)),
                                   torch.randn(3, 9))),
}


def _model_and_inputs(name):
    torch.manual_seed(0)
    fn, make = CASES[name]
    return Fn(fn).eval(), make()


@pytest.mark.parametrize("name", sorted(CASES))
def test_tensor_and_loop_ir_match_eager(name):
    model, inputs = _model_and_inputs(name)
    graph = capture(model, inputs, name=name)
    program = lower(graph)
    bound = {p.name: v for p, v in zip(graph.inputs, inputs)}
    bound |= dict(graph.values)
    with torch.no_grad():
        want = model(*inputs)
    assert_matches(run(program, bound)[0], want, "Tensor IR")
    got = loop_interp.run(lower_loops(program), bound)[0]
    assert_matches(got.astype(np.float32) if want.dtype == torch.bfloat16 else got, want,
                   "Loop IR")


@pytest.mark.parametrize("name", ["scatter_value_mask", "scatter_src_gate", "scatter_repeated",
                                  "scatter_add_f16", "index_add", "index_fill_wraps",
                                  "scatter_add_many", "scatter_many_last_wins",
                                  "index_put_many_wraps", "scatter_reduce_amax",
                                  "scatter_reduce_mean_int_alone"])
def test_emitted_cuda_matches_eager(name):
    model, inputs = _model_and_inputs(name)
    w = Workload(name, model, tuple(inputs), source=name, origin="<test>")
    stages = compile_to(w, "cuda")
    report, failed = check_cuda_program(w, stages["torch"], stages["cuda"])
    assert report is not None, failed.log[-2000:]
    assert report.ok, report.outputs


@pytest.mark.parametrize("fn, inputs, message", [
    (lambda x, i: x.scatter(1, i, 1.0), (torch.randn(4, 8), torch.randint(0, 8, (2, 3))),
     "emmy writes whole rows"),
])
def test_refusals_say_why(fn, inputs, message):
    with pytest.raises(UnsupportedOp, match="scatter|index_add") as e:
        lower(capture(Fn(fn).eval(), inputs, name="t"))
    assert message in str(e.value)


@pytest.mark.parametrize("expr", [
    "torch.zeros(8, 16).scatter_add(1, torch.randint(0, 16, (8, 40)), torch.randn(8, 40))",
    "torch.randn(64, 4).scatter_reduce(0, torch.randint(0, 64, (90, 4)), torch.randn(90, 4), "
    "reduce='amax', include_self=False)",
])
def test_writes_as_reductions_on_sampled_rows_compile_and_match_eager(expr):
    from tests.tensor_ir.emitted import assert_sampled_rows_match_eager

    assert_sampled_rows_match_eager(expr, per_kernel=3, seed=4)


def test_segment_reduce_matches_eager(check):
    """torch.segment_reduce (PyG's pooling over `ptr`): every reduction, an empty segment
    (0, NaN mean, -inf, inf, 1), lengths instead of offsets, offsets per leading index along
    axis 1, an initial value, and 16-bit data; on the emulator too."""
    from tests.tensor_ir.emitted import assert_workload_cuda_matches_eager

    def segments(x, ptr, lengths, y, ptr2, h):
        out = [torch.segment_reduce(x, r, offsets=ptr) for r in ("sum", "mean", "max", "min",
                                                                   "prod", "amax")]
        return (*out, torch.segment_reduce(x, "sum", lengths=lengths),
                torch.segment_reduce(x, "max", offsets=ptr, initial=0.0),
                torch.segment_reduce(y, "mean", offsets=ptr2, axis=1),
                torch.segment_reduce(h, "sum", offsets=ptr))

    ptr = torch.tensor([0, 2, 2, 5, 7])
    args = (torch.randn(7, 3), ptr, torch.tensor([3, 0, 4]), torch.randn(2, 7, 3),
            torch.tensor([[0, 2, 7], [0, 0, 4]]), torch.randn(7, 3).half())
    check(segments, *args)
    assert_workload_cuda_matches_eager(Workload("segments", Fn(segments).eval(), args,
                                                source="", origin="<test>"))


def test_a_segment_reduce_emmy_does_not_take_is_refused_with_the_reason():
    call = lambda x, n: torch.segment_reduce(x, "mean", lengths=n, initial=1.0)  # noqa: E731
    with pytest.raises(UnsupportedOp, match="segment_reduce's mean with an initial value"):
        lower(capture(Fn(call), (torch.randn(5, 3), torch.tensor([2, 3]))))
