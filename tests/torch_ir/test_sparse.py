"""A constant sparse matrix (LightGCN's normalized adjacency, a COO attribute) times a dense one:
ELLPACK arrays of the constant, and the product as a gather, a multiply and a sum, against
eager through the Tensor IR interpreter and the emitted CUDA on the emulator."""

import pytest
import torch
import torch.nn as nn

from emmy.errors import UserError
from emmy.frontend.workload import Workload
from emmy.tensor_ir.interp import run
from emmy.tensor_ir.lower import lower
from emmy.torch_ir.capture import capture
from emmy.torch_ir.sparse import ellpack
from tests.tensor_ir.emitted import assert_workload_cuda_matches_eager


def _graph(n: int = 9, edges: int = 20, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    index = torch.randint(0, n, (2, edges), generator=g)      # repeats: coalesced, summed
    index[:, 0] = torch.tensor([n - 1, 0])
    return torch.sparse_coo_tensor(index, torch.rand(edges, generator=g), (n, n),
                                   check_invariants=True).coalesce()


class Propagate(nn.Module):
    """LightGCN's propagation: x, then G x twice, averaged; `@` and torch.mm too."""

    def __init__(self, graph):
        super().__init__()
        self.graph = graph

    def forward(self, x):
        h1 = torch.sparse.mm(self.graph, x)
        with torch.no_grad():                   # a region reads the constant too
            h2 = self.graph @ h1
        return (x + h1 + h2) / 3, torch.mm(self.graph, x * 2)


def test_ellpack_holds_each_row_s_nonzeros_padded():
    graph = _graph()
    columns, values = ellpack(graph)
    dense = torch.zeros(graph.shape).scatter_add_(1, columns, values)
    torch.testing.assert_close(dense, graph.to_dense())
    assert columns.shape[1] == int(torch.bincount(graph.indices()[0]).max())


def test_a_sparse_constant_times_a_dense_matrix_matches_eager():
    model, x = Propagate(_graph()).eval(), torch.randn(9, 5)
    graph = capture(model, (x,))
    assert "_sparse_mm" not in [n.op for n in graph.nodes]
    got = run(lower(graph), {"x": x})
    for out, want in zip(got, model(x)):
        torch.testing.assert_close(torch.from_numpy(out), want, rtol=1e-5, atol=1e-6)
    assert_workload_cuda_matches_eager(Workload("propagate", model, (x,), "", "<test>"))


def test_other_uses_of_a_sparse_constant_are_refused_by_name():
    class Dense(nn.Module):
        def __init__(self):
            super().__init__()
            self.graph = _graph()

        def forward(self, x):
            return x @ self.graph.to_dense()

    with pytest.raises(UserError, match="reads a sparse constant; emmy multiplies one by a "
                                        "dense matrix"):
        capture(Dense(), (torch.randn(4, 9),))
