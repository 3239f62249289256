"""One 2-d convolution with a fused bias and ReLU, a ResNet stage's shape scaled down: emmy
computes it as an implicit GEMM (output channels x batch*height*width, over in_channels x
kernel x kernel), the input gathered under each window with its zero padding. `emmy bench
--suite conv` runs it at full size against cuDNN."""

import torch
import torch.nn as nn

batch_size = 2
in_channels = 16
out_channels = 32
height = 14
width = 14
kernel_size = 3
stride = 1
padding = 1


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride,
                              padding=padding)

    def forward(self, x):
        return torch.relu(self.conv(x))


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
