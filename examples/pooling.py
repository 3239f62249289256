"""Pooling as KernelBench writes it: a 2-D max pool with padding and dilation, an average pool
that counts only the input (ceil_mode, count_include_pad=False), and a global average pool."""

import torch
import torch.nn as nn

batch_size = 4
channels = 8
height = 30
width = 30
kernel_size = 3
stride = 2
padding = 1
dilation = 2


class Model(nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int, dilation: int):
        super().__init__()
        self.max_pool = nn.MaxPool2d(kernel_size, stride, padding, dilation)
        self.avg_pool = nn.AvgPool2d(kernel_size, stride, padding, ceil_mode=True,
                                     count_include_pad=False)
        self.global_pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.max_pool(x), self.avg_pool(x), self.global_pool(x)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [kernel_size, stride, padding, dilation]
