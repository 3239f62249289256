"""Reductions along different dimensions: sum, mean, max, min, prod, argmax, argmin."""

import torch
import torch.nn as nn

batch_size = 16
rows = 64
cols = 256


class Model(nn.Module):
    def forward(self, x):
        values, indices = torch.max(x, dim=1)
        return (x.sum(dim=-1), x.mean(dim=(1, 2)), values, indices, torch.amin(x, dim=2),
                torch.prod(1 + 0.01 * x, dim=1), torch.argmax(x, dim=2), torch.argmin(x, dim=0),
                x.sum(dim=1, keepdim=True))


def get_inputs():
    return [torch.randn(batch_size, rows, cols)]


def get_init_inputs():
    return []
