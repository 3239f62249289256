"""A matrix-vector product y = A @ x."""

import torch
import torch.nn as nn

M = 1024
K = 2048


class Model(nn.Module):
    def forward(self, a, x):
        return torch.matmul(a, x)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K)]


def get_init_inputs():
    return []
