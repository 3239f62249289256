"""Masked updates and reductions of masked values (emmy/torch_ir/masked.py): `x[mask] -= 1`,
`loss[labels != -100].mean()` have static shapes, and are rewritten before mirroring so that no
data-dependent gather is left; each rewrite is checked against eager on random data and masks
(the Tensor IR interpreter), and a sample through the emitted CUDA on the emulator."""

import pytest
import torch
import torch.nn as nn

from emmy.errors import UserError
from emmy.frontend.workload import Workload
from emmy.tensor_ir.interp import run
from emmy.tensor_ir.lower import lower
from emmy.torch_ir.capture import capture
from tests.tensor_ir.emitted import assert_workload_cuda_matches_eager


class Body(nn.Module):
    """`body`: statements over x (6 x 5 floats), n (6 x 5 integers), labels (6,) and w (5,),
    assigning `out` (a tuple of tensors)."""

    def __init__(self, body: str):
        super().__init__()
        self.body = body

    def forward(self, x, n, labels, w):
        scope = {"x": x, "n": n, "labels": labels, "w": w}
        exec(compile(self.body, "<body>", "exec"), {"torch": torch}, scope)
        return scope["out"]


BODIES = {
    "mean_of_selected": "out = ((x.float() ** 2)[labels != -100].mean(),)",
    "sum_rows_selected": "out = ((x * w)[labels > 2].sum(0), x[labels > 2].sum())",
    "mean_over_axes": "out = (x[labels >= 0].mean((0, 1)), x[labels >= 0].mean(0))",
    "extremes": "out = (x[x > 0.5].max(), n[n != 3].min(), x[labels > 0].amax(0), "
                "n[labels > 0].amin((0, 1)))",
    "integer_update": "y = n.clone()\ny[(x > 0) & (n == 3)] -= 1\nout = (y,)",
    "update_from_other": "y = x * 2\ny[n > 4] = (x[n > 4] * 3 + n[n > 4]).clamp(max=4)\n"
                         "out = (y,)",
    "rows_update": "y = x.clone()\ny[labels == 1] *= w\ny[labels < 0] = x[labels < 0] - 1\n"
                   "out = (y,)",
    "update_then_reduce": "y = x.clone()\ny[y < 0] = 0\nout = (y, y[labels != 0].mean())",
    # the spread of the valid pixels' flow errors (KITTI's metrics), each Bessel correction
    "spreads": "out = (x[x > 0].std(), x[x > 0].var(unbiased=False), "
               "torch.std(x[labels > 0], correction=0), x[labels >= 0].std(dim=0), "
               "x[labels >= 0].var(0, correction=2), (x[n > 2] * 2 + 1).var(), "
               "x[labels > 0].std((0, 1)))",
    # KITTI's outlier rate: a count over the selection's length (torch.export itself refuses
    # `len(e)`, a Python int)
    "lengths": "e = x[labels > 0]\nf = x[x > 0.3]\nout = ((e > 0).sum() / e.numel(), "
               "e.sum() / e.shape[0], (f * 2).sum() / f.numel())",
    # the median flow error over valid pixels: torch's lower median, NaN where one is NaN
    "medians": "out = (torch.median(x[labels > 0]), x[x > 0.2].median(), n[n != 3].median(), "
               "(x[labels >= 0] * w).median(), torch.where(n == 5, float('nan'), x)[x > 0]"
               ".median(), torch.where(n == 5, float('nan'), x)[labels > 5].median())",
}


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(-1, 4, (6,), generator=g)
    labels[seed % 6] = 1          # some row selected
    labels[(seed + 1) % 6] = 3
    return (torch.randn(6, 5, generator=g), torch.randint(0, 8, (6, 5), generator=g), labels,
            torch.randn(5, generator=g))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", BODIES)
def test_rewritten_programs_match_eager_on_random_masks(name, seed):
    model = Body(BODIES[name])
    graph = capture(model, _inputs(seed))
    assert not any(n.op == "index.Tensor" for n in graph.nodes)       # no gather is left
    # the graph's ops on other masks and values than the ones it was exported with
    inputs = _inputs(seed + 100)
    got = run(lower(graph), {p.name: v for p, v in zip(graph.inputs, inputs)})
    for out, want in zip(got, model(*inputs)):
        torch.testing.assert_close(torch.from_numpy(out).reshape(want.shape), want,
                                   equal_nan=True)


@pytest.mark.parametrize("name", ["mean_of_selected", "extremes", "update_from_other",
                                  "spreads", "medians", "lengths"])
def test_emitted_cuda_matches_eager(name):
    w = Workload(name, Body(BODIES[name]), _inputs(0), source=BODIES[name], origin="<test>")
    assert_workload_cuda_matches_eager(w)


@pytest.mark.parametrize("body", [
    "s = x[x > 0]\ny = x.clone()\ny[x > 0] = s * 2\nout = (y, s)",        # the selection kept
    "out = (x[x > 0].cumsum(0)[:1],)",                                   # not elementwise
    "out = (x[x > 0].sum(0, keepdim=True),)",                            # keeps the axis
    "out = (x[labels > 0].sum(1),)",                                     # a length per row
    "out = (x[labels > 0].std(1),)",
    "out = (torch.nanmedian(x[x > 0]),)",
    "y = x.clone()\ny[torch.rand_like(x) > 0.5] = x[torch.rand_like(x) > 0.5]\nout = (y,)",
])
def test_selections_the_rewrite_cannot_remove_stay_refused(body):
    with pytest.raises(UserError, match="data-dependent shape"):
        capture(Body(body), _inputs(0))


def test_a_masked_update_of_a_model_input_is_written_back():
    class OnInput(nn.Module):
        def forward(self, x):
            x[x > 0] -= 1
            return x * 2

    g = capture(OnInput(), (torch.randn(4, 4),))
    assert g.updates == ("input:0",) and len(g.outputs) == 2
