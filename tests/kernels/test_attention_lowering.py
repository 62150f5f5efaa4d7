"""SDPA -> flydsl.attention through translate() on flysim, at head dims the kernel pads
(8, 12, 24, 40: seen in real models), and the support check's reasons where it declines."""

from __future__ import annotations

import pytest
import torch
from translator.tolerances import model_tol
import torch.nn as nn
import torch.nn.functional as F

from translator import translate

pytest.importorskip("flysim")


class Sdpa(nn.Module):
    def __init__(self, causal=False):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


@pytest.mark.parametrize("d,causal", [(8, False), pytest.param(24, True, marks=pytest.mark.slow)])
def test_sdpa_at_a_padded_head_dim_runs_the_kernel(d, causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 19, d, generator=g) for _ in range(3))
    model = Sdpa(causal).eval()
    tm = translate(model, (q, k, v), backend="flysim")
    assert tm.report.counters.get("sdpa") == 1, tm.report.counters
    rows = [r for r in tm.report.rows if r.where.startswith("flydsl")]
    assert [r.where for r in rows] == ["flydsl-kernel"], [(r.where, r.detail) for r in rows]
    assert tm.report.verification.passed, tm.report.verification.message
    out = tm(q, k, v)
    assert any("attention" in str(getattr(x, "kernel", x)) for x in tm.last_launches), tm.last_launches
    torch.testing.assert_close(out, model(q, k, v), **model_tol(check="few_ops"))


def test_head_dim_past_256_is_declined_with_its_reason():
    q = torch.randn(1, 1, 4, 264)
    tm = translate(Sdpa().eval(), (q, q, q), backend="reference")
    assert not tm.report.counters.get("sdpa")
    assert any("head_dim=264 is outside 8..256" in (r.detail or "") for r in tm.report.rows), \
        [r.detail for r in tm.report.rows]
