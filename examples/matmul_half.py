"""A half-precision matrix product at a ragged size (no dimension a multiple of 8): tensor-core
rows must predicate every edge, and rows whose 16-byte copies would be misaligned are illegal."""

import torch
import torch.nn as nn

M = 127
K = 63
N = 255
dtype = "float16"      # or "bfloat16"


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    t = getattr(torch, dtype)
    return [torch.randn(M, K).to(t), torch.randn(K, N).to(t)]


def get_init_inputs():
    return []
