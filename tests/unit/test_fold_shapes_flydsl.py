"""Shape-only values that a lowering had already made FlyDSL ops are folded too.

Llama's rotary tables (`inv_freq @ positions`, then cos / sin) depend only on the sequence length,
yet the bmm and the two elementwise regions were lowered before fold_shapes ran and launched three
kernels on every forward. Before this fix the test's first assertion failed: the forward recorded
six launches, three of them (a gemm, cos, sin) for the tables.
"""

import torch
import torch.nn as nn

from translator import translate
from translator.passes.fold_shapes import FoldedShapes
from translator.tolerances import model_tol


class Rotary(nn.Module):
    """A projection with rotary position embedding, written as HF Llama writes it."""

    def __init__(self, d=64, head=32):
        super().__init__()
        self.q = nn.Linear(d, d, bias=False)
        self.head = head
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, head, 2).float() / head)), persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        pos = torch.arange(t, device=x.device)[None].expand(b, -1)
        freqs = (self.inv_freq[None, :, None].expand(b, -1, 1) @ pos[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, :, None], emb.sin()[:, :, None]
        q = self.q(x).view(b, t, -1, self.head)
        q1, q2 = q[..., : self.head // 2], q[..., self.head // 2:]
        return q * cos + torch.cat((-q2, q1), dim=-1) * sin


def test_rotary_tables_are_computed_once_per_shape_not_per_forward():
    torch.manual_seed(0)
    m = Rotary().eval()
    x = torch.randn(2, 8, 64)
    tm = translate(m, (x,), backend="flysim")
    assert tm.report.verification.passed
    with torch.no_grad():
        tm(x)
    kernels = [r.kernel.split("_")[0] for r in tm.last_launches]
    # the projection's gemm and the whole rotary (rotate_half's cat, neg, mul-add: lowerings.rope) in one
    # kernel (flydsl.rope); no table bmm, cos or sin
    assert sorted(kernels) == ["gemm", "rope"], kernels
    assert tm.report.counters.get("rope_rotate_half") == 1
    assert tm.report.summary()["flydsl_ops"] == {"flydsl.gemm": 1, "flydsl.rope": 1}
    (f,) = [mod for mod in tm.gm.modules() if isinstance(mod, FoldedShapes)]
    assert tm.report.counters.get("folded_bmm") == 1  # the lowered bmm was taken into the folded region
    assert {"cos", "sin"} <= set(f.sources), f.sources
    rows = {r.node: r for r in tm.report.rows}
    assert rows["cos"].where == rows["sin"].where == "folded"
    runs = f.computed
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(tm(x), m(x), **model_tol())
        assert f.computed == runs  # same shape: served from the cache, no table recomputed
        x2 = torch.randn(3, 5, 64)  # a new batch and sequence length get their own tables
        torch.testing.assert_close(tm(x2), m(x2), **model_tol())
        assert f.computed == runs + 1
        assert len(tm.last_launches) == 2
