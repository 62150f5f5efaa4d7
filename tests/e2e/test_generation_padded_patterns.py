"""The key-start padding term (attention_cache.padding_start / gather_start, attention.lower_padding_gather) on
hand-written static-cache attention: the rewrite fires on exactly the form that is `key >= start[b]` and on no
look-alike, and the numerics are eager's either way (reference backend).

    am = arange(L)[None, :] >= start[:, None]                      # [B, L]: row b's keys from start[b] on
    mask = (kv <= pos[:, None]) & am[arange(B)[:, None, None, None], kv]   # HF's sdpa mask with padding

`>=` (or `start <= kv`) is a key start: flydsl.attention(q_pos=pos, k_start=start), no mask tensor. `>` (off by
one), `<=` (the keys before the start), or a mask that is data (an input) keep their mask tensor. HF's eager
attention adds the mask (where(mask, 0, finfo.min)): there the gather becomes an elementwise compare (it had no
lowering and ran in PyTorch).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import translator

B, H, L, D, S = 2, 2, 24, 16, 5
START, POS = torch.tensor([0, 7]), torch.arange(10, 10 + S)


class PaddedCacheAttention(torch.nn.Module):
    """SDPA (or, eager=True, HF's eager attention) of q over a static cache, masked by the positions and a
    padding term built as `form` says."""

    def __init__(self, form: str, eager: bool = False):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("kc", torch.randn(B, H, L, D, generator=g))
        self.register_buffer("vc", torch.randn(B, H, L, D, generator=g))
        self.form, self.eager = form, eager

    def forward(self, q, pos, start, data):
        kv = torch.arange(L)
        am = {"ge": lambda: kv[None, :] >= start[:, None], "le_swapped": lambda: start[:, None] <= kv[None, :],
              "gt": lambda: kv[None, :] > start[:, None], "flipped": lambda: kv[None, :] <= start[:, None],
              "data": lambda: data}[self.form]()
        k4 = kv[None, None, None, :]
        mask = (k4 <= pos[None, None, :, None]) & am[torch.arange(B)[:, None, None, None], k4]
        if not self.eager:
            return F.scaled_dot_product_attention(q, self.kc, self.vc, attn_mask=mask)
        add = torch.where(mask, 0.0, torch.finfo(torch.float32).min)
        s = q @ self.kc.transpose(-1, -2) * D ** -0.5 + add
        return torch.softmax(s, -1) @ self.vc


def _inputs():
    q = torch.randn(B, H, S, D, generator=torch.Generator().manual_seed(1))
    return q, POS, START, torch.arange(L)[None, :] >= START[:, None]


@pytest.mark.parametrize("form,fires", [("ge", True), ("le_swapped", True), ("gt", False), ("flipped", False),
                                        ("data", False)])
def test_only_a_key_start_becomes_k_start(form, fires):
    model, x = PaddedCacheAttention(form), _inputs()
    tm = translator.translate(model, x, backend="reference", dynamic_shapes=None)
    torch.testing.assert_close(tm(*x), model(*x))
    (att,) = [n for n in tm.gm.graph.nodes if n.target is torch.ops.flydsl.attention.default]
    assert (tm.report.counters.get("sdpa_cache_key_start") == 1) is fires, tm.report.counters
    assert (att.args[3] is None) is fires, att.format_node()  # the mask tensor is gone only for a key start
    if fires:
        assert att.args[11].op == "placeholder" and att.args[11].meta["val"].shape == (B,), att.format_node()


def test_eager_attentions_padding_gather_is_a_compare():
    model, x = PaddedCacheAttention("ge", eager=True), _inputs()
    tm = translator.translate(model, x, backend="reference", dynamic_shapes=None)
    torch.testing.assert_close(tm(*x), model(*x))
    assert tm.report.counters.get("padding_gather_compare") == 1, tm.report.counters
    assert not [n for n in tm.gm.graph.nodes if n.target is torch.ops.aten.index.Tensor]
    assert not [r.op for r in tm.report.rows if r.where == "pytorch" and not r.layout]
