"""nn.Linear with a bias, followed by a ReLU epilogue."""

import torch
import torch.nn as nn

batch_size = 32
in_features = 512
out_features = 256


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
