"""Half-precision rows: RMSNorm in bf16 and softmax in f16 (both compute in f32 inside)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16
dim = 1024


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.weight = nn.Parameter(torch.rand(dim, dtype=torch.bfloat16) + 0.5)

    def forward(self, x, y):
        return F.rms_norm(x, (self.dim,), self.weight), torch.softmax(y, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, dim, dtype=torch.bfloat16),
            torch.randn(batch_size, dim, dtype=torch.float16)]


def get_init_inputs():
    return [dim]
