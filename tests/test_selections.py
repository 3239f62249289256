"""Outputs of positions (topk, argmax, max over a dim) are checked by the values they pick: a
near tie the reference resolved the other way passes, a wrong, repeated or unwritten position
fails, in the harness (float64 reference) and in `emmy run --check` (eager)."""

import numpy as np
import torch

from emmy.bench.harness import compare_output
from emmy.check import compare
from emmy.dtypes import DType
from emmy.selections import model_dtype, of_outputs, recording

NEXT_AFTER_ONE = 1.0 + 2 ** -23       # f32's next value after 1: 2 + 2^-23 rounds to 2


def _recorded(fn, x, own_dtype=None):
    """(outputs, their selections) of fn on x in float64, toleranced as in `own_dtype`."""
    f64, own = [], []
    with torch.no_grad(), recording(f64):
        out = fn(x.double())
    with torch.no_grad(), recording(own):
        fn(x if own_dtype is None else x.to(own_dtype))
    flat = [t for t in (out if isinstance(out, tuple) else (out,))]
    return flat, of_outputs(flat, f64, own)


def test_a_near_tie_resolved_the_other_way_passes():
    x = torch.tensor([[1.0, NEXT_AFTER_ONE, 0.5, -3.0]])
    (values, positions), (_, sel) = _recorded(lambda t: torch.topk(t + 1, 2), x)
    assert positions.tolist() == [[1, 0]]                # float64 tells them apart
    assert sel.dtype is DType.F32
    ours = torch.tensor([[0, 1]])                        # f32 rounds both to 2: lower first
    assert compare_output("i", DType.I64, ours, positions, selection=sel).ok
    assert not compare_output("i", DType.I64, ours, positions).ok     # exact without it


def test_a_wrong_repeated_or_unwritten_position_fails():
    x = torch.tensor([[1.0, NEXT_AFTER_ONE, 0.5, -3.0]])
    (_, positions), (_, sel) = _recorded(lambda t: torch.topk(t + 1, 2), x)
    wrong = compare_output("i", DType.I64, torch.tensor([[1, 2]]), positions, selection=sel)
    assert not wrong.ok and wrong.bad == 1 and "position 2 where the reference took 0" in \
        wrong.worst
    assert not compare_output("i", DType.I64, torch.tensor([[1, 1]]), positions,
                              selection=sel).ok
    poison = torch.iinfo(torch.int64).min + 7
    assert not compare_output("i", DType.I64, torch.tensor([[1, poison]]), positions,
                              selection=sel).ok


def test_argmax_and_max_over_a_dim_are_selections_too():
    x = torch.tensor([[0.25, 3.0, 3.0 + 1e-9], [2.0, -1.0, 0.0]], dtype=torch.float64)
    outs, sels = _recorded(lambda t: (t.argmax(1), torch.max(t, 0, keepdim=True).indices,
                                      torch.argmax(t)), x, torch.float32)
    assert all(s is not None for s in sels)
    assert outs[0].tolist() == [2, 0]
    assert compare_output("a", DType.I64, torch.tensor([1, 0]), outs[0], selection=sels[0]).ok
    assert not compare_output("a", DType.I64, torch.tensor([0, 0]), outs[0],
                              selection=sels[0]).ok
    assert compare_output("m", DType.I64, torch.tensor([[1, 0, 0]]), outs[1],
                          selection=sels[1]).ok
    assert compare_output("f", DType.I64, torch.tensor(1), outs[2], selection=sels[2]).ok


def test_positions_of_integers_compare_exactly():
    x = torch.tensor([[3, 7, 7, 1]])
    with recording(rec := []):
        _, positions = torch.topk(x, 1)
    sel, = of_outputs([positions], rec, floor=DType.BF16)
    assert sel.dtype is DType.I64 and positions.tolist() == [[1]]
    assert compare_output("i", DType.I64, torch.tensor([[2]]), positions, selection=sel).ok
    assert not compare_output("i", DType.I64, torch.tensor([[0]]), positions,
                              selection=sel).ok


def test_the_model_dtype_widens_the_tolerance_of_float32_values():
    # bf16 logits make f32 probabilities a bf16 rounding apart
    model = torch.nn.Linear(4, 2).to(torch.bfloat16)
    assert model_dtype(model, (torch.randn(2, 4),)) is DType.BF16
    probs = torch.tensor([[0.30, 0.301, 0.2]])
    with recording(rec := []):
        _, positions = torch.topk(probs, 1)
    assert compare_output("i", DType.I64, torch.tensor([[0]]), positions,
                          selection=of_outputs([positions], rec, floor=DType.BF16)[0]).ok
    assert not compare_output("i", DType.I64, torch.tensor([[0]]), positions,
                              selection=of_outputs([positions], rec)[0]).ok


def test_emmy_check_compares_positions_by_value_and_says_so():
    x = torch.tensor([[1.0, NEXT_AFTER_ONE, 0.5]])
    with recording(rec := []):
        _, positions = torch.topk(x.double(), 1)
    sel = of_outputs([positions], rec, floor=DType.F32)
    report = compare(["i"], [DType.I64], [np.array([[0]])], [positions], selections=sel)
    assert report.ok and report.outputs[0].reference == "eager, by the values the positions pick"
    assert not compare(["i"], [DType.I64], [np.array([[2]])], [positions], selections=sel).ok


def test_the_reference_topk_results_can_be_viewed_as_topk_results_can():
    """The reference's topk (a stable sort cut to k) returns contiguous tensors, as torch.topk
    does: CenterNet's `scores.view(batch, -1)` of topk over the last axis runs there too."""
    x = torch.randn(2, 3, 40)
    with recording():
        values, indices = torch.topk(x, 5)
    assert values.is_contiguous() and indices.is_contiguous()
    assert values.view(2, -1).shape == (2, 15)


def test_max_and_min_over_an_axis_given_as_numpy_spells_it_are_recorded():
    """`x.max(axis=1, keepdim=True)` (HQQ's quantizer) is torch's `dim`: recorded as the
    selection over that dim, not a KeyError blamed on the model."""
    x = torch.randn(4, 9)
    out, found = _recorded(lambda t: (t.max(axis=1, keepdim=True)[1], t.min(axis=0)[1]), x)
    assert [s.dim for s in found if s is not None] == [1, 0]
