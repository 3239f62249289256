"""A bf16 projection of a batch of sequences with a fused epilogue: x @ W^T + b, GELU, then a
residual add. The weight is read transposed (k-contiguous) and shared by every batch."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 2
seq_len = 64
features = 96


class Model(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.proj = nn.Linear(features, features).to(torch.bfloat16)

    def forward(self, x):
        return x + F.gelu(self.proj(x))


def get_inputs():
    return [torch.randn(batch_size, seq_len, features, dtype=torch.bfloat16)]


def get_init_inputs():
    return [features]
