"""A mixture-of-experts router (Mixtral's and DeepSeek's shape of it): a gate projection of each
token's hidden state, softmax over the experts in float32, the top-k experts per token, and
their weights renormalized to sum to one. Returns (weights, expert indices)."""

import torch
import torch.nn as nn

tokens = 256
hidden = 512
experts = 64
top_k = 6


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(hidden, experts, bias=False).to(torch.bfloat16)

    def forward(self, x):
        logits = self.gate(x)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), chosen


def get_inputs():
    return [torch.randn(tokens, hidden, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
