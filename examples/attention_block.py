"""minGPT's causal self-attention block in half precision (a KernelBench level-3 model): one
linear layer projects x to q|k|v, the heads are split by views and transposes, a registered
`tril` buffer masks the scores, and a second linear layer projects the heads back. emmy makes
it three kernels: the q|k|v product, one flash attention reading q, k and v from the packed
projection and the mask from the buffer, and the output product
(`emmy compile examples/attention_block.py --ir tile`)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 2
seq_len = 70
n_embd = 128
n_head = 2
dtype = "float16"      # or "bfloat16"


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.register_buffer("bias", torch.tril(torch.ones(seq_len, seq_len))
                             .view(1, 1, seq_len, seq_len))
        self.to(getattr(torch, dtype))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(n_embd, dim=2)
        k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
        q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
        v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


def get_inputs():
    return [torch.randn(batch_size, seq_len, n_embd).to(getattr(torch, dtype))]


def get_init_inputs():
    return []
