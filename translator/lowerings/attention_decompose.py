"""An SDPA call the attention kernel declines -> Q·Kᵀ, scale, mask, softmax, ·V as aten ops,
which the later stages lower to FlyDSL `bmm` and `softmax` (not the whole call left in PyTorch).

    F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
      -> s = (q @ kᵀ) * scale                      # k, v repeat_interleave'd when enable_gqa
         s = torch.where(mask, s, -inf) | s + mask  # bool keep-mask | additive mask
         s = torch.where(tril(ones(Sq, Sk)), s, -inf)  # is_causal (top-left, as SDPA)
         p = softmax(s, -1); p = dropout(p, dropout_p, train=True) when dropout_p > 0
         out = p @ v

Where it applies: head_dim outside the kernel's 8..256, a value head_dim different from the
query's (DeepSeek-style MLA: 192 / 128), an attention mask dtype the kernel does not take,
dynamic head counts, training-mode dropout. Not for inputs no FlyDSL op takes (float64): the
call then stays whole in PyTorch with the kernel's reason. The SDPA node's report row says
"not taken by attention: <reason>" and names the FlyDSL ops that computed its parts.

A fully masked row gives NaN here, as the math of softmax does, where SDPA itself gives 0.
"""

from __future__ import annotations

import math

import torch

from ..graph import FLOAT_DTYPES, aten, arg, dtype_of, shape_of, static_int
from ..registry import NO_MATCH, Match, Stage, rule
from . import gemm  # noqa: F401  (registers the bmm family this rule's products run on)
from .attention import PREFIX, sdpa_supported


def sdpa_decompose_supported(node, ctx):
    """NO_MATCH where the kernel takes the call (lower_sdpa does) or no FlyDSL op could take its parts;
    else the kernel's reason, for the report row."""
    declined = sdpa_supported(node, ctx)
    if declined is None:
        return NO_MATCH
    q, k, v = (arg(node, a) for a in ("query", "key", "value"))
    if not (dtype_of(q) == dtype_of(k) == dtype_of(v) and dtype_of(q) in FLOAT_DTYPES):
        return NO_MATCH
    if not (2 <= len(shape_of(q)) <= 4 and len(shape_of(k)) == len(shape_of(q)) == len(shape_of(v))):
        return NO_MATCH
    if static_int(shape_of(q)[-1]) is None:
        return NO_MATCH
    h, hkv = shape_of(q)[-3] if len(shape_of(q)) > 2 else 1, shape_of(k)[-3] if len(shape_of(k)) > 2 else 1
    if str(h) != str(hkv) and not (arg(node, "enable_gqa", False) and static_int(h) and static_int(hkv)
                                   and static_int(h) % static_int(hkv) == 0):
        return NO_MATCH
    mask = arg(node, "attn_mask", None)
    if mask is not None and (dtype_of(mask) is not torch.bool and dtype_of(mask) not in FLOAT_DTYPES):
        return NO_MATCH
    return Match(declined=declined)


@rule(Stage.DECOMPOSE, aten.scaled_dot_product_attention.default, family="bmm",
      supported=sdpa_decompose_supported, name="sdpa_decomposed",
      doc="SDPA the kernel declines -> bmm, softmax, bmm")
def lower_sdpa_decomposed(node, ctx, m):
    ctx.not_lowered(node, PREFIX + m.declined)
    q, k, v = (arg(node, a) for a in ("query", "key", "value"))

    def e(target, *args, **kwargs):
        return ctx.insert(target, *args, before=node, **kwargs)

    if str(shape_of(k)[-3]) != str(shape_of(q)[-3]):  # enable_gqa: query head h reads kv head h // n
        n = static_int(shape_of(q)[-3]) // static_int(shape_of(k)[-3])
        k, v = e(aten.repeat_interleave.self_int, k, n, -3), e(aten.repeat_interleave.self_int, v, n, -3)
    scale = arg(node, "scale", None)
    scale = 1.0 / math.sqrt(static_int(shape_of(q)[-1])) if scale is None else float(scale)
    s = e(aten.mul.Tensor, e(aten.matmul.default, q, e(aten.transpose.int, k, -2, -1)), scale)
    mask = arg(node, "attn_mask", None)
    device = q.meta["val"].device
    neg = None
    if mask is not None and dtype_of(mask) is torch.bool or arg(node, "is_causal", False):
        neg = e(aten.full.default, [], float("-inf"), dtype=dtype_of(s), device=device)
    if mask is not None and dtype_of(mask) is torch.bool:
        s = e(aten.where.self, mask, s, neg)
    elif mask is not None:
        s = e(aten.add.Tensor, s, mask)
    if arg(node, "is_causal", False):
        sq, sk = e(aten.sym_size.int, q, len(shape_of(q)) - 2), e(aten.sym_size.int, k, len(shape_of(k)) - 2)
        keep = e(aten.tril.default, e(aten.ones.default, [sq, sk], dtype=torch.bool, device=device))
        s = e(aten.where.self, keep, s, neg)
    p = e(aten.softmax.int, s, -1)
    if arg(node, "dropout_p", 0.0):
        p = e(aten.dropout.default, p, float(arg(node, "dropout_p", 0.0)), True)
    out = e(aten.matmul.default, p, v)
    node.replace_all_uses_with(out)
    ctx.gm.graph.erase_node(node)
    ctx.count("sdpa_decomposed")
    return out
