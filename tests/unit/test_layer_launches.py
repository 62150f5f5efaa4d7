"""Fewer launches per Llama layer: sibling projections in one GEMM (lowerings/qkv.py), K/V read
unrepeated by SDPA (lowerings/attention.py), RoPE in one elementwise kernel (lowerings/rope.py).

Each rewrite: the counter moved and the numerics match eager (reference backend for the small
forms, flysim where a kernel is named); a form that is not the pattern is left alone. The layer
count is measured from the translated graph of a tiny HF Llama and the gpt-fast-style model:
FlyDSL nodes of 2 layers minus those of 1 (before these rewrites: 15 and 13; then 9 and 9 + 2 cache
writes; with RoPE q, k and the cache writes in one kernel, lowerings/rope_cache.py: 8 and 8; at decode, with
both RMSNorms folded into the GEMMs that read them, lowerings/norm_gemm.py: 6 and 6)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import translator
from translator.tolerances import model_tol

from stride_forms import Fn, heads, merge, r

VIEWS = {"view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "expand", "slice", "select", "t",
         "_unsafe_view", "alias", "flatten", "unflatten", "split_with_sizes", "getitem", "_assert_tensor_metadata",
         "sym_size", "detach", "_to_copy", "to", "type_as"}


def _counts(tm):
    """(FlyDSL compute launches, PyTorch compute ops): the cache writes (flydsl.cache_write, the state
    contract's scatter kernel) are counted apart, by the per-layer test."""
    fly = sum(1 for n in tm.gm.graph.nodes if getattr(n.target, "namespace", None) == "flydsl"
              and n.target is not torch.ops.flydsl.cache_write.default)
    torch_ops = [n for n in tm.gm.graph.nodes if n.op == "call_function" and getattr(n.target, "namespace", None)
                 != "flydsl" and getattr(n.target, "__name__", str(n.target)).split(".")[0] not in VIEWS]
    return fly, torch_ops


def _check(model, inputs, backend="reference", **counters):
    tm = translator.translate(model.eval(), inputs, backend=backend, dynamic_shapes=None)
    assert tm.report.verification.passed, tm.report.verification.message
    for k, v in counters.items():
        assert tm.report.counters.get(k, 0) == v, (k, tm.report.counters)
    with torch.no_grad():
        torch.testing.assert_close(tm(*inputs), model(*inputs), **model_tol())
    return tm


def _lin(i, o, bias=False, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(i, o, bias=bias)


# --- Q, K, V in one GEMM ----------------------------------------------------------------------

def test_qkv_projections_become_one_gemm():
    m = Fn(lambda m, x: merge(F.scaled_dot_product_attention(heads(m[0](x), 4), heads(m[1](x), 4), heads(m[2](x), 4))),
           _lin(64, 64, True, 1), _lin(64, 64, True, 2), _lin(64, 64, True, 3))
    tm = _check(m, (r(2, 8, 64),), qkv=1, linear=0)
    gemms = [n for n in tm.gm.graph.nodes if n.target is torch.ops.flydsl.gemm.default]
    assert len(gemms) == 1


def test_qkv_of_other_widths_and_a_bias_mismatch():
    m = Fn(lambda m, x: (m[0](x), m[1](x), m[2](x)), _lin(32, 48, seed=1), _lin(32, 16, seed=2),
           _lin(32, 24, True, 3))  # the third has a bias: only the first two merge
    _check(m, (r(3, 32),), qkv=1, linear=1)


def test_linears_of_different_inputs_stay_apart():
    m = Fn(lambda m, x, y: m[0](x) + m[1](y), _lin(32, 16, seed=1), _lin(32, 16, seed=2))
    _check(m, (r(3, 32), r(3, 32, seed=1)), qkv=0, linear=2)


def test_qkv_on_flysim_under_bf16_precision():
    m = Fn(lambda m, x: m[0](x) * m[1](x).sigmoid(), _lin(32, 48, seed=1), _lin(32, 48, seed=2))
    tm = translator.translate(m.eval(), (r(4, 32),), backend="flysim", precision="bf16", dynamic_shapes=None)
    assert tm.report.verification.passed, tm.report.verification.message
    assert tm.report.counters.get("qkv") == 1
    assert any(c.family == "gemm" and c.launches for c in tm.last_calls)


# --- K / V repeated to every head -------------------------------------------------------------

def _repeat_kv(x, n):
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


@pytest.mark.parametrize("how", ["repeat_kv", "repeat_interleave"])
def test_sdpa_reads_k_and_v_unrepeated(how):
    rep = _repeat_kv if how == "repeat_kv" else (lambda t, n: t.repeat_interleave(n, dim=1))
    m = Fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, rep(k, 2), rep(v, 2), is_causal=True))
    tm = _check(m, (r(1, 4, 8, 16), r(1, 2, 8, 16, seed=1), r(1, 2, 8, 16, seed=2)), sdpa_unexpand_kv=1, sdpa=1)
    assert not [n for n in tm.gm.graph.nodes if n.target is torch.ops.flydsl.layout.default]


# --- RoPE ------------------------------------------------------------------------------------

def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _tables(s, d):
    ang = torch.arange(s)[:, None] * (1.0 / 10000 ** (torch.arange(0, d, 2) / d))[None]
    emb = torch.cat((ang, ang), -1)
    return emb.cos()[None, None], emb.sin()[None, None]


def test_rotate_half_rope_is_one_kernel_on_flysim():
    cos, sin = _tables(8, 16)
    m = Fn(lambda m, q, c, s: (q * c) + (rotate_half(q) * s))
    tm = _check(m, (r(1, 2, 8, 16), cos, sin), backend="flysim", rope_rotate_half=1)
    fly, rest = _counts(tm)
    assert fly == 1 and not rest, (fly, [n.format_node() for n in rest])
    assert [c.family for c in tm.last_calls] == ["rope"] and tm.last_calls[0].launches


def test_rotate_half_of_another_order_is_left_alone():
    cos, sin = _tables(8, 16)
    other = lambda x: torch.cat((x[..., 8:], -x[..., :8]), -1)  # noqa: E731  (not rotate_half)
    _check(Fn(lambda m, q, c, s: q * c + other(q) * s), (r(1, 2, 8, 16), cos, sin), rope_rotate_half=0)


def gptfast_rope(x, f):
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    f = f.view(1, xs.size(1), 1, xs.size(3), 2)
    out = torch.stack([xs[..., 0] * f[..., 0] - xs[..., 1] * f[..., 1],
                       xs[..., 1] * f[..., 0] + xs[..., 0] * f[..., 1]], -1)
    return out.flatten(3).type_as(x)


def test_interleaved_rope_with_stack_is_one_kernel_on_flysim():
    f = torch.stack([torch.cos(torch.arange(32.0)).view(8, 4), torch.sin(torch.arange(32.0)).view(8, 4)], -1)
    tm = _check(Fn(lambda m, x, f: gptfast_rope(x, f)), (r(1, 8, 2, 8), f), backend="flysim", rope_stack=1)
    fly, rest = _counts(tm)
    assert fly == 1 and not rest, (fly, [n.format_node() for n in rest])


def test_bf16_rope_reads_and_writes_bf16_in_its_one_launch_on_flysim():
    """gpt-fast's x.float() before and .type_as(x) after the rotation of a bf16 tensor: no cast kernel
    left (rope_casts.py); the kernel reads bf16, computes in fp32 and rounds once: eager's values exactly."""
    f = torch.stack([torch.cos(torch.arange(32.0)).view(8, 4), torch.sin(torch.arange(32.0)).view(8, 4)], -1)
    x = r(1, 8, 2, 8).to(torch.bfloat16)
    m = Fn(lambda m, x, f: gptfast_rope(x, f))
    tm = _check(m, (x, f), backend="flysim", rope_stack=1, rope_casts=2)
    fly, rest = _counts(tm)
    assert fly == 1 and not rest, (fly, [n.format_node() for n in rest])
    with torch.no_grad():
        got = tm(x, f)
    assert got.dtype == torch.bfloat16 and torch.equal(got, m(x, f))
    assert [c.family for c in tm.last_calls] == ["rope"] and tm.last_calls[0].launches


class ComplexRope(nn.Module):
    """Meta's llama RoPE: complex multiply by a precomputed polar table (a buffer)."""

    def __init__(self, dim=16, end=32):
        super().__init__()
        freqs = 1.0 / (10000.0 ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
        self.register_buffer("freqs_cis", torch.polar(torch.ones(end, dim // 2), torch.outer(torch.arange(end), freqs)))

    def forward(self, xq, xk):
        s = xq.shape[1]
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        fc = self.freqs_cis[:s].view(1, s, 1, xq_.shape[-1])
        return (torch.view_as_real(xq_ * fc).flatten(3).type_as(xq),
                torch.view_as_real(xk_ * fc).flatten(3).type_as(xk))


def test_complex_rope_is_one_kernel_per_tensor_on_flysim():
    m = ComplexRope().eval()
    x = (r(1, 8, 4, 16), r(1, 8, 2, 16, seed=1))
    tm = translator.translate(m, x, backend="flysim", dynamic_shapes=None)
    assert tm.report.verification.passed, tm.report.verification.message
    assert tm.report.counters.get("rope_complex") == 2
    fly, rest = _counts(tm)
    assert fly == 2 and not rest, (fly, [n.format_node() for n in rest])
    with torch.no_grad():
        for g, w in zip(tm(*x), m(*x)):
            torch.testing.assert_close(g, w, **model_tol())


# --- per layer ---------------------------------------------------------------------------------

def _hf_llama(layers):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=128, num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=256, max_position_embeddings=64)
    m = transformers.LlamaForCausalLM(cfg)
    m.config._attn_implementation = "sdpa"
    return m.eval(), (torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(0)),)


def _gptfast(layers):
    from gptfast_model import build

    return build(n_layer=layers), (torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0)),
                                   torch.arange(8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("make", [_hf_llama, _gptfast], ids=["hf_llama", "gpt_fast"])
def test_a_llama_layer_is_eight_launches(make, dtype):
    """RMSNorm, QKV GEMM, RoPE q + k (+ the K / V cache writes), attention, O projection, RMSNorm,
    gated MLP, down projection: 8 (before the fused RoPE / cache kernel: 9 + 2 cache writes). A bf16
    model too: gpt-fast's casts to fp32 and back around each rotation are folded into the RoPE launch
    (before: 13, four cast kernels and q and k in two launches)."""
    per = []
    for layers in (1, 2):
        m, x = make(layers)
        m = m.to(dtype)
        tm = translator.translate(m, x, backend="reference", dynamic_shapes=None)
        assert tm.report.verification.passed, tm.report.verification.message
        per.append(_counts(tm))
    (f1, r1), (f2, r2) = per
    assert f2 - f1 == 8, f"{f2 - f1} FlyDSL launches per layer"
    writes = sum(1 for n in tm.gm.graph.nodes if n.target is torch.ops.flydsl.cache_write.default)
    assert writes == 0  # gpt-fast's K and V cache writes are inside the RoPE kernel's launch
    ropes = [n for n in tm.gm.graph.nodes if n.target is torch.ops.flydsl.rope.default]
    assert len(ropes) == 2 and all(len(n.args[0]) == 2 for n in ropes)  # q and k: one launch per layer
    assert all((n.args[4] is not None) == (make is _gptfast) for n in ropes)  # the k cache written by it
    assert tm.report.counters.get("rope_cache_write" if make is _gptfast else "rope_qk") == 2
    assert tm.report.counters.get("rope_casts", 0) == (8 if make is _gptfast and dtype == torch.bfloat16 else 0)
    assert len(r2) == len(r1), f"PyTorch compute ops added per layer: {[n.format_node() for n in r2]}"


@pytest.mark.parametrize("make", [_hf_llama, _gptfast], ids=["hf_llama", "gpt_fast"])
def test_a_llama_layer_at_decode_is_six_launches(make):
    """At one token (decode: M = 1 <= norm_gemm.M_MAX) both RMSNorms fold into the GEMMs that read them, the QKV
    GEMM and the gated MLP GEMM (lowerings/norm_gemm.py): 8 -> 6. The prefill shape above (8 tokens) keeps them."""
    per = []
    for layers in (1, 2):
        m, x = make(layers)
        x = (x[0][:, :1],) + ((torch.tensor([3]),) if len(x) > 1 else ())
        tm = translator.translate(m, x, backend="reference", dynamic_shapes=None)
        assert tm.report.verification.passed, tm.report.verification.message
        assert tm.report.counters.get("norm_gemm") == 2 * layers + 1  # + the final norm into the LM head
        per.append(_counts(tm))
    (f1, r1), (f2, r2) = per
    assert f2 - f1 == 6, f"{f2 - f1} FlyDSL launches per layer"
    assert len(r2) == len(r1), f"PyTorch compute ops added per layer: {[n.format_node() for n in r2]}"
