"""Loading workload files and -c expressions; each user mistake has its own message."""

import textwrap

import pytest

from emmy.errors import UserError
from emmy.frontend.workload import load_expr, load_file, parse_sets

GOOD = """
import torch
import torch.nn as nn

batch_size = 8
dim = 16

class Model(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.RMSNorm(d)

    def forward(self, x):
        return self.norm(x)

def get_inputs():
    return [torch.randn(batch_size, dim)]

def get_init_inputs():
    return [dim]
"""


def write(tmp_path, text, name="w.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_file_builds_model_and_inputs(tmp_path):
    w = load_file(write(tmp_path, GOOD))
    assert w.name == "w"
    assert tuple(w.inputs[0].shape) == (8, 16)
    assert not w.model.training


def test_set_overrides_a_constant_before_the_model_is_built(tmp_path):
    w = load_file(write(tmp_path, GOOD), parse_sets(["batch_size=2", "dim=4"]))
    assert tuple(w.inputs[0].shape) == (2, 4)
    assert tuple(w.model.norm.weight.shape) == (4,)


def test_unknown_set_name_lists_the_constants(tmp_path):
    with pytest.raises(UserError, match="no module-level constant `batch`") as e:
        load_file(write(tmp_path, GOOD), parse_sets(["batch=2"]))
    assert "batch_size" in str(e.value)


def test_malformed_set(tmp_path):
    with pytest.raises(UserError, match="NAME=VALUE"):
        parse_sets(["batch_size"])


def test_missing_file():
    with pytest.raises(UserError, match="no such workload file"):
        load_file("/nonexistent/w.py")


def test_file_without_model(tmp_path):
    with pytest.raises(UserError, match="defines no `Model` class"):
        load_file(write(tmp_path, "def get_inputs():\n    return []\n"))


def test_syntax_error_names_the_line(tmp_path):
    with pytest.raises(UserError, match=r"w.py:2: syntax error"):
        load_file(write(tmp_path, "x = 1\ndef broken(:\n"))


def test_failing_model_constructor_names_the_line(tmp_path):
    text = GOOD.replace("super().__init__()", "super().__init__()\n        raise ValueError('boom')")
    with pytest.raises(UserError, match=r"w.py:\d+: Model\(\*get_init_inputs\(\)\) failed: ValueError: boom"):
        load_file(write(tmp_path, text))


def test_expression_workload():
    w = load_expr("nn.RMSNorm(2048)(torch.randn(32, 2048))")
    assert w.name == "rmsnorm" and tuple(w.inputs[0].shape) == (32, 2048)


def test_expression_of_a_function():
    w = load_expr("torch.exp(torch.randn(4, 4))")
    assert w.model(*w.inputs).shape == (4, 4)


def test_expression_must_be_a_call():
    with pytest.raises(UserError, match="module call"):
        load_expr("nn.RMSNorm(2048)")


def test_expression_that_fails():
    with pytest.raises(UserError, match="AttributeError"):
        load_expr("nn.Nope(3)(torch.randn(2))")
