"""Running sums and products: cumsum, reverse cumsum, exclusive cumsum and cumprod."""

import torch
import torch.nn as nn

batch_size = 32
length = 1024


class Model(nn.Module):
    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        forward = torch.cumsum(x, dim=self.dim)
        backward = torch.cumsum(x.flip(self.dim), dim=self.dim).flip(self.dim)
        exclusive = torch.cumsum(x, dim=self.dim) - x
        growth = torch.cumprod(1 + 0.001 * x, dim=self.dim)
        return forward, backward, exclusive, growth


def get_inputs():
    return [torch.randn(batch_size, length)]


def get_init_inputs():
    return [1]
