"""A weight-only int8 linear layer, as LLM inference quantizes one: the weight stored as int8
with one f16 scale per output row, dequantized to f16 in the forward (`w.half() * scale`), then
the f16 product. emmy dequantizes the weight inside the tensor-core product, as it copies the
weight's tiles (one byte a weight read); the row's PLACE=cut stores the f16 weight by a map
kernel first, which the default row does where the cost model finds it faster (many rows)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch = 64
in_features = 512
out_features = 256


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        weight = torch.randn(out_features, in_features)
        scale = weight.abs().amax(dim=1, keepdim=True) / 127
        self.register_buffer("weight", (weight / scale).round().to(torch.int8))
        self.register_buffer("scale", scale.half())
        self.bias = nn.Parameter(torch.randn(out_features).half() * 0.1)

    def forward(self, x):
        return F.linear(x, self.weight.half() * self.scale, self.bias)


def get_inputs():
    return [torch.randn(batch, in_features).half()]


def get_init_inputs():
    return [in_features, out_features]
