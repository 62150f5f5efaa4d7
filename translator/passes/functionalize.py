"""Functionalize in-place ops before matching: `x += y` behaves as `x = x + y` everywhere.

torch.export keeps in-place aten ops (`aten.add_`, `aten.mul_`, `aten.copy_`, `aten.detach_`,
...) in the graph it returns, and every later read goes through the op's result. A pattern
written for `aten.add.Tensor` would not see `aten.add_.Tensor`, and an elementwise region would
stop at it. When nothing can observe the mutation itself, the node is replaced by its
out-of-place form:

- the mutated tensor is an intermediate value (not a graph input or a parameter / buffer,
  whose mutation the caller sees),
- no view of it was taken (an alias would see the new value), and when it is itself a view,
  its base qualifies in turn with this view its only alias (``s = s.view(...); s += bias``),
- every other reader of it runs before the in-place op (it reads the old value either way).

`copy_(dst, src)` becomes `src` cast to dst's dtype and broadcast to its shape; `detach_(x)`
becomes `x`. The new node keeps the captured name, so the report attributes it as before.
Anything else stays as it is (and the report says the op stays in PyTorch).
"""

from __future__ import annotations

import torch

from ..graph import arg

aten = torch.ops.aten


def functionalize(ctx) -> int:
    g = ctx.gm.graph
    order = {n: i for i, n in enumerate(g.nodes)}
    done = 0
    for node in list(g.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        new = _out_of_place(ctx, node, order)
        if new is None:
            continue
        new.meta["orig_name"] = node.meta.get("orig_name", node.name)
        node.replace_all_uses_with(new)
        g.erase_node(node)
        done += 1
    if done:
        ctx.count("functionalize", done)
    return done


def _inplace_target(node):
    schema = node.target._schema
    args = schema.arguments
    if not args or args[0].alias_info is None or not args[0].alias_info.is_write:
        return None
    return args[0]


def _mutation_unobservable(x, node, order, depth: int = 4, via=None) -> bool:
    """Nothing but `node` sees x change: x is an intermediate whose other readers run before
    node; a view x qualifies when its base does, with x its only view (``s.view(...).add_(b)``).
    via: the reader the mutation arrives through (node itself, or the view of x it mutates)."""
    if not isinstance(x, torch.fx.Node) or x.op != "call_function":
        return False
    if _aliases(x) and not (depth and isinstance(x.target, torch._ops.OpOverload) and x.args
                            and _mutation_unobservable(x.args[0], node, order, depth - 1, via=x)):
        return False
    for u in x.users:
        if u is (via or node):
            continue
        if _aliases(u) or order.get(u, -1) > order[node]:
            return False
    return True


def _aliases(n) -> bool:
    """True for an op whose result is a view of (aliases) an input."""
    t = n.target
    if not isinstance(t, torch._ops.OpOverload):
        return n.op == "call_function"  # unknown callables: assume the worst
    return any(r.alias_info is not None for r in t._schema.returns)


def _out_of_place(ctx, node, order):
    target = _inplace_target(node)
    if target is None:
        return None
    x = arg(node, target.name)
    if not _mutation_unobservable(x, node, order):
        return None
    g = ctx.gm.graph
    t = node.target
    if t is aten.detach_.default:
        return x
    if t is aten.copy_.default:
        src, want = arg(node, "src"), x.meta["val"]
        have = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
        if not isinstance(have, torch.Tensor):
            return None
        if have.dtype == want.dtype and have.shape == want.shape and len(src.users) == 1 and not _aliases(src):
            return src  # the copy's only reader: its value is the result
        y = src
        with g.inserting_before(node):
            if have.dtype != want.dtype:
                y = ctx.infer(g.call_function(aten._to_copy.default, (y,), {"dtype": want.dtype}))
            y = ctx.infer(g.call_function(aten.expand_as.default, (y, x)))
            y = g.call_function(aten.clone.default, (y,))  # a dense tensor, as copy_'s destination was
        return ctx.infer(y)
    name = t._schema.name.split("::")[-1]
    if not name.endswith("_"):
        return None
    packet = getattr(aten, name[:-1], None)
    out = getattr(packet, t._overloadname, None) if packet is not None else None
    if out is None or any(a.alias_info is not None for a in out._schema.arguments):
        return None
    with g.inserting_before(node):
        y = g.call_function(out, node.args, node.kwargs)
    ctx.infer(y)
    want = node.meta.get("val")
    if isinstance(want, torch.Tensor) and (y.meta["val"].dtype != want.dtype or y.meta["val"].shape != want.shape):
        g.erase_node(y)  # type promotion or broadcasting that in-place semantics forbid: leave it
        return None
    return y
