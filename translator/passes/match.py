"""The matching pass: apply the registry's rules of one stage, node by node in graph order.

For each node a rule looks at: a node the user (or verification's fallback) pinned to PyTorch
stays; else the rules run by priority (translator.registry.rules_for). A rule's support check
reads fake-tensor metadata and answers supported (rewrite, next node), a reason (the report
quotes it on the node and on the other nodes of the form a `Reason` names; the next rule may still
take the node) or no match (not this form: nothing to say). The rewrite receives the check's match.
A support check that raises is a translator bug: the node stays in PyTorch with that stated as
its reason, and the rest of the model is still translated.
"""

from __future__ import annotations

import logging

from ..graph import captured_name, erased
from ..registry import Stage, check, report_line, rules_for

log = logging.getLogger(__name__)


def match_stage(ctx, stage: Stage, repeat: bool = False) -> int:
    """Apply `stage`'s rules; returns the number of rewrites. repeat: after a rewrite, try the
    same node again (a consumer may take in what feeds it and what follows it)."""
    rules = rules_for(stage)
    if not rules:
        return 0
    count = 0
    for node in list(ctx.gm.graph.nodes):
        for _ in range(16 if repeat else 1):  # a consumer folds at most a few neighbours
            if node.op != "call_function" or node.graph is not ctx.gm.graph or erased(node):
                break
            if not _apply_first(ctx, node, rules):
                break
            count += 1
    return count


def _apply_first(ctx, node, rules) -> bool:
    for r in rules:
        if node.target not in r.targets:
            continue
        if captured_name(node) in ctx.deny:
            ctx.not_lowered(node, ctx.deny[captured_name(node)])
            return False
        try:
            verdict = check(r, node, ctx)
        except Exception as e:  # noqa: BLE001 — one broken pattern must not sink the whole model
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            reason = f"its support check raised {type(e).__name__}: {msg} (a translator bug; the op stays in PyTorch)"
            log.warning("rule %s on %s: %s", r.name, node.name, reason)
            ctx.not_lowered(node, f"{r.name}: {reason}")
            continue
        if not verdict.matched:
            continue
        if not verdict.supported:
            for n in (node, *getattr(verdict.reason, "also", ())):
                ctx.not_lowered(n, report_line(r, verdict.reason))
            continue
        r.apply(node, ctx, verdict)
        return True
    return False
