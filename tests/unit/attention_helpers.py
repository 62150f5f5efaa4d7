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
