"""A fused elementwise region writes each of its outputs at the region's full (broadcast)
shape, so a value of a smaller shape that is used outside the region must stay out of it:
fusing it would hand its users a tensor of the wrong shape."""

from __future__ import annotations

import torch
from translator.tolerances import model_tol

from translator import translate


class GateAndScale(torch.nn.Module):
    def forward(self, x, b):
        gate = torch.sigmoid(b)  # [C], also returned: used outside any region it could join
        return x * gate + 1.0, gate * 2.0


def test_a_smaller_value_used_outside_is_not_swallowed():
    x, b = torch.randn(4, 8), torch.randn(8)
    tm = translate(GateAndScale(), (x, b), backend="flysim")
    v = tm.report.verification
    assert v.passed, v.message
    got = tm(x, b)
    assert [tuple(o.shape) for o in got] == [(4, 8), (8,)]
    want = GateAndScale()(x, b)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **model_tol(check="few_ops"))
    assert tm.report.counters.get("fused_elementwise", 0) >= 2  # the [C] chain and the [N, C] chain
    assert len(tm.last_launches) >= 2
