"""Mixture-of-experts layers written by hand -> `flydsl.moe_experts` (the ops: moe.py).

Two forms, both accumulating into ``out = torch.zeros_like(x)``, one step per expert id
first..first + E - 1 (first = 0, or a rank's first expert under expert parallel), each expert
``w2(act(w1(h)) * w3(h))`` of three bias-free Linears (the gated-MLP matcher: silu / gelu):

    tok, slot = torch.where(top_idx == e)                        the loop (Mixtral-style reference code)
    out.index_add_(0, tok, expert(x[tok]) * w[tok, slot, None])  (or w[tok, slot].unsqueeze(-1); .to(dtype))

    out = out + (w * (top_idx == e)).sum(-1, keepdim=True) * expert(x)      dense dispatch (every
                                                                          expert on every token, masked)

The pattern anchors at `zeros_like`, which comes before the experts' gated MLPs (the gated-MLP rule
would take them one by one otherwise). The loop's `where` has a data-dependent size: the loop's
nodes and their unbacked-size asserts are erased with the match, so no such size reaches a later
pass; a loop that branches on it (`if tok.numel() == 0: continue`) cannot be captured, and its
CaptureError names this rewrite (translator.capture.MOE_LOOP_HINT). Dense dispatch computes every
expert on every token; as moe_experts it computes only the routed pairs (the same sum: the other
terms are multiplied by 0). The per-expert Linear weights are stacked into moe.py's prepared layout,
rebuilt if a parameter changes. Counters: `moe_experts_loop`, `moe_experts_dense`.
"""

from __future__ import annotations

import torch

from ..graph import arg, aten, dtype_of, shape_of
from ..registry import NO_MATCH, Match, Stage, rule
from . import moe_fp8
from .gated_mlp import _match as _gated_mlp
from .moe import _erase_dead, _experts_reason, _is, _item, _one_index, _pair, _skip_to, _src, _w13, _w2


def _loop_step(add, ctx):
    """(expert, ids, weights, x, (W1, W3, W2), act, nodes) of one `out.index_add_(0, tok, expert(x[tok]) *
    w[tok, slot, None])` step with `tok, slot = torch.where(ids == expert)`, else None."""
    if arg(add, "dim") != 0 or arg(add, "alpha", 1) != 1:
        return None
    tok, contrib = arg(add, "index"), _skip_to(arg(add, "source"))  # (...).to(out.dtype) in low precision
    wh = _item(tok, 0)
    eq = arg(wh, "condition") if _is(wh, aten.where.default) else None
    if not _is(eq, aten.eq.Scalar) or not isinstance(arg(eq, "other"), int) or not _is(contrib, aten.mul.Tensor):
        return None
    ids, e = _src(eq), arg(eq, "other")
    slot = next((u for u in wh.users if _item(u, 1) is wh), None)
    for y, wsel in _pair(contrib):
        if _is(y, aten.linear.default) and _is(wsel, aten.index.Tensor, aten.unsqueeze.default):
            break
    else:
        return None
    nodes = [add, tok, wh, eq, contrib, y, wsel, arg(add, "source")] + ([slot] if slot is not None else [])
    if wsel.target is aten.unsqueeze.default:  # w[tok, slot].unsqueeze(-1)
        wsel = _src(wsel)
        nodes.append(wsel)
        if not _is(wsel, aten.index.Tensor):
            return None
        weights = _src(wsel)
    else:  # w[tok, slot, None] (= unsqueeze(w, 2)[tok, slot])
        un = _src(wsel)
        if not _is(un, aten.unsqueeze.default):
            return None
        weights = _src(un)
        nodes.append(un)
    if slot is None or list(arg(wsel, "indices")) != [tok, slot]:
        return None
    ex = _expert(y, ctx)
    if ex is None or _one_index(ex[0]) is not tok:
        return None
    xe, ws, gate, more = ex
    return e, ids, weights, _src(xe), ws, gate, nodes + more + [xe]


def _dense_step(add, cur, ctx):
    """The same tuple for one `out = out + (w * (ids == e)).sum(-1, keepdim=True) * expert(x)` step."""
    for prev, term in _pair(add):
        if prev is cur and _is(term, aten.mul.Tensor):
            break
    else:
        return None
    for g, y in _pair(term):
        if _is(g, aten.sum.dim_IntList) and _is(y, aten.linear.default):
            break
    else:
        return None
    if list(arg(g, "dim") or []) not in ([-1], [1]) or not arg(g, "keepdim", False) or not _is(_src(g), aten.mul.Tensor):
        return None
    for weights, eq in _pair(_src(g)):
        if _is(eq, aten.eq.Scalar) and isinstance(arg(eq, "other"), int):
            break
    else:
        return None
    ex = _expert(y, ctx)
    if ex is None:
        return None
    x, ws, gate, more = ex
    return arg(eq, "other"), _src(eq), weights, x, ws, gate, [add, term, g, _src(g), eq, y] + more


def _expert(y, ctx):
    """(x, (W1, W3, W2), act, nodes) of y = linear(act(linear(x, W1)) * linear(x, W3), W2), no biases."""
    w2 = ctx.constant(arg(y, "weight"))
    hidden = arg(y, "input")
    if w2 is None or arg(y, "bias") is not None or not _is(hidden, aten.mul.Tensor):
        return None
    gm = _gated_mlp(hidden, ctx)
    if gm is None:
        return None
    gate, act_node, gl, ul = gm
    w1, w3 = ctx.constant(arg(gl, "weight")), ctx.constant(arg(ul, "weight"))
    if w1 is None or w3 is None or arg(gl, "bias") is not None or arg(ul, "bias") is not None:
        return None
    return arg(gl, "input"), (w1, w3, w2), gate, [hidden, act_node, gl, ul]


_CHAINS = {"loop": ((aten.index_add.default, aten.index_add_.default), lambda add, cur, ctx: (
               _loop_step(add, ctx) if arg(add, "self") is cur else None)),
           "dense": ((aten.add.Tensor,), _dense_step)}


def _match_loop(node, ctx):
    """E steps (one per expert id first..first + E - 1) accumulating into out = zeros_like(x), each an
    index_add_ (the loop form) or an add of a masked full-batch expert (dense dispatch)."""
    for form, (targets, step) in _CHAINS.items():
        steps, cur = [], node
        while len(cur.users) == 1:
            (add,) = cur.users
            st = step(add, cur, ctx) if _is(add, *targets) else None
            if st is None:
                break
            steps.append(st)
            cur = add
        if len(steps) >= 2:
            break
    else:
        return None
    ids, weights, x, gate = steps[0][1], steps[0][2], steps[0][3], steps[0][5]
    if any((s[1], s[2], s[3], s[5]) != (ids, weights, x, gate) for s in steps) or arg(node, "self", x) is not x:
        return None
    by_e = {s[0]: s for s in steps}
    first = min(by_e)  # expert parallel: a rank's loop covers its experts [first, first + E)
    if sorted(by_e) != list(range(first, first + len(steps))) or first < 0:
        return None
    ws = [by_e[first + j][4] for j in range(len(steps))]
    nodes = [n for s in steps for n in s[6]] + [node]
    return dict(x=x, ids=ids, weights=weights, gate=gate, last=cur, experts=ws, seen=nodes, first=first, form=form)


def moe_loop_supported(node, ctx):
    m = _match_loop(node, ctx)
    if m is None:
        return NO_MATCH
    w1, w3, w2 = m["experts"][0]
    if any(tuple(a.shape) != tuple(b.shape) for ws in m["experts"] for a, b in zip(ws, (w1, w3, w2))):
        return "the experts' weights differ in shape"
    k = (shape_of(m["ids"]) or [None])[-1]
    gu = torch.empty(len(m["experts"]), 2 * w1.shape[0], w1.shape[1], dtype=w1.dtype, device="meta")
    dn = torch.empty(len(m["experts"]), *w2.shape, dtype=w2.dtype, device="meta")
    return _experts_reason(dict(m, k=k, gate_up=gu, down=dn), ctx) or Match(**m)


def _stack_gate_up(*ws):
    e = len(ws) // 3
    return torch.stack([torch.cat([ws[3 * j].detach(), ws[3 * j + 1].detach()]) for j in range(e)])


def _stack_down(*ws):
    return torch.stack([w.detach() for w in ws])


@rule(Stage.PATTERN, aten.zeros_like.default, family="moe_experts", supported=moe_loop_supported,
      doc="out = zeros_like(x); per expert e: out.index_add_(0, tok, expert_e(x[tok]) * w[tok, slot, None]) "
          "(tok, slot = where(ids == e)), or out = out + (w * (ids == e)).sum(-1, keepdim=True) * expert_e(x) "
          "-> moe_experts")
def lower_moe_loop(node, ctx, m):
    flat = [w for ws in m.experts for w in ws]
    downs = tuple(ws[2] for ws in m.experts)
    if ctx.precision == "fp8":  # fp8 experts (moe_fp8.py); None where they stay bf16
        new = moe_fp8.emit_experts_fp8(ctx, m.last, m.x, m.weights, m.ids, (_stack_gate_up, flat),
                                       (_stack_down, downs), m.experts[0][0].shape[0], m.gate, m.first,
                                       "moe_experts_fp8_" + m.form, m.seen)
        if new is not None:
            m.last.replace_all_uses_with(ctx.cast(new, dtype_of(m.last), m.last))
            _erase_dead(ctx, m.seen)
            return new
    dt = None if ctx.precision == "fp32" else ctx.compute_dtype
    w13 = ctx.add_constant(_w13(dt, _stack_gate_up(*flat)), "moe_w13", m.last,
                           derive=lambda *p: _w13(dt, _stack_gate_up(*p)), sources=tuple(flat))
    w2 = ctx.add_constant(_w2(dt, _stack_down(*downs)), "moe_w2", m.last,
                          derive=lambda *p: _w2(dt, _stack_down(*p)), sources=downs)
    x = ctx.cast_in(m.x, m.last)
    new = ctx.emit("moe_experts", (x, m.weights, m.ids, w13, w2, m.experts[0][0].shape[0], m.gate, None, m.first),
                   lowering="moe_experts_" + m.form, sources=m.seen, anchor=m.last, before=m.last)
    m.last.replace_all_uses_with(ctx.cast(new, dtype_of(m.last), m.last))
    _erase_dead(ctx, m.seen)
    return new
