"""OLMo2's q / k norm over all heads (rope_norm.py, `norm_dims`): an RMSNorm over the projection's whole row,
then the split into heads and rotate-half RoPE, is one RoPE op that normalizes each token's row in one workgroup.
Written by hand as OLMo2 writes it; a near miss (the rotation reads only some heads of the normalized row, so the
row is not whole dims of the rotated tensor; or the normalized row is also read elsewhere) keeps its norm. Each:
the counter, the FlyDSL nodes (reference) or the recorded launch (flysim), eager's numbers. The HF model's count:
tests/e2e/test_generation_launches.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import translator
from translator.tolerances import model_tol


class AllHeadsNormRope(torch.nn.Module):
    """q = rope(rms_norm(x over H * D).view(B, S, H, D).transpose(1, 2)). form "olmo2"; "some_heads": only the
    first half of the heads rotated; "leak": the normalized row also returned."""

    def __init__(self, form="olmo2", heads=4, d=16):
        super().__init__()
        self.form, self.heads, self.d = form, heads, d
        self.w = torch.nn.Parameter(torch.randn(heads * d))
        ang = torch.randn(8, d // 2)
        self.register_buffer("cos", torch.cat((ang, ang), -1).cos())
        self.register_buffer("sin", torch.cat((ang, ang), -1).sin())

    def forward(self, x):
        b, s, _ = x.shape
        qn = F.rms_norm(x, (self.heads * self.d,), self.w, 1e-6)
        q = qn.view(b, s, self.heads, self.d).transpose(1, 2)
        if self.form == "some_heads":
            q = q[:, : self.heads // 2]
        h, cos, sin = self.d // 2, self.cos[:s], self.sin[:s]
        out = q * cos + torch.cat((-q[..., h:], q[..., :h]), -1) * sin
        return (out, qn) if self.form == "leak" else out


def _flydsl_nodes(tm):
    return [str(n.target).split(".")[1] for n in tm.gm.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("flydsl.")]


@pytest.mark.parametrize("form", ["olmo2", "some_heads", "leak"])
def test_all_heads_norm_before_rope_folds_only_when_the_rotation_reads_the_whole_row(form):
    torch.manual_seed(0)
    model, x = AllHeadsNormRope(form).eval(), torch.randn(1, 5, 64)
    tm = translator.translate(model, (x,), backend="reference")
    fired = form == "olmo2"
    assert tm.report.counters.get("rope_norm_all_heads") == (1 if fired else None), tm.report.counters
    assert _flydsl_nodes(tm) == (["rope"] if fired else ["rms_norm", "rope"]), _flydsl_nodes(tm)
    with torch.no_grad():
        got, want = tm(x), model(x)
    for g, w in zip(got if form == "leak" else [got], want if form == "leak" else [want]):
        torch.testing.assert_close(g, w, **model_tol())


def test_flysim_all_heads_norm_and_rope_are_one_launch():
    torch.manual_seed(0)
    model, x = AllHeadsNormRope().eval(), torch.randn(1, 5, 64)
    tm = translator.translate(model, (x,), backend="flysim")
    with torch.no_grad():
        got = tm(x)
    assert [(c.family, len(c.launches)) for c in tm.last_calls] == [("rope", 1)], tm.last_calls
    assert [ln.kernel.split("_kernel")[0] for ln in tm.last_launches] == ["rope_cache"]
    torch.testing.assert_close(got, model(x), **model_tol())
