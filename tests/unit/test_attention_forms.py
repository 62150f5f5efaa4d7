"""Attention as model authors write it (issue 15's forms), each through translate(): the
rewrite fired (the attention_handwritten counter, one flydsl.attention node, no softmax or bmm
left) and the numerics match eager on flysim (the attention kernel launched)."""

from __future__ import annotations

import math

import pytest
import torch
from translator.tolerances import model_tol
import torch.nn as nn
import torch.nn.functional as F

from translator import translate
from translator_kernels import launch as kl

from attention_helpers import attention_node, ops as flydsl_ops, run_attention  # noqa: E402  (tests/unit on sys.path)
from attention_audit_forms import Sdpa  # noqa: E402

pytest.importorskip("flysim")

FINFO_MIN = torch.finfo(torch.float32).min


def run(model, inputs, backend="flysim", chain_ops=("softmax", "bmm", "fused_elementwise")):
    return run_attention(model, inputs, backend, chain_ops)


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


class GPT2SelfAttention(GPT2EagerWhere):
    """The same attention with q, k, v split from one projection: Sq and Sk are one size."""

    def __init__(self, d=32, h=2):
        super().__init__()
        self.h = h
        self.c_attn = nn.Linear(d, 3 * d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (y.view(b, t, self.h, c // self.h).transpose(1, 2) for y in self.c_attn(x).split(c, dim=2))
        return super().forward(q, k, v).transpose(1, 2).reshape(b, t, c)


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
    # the slice starts at Sk - Sq, not provably 0 for separate q and k: the sliced buffer is the keep-mask
    assert n.args[4] is False and n.args[3].meta["val"].dtype == torch.bool


def test_gpt2_self_attention_where_is_causal():
    tm, _ = run(GPT2SelfAttention(), (randn(2, 8, 32),))
    n = attention_node(tm)
    assert n.args[3] is None and n.args[4] is True  # Sk - Sq == 0: the tril buffer is the causal flag


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


# --- 3. nn.MultiheadAttention with its default need_weights=True, weights dropped --------------

class MHA(nn.Module):
    def __init__(self, batch_first):
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 2, batch_first=batch_first)

    def forward(self, x):
        out, _weights = self.attn(x, x, x)  # the head-averaged weights are computed, then dropped
        return out


class MHAPadded(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 2, batch_first=True)

    def forward(self, x, pad):  # the mask arrives as baddbmm(mask, q * scale, kᵀ)
        return self.attn(x, x, x, key_padding_mask=pad)[0]


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_with_unused_weights(batch_first):
    x = randn(2, 8, 32) if batch_first else randn(8, 2, 32)
    tm, _ = run(MHA(batch_first), (x,))
    n = attention_node(tm)
    assert n.args[5] == pytest.approx(16 ** -0.5)  # q's pre-scaling folded into the kernel's scale
    assert list(n.args[0].meta["val"].shape) == [1, 4, 8, 16]  # [B*H, S, D] as one batch of B*H heads
    assert "mean" not in tm.code


def test_multihead_attention_with_a_key_padding_mask():
    pad = torch.zeros(2, 8, dtype=torch.bool)
    pad[1, 5:] = True
    # MHA turns the bool padding mask into an additive one (zeros_like + masked_fill -inf): that mask
    # preparation reads only `pad`, is not part of the chain, and runs as one fused_elementwise kernel
    tm, _ = run(MHAPadded(), (randn(2, 8, 32), pad), chain_ops=("softmax", "bmm"))
    prep = [n for n in tm.gm.graph.nodes if "fused_elementwise" in str(n.target)]
    assert len(prep) == 1 and {a.name for a in prep[0].all_input_nodes} == {"pad"}, tm.code
    n = attention_node(tm)
    assert n.args[3] is not None and n.args[5] == pytest.approx(16 ** -0.5)


# --- 4. soft-cap (Gemma-2) and cosine attention with a learned per-head scale (Swin-V2) ---------

class Gemma2Eager(nn.Module):
    def __init__(self, softcap=50.0, head_dim=16):
        super().__init__()
        self.softcap, self.scaling = softcap, head_dim ** -0.5

    def forward(self, q, k, v, mask):
        w = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        w = w / self.softcap
        w = torch.tanh(w)
        w = w * self.softcap
        w = w + mask[:, :, :, : k.shape[-2]]
        w = nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(w, v)


class SwinV2Cosine(nn.Module):
    def __init__(self, heads=2):
        super().__init__()
        self.logit_scale = nn.Parameter(torch.log(10 * torch.rand((heads, 1, 1)) + 1))

    def forward(self, q, k, v, bias):
        attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        logit_scale = torch.clamp(self.logit_scale, max=math.log(1.0 / 0.01)).exp()
        attn = attn * logit_scale
        attn = attn + bias.unsqueeze(0)
        return attn.softmax(dim=-1) @ v


def test_gemma2_soft_cap():
    q, k, v = qkv(s=8)
    mask = torch.triu(torch.full((8, 8), FINFO_MIN), 1)[None, None]
    tm, _ = run(Gemma2Eager(softcap=2.0), (q * 4, k * 4, v, mask))  # scores large enough to be capped
    n = attention_node(tm)
    assert n.args[5] == pytest.approx(0.25) and n.args[6] == 2.0 and n.args[7] is None


def test_swin_v2_cosine_attention_per_head_scale():
    q, k, v = qkv(h=2, s=8)
    model = SwinV2Cosine(heads=2)
    tm, _ = run(model, (q, k, v, randn(2, 8, 8, seed=4)), chain_ops=("softmax", "bmm"))  # normalize: elementwise
    n = attention_node(tm)
    assert n.args[5] == 1.0 and n.args[6] is None
    assert list(n.args[7].meta["val"].shape) == [2, 1, 1]  # exp(clamp(logit_scale)): one scale per head


def test_mask_before_soft_cap_is_declined_with_its_reason():
    class CapAfterMask(nn.Module):
        def forward(self, q, k, v, mask):
            w = q @ k.transpose(-1, -2) + mask
            return torch.softmax(torch.tanh(w / 30.0) * 30.0, -1) @ v

    q, k, v = qkv()
    tm = translate(CapAfterMask().eval(), (q, k, v, torch.zeros(1, 1, 8, 8)), backend="reference")
    assert not tm.report.counters.get("attention_handwritten")
    assert any("not taken by attention: an additive mask is applied before the soft-cap" in r.detail
               for r in tm.report.rows if r.op == "aten.softmax"), [(r.op, r.detail) for r in tm.report.rows]


# --- 5. K / V expanded for MQA / GQA: absorbed into KV-head indexing ---------------------------

def repeat_kv(x, n):
    b, kvh, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kvh, n, s, d).reshape(b, kvh * n, s, d)


class GQA(nn.Module):
    def __init__(self, how, n):
        super().__init__()
        self.how, self.n = how, n

    def expand(self, x):
        b, kvh, s, d = x.shape
        if self.how == "repeat_interleave":
            return x.repeat_interleave(self.n, dim=1)
        if self.how == "expand_reshape":
            return x.unsqueeze(2).expand(b, kvh, self.n, s, d).reshape(b, kvh * self.n, s, d)
        if self.how == "mqa_expand":
            return x.expand(b, self.n, s, d)
        return repeat_kv(x, self.n)

    def forward(self, q, k, v):
        k, v = self.expand(k), self.expand(v)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.size(-1))
        return torch.matmul(torch.softmax(w, -1), v)


@pytest.mark.parametrize("how,hkv", [("repeat_interleave", 2), ("expand_reshape", 2), ("repeat_kv", 1),
                                     ("mqa_expand", 1)])
def test_kv_expansion_becomes_kv_head_indexing(how, hkv):
    q, k, v = qkv(h=4, hkv=hkv, s=8)
    tm, uses = run(GQA(how, 4 // hkv), (q, k, v))
    n = attention_node(tm)
    assert n.args[1].meta["val"].shape[1] == hkv and n.args[2].meta["val"].shape[1] == hkv  # no H copies
    assert not any(op in tm.code for op in ("repeat_interleave", "expand", "reshape"))
    (use,) = [u for u in uses if "attention" in kl.kernel_name(u.launcher)]
    assert use.args[1][0] == "tensor" and use.args[1][2][1] == hkv  # the kernel reads the Hkv-head K ...
    assert use.args[13] == ("int", 4 // hkv)  # ... with group = H / Hkv (the launch: after the split counters)


# --- 6. in-place bias add (T5), also on a view of the scores ----------------------------------

class T5Inplace(nn.Module):
    def forward(self, q, k, v, position_bias):
        scores = torch.matmul(q, k.transpose(3, 2))
        scores += position_bias
        w = nn.functional.softmax(scores.float(), dim=-1).type_as(scores)
        return torch.matmul(w, v)


class InplaceOnView(nn.Module):
    """torch's old multi_head_attention_forward: bmm scores viewed per head, then a bias added in place."""

    def forward(self, q, k, v, bias):
        b, h, s, d = q.shape
        w = torch.bmm(q.reshape(b * h, s, d) * d ** -0.5, k.reshape(b * h, s, d).transpose(1, 2))
        w = w.view(b, h, s, s)
        w += bias
        w = torch.softmax(w, -1).view(b * h, s, s)
        return torch.bmm(w, v.reshape(b * h, s, d)).view(b, h, s, d)


@pytest.mark.parametrize("model", [T5Inplace, InplaceOnView])
def test_inplace_bias_add_is_seen_through(model):
    q, k, v = qkv(s=8)
    tm, _ = run(model(), (q, k, v, randn(1, 2, 8, 8, seed=5)))
    assert tm.report.counters.get("functionalize") == 1
    assert attention_node(tm).args[3] is not None  # the bias is the kernel's additive mask


# --- 8. an SDPA the kernel declines runs as FlyDSL bmm + softmax ------------------------------

def sdpa_row(tm):
    (row,) = [r for r in tm.report.rows if r.op == "aten.scaled_dot_product_attention"]
    return row


def test_declined_sdpa_is_decomposed_into_flydsl_bmm_and_softmax():
    q, k = randn(1, 2, 8, 24, seed=1), randn(1, 2, 8, 24, seed=2)
    v = randn(1, 2, 8, 16, seed=3)  # a value head_dim unlike the query's (MLA-style): the kernel declines
    model = Sdpa(is_causal=True).eval()
    tm = translate(model, (q, k, v), backend="flysim")
    assert tm.report.counters.get("sdpa_decomposed") == 1 and not tm.report.counters.get("sdpa")
    # Q·Kᵀ and ·V on the bmm kernel, scale + causal where in one elementwise kernel, the softmax kernel
    assert sorted(flydsl_ops(tm)) == ["bmm", "bmm", "fused_elementwise", "softmax"], tm.code
    assert "not taken by attention: value head_dim 16 differs" in sdpa_row(tm).detail, sdpa_row(tm).detail
    assert tm.report.verification.passed, tm.report.verification.message
    torch.testing.assert_close(tm(q, k, v), model(q, k, v), **model_tol("fp32", "few_ops"))
    kernels = {getattr(x, "kernel", "") for x in tm.last_launches}
    assert any(k.startswith("gemm") for k in kernels) and any(k.startswith("softmax") for k in kernels), kernels


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_decomposed_sdpa_masks_and_gqa(mask_dtype):
    q, k, v = randn(2, 4, 6, 300, seed=1), randn(2, 2, 6, 300, seed=2), randn(2, 2, 6, 300, seed=3)  # D > 256
    mask = randn(2, 1, 6, 6, seed=4) > -0.5 if mask_dtype is torch.bool else randn(2, 1, 6, 6, seed=4)
    model = Sdpa(enable_gqa=True, scale=0.1).eval()
    tm = translate(model, (q, k, v, mask), backend="reference")
    assert tm.report.counters.get("sdpa_decomposed") == 1 and "softmax" in flydsl_ops(tm)
    assert "not taken by attention: head_dim=300 is outside 8..256" in sdpa_row(tm).detail
    torch.testing.assert_close(tm(q, k, v, mask), model(q, k, v, mask), **model_tol("fp32", "few_ops"))


def test_sdpa_no_flydsl_op_takes_stays_whole_with_its_reason():
    q = randn(1, 2, 4, 16).double()
    tm = translate(Sdpa().eval(), (q, q, q), backend="reference")
    assert not tm.report.counters.get("sdpa_decomposed") and not flydsl_ops(tm)
    assert sdpa_row(tm).detail.startswith("not taken by attention: query dtype float64"), sdpa_row(tm).detail


# --- einsum attention (Perceiver, x-transformers) ------------------------------------------------

class EinsumAttention(nn.Module):
    def forward(self, q, k, v):
        sim = torch.einsum("bhid,bhjd->bhij", q, k) * q.shape[-1] ** -0.5
        return torch.einsum("bhij,bhjd->bhid", sim.softmax(dim=-1), v)


def test_einsum_attention():
    tm, _ = run(EinsumAttention(), qkv())
    assert "einsum" not in tm.code


def test_sdpa_one_kv_head_broadcast_is_mqa_on_the_kernel():
    """Falcon's multi-query SDPA call: one key/value head broadcast over the query heads, no
    enable_gqa. It was declined ("head count differs ... without enable_gqa"); it is MQA."""
    q, k, v = randn(2, 4, 6, 16, seed=1), randn(2, 1, 6, 16, seed=2), randn(2, 1, 6, 16, seed=3)
    model = Sdpa(is_causal=True).eval()
    tm = translate(model, (q, k, v), backend="flysim")
    assert tm.report.verification.passed, tm.report.verification.message
    assert flydsl_ops(tm) == ["attention"] and sdpa_row(tm).flydsl_node, tm.code
    assert "not taken" not in sdpa_row(tm).detail, sdpa_row(tm).detail
    with torch.no_grad():
        got = tm(q, k, v)
    assert any("attention" in str(getattr(x, "kernel", x)) for x in tm.last_launches), tm.last_launches
    torch.testing.assert_close(got, model(q, k, v), **model_tol("fp32", "few_ops"))
