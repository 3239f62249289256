"""RMSNorm over the last dimension: x * rsqrt(mean(x^2) + eps) * weight (nn.RMSNorm(2048))."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 32
dim = 2048


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (self.dim,), self.weight)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
