"""A GPTQ-format int4 linear layer, as GPTQ checkpoints store it: `qweight` int32
(in_features // 8, out_features), eight 4-bit weights a word along the input features (weight
k in bits 4 (k % 8) .. 4 (k % 8) + 3); `qzeros` int32 (groups, out_features // 8), each
group's zero points packed the same way along the output features; `scales` f16 (groups,
out_features); a group of 128 input features. The forward unpacks both with shifts and masks
and takes the f16 product, as the reference PyTorch dequantization does."""

import torch
import torch.nn as nn

batch = 16
in_features = 1024
out_features = 512
group = 128
dtype = "float16"


def pack_rows(values: torch.Tensor) -> torch.Tensor:
    """int32 words of eight 4-bit values along the first axis (value i in bits 4i..4i+3)."""
    words = values.view(values.shape[0] // 8, 8, *values.shape[1:]).to(torch.int32)
    out = torch.zeros(words.shape[0], *values.shape[1:], dtype=torch.int32)
    for i in range(8):
        out |= words[:, i] << (4 * i)
    return out


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        groups = in_features // group
        self.register_buffer("qweight", pack_rows(torch.randint(0, 16, (in_features, out_features))))
        self.register_buffer("qzeros", pack_rows(torch.randint(6, 10, (out_features, groups))).T
                             .contiguous())
        self.register_buffer("scales", (torch.rand(groups, out_features) * 0.02 + 0.001)
                             .to(getattr(torch, dtype)))

    def forward(self, x):
        shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=x.device)
        q = (self.qweight.unsqueeze(1) >> shifts.view(1, 8, 1)) & 15          # (in/8, 8, out)
        zeros = (self.qzeros.unsqueeze(2) >> shifts.view(1, 1, 8)) & 15       # (groups, out/8, 8)
        zeros = zeros.reshape(in_features // group, 1, out_features)
        w = (q.reshape(in_features // group, group, out_features) - zeros).to(x.dtype) \
            * self.scales.unsqueeze(1)
        return x @ w.reshape(in_features, out_features)


def get_inputs():
    return [torch.randn(batch, in_features).to(getattr(torch, dtype))]
