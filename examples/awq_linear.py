"""An AWQ-format int4 linear layer, as AWQ checkpoints store it (AutoAWQ's GEMM layout):
`qweight` int32 (in_features, out_features // 8), eight 4-bit weights a word along the output
features in AWQ's interleaved order (outputs 8j .. 8j + 7 in nibbles 0, 4, 1, 5, 2, 6, 3, 7);
`qzeros` int32 (groups, out_features // 8), each group's zero points packed the same way;
`scales` f16 (groups, out_features); a group of 128 input features. The forward is the
reference dequantization (AutoAWQ's unpack_awq, reverse_awq_order, then the f16 product):
shifts, a constant list that undoes the order, masks. emmy reads the constant list as index
arithmetic and computes the weights inside the product, two neighbouring outputs at a time."""

import torch
import torch.nn as nn

batch = 16
in_features = 1024
out_features = 512
group = 128
dtype = "float16"

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]           # output 8j + i goes to nibble AWQ_ORDER.index(i)
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]   # nibble i holds output 8j + AWQ_REVERSE_ORDER[i]


def pack_cols(values: torch.Tensor) -> torch.Tensor:
    """int32 words of eight 4-bit values along the last axis, in AWQ's order."""
    v = values.view(*values.shape[:-1], values.shape[-1] // 8, 8)[..., AWQ_ORDER].to(torch.int32)
    out = torch.zeros(v.shape[:-1], dtype=torch.int32)
    for i in range(8):
        out |= v[..., i] << (4 * i)
    return out


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        groups = in_features // group
        self.register_buffer("qweight",
                             pack_cols(torch.randint(0, 16, (in_features, out_features))))
        self.register_buffer("qzeros", pack_cols(torch.randint(6, 10, (groups, out_features))))
        self.register_buffer("scales", (torch.rand(groups, out_features) * 0.02 + 0.001)
                             .to(getattr(torch, dtype)))

    def forward(self, x):
        shifts = torch.arange(0, 32, 4, device=x.device)
        iweight = torch.bitwise_right_shift(self.qweight[:, :, None], shifts[None, None, :])
        iweight = iweight.to(torch.int8).view(in_features, -1)
        izeros = torch.bitwise_right_shift(self.qzeros[:, :, None], shifts[None, None, :])
        izeros = izeros.to(torch.int8).view(in_features // group, -1)
        order = torch.arange(out_features, dtype=torch.int32, device=x.device).view(-1, 8)
        order = order[:, AWQ_REVERSE_ORDER].view(-1)
        iweight = torch.bitwise_and(iweight[:, order], 15)
        izeros = torch.bitwise_and(izeros[:, order], 15)
        w = (iweight - izeros.repeat_interleave(group, dim=0)) \
            * self.scales.repeat_interleave(group, dim=0)
        return x @ w


def get_inputs():
    return [torch.randn(batch, in_features).to(getattr(torch, dtype))]
