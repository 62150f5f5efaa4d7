"""Small hand-written modules that more than one test file translates, and the seeded translation of one."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """A transformer-style MLP block: softmax(LayerNorm(x + fc2(gelu(fc1(x))))), hidden 2d."""

    def __init__(self, d=32):
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        return torch.softmax(self.ln(x + self.fc2(F.gelu(self.fc1(x)))), -1)


def translate_seeded(make, shape, **kw):
    """(model, input, translated module): make() in eval mode and a randn input of `shape`, drawn in
    that order after seeding torch with 0, translated with `kw` (backend=...)."""
    from translator import translate

    torch.manual_seed(0)
    m = make().eval()
    x = torch.randn(*shape)
    return m, x, translate(m, (x,), **kw)
