"""An fp8 linear layer as torchao's float8 inference runs one: e4m3 weights with one f32 scale
per output channel, the bf16 activation quantized to e4m3 per row with a dynamic scale
(amax / 448), then torch._scaled_mm with both scales and the bias, bf16 out. emmy stores the
row scales and the quantized activation (one row kernel, one map), then multiplies the fp8
operands widened through bf16 (exact) on bf16 tensor cores, the scales and bias in the
epilogue; Hopper's fp8 instructions are not used yet."""

import torch
import torch.nn as nn

batch = 64
in_features = 512
out_features = 256
E4M3_MAX = 448.0


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        weight = torch.randn(out_features, in_features) * in_features ** -0.5
        scale = weight.abs().amax(dim=1, keepdim=True) / E4M3_MAX
        self.register_buffer("weight", (weight / scale).to(torch.float8_e4m3fn))
        self.register_buffer("scale", scale.t().contiguous())           # (1, out_features)
        self.bias = nn.Parameter(torch.randn(out_features).bfloat16() * 0.1)

    def forward(self, x):
        x_scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX
        x8 = (x.float() / x_scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        return torch._scaled_mm(x8, self.weight.t(), scale_a=x_scale, scale_b=self.scale,
                                bias=self.bias, out_dtype=torch.bfloat16)


def get_inputs():
    return [torch.randn(batch, in_features).bfloat16()]


def get_init_inputs():
    return [in_features, out_features]
