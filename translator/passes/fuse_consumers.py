"""Fuse consumers: fold into each FlyDSL node what feeds it or follows it, by the registry's
CONSUMER rules.

One mechanism for every fold: the elementwise region read only by a reduction or a scan joins
its program, the region that alone reads a reduction's result becomes its epilogue
(translator/lowerings/fold.py), the part of the region after a GEMM that is computed from the
GEMM's value alone becomes its epilogue (gemm_epilogue.py: scale, bias, program, residual), and a
residual add also used later joins the norm that reads it (norm_residual.py). The regions are the
partition pass's; the per-element program they carry is the one language of all these kernels
(translator_kernels.program), so what one folds another can. Nodes are visited in graph order
and each node is offered to the rules again after a fold, so a reduction takes in both its
prologue and its epilogue. The partition pass leaves the nodes these rules claim (the norm's
residual add) out of regions. A fold may make a node read a value defined after it, so the graph
is then re-sorted (stable).

A FlyDSL node folded whole into another no longer launches a kernel of its own, though the
rewrite that made it was counted (`fused_elementwise` counts every region partition made): the
pass counts such nodes per family as `absorbed_<family>`, so the report can say how many of a
family's rewrites ended inside another family's kernel (the report's kernel counts come from the
final graph and the recorded launches).
"""

from __future__ import annotations

from collections import Counter

from ..graph import stable_toposort
from ..registry import Stage
from .match import match_stage


def fuse_consumers(ctx) -> int:
    before = _families(ctx.gm.graph)
    count = match_stage(ctx, Stage.CONSUMER, repeat=True)
    if count:
        stable_toposort(ctx.gm.graph)
    for family, n in (before - _families(ctx.gm.graph)).items():
        ctx.count(f"absorbed_{family}", n)
    return count


def _families(graph) -> Counter:
    return Counter(n.meta["flydsl"]["family"] for n in graph.nodes if "flydsl" in n.meta)
