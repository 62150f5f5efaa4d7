"""Fuse consumers: fold into each FlyDSL node what feeds it or follows it, by the registry's
CONSUMER rules.

One mechanism for every fold: the elementwise region read only by a reduction or a scan joins
its program, the region that alone reads a reduction's result becomes its epilogue
(translator/lowerings/fold.py), the chain after a GEMM becomes its epilogue (gemm_epilogue.py),
and a residual add also used later joins the norm that reads it (norm_residual.py). Nodes are
visited in graph order and each node is offered to the rules again after a fold, so a reduction
takes in both its prologue and its epilogue, and a GEMM (visited before the norm that reads its
sum) takes a residual add before the norm could. The partition pass leaves the nodes these rules
claim out of regions. A fold may make a node read a value defined after it, so the graph is then
re-sorted (stable).
"""

from __future__ import annotations

from ..graph import stable_toposort
from ..registry import Stage
from .match import match_stage


def fuse_consumers(ctx) -> int:
    count = match_stage(ctx, Stage.CONSUMER, repeat=True)
    if count:
        stable_toposort(ctx.gm.graph)
    return count
