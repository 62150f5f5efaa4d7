"""A plain multi-layer perceptron: Linear -> ReLU -> Linear -> GELU -> Linear.

Mirrors the feed-forward stacks of KernelBench level 3 ("MLP", "DeepNarrowMLP")
and of any classifier head: layers built in __init__, applied in order in
forward. The middle layer has no bias (as in many gated / projection layers),
so the translator sees both `linear(x, w, b)` and `linear(x, w)` forms.
"""

import torch
import torch.nn as nn

batch_size = 2
seq_len = 16
in_features = 64
hidden_features = 128
out_features = 32


class Model(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act1 = nn.ReLU()
        self.fc2 = nn.Linear(hidden_features, hidden_features, bias=False)
        self.act2 = nn.GELU()
        self.fc3 = nn.Linear(hidden_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act1(self.fc1(x))
        x = self.act2(self.fc2(x))
        return self.fc3(x)


def get_inputs():
    return [torch.randn(batch_size, seq_len, in_features)]


def get_init_inputs():
    return [in_features, hidden_features, out_features]
