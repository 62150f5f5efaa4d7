"""The generic lowering pass: apply every registered lowering of one stage.

For each node whose target a lowering inspects: a node the user (or verification's
fallback) pinned to PyTorch stays; else the lowering's support check runs on fake-tensor
metadata; None means rewrite, a string is the reason the report quotes, and False means
"not this pattern" (a fusion pattern that does not apply says nothing). A support check that
raises is a translator bug: the node stays in PyTorch with that stated as its reason, and the
rest of the model is still translated.
"""

from __future__ import annotations

import logging

import torch

from ..registry import lowerings_for

log = logging.getLogger(__name__)


def lower_stage(ctx, stage: str) -> int:
    rules = lowerings_for(stage)
    if not rules:
        return 0
    count = 0
    for node in list(ctx.gm.graph.nodes):
        if node.op != "call_function" or node.graph is not ctx.gm.graph or _erased(node):
            continue
        for rule in rules:
            if node.target not in rule.targets:
                continue
            name = node.meta.get("orig_name", node.name)
            if name in ctx.deny:
                ctx.not_lowered(node, ctx.deny[name])
                break
            try:
                reason = rule.supported(node, ctx)
            except Exception as e:  # noqa: BLE001 — one broken pattern must not sink the whole model
                msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
                reason = f"its support check raised {type(e).__name__}: {msg} (a translator bug; the op stays in PyTorch)"
                log.warning("lowering %s on %s: %s", rule.name, node.name, reason)
            if reason is False:  # not this pattern at all: nothing to report
                continue
            if reason:
                ctx.not_lowered(node, f"{rule.name}: {reason}")
                continue
            rule.rewrite(node, ctx)
            count += 1
            break
    return count


def _erased(node: torch.fx.Node) -> bool:
    return getattr(node, "_erased", False)
