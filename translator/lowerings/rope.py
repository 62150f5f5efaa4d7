"""Rotary position embeddings (RoPE) as one elementwise kernel: nothing of it left in PyTorch.

RoPE mixes the two halves (or the two members of each pair) of a head vector, so its written
forms move data between positions: a ``cat`` or ``stack`` that the elementwise partition cannot
take, leaving a copy in PyTorch and splitting the math into several kernels (a negate kernel,
the ``cat``, a multiply-add kernel, for q and for k). Both rules below rewrite, before matching,
the form into per-element aten ops over a view in which the mixed positions are a broadcast dim,
so the partition pass makes one generated kernel of all of it (`flydsl.fused_elementwise`).

Rotate-half (HF Llama, Mistral, Qwen2, Gemma, GPT-NeoX ...), counter ``rope_rotate_half``:

    def rotate_half(x): x1, x2 = x[..., :h], x[..., h:]; return torch.cat((-x2, x1), dim=-1)
    q_embed = (q * cos) + (rotate_half(q) * sin)

  -> with X = x.unflatten(-1, [2, h]) (a view; likewise cos and sin):
     out = (X * C + where(second, X[..., 0:1, :], -X[..., 1:2, :]) * S).flatten(-2)
  where `second` is the constant [[False], [True]]: exact (no multiply by 0 / 1).

Interleaved pairs written with ``stack`` (gpt-fast, Meta's reference through real arithmetic),
counter ``rope_stack``:

    xs = x.reshape(*x.shape[:-1], -1, 2)
    out = torch.stack([xs[..., 0] * f[..., 0] - xs[..., 1] * f[..., 1],
                       xs[..., 1] * f[..., 0] + xs[..., 0] * f[..., 1]], -1).flatten(3)

  Any ``stack([e0, e1, ...], dim=-1)`` whose members are per-element expressions: each member is
  rebuilt over its leaves unsqueezed at the end (``t[..., j]`` read as ``t[..., j:j+1]``) and the
  members are selected per position of the new dim by constant one-hot masks:
  ``where(m1, e1', where(m2, e2', ... e0'))``. One kernel reads every input once.

Complex multiply (Meta's llama reference), counter ``rope_complex``:

    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    out = torch.view_as_real(xq_ * freqs_cis).flatten(3)

  -> the product in real arithmetic over the [.., 2] pairs, A = the real pairs of the
  view_as_complex operand, F = view_as_real of the table (a view):
     re = A[..., 0:1] * F[..., 0:1] - A[..., 1:2] * F[..., 1:2]
     im = A[..., 0:1] * F[..., 1:2] + A[..., 1:2] * F[..., 0:1]
     out = where([False, True], im, re)
  No complex tensor is computed; the table stays a buffer, read through a real view.
"""

from __future__ import annotations

import torch

from ..graph import aten, arg, is_call, shape_of, static_int, val
from ..registry import NO_MATCH, Match, Stage, rule
from .elementwise import ELEMENTWISE

MAX_TREE = 24  # nodes of one stacked member rebuilt at most


def _elem(n) -> bool:
    return isinstance(n, torch.fx.Node) and n.op == "call_function" and n.target in ELEMENTWISE


def _last(n, dim) -> bool:
    """dim is n's last dim (as -1 or rank-1)."""
    s = shape_of(n)
    return s is not None and dim in (-1, len(s) - 1)


def _half(n):
    """(x, start, end) of ``x[..., start:end]`` (a last-dim slice, step 1), else None."""
    if not is_call(n, aten.slice.Tensor) or not _last(arg(n, "self"), arg(n, "dim")) or arg(n, "step") != 1:
        return None
    x = arg(n, "self")
    d = static_int(shape_of(x)[-1])
    if d is None:
        return None
    start, end = arg(n, "start") or 0, arg(n, "end")
    end = d if end is None or end > d else end
    return x, start, end


def rotate_half_of(n):
    """x when n is ``cat((-x[..., h:], x[..., :h]), -1)`` with x's last dim 2h, else None."""
    if not is_call(n, aten.cat.default) or not _last(n, arg(n, "dim")):
        return None
    parts = arg(n, "tensors")
    if len(parts) != 2 or not is_call(parts[0], aten.neg.default):
        return None
    hi, lo = _half(arg(parts[0], "self")), _half(parts[1])
    if hi is None or lo is None or hi[0] is not lo[0]:
        return None
    d = static_int(shape_of(hi[0])[-1])
    return hi[0] if d % 2 == 0 and hi[1:] == (d // 2, d) and lo[1:] == (0, d // 2) else None


def _mul_operands(n):
    if not is_call(n, aten.mul.Tensor):
        return ()
    a, b = arg(n, "self"), arg(n, "other")
    return ((a, b), (b, a)) if isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node) else ()


def _match_rotate_half(node):
    """(x, cos, sin, absorbed nodes) of ``x * cos + rotate_half(x) * sin`` rooted at add `node`."""
    if not is_call(node, aten.add.Tensor) or arg(node, "alpha") != 1:
        return None
    a, b = arg(node, "self"), arg(node, "other")
    for p, r in ((a, b), (b, a)):
        for x, cos in _mul_operands(p):
            for cat, sin in _mul_operands(r):
                if rotate_half_of(cat) is not x:
                    continue
                d = shape_of(x)[-1]
                if any(str(shape_of(t)[-1]) != str(d) for t in (cos, sin)):
                    return None
                neg = arg(cat, "tensors")[0]
                return x, cos, sin, [p, r, cat, neg, arg(neg, "self"), arg(cat, "tensors")[1]]
    return None


def rotate_half_supported(node, ctx):
    m = _match_rotate_half(node)
    if m is None or not val(m[0]).is_floating_point():
        return NO_MATCH
    x, cos, sin, absorbed = m
    return ctx.denied([node, *absorbed]) or Match(x=x, cos=cos, sin=sin, absorbed=absorbed)


def _mask(ctx, rows: list, before):
    """A bool constant of `rows` (the selection of one position of the mixed dim)."""
    return ctx.add_constant(torch.tensor(rows, dtype=torch.bool), "rope_sel", before)


@rule(Stage.DECOMPOSE, aten.add.Tensor, family="fused_elementwise", supported=rotate_half_supported,
      doc="x * cos + rotate_half(x) * sin (cat of halves) -> per-element ops over [.., 2, D/2] (one kernel)")
def lower_rope_rotate_half(node, ctx, m):
    x, cos, sin, absorbed = m.x, m.cos, m.sin, m.absorbed
    h = static_int(shape_of(x)[-1]) // 2
    ins = lambda *a: ctx.insert(*a, before=node)  # noqa: E731
    X, C, S = (ins(aten.unflatten.int, t, -1, [2, h]) for t in (x, cos, sin))
    first = ins(aten.slice.Tensor, X, -2, 0, 1)
    second = ins(aten.neg.default, ins(aten.slice.Tensor, X, -2, 1, 2))
    rot = ins(aten.where.self, _mask(ctx, [[False], [True]], node), first, second)
    out = ins(aten.add.Tensor, ins(aten.mul.Tensor, X, C), ins(aten.mul.Tensor, rot, S))
    res = ins(aten.flatten.using_ints, out, -2, -1)
    node.replace_all_uses_with(res)
    ctx.count("rope_rotate_half")
    ctx.erase_unused([node, *absorbed])
    return res


# --- stack of per-element expressions ------------------------------------------------------

def _tree_size(n, budget) -> int | None:
    """Nodes of the per-element tree rooted at n (leaves excluded), None when over budget."""
    if not _elem(n):
        return 0
    total = 1
    for i in n.all_input_nodes:
        s = _tree_size(i, budget - total)
        if s is None:
            return None
        total += s
        if total > budget:
            return None
    return total


def stack_supported(node, ctx):
    parts = arg(node, "tensors")
    shapes = [shape_of(t) for t in parts]
    if len(parts) < 2 or any(s is None for s in shapes) or len({str(s) for s in shapes}) != 1:
        return NO_MATCH
    if arg(node, "dim") not in (-1, len(shapes[0])):
        return NO_MATCH
    if not all(_elem(t) and _tree_size(t, MAX_TREE) for t in parts):
        return NO_MATCH
    return ctx.denied([node]) or Match(parts=parts, tree=_tree_nodes(parts))


def _tree_nodes(parts) -> set:
    """The per-element nodes of the trees rooted at `parts` (what the rewrite lifts)."""
    out: set = set()
    todo = list(parts)
    while todo:
        n = todo.pop()
        if _elem(n) and n not in out:
            out.add(n)
            todo.extend(n.all_input_nodes)
    return out


def _lift(ctx, n, before, memo, tree):
    """n's per-element tree rebuilt with a new last dim of size 1 (leaves unsqueezed there)."""
    if not isinstance(n, torch.fx.Node):
        return n
    if n in memo:
        return memo[n]
    if is_call(n, aten.select.int) and _last(arg(n, "self"), arg(n, "dim")) and arg(n, "index") >= 0:
        j = arg(n, "index")  # t[..., j] -> t[..., j:j+1]: the same elements, the dim kept
        out = ctx.insert(aten.slice.Tensor, arg(n, "self"), -1, j, j + 1, before=before)
    elif n in tree:
        args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: _lift(ctx, a, before, memo, tree))
        out = ctx.insert(n.target, *args, before=before, **kwargs)
    elif isinstance(val(n), torch.Tensor):
        out = ctx.insert(aten.unsqueeze.default, n, -1, before=before)
    else:
        out = n
    memo[n] = out
    return out


@rule(Stage.DECOMPOSE, aten.stack.default, family="fused_elementwise", supported=stack_supported,
      doc="stack([per-element expressions], -1) (RoPE's interleaved pairs) -> one per-element program")
def lower_rope_stack(node, ctx, m):
    parts, tree = m.parts, m.tree
    memo: dict = {}
    lifted = [_lift(ctx, t, node, memo, tree) for t in parts]
    n = len(parts)
    out = lifted[0]
    for i in range(1, n):
        onehot = _mask(ctx, [j == i for j in range(n)], node)
        out = ctx.insert(aten.where.self, onehot, lifted[i], out, before=node)
    node.replace_all_uses_with(out)
    ctx.count("rope_stack")
    selects = [i for n in tree for i in n.all_input_nodes if is_call(i, aten.select.int)]
    ctx.erase_unused([node, *tree, *selects])
    return out


# --- complex multiply ------------------------------------------------------------------------

def _complex_mul(node):
    """(A, F, absorbed) of ``view_as_real(view_as_complex(A) * F)`` rooted at `node`, else None."""
    if not is_call(node, aten.view_as_real.default):
        return None
    mul = arg(node, "self")
    if len(mul.users) != 1:
        return None
    for z, f in _mul_operands(mul):
        if is_call(z, aten.view_as_complex.default) and val(f).is_complex() and val(z).dtype == val(f).dtype:
            return arg(z, "self"), f, [mul, z]
    return None


def complex_supported(node, ctx):
    m = _complex_mul(node)
    if m is None:
        return NO_MATCH
    a, f, absorbed = m
    return ctx.denied([node, *absorbed]) or Match(a=a, f=f, absorbed=absorbed)


@rule(Stage.DECOMPOSE, aten.view_as_real.default, family="fused_elementwise", supported=complex_supported,
      doc="view_as_real(view_as_complex(x) * freqs_cis) (complex RoPE) -> real per-element ops over the pairs")
def lower_rope_complex(node, ctx, m):
    a, f, absorbed = m.a, m.f, m.absorbed
    ins = lambda *x: ctx.insert(*x, before=node)  # noqa: E731
    fr = ins(aten.view_as_real.default, f)
    a0, a1, f0, f1 = (ins(aten.slice.Tensor, t, -1, j, j + 1) for t, j in ((a, 0), (a, 1), (fr, 0), (fr, 1)))
    re = ins(aten.sub.Tensor, ins(aten.mul.Tensor, a0, f0), ins(aten.mul.Tensor, a1, f1))
    im = ins(aten.add.Tensor, ins(aten.mul.Tensor, a0, f1), ins(aten.mul.Tensor, a1, f0))
    out = ins(aten.where.self, _mask(ctx, [False, True], node), im, re)
    node.replace_all_uses_with(out)
    ctx.count("rope_complex")
    ctx.erase_unused([node, *absorbed])
    return out
