"""A batched matrix product C[b] = A[b] @ B[b]."""

import torch
import torch.nn as nn

batch_size = 8
M = 64
K = 64
N = 64


class Model(nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)


def get_inputs():
    return [torch.randn(batch_size, M, K), torch.randn(batch_size, K, N)]


def get_init_inputs():
    return []
