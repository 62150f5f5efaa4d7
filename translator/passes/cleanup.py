"""Cleanup: drop dead nodes and the parameters no node reads any more (e.g. a weight
whose preshuffled copy replaced it), so the translated module holds each weight once."""

from __future__ import annotations


def dead_code(ctx) -> int:
    """Drop nodes nothing reads (before matching: a dead user, such as nn.MultiheadAttention's
    head-averaged weights when the model drops them, would otherwise pin what it reads)."""
    g = ctx.gm.graph
    before = len(g.nodes)
    g.eliminate_dead_code(is_impure_node=lambda n: n.op == "call_module" or n.is_impure())
    return before - len(g.nodes)


def cleanup(ctx) -> int:
    g = ctx.gm.graph
    before = len(g.nodes)
    dead_code(ctx)
    used = {n.target for n in g.nodes if n.op == "get_attr"}
    # a call_module node reads every parameter of its module without a get_attr node
    called = tuple(n.target + "." for n in g.nodes if n.op == "call_module")
    removed = 0
    for name, _ in list(ctx.gm.named_parameters()) + list(ctx.gm.named_buffers()):
        if name not in used and not name.startswith(called) and _delete(ctx.gm, name):
            removed += 1
    return before - len(g.nodes) + removed


def _delete(gm, qualname) -> bool:
    *path, leaf = qualname.split(".")
    mod = gm
    for p in path:
        mod = getattr(mod, p, None)
        if mod is None:
            return False
    if leaf in getattr(mod, "_parameters", {}):
        del mod._parameters[leaf]
        return True
    if leaf in getattr(mod, "_buffers", {}):
        del mod._buffers[leaf]
        return True
    return False
