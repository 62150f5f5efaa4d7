"""Residual add + norm -> `flydsl.add_rms_norm` / `flydsl.add_layer_norm` (two outputs).

Matched on the hand-written forms and on aten.layer_norm / aten.rms_norm:

    hidden = residual + hidden                # the sum feeds the norm AND is used later
    residual = hidden; hidden = self.post_attention_layernorm(hidden)   # pre-norm blocks

becomes ``s, y = flydsl.add_rms_norm(residual, hidden, ...)`` (or add_layer_norm): one pass
that writes both the residual stream and the normalized value; the graph gets getitem nodes
for the two results. When one addend is a linear whose only use is this add (every
transformer's ``x + o_proj(attn)``), the add is left to the GEMM epilogue, which folds the
residual for one extra read (4 tensor passes: gemm writes x + r, norm reads and writes)
where add + norm costs 5 (gemm writes, add+norm reads two and writes two).

The hand-written forms (norm_patterns.py) call `residual_of` / `replace_fused` here; the
canonical aten.layer_norm / aten.rms_norm forms are matched by the rules at the bottom.
"""

from __future__ import annotations

import operator

import torch

from ..registry import FAMILIES, Lowering, lowerings_for, register_lowering
from ._common import aten, dtype_of, shape_of
from .norm import layer_norm_supported, rms_norm_supported

Node = torch.fx.Node
ASSERT = aten._assert_tensor_metadata.default
GEMMS = (aten.linear.default, aten.addmm.default, aten.mm.default, aten.matmul.default)


def is_call(n, *targets) -> bool:
    return isinstance(n, Node) and n.op == "call_function" and n.target in targets


def users_of(n) -> list:
    return [u for u in n.users if u.target is not ASSERT]


def same_shape(a, b) -> bool:
    sa, sb = shape_of(a), shape_of(b)
    return sa is not None and sb is not None and [str(s) for s in sa] == [str(s) for s in sb]


def captured_name(n) -> str:
    return n.meta.get("orig_name") or n.name


def denied(nodes, ctx):
    for n in nodes:
        if captured_name(n) in ctx.deny:
            return ctx.deny[captured_name(n)]
    return None


def _gemm_takes(add, ctx) -> bool:
    """One addend is a linear read only by this add, which the GEMM epilogue folds as its residual."""
    if not any(low.name == "gemm_epilogue" for low in lowerings_for("epilogue")):
        return False
    if ctx.precision != "fp32" and dtype_of(add) == torch.float32:
        return False  # the gemm's output is cast back first: its epilogue does not fold the add
    order = {n: i for i, n in enumerate(add.graph.nodes)}
    for p, other in ((add.args[0], add.args[1]), (add.args[1], add.args[0])):
        while is_call(p, aten.dropout.default) and not (len(p.args) > 2 and p.args[2]) and len(users_of(p)) == 1:
            p = p.args[0]
        if not is_call(p, *GEMMS) or len(users_of(p)) != 1 or order.get(other, 1 << 62) >= order[p]:
            continue
        w = p.args[2] if p.target is aten.addmm.default else p.args[1]
        if is_call(w, aten.t.default, aten.transpose.int, aten.permute.default):
            w = w.args[0]
        if not (isinstance(w, Node) and w.op == "get_attr"):
            continue  # activation @ activation becomes flydsl.bmm, which has no residual epilogue
        if any(low.supported(p, ctx) is None for low in lowerings_for("lower")
               if low.family == "gemm" and p.target in low.targets):
            return True
    return False


def residual_of(x, absorbed, ctx):
    """(a, b) when x = a + b is a residual add also used outside the norm, else None."""
    if not is_call(x, aten.add.Tensor) or x.kwargs.get("alpha", 1) != 1 or len(x.args) != 2:
        return None
    a, b = x.args
    if not (isinstance(a, Node) and isinstance(b, Node) and same_shape(a, x) and same_shape(b, x)):
        return None
    if not dtype_of(a) == dtype_of(b) == dtype_of(x):
        return None
    if not [u for u in users_of(x) if u not in absorbed] or _gemm_takes(x, ctx):
        return None
    return a, b


def insert_point(add, params, absorbed):
    """The node after which the fused op goes: its inputs are ready and the sum's other users follow."""
    g = add.graph
    order = {n: i for i, n in enumerate(g.nodes)}
    after = max([add, *[p for p in params if isinstance(p, Node)]], key=order.get)
    if any(order[u] <= order[after] for u in users_of(add) if u not in absorbed):
        return None
    return after


def param_arg(ctx, p, shape, before):
    """p reshaped to `shape` (from [1, .., N]) and cast to the compute dtype."""
    if p is None:
        return None
    if [str(s) for s in shape_of(p)] != [str(s) for s in shape]:
        with ctx.gm.graph.inserting_before(before):
            p = ctx.gm.graph.call_function(aten.reshape.default, (p, list(shape)))
        ctx.infer(p)
    return ctx.cast_in(p, before)


def cast_to(ctx, n, dtype, before):
    if dtype_of(n) == dtype:
        return n
    with ctx.gm.graph.inserting_before(before):
        c = ctx.gm.graph.call_function(aten._to_copy.default, (n,), {"dtype": dtype})
    return ctx.infer(c)


def replace_fused(ctx, kind, add, shape, weight, bias, eps, root, absorbed, after):
    """``s, y = flydsl.add_<kind>_norm(a, b, ...)``: s takes the add's uses, y the norm's."""
    g = ctx.gm.graph
    family = "add_layer_norm" if kind == "layer" else "add_rms_norm"
    nxt = after.next
    a, b = (ctx.cast_in(t, nxt) for t in add.args)
    w = param_arg(ctx, weight, shape, nxt)
    args = (a, b, list(shape), w, *((param_arg(ctx, bias, shape, nxt),) if kind == "layer" else ()), float(eps))
    with g.inserting_before(nxt):
        new = g.call_function(FAMILIES[family].op.default, args)
    ctx.infer(new)
    info = {"family": family, "lowering": family, "anchor": captured_name(root)}
    new.meta["flydsl"] = {**info, "sources": [captured_name(s) for s in [add, *absorbed]]}
    outs = []
    for i, replaced in ((0, add), (1, root)):
        with g.inserting_before(nxt):
            gi = g.call_function(operator.getitem, (new, i))
        gi.meta["val"] = new.meta["val"][i]
        gi.meta["flydsl"] = {**info, "sources": [], "anchor": captured_name(replaced)}
        gi.meta["orig_name"] = None
        outs.append(cast_to(ctx, gi, dtype_of(replaced), nxt))
    for n in (new, *outs):
        n.meta["orig_name"] = None
    root.replace_all_uses_with(outs[1])
    order = {n: i for i, n in enumerate(g.nodes)}
    for s in sorted(absorbed, key=lambda n: -order[n]):
        if not s.users:
            g.erase_node(s)
    add.replace_all_uses_with(outs[0])
    g.erase_node(add)
    ctx.counters[family] = ctx.counters.get(family, 0) + 1
    return new


# --- aten.layer_norm / aten.rms_norm whose input is a residual add used later ------------------

def _canonical(node):
    x, shape = node.args[0], list(node.args[1])
    kw = node.kwargs
    w = node.args[2] if len(node.args) > 2 else kw.get("weight")
    if node.target is aten.layer_norm.default:
        b = node.args[3] if len(node.args) > 3 else kw.get("bias")
        eps = node.args[4] if len(node.args) > 4 else kw.get("eps", 1e-5)
        return "layer", x, shape, w, b, eps
    eps = node.args[3] if len(node.args) > 3 else kw.get("eps")
    if eps is None:
        eps = torch.finfo(dtype_of(x)).eps
    return "rms", x, shape, w, None, eps


def add_norm_supported(node, ctx):
    kind, x, shape, w, b, eps = _canonical(node)
    if residual_of(x, [node], ctx) is None or insert_point(x, (w, b), [node]) is None:
        return False
    return denied([node, x], ctx) or (layer_norm_supported if kind == "layer" else rms_norm_supported)(node, ctx)


def lower_add_norm(node, ctx):
    kind, x, shape, w, b, eps = _canonical(node)
    return replace_fused(ctx, kind, x, shape, w, b, eps, node, [node], insert_point(x, (w, b), [node]))


register_lowering(Lowering(
    "add_layer_norm", "add_layer_norm", (aten.layer_norm.default,), add_norm_supported, lower_add_norm,
    stage="fuse", doc="layer_norm(x + r) where x + r is also used later -> (x + r, norm) in one pass"))
register_lowering(Lowering(
    "add_rms_norm", "add_rms_norm", (aten.rms_norm.default,), add_norm_supported, lower_add_norm,
    stage="fuse", doc="rms_norm(x + r) where x + r is also used later -> (x + r, norm) in one pass"))
