"""GPT-NeoX's partial rotary (rope_pass.py, `rot_dim`): `cat([rope(x[..., :r]), x[..., r:]], -1)` is one RoPE op
over the whole head, so q's and k's rotations pair into one launch (rope_cache.py) and a rotated k reaches a cache
write through views. Written by hand as GPT-NeoX writes it; a near miss (the parts in the other order, or the
pass-through part of another tensor) keeps its `cat`. Each: the counter, the FlyDSL nodes (reference) or the
recorded launches (flysim), eager's numbers. The HF model's count: tests/e2e/test_generation_launches.py."""

from __future__ import annotations

import pytest
import torch

import translator
from translator.tolerances import model_tol


class PartialRope(torch.nn.Module):
    """q and k of [B, S, H * D] rotated over their first `rot` features per head (rotate-half), the rest passed
    through. form "neox": GPT-NeoX's `cat([rotated, pass])`; "swapped": `cat([pass, rotated])`; "crossed": q's
    rotation joined to k's pass-through part."""

    def __init__(self, form="neox", heads=2, d=16, rot=4):
        super().__init__()
        self.form, self.heads, self.d, self.rot = form, heads, d, rot
        ang = torch.randn(8, rot // 2)
        self.register_buffer("cos", torch.cat((ang, ang), -1).cos())
        self.register_buffer("sin", torch.cat((ang, ang), -1).sin())

    def _rope(self, x, cos, sin):
        h = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin

    def forward(self, qk):
        b, s, _ = qk.shape
        q, k = qk.view(b, s, self.heads, 2 * self.d).transpose(1, 2).chunk(2, -1)
        cos, sin, r = self.cos[:s], self.sin[:s], self.rot
        qr, kr = self._rope(q[..., :r], cos, sin), self._rope(k[..., :r], cos, sin)
        if self.form == "swapped":
            return torch.cat([q[..., r:], qr], -1), torch.cat([k[..., r:], kr], -1)
        if self.form == "crossed":
            return torch.cat([qr, k[..., r:]], -1), torch.cat([kr, q[..., r:]], -1)
        return torch.cat([qr, q[..., r:]], -1), torch.cat([kr, k[..., r:]], -1)


def _flydsl_nodes(tm):
    return [str(n.target).split(".")[1] for n in tm.gm.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("flydsl.")]


def _cats(tm):
    return sum(n.op == "call_function" and "cat" in str(n.target) for n in tm.gm.graph.nodes)


@pytest.mark.parametrize("form", ["neox", "swapped", "crossed"])
def test_partial_rotary_pass_through_folds_only_in_gpt_neox_form(form):
    torch.manual_seed(0)
    model, x = PartialRope(form).eval(), torch.randn(1, 5, 64)
    tm = translator.translate(model, (x,), backend="reference")
    fired = form == "neox"
    assert tm.report.counters.get("rope_partial_pass") == (2 if fired else None), tm.report.counters
    assert _flydsl_nodes(tm) == ["rope"], _flydsl_nodes(tm)  # q's and k's rotations paired (rope_qk) either way
    assert _cats(tm) == (0 if fired else 2)
    with torch.no_grad():
        got, want = tm(x), model(x)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.stride() == w.stride()  # the cat's layout
        torch.testing.assert_close(g, w, **model_tol())


def test_flysim_partial_rotary_of_q_and_k_is_one_launch():
    torch.manual_seed(0)
    model, x = PartialRope().eval(), torch.randn(1, 5, 64)
    tm = translator.translate(model, (x,), backend="flysim")
    with torch.no_grad():
        got, want = tm(x), model(x)
    assert [(c.family, len(c.launches)) for c in tm.last_calls] == [("rope", 1)], tm.last_calls
    assert [ln.kernel.split("_kernel")[0] for ln in tm.last_launches] == ["rope_cache"]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **model_tol())
        assert torch.equal(g[..., 4:], w[..., 4:])  # the passed features are x's own
