"""Two chained matrix products O = (A @ B) @ C; the intermediate H = A @ B is 4 KiB."""

import torch
import torch.nn as nn

M = 32
K = 64
N = 32
P = 16


class Model(nn.Module):
    def forward(self, a, b, c):
        return (a @ b) @ c


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N), torch.randn(N, P)]


def get_init_inputs():
    return []
