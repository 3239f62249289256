"""torch.export capture into Torch IR: a 1:1 mirror, parameters as load(...), clear failures."""

import textwrap

import pytest
import torch
import torch.nn as nn

from emmy.errors import UserError
from emmy.frontend.workload import load_expr, load_file
from emmy.torch_ir.capture import capture
from emmy.torch_ir.ir import InputKind
from emmy.torch_ir.printer import print_graph


def test_rmsnorm_is_one_op_and_its_weight_a_load():
    w = load_expr("nn.RMSNorm(2048)(torch.randn(32, 2048))")
    g = capture(w.model, w.inputs, name=w.name)
    assert [n.op for n in g.nodes] == ["rms_norm"]
    text = print_graph(g)
    assert 'weight = load("weight") : f32[2048]' in text
    assert "rms_norm = rms_norm(x, [2048], weight) : f32[32,2048]" in text
    assert g.values["weight"].shape == (2048,)


def test_printout_is_deterministic():
    w = load_expr("nn.Linear(3, 2)(torch.randn(4, 3))")
    assert print_graph(capture(w.model, w.inputs)) == print_graph(capture(w.model, w.inputs))


def test_buffers_and_multiple_outputs():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("shift", torch.ones(4))

        def forward(self, x):
            y = x + self.shift
            return y.max(dim=1), y

    g = capture(M(), (torch.randn(2, 4),))
    kinds = {p.name: p.kind for p in g.placeholders}
    assert kinds["shift"] is InputKind.BUFFER
    assert len(g.outputs) == 3  # values, indices, y


def test_source_line_points_into_the_workload_file(tmp_path):
    path = tmp_path / "w.py"
    path.write_text(textwrap.dedent("""
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, x):
                return torch.exp(-x)

        def get_inputs():
            return [torch.randn(4, 4)]

        def get_init_inputs():
            return []
    """))
    w = load_file(path)
    g = capture(w.model, w.inputs, origin=str(path))
    assert g.nodes[-1].source == "w.py:7: return torch.exp(-x)"


def test_data_dependent_shape_is_a_user_error():
    class M(nn.Module):
        def forward(self, x):
            return x[x > 0]

    with pytest.raises(UserError, match="data-dependent"):
        capture(M(), (torch.randn(8),))


def test_export_failure_is_a_user_error():
    class M(nn.Module):
        def forward(self, x):
            return x.numpy()

    with pytest.raises(UserError, match="torch.export failed"):
        capture(M(), (torch.randn(8),))


def test_non_tensor_output_is_refused():
    class M(nn.Module):
        def forward(self, x):
            return x.shape[0]

    with pytest.raises(UserError):
        capture(M(), (torch.randn(8),))
