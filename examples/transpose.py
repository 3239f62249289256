"""Layout ops (transpose, reshape, slice, flip, broadcast) mixed with arithmetic."""

import torch
import torch.nn as nn

batch_size = 16
rows = 64
cols = 128


class Model(nn.Module):
    def forward(self, x, bias):
        b, r, c = x.shape
        t = x.transpose(1, 2)                             # [b, c, r]
        pairs = t.reshape(b, c // 2, 2, r)
        mixed = pairs[:, :, 0] * 2 - pairs[:, :, 1].flip(-1)
        strided = x[:, ::2, 1::2].permute(0, 2, 1)        # [b, c/2, r/2]
        return mixed[:, :, : r // 2] + strided + bias.unsqueeze(0).expand_as(strided)


def get_inputs():
    return [torch.randn(batch_size, rows, cols), torch.randn(cols // 2, rows // 2)]


def get_init_inputs():
    return []
