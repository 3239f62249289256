"""A stacked LSTM as a KernelBench level-3 model writes it: given initial states, a linear
classifier on the last step's output. emmy unrolls the recurrence (torch's decomposition of
the layer): up to two kernels a step and layer, the hidden-state product and the gates'
update (26 here). Longer sequences compile, at more kernels and a longer compile:
`--set sequence_length=32`."""

import torch
import torch.nn as nn

batch_size = 4
sequence_length = 8
input_size = 32
hidden_size = 64
num_layers = 2
output_size = 10


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers, output_size):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)
        self.fc = nn.Linear(hidden_size, output_size)

    def forward(self, x, h0, c0):
        out, _ = self.lstm(x, (h0, c0))
        return self.fc(out[:, -1, :])


def get_inputs():
    return [torch.randn(batch_size, sequence_length, input_size),
            torch.randn(num_layers, batch_size, hidden_size),
            torch.randn(num_layers, batch_size, hidden_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_layers, output_size]
