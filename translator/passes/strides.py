"""The stride contract: the translated graph computes with the layouts its FlyDSL ops return.

torch.export records every value's strides as eager produced them, and graph code may depend
on them: a ``.contiguous()`` that was a no-op in eager is not in the graph at all, so the
``view`` after it is valid only for eager's layout (gpt-fast's
``y.transpose(1, 2).contiguous().view(B, S, D)`` after SDPA, whose CPU output follows the
query's [B, S, H, D] memory). A FlyDSL op should return its aten op's layout (attention writes
O in the order eager's SDPA returns: translator/lowerings/attention.py); where one does not,
these two passes make the graph right anyway:

- `record_strides` (first pass): the captured value of every node, by captured name, before any
  rewrite.
- `fix_strides` (after the last lowering): walks the graph in order. A FlyDSL node whose layout
  differs from its anchor's recorded one (or whose shape does: it replaced something else) is a
  *changed* value. Every node that reads a changed value is re-run on fake tensors, so its
  ``meta["val"]`` holds the layout it will really see; a node whose layout then differs is
  changed in turn. A consumer that cannot take the new layout is rewritten:
    * ``view`` that no longer fits its input -> ``reshape`` (a view where the layout allows,
      else a copy);  counter ``stride_view_to_reshape``;
    * ``as_strided`` (which would silently read other elements), and any op whose re-run
      raises -> its changed inputs are first copied back to their recorded layout;
      counter ``stride_restore``;
    * a graph output whose layout differs from eager's is copied to eager's layout, so the user
      gets the strides eager gives; counter ``stride_output``.
  A FlyDSL node whose layout differs from its anchor's bumps ``stride_mismatch_<family>``. A node
  a lowering marked ``meta["replaces"] = captured name`` (a column slice of a merged GEMM that
  took a linear's uses: translator/lowerings/qkv.py) is compared with that node's record the same way.

A restore copy is ``permute(order) -> clone(contiguous) -> permute(inverse)``: three aten ops,
one copy, exact strides for any dense layout. Nodes whose recorded value holds unbacked
symbols (data-dependent shapes) are never re-run (a re-run would mint new symbols): their
changed inputs are restored instead.
"""

from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from ..graph import aten, captured_name, getitem_of, val
from ..layouts import dim_order, same_layout

_KEY = "flydsl_eager_vals"
VIEWS = (aten.view.default, aten._unsafe_view.default)
UNSAFE = (aten.as_strided.default, aten.as_strided_.default)  # read memory by strides: restore first


def record_strides(ctx) -> int:
    """Remember every node's captured value (shape and strides as eager made them)."""
    rec = {captured_name(n): n.meta["val"] for n in ctx.gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)}
    ctx.gm.meta[_KEY] = rec
    return 0


def _flydsl_value(n) -> bool:
    """n is a flydsl node or one output of one."""
    if n.op != "call_function":
        return False
    if getattr(n.target, "namespace", None) == "flydsl":
        return True
    gi = getitem_of(n)
    return gi is not None and getattr(gi[0].target, "namespace", None) == "flydsl"


def _anchor_val(n, rec):
    """The recorded value of the node flydsl value `n` reproduces: its own anchor, or the anchor
    of its op when it is the only output; None when nothing was recorded for it."""
    info = n.meta.get("flydsl")
    if info is None:
        src, _ = getitem_of(n)
        if len(val(src)) != 1:
            return None  # one of several outputs with no anchor of its own
        info = src.meta.get("flydsl")
    return rec.get(info["anchor"]) if info else None


def restride(ctx, x, like, before):
    """Insert a copy of `x` laid out as tensor `like` (a dense layout of x's shape) before `before`;
    None when `like` is no such layout."""
    order = dim_order(like) if isinstance(like, torch.Tensor) and _same_shape(val(x), like) else None
    if order is None:
        return None
    inv = [order.index(d) for d in range(len(order))]
    ident = list(order) == list(range(len(order)))
    p = x if ident else ctx.insert(aten.permute.default, x, list(order), before=before)
    c = ctx.insert(aten.clone.default, p, before=before, memory_format=torch.contiguous_format)
    return c if ident else ctx.insert(aten.permute.default, c, inv, before=before)


def _rerun(ctx, n) -> bool:
    try:
        ctx.infer(n)
        return True
    except Exception:  # noqa: BLE001 — any failure of the fake re-run means "this layout does not fit"
        return False


def fix_strides(ctx) -> int:
    rec = ctx.gm.meta.pop(_KEY, {})
    g = ctx.gm.graph
    changed: dict = {}  # node -> the value (layout) the rest of the graph was traced with
    fixes = 0
    for n in list(g.nodes):
        if n.op == "output":
            fixes += _restore_inputs(ctx, n, changed, "stride_output")
            continue
        if n.op != "call_function" or not isinstance(val(n), (torch.Tensor, list, tuple)):
            continue
        flydsl = _flydsl_value(n)
        if flydsl or "replaces" in n.meta:  # a value that took a captured node's uses
            want = _anchor_val(n, rec) if flydsl else rec.get(n.meta["replaces"])
            got = val(n)
            if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and not same_layout(got, want):
                changed[n] = want
                if flydsl and _same_shape(got, want) and dim_order(want) is not None:  # (a dense copy of a view: no count)
                    ctx.count(f"stride_mismatch_{(n.meta.get('flydsl') or getitem_of(n)[0].meta['flydsl'])['family']}")
            if flydsl and not any(i in changed for i in n.all_input_nodes):
                continue
        if n not in changed and not any(i in changed for i in n.all_input_nodes):
            continue
        old = val(n)
        if isinstance(old, torch.Tensor) and free_unbacked_symbols(old) or n.target in UNSAFE:
            fixes += _restore_inputs(ctx, n, changed)
            continue
        if not _rerun(ctx, n):
            if n.target in VIEWS:
                n.target = aten.reshape.default
                ctx.count("stride_view_to_reshape")
                fixes += 1
            else:
                fixes += _restore_inputs(ctx, n, changed)
            if not _rerun(ctx, n):
                raise RuntimeError(f"fix_strides: {n.format_node()} fails on its inputs' layouts even after restoring them")
        if _differ(old, val(n)):
            changed[n] = old
    return fixes


def _same_shape(a, b) -> bool:
    return tuple(map(str, a.shape)) == tuple(map(str, b.shape))


def _differ(old, new) -> bool:
    """The layouts of value `old` and its re-run `new` (tensors, or lists of them) differ."""
    if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
        return not same_layout(new, old)
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)) and len(old) == len(new):
        return any(_differ(a, b) for a, b in zip(old, new))
    return False


def _restore_inputs(ctx, n, changed, counter: str = "stride_restore") -> int:
    """Make `n` read each changed tensor input copied back to its recorded layout."""
    count = 0
    for i in list(n.all_input_nodes):
        if i in changed and isinstance(val(i), torch.Tensor):
            r = restride(ctx, i, changed[i], before=n)
            if r is not None:
                n.replace_input_with(i, r)
                ctx.count(counter)
                count += 1
    return count
