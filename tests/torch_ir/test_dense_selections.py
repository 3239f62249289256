"""Selections read row by row and added back (Mixtral's per-expert loop: `torch.where` on an
expert's mask, the expert on the tokens it picks, `index_add_` into the output) compile as the
dense computation over every position the mask could select, each row it does not select
added as zeros (emmy/torch_ir/static_selections.py); checked against eager on selections other than
the exported one, and on the emulator. Anything else read from a selection stays refused."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from emmy.errors import UserError
from emmy.frontend.workload import Workload
from emmy.tensor_ir.interp import run
from emmy.tensor_ir.lower import lower
from emmy.torch_ir.capture import capture
from tests.tensor_ir.conftest import assert_matches
from tests.tensor_ir.emitted import assert_workload_cuda_matches_eager

HIDDEN, FFN, EXPERTS, TOP_K = 12, 20, 4, 2


class SparseMoe(nn.Module):
    """HF's MixtralSparseMoeBlock, as transformers writes it."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.w1 = nn.ModuleList(nn.Linear(HIDDEN, FFN, bias=False) for _ in range(EXPERTS))
        self.w2 = nn.ModuleList(nn.Linear(FFN, HIDDEN, bias=False) for _ in range(EXPERTS))
        self.w3 = nn.ModuleList(nn.Linear(HIDDEN, FFN, bias=False) for _ in range(EXPERTS))

    def forward(self, hidden_states):
        b, s, h = hidden_states.shape
        hidden_states = hidden_states.view(-1, h)
        router_logits = self.gate(hidden_states)
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected = torch.topk(routing_weights, TOP_K, dim=-1)
        routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        final = torch.zeros((b * s, h), dtype=hidden_states.dtype)
        expert_mask = F.one_hot(selected, num_classes=EXPERTS).permute(2, 1, 0)
        for e in range(EXPERTS):
            idx, top_x = torch.where(expert_mask[e])
            current = hidden_states[None, top_x].reshape(-1, h)
            out = self.w2[e](F.silu(self.w1[e](current)) * self.w3[e](current))
            final.index_add_(0, top_x, out * routing_weights[top_x, idx, None])
        return final.reshape(b, s, h), router_logits


def _agrees_on_other_inputs(model, example, others):
    """The program captured at `example` gives eager's outputs on each of `others` (other
    selections: other counts per expert), in the Tensor IR interpreter."""
    graph = capture(model, example)
    program = lower(graph)
    for inputs in others:
        got = run(program, {p.name: v for p, v in zip(graph.inputs, inputs)})
        with torch.no_grad():
            want = model(*inputs)
        for g, w in zip(got, want if isinstance(want, tuple) else (want,)):
            assert_matches(g, w)


def test_mixtral_s_expert_loop_is_the_dense_computation():
    torch.manual_seed(0)
    model = SparseMoe().eval()
    others = [(torch.randn(2, 7, HIDDEN),) for _ in range(3)]
    others.append((torch.zeros(2, 7, HIDDEN),))       # every token routed alike: some unused
    _agrees_on_other_inputs(model, (torch.randn(2, 7, HIDDEN),), others)
    assert_workload_cuda_matches_eager(Workload("moe", model, (torch.randn(2, 7, HIDDEN),),
                                                "", "<test>"))


def test_positions_from_nonzero_and_a_column_of_them():
    """`torch.nonzero(mask)` (a row per selected position, a column per axis) read by column."""
    class Pairs(nn.Module):
        def forward(self, x, w, mask):
            nz = torch.nonzero(mask)
            rows, cols = nz[:, 0], nz[:, 1]
            return torch.zeros_like(x).index_add_(0, rows, x[rows] * w[rows, cols, None])

    example = (torch.randn(6, 5), torch.randn(6, 3), torch.rand(6, 3) > 0.5)
    others = [(torch.randn(6, 5), torch.randn(6, 3), torch.rand(6, 3) > p) for p in (0.2, 0.9)]
    _agrees_on_other_inputs(Pairs(), example, others)


def test_a_row_not_selected_adds_nothing_even_where_it_is_not_finite():
    """A row computed for a position the mask does not hold is selected away, not multiplied
    by zero: an expert's infinite output on a token it was not given adds nothing."""
    class Log(nn.Module):
        def forward(self, x, mask):
            (rows,) = torch.where(mask)
            return torch.zeros_like(x).index_add_(0, rows, torch.log(x[rows]))

    x = torch.tensor([[1.0, 2.0], [0.0, -1.0], [3.0, 4.0]])
    _agrees_on_other_inputs(Log(), (x, torch.tensor([True, False, True])),
                            [(x, torch.tensor([True, False, True])),
                             (x, torch.tensor([False, False, True]))])


def test_a_selection_read_otherwise_stays_refused():
    """A sum over the selected rows is not an index_add: the selection is refused as before."""
    class Total(nn.Module):
        def forward(self, x, mask):
            (rows,) = torch.where(mask)
            return x[rows].sum(0)

    with pytest.raises(UserError, match=r"data-dependent shape \(u0\)"):
        capture(Total(), (torch.randn(4, 3), torch.tensor([True, False, True, True])))


class InfoNce(nn.Module):
    """sthalles/SimCLR's info_nce_loss as written: a labels matrix and an eye mask made from
    nothing the model takes, the similarity matrix selected through them."""

    def forward(self, features):
        labels = torch.cat([torch.arange(4) for _ in range(2)], dim=0)
        labels = (labels.unsqueeze(0) == labels.unsqueeze(1)).float()
        features = F.normalize(features, dim=1)
        similarity = features @ features.T
        mask = torch.eye(labels.shape[0], dtype=torch.bool)
        labels = labels[~mask].view(labels.shape[0], -1)
        similarity = similarity[~mask].view(similarity.shape[0], -1)
        positives = similarity[labels.bool()].view(labels.shape[0], -1)
        negatives = similarity[~labels.bool()].view(similarity.shape[0], -1)
        logits = torch.cat([positives, negatives], dim=1) / 0.07
        return F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long)), logits


def test_a_mask_made_of_constants_selects_a_known_count():
    """A mask computed from no input (torch.eye, and a labels matrix from arange, and a
    selection of it through such a mask) is evaluated when compiling: its positions become
    constants, and what follows (`.view(N, -1)`) has a static shape."""
    torch.manual_seed(0)
    _agrees_on_other_inputs(InfoNce(), (torch.randn(8, 16),),
                            [(torch.randn(8, 16),) for _ in range(2)])
    assert_workload_cuda_matches_eager(Workload("info_nce", InfoNce(), (torch.randn(8, 16),),
                                                "", "<test>"))


class CorrelatedSamples(nn.Module):
    """Spijkervet/SimCLR's mask_correlated_samples called in forward, and a mask written
    element by element (chingyaoc/DCL's get_negative_mask): the writes into the constant mask
    decide which elements it selects."""

    def forward(self, z):
        n = z.shape[0]
        mask = torch.ones((n, n), dtype=torch.bool)
        mask = mask.fill_diagonal_(0)
        for i in range(n // 2):
            mask[i, n // 2 + i] = 0
            mask[n // 2 + i, i] = 0
        sim = z @ z.T
        single = torch.ones(4, 4, dtype=torch.bool)
        single[0, 1] = False
        return sim[mask].view(n, -1), z[:4, :4][single]


def test_writes_into_a_constant_mask_decide_what_it_selects():
    """Folding the mask as torch.ones made it (the writes, copy_ into views of it, unread)
    selected every element: now the program is functionalized first and the written mask folds."""
    torch.manual_seed(0)
    model = CorrelatedSamples()
    inputs = (torch.randn(8, 6),)
    graph = capture(model, inputs)
    got = run(lower(graph), {p.name: v for p, v in zip(graph.inputs, inputs)})
    assert [g.shape for g in got] == [(8, 6), (15,)]
    _agrees_on_other_inputs(model, inputs, [(torch.randn(8, 6),) for _ in range(2)])
    assert_workload_cuda_matches_eager(Workload("correlated", model, inputs, "", "<test>"))



class LabelRows(nn.Module):
    """A positives mask filled row by row from the labels (batch-hard triplet mining written as
    a loop): its writes read an input, so the mask is not a constant, and the sum over what it
    selects is the masked sum."""

    def forward(self, dist, labels):
        mask = torch.zeros(8, 8, dtype=torch.bool)
        for i in range(8):
            mask[i] = labels == labels[i]
        return dist[mask].sum()


def test_a_mask_written_from_the_inputs_is_not_folded_as_its_factory_made_it():
    torch.manual_seed(0)
    inputs = (torch.rand(8, 8), torch.randint(0, 3, (8,)))
    _agrees_on_other_inputs(LabelRows(), inputs,
                            [(torch.rand(8, 8), torch.randint(0, 3, (8,))) for _ in range(3)])


class SimclrMasks(nn.Module):
    """leftthomas/SimCLR's mask, `(torch.ones_like(sim) - torch.eye(n)).bool()`, through
    masked_select; Barlow Twins' `c[~eye] *= lam`; and a masked_select through an input's mask."""

    def forward(self, x, keep):
        sim = torch.exp(x @ x.t())
        mask = (torch.ones_like(sim) - torch.eye(8)).bool()
        c = x @ x.t()
        c[~torch.eye(8, dtype=torch.bool)] *= 0.5
        return sim.masked_select(mask).view(8, -1), sim[mask].view(8, -1), c, \
            x.masked_select(keep).sum()


def test_constant_masks_through_masked_select_ones_like_and_a_masked_update():
    torch.manual_seed(0)
    inputs = (torch.randn(8, 4), torch.rand(8, 4) > 0.5)
    _agrees_on_other_inputs(SimclrMasks(), inputs,
                            [(torch.randn(8, 4), torch.rand(8, 4) > 0.5) for _ in range(2)])
    assert_workload_cuda_matches_eager(Workload("simclr_masks", SimclrMasks(), inputs, "",
                                                "<test>"))
