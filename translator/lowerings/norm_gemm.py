"""RMSNorm folded into the GEMM that reads it, at decode shapes: `flydsl.gemm(flydsl.rms_norm(x, γ))` ->
`flydsl.gemm(x, W·diag(γ), ..., eps)` (and the same for `flydsl.gemm_gated`).

Every pre-norm decoder layer writes it twice (HF Llama / Mistral / Qwen2, gpt-fast, Meta's llama):

    h = self.input_layernorm(x)                      # HF LlamaRMSNorm: x.float(), pow(2).mean(-1),
    q, k, v = self.q_proj(h), self.k_proj(h), ...    #   rsqrt, weight * x.to(dtype); gpt-fast:
    ...                                              #   _norm(x.float()).type_as(x) * weight
    h = self.post_attention_layernorm(x)
    out = self.down_proj(silu(self.gate_proj(h)) * self.up_proj(h))

By the time this CONSUMER rule runs the norm is one `flydsl.rms_norm` (norm.py, norm_patterns.py) and its
readers are one GEMM (the QKV merge, qkv.py; the gated gate + up GEMM, gated_mlp.py). Since
``rms_norm(x)·γ @ Wᵀ = rstd(x) ⊙ (x @ (W·diag(γ))ᵀ)`` per row, the rewrite gives the GEMM x itself, a new
prepared weight W·diag(γ) (made from the same parameters and γ: `derive` / `natural` of the GEMM's prepared
entry with γ folded in, fp32 product rounded once to W's dtype; rebuilt when W or γ changes, state.prepared;
the user's parameters untouched) and the norm's eps: the kernel computes rstd per row inside the GEMM launch
(translator_kernels/gemm/rownorm.py). The norm's launch is gone (two per layer: 8 -> 6).

Where it pays (the decode bound `M_MAX`): every GEMM workgroup re-reads its rows of x over the full K (the
split-K ones too), valid rows x K x element size each. With Llama-3-8B's decode tiles (16 x 16 x 128, split
2 on gfx942: 768 workgroups, about 2.5 per CU for the QKV GEMM) that is 8 KiB per workgroup and row in
bf16, and one dependent L2 round per 2 rows: at M = 1 about 20 KiB per CU and one L2 round (~0.4 us), at
M = 4 80 KiB and 2 rounds, at M = 16 320 KiB and 8 rounds (~3 us of latency alone), as much as the norm
launch it saves (~3.8 us: the 1.7 us graph-replay gap and the row kernel). So the rule takes M <= 4 (the
GEMM's M bucket 4: decode at batch 1-4), where the saving is clear; prefill and larger batches keep the norm
kernel.

Taken when: the norm's output is read by this GEMM only; one normalized dim of length K; x, the output and
the weight of one dtype (fp32 / bf16 / f16: the model's own, precision="fp32"; the precision modes cast
around both ops); M static and <= M_MAX; γ a parameter (or no γ); the GEMM's prepared weight has an entry
with its natural layout. Counter: `norm_gemm`. Numerics: eager rounds the normalized x (and x·γ) to the
dtype and then multiplies; here x is multiplied in its own dtype with W·γ rounded once, and the fp32
accumulator scaled by rstd: the same math in another rounding order (tests/e2e/test_norm_gemm.py: bf16
against eager).
"""

from __future__ import annotations

import functools
import math

import torch

from translator_kernels.gemm.gated import gated_weight
from translator_kernels.gemm.preshuffle import shuffle_weight

from ..graph import arg, dtype_of, is_call, set_args, shape_of, static_int, users
from ..registry import NO_MATCH, Match, Stage, rule
from ..state import entry_of
from . import gated_mlp, gemm, norm  # noqa: F401  (register the ops read here)

RMS = torch.ops.flydsl.rms_norm.default
GEMM = torch.ops.flydsl.gemm.default
GATED = torch.ops.flydsl.gemm_gated.default
M_MAX = 4  # rows: decode at batch 1-4 (module docstring)


def _fold(gamma, w):
    """W·diag(γ): the fp32 product rounded once to W's dtype."""
    return (w.float() * gamma.float()).to(w.dtype)


def folded_natural(natural, n_src: int, *srcs):
    """The GEMM's natural weight(s) (`natural(*srcs[:n_src])`: W, or the gated (Wg, Wu)) with γ = srcs[-1] folded."""
    w, gamma = natural(*srcs[:n_src]), srcs[n_src]
    return tuple(_fold(gamma, t) for t in w) if isinstance(w, tuple) else _fold(gamma, w)


def folded_gemm(natural, n_src: int, *srcs):
    return shuffle_weight(folded_natural(natural, n_src, *srcs))


def folded_gated(natural, n_src: int, *srcs):
    return gated_weight(*folded_natural(natural, n_src, *srcs))


def _rows(node) -> int | None:
    dims = [static_int(d) for d in (shape_of(node) or ())[:-1]]
    return None if any(d is None for d in dims) else math.prod(dims)


def norm_gemm_supported(node, ctx):
    a = arg(node, "a")
    if not is_call(a, RMS) or arg(node, "eps") is not None or ctx.precision != "fp32":
        return NO_MATCH
    x, shape, gamma_node = arg(a, "x"), arg(a, "normalized_shape"), arg(a, "weight")
    w_node, k = arg(node, "w"), arg(node, "k")
    # not taken (the norm stays its own kernel, no fallback: NO_MATCH): another reader, a norm over several dims,
    # a precision cast between, prefill / large batch (M > M_MAX), a computed γ, a weight without its entry
    if users(a) != [node] or list(shape) != [k] or ctx.denied([a]):
        return NO_MATCH
    m = _rows(a)
    if m is None or m > M_MAX or not dtype_of(x) == dtype_of(a) == w_node.meta["val"].dtype:
        return NO_MATCH
    gamma = None
    if gamma_node is not None:
        gamma = ctx.constant(gamma_node)
        if gamma is None or tuple(gamma.shape) != (k,) or not gamma.is_floating_point():
            return NO_MATCH
    entry = entry_of(ctx.gm, w_node.target) if w_node.op == "get_attr" else None
    if entry is None or entry[4] is None:
        return NO_MATCH
    return Match(norm=a, x=x, gamma=gamma, entry=entry, eps=float(arg(a, "eps")))


@rule(Stage.CONSUMER, GEMM, GATED, family="gemm", supported=norm_gemm_supported, name="norm_gemm",
      doc="gemm(rms_norm(x, γ)) at decode M -> gemm(x, W·diag(γ), eps): rstd inside the GEMM, one launch fewer")
def lower_norm_gemm(node, ctx, m):
    w_node = arg(node, "w")
    if m.gamma is not None:
        _, _, srcs, _, natural = m.entry
        relayout = folded_gated if node.target is GATED else folded_gemm
        w_node = ctx.add_constant(None, "norm_w", node, derive=functools.partial(relayout, natural, len(srcs)),
                                  sources=(*srcs, m.gamma),
                                  natural=functools.partial(folded_natural, natural, len(srcs)))
    ctx.absorb(node, [m.norm], prepend=True)
    set_args(node, a=m.x, w=w_node, eps=m.eps)
    ctx.erase_unused([m.norm])
    ctx.count("norm_gemm")
    return node
