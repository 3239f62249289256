"""Scaled dot-product attention (fp32): softmax(q k^T / sqrt(d) + mask) v, causal unless
is_causal = False."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 2
heads = 4
seq_len = 64
head_dim = 32
is_causal = True


class Model(nn.Module):
    def __init__(self, is_causal: bool = True):
        super().__init__()
        self.is_causal = is_causal

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.is_causal)


def get_inputs():
    shape = (batch_size, heads, seq_len, head_dim)
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return [is_causal]
