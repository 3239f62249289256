"""torch.topk (and sort, argsort: the top n) as k rounds of a row reduction; past 32 rounds
by ranking each element or, where that costs more, by selecting the k-th largest key a bit at
a time (and kthvalue, median, nanmedian so; mode by counting): values and positions against a
reference that breaks ties lowest position first (emmy.selections), through the Tensor IR, the
Loop IR and the emitted CUDA on the emulator."""

import numpy as np
import pytest
import torch

from emmy.check import check_cuda_program, check_loop_program, program_inputs, run_eager
from emmy.selections import stable_topk
from emmy.errors import UnsupportedOp
from emmy.frontend.workload import Workload
from emmy.loop_ir.interp import run as run_loop
from emmy.pipeline import compile_to
from emmy.tensor_ir.interp import run as run_tensor
from emmy.tensor_ir.lower import lower
from emmy.torch_ir.capture import capture
from tests.tensor_ir.conftest import Fn, assert_matches, outputs_of

INF, NAN = float("inf"), float("nan")
# ties, NaN (largest of all), infinities and a row of only NaN and -inf
AWKWARD = torch.tensor([[1., 3., 3., 2., 3., NAN, -INF, -INF, NAN, 0.],
                        [-INF, -INF, NAN, -INF, 5., 5., INF, -1., 5., INF],
                        [NAN, -INF, NAN, NAN, -INF, NAN, -INF, NAN, NAN, -INF]])
# past the rounds (TOPK_LIMIT, 28) elements a row: the ranked path, with the same ties and NaNs
WIDE = torch.cat([AWKWARD, AWKWARD.flip(1) * 2, AWKWARD, torch.randn(3, 10), AWKWARD], 1)
# long enough that selecting costs less than ranking: -0.0 beside +0.0 (equal, as in torch)
LONG = torch.cat([WIDE, -WIDE, torch.zeros(3, 20), -torch.zeros(3, 20), WIDE.flip(1),
                  torch.randn(3, 110)], 1)
MERGED = torch.cat([LONG, LONG.flip(1), LONG * 3, torch.randn(3, 101), LONG], 1)   # 1,301

CASES = {
    "largest": (lambda x: torch.topk(x, 4), [torch.randn(6, 33)]),
    "smallest": (lambda x: torch.topk(x, 3, largest=False), [torch.randn(6, 33)]),
    "dim0": (lambda x: torch.topk(x, 2, dim=0), [torch.randn(9, 5, 4)]),
    "middle_dim": (lambda x: x.topk(3, 1), [torch.randn(2, 7, 3)]),
    "unsorted": (lambda x: torch.topk(x, 5, sorted=False), [torch.randn(4, 16)]),
    "k_is_n": (lambda x: torch.topk(x, 6), [torch.randn(3, 6)]),
    "one_d": (lambda x: torch.topk(x, 1), [torch.randn(40)]),
    "ties": (lambda x: torch.topk(x, 7), [torch.randint(0, 4, (5, 20)).float()]),
    "ties_smallest": (lambda x: torch.topk(x, 7, largest=False),
                      [torch.randint(0, 4, (5, 20)).float()]),
    "awkward": (lambda x: torch.topk(x, 10), [AWKWARD]),
    "awkward_smallest": (lambda x: torch.topk(x, 10, largest=False), [AWKWARD]),
    "int": (lambda x: torch.topk(x, 4), [torch.randint(-9, 9, (3, 12))]),
    "int_smallest": (lambda x: torch.topk(x, 4, largest=False),
                     [torch.randint(-9, 9, (3, 12), dtype=torch.int32)]),
    "int_extremes": (lambda x: (torch.topk(x, 4), torch.topk(x, 4, largest=False)),
                     [torch.tensor([[2**63 - 1, -2**63, -2**63, 0, 2**63 - 1, 5]])]),
    "bf16": (lambda x: torch.topk(x, 5), [torch.randn(4, 64).bfloat16()]),
    "router": (lambda x: _router(x), [torch.randn(8, 16)]),
    "sort": (lambda x: torch.sort(x, 1), [AWKWARD]),
    "sort_descending_stable": (lambda x: x.sort(dim=0, descending=True, stable=True),
                               [torch.randint(0, 3, (9, 4)).float()]),
    "argsort": (lambda x: (torch.argsort(x), x.argsort(dim=1, descending=True)),
                [torch.randint(-4, 4, (3, 11))]),
    # the smallest bytes: what a taken byte reads as is 255 (not 127, an i8's largest)
    "bytes": (lambda x: (torch.sort(x, 1), torch.topk(x, 5), torch.topk(x, 5, largest=False)),
              [torch.randint(0, 256, (6, 20)).to(torch.uint8)]),
    # ranked: each element's place counted (n * n compares a row)
    "ranked_sort": (lambda x: (torch.sort(x, 1), x.sort(1, descending=True)), [WIDE]),
    "ranked_topk": (lambda x: (torch.topk(x, 40), torch.topk(x, 33, largest=False)), [WIDE]),
    "ranked_dim0": (lambda x: x.argsort(dim=0, descending=True),
                    [torch.randint(0, 5, (45, 3)).float()]),
    "ranked_kth": (lambda x: (torch.kthvalue(x, 20), torch.median(x, 1),
                              torch.kthvalue(x, 3, 1, keepdim=True)), [WIDE]),
    "ranked_median_numbers": (lambda x: torch.median(x, 1), [torch.randn(4, 81)]),
    "ranked_ints": (lambda x: (torch.sort(x, 1), torch.topk(x, 35, largest=False)),
                    [torch.randint(0, 256, (3, 70)).to(torch.uint8)]),
    "ranked_bool": (lambda x: torch.sort(x > 0, dim=1, stable=True), [torch.randn(3, 40)]),
    # selected: the k-th largest key found a bit at a time, then the k moved to slots
    "selected_topk": (lambda x: (torch.topk(x, 40), torch.topk(x, 45, largest=False)), [LONG]),
    "selected_dim0": (lambda x: x.topk(40, dim=0), [LONG.t().contiguous()]),
    "selected_f16": (lambda x: torch.topk(x, 50), [(torch.randint(-60, 60, (4, 300)) / 8).half()]),
    "selected_bf16": (lambda x: torch.topk(x, 50, largest=False),
                      [torch.randn(4, 300).bfloat16()]),
    "selected_ints": (lambda x: (torch.topk(x, 40), torch.topk(x, 40, largest=False)),
                      [torch.tensor([2**63 - 1, -2**63, 0, -1, 7] * 40).reshape(2, 100)]),
    "selected_bytes": (lambda x: torch.topk(x, 40), [torch.randint(0, 256, (3, 200)).to(torch.uint8)]),
    "selected_f64": (lambda x: torch.topk(x, 40), [torch.cat([LONG, LONG], 1).double()]),
    "selected_long_row": (lambda x: torch.topk(x, 50), [torch.randn(2, 5000)]),
    "selected_kth": (lambda x: (torch.kthvalue(x, 100), torch.median(x, 1),
                                torch.kthvalue(x, 250, 1, keepdim=True)), [LONG]),
    "selected_median_long": (lambda x: torch.median(x, 1), [torch.randn(3, 5001)]),
    # merged: past 1,024 elements, sorted runs merged pairwise (a binary search a merge)
    "merged_sort": (lambda x: (torch.sort(x, 1), x.sort(1, descending=True), x.argsort(1)),
                    [MERGED]),
    "merged_dim0": (lambda x: x.sort(0, descending=True), [MERGED[:, :1100].t().contiguous()]),
    "merged_topk": (lambda x: torch.topk(x, 1200, largest=False), [MERGED]),
    "merged_16bit": (lambda x, y: (torch.sort(x, 1), torch.sort(y, 1, descending=True)),
                     [(torch.randint(-60, 60, (2, 1500)) / 8).half(), torch.randn(2, 1100).bfloat16()]),
    "merged_ints": (lambda x, y: (torch.sort(x, 1), torch.argsort(y, 1, descending=True)),
                    [torch.randint(-2**31, 2**31, (2, 1030), dtype=torch.int32),
                     torch.randint(0, 256, (2, 1030)).to(torch.uint8)]),
    "merged_long_row": (lambda x: torch.sort(x, 1), [torch.randn(2, 5000)]),
    "ranked_i64_past_merging": (lambda x: torch.sort(x, 1), [torch.randint(-9, 9, (2, 1500))]),
    "merged_mode": (lambda x, y: (torch.mode(x, 1), torch.mode(y, 0)),
                    [torch.randint(0, 40, (3, 1500)).float(),
                     torch.randint(-3, 3, (1200, 2), dtype=torch.int32)]),
    "nanmedian": (lambda x: (torch.nanmedian(x, 1), torch.nanmedian(x[1:])), [AWKWARD]),
    "nanmedian_wide": (lambda x: torch.nanmedian(x, 1, keepdim=True), [WIDE]),
    "mode": (lambda x: (torch.mode(x, 1), torch.mode(x, 0, keepdim=True)),
             [torch.randint(0, 4, (6, 9))]),
    # no NaN: eager's mode of a row holding NaNs depends on where they sit ([nan, nan, 1] gives
    # nan, [1, nan, nan] gives 1)
    "mode_floats": (lambda x: torch.mode(x, 1), [torch.nan_to_num(AWKWARD, nan=3.0)]),
    "mode_bool": (lambda x: torch.mode(x > 0), [torch.randn(5, 6)]),
    "mode_nan_row": (lambda x: torch.mode(x, 1), [torch.tensor([[NAN, NAN, NAN], [1., 2., 2.]])]),
}


def _router(logits):
    weights, chosen = torch.topk(torch.softmax(logits, -1), 2)
    return weights / weights.sum(-1, keepdim=True), chosen


def _reference(fn, inputs):
    with torch.no_grad():
        return outputs_of(run_eager(Fn(fn), inputs))


def _lowered(fn, inputs):
    graph = capture(Fn(fn).eval(), inputs, name="t")
    return graph, lower(graph)


def _assert_same(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        if w.dtype.is_floating_point:
            assert_matches(np.asarray(g), w, f"output {i}")
        else:                                    # positions: exactly
            np.testing.assert_array_equal(np.asarray(g), w.numpy(), err_msg=f"output {i}")


# positions among ties that torch does not break lowest first (kthvalue, median, nanmedian,
# mode): judged by the values they pick (emmy.selections), through check_loop_program
BY_VALUE = ("ranked_kth", "selected_kth", "nanmedian", "nanmedian_wide", "mode", "mode_floats",
            "mode_bool", "mode_nan_row", "merged_mode")


@pytest.mark.parametrize("name", [n for n in CASES if n not in BY_VALUE])
def test_topk_tensor_ir_matches_the_reference(name):
    fn, inputs = CASES[name]
    graph, program = _lowered(fn, inputs)
    got = run_tensor(program, {p.name: v for p, v in zip(graph.inputs, inputs)})
    _assert_same(got, _reference(fn, inputs))


def _workload(name):
    fn, inputs = CASES[name]
    return Workload(name, Fn(fn).eval(), tuple(inputs), source=name, origin="<test>")


@pytest.mark.parametrize("name", ["awkward", "awkward_smallest", "int_extremes", "router",
                                  "dim0", "bytes", "ranked_sort", "ranked_dim0", "selected_topk",
                                  "selected_dim0", "selected_ints", "selected_long_row",
                                  "selected_median_long", "merged_sort", "merged_dim0",
                                  "merged_ints", "merged_long_row"])
def test_topk_loop_ir_matches_the_reference(name):
    w = _workload(name)
    stages = compile_to(w, "loop")
    got = run_loop(stages["loop"], program_inputs(stages["torch"], w.inputs))
    _assert_same(got, _reference(CASES[name][0], w.inputs))


@pytest.mark.parametrize("name", BY_VALUE)
def test_ranked_selections_loop_ir_pick_the_references_values(name):
    w = _workload(name)
    stages = compile_to(w, "loop")
    report = check_loop_program(w, stages["torch"], stages["loop"])
    assert report.ok, report.outputs
    assert any(o.dtype.value == "i64" for o in report.outputs)


# each path (rounds, ranked, selected, merged, counted) and key type in the default suite; the
# rest (a dozen kernels each, a third of this file's time) in the full sweep (-m slow)
EMITTED = ["awkward", "int_extremes", "router", "bf16", "sort", "argsort", "ranked_topk",
           "ranked_ints", "mode", "mode_nan_row", "selected_bf16", "selected_ints",
           "selected_bytes", "merged_ints", "ranked_i64_past_merging"]
EMITTED_SLOW = ["awkward_smallest", "bytes", "nanmedian", "selected_topk", "selected_f16",
                "selected_f64", "selected_kth", "merged_sort", "merged_topk", "merged_16bit",
                "merged_mode"]


@pytest.mark.parametrize("name", EMITTED + [pytest.param(n, marks=pytest.mark.slow)
                                            for n in EMITTED_SLOW])
def test_topk_emitted_cuda_matches_the_reference(name):
    w = _workload(name)
    stages = compile_to(w, "cuda")
    report, failed = check_cuda_program(w, stages["torch"], stages["cuda"])
    assert report is not None, failed.log[-2000:]
    assert report.ok, report.outputs
    assert any(o.dtype.value == "i64" and o.atol == 0 for o in report.outputs)


def test_reference_breaks_ties_lowest_position_first():
    x = torch.tensor([[1., 3., 3., 2., 3., NAN, NAN]])
    values, indices = run_eager(lambda t: torch.topk(t, 5), (x,))
    assert indices.tolist() == [[5, 6, 1, 2, 4]]
    assert torch.equal(values[:, 2:], torch.tensor([[3., 3., 3.]]))
    values, indices = stable_topk(x, 3, largest=False)
    assert indices.tolist() == [[0, 3, 1]] and values.tolist() == [[1., 2., 3.]]


@pytest.mark.parametrize("call, message", [
    ("torch.topk(x, 0)", "k=0 selects nothing"),
    ("torch.topk(x > 0, 2)", "bool"),
    ("torch.sort((y * 100).long())", "sorting 5000 elements of 64-bit i64 along a dimension: "
                                     "emmy sorts rows past 4096 elements by merging keys of at "
                                     "most 32 bits"),
    ("torch.topk(y.double(), 4500)", "topk with k=4500 of 5000 elements of 64-bit f64"),
    ("torch.mode(y.double())", "the mode of 5000 elements of 64-bit f64"),
])
def test_topk_refusals_say_why(call, message):
    def fn(x, y):
        return eval(call)

    with pytest.raises(UnsupportedOp, match="topk|sort|mode") as e:
        _lowered(fn, [torch.randn(4, 8), torch.randn(2, 5000)])
    assert message in str(e.value)


def test_a_sort_stores_its_ranks_once():
    """The ranks are read at every output position's candidates: stored by their own kernel,
    not recomputed (n times) inside the selection's reduction."""
    w = Workload("ranked", Fn(lambda x: torch.sort(x, 1)).eval(), (torch.randn(4, 50),),
                 source="ranked", origin="<test>")
    loop = compile_to(w, "loop")["loop"]
    assert len(loop.kernels) == 3            # ranks, positions, values
    assert any("inside a loop it does not depend on" in n for n in loop.notes)
    assert not any("recomputed" in n for n in loop.notes)


def test_a_selection_stores_its_kth_key_once():
    """The k-th largest key (32 counts over the row) is read by both running counts and by the
    slots' counts: stored once, not run again as the prologue of each of those kernels."""
    w = Workload("selected", Fn(lambda x: torch.topk(x, 50)).eval(), (torch.randn(8, 5000),),
                 source="selected", origin="<test>")
    loop = compile_to(w, "loop")["loop"]
    text = str(loop)
    assert sum("chain of 32 reductions" in n for n in loop.notes) == 1
    assert text.count("reduce a") <= 32 + 1 + 1 + 2     # the key, the count above, the slots, ranks
    assert len(loop.kernels) <= 8


def test_topk_rounds_keep_their_kernels():
    """Each round of a top-k by rounds (as many as one program unrolls) is read by the outputs
    (a pick) and by the next round: no statistic funnels its chain alone, so none is stored
    apart (a kernel per round); and they fit one kernel, as TOPK_LIMIT promises."""
    from emmy.tensor_ir.decomp.reductions import TOPK_LIMIT

    w = Workload("rounds", Fn(lambda x: torch.topk(x, TOPK_LIMIT)).eval(),
                 (torch.randn(8, 50257),), source="rounds", origin="<test>")
    loop = compile_to(w, "loop")["loop"]
    assert not any("compute this statistic" in n for n in loop.notes)
    assert len(loop.kernels) == 1


@pytest.mark.parametrize("largest", [True, False])
def test_topk_past_its_rounds_selects_in_a_few_kernels(largest):
    """One round past what one kernel holds, topk selects (or ranks) instead of storing the
    rounds' masks between kernels (which took 2-17 kernels and 2-4x the time, modeled)."""
    from emmy.tensor_ir.decomp.reductions import TOPK_LIMIT, TOPK_SMALLEST_LIMIT

    k = (TOPK_LIMIT if largest else TOPK_SMALLEST_LIMIT) + 1
    w = Workload("past", Fn(lambda x: torch.topk(x, k, largest=largest)).eval(),
                 (torch.randn(64, 2048),), source="past", origin="<test>")
    loop = compile_to(w, "loop")["loop"]
    assert any("chain of 32 reductions" in n for n in loop.notes)     # the k-th key, selected
    assert len(loop.kernels) <= 8


def test_a_long_sort_merges_a_kernel_a_run_length():
    """8 rows of 50,257 (GPT-2's vocabulary): padded to 65,536, 16 merges, each a kernel
    reading the last, then positions and values; no n * n ranking."""
    w = Workload("merged", Fn(lambda x: torch.sort(x, 1, descending=True)).eval(),
                 (torch.randn(8, 50257),), source="merged", origin="<test>")
    loop = compile_to(w, "loop")["loop"]
    assert len(loop.kernels) == 16 + 2
    assert "reduce a" not in str(loop)
