"""The pass pipeline: one flat, ordered list of named passes.

Each pass takes a `LowerCtx` (translator.graph), rewrites `ctx.gm.graph` in place, keeps
`node.meta["val"]` correct, and returns how many rewrites it made. Per-pattern counters
accumulate in `ctx.counters` (tests assert them); reasons a node was not lowered go to
`ctx.reasons`. The rules the matching passes apply come from the registry, which
`translator.lowerings` fills on import.
"""

from __future__ import annotations

from functools import partial

from .. import lowerings  # noqa: F401  (importing the lowerings fills the registry)
from ..registry import Stage
from .casts import cast_round_trips
from .cleanup import cleanup, dead_code
from .fold_shapes import fold_shapes
from .functionalize import functionalize
from .fuse_consumers import fuse_consumers
from .match import match_stage
from .normalize import normalize
from .partition import fuse_regions
from .store_casts import embedding_out_casts, gemm_out_casts, region_out_casts
from .strides import fix_strides, record_strides

PIPELINE = [
    ("record_strides", record_strides),  # eager's layout of every value, before any rewrite
    ("normalize", normalize),  # one argument form for every aten call
    ("functionalize", functionalize),  # x += y as x = x + y, where nothing observes the mutation
    ("dead_code", dead_code),  # what nothing reads (a dead user must not block a pattern)
    ("decompose", partial(match_stage, stage=Stage.DECOMPOSE)),  # losses -> aten ops lowered below
    # hand-written forms first: they consume the nodes the canonical rules would take one by one
    ("match_patterns", partial(match_stage, stage=Stage.PATTERN)),
    ("match_canonical", partial(match_stage, stage=Stage.CANONICAL)),
    ("cast_round_trips", cast_round_trips),  # x.to(fp32).to(bf16) between lowered ops is x: no cast kernels
    ("partition", fuse_regions),  # elementwise regions -> generated kernels
    ("fuse_consumers", fuse_consumers),  # prologues, epilogues, residual adds into FlyDSL nodes
    ("cast_round_trips_folded", cast_round_trips),  # the same for the casts the folds added (norm residual)
    ("gemm_out_casts", gemm_out_casts),  # a cast kernel widening a gemm's output: the gemm stores fp32
    ("embedding_out_casts", embedding_out_casts),  # an embedding narrowed by a cast kernel: the gather stores bf16
    ("region_out_casts", region_out_casts),  # the same for a generated kernel's output read through views
    ("fix_strides", fix_strides),  # consumers of a FlyDSL op's layout fixed (view -> reshape, ...)
    ("fold_shapes", fold_shapes),  # what depends only on shapes and constants: once per input shape, cached
    ("cleanup", cleanup),
]


def run_pipeline(ctx) -> dict:
    """Run every pass in order; returns {pass name: rewrite count}."""
    counts = {}
    for name, fn in PIPELINE:
        counts[name] = fn(ctx)
        ctx.gm.graph.lint()
    ctx.gm.recompile()
    return counts
