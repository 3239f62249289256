"""Loading workload files and -c expressions; each user mistake has its own message."""

import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

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


def test_the_file_runs_as_a_module_importable_by_name(tmp_path):
    """torch.export imports the module of a function it traces by name (flex_attention's
    score_mod): the file's module is registered while its model is used."""
    import importlib

    w = load_file(write(tmp_path, GOOD))
    module = importlib.import_module(type(w.model).__module__)
    assert module.Model is type(w.model) and module.dim == 16


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


def test_failing_get_init_inputs_names_the_line(tmp_path):
    text = GOOD.replace("def get_init_inputs():\n    return [dim]",
                        "def get_init_inputs():\n    return [undefined_size]")
    assert text != GOOD
    with pytest.raises(UserError, match=r"w.py:\d+: get_init_inputs\(\) failed: NameError"):
        load_file(write(tmp_path, text))


def test_expression_workload():
    w = load_expr("nn.RMSNorm(2048)(torch.randn(32, 2048))")
    assert w.name == "rmsnorm" and tuple(w.inputs[0].shape) == (32, 2048)


def test_expression_of_a_function():
    w = load_expr("torch.exp(torch.randn(4, 4))")
    assert w.model(*w.inputs).shape == (4, 4)


def test_expression_with_keyword_arguments():
    w = load_expr("F.softmax(torch.randn(3, 5, 7), dim=1)")
    assert w.name == "softmax"
    (x,) = w.inputs
    torch.testing.assert_close(w.model(x), torch.softmax(x, dim=1))


def test_expression_with_operators_and_two_inputs():
    w = load_expr("torch.randn(64, 32) @ torch.randn(16, 32).T + 1")
    a, b = w.inputs
    assert w.name == "add" and tuple(b.shape) == (16, 32)
    torch.testing.assert_close(w.model(a, b), a @ b.T + 1)


def test_expression_modules_are_submodules_built_once():
    w = load_expr("F.gelu(nn.Linear(8, 16)(torch.randn(4, 8))) + nn.Linear(8, 16)(torch.randn(4, 8))")
    names = sorted(n for n, _ in w.model.named_parameters())
    assert names == ["linear.bias", "linear.weight", "linear_1.bias", "linear_1.weight"]
    a, b = w.inputs
    lin, lin1 = w.model.linear, w.model.linear_1
    torch.testing.assert_close(w.model(a, b), F.gelu(lin(a)) + lin1(b))
    again = load_expr("F.gelu(nn.Linear(8, 16)(torch.randn(4, 8))) + nn.Linear(8, 16)(torch.randn(4, 8))")
    assert torch.equal(again.model.linear.weight, lin.weight)   # seeded: the same weights


def test_expression_dtype_conversions_stay_with_inputs_and_modules():
    w = load_expr("nn.Linear(64, 32).half()(torch.randn(8, 64).half())")
    assert w.name == "linear" and w.inputs[0].dtype == torch.float16
    assert isinstance(w.model, nn.Linear) and w.model.weight.dtype == torch.float16
    w = load_expr("torch.exp(torch.randn(4, 4).to(torch.bfloat16))")
    assert w.inputs[0].dtype == torch.bfloat16
    # eval() / train(False) chained as well: the module is built with them, not converted in
    # the forward (which torch.export refused: "Couldn't swap ... weight")
    w = load_expr("nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval().half()"
                  "(torch.randn(2, 4, 16).half())")
    assert isinstance(w.model, nn.TransformerEncoderLayer) and not w.model.training
    assert w.model.linear1.weight.dtype == torch.float16
    from emmy.pipeline import compile_to

    assert compile_to(w, "tensor")["tensor"].outputs


def test_expression_module_names_skip_chained_modes_and_module_attributes():
    # `.eval()` chained on a module used inside a larger expression: the submodule is named
    # after its class, not after `eval` (which nn.Module already has: add_module refused it)
    w = load_expr("nn.MultiheadAttention(16, 2, batch_first=True).eval()(torch.randn(2, 4, 16), "
                  "torch.randn(2, 4, 16), torch.randn(2, 4, 16))[0]")
    assert isinstance(w.model.multiheadattention, nn.MultiheadAttention)
    q, k, v = w.inputs
    torch.testing.assert_close(w.model(q, k, v), w.model.multiheadattention(q, k, v)[0])
    # a name nn.Module already has (a method, an attribute) takes a suffix, as a repeat does
    import ast

    from emmy.frontend.workload import _module_name

    call = ast.parse("nn.Train(4).half()", mode="eval").body
    assert _module_name(call, {}) == "train_1"
    assert _module_name(call, {"train_1": None}) == "train_2"


def test_expression_inputs_are_fresh_on_demand():
    w = load_expr("torch.relu(torch.randn(16))")
    (fresh,) = w.make_inputs()
    assert fresh.shape == (16,) and not torch.equal(fresh, w.inputs[0])


def test_expression_operations_on_inputs_are_the_programs():
    w = load_expr("torch.relu(torch.randn(8, 4) @ torch.randn(4, 3))")
    assert [tuple(x.shape) for x in w.inputs] == [(8, 4), (4, 3)]


def test_expression_a_functions_arguments_built_from_factories_alone_are_one_input():
    w = load_expr("(lambda m, x: torch.where(m, x, 0.0))(torch.rand(4, 4) < 0.5, "
                  "torch.randn(4, 4))")
    mask, x = w.inputs
    assert mask.dtype == torch.bool and x.dtype == torch.float32
    torch.testing.assert_close(w.model(mask, x), torch.where(mask, x, 0.0))
    # a function's body stays the forward's: its factories are not inputs
    w = load_expr("(lambda x: x * torch.ones(4))(torch.randn(2, 4))")
    assert len(w.inputs) == 1
    torch.testing.assert_close(w.model(w.inputs[0]), w.inputs[0])


def test_expression_input_keeps_its_name_where_the_expression_binds_x():
    w = load_expr("sum([x * torch.randn(3) for x in range(3)])")
    (y,) = w.inputs
    torch.testing.assert_close(w.model(y), 3 * y)


def test_expression_without_input():
    with pytest.raises(UserError, match="no tensor input"):
        load_expr("nn.ReLU()(torch.Size([2]))")


def test_expression_with_an_unknown_name():
    with pytest.raises(UserError, match="`x` is not defined"):
        load_expr("nn.ReLU()(x)")


def test_expression_that_only_makes_an_input():
    with pytest.raises(UserError, match="only makes an input"):
        load_expr("torch.randn(3)")


def test_expression_whose_call_fails_names_the_error():
    with pytest.raises(UserError, match=r"evaluating .* failed: RuntimeError: .*\[4, 3\] X \[4, 3\]"):
        load_expr("torch.randn(4, 3) @ torch.randn(4, 3)")


def test_expression_must_be_a_call():
    with pytest.raises(UserError, match="module call"):
        load_expr("nn.RMSNorm(2048)")


def test_expression_that_fails():
    with pytest.raises(UserError, match="AttributeError"):
        load_expr("nn.Nope(3)(torch.randn(2))")
