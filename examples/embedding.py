"""A GPT's input: token and position embeddings, summed, then the first block's LayerNorm.

The token rows are read at positions the input holds (a gather); the position table at the
sequence position. One kernel: each row's token id is read once, the two rows are added and
normalized in registers (`emmy compile examples/embedding.py --ir loop` shows the gather).
"""

import torch
import torch.nn as nn

batch_size = 8
seq_len = 64
vocab = 8192
hidden = 768


class Model(nn.Module):
    def __init__(self, vocab: int, seq_len: int, hidden: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(seq_len, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.norm(self.tokens(idx) + self.positions(pos))


def get_inputs():
    return [torch.randint(0, vocab, (batch_size, seq_len))]


def get_init_inputs():
    return [vocab, seq_len, hidden]
