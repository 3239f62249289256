"""A Llama decoder block: RMSNorm, q/k/v projections, rotary position embeddings, causal
grouped-query attention (8 query heads sharing 2 key/value heads), the output projection and
its residual, RMSNorm, and the SwiGLU feed-forward with its residual.

emmy stores each norm's output, so that the projections after it are matrix-product kernels
(inlined, a projection's kernel would compute the norm's statistic first and then every dot
product one by one), stores the q and k projections, which the rotation reads at two columns,
and makes the attention one flash kernel reading k and v at head h // 4. The feed-forward is
the gate's product, then a chain: silu(gate) * (h W_up), times W_down, plus the residual,
which its default row cuts into two products where the cost model says that is faster (here,
and at Llama's sizes). `emmy compile examples/llama_block.py --ir tile` lists the kernels;
`--ir loop` says why each tensor is stored.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 2
seq_len = 45          # not a multiple of any tile: the ragged edges are predicated
dim = 256
n_heads = 8
n_kv_heads = 2
hidden = 512
dtype = "float16"     # or "bfloat16", "float32"


def rotate(x, cos, sin):
    """Rotary embedding, as Llama's reference code writes it: the halves of each head swap."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        head_dim = dim // n_heads
        self.attention_norm = nn.RMSNorm(dim, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(dim, eps=1e-5)
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=False)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        freqs = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(seq_len).float(), freqs)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())
        self.to(getattr(torch, dtype))

    def forward(self, x):
        B, T, C = x.shape
        head_dim = C // n_heads
        h = self.attention_norm(x)
        q = self.wq(h).view(B, T, n_heads, head_dim).transpose(1, 2)
        k = self.wk(h).view(B, T, n_kv_heads, head_dim).transpose(1, 2)
        v = self.wv(h).view(B, T, n_kv_heads, head_dim).transpose(1, 2)
        q, k = rotate(q, self.cos, self.sin), rotate(k, self.cos, self.sin)
        k = k.repeat_interleave(n_heads // n_kv_heads, dim=1)
        v = v.repeat_interleave(n_heads // n_kv_heads, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(B, T, C))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def get_inputs():
    return [torch.randn(batch_size, seq_len, dim).to(getattr(torch, dtype))]


def get_init_inputs():
    return []
