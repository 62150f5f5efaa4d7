"""Matmul -> GELU -> dropout (eval) -> clamp, in the style of KernelBench level 2's
"Matmul + activation + Dropout + Clamp" problems.

In eval mode the dropout is the identity; the translator folds the GELU, the dropout and the
clamp into the GEMM's epilogue (one FlyDSL kernel for the whole forward).
"""

import torch
import torch.nn as nn

batch_size = 4
seq_len = 6
in_features = 48
out_features = 80
clamp_min = -0.25
clamp_max = 0.75


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, clamp_min: float, clamp_max: float):
        super().__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.gelu = nn.GELU()
        self.dropout = nn.Dropout(0.2)
        self.clamp_min, self.clamp_max = clamp_min, clamp_max

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.gelu(self.matmul(x))
        x = self.dropout(x)
        return torch.clamp(x, min=self.clamp_min, max=self.clamp_max)


def get_inputs():
    return [torch.randn(batch_size, seq_len, in_features)]


def get_init_inputs():
    return [in_features, out_features, clamp_min, clamp_max]
