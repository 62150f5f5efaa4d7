"""The rope_cache rule (translator/lowerings/rope_cache.py): what it fuses into one flydsl.rope launch and what
it leaves apart, on small attention blocks written by hand (reference backend: the graph and its math; the
kernel itself: tests/kernels/test_rope_cache.py).

Each case: the counters, the graph (rope nodes, cache writes left) and eager's outputs and final cache."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import translator
from translator.tolerances import model_tol
import translator.lowerings  # noqa: F401  (registers flydsl.rope)

ROPE, WRITE = torch.ops.flydsl.rope.default, torch.ops.flydsl.cache_write.default


def _rot(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


class Block(nn.Module):
    """q, k, v from one projection, rotate-half RoPE, k and v written into static caches at `pos`.
    form: "plain" (fused whole), "read_between" (the k cache is read between the rotations and its write: that
    write stays apart, v's joins),
    "k_used_twice" (the rotated k is also returned), "complex" (Meta's view_as_complex RoPE)."""

    def __init__(self, form):
        super().__init__()
        torch.manual_seed(0)
        self.form = form
        self.qkv = nn.Linear(32, 64, bias=False)  # 4 q heads, 2 kv heads, head dim 8
        self.register_buffer("kc", torch.zeros(1, 2, 8, 8))
        self.register_buffer("vc", torch.zeros(1, 2, 8, 8))

    def forward(self, x, cos, sin, pos):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([32, 16, 16], -1)
        q, k, v = (t.view(b, s, -1, 8).transpose(1, 2) for t in (q, k, v))
        if self.form == "complex":
            f = torch.polar(torch.ones_like(cos[..., :4]), cos[..., :4])  # [1, 1, S, 4] complex
            q, k = (torch.view_as_real(torch.view_as_complex(t.reshape(b, -1, s, 4, 2)) * f).flatten(3) for t in (q, k))
        else:
            q, k = _rot(q, cos, sin), _rot(k, cos, sin)
        before = self.kc.sum() if self.form == "read_between" else None
        self.kc.index_copy_(2, pos, k)
        self.vc.index_copy_(2, pos, v)
        out = (q @ self.kc.repeat_interleave(2, 1).transpose(-1, -2)).softmax(-1) @ self.vc.repeat_interleave(2, 1)
        if before is not None:
            return out, before
        return (out, k) if self.form == "k_used_twice" else out


def _inputs(s=3):
    g = torch.Generator().manual_seed(1)
    ang = torch.randn(1, 1, s, 4, generator=g)
    emb = torch.cat((ang, ang), -1)
    return torch.randn(1, s, 32, generator=g), emb.cos(), emb.sin(), torch.arange(2, 2 + s)


@pytest.mark.parametrize("form,counter,kc,vc", [("plain", "rope_cache_write", True, True),
                                                ("complex", "rope_cache_write", True, True),
                                                ("read_between", "rope_cache_write", False, True),
                                                ("k_used_twice", "rope_cache_write", False, True)])
def test_what_the_rope_launch_takes(form, counter, kc, vc):
    x = _inputs()
    eager = Block(form).eval()
    with torch.no_grad():
        want = eager(*x)
    m = Block(form).eval()
    tm = translator.translate(m, x, backend="reference", dynamic_shapes=None)
    assert tm.report.verification.passed, tm.report.verification.message
    assert tm.report.counters.get(counter) == 1, tm.report.counters
    (rope,) = [n for n in tm.gm.graph.nodes if n.target is ROPE]  # q and k rotated in one launch
    assert len(rope.args[0]) == 2
    assert (rope.args[4] is not None, rope.args[7] is not None) == (kc, vc)
    assert sum(n.target is WRITE for n in tm.gm.graph.nodes) == 2 - kc - vc  # the writes not taken stay
    tm.load_state_dict({"kc": torch.zeros(1, 2, 8, 8), "vc": torch.zeros(1, 2, 8, 8)}, strict=False)
    with torch.no_grad():
        got = tm(*x)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w, **model_tol())
    state = tm.state_dict()
    torch.testing.assert_close(state["kc"], eager.kc)
    torch.testing.assert_close(state["vc"], eager.vc)
