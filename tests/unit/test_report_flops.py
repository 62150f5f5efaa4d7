"""The report's FLOP counts against formulas written out here, independent of the counter the
report uses: attention is Q·Kᵀ plus P·V (2 FLOPs per multiply-add), a linear 2·M·N·K."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from translator import translate


class Attn(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=False)


def test_attention_and_linear_flops():
    b, h, s, t, d = 2, 3, 16, 24, 8
    q, k, v = torch.randn(b, h, s, d), torch.randn(b, h, t, d), torch.randn(b, h, t, d)
    tm = translate(Attn(), (q, k, v), backend="reference")
    (row,) = [r for r in tm.report.rows if "attention" in r.op]
    matmuls = 2 * b * h * s * t * d * 2
    assert matmuls <= row.flops <= 1.25 * matmuls, row.flops  # softmax / scaling may be counted on top

    lin = torch.nn.Linear(32, 48)
    tm = translate(lin, (torch.randn(5, 32),), backend="reference")
    (row,) = [r for r in tm.report.rows if "linear" in r.op]
    assert 2 * 5 * 48 * 32 <= row.flops <= 1.1 * 2 * 5 * 48 * 32 + 5 * 48, row.flops  # + bias adds
