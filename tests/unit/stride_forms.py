"""One small model per lowering form, for the stride contract test (tests/unit/test_strides.py):
each is the aten op a family replaces, fed inputs in the layouts real models give it
(transposed projections, [B, S, H, D] heads viewed as [B, H, S, D]), and followed by what reads
its strides (a ``view`` that only eager's layout allows, or nothing: the output itself)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


from test_registry import Fn, _r as r  # fn(its submodules, *inputs) as a module; seeded randn


def heads(x, h):
    """[B, S, H*D] -> [B, H, S, D] as a view (the projection's [B, S, H, D] memory)."""
    b, s, _ = x.shape
    return x.view(b, s, h, -1).transpose(1, 2)


def merge(y):
    """gpt-fast's ``y.transpose(1, 2).contiguous().view(B, S, H*D)``: export keeps the view only."""
    b, h, s, d = y.shape
    return y.transpose(1, 2).contiguous().view(b, s, h * d)


def sdpa_bshd(**kw):
    """SDPA on heads viewed from [B, S, H, D] projections (gpt-fast, HF Llama), output merged back."""
    hkv = kw.pop("hkv", 4)

    def f(m, x, mask=None):
        q, k, v = heads(m[0](x), 4), heads(m[1](x), hkv), heads(m[2](x), hkv)
        return merge(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw))
    return f


def _lin(i, o, bias=False):
    torch.manual_seed(i * 7 + o)
    return nn.Linear(i, o, bias=bias)


def handwritten(m, x):
    q, k, v = heads(m[0](x), 4), heads(m[1](x), 4), heads(m[2](x), 4)
    p = torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1)
    return merge(p @ v)


def handwritten_masked(m, x, mask):
    q, k, v = heads(m[0](x), 4), heads(m[1](x), 4), heads(m[2](x), 4)
    s = (q @ k.transpose(-1, -2)) / 4.0
    s = s.masked_fill(~mask, float("-inf"))
    return merge(torch.softmax(s, -1) @ v)


B, S, D = 2, 8, 64
CAUSAL = torch.ones(S, S, dtype=torch.bool).tril()

# name -> (family the form lowers to, model, inputs)
FORMS = {
    # gemm family
    "linear": ("gemm", Fn(lambda m, x: m[0](x).view(-1), _lin(32, 24)), (r(4, 32),)),
    "linear_3d_bias": ("gemm", Fn(lambda m, x: m[0](x), _lin(32, 24, True)), (r(2, 5, 32),)),
    "linear_transposed_in": ("gemm", Fn(lambda m, x: m[0](x.transpose(1, 2)), _lin(32, 24)), (r(2, 32, 5),)),
    "addmm": ("gemm", Fn(lambda m, x: torch.addmm(m[0].bias, x, m[0].weight.t()), _lin(32, 24, True)), (r(4, 32),)),
    "mm_transposed": ("bmm", Fn(lambda m, x: (x.t() @ m[0].weight.t()).view(-1), _lin(32, 24)), (r(32, 4),)),
    "matmul_3d": ("bmm", Fn(lambda m, x: x @ m[0].weight.t(), _lin(32, 24)), (r(2, 5, 32),)),
    "matmul_activations": ("bmm", Fn(lambda m, x, w: x @ w), (r(2, 5, 32), r(32, 24))),
    "bmm": ("bmm", Fn(lambda m, a, b: torch.bmm(a, b)), (r(2, 5, 16), r(2, 16, 9))),
    "bmm_transposed": ("bmm", Fn(lambda m, a, b: a.transpose(1, 2) @ b), (r(2, 16, 5), r(2, 16, 9))),
    "einsum": ("bmm", Fn(lambda m, a, b: torch.einsum("bij,bjk->bik", a, b)), (r(2, 5, 16), r(2, 16, 9))),
    # gemm epilogue and gated MLP
    "linear_gelu": ("gemm", Fn(lambda m, x: F.gelu(m[0](x)), _lin(32, 24, True)), (r(4, 32),)),
    "linear_residual": ("gemm", Fn(lambda m, x, y: m[0](x) + y, _lin(32, 24)), (r(4, 32), r(4, 24))),
    "gated_mlp": ("gemm_gated", Fn(lambda m, x: m[2](F.silu(m[0](x)) * m[1](x)), _lin(32, 48), _lin(32, 48),
                                   _lin(48, 32)), (r(2, 5, 32),)),
    # attention: SDPA layouts and options, hand-written forms
    "sdpa_contiguous": ("attention", Fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v)),
                        (r(B, 4, S, 16), r(B, 4, S, 16, seed=1), r(B, 4, S, 16, seed=2))),
    "sdpa_bshd": ("attention", Fn(sdpa_bshd(), _lin(D, D), _lin(D, D), _lin(D, D)), (r(B, S, D),)),
    "sdpa_bshd_causal": ("attention", Fn(sdpa_bshd(is_causal=True), _lin(D, D), _lin(D, D), _lin(D, D)), (r(B, S, D),)),
    "sdpa_bshd_float_mask": ("attention", Fn(sdpa_bshd(), _lin(D, D), _lin(D, D), _lin(D, D)),
                             (r(B, S, D), r(S, S))),
    "sdpa_bshd_bool_mask": ("attention", Fn(sdpa_bshd(), _lin(D, D), _lin(D, D), _lin(D, D)), (r(B, S, D), CAUSAL)),
    "sdpa_bshd_gqa": ("attention", Fn(sdpa_bshd(hkv=2, enable_gqa=True), _lin(D, D), _lin(D, D // 2),
                                      _lin(D, D // 2)), (r(B, S, D),)),
    "sdpa_bshd_mqa": ("attention", Fn(sdpa_bshd(hkv=1), _lin(D, D), _lin(D, D // 4), _lin(D, D // 4)), (r(B, S, D),)),
    "sdpa_decode": ("attention", Fn(lambda m, q, k, v: merge(F.scaled_dot_product_attention(
        heads(q, 4), k, v)), ), (r(B, 1, D), r(B, 4, S, 16), r(B, 4, S, 16, seed=1))),
    "attention_handwritten": ("attention", Fn(handwritten, _lin(D, D), _lin(D, D), _lin(D, D)), (r(B, S, D),)),
    "attention_handwritten_masked": ("attention", Fn(handwritten_masked, _lin(D, D), _lin(D, D), _lin(D, D)),
                                     (r(B, S, D), CAUSAL)),
    # rows
    "softmax": ("softmax", Fn(lambda m, x: torch.softmax(x, -1)), (r(6, 50),)),
    "softmax_dim1": ("softmax", Fn(lambda m, x: torch.softmax(x, 1)), (r(2, 6, 5),)),
    "softmax_transposed": ("softmax", Fn(lambda m, x: torch.softmax(x.transpose(0, 1), -1).view(-1)), (r(50, 6),)),
    "layer_norm": ("layer_norm", Fn(lambda m, x: m[0](x), nn.LayerNorm(48)), (r(6, 48),)),
    "layer_norm_transposed": ("layer_norm", Fn(lambda m, x: m[0](x.transpose(1, 2)), nn.LayerNorm(48)),
                              (r(2, 48, 6),)),
    "rms_norm": ("rms_norm", Fn(lambda m, x: m[0](x), nn.RMSNorm(48, eps=1e-6)), (r(6, 48),)),
    "rms_norm_handwritten": ("rms_norm", Fn(lambda m, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
                                            * m[0].weight, nn.RMSNorm(48)), (r(6, 48),)),
    "add_layer_norm": ("add_layer_norm", Fn(lambda m, x, y: (lambda h: (h, m[0](h)))(x + y), nn.LayerNorm(48)),
                       (r(6, 48), r(6, 48, seed=1))),
    "group_norm": ("group_norm", Fn(lambda m, x: m[0](x), nn.GroupNorm(4, 16)), (r(2, 16, 5, 3),)),
    "group_norm_channels_last": ("group_norm", Fn(lambda m, x: m[0](x), nn.GroupNorm(4, 16)),
                                 (r(2, 16, 5, 3).to(memory_format=torch.channels_last),)),
    # per element, reductions, scans
    "elementwise": ("fused_elementwise", Fn(lambda m, a, b: torch.tanh(a) * torch.sigmoid(b)), (r(6, 33), r(6, 33))),
    "elementwise_transposed": ("fused_elementwise", Fn(lambda m, a: (a.transpose(0, 1).exp() + 1).transpose(0, 1).view(-1)),
                               (r(6, 33),)),
    "elementwise_broadcast": ("fused_elementwise", Fn(lambda m, a, b: a * b + 1), (r(6, 1, 5), r(4, 1))),
    "reduce": ("fused_reduce", Fn(lambda m, x: (x * x).mean(-1)), (r(6, 70),)),
    "reduce_keepdim_dim0": ("fused_reduce", Fn(lambda m, x: x.amax(0, keepdim=True)), (r(6, 70),)),
    "reduce_transposed": ("fused_reduce", Fn(lambda m, x: x.transpose(1, 2).sum(-1)), (r(2, 5, 7),)),
    "scan": ("scan", Fn(lambda m, x: torch.cumsum(x, 1)), (r(4, 37),)),
    "scan_dim0": ("scan", Fn(lambda m, x: torch.cumsum(x, 0)), (r(4, 37),)),
    # layout and gathers
    "pad": ("layout", Fn(lambda m, x: F.pad(x, (1, 2, 0, 1))), (r(5, 6),)),
    "roll": ("layout", Fn(lambda m, x: torch.roll(x, 2, 1)), (r(5, 6),)),
    "repeat": ("layout", Fn(lambda m, x: x.repeat(2, 1)), (r(5, 6),)),
    "expand_contiguous": ("layout", Fn(lambda m, x: x.expand(3, 5, 6).contiguous()), (r(1, 5, 6),)),
    "index_select": ("layout", Fn(lambda m, x, i: x.index_select(0, i)), (r(5, 6), torch.tensor([3, 0, 2]))),
    "index": ("layout", Fn(lambda m, x, i: x[:, i]), (r(5, 6), torch.tensor([3, 0, 2]))),
    "repeat_interleave": ("layout", Fn(lambda m, x: x.repeat_interleave(2, dim=1)), (r(2, 2, 5, 8),)),
    "unfold": ("layout", Fn(lambda m, x: x.unfold(1, 3, 2).contiguous()), (r(4, 9),)),
    "embedding": ("embedding", Fn(lambda m, i: m[0](i), nn.Embedding(40, 24)),
                  (torch.randint(0, 40, (3, 5), generator=torch.Generator().manual_seed(0)),)),
    # losses (decomposed into reductions)
    "cross_entropy": ("fused_reduce", Fn(lambda m, x, t: F.cross_entropy(x, t)),
                      (r(6, 10), torch.randint(0, 10, (6,), generator=torch.Generator().manual_seed(1)))),
    "mse_loss": ("fused_reduce", Fn(lambda m, x, y: F.mse_loss(x, y)), (r(6, 10), r(6, 10, seed=1))),
}
