"""Casts around a rotation folded into `flydsl.rope`: the kernel reads x in its own dtype and rounds once.

gpt-fast (and Meta's reference) rotate in fp32 whatever the model's dtype:

    xs = x.float().reshape(*x.shape[:-1], -1, 2)          # bf16 -> fp32
    out = torch.stack([...], -1).flatten(3)               # flydsl.rope (rope.py)
    return out.type_as(x)                                 # fp32 -> bf16

In a bf16 model (and under precision="bf16", whose GEMMs give bf16 that the fp32 graph casts back)
the two casts stay one generated elementwise kernel each, per rotation: four launches per layer
around the RoPE launch, and q's and k's rotations read two different cast outputs, so rope_cache.py
cannot put them in one launch (13 launches per layer instead of 8). The RoPE kernel already loads
x, cos and sin in their own dtypes and computes in fp32 (translator_kernels/layout/rope_cache.py),
so:

- a cast to fp32 of a bf16 / fp16 tensor feeding x (through views) is dropped: the views are
  rebuilt over the narrow tensor (each checked to stay a view, replayed on a meta tensor) and the
  kernel reads it; widening is exact, so the fp32 math sees the same numbers;
- a cast of the fp32 result to bf16 / fp16 (through views) becomes the op's `out_dtype`: the kernel
  rounds its fp32 result once to it, which is what eager's cast of the fp32 result does.

Same values, bit for bit. A CONSUMER rule ahead of rope_cache (priority 2): it folds every rotation
of the graph at once, so that q's and k's rotations read views of one tensor by the time the fused
RoPE / cache-write rule looks for a partner. A cast read by anything else stays. Counter `rope_casts`
(casts folded).
"""

from __future__ import annotations

import torch

from translator_kernels.program import parse

from ..graph import arg, aten, dtype_of, getitem_of, is_call, set_args, size_hint, val
from ..registry import NO_MATCH, Match, Stage, rule
from .rope_cache import ROPE, _out, _replay, _view_of

FE = torch.ops.flydsl.fused_elementwise.default
NARROW = (torch.bfloat16, torch.float16)


def _cast(n):
    """(source, [nodes of the cast]) when n is one float cast of one tensor read by nothing else: a
    one-op `flydsl.fused_elementwise` region or an aten cast, else None."""
    part = getitem_of(n)
    if part is not None and isinstance(part[0], torch.fx.Node) and part[0].target is FE:
        f = part[0]
        ins, prog = arg(f, "inputs"), parse(arg(f, "program"))
        if len(ins) == 1 and len(prog.ops) == 1 and prog.ops[0][0] == "cast" and len(prog.out) == 1 \
                and len(f.users) == 1:
            return ins[0], [n, f]
        return None
    if is_call(n, aten._to_copy.default, aten.to.dtype) and set(n.kwargs) <= {"dtype"}:
        return arg(n, "self"), [n]
    return None


def _single_user_chain(start, end) -> list | None:
    """The view nodes from `start` (exclusive) out to `end` (inclusive), each the only reader of the
    one before, else None."""
    chain, n = [], end
    while n is not start:
        chain.append(n)
        b = _view_of(n)
        if b is None or len(b.users) != 1 or getitem_of(n) is not None:
            return None
        n = b
    return chain[::-1]


def _input_fold(r):
    """(narrow source, cast nodes, view chain) when x of rope r is views of a widening cast to fp32."""
    x = arg(r, "xs")[0]
    n = x
    while (b := _view_of(n)) is not None and getitem_of(n) is None:
        n = b
    found = _cast(n)
    if found is None or dtype_of(n) != torch.float32 or dtype_of(found[0]) not in NARROW or len(n.users) != 1:
        return None
    src, nodes = found
    chain = _single_user_chain(n, x) if x is not n else []
    if chain is None:
        return None
    sv = val(src)
    meta = torch.empty_strided([size_hint(s) for s in sv.shape], [size_hint(s) for s in sv.stride()],
                               dtype=sv.dtype, device="meta")
    if chain and _replay(chain, meta) is None:
        return None  # a reshape that would copy the narrow tensor
    return src, nodes, chain


def _output_fold(r):
    """(narrowing cast's output node, cast nodes, view chain) when rope r's fp32 result is read only
    through views by one cast to bf16 / fp16."""
    g = _out(r)
    if g is None or dtype_of(g) != torch.float32:
        return None
    chain, n = [], g
    while len(n.users) == 1:
        u = next(iter(n.users))
        found = _cast(u) if getitem_of(u) is None else None
        if found is None and u.target is FE and len(u.users) == 1:
            found = _cast(next(iter(u.users)))
            u = next(iter(u.users))
        if found is not None and found[0] is n:
            return (u, found[1], chain) if dtype_of(u) in NARROW else None
        if _view_of(u) is not n or getitem_of(u) is not None:
            return None
        chain.append(u)
        n = u
    return None


def _foldable(r):
    if r.target is not ROPE or len(arg(r, "xs")) != 1 or arg(r, "kc") is not None or arg(r, "vc") is not None:
        return None, None
    return _input_fold(r), (_output_fold(r) if arg(r, "out_dtype") is None else None)


def _rebuild(ctx, chain, base, before):
    """The view chain's ops applied to `base` (a node), inserted before `before`; the last node."""
    n = base
    for v in chain:
        prev = arg(v, "self")
        args, kwargs = torch.fx.node.map_arg((v.args, v.kwargs), lambda a, prev=prev, n=n: n if a is prev else a)
        n = ctx.insert(v.target, *args, before=before, **kwargs)
    return n


def rope_casts_supported(node, ctx):
    folds = {r: f for r in node.graph.nodes if r.target is ROPE and any(f := _foldable(r))}
    if node not in folds or ctx.denied(list(folds)):
        return NO_MATCH
    return Match(folds=folds)


@rule(Stage.CONSUMER, ROPE, family="rope", supported=rope_casts_supported, priority=2,
      doc="x.float() before and .type_as(x) after a rotation -> flydsl.rope reads x and rounds to the cast's dtype")
def fuse_rope_casts(node, ctx, m):
    for r, (fin, fout) in m.folds.items():
        if fin is not None:
            src, nodes, chain = fin
            x = _rebuild(ctx, chain, src, r)
            set_args(r, xs=[x])
            ctx.absorb(r, nodes)
            ctx.count("rope_casts")
            ctx.erase_unused([*chain[::-1], *nodes])
        if fout is not None:
            cast_out, nodes, chain = fout
            set_args(r, out_dtype=dtype_of(cast_out))
            ctx.infer(r)
            g = _out(r)
            g.meta["val"] = val(r)[0]
            y = _rebuild(ctx, chain, g, cast_out)
            cast_out.replace_all_uses_with(y)
            ctx.absorb(r, nodes)
            ctx.count("rope_casts")
            ctx.erase_unused([*nodes, *chain[::-1]])
        if fin is not None and fout is None:
            ctx.infer(r)
    return node
