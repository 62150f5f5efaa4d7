"""Attention as model authors write it (issue 15's forms), each through translate(): the
rewrite fired (the attention_handwritten counter, one flydsl.attention node, no softmax or bmm
left) and the numerics match eager on flysim (the attention kernel launched)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from translator import translate
from translator_kernels import launch as kl

from test_attention_patterns import attention_node, ops as flydsl_ops  # noqa: E402  (tests/unit on sys.path)

pytest.importorskip("flysim")

FINFO_MIN = torch.finfo(torch.float32).min


def run(model, inputs, backend="flysim"):
    """Translate, assert the pattern fired and left nothing of the chain behind, compare with eager."""
    model = model.eval()
    tm = translate(model, inputs, backend=backend)
    assert tm.report.counters.get("attention_handwritten") == 1, tm.report.counters
    left = [op for op in flydsl_ops(tm) if op in ("softmax", "bmm", "fused_elementwise")]
    assert not left, (left, tm.code)
    assert tm.report.verification.passed, tm.report.verification.message
    with torch.no_grad(), kl.collect() as (uses, _):
        got = tm(*inputs)
    torch.testing.assert_close(got, model(*inputs), atol=1e-5, rtol=1e-5)
    if backend == "flysim":
        assert any("attention" in str(getattr(x, "kernel", x)) for x in tm.last_launches), tm.last_launches
        assert not tm.report.without_launch(), tm.report.without_launch()
    return tm, uses


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def qkv(b=1, h=2, s=8, d=16, hkv=None, sk=None):
    return randn(b, h, s, d, seed=1), randn(b, hkv or h, sk or s, d, seed=2), randn(b, hkv or h, sk or s, d, seed=3)


# --- 1. torch.where with finfo.min (HF GPT-2 eager as it stood for years) ----------------------

class GPT2EagerWhere(nn.Module):
    def __init__(self, t=16):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones((t, t), dtype=torch.bool)).view(1, 1, t, t),
                             persistent=False)

    def forward(self, q, k, v):
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
        ql, kl_ = q.size(-2), k.size(-2)
        causal = self.bias[:, :, kl_ - ql: kl_, :kl_]
        mask_value = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
        w = torch.where(causal, w.to(w.dtype), mask_value)
        w = nn.functional.softmax(w, dim=-1).type(v.dtype)
        return torch.matmul(w, v)


class WhereSliced(nn.Module):
    """torch.where(causal_bool, scores, finfo.min) with the mask buffer sliced [:, :, :S, :S]."""

    def __init__(self, t=16):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(t, t, dtype=torch.bool))[None, None])

    def forward(self, q, k, v):
        s = q.size(-2)
        scores = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5
        scores = torch.where(self.bias[:, :, :s, :s], scores, torch.finfo(scores.dtype).min)
        return scores.softmax(-1) @ v


def test_gpt2_where_finfo_min():
    tm, _ = run(GPT2EagerWhere(), qkv(s=8))
    n = attention_node(tm)
    assert n.args[5] == pytest.approx(0.25)  # 1 / full([], 16 ** 0.5) folded to a number
    # the slice starts at Sk - Sq: not provably 0, so the sliced buffer is passed as a keep-mask
    assert n.args[4] is True or n.args[3].meta["val"].dtype == torch.bool


def test_where_with_sliced_tril_buffer_is_causal():
    tm, _ = run(WhereSliced(), qkv(s=8))
    n = attention_node(tm)
    assert n.args[3] is None and n.args[4] is True


# --- 2. scaling by a 0-dim tensor --------------------------------------------------------------

class ScaleFull(nn.Module):
    def forward(self, q, k, v):
        s = q @ k.transpose(-1, -2) / torch.full([], q.size(-1) ** 0.5)
        return torch.softmax(s, -1) @ v


class ScaleTensorSqrt(nn.Module):
    def forward(self, q, k, v):
        s = q @ k.transpose(-1, -2) / torch.tensor(q.size(-1)).sqrt()
        return torch.softmax(s, -1) @ v


class ScaleLearned(nn.Module):
    """A learned 0-dim temperature: a parameter, so it stays a tensor (the kernel's head_scale)."""

    def __init__(self):
        super().__init__()
        self.temperature = nn.Parameter(torch.tensor(0.3))

    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) * self.temperature, -1) @ v


@pytest.mark.parametrize("model", [ScaleFull, ScaleTensorSqrt])
def test_scale_by_a_constant_0dim_tensor_folds(model):
    tm, _ = run(model(), qkv(d=16))
    n = attention_node(tm)
    assert n.args[5] == pytest.approx(0.25) and len(n.args) == 6


def test_scale_by_a_learned_0dim_parameter_is_a_head_scale():
    tm, _ = run(ScaleLearned(), qkv(d=16))
    n = attention_node(tm)
    assert n.args[5] == 1.0 and n.args[7] is not None
