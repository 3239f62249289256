"""A plain matrix product C = A @ B."""

import torch
import torch.nn as nn

M = 128
K = 256
N = 128


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
