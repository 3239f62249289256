"""Normalizations and vector norms against eager PyTorch."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F


def _randomized(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p))
        for name, buf in module.named_buffers():
            if buf.is_floating_point():
                buf.copy_(torch.rand_like(buf) + 0.5 if "var" in name else torch.randn_like(buf))
    return module


MODULES = {
    "rms_norm": (lambda: nn.RMSNorm(16), (4, 16)),
    "rms_norm_eps_2d": (lambda: nn.RMSNorm((3, 16), eps=1e-3), (4, 3, 16)),
    "rms_norm_no_weight": (lambda: nn.RMSNorm(16, elementwise_affine=False), (4, 16)),
    "layer_norm": (lambda: nn.LayerNorm(16), (2, 4, 16)),
    "layer_norm_2d": (lambda: nn.LayerNorm((4, 16)), (2, 4, 16)),
    "batch_norm_1d": (lambda: nn.BatchNorm1d(6), (4, 6)),
    "batch_norm_2d": (lambda: nn.BatchNorm2d(6), (2, 6, 3, 5)),
    "instance_norm": (lambda: nn.InstanceNorm2d(6, affine=True), (2, 6, 3, 5)),
    "instance_norm_plain": (lambda: nn.InstanceNorm1d(6), (2, 6, 9)),
    "group_norm": (lambda: nn.GroupNorm(3, 6), (2, 6, 3, 5)),
}

FUNCTIONS = {
    "l2_normalize": lambda x: F.normalize(x, dim=1),
    "l1_normalize": lambda x: F.normalize(x, p=1, dim=-1),
    "frobenius": lambda x: torch.norm(x, "fro"),
    "frobenius_div": lambda x: x / torch.norm(x, p="fro"),
    "vector_norm_inf": lambda x: torch.linalg.vector_norm(x, float("inf"), dim=1),
    "vector_norm_3": lambda x: torch.linalg.vector_norm(x, 3, dim=(0, 1)),
    "vector_norm_0": lambda x: torch.linalg.vector_norm(x.relu(), 0, dim=1),
    "cosine_similarity": lambda x: F.cosine_similarity(x, x.flip(0)),
}


@pytest.mark.parametrize("name", MODULES)
def test_norm_module(check, name):
    make, shape = MODULES[name]
    check(_randomized(make()), torch.randn(shape) * 3 + 1)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_norm_function(check, name):
    check(FUNCTIONS[name], torch.randn(4, 6, 5))


def test_batch_norm_in_training_mode_uses_batch_statistics(check):
    weight, bias = torch.rand(6) + 0.5, torch.randn(6)
    check(lambda x: F.batch_norm(x, None, None, weight, bias, training=True), torch.randn(8, 6))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_norms_compute_in_f32(check, dtype):
    model = _randomized(nn.LayerNorm(64)).to(dtype)
    program = check(model, torch.randn(4, 64).to(dtype))
    casts = [d for d in program.defs if type(d).__name__ == "Cast"]
    assert {str(d.type.dtype) for d in casts} == {"f32", str(program.get(program.outputs[0]).type.dtype)}
