"""A residual block as a KernelBench level-3 model writes it: a strided 7x7 stem convolution
with batch norm, an in-place ReLU and a max pool, two 3x3 convolutions with batch norm and a
skip connection, a global average pool and a classifier."""

import torch
import torch.nn as nn

batch_size = 2
channels = 8
size = 16
num_classes = 10


class Model(nn.Module):
    def __init__(self, channels, num_classes):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 7, stride=2, padding=3, bias=False),
                                  nn.BatchNorm2d(channels), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, stride=2, padding=1))
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x):
        x = self.stem(x)
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        x = torch.relu(x + y)
        return self.fc(torch.flatten(self.pool(x), 1))


def get_inputs():
    return [torch.randn(batch_size, 3, size, size)]


def get_init_inputs():
    return [channels, num_classes]
