"""Many activation functions on one input, summed."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 64
dim = 2048


class Model(nn.Module):
    def forward(self, x):
        return (F.relu(x) + F.leaky_relu(x, 0.05) + torch.sigmoid(x) + torch.tanh(x)
                + F.gelu(x) + F.gelu(x, approximate="tanh") + F.silu(x)
                + F.softplus(x, beta=2.0, threshold=10.0) + F.elu(x, alpha=0.5) + F.selu(x)
                + F.hardtanh(x, -2.0, 2.0) + F.hardsigmoid(x) + F.softsign(x) + F.mish(x)
                + F.hardswish(x) + F.relu6(x) + F.celu(x))


def get_inputs():
    return [torch.randn(batch_size, dim) * 3]


def get_init_inputs():
    return []
