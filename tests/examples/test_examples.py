"""Every workload in examples/: the Tensor IR interpreter matches the module's eager output."""

from pathlib import Path

import numpy as np
import pytest
import torch

from emmy.check import run_eager
from emmy.dtypes import from_torch, tolerance
from emmy.frontend.workload import load_file
from emmy.tensor_ir.interp import run
from emmy.tensor_ir.lower import lower
from emmy.torch_ir.capture import capture

EXAMPLES = sorted(Path(__file__).resolve().parents[2].joinpath("examples").glob("*.py"))


def _flat(value):
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    return [value]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_matches_eager(path):
    workload = load_file(path)
    graph = capture(workload.model, workload.inputs, name=workload.name, origin=str(path))
    program = lower(graph)
    got = run(program, {p.name: v for p, v in zip(graph.inputs, workload.inputs)})
    with torch.no_grad():
        want = _flat(run_eager(workload.model, workload.inputs))   # ties as emmy breaks them
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        atol, rtol = tolerance(from_torch(w.dtype))
        np.testing.assert_allclose(g, w.float().numpy() if w.dtype == torch.bfloat16
                                   else w.numpy(), atol=atol, rtol=rtol,
                                   err_msg=f"{path.name}: output {i}")


def test_examples_cover_every_family():
    names = {p.stem for p in EXAMPLES}
    assert {"rmsnorm", "layernorm", "softmax", "log_softmax", "elementwise_chain", "activations",
            "reductions", "norms", "matmul", "bmm", "linear", "matvec", "mlp", "chained_matmul",
            "attention", "scan", "losses", "transpose", "pooling", "conv"} <= names


def test_sizes_can_be_overridden():
    path = next(p for p in EXAMPLES if p.stem == "attention")
    workload = load_file(path, sets=(("seq_len", 16),))
    program = lower(capture(workload.model, workload.inputs))
    assert program.get(program.outputs[0]).type.shape == (2, 4, 16, 32)
