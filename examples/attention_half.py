"""Half-precision causal attention at a ragged length (70 is no multiple of a key block):
flash-attention rows mask the last block's keys and predicate the last queries."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 1
heads = 2
seq_len = 70
head_dim = 64
is_causal = True
dtype = "float16"      # or "bfloat16"


class Model(nn.Module):
    def __init__(self, is_causal: bool = True):
        super().__init__()
        self.is_causal = is_causal

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.is_causal)


def get_inputs():
    t = getattr(torch, dtype)
    shape = (batch_size, heads, seq_len, head_dim)
    return [torch.randn(shape).to(t), torch.randn(shape).to(t), torch.randn(shape).to(t)]


def get_init_inputs():
    return [is_causal]
