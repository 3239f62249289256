"""A KernelBench level-2 pattern: a convolution, a group norm over its output, a HardSwish.
The group norm's statistics read the convolution's output, so emmy stores that output (an
implicit-GEMM kernel of its own) and the norm reads it: fused, every output element would
compute its whole group's convolution again, for the mean and again for the variance."""

import torch
import torch.nn as nn

batch_size = 2
in_channels = 8
out_channels = 16
groups = 4
size = 10


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, groups: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm = nn.GroupNorm(groups, out_channels)

    def forward(self, x):
        return nn.functional.hardswish(self.norm(self.conv(x)))


def get_inputs():
    return [torch.randn(batch_size, in_channels, size, size)]


def get_init_inputs():
    return [in_channels, out_channels, groups]
