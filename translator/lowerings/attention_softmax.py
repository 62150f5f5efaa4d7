"""A softmax written out by hand between the two products of attention -> `aten.softmax`, so the
attention matcher (attention_patterns.py) sees the chain:

    s = q @ k.transpose(-2, -1) * scale
    e = torch.exp(s - s.amax(-1, keepdim=True))          # or s.max(-1, keepdim=True).values
    p = e / e.sum(-1, keepdim=True)                      # -> torch.softmax(s, -1)
    out = p @ v

Seen in "attention from scratch" code and teaching notebooks. Only where it is attention: the
division's result is the left operand of a product (matmul / bmm / einsum) and the scores come
from a Q·Kᵀ product a few ops up; a stand-alone hand-written softmax is left to the elementwise
and reduce kernels as before. Same math as softmax (exp of the max-shifted scores over their sum),
so numerics are unchanged up to rounding.
"""

from __future__ import annotations

from ..graph import arg, aten, getitem_of, is_call
from ..registry import NO_MATCH, Match, Stage, rule
from . import softmax  # noqa: F401  (registers the softmax family this rule's result runs on)
from .forms import DETACH, find_qk, manual_softmax, product_of


def manual_softmax_supported(node, ctx):
    """The scores, when `node` ends a softmax written out by hand that feeds a product over Q·Kᵀ scores."""
    x = manual_softmax(node)
    feeds = x is not None and find_qk(x) is not None and any(
        product_of(u) is not None and product_of(u)[0] is node for u in node.users)
    return Match(x=x) if feeds else NO_MATCH


@rule(Stage.DECOMPOSE, aten.div.Tensor, family="softmax", supported=manual_softmax_supported,
      name="attention_manual_softmax", doc="exp(s - max(s)) / sum(..) between Q·Kᵀ and ·V -> softmax")
def lower_manual_softmax(node, ctx, m):
    sm = ctx.insert(aten.softmax.int, m.x, -1, before=node)
    node.replace_all_uses_with(sm)
    e, total = arg(node, "self"), arg(node, "other")
    sub = arg(e, "self")
    ctx.gm.graph.erase_node(node)
    top, dead = arg(sub, "other"), [total, e, sub]
    while top is not None:  # the row max: detach, getitem, max.dim / amax (erased once unread)
        dead.append(top)
        top = (getitem_of(top) or (None,))[0] if getitem_of(top) else \
            arg(top, "self") if is_call(top, *DETACH) else None
    ctx.erase_unused(dead)
    ctx.count("attention_manual_softmax")
    return sm
