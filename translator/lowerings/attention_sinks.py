"""Attention sinks (gpt-oss) as written in eager code: one learned logit per head joins the
softmax denominator and is dropped after it.

    sinks = module.sinks.reshape(1, -1, 1, 1).expand(B, -1, Sq, -1)           # [B, H, Sq, 1]
    combined = torch.cat([scores, sinks], dim=-1)                               # [B, H, Sq, Sk + 1]
    combined = combined - combined.max(dim=-1, keepdim=True).values             # (a shift: softmax ignores it)
    probs = F.softmax(combined, dim=-1); p = probs[..., :-1]                    # the sink's column dropped
    out = p @ v

is `flydsl.attention(..., sinks=module.sinks)`: sum_k e^(s_k) v_k / (sum_k e^(s_k) + e^(sink_h)).
attention_patterns.match walks through the dropped column (`sink_cut`) and the cat
(`sink_logits`); anything else between them is a reason, never a silent miss.
"""

from __future__ import annotations

import torch

from ..graph import arg, aten, getitem_of, is_call, shape_of
from .attention_forms import fixed_dim, node_int



def sink_cut(p) -> bool:
    """p = probs[..., :-1] (or [..., :Sk]) of a softmax over the last dim: the sink column dropped."""
    if not is_call(p, aten.slice.Tensor):
        return False
    src = arg(p, "self")
    r = len(shape_of(src) or ())
    if not r or arg(p, "dim") % r != r - 1 or node_int(arg(p, "start") or 0) != 0 or arg(p, "step") != 1:
        return False
    return _one_more(shape_of(src)[-1], shape_of(p)[-1]) and is_call(src, aten.softmax.int, aten._softmax.default)


def _one_more(a, b) -> bool:
    """a == b + 1, for ints or symbolic sizes (s + 1 against s), without specializing either."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b + 1
    ea, eb = (x.node.expr if isinstance(x, torch.SymInt) else x for x in (a, b))
    try:
        return (ea - eb - 1) == 0
    except TypeError:
        return False


def _row_max(n, x):
    """The node reading x when n is x's max over the last dim, kept (amax(x, -1, True) or
    max(x, -1, True).values), else None."""
    item = getitem_of(n)
    if item is not None:
        if item[1] != 0:
            return None
        n = item[0]
    r = len(shape_of(x) or ())
    if is_call(n, aten.amax.default):
        dims = arg(n, "dim")
        ok = arg(n, "self") is x and [d % r for d in dims] == [r - 1] and bool(arg(n, "keepdim"))
    elif is_call(n, aten.max.dim):
        ok = arg(n, "self") is x and arg(n, "dim") % r == r - 1 and bool(arg(n, "keepdim"))
    else:
        ok = False
    return n if ok else None


def _per_head(n, heads, absorbed):
    """The [H] tensor that n broadcasts to one value per head ([1, H, 1, 1] expanded), else None."""
    seen = []
    while is_call(n, aten.expand.default, aten.view.default, aten.reshape.default, aten._unsafe_view.default,
                  aten.unsqueeze.default, aten._to_copy.default):
        seen.append(n)
        n = arg(n, "self")
    shape = shape_of(n)
    if shape is None or [fixed_dim(n, i) for i in range(len(shape))].count(heads) != 1 \
            or any(fixed_dim(n, i) not in (1, heads) for i in range(len(shape))):
        return None
    absorbed += seen
    return n


def sink_logits(s, heads, absorbed):
    """(scores, sinks [H]) when the softmax input s is cat([scores, sinks], -1), optionally shifted by
    its own row max; else the reason."""
    mx = _row_max(arg(s, "other"), arg(s, "self")) if is_call(s, aten.sub.Tensor) else None
    if mx is not None and arg(s, "alpha", 1) == 1:  # combined - combined.max(-1, keepdim=True).values
        cat = arg(s, "self")
        if set(cat.users) - {s, mx}:
            return "the scores with the sink column are also used elsewhere"
        absorbed += [s, arg(s, "other")] + ([mx] if mx is not arg(s, "other") else [])
        s = cat
    if not is_call(s, aten.cat.default):
        return "the probabilities' last column is dropped, but the softmax input is not cat([scores, sinks], -1)"
    parts = list(arg(s, "tensors"))
    r = len(shape_of(s) or ())
    if len(parts) != 2 or (arg(s, "dim") or 0) % r != r - 1 or fixed_dim(parts[1], -1) != 1:
        return "the softmax input is a cat that is not [scores, one sink logit per row] on the last dim"
    sinks = _per_head(parts[1], heads, absorbed)
    if sinks is None:
        return "the extra softmax column is not one learned logit per head (attention sinks)"
    absorbed.append(s)
    return parts[0], sinks


def sink_scores(s):
    """The scores part of a softmax input written cat([scores, sinks], -1) (shifted or not), else None
    (attention_patterns.chain_of looks for the Q·Kᵀ product upstream of it)."""
    if is_call(s, aten.sub.Tensor) and _row_max(arg(s, "other"), arg(s, "self")) is not None:
        s = arg(s, "self")
    if not is_call(s, aten.cat.default) or len(arg(s, "tensors")) != 2:
        return None
    r = len(shape_of(s) or ())
    return arg(s, "tensors")[0] if r and (arg(s, "dim") or 0) % r == r - 1 else None
