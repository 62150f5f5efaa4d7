"""Generic forms: recognizers of small graph shapes that any op family may match on.

Each function reads a few nodes and answers what they compute, or None / False when they are
something else. They import only translator.graph, so a family file (softmax.py, attention*.py,
a new one) can use them without importing another family:

- `product_of`: a product over the last two dims (matmul, bmm, baddbmm, a two-operand einsum)
  as (a, b, b is transposed).
- `find_qk`: the Q·Kᵀ product some scores come from, a few ops up.
- `row_max_of` / `last_dim`: x.amax(-1, keepdim=True) or x.max(-1, keepdim=True).values
  (detached or not); a dims argument that names only the last dim.
- `manual_softmax`: exp(x - rowmax(x)) / exp(..).sum(-1, keepdim=True) -> x.
"""

from __future__ import annotations

import torch

from ..graph import aten, arg, getitem_of, is_call, shape_of


# --- products -------------------------------------------------------------------------------

def product_of(n):
    """(a, b, bt) when n = a @ b (bt False) or a @ bᵀ (bt True) over the last two dims: matmul,
    bmm, or a two-operand einsum such as "bhid,bhjd->bhij" / "bhij,bhjd->bhid", else None."""
    if is_call(n, aten.matmul.default):
        return arg(n, "self"), arg(n, "other"), False
    if is_call(n, aten.bmm.default):
        return arg(n, "self"), arg(n, "mat2"), False
    if is_call(n, aten.baddbmm.default):  # mask + q @ kᵀ in one op (nn.MultiheadAttention with a mask)
        return arg(n, "batch1"), arg(n, "batch2"), False
    if not is_call(n, aten.einsum.default):
        return None
    eq, tensors = arg(n, "equation"), arg(n, "tensors")
    if len(tensors) != 2 or "." in eq:
        return None
    ins, _, out = eq.replace(" ", "").partition("->")
    a, _, b = ins.partition(",")
    if len(a) != len(b) or len(a) != len(out) or len(a) < 2 or len(set(a + b)) != len(a) + 1:
        return None
    x, (i, k) = a[:-2], a[-2:]
    if b[:-2] != x or out[:-1] != x + i:
        return None
    if b[-2:] == k + out[-1] and out[-1] not in a:
        return tensors[0], tensors[1], False
    if b[-2:] == out[-1] + k and out[-1] not in a:
        return tensors[0], tensors[1], True
    return None


def find_qk(s, depth: int = 12):
    """The Q·Kᵀ product the scores s come from (through any ops), else None."""
    last2 = [str(d) for d in (shape_of(s) or ())[-2:]]
    todo, seen = [s], set()
    while todo and depth:
        n = todo.pop(0)
        if n in seen or not isinstance(n, torch.fx.Node) or n.op != "call_function":
            continue
        seen.add(n)
        depth -= 1
        if product_of(n) is not None and [str(d) for d in (shape_of(n) or ())[-2:]] == last2:
            return n
        todo += [a for a in n.all_input_nodes if [str(d) for d in (shape_of(a) or ())[-2:]] == last2]
    return None


# --- a softmax written out by hand --------------------------------------------------------------

DETACH = (aten.detach.default, aten.alias.default)


def last_dim(n, dims) -> bool:
    r = len(shape_of(n) or ())
    return isinstance(dims, (list, tuple)) and len(dims) == 1 and r and dims[0] % r == r - 1


def row_max_of(m, x) -> bool:
    """m = x.amax(-1, keepdim=True) or x.max(-1, keepdim=True).values (detached or not)."""
    while is_call(m, *DETACH):
        m = arg(m, "self")
    if is_call(m, aten.amax.default):
        return arg(m, "self") is x and last_dim(x, arg(m, "dim")) and arg(m, "keepdim")
    mx, index = getitem_of(m) or (None, None)
    if index == 0 and is_call(mx, aten.max.dim):
        return arg(mx, "self") is x and last_dim(x, [arg(mx, "dim")]) and arg(mx, "keepdim")
    return False


def manual_softmax(div):
    """The scores x when div = exp(x - rowmax(x)) / exp(..).sum(-1, keepdim=True), else None."""
    e, total = arg(div, "self"), arg(div, "other")
    if not (is_call(e, aten.exp.default) and is_call(total, aten.sum.dim_IntList)):
        return None
    if arg(total, "self") is not e or not last_dim(e, arg(total, "dim")) or not arg(total, "keepdim"):
        return None
    if set(e.users) != {div, total} or len(total.users) != 1:
        return None
    sub = arg(e, "self")
    if not (is_call(sub, aten.sub.Tensor) and arg(sub, "alpha") == 1 and len(sub.users) == 1):
        return None
    x = arg(sub, "self")
    return x if isinstance(x, torch.fx.Node) and row_max_of(arg(sub, "other"), x) else None
