"""A weight-only int4 linear layer, as GPTQ and AWQ quantize LLM weights: two 4-bit weights to a
byte (the low nibble first), unsigned with a zero point of 8, one f16 scale per group of 128
weights along the input features; the forward unpacks and dequantizes the weight to f16 with
bit operations and a reshape, then takes the f16 product. emmy dequantizes the weight inside the
tensor-core product as it copies the weight's tiles (half a byte a weight read, two weights a
few instructions); the row's PLACE=cut stores the f16 weight by a map kernel first."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch = 64
in_features = 512
out_features = 256
group = 128


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        weight = torch.randn(out_features, in_features // group, group)
        scale = weight.abs().amax(dim=2, keepdim=True) / 7
        q = ((weight / scale).round().clamp(-8, 7) + 8).to(torch.uint8).view(out_features, -1)
        self.register_buffer("packed", q[:, 0::2] | (q[:, 1::2] << 4))
        self.register_buffer("scale", scale.half())

    def forward(self, x):
        q = torch.stack([self.packed & 15, self.packed >> 4], dim=-1)
        w = (q.view(out_features, in_features // group, group).half() - 8) * self.scale
        return F.linear(x, w.view(out_features, in_features))


def get_inputs():
    return [torch.randn(batch, in_features).half()]


def get_init_inputs():
    return [in_features, out_features]
