"""A decoding step's sampling filters over a vocabulary: top-k (the k largest logits kept, the
rest -inf) and top-p / nucleus (the smallest set of tokens whose probabilities reach p, found by
sorting the probabilities and a running sum), as Hugging Face's warpers compute them, written
without a scatter: each filter finds its threshold, then masks the logits by it.

`--set vocab=50257` is GPT-2's vocabulary (the default is smaller, to keep the CPU emulator's
check quick)."""

import torch
import torch.nn as nn

batch_size = 4
vocab = 8192
top_k = 50
top_p = 0.9


class Model(nn.Module):
    def forward(self, logits):
        kth = torch.topk(logits, top_k).values[:, -1:]
        top_k_logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        ordered = torch.sort(probs, dim=-1, descending=True).values
        before = ordered.cumsum(dim=-1) - ordered          # the mass of the tokens ahead
        smallest_kept = ordered.masked_fill(before > top_p, 1.0).amin(dim=-1, keepdim=True)
        top_p_logits = logits.masked_fill(probs < smallest_kept, float("-inf"))
        return top_k_logits, top_p_logits


def get_inputs():
    return [torch.randn(batch_size, vocab) * 3]


def get_init_inputs():
    return []
