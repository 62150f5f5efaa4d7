"""translate(): options, bad input, strictness, verification and its fallback, dynamic shapes,
the user's model left untouched, report renderers."""

from __future__ import annotations

import json

import pytest
import torch
from translator.tolerances import model_tol
import torch.nn as nn
import torch.nn.functional as F

import translator
from translator import InputError, ShapeError, StrictError, translate
from translator.registry import FAMILIES

import small_models  # noqa: E402


class Block(small_models.Block):
    """The shared block with a dropout (a no-op in eval) before fc2 and its output sorted."""

    def __init__(self, d=32):
        super().__init__(d)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        h = self.drop(F.gelu(self.fc1(x)))
        return torch.sort(torch.softmax(self.ln(x + self.fc2(h)), -1), -1).values


@pytest.fixture
def block():
    torch.manual_seed(0)
    return Block()


def test_report_and_backend_choice(block):
    x = torch.randn(2, 8, 32)
    tm = translate(block.eval(), (x,), backend="reference")
    r = tm.report
    assert r.backend == "reference" and r.backend_reason == "requested"
    assert r.verification.passed
    s = r.summary()
    assert s["flydsl_ops"] == {"flydsl.gemm": 2, "flydsl.layer_norm": 1, "flydsl.softmax": 1}
    assert r.counters["epilogue_activation"] == 1 and r.counters["epilogue_residual"] == 1
    assert 0.95 < s["flydsl_flop_share"] < 1  # the sort left in PyTorch costs n log2 n compares
    d = json.loads(r.to_json())
    assert d["summary"]["compute_nodes"] == s["compute_nodes"] and d["rows"]
    md = r.to_markdown()
    assert "| fc1" not in md and "flydsl.gemm [linear]" in md
    srt = [row for row in r.rows if row.op == "aten.sort"][0]
    assert srt.where == "pytorch" and srt.detail == "no FlyDSL lowering for aten.sort yet"
    assert "torch.ops.flydsl.gemm.default" in tm.code


def test_auto_backend_says_why(block):
    tm = translate(block.eval(), (torch.randn(2, 8, 32),))
    assert tm.report.backend in ("flysim", "reference", "rocm")
    assert tm.report.backend_reason.startswith("auto:")


def test_training_model_is_captured_in_eval_and_left_as_given(block):
    block.train()
    before = {k: v.clone() for k, v in block.state_dict().items()}
    x = torch.randn(2, 8, 32)
    x0 = x.clone()
    tm = translate(block, (x,), backend="reference")
    assert block.training and all(m.training for m in block.modules())
    assert all(torch.equal(before[k], v) for k, v in block.state_dict().items())
    assert torch.equal(x, x0)
    assert tm.report.verification.passed  # dropout captured in eval mode
    assert sum(1 for _ in block.parameters()) == 6  # nothing deleted from the user's model


def test_dynamic_batch_and_sequence(block):
    tm = translate(block.eval(), (torch.randn(2, 8, 32),), backend="reference")
    for shape in [(1, 8, 32), (3, 17, 32)]:
        x = torch.randn(shape)
        torch.testing.assert_close(tm(x), block(x), **model_tol(check="few_ops"))
    with pytest.raises(ShapeError, match="input 0 dim 2 is 31"):
        tm(torch.randn(2, 8, 31))


def test_precision_bf16_casts_around_flydsl_ops(block):
    x = torch.randn(2, 8, 32)
    tm = translate(block.eval(), (x,), backend="reference", precision="bf16")
    assert tm.report.verification.passed, tm.report.verification.message
    ws = [b for n, b in tm.gm.named_buffers() if n.startswith("_flydsl_w")]
    assert ws and all(w.dtype == torch.bfloat16 for w in ws)
    assert tm(x).dtype == torch.float32


def test_strict_raises_when_ops_stay_in_pytorch(block):
    with pytest.raises(StrictError, match="sort"):
        translate(block.eval(), (torch.randn(2, 8, 32),), backend="reference", strict=True)


@pytest.mark.parametrize("kwargs,match", [
    (dict(arch="gfx90a"), "arch 'gfx90a' is not supported"),
    (dict(backend="cuda"), "backend 'cuda' is not one of"),
    (dict(precision="int4"), "precision 'int4' is not one of"),
])
def test_bad_options(block, kwargs, match):
    with pytest.raises(InputError, match=match):
        translate(block, (torch.randn(2, 8, 32),), **kwargs)


def test_bad_model_and_inputs(block):
    with pytest.raises(InputError, match="must be a torch.nn.Module"):
        translate(lambda x: x, (torch.randn(2),))
    with pytest.raises(InputError, match="tuple or list of tensors"):
        translate(block, {"x": torch.randn(2, 8, 32)})
    with pytest.raises(InputError, match="failed on the example inputs"):
        translate(block, (torch.randn(2, 8, 31),))


def test_rocm_backend_without_gpu_is_a_clear_error(block):
    if translator.runtime.rocm_gpu_present():
        pytest.skip("a ROCm GPU is present: backend='rocm' is valid here")
    with pytest.raises(InputError, match="needs an AMD GPU"):
        translate(block, (torch.randn(2, 8, 32),), backend="rocm")


@pytest.fixture
def broken_layer_norm(monkeypatch):
    """Make flydsl.layer_norm's reference wrong, standing in for a miscompiled kernel."""
    fam = FAMILIES["layer_norm"]
    good = fam.reference
    monkeypatch.setattr(fam, "reference", lambda *a: good(*a) * 2.0 + 0.5)


def test_mismatch_names_first_diverging_node(block, broken_layer_norm):
    tm = translate(block.eval(), (torch.randn(2, 8, 32),), backend="reference")
    v = tm.report.verification
    assert v.passed is False
    assert v.divergence.op == "flydsl.layer_norm" and v.divergence.replaces == "layer_norm"
    assert v.divergence.max_abs > 0.5
    assert "first diverging FlyDSL node" in tm.report.to_markdown()


def test_fallback_on_mismatch_returns_node_to_pytorch(block, broken_layer_norm):
    tm = translate(block.eval(), (torch.randn(2, 8, 32),), backend="reference", fallback_on_mismatch=True)
    v = tm.report.verification
    assert v.passed and len(v.fallbacks) == 1 and v.fallbacks[0]["op"] == "flydsl.layer_norm"
    row = [r for r in tm.report.rows if r.op == "aten.layer_norm"][0]
    assert row.where == "pytorch" and "verification mismatch" in row.detail
    assert "layer_norm" not in [n.target._opname for n in tm.gm.graph.nodes
                                if getattr(n.target, "namespace", "") == "flydsl"]


def test_a_crashing_support_check_leaves_the_op_in_pytorch(block, monkeypatch):
    from translator.registry import RULES

    rule = next(r for r in RULES if r.name == "layer_norm")

    def boom(node, ctx):
        raise IndexError("tuple index out of range")

    monkeypatch.setattr(rule, "supported", boom)
    tm = translate(block.eval(), (torch.randn(2, 8, 32),), backend="reference")
    row = [r for r in tm.report.rows if r.op == "aten.layer_norm"][0]
    assert row.where == "pytorch" and "support check raised IndexError" in row.detail
    assert tm.report.summary()["flydsl_ops"]["flydsl.gemm"] == 2 and tm.report.verification.passed
