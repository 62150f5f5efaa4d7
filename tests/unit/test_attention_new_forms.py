"""Attention forms of issue 27 (item 3), enumerated and asserted fused-or-reasoned:

- gpt-oss (HF GptOss tiny config, eager attention): attention sinks, a learned logit per head
  joined to the scores by `cat` and dropped after the softmax -> flydsl.attention(sinks=...);
- XLNet's relative attention (HF XLNet tiny config): scores = (q+r_w)·kᵀ + rel_shift((q+r_r)·rᵀ),
  all scaled, an einsum per product;
- a diffusion UNet's spatial self-attention over H·W tokens (the LDM / Stable Diffusion VAE
  `AttnBlock`, re-typed from its well-known public form): 1x1-conv q, k, v, `bmm(q, k) * c**-0.5`,
  softmax, and the ·V product written `bmm(v, wᵀ)` (V·Pᵀ: the probabilities on the right).

The chains are enumerated on the captured graph by this file's own definition, broader than
test_attention_no_silent_miss's: a last-dim softmax with a product a few ops upstream whose
result reaches either operand of a product downstream. Each must become flydsl.attention or say
"not taken by attention: <reason>" on its softmax row."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from translator import translate
from translator.tolerances import model_tol

from attention_helpers import fused_or_reasoned, translate_and_enumerate  # noqa: E402

transformers = pytest.importorskip("transformers")


class Logits(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        return self.m(ids, use_cache=False).logits


def gpt_oss():
    cfg = transformers.GptOssConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                    num_experts_per_tok=2, max_position_embeddings=64, sliding_window=8)
    torch.manual_seed(0)
    m = transformers.GptOssForCausalLM._from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for layer in m.model.layers:  # learned sinks, not the zero init: they must change the output
            layer.self_attn.sinks.normal_(0.0, 2.0)
    return Logits(m), (torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(1)),)


def xlnet():
    cfg = transformers.XLNetConfig(vocab_size=128, d_model=64, n_layer=1, n_head=4, d_inner=128, mem_len=None)
    torch.manual_seed(0)
    m = transformers.XLNetModel(cfg).eval()

    class Hidden(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(ids, use_mems=False).last_hidden_state

    return Hidden(), (torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(1)),)


class SpatialSelfAttention(nn.Module):
    """The LDM / Stable Diffusion VAE attention block over H·W tokens (one head of C channels)."""

    def __init__(self, c):
        super().__init__()
        self.norm = nn.GroupNorm(8, c, eps=1e-6)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(c, c, 1) for _ in range(4))

    def forward(self, x):
        h_ = self.norm(x)
        q, k, v = self.q(h_), self.k(h_), self.v(h_)
        b, c, h, w = q.shape
        q = q.reshape(b, c, h * w).permute(0, 2, 1)   # b, hw, c
        k = k.reshape(b, c, h * w)                    # b, c, hw
        w_ = torch.bmm(q, k) * (int(c) ** (-0.5))     # b, hw (queries), hw (keys)
        w_ = F.softmax(w_, dim=2)
        v = v.reshape(b, c, h * w)
        w_ = w_.permute(0, 2, 1)                      # keys first
        h_ = torch.bmm(v, w_)                         # b, c, hw (queries)
        h_ = h_.reshape(b, c, h, w)
        return x + self.proj_out(h_)


def unet_block():
    torch.manual_seed(0)
    return SpatialSelfAttention(32), (torch.randn(1, 32, 6, 5, generator=torch.Generator().manual_seed(1)),)


def test_gpt_oss_sinks_become_the_kernel_option(monkeypatch):
    model, inputs = gpt_oss()
    tm, names = translate_and_enumerate(model, inputs, monkeypatch, either_operand=True)
    assert len(names) == 2, names
    taken, reasons = fused_or_reasoned(tm, names)
    assert taken == names, reasons
    att = [n for n in tm.gm.graph.nodes if "flydsl.attention" in str(n.target)]
    assert len(att) == 2 and all(n.args[10] is not None for n in att)  # sinks passed
    torch.testing.assert_close(tm(*inputs), model(*inputs), **model_tol())


@pytest.mark.slow  # ~1-2 min on 2 cores; the kernel's sinks are in tests/kernels/test_attention_cache.py
def test_gpt_oss_sinks_on_flysim():
    """The attention node with sinks on the kernel: launches and numerics against eager."""
    model, inputs = gpt_oss()
    tm = translate(model, inputs, backend="flysim")
    launches = [getattr(ln, "kernel", str(ln)).rsplit("_", 1)[0] for ln in tm.last_launches]
    assert launches.count("attention_fwd_kernel") == 2, launches
    torch.testing.assert_close(tm(*inputs), model(*inputs), **model_tol())


@pytest.mark.parametrize("build,why", [(xlnet, "'bnij,jbnd->ibnd'"), (unet_block, "right operand of the ·V product")],
                         ids=["xlnet", "unet_spatial"])
def test_relative_and_spatial_attention_are_fused_or_reasoned(build, why, monkeypatch):
    """Not fused yet (translator/lowerings/attention_unread.py says why); before it, both chains
    were silent misses: their softmax row read "flydsl.softmax" with no reason."""
    model, inputs = build()
    tm, names = translate_and_enumerate(model, inputs, monkeypatch, either_operand=True)
    assert len(names) == 1, names
    taken, reasons = fused_or_reasoned(tm, names)
    assert not taken and why in reasons[names[0]], reasons
    torch.testing.assert_close(tm(*inputs), model(*inputs), **model_tol())
