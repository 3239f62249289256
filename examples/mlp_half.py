"""A bf16 MLP block with ragged sizes: up projection, bias, GELU, down projection. Eager rounds
the hidden activation to bf16, so the fused back-to-back kernel (or the cut pair) keeps that
rounding and runs both products on tensor cores."""

import torch
import torch.nn as nn
import torch.nn.functional as F

tokens = 40
features = 96
hidden = 200


class Model(nn.Module):
    def __init__(self, features: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(features, hidden).to(torch.bfloat16)
        self.down = nn.Linear(hidden, features).to(torch.bfloat16)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


def get_inputs():
    return [torch.randn(tokens, features, dtype=torch.bfloat16)]


def get_init_inputs():
    return [features, hidden]
