"""Rotary position embeddings (RoPE) as one kernel: nothing of it left in PyTorch.

RoPE mixes the two halves (or the two members of each pair) of a head vector, so its written
forms move data between positions: a ``cat`` or ``stack`` that the elementwise partition cannot
take, leaving a copy in PyTorch and splitting the math into several kernels (a negate kernel,
the ``cat``, a multiply-add kernel, for q and for k). The three rules below find x, cos and sin
of each form and emit ``flydsl.rope([x], [cos], [sin], pairs)`` (translator_kernels/layout/
rope_cache.py: x and the tables read in place with their strides, fp32 math); rope_cache.py then
puts q's and k's rotations and the K / V cache writes into one launch. Where the op does not
take the form (integer dtypes, tables that widen x, a stack that is not RoPE's), the rules rewrite
it into per-element aten ops over a view in which the mixed positions are a broadcast dim, so the
partition pass makes one generated kernel of it (`flydsl.fused_elementwise`), as described below.

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

from typing import Optional

import torch

from ..graph import aten, arg, is_call, shape_of, static_int, val
from ..registry import NO_MATCH, Match, OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch
from .elementwise import ELEMENTWISE

MAX_TREE = 24  # nodes of one stacked member rebuilt at most
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


# --- the op: flydsl.rope ----------------------------------------------------------------------

@torch.library.custom_op("flydsl::rope", mutates_args=("kc", "vc"))
def rope(xs: list[torch.Tensor], coss: list[torch.Tensor], sins: list[torch.Tensor], pairs: bool,
         kc: Optional[torch.Tensor], k_order: Optional[list[int]], v: Optional[torch.Tensor],
         vc: Optional[torch.Tensor], ids: Optional[torch.Tensor], dim: int,
         out_dtype: Optional[torch.dtype] = None, norm_w0: Optional[torch.Tensor] = None,
         norm_w1: Optional[torch.Tensor] = None, norm_eps: float = 0.0, rot_dim: int = 0,
         norm_dims: Optional[list[int]] = None) -> list[torch.Tensor]:
    return dispatch("rope", xs, coss, sins, pairs, kc, k_order, v, vc, ids, dim, out_dtype, norm_w0, norm_w1, norm_eps,
                    rot_dim, norm_dims)


def _norm_ws(xs, w0, w1):
    """The norm weights of xs (rope_norm.py), one per rotated tensor, else None."""
    return None if w0 is None else [w0, w1][:len(xs)]


def _rotated(x, cos, sin, pairs, out_dtype=None, rot_dim=0):
    """(shape, dtype) of one rotation's result: out_dtype, else the promoted type of x, cos and sin
    (rope_casts.py folds a cast of the result into the op as out_dtype). With rot_dim (rope_pass.py: partial
    rotary) x's first rot_dim features rotate, the rest pass through: the result has x's last dim."""
    c, s = (cos.unsqueeze(-1), sin.unsqueeze(-1)) if pairs else (cos, sin)
    shape = torch.broadcast_shapes(x[..., :rot_dim].shape if rot_dim else x.shape, c.shape, s.shape)
    if rot_dim:
        shape = torch.Size([*shape[:-1], x.shape[-1]])
    return shape, out_dtype or torch.promote_types(torch.promote_types(x.dtype, cos.dtype), sin.dtype)


@rope.register_fake
def _(xs, coss, sins, pairs, kc, k_order, v, vc, ids, dim, out_dtype=None, norm_w0=None, norm_w1=None, norm_eps=0.0,
      rot_dim=0, norm_dims=None):
    n = len(xs) - (kc is not None)
    outs = []
    for i in range(n):
        shape, dt = _rotated(xs[i], coss[i], sins[i], pairs, out_dtype, rot_dim)
        outs.append(xs[i].new_empty(shape, dtype=dt))
    return outs


def _rms_norm_over(x, dims, w, eps):
    """flydsl.rms_norm(x, ..) over x's dims `dims` (outermost first) as one row, in fp32, rounded to x's dtype."""
    dims = [d % x.dim() for d in dims]
    perm = [d for d in range(x.dim()) if d not in dims] + dims
    p = x.float().permute(perm)
    lead = p.shape[:x.dim() - len(dims)]
    y = torch.nn.functional.rms_norm(p.reshape(*lead, -1), (w.numel(),), w.float(), eps).reshape(p.shape)
    return y.permute([perm.index(d) for d in range(x.dim())]).to(x.dtype)


def ref_rope(xs, coss, sins, pairs, kc, k_order, v, vc, ids, dim, out_dtype=None, norm_w0=None, norm_w1=None,
             norm_eps=0.0, rot_dim=0, norm_dims=None):
    """The rotations in fp32 (rotate-half over x's last dim, or pairs x [..., P, 2] with cos / sin per
    pair), cast once (the returned ones to out_dtype when given); the last into kc at ids along dim when kc
    is given, rounded to kc's dtype (its region's strides over the rotated tensor follow k_order,
    innermost first); v into vc likewise. With norm weights (norm_w0 for xs[0], norm_w1 for xs[1]), each x is
    first flydsl.rms_norm(x, [D], w, norm_eps) (rope_norm.py: Qwen3's q / k norm). With rot_dim, x's first rot_dim
    features rotate and the rest pass through, cast likewise (rope_pass.py: GPT-NeoX's partial rotary). norm_dims:
    the norm's row spans those dims of x, outermost first (rope_norm.py: OLMo2's q / k norm over all heads)."""
    norm_ws = _norm_ws(xs, norm_w0, norm_w1)
    if norm_ws is not None:
        xs = [_rms_norm_over(x, norm_dims or [-1], w, norm_eps) for x, w in zip(xs, norm_ws)]
    outs = []
    for i, (x, c, s) in enumerate(zip(xs, coss, sins)):
        cached = kc is not None and i == len(xs) - 1  # stored in kc: rounded to kc's dtype
        _, dt = _rotated(x, c, s, pairs, kc.dtype if cached else out_dtype, rot_dim)
        x, c, s = x.float(), c.float(), s.float()
        keep = x[..., rot_dim:] if rot_dim else None
        x = x[..., :rot_dim] if rot_dim else x
        if pairs:
            c, s = c.unsqueeze(-1), s.unsqueeze(-1)
            r = torch.cat((-x[..., 1:], x[..., :1]), -1)
        else:
            h = x.shape[-1] // 2
            r = torch.cat((-x[..., h:], x[..., :h]), -1)
        y = x * c + r * s
        if keep is not None:
            y = torch.cat([y, keep.expand(*y.shape[:-1], keep.shape[-1])], -1)
        outs.append(y.to(dt).contiguous())  # the kernel's layout
    at = lambda t: (slice(None),) * dim + (ids,)  # noqa: E731
    if kc is not None:
        k = outs.pop().contiguous()
        region = list(kc.shape)
        region[dim] = ids.numel()
        vs, acc = [0] * len(region), 1
        for d in k_order:
            vs[d], acc = acc, acc * region[d]
        kc[at(kc)] = torch.as_strided(k, region, vs)
    if vc is not None:
        vc[at(vc)] = v
    return outs


def kernel_rope(xs, coss, sins, pairs, kc, k_order, v, vc, ids, dim, out_dtype=None, norm_w0=None, norm_w1=None,
                norm_eps=0.0, rot_dim=0, norm_dims=None):
    from translator_kernels.layout.rope_cache import rope_cache

    return rope_cache(xs, coss, sins, pairs, kc, k_order, v, vc, ids, dim, out_dtype=out_dtype,
                      norm_ws=_norm_ws(xs, norm_w0, norm_w1), eps=norm_eps, rot=rot_dim, norm_dims=norm_dims)


register_family(OpFamily(
    name="rope", description="rotary position embeddings of q and k (and the K / V cache writes) in one kernel",
    reference=ref_rope, kernel=kernel_rope, kernel_entry="translator_kernels.layout.rope_cache:rope_cache",
    sample_inputs=lambda dt: ([torch.randn(1, 3, 2, 8).to(dt)], [torch.randn(1, 3, 1, 8).to(dt)],
                              [torch.randn(1, 3, 1, 8).to(dt)], False, None, None, None, None, None, 0),
))


def rope_op_reason(x, cos, sin, pairs, node) -> str | None:
    """None when flydsl.rope computes `node` from (x, cos, sin), else why not (the per-element
    decomposition then takes it)."""
    vs = [val(t) for t in (x, cos, sin)]
    if not all(isinstance(t, torch.Tensor) and t.dtype in FLOATS for t in vs):
        return "not float32 / bfloat16 / float16 tensors"
    if any(t.device != vs[0].device for t in vs):
        return "on different devices"
    d = static_int(vs[0].shape[-1]) if vs[0].dim() else None
    if d is None or d % 2 or (pairs and d != 2):
        return "the pairs' dim is not static and even"
    try:
        shape, dt = _rotated(*vs, pairs)
    except RuntimeError:
        return "cos / sin do not broadcast"
    if len(shape) != vs[0].dim() or str(shape) != str(vs[0].shape) or dt != val(node).dtype:
        return "cos / sin widen x, or the result's dtype differs"
    return None


def emit_rope(ctx, node, x, cos, sin, pairs, absorbed, lowering):
    """flydsl.rope of one tensor in place of `node`: its result replaces node's uses."""
    _, (out,) = ctx.emit("rope", ([x], [cos], [sin], pairs, None, None, None, None, None, 0), lowering=lowering,
                         sources=[node, *absorbed], anchor=node, before=node)
    node.replace_all_uses_with(out)
    ctx.erase_unused([node, *absorbed])
    return out


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


@rule(Stage.DECOMPOSE, aten.add.Tensor, family="rope", supported=rotate_half_supported,
      doc="x * cos + rotate_half(x) * sin (cat of halves) -> per-element ops over [.., 2, D/2] (one kernel)")
def lower_rope_rotate_half(node, ctx, m):
    x, cos, sin, absorbed = m.x, m.cos, m.sin, m.absorbed
    if rope_op_reason(x, cos, sin, False, node) is None:
        return emit_rope(ctx, node, x, cos, sin, False, absorbed, "rope_rotate_half")
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
    return ctx.denied([node]) or Match(parts=parts, tree=_tree_nodes(parts), pairs=_pairs_form(parts, node))


def _sel(n):
    """(base, j) of ``t[..., j]`` (a select of the last dim), else None."""
    if is_call(n, aten.select.int) and _last(arg(n, "self"), arg(n, "dim")):
        return arg(n, "self"), arg(n, "index")
    return None


def _same(a, b) -> bool:
    """a and b are one value: the same node, or the same select written twice."""
    return a is b or (_sel(a) is not None and _sel(a) == _sel(b))


def _products(n, op):
    """((u, w), (y, z)) of ``u * w (op) y * z``, else None."""
    if not is_call(n, op) or arg(n, "alpha", 1) != 1:
        return None
    a, b = arg(n, "self"), arg(n, "other")
    if not (is_call(a, aten.mul.Tensor) and is_call(b, aten.mul.Tensor)):
        return None
    return (arg(a, "self"), arg(a, "other")), (arg(b, "self"), arg(b, "other"))


def _pairs_form(parts, node):
    """(A, cos, sin) when the stack is RoPE's interleaved pairs of A [..., P, 2]:
    ``stack([A0 * c - A1 * s, A1 * c + A0 * s], -1)`` (Ai = A[..., i]; products in either order),
    and flydsl.rope computes it; else None."""
    if len(parts) != 2:
        return None
    re, im = _products(parts[0], aten.sub.Tensor), _products(parts[1], aten.add.Tensor)
    if re is None or im is None:
        return None
    for x0, c in (re[0], re[0][::-1]):
        for x1, s in (re[1], re[1][::-1]):
            a0, a1 = _sel(x0), _sel(x1)
            if a0 is None or a1 is None or a0[0] is not a1[0] or (a0[1], a1[1]) != (0, 1):
                continue
            want = ((x1, c), (x0, s))
            for first, second in (im, im[::-1]):
                if all(any(_same(p, q) and _same(r, t) for p, r in (f, f[::-1]))
                       for f, (q, t) in zip((first, second), want)):
                    if rope_op_reason(a0[0], c, s, True, node) is None:
                        return a0[0], c, s
    return None


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


@rule(Stage.DECOMPOSE, aten.stack.default, family="rope", supported=stack_supported,
      doc="stack([per-element expressions], -1) (RoPE's interleaved pairs) -> one per-element program")
def lower_rope_stack(node, ctx, m):
    parts, tree = m.parts, m.tree
    if m.pairs is not None:
        out = emit_rope(ctx, node, *m.pairs, True, [], "rope_stack")
        selects = [i for n in tree for i in n.all_input_nodes if is_call(i, aten.select.int)]
        ctx.erase_unused([*tree, *selects])
        return out
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


@rule(Stage.DECOMPOSE, aten.view_as_real.default, family="rope", supported=complex_supported,
      doc="view_as_real(view_as_complex(x) * freqs_cis) (complex RoPE) -> real per-element ops over the pairs")
def lower_rope_complex(node, ctx, m):
    a, f, absorbed = m.a, m.f, m.absorbed
    ins = lambda *x: ctx.insert(*x, before=node)  # noqa: E731
    fr = ins(aten.view_as_real.default, f)
    cos, sin = (ins(aten.select.int, fr, -1, j) for j in (0, 1))
    if rope_op_reason(a, cos, sin, True, node) is None:
        return emit_rope(ctx, node, a, cos, sin, True, absorbed, "rope_complex")
    ctx.erase_unused([sin, cos])
    a0, a1, f0, f1 = (ins(aten.slice.Tensor, t, -1, j, j + 1) for t, j in ((a, 0), (a, 1), (fr, 0), (fr, 1)))
    re = ins(aten.sub.Tensor, ins(aten.mul.Tensor, a0, f0), ins(aten.mul.Tensor, a1, f1))
    im = ins(aten.add.Tensor, ins(aten.mul.Tensor, a0, f1), ins(aten.mul.Tensor, a1, f0))
    out = ins(aten.where.self, _mask(ctx, [False, True], node), im, re)
    node.replace_all_uses_with(out)
    ctx.count("rope_complex")
    ctx.erase_unused([node, *absorbed])
    return out
