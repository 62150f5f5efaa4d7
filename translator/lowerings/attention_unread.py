"""No silent miss for the attention chains the matcher cannot read at all.

attention_patterns.match starts from a ·V product it can read as P @ V (forms.product_of:
matmul, bmm, baddbmm, or a two-operand einsum over matching batch letters). Two forms seen in
real models are attention but not of that shape:

- XLNet's relative attention: Q·Kᵀ and the ·V product are einsums over permuted layouts
  ("ibnd,jbnd->bnij", "bnij,jbnd->ibnd"), and a second, positional score product
  (rel_shift((q + r_r)·rᵀ)) is added before the scale;
- the LDM / Stable Diffusion VAE spatial self-attention over H·W tokens: the ·V product is written
  bmm(v, pᵀ) (V·Pᵀ, [B, C, HW] out), the probabilities on the right.

attention_patterns registers the rule `attention_unread` with this check, after
attention_handwritten on the same products: a product whose operand comes,
within a few layout / cast ops, from a softmax over the last dim of scores with a product
upstream, and that no attention rule took, gets "not taken by attention: <reason>" on itself
and on the softmax, whatever then runs them (bmm / einsum / softmax kernels). Not fused yet:
both would need the matcher to read permuted operand layouts (and XLNet's positional scores as
an additive mask scaled with the content scores).
"""

from __future__ import annotations

import torch

from ..graph import arg, aten, is_call, shape_of
from ..registry import NO_MATCH, Reason
from .attention import PREFIX
from .forms import find_qk, product_of

SOFTMAX = (aten.softmax.int, aten._softmax.default)
THROUGH = (aten.permute.default, aten.transpose.int, aten.view.default, aten.reshape.default, aten._to_copy.default,
           aten.to.dtype, aten.dropout.default, aten.clone.default, aten.contiguous.default, aten._unsafe_view.default,
           aten.type_as.default, aten.alias.default)


def _softmax_behind(x, hops: int = 4):
    """The last-dim softmax x is (a layout or cast of), else None."""
    for _ in range(hops + 1):
        if not isinstance(x, torch.fx.Node) or x.op != "call_function":
            return None
        if is_call(x, *SOFTMAX):
            r = len(shape_of(x) or ())
            return x if r and arg(x, "dim") % r == r - 1 else None
        if x.target not in THROUGH:
            return None
        x = x.all_input_nodes[0] if x.all_input_nodes else None
    return None


def _scores_product(sm):
    """A product upstream of the softmax's input (its Q·Kᵀ), through any ops."""
    todo, seen = [arg(sm, "self")], set()
    while todo and len(seen) < 16:
        n = todo.pop(0)
        if not isinstance(n, torch.fx.Node) or n in seen or n.op != "call_function":
            continue
        seen.add(n)
        if is_call(n, aten.matmul.default, aten.bmm.default, aten.einsum.default, aten.baddbmm.default):
            return n
        todo += list(n.all_input_nodes)
    return None


def unread_chain(node, seen: bool):
    """Reason for a ·V product of an attention chain the matcher cannot read, else NO_MATCH;
    `seen`: the matcher found the chain (fused, or its own reason given)."""
    if seen:
        return NO_MATCH
    ops = list(arg(node, "tensors")) if is_call(node, aten.einsum.default) else node.all_input_nodes[:2]
    for side, x in enumerate(ops):
        sm = _softmax_behind(x)
        qk = _scores_product(sm) if sm is not None else None
        if qk is None:
            continue
        if product_of(node) is not None and side == 1:
            why = ("the probabilities are the right operand of the ·V product (V·Pᵀ, as the LDM spatial "
                   "self-attention writes bmm(v, pᵀ)); not fused yet")
        elif product_of(node) is None and is_call(node, aten.einsum.default):
            why = (f"the ·V product einsum {arg(node, 'equation')!r} (and the scores' "
                   f"{arg(qk, 'equation')!r}) use permuted layouts the matcher does not read"
                   if is_call(qk, aten.einsum.default) else
                   f"the ·V product einsum {arg(node, 'equation')!r} uses a layout the matcher does not read")
        elif find_qk(arg(sm, "self")) is None:
            why = "the scores reach the softmax through ops that change their last two dims"
        else:
            why = "the ·V product's operands are not in a layout the matcher reads"
        return Reason(why, also=(sm, qk), prefix=PREFIX)
    return NO_MATCH
