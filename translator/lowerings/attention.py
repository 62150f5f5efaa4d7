"""Attention family: `flydsl.attention(q, k, v, mask, causal, scale, softcap, head_scale)`.

q [B, H, Sq, D], k / v [B, Hkv, Sk, D] with Hkv dividing H (GQA / MQA served without
repeating K/V), any D from 8 to 256, mask None or an additive float / boolean (True = keep)
tensor broadcastable to [B, H, Sq, Sk], causal with torch's top-left convention, scale default
1/sqrt(D). Scores are s = q·kᵀ * scale * head_scale[h] (head_scale: H per-head multipliers, as
Swin-V2's cosine attention), then softcap * tanh(s / softcap) when softcap is set (Gemma-2),
then the mask.

Forms matched (where they appear):
- ``aten.scaled_dot_product_attention`` — F.scaled_dot_product_attention in HF "sdpa"
  attention (BERT, GPT-2, Llama, ViT), nn.MultiheadAttention's fast path, timm, nanoGPT's
  flash branch. dropout_p must be 0 (eval).
An SDPA call the kernel declines is decomposed into bmm + softmax (attention_decompose.py);
hand-written attention (q @ kᵀ, mask, softmax, @ v) is matched in attention_patterns.py. Every
reason either gives reads "not taken by attention: ..." in the report (PREFIX).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from translator_kernels.attention import empty_in_order, kv_in_registers

from ..graph import aten, arg, dtype_of, dtype_reason, is_static, set_args, shape_of, val
from ..layouts import dim_order
from .attention_cache import cache_positions, gather_start
from .attention_forms import unexpand_kv
from ..registry import NO_MATCH, Match, OpFamily, Reason, Stage, register_family, rule
from ..runtime.ops import dispatch

MIN_HEAD_DIM, MAX_HEAD_DIM = 8, 256
HEAD_DIMS = range(MIN_HEAD_DIM, MAX_HEAD_DIM + 1)
PREFIX = "not taken by attention: "  # how the report starts every reason an attention chain was not fused


@torch.library.custom_op("flydsl::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
              causal: bool, scale: Optional[float], softcap: Optional[float] = None,
              head_scale: Optional[torch.Tensor] = None, out_order: Optional[list[int]] = None,
              q_pos: Optional[torch.Tensor] = None, sinks: Optional[torch.Tensor] = None,
              k_start: Optional[torch.Tensor] = None) -> torch.Tensor:
    return dispatch("attention", q, k, v, mask, causal, scale, softcap, head_scale, out_order, q_pos, sinks, k_start)


@attention.register_fake
def _(q, k, v, mask, causal, scale, softcap=None, head_scale=None, out_order=None, q_pos=None, sinks=None,
      k_start=None):
    return empty_in_order((*q.shape[:-1], v.shape[-1]), tuple(out_order or range(4)), dtype=q.dtype,
                          device=q.device)


def ref_attention(q, k, v, mask, causal, scale, softcap=None, head_scale=None, out_order=None, q_pos=None,
                  sinks=None, k_start=None):
    """The op's math in fp32 torch: scores, per-head scale, soft-cap, mask (q_pos: key k kept for
    row i iff k <= q_pos[i]; k_start: for batch row b iff k >= k_start[b]), softmax (sinks: one more
    logit per head in the denominator), · V;
    laid out in `out_order` as the kernel writes it. fp32 K / V with a 16-bit q are rounded to q's
    dtype first, as the kernel rounds them when it loads them."""
    if k.dtype != q.dtype:
        k, v = k.to(q.dtype), v.to(q.dtype)
    if q_pos is not None:
        keep = torch.arange(k.shape[-2], device=k.device)[None, :] <= q_pos.reshape(-1, 1)
        keep = keep.expand(q.shape[-2], -1)
        mask = keep if mask is None else (keep & mask if mask.dtype == torch.bool
                                          else mask.masked_fill(~keep, float("-inf")))
    if k_start is not None:  # [B, 1, 1, Sk]: batch row b's keys from k_start[b] on
        keep = torch.arange(k.shape[-2], device=k.device) >= k_start.reshape(-1, 1, 1, 1)
        mask = keep if mask is None else keep & mask
    out = _ref_math(q, k, v, mask, causal, scale, softcap, head_scale, sinks)
    o = empty_in_order(out.shape, tuple(out_order or range(4)), dtype=out.dtype, device=out.device)
    return o.copy_(out)


def _ref_math(q, k, v, mask, causal, scale, softcap, head_scale, sinks=None):
    h, hkv = q.shape[1], k.shape[1]
    if hkv != h:
        k = k.repeat_interleave(h // hkv, dim=1)
        v = v.repeat_interleave(h // hkv, dim=1)
    m = mask.float() if mask is not None and mask.dtype != torch.bool else mask
    if softcap is None and head_scale is None and sinks is None:
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m, is_causal=causal,
                                             scale=scale)
        return out.to(q.dtype)
    s = q.float() @ k.float().transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if head_scale is not None:
        s = s * head_scale.float().reshape(-1).expand(h).view(1, h, 1, 1)
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    if m is not None:
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m
    if sinks is not None:  # one more logit per head joins the denominator, then is dropped
        col = sinks.float().reshape(1, h, 1, 1).expand(*s.shape[:-1], 1)
        p = torch.softmax(torch.cat([s, col], -1), -1)[..., :-1]
    else:
        p = torch.softmax(s, -1).nan_to_num(0.0)  # a fully masked row gives 0, as SDPA and the kernel do
    return (p @ v.float()).to(q.dtype)


def kernel_attention(q, k, v, mask, causal, scale, softcap=None, head_scale=None, out_order=None, q_pos=None,
                     sinks=None, k_start=None):
    from translator_kernels.attention import attention as run

    return run(q, k, v, mask=mask, causal=causal, scale=scale, softcap=softcap, head_scale=head_scale,
               out_order=out_order, q_pos=q_pos, sinks=sinks, k_start=k_start)


def _sample(dt):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 17, 64, generator=g).to(dt)
    kv = torch.randn(1, 2, 17, 64, generator=g).to(dt)
    return (q, kv, kv.clone(), None, True, None)


register_family(OpFamily(
    name="attention", description="flash attention forward (online softmax), causal / masked / GQA",
    reference=ref_attention, kernel=kernel_attention, kernel_entry="translator_kernels.attention:attention",
    sample_inputs=_sample,
))


def sdpa_supported(node, ctx):
    q, k, v = arg(node, "query"), arg(node, "key"), arg(node, "value")
    mask = arg(node, "attn_mask", None)
    if arg(node, "dropout_p", 0.0) != 0.0:
        return f"dropout_p={arg(node, 'dropout_p', 0.0)} (training-mode dropout is not fused; only 0 is)"
    for t, nm in ((q, "query"), (k, "key"), (v, "value")):
        r = dtype_reason(t, nm)
        if r:
            return r
    if not (dtype_of(q) == dtype_of(k) == dtype_of(v)):
        return "query/key/value dtypes differ"
    if not (len(shape_of(q)) == len(shape_of(k)) == len(shape_of(v)) == 4):
        return "query/key/value are not 4-D [batch, heads, seq, head_dim]"
    d = shape_of(q)[-1]
    if not is_static(d, shape_of(k)[1], shape_of(q)[1]):
        return "head count or head_dim is dynamic"
    if d not in HEAD_DIMS:
        return f"head_dim={d} is outside {MIN_HEAD_DIM}..{MAX_HEAD_DIM} (the kernel pads up to 256)"
    if shape_of(v)[-1] != d:
        return f"value head_dim {shape_of(v)[-1]} differs from the query's {d} (not supported by the kernel)"
    h, hkv = shape_of(q)[1], shape_of(k)[1]
    if h % hkv:
        return f"{h} query heads are not a multiple of {hkv} key/value heads"
    if shape_of(v)[1] != hkv:
        return f"key has {hkv} heads, value {shape_of(v)[1]}"
    if hkv not in (h, 1) and not arg(node, "enable_gqa", False):
        # one key/value head broadcasts over the query heads (Falcon's multi-query SDPA call): MQA
        return "key/value head count differs from query's without enable_gqa"
    if mask is not None:
        if dtype_of(mask) not in (torch.bool, dtype_of(q), torch.float32):
            return f"attn_mask dtype {dtype_of(mask)} is not bool or the query's float dtype"
        if len(shape_of(mask)) > 4:
            return "attn_mask has more than 4 dims"
    return None


def _unexpanded(node):
    """(k base, v base, nodes of the expansions) when SDPA `node` reads K and V repeated from Hkv
    heads (HF's repeat_kv, repeat_interleave, MQA's expand; attention_forms.unexpand_kv), else None."""
    absorbed = []
    k, v = arg(node, "key"), arg(node, "value")
    kb, vb = unexpand_kv(k, absorbed), unexpand_kv(v, absorbed)
    if kb is k or vb is v or shape_of(kb)[1] != shape_of(vb)[1]:
        return None
    return kb, vb, absorbed


def unexpand_supported(node, ctx):
    m = _unexpanded(node)
    chain = []
    pos, start = cache_positions(arg(node, "attn_mask", None), arg(node, "key"), ctx, chain) or (None, None)
    if m is None and pos is None:
        return NO_MATCH
    reason = sdpa_supported(node, ctx)
    if reason:
        return reason
    kb, vb, absorbed = m or (None, None, [])
    return Match(kb=kb, vb=vb, absorbed=absorbed, pos=pos, start=start, mask_chain=chain)


@rule(Stage.PATTERN, aten.scaled_dot_product_attention.default, family="attention", supported=unexpand_supported,
      doc="SDPA on K / V repeated to every query head -> SDPA with enable_gqa on the unrepeated K / V; "
          "a static cache's mask tril_buffer[None, None, pos] -> flydsl.attention(q_pos=pos)")
def lower_sdpa_unexpand(node, ctx, m):
    """K and V repeated from Hkv heads before SDPA (HF's repeat_kv, gpt-fast's repeat_interleave)
    are read as they were: the kernel serves GQA (head h reads K/V head h // (H / Hkv), what both
    repetitions lay out) with no copy of K and V. The SDPA node stays, for the canonical rule,
    unless its mask is a static cache's causal mask (attention_cache.py): then it becomes
    flydsl.attention with q_pos here, and the mask's gather goes away."""
    if m.kb is not None:
        set_args(node, key=m.kb, value=m.vb, enable_gqa=True)
        ctx.count("sdpa_unexpand_kv")
    if m.pos is None:
        ctx.erase_unused(m.absorbed)
        return node
    ctx.count("sdpa_cache_positions")
    if m.start is not None:
        ctx.count("sdpa_cache_key_start")
    new = _emit_sdpa(node, ctx, None, m.pos, [*m.absorbed, *m.mask_chain], m.start)
    return new


def padding_gather_supported(node, ctx):
    m = []
    got = gather_start(node, m)
    return NO_MATCH if got is None else Match(start=got[0], kv=got[1], chain=m)


@rule(Stage.DECOMPOSE, aten.index.Tensor, family="attention", supported=padding_gather_supported,
      doc="HF's padding term am[b, kv] of am = arange(L) >= start[:, None] -> kv >= start[b] (elementwise)")
def lower_padding_gather(node, ctx, m):
    """The gather of a key-start padding mask (module notes) is a compare: `kv >= start` with start laid along
    dim 0, elementwise (the gather had no lowering: it ran in PyTorch where the mask stays a tensor, HF's eager
    attention), and the form `padding_start` reads as the attention's k_start."""
    start = m.start
    for d in range(1, len(shape_of(node))):
        start = ctx.insert(aten.unsqueeze.default, start, d, before=node)
    new = ctx.insert(aten.ge.Tensor, m.kv, start, before=node)
    node.replace_all_uses_with(new)
    ctx.erase_unused(m.chain)
    ctx.count("padding_gather_compare")
    return new


def sdpa_check(node, ctx):
    """sdpa_supported, its reason on the report row as "not taken by attention: ..."."""
    reason = sdpa_supported(node, ctx)
    return Reason(reason, prefix=PREFIX) if reason else None


@rule(Stage.CANONICAL, aten.scaled_dot_product_attention.default, family="attention", supported=sdpa_check,
      doc="F.scaled_dot_product_attention")
def lower_sdpa(node, ctx):
    return _emit_sdpa(node, ctx, arg(node, "attn_mask", None), None, [])


_WRITES = (aten.index_put_.default, aten.index_copy_.default, aten.copy_.default)


def _is_state(n) -> bool:
    """n is a buffer or graph input (a KV cache), maybe as the result of an in-place write to it."""
    while isinstance(n, torch.fx.Node) and n.op == "call_function" and n.target in _WRITES:
        n = arg(n, "self")  # the tensor written (index_put_ / index_copy_ / copy_ all name it self)
    return isinstance(n, torch.fx.Node) and n.op in ("get_attr", "placeholder")


def _kv_uncast(ctx, q, k, v, causal) -> bool:
    """Under precision bf16 / fp16, fp32 K / V state (cache buffers or inputs, maybe just written in
    place) that the one-wave kernel reads as they are, rounding them in registers (kv_in_registers):
    gpt-fast's fp32 cache buffers, whose casts were two launches of the whole [B, Hkv, S_max, D]
    caches per layer and step. Static head counts and query length only."""
    if ctx.precision == "fp32" or not dtype_of(k) == dtype_of(v) == dtype_of(q) == torch.float32:
        return False
    if not (_is_state(k) and _is_state(v)):  # a computed K (a GEMM's bf16 widened): its cast folds away
        return False
    (_, h, sq, _), (_, hkv, _, _) = shape_of(q), shape_of(k)
    return is_static(h, sq, hkv) and kv_in_registers(int(h), int(hkv), int(sq), causal)


def _emit_sdpa(node, ctx, mask, q_pos, absorbed, k_start=None):
    q, k, v = arg(node, "query"), arg(node, "key"), arg(node, "value")
    causal = bool(arg(node, "is_causal", False))
    scale = arg(node, "scale", None)
    kv = (k, v) if _kv_uncast(ctx, q, k, v, causal) else (ctx.cast_in(k, node), ctx.cast_in(v, node))
    args = (ctx.cast_in(q, node), *kv, ctx.cast_in(mask, node), causal, None if scale is None else float(scale))
    order = dim_order(val(node))
    order = list(order) if order not in (None, (0, 1, 2, 3)) and order[-1] == 3 else None  # eager's O layout
    if order or q_pos is not None:
        args += (None, None, order)
    if q_pos is not None:
        args += (q_pos,)
    if k_start is not None:  # a left-padded batch's first keys (attention_cache.padding_start)
        args += (None, k_start)
    return ctx.replace(node, "attention", "sdpa_cache" if q_pos is not None else "sdpa", args, [node, *absorbed])
