"""`emmy.compile`: compiles with tuned rows; runs eagerly where there is no GPU."""

import pytest
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


def test_run_emulate_runs_the_kernels_on_the_cpu():
    """run=emulate runs the emitted CUDA on the CPU emulator (not eager): new outputs each
    call, in the model's dtype."""
    model = nn.LayerNorm(32).to(torch.bfloat16)
    x = torch.randn(4, 32).to(torch.bfloat16)
    compiled = emmy.compile(model, x, db=None, run="emulate")
    assert compiled.backend.startswith("cpu emulator")
    out = compiled(x)
    assert out.dtype == torch.bfloat16 and out is not compiled(x)
    torch.testing.assert_close(out, model(x).detach(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("run, message", [
    ("fast", "run must be one of auto, gpu, emulate, eager"),
    pytest.param("gpu", "no CUDA GPU is available here", marks=pytest.mark.skipif(
        gpu_available(), reason="a GPU is here")),
])
def test_bad_runs_say_what_is_accepted(run, message):
    from emmy.errors import UserError

    with pytest.raises(UserError, match=message):
        emmy.compile(nn.RMSNorm(8), torch.randn(2, 8), run=run)


def test_run_eager_compiles_but_runs_the_model():
    model = nn.RMSNorm(8)
    x = torch.randn(2, 8)
    compiled = emmy.compile(model, x, db=None, run="eager")
    assert compiled.backend == "eager torch (asked for)" and compiled.rows
    torch.testing.assert_close(compiled(x), model(x).detach())


def test_a_model_in_training_mode_is_compiled_as_it_trains():
    """rl_games' RunningMeanStd and BatchNorm update their running statistics when training:
    emmy.compile compiles the model in its own mode (it did switch it to eval, silently), and
    a dropout in training mode is refused by name."""
    import copy

    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU()).train()
    eager = copy.deepcopy(model)
    compiled = emmy.compile(model, torch.randn(5, 6), db=None, run="emulate")
    assert model.training
    for i in range(3):
        x = torch.randn(5, 6, generator=torch.Generator().manual_seed(i))
        torch.testing.assert_close(compiled(x), eager(x).detach())
    torch.testing.assert_close(model[1].running_var, eager[1].running_var)
    assert int(model[1].num_batches_tracked) == int(eager[1].num_batches_tracked) == 3
    with pytest.raises(emmy.errors.UserError, match="dropout in training mode"):
        emmy.compile(nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.1)), torch.randn(5, 6))


def test_eager_runs_make_device_less_tensors_on_the_inputs_device():
    """A forward that makes a tensor without naming a device (torch.hann_window for stft) runs
    on the inputs' device, as on a GPU; checked here with the meta device."""
    import torch

    from emmy.check import run_eager

    out = run_eager(lambda x: x * torch.arange(4.0), (torch.empty(3, 4, device="meta"),))
    assert out.device.type == "meta" and out.shape == (3, 4)
    cpu = run_eager(lambda x: x * torch.arange(4.0), (torch.ones(2, 4),))
    assert torch.equal(cpu, torch.arange(4.0).expand(2, 4))
