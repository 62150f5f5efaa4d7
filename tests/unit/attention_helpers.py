"""Shared by the attention pattern tests (test_attention_patterns, test_attention_forms): translate
a hand-written attention, check the rewrite fired and left none of the chain behind, compare with
eager, and, on flysim, that the attention kernel launched."""

from __future__ import annotations

import torch

from translator import translate
from translator.tolerances import model_tol
from translator_kernels import launch as kl


def ops(tm):
    return [n.target._opname for n in tm.gm.graph.nodes if getattr(n.target, "namespace", "") == "flydsl"]


def attention_node(tm):
    (n,) = [n for n in tm.gm.graph.nodes if getattr(n.target, "namespace", "") == "flydsl"
            and n.target._opname == "attention"]
    return n


def run_attention(model, inputs, backend="reference", chain_ops=("softmax", "bmm")):
    """(translated module, kernel uses of its call): the pattern fired once (the
    attention_handwritten counter), no `chain_ops` FlyDSL op is left besides the attention, and
    the output matches eager."""
    model = model.eval()
    tm = translate(model, inputs, backend=backend)
    assert tm.report.counters.get("attention_handwritten") == 1, tm.report.counters
    left = [op for op in ops(tm) if op in chain_ops]
    assert not left, (left, tm.code)
    assert tm.report.verification.passed, tm.report.verification.message
    with torch.no_grad(), kl.collect() as (uses, _):
        got = tm(*inputs)
    torch.testing.assert_close(got, model(*inputs), **model_tol("fp32", "few_ops"))
    if backend == "flysim":
        assert any("attention" in str(getattr(x, "kernel", x)) for x in tm.last_launches), tm.last_launches
        assert not tm.report.without_launch(), tm.report.without_launch()
    return tm, uses


# ---- enumerating the attention chains of a captured graph (the no-silent-miss tests) -------------
aten = torch.ops.aten
PRODUCTS = {aten.matmul.default, aten.bmm.default, aten.einsum.default, aten.baddbmm.default}
SOFTMAX = {aten.softmax.int, aten._softmax.default}


def near(n, step, hops, want) -> bool:
    """A node x != n within `hops` steps of n (step: a node's neighbours one way) with want(x)."""
    todo, seen = [(n, 0)], set()
    while todo:
        x, d = todo.pop(0)
        if x in seen:
            continue
        seen.add(x)
        if d and want(x):
            return True
        if d < hops:
            todo += [(y, d + 1) for y in step(x)]
    return False


def _left_operand_of_product(user, n) -> bool:
    if user.target in (aten.matmul.default, aten.bmm.default):
        return user.args[0] is n
    return user.target is aten.einsum.default and user.args[1][0] is n


def _downstream(n, hops):
    seen, todo = [], [(n, 0)]
    while todo:
        x, d = todo.pop(0)
        if d < hops:
            for u in x.users:
                if u not in seen:
                    seen.append(u)
                    todo.append((u, d + 1))
    return seen


def _reaches_product(n, either_operand) -> bool:
    if either_operand:  # any product within 5 ops downstream, the probabilities on either side
        return near(n, lambda x: list(x.users), 5, lambda x: x.target in PRODUCTS)
    return any(near(n, lambda x: list(x.users), 4, lambda x, p=p: _left_operand_of_product(x, p))
               for p in [n, *_downstream(n, 4)])


def attention_chains(gm, either_operand=False) -> list[str]:
    """Captured node names of the chains in gm: the SDPA node, or the chain's softmax (a last-dim
    softmax with a product a few ops upstream whose result reaches the left operand of a product a
    few ops downstream; either operand with `either_operand`)."""
    out = []
    for n in gm.graph.nodes:
        if n.target is aten.scaled_dot_product_attention.default:
            out.append(n.name)
        elif n.target in SOFTMAX and n.args[1] % n.meta["val"].dim() == n.meta["val"].dim() - 1:
            up = near(n, lambda x: x.all_input_nodes, 8, lambda x: x.target in PRODUCTS)
            if up and _reaches_product(n, either_operand):
                out.append(n.name)
    return out


def translate_and_enumerate(model, inputs, monkeypatch, either_operand=False, backend="reference", **kw):
    """(translated module, attention_chains of the captured graph the translation started from)."""
    import translator.api

    found = []
    run = translator.api.run_pipeline

    def spy(ctx):
        found.extend(attention_chains(ctx.gm, either_operand))  # the captured graph, before any pass
        return run(ctx)

    monkeypatch.setattr(translator.api, "run_pipeline", spy)
    return translate(model.eval(), inputs, backend=backend, **kw), found


def fused_or_reasoned(tm, names):
    """(names that became flydsl.attention, {name: reason} of the others); a chain that did
    neither (no "not taken by attention: <reason>" on its row) fails as a silent miss."""
    rows = {r.node: r for r in tm.report.rows}
    taken, reasons = [], {}
    for name in names:
        r = rows[name]
        if r.where != "pytorch" and r.detail.startswith("flydsl.attention"):
            taken.append(name)
        else:
            assert "not taken by attention: " in r.detail, f"{name}: silent miss ({r.where}: {r.detail})"
            reasons[name] = r.detail.split("not taken by attention: ", 1)[1]
    return taken, reasons
