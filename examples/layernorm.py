"""LayerNorm over the last dimension, with a learned scale and shift."""

import torch
import torch.nn as nn

batch_size = 64
seq_len = 8
hidden = 1024


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        with torch.no_grad():  # not the identity scale, so the affine part is checked too
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden) * 2 + 0.5]


def get_init_inputs():
    return [hidden]
