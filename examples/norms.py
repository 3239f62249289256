"""Batch, instance and group norm (inference), L1/L2 normalization and the Frobenius norm."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 8
channels = 16
height = 32
width = 32
groups = 4


class Model(nn.Module):
    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.batch_norm = nn.BatchNorm2d(channels)
        self.instance_norm = nn.InstanceNorm2d(channels, affine=True)
        self.group_norm = nn.GroupNorm(groups, channels)
        with torch.no_grad():  # trained-looking statistics and affine parameters
            self.batch_norm.running_mean.uniform_(-0.5, 0.5)
            self.batch_norm.running_var.uniform_(0.5, 2.0)
            for norm in (self.batch_norm, self.instance_norm, self.group_norm):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        rows = x.flatten(1)
        return (self.batch_norm(x), self.instance_norm(x), self.group_norm(x),
                F.normalize(rows, p=2, dim=1), F.normalize(rows, p=1, dim=1),
                x / torch.norm(x, p="fro"))


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, groups]
