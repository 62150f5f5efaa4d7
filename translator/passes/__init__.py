"""The pass pipeline: one flat, ordered list of named passes.

Each pass takes a `LowerCtx`, rewrites `ctx.gm.graph` in place, keeps `node.meta["val"]`
correct, and returns how many rewrites it made. Per-pattern counters accumulate in
`ctx.counters` (tests assert them); reasons a node was not lowered go to `ctx.reasons`.
"""

from __future__ import annotations

from .cleanup import cleanup
from .fold_shapes import fold_shapes
from .functionalize import functionalize
from .lower import lower_stage
from .partition import fuse_elementwise, fuse_reduce_prologue

PIPELINE = [
    ("functionalize", functionalize),  # x += y as x = x + y, where nothing observes the mutation
    # hand-written forms are matched first (they consume the nodes the canonical rules would take)
    ("fuse_patterns", lambda ctx: lower_stage(ctx, "fuse")),
    ("lower_canonical", lambda ctx: lower_stage(ctx, "lower")),
    ("fuse_elementwise", fuse_elementwise),  # elementwise regions -> generated kernels
    ("fuse_reduce_prologue", fuse_reduce_prologue),  # a region read only by a reduction joins its kernel
    ("fuse_epilogues", lambda ctx: lower_stage(ctx, "epilogue")),
    ("fold_shapes", fold_shapes),  # what depends only on shapes and constants: once per input shape, cached
    ("cleanup", cleanup),
]


def run_pipeline(ctx) -> dict:
    """Run every pass in order; returns {pass name: rewrite count}."""
    from ..registry import load_all

    load_all()
    counts = {}
    for name, fn in PIPELINE:
        counts[name] = fn(ctx)
        ctx.gm.graph.lint()
    ctx.gm.recompile()
    return counts
