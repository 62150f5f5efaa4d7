"""GEMM -> scale -> sigmoid -> residual add, in the style of KernelBench level 2's
"Gemm + a few elementwise ops" problems (e.g. Gemm_Sigmoid_Scaling_ResidualAdd).

The scale comes after the Linear's bias, so it is not the GEMM's `scale` argument: the
translator folds `* scaling_factor`, the sigmoid and the residual add into the GEMM's epilogue
(one FlyDSL kernel for the whole forward).
"""

import torch
import torch.nn as nn

batch_size = 8
features = 64
scaling_factor = 2.0


class Model(nn.Module):
    def __init__(self, features: int, scaling_factor: float):
        super().__init__()
        self.gemm = nn.Linear(features, features)
        self.scaling_factor = scaling_factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.gemm(x)
        y = y * self.scaling_factor
        y = torch.sigmoid(y)
        return y + x


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features, scaling_factor]
