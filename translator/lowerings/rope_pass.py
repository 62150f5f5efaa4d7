"""An empty pass-through part after RoPE dropped: `cat([rotated, x[..., D:]], -1)` with nothing past D is `rotated`.

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
once. A non-empty pass-through part (GPT-NeoX's 0.25) stays a `cat`. Counter `rope_empty_pass`.
"""

from __future__ import annotations

import operator

import torch

from ..graph import aten, arg, getitem_of, shape_of, static_int
from ..registry import NO_MATCH, Match, Stage, rule
from .rope_cache import ROPE


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
