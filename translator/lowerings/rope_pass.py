"""The pass-through part of a partial rotary joined to RoPE: `cat([rotated, x[..., D:]], -1)` becomes the rotation.

Partial-rotary attention (Phi-3, GPT-NeoX, Phi) rotates the first `rotary_dim` features of each head and passes
the rest through:

    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    q_embed = torch.cat([rope(q_rot), q_pass], dim=-1)

Phi-3's default config rotates all of head_dim (partial_rotary_factor 1.0), so `q_pass` has no element, yet
the `cat` is a copy left in PyTorch, and a rotated k reaching the cache write through it is no view chain:
rope_cache.py could not store k from the RoPE launch (K's write a separate scatter: 10 launches per Phi-3
layer). A `cat` whose other members are statically empty along the cat dim is the rotation itself (the same
shape; contiguous, as the `cat` returns it): its readers read the rotation. A CONSUMER rule on flydsl.rope
(priority 4, ahead of rope_norm.py, rope_casts.py and rope_cache.py), folding every such `cat` of the graph at
once. Counter `rope_empty_pass`.

A non-empty pass-through part (GPT-NeoX's rotary_pct 0.25: 4 of 16 features rotate) was a real `cat` in PyTorch,
so q's and k's rotations read two different parts of the projection (no pairing) and the rotated k reached its
cache write through a copy: 2 RoPE launches and 2 cache-write launches per layer, 11 launches per GPT-NeoX layer.
A second rule (priority 5, ahead of the empty-pass one) takes

    y = flydsl.rope([x[..., :r]], [cos], [sin])    (rotate-half, the slice's start 0, r < D, both static)
    cat([y, x[..., r:]], -1)                        (the rest of the same x, nothing else reading y)
    -> flydsl.rope([x], [cos], [sin], rot_dim=r)    (the kernel rotates features < r and copies the rest:
                                                     translator_kernels/layout/rope_cache.py)

with the cat's dtype that of x and of the rotation (the passed features are x's own values, stored unrounded).
The result has the cat's shape and contiguous layout, and the op now reproduces the cat (its anchor). Then q's and
k's rotations read views of one QKV output and rope_cache.py pairs them and takes both cache writes: a GPT-NeoX
layer is Llama's 8. Any other cat (the parts in the other order, a pass part of another tensor or not starting at
r, a norm folded in, interleaved pairs) keeps its form. Counter `rope_partial_pass`.
"""

from __future__ import annotations

import operator

import torch

from ..graph import aten, arg, captured_name, dtype_of, getitem_of, set_args, shape_of, static_int, val
from ..registry import NO_MATCH, Match, Stage, rule
from .rope import _half
from .rope_cache import ROPE, _out, rope_folds


def _empty_pass_cats(r):
    """The cats reading an output of rope r whose other members are empty along the cat dim."""
    out = []
    for g in r.users:
        if g.target is not operator.getitem:
            continue
        for c in g.users:
            if c.target is not aten.cat.default:
                continue
            xs, dim = arg(c, "tensors"), arg(c, "dim", 0)
            rank = len(shape_of(g))
            dim = dim + rank if dim < 0 else dim
            others = [t for t in xs if t is not g]
            if xs.count(g) != 1 or not others or any(
                    not isinstance(t, torch.fx.Node) or len(shape_of(t)) != rank or static_int(shape_of(t)[dim]) != 0
                    for t in others):
                continue
            out.append((c, g))
    return out


def rope_pass_supported(node, ctx):
    cats = [p for r in node.graph.nodes if r.target is ROPE for p in _empty_pass_cats(r)]
    if not any(getitem_of(g)[0] is node for _, g in cats) or ctx.denied([c for c, _ in cats]):
        return NO_MATCH
    return Match(cats=cats)


@rule(Stage.CONSUMER, ROPE, family="rope", supported=rope_pass_supported, priority=4,
      doc="cat([rope(x), x[..., D:]]) with nothing past D -> the rotation (partial rotary of the full head)")
def drop_empty_pass(node, ctx, m):
    for c, g in m.cats:
        c.replace_all_uses_with(g)
        ctx.count("rope_empty_pass")
        ctx.erase_unused([c, *(t for t in arg(c, "tensors") if t is not g)])
    return node


def _partial_pass(r):
    """(cat, rotation's getitem, x, r) when rope r rotates x[..., :r] and one cat joins x[..., r:] after it."""
    if len(arg(r, "xs")) != 1 or arg(r, "kc") is not None or arg(r, "vc") is not None or arg(r, "pairs") \
            or arg(r, "norm_w0") is not None or arg(r, "rot_dim"):
        return None
    g = _out(r)
    if g is None or len(g.users) != 1:
        return None
    c = next(iter(g.users))
    if c.target is not aten.cat.default or len(arg(c, "tensors")) != 2 or arg(c, "tensors")[0] is not g:
        return None
    rank = len(shape_of(c))
    if arg(c, "dim", 0) not in (-1, rank - 1):
        return None
    rot, rest = _half(arg(r, "xs")[0]), _half(arg(c, "tensors")[1])
    if rot is None or rest is None or rot[0] is not rest[0]:
        return None
    x, d = rot[0], static_int(shape_of(rot[0])[-1])
    if d is None or rot[1] != 0 or not 0 < rot[2] < d or rot[2] % 2 or rest[1:] != (rot[2], d):
        return None
    if not dtype_of(x) == dtype_of(g) == dtype_of(c) or str(shape_of(c)) != str(shape_of(x)):
        return None
    return c, g, x, rot[2]


def rope_partial_supported(node, ctx):
    found = rope_folds(node, ctx, _partial_pass)
    return Match(found=found) if found else NO_MATCH


@rule(Stage.CONSUMER, ROPE, family="rope", supported=rope_partial_supported, priority=5,
      doc="cat([rope(x[..., :r]), x[..., r:]]) (partial rotary) -> flydsl.rope(x, rot_dim=r): one tensor, one launch")
def fold_partial_pass(node, ctx, m):
    for r, (c, g, x, rot) in m.found.items():
        old = arg(r, "xs")[0]
        set_args(r, xs=[x], rot_dim=rot)
        g.meta["val"] = val(c)
        r.meta["val"] = [val(c)]
        ctx.absorb(r, [c], anchor=c)  # the op now returns the cat's value: the stride contract compares with it
        g.meta["orig_name"] = captured_name(c)
        c.replace_all_uses_with(g)
        ctx.count("rope_partial_pass")
        ctx.erase_unused([c, arg(c, "tensors")[1], old])
    return node
