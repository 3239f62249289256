"""Convolutions as KernelBench writes them: a padded 3x3 convolution with a fused ReLU, a
strided depthwise convolution, and a transposed convolution that doubles the resolution."""

import torch
import torch.nn as nn

batch_size = 2
in_channels = 8
out_channels = 16
height = 16
width = 16


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.depthwise = nn.Conv2d(out_channels, out_channels, 3, stride=2, padding=1,
                                   groups=out_channels)
        self.up = nn.ConvTranspose2d(out_channels, in_channels, 2, stride=2)

    def forward(self, x):
        return self.up(self.depthwise(torch.relu(self.conv(x))))


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
