"""Sibling projections in one GEMM: linears that read the same input -> one `flydsl.gemm`.

Matched (aten, canonical stage, before the one-linear lowering): two or more ``aten.linear``
nodes with the same input `x` and parameter weights of one dtype and K, all with a parameter
bias or none:

    q = self.q_proj(x); k = self.k_proj(x); v = self.v_proj(x)     HF Llama, Mistral, Qwen2, BERT,
                                                                   ViT, T5 (q / k / v), CLIP ...

(gate and up projections read the same x too, but the pattern stage has already made them one
gated GEMM: translator/lowerings/gated_mlp.py.)

Rewrite: the weights are concatenated at translate time ([Nq + Nk + Nv, K], preshuffled once,
rebuilt when a parameter changes: state.prepared), one GEMM computes [.., Nq + Nk + Nv], and each
sibling's uses read its column slice of that output, a view: the outputs are written where the
graph reads them, x is read once and there is one launch instead of three. A slice's strides
are not those of a separate linear's output (its rows are Nq + Nk + Nv apart); the
`fix_strides` pass re-checks what reads them (a ``view(B, S, H, D)`` of a column slice stays
a view). Siblings past a collective's issue are not merged (the merged GEMM would run before the issue:
tests/e2e/test_generation_tp.py, test_an_overlapped_collective_stays_overlapped). Counters: `qkv` (merged
GEMMs), `qkv_merged_linears` (the linears they replaced).
"""

from __future__ import annotations

import functools

import torch

from ..graph import aten, arg, captured_name, dtype_of, users
from ..registry import NO_MATCH, Match, Stage, rule
from .gemm import cast_weight, linear_supported, shuffled_weight


def _siblings(node, ctx) -> list:
    """The lowerable linears that read `node`'s input (graph order), `node` first, else []."""
    x = arg(node, "input")
    w0 = ctx.constant(arg(node, "weight"))
    if w0 is None or not isinstance(x, torch.fx.Node):
        return []
    out = []
    for u in users(x):
        if u.op != "call_function" or u.target is not aten.linear.default or arg(u, "input") is not x:
            continue
        w, b = ctx.constant(arg(u, "weight")), arg(u, "bias")
        if isinstance(linear_supported(u, ctx), str) or w.shape[1] != w0.shape[1] or w.dtype != w0.dtype:
            continue
        if (b is None) != (arg(node, "bias") is None) or (b is not None and ctx.constant(b) is None):
            continue
        out.append(u)
    out.sort(key=lambda n: n._sort_key)
    out = out[:_before_a_collective(out)]
    return out if len(out) >= 2 and out[0] is node and not ctx.denied(out) else []


def _before_a_collective(sibs) -> int:
    """How many of `sibs` (graph order) come before the first collective issued after sibs[0]: the merged GEMM
    runs where sibs[0] was, so a sibling past an issue would be pulled before it (the issue then waits for its
    GEMM, and compute the model overlapped with the collective no longer is)."""
    n, i = sibs[0].next, 1
    while i < len(sibs):
        if n is sibs[i]:
            i += 1
        elif n.op == "call_function" and getattr(n.target, "namespace", None) in ("_c10d_functional", "c10d") \
                and "wait" not in str(n.target):
            break
        n = n.next
    return i


def qkv_supported(node, ctx):
    sibs = _siblings(node, ctx)
    return Match(sibs=sibs) if sibs else NO_MATCH


def _concat(dt, *ws):
    return shuffled_weight(dt, torch.cat([w.detach() for w in ws], 0))


def _concat_natural(dt, *ws):
    return cast_weight(dt, torch.cat([w.detach() for w in ws], 0))


def _concat_bias(dt, *bs):
    return cast_weight(dt, torch.cat([b.detach() for b in bs], 0))


@rule(Stage.CANONICAL, aten.linear.default, family="gemm", supported=qkv_supported, priority=10,
      doc="linears reading one input (Q, K, V projections) -> one GEMM over concatenated weights")
def lower_qkv(node, ctx, m):
    sibs = m.sibs
    ws = [ctx.constant(arg(s, "weight")) for s in sibs]
    dt = None if ctx.precision == "fp32" else ctx.compute_dtype
    prep = functools.partial(_concat, dt)
    w_node = ctx.add_constant(None, "qkv_w", node, derive=prep, sources=tuple(ws),
                              natural=functools.partial(_concat_natural, dt))
    b_node = None
    if arg(node, "bias") is not None:
        bs = [ctx.constant(arg(s, "bias")) for s in sibs]
        bprep = functools.partial(_concat_bias, dt)
        b_node = ctx.add_constant(bprep(*bs), "qkv_b", node, derive=bprep, sources=tuple(bs))
    n_total, k = sum(w.shape[0] for w in ws), ws[0].shape[1]
    x = ctx.cast_in(arg(node, "input"), node)
    anchor = "+".join(captured_name(s) for s in sibs)  # no captured value of this shape: not compared alone
    new = ctx.emit("gemm", (x, w_node, n_total, k, b_node, None, None, 1.0), lowering="qkv", sources=sibs,
                   anchor=anchor, before=node)
    off, prev = 0, new
    for s, w in zip(sibs, ws):
        part = ctx.insert(aten.slice.Tensor, new, -1, off, off + w.shape[0], after=prev)
        part.meta["replaces"] = captured_name(s)
        out = ctx.cast(part, dtype_of(s), s)
        s.replace_all_uses_with(out)
        off, prev = off + w.shape[0], part
    ctx.count("qkv_merged_linears", len(sibs))
    ctx.erase_unused(sibs)
    return new
