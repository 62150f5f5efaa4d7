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

import torch

from ..graph import arg, aten, getitem_of, is_call, shape_of
from ..registry import NO_MATCH, Stage, rule
from . import softmax  # noqa: F401  (registers the softmax family this rule's result runs on)
from .attention_forms import find_qk, product_of  # the matcher's own idea of a product

_DETACH = (aten.detach.default, aten.alias.default)


def _last_dim(n, dims) -> bool:
    r = len(shape_of(n) or ())
    return isinstance(dims, (list, tuple)) and len(dims) == 1 and r and dims[0] % r == r - 1


def _row_max_of(m, x) -> bool:
    """m = x.amax(-1, keepdim=True) or x.max(-1, keepdim=True).values (detached or not)."""
    while is_call(m, *_DETACH):
        m = arg(m, "self")
    if is_call(m, aten.amax.default):
        return arg(m, "self") is x and _last_dim(x, arg(m, "dim")) and arg(m, "keepdim")
    mx, index = getitem_of(m) or (None, None)
    if index == 0 and is_call(mx, aten.max.dim):
        return arg(mx, "self") is x and _last_dim(x, [arg(mx, "dim")]) and arg(mx, "keepdim")
    return False


def manual_softmax(div):
    """The scores x when div = exp(x - rowmax(x)) / exp(..).sum(-1, keepdim=True), else None."""
    e, total = arg(div, "self"), arg(div, "other")
    if not (is_call(e, aten.exp.default) and is_call(total, aten.sum.dim_IntList)):
        return None
    if arg(total, "self") is not e or not _last_dim(e, arg(total, "dim")) or not arg(total, "keepdim"):
        return None
    if set(e.users) != {div, total} or len(total.users) != 1:
        return None
    sub = arg(e, "self")
    if not (is_call(sub, aten.sub.Tensor) and arg(sub, "alpha") == 1 and len(sub.users) == 1):
        return None
    x = arg(sub, "self")
    return x if isinstance(x, torch.fx.Node) and _row_max_of(arg(sub, "other"), x) else None


def _feeds_a_product(div) -> bool:
    x = manual_softmax(div)
    return x is not None and find_qk(x) is not None and any(
        product_of(u) is not None and product_of(u)[0] is div for u in div.users)


def manual_softmax_supported(node, ctx):
    return None if _feeds_a_product(node) else NO_MATCH


@rule(Stage.DECOMPOSE, aten.div.Tensor, family="softmax", supported=manual_softmax_supported,
      name="attention_manual_softmax", doc="exp(s - max(s)) / sum(..) between Q·Kᵀ and ·V -> softmax")
def lower_manual_softmax(node, ctx):
    x = manual_softmax(node)
    sm = ctx.insert(aten.softmax.int, x, -1, before=node)
    node.replace_all_uses_with(sm)
    e, total = arg(node, "self"), arg(node, "other")
    sub = arg(e, "self")
    ctx.gm.graph.erase_node(node)
    top, dead = arg(sub, "other"), [total, e, sub]
    while top is not None:  # the row max: detach, getitem, max.dim / amax (erased once unread)
        dead.append(top)
        top = (getitem_of(top) or (None,))[0] if getitem_of(top) else \
            arg(top, "self") if is_call(top, *_DETACH) else None
    ctx.erase_unused(dead)
    ctx.count("attention_manual_softmax")
    return sm
