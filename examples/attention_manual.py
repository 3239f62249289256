"""Causal attention written out by hand in half precision, as many models write it: the
scores' product scaled by 1/sqrt(d), a mask from `tril`, softmax, the product with v. The
three folds are one flash kernel (`emmy compile examples/attention_manual.py --ir tile`),
which rounds each score to f16 where the program does (q @ k is an f16 product in eager)."""

import math

import torch
import torch.nn as nn

batch_size = 1
heads = 2
seq_len = 70
head_dim = 64
dtype = "float16"      # or "bfloat16"


class Model(nn.Module):
    def forward(self, q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        keep = torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


def get_inputs():
    t = getattr(torch, dtype)
    shape = (batch_size, heads, seq_len, head_dim)
    return [torch.randn(shape).to(t), torch.randn(shape).to(t), torch.randn(shape).to(t)]


def get_init_inputs():
    return []
