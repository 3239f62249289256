"""A transformer-style MLP block: Linear -> GELU -> Linear."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16
hidden = 256
expansion = 4


class Model(nn.Module):
    def __init__(self, hidden: int, expansion: int):
        super().__init__()
        self.up = nn.Linear(hidden, hidden * expansion)
        self.down = nn.Linear(hidden * expansion, hidden)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


def get_inputs():
    return [torch.randn(batch_size, hidden)]


def get_init_inputs():
    return [hidden, expansion]
