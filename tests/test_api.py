"""`emmy.compile`: compiles with tuned rows; runs eagerly where there is no GPU."""

import torch
import torch.nn as nn

import emmy
from emmy.runtime.gpu import gpu_available


def test_compile_returns_a_callable_that_matches_eager():
    model = nn.RMSNorm(64)
    x = torch.randn(4, 64)
    compiled = emmy.compile(model, x)
    assert list(compiled.rows) == ["k0_rmsnorm"]
    assert repr(compiled).startswith("<emmy.Compiled rmsnorm for sm_90a: 1 kernel(s), backend")
    assert f"\n  k0_rmsnorm: {compiled.rows['k0_rmsnorm']}" in repr(compiled)
    assert "__global__" in compiled.source
    out = compiled(x)
    torch.testing.assert_close(out.cpu(), model(x).detach(), atol=1e-4, rtol=1e-4)
    if not gpu_available():
        assert compiled.backend.startswith("eager")
