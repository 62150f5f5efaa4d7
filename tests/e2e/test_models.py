"""The bundled models (models/*.py) through translate() on the reference backend.

For every model script: it runs in eager and exports, its translation verifies, the
translated module matches eager on fresh inputs, and the report's node table puts the
expected aten ops into the expected FlyDSL ops (or keeps them in PyTorch for the stated
reason). A new models/*.py must add its row to EXPECTED.

Parameters are perturbed before translating (norm weights away from 1, biases and
batch-norm statistics away from 0), as in a trained model, so that a lowering which
drops a weight or a bias cannot pass by accident.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

import translator
from translator.frontends import cli
from translator.verify import calibrate, verify_outputs

REPO = Path(__file__).resolve().parents[2]
MODEL_FILES = sorted(p for p in (REPO / "models").glob("*.py") if not p.name.startswith("_"))
BY_DESIGN = "kept in PyTorch by design"

# per model: aten op -> (where its nodes must go, how many there are).
#   "flydsl.<family>"  every such node runs inside that FlyDSL op
#   "flydsl"           every such node runs inside some FlyDSL op (the fusion may vary:
#                      hand-written attention becomes attention, or bmm + softmax)
#   BY_DESIGN          every such node stays in PyTorch with that reason
EXPECTED = {
    "mlp": {"aten.linear": ("flydsl.gemm", 3)},
    "mini_gpt": {
        "aten.linear": ("flydsl.gemm", 8),
        "aten.layer_norm": ("flydsl.layer_norm", 5),
        "aten.matmul": ("flydsl", 4),
        "aten.softmax": ("flydsl", 2),
    },
    "bert_layer": {
        "aten.linear": ("flydsl.gemm", 6),
        "aten.layer_norm": ("flydsl.layer_norm", 2),
        "aten.matmul": ("flydsl", 2),
        "aten.softmax": ("flydsl", 1),
    },
    "llama_block": {
        "aten.linear": ("flydsl", 7),  # q, k, v, o, down: flydsl.gemm; gate and up: one flydsl.gemm_gated
        "aten.scaled_dot_product_attention": ("flydsl.attention", 1),
        "aten.rsqrt": ("flydsl.rms_norm", 2),  # the hand-written LlamaRMSNorm
    },
    "vit_block": {
        "aten.linear": ("flydsl.gemm", 4),
        "aten.layer_norm": ("flydsl.layer_norm", 2),
        "aten.scaled_dot_product_attention": ("flydsl.attention", 1),
    },
    "gemm_scale_sigmoid_residual": {  # one GEMM with the whole chain in its epilogue
        "aten.linear": ("flydsl.gemm", 1),
        "aten.mul": ("flydsl.gemm", 1),
        "aten.sigmoid": ("flydsl.gemm", 1),
        "aten.add": ("flydsl.gemm", 1),
    },
    "gemm_gelu_clamp": {
        "aten.linear": ("flydsl.gemm", 1),
        "aten.gelu": ("flydsl.gemm", 1),
        "aten.clamp": ("flydsl.gemm", 1),
    },
    "small_cnn": {
        "aten.linear": ("flydsl.gemm", 2),
        "aten.conv2d": (BY_DESIGN, 2),
        "aten.batch_norm": (BY_DESIGN, 2),
        "aten.max_pool2d": (BY_DESIGN, 2),
        "aten.adaptive_avg_pool2d": (BY_DESIGN, 1),
    },
}

IDS = [p.stem for p in MODEL_FILES]


def load(path: Path):
    """Model and inputs exactly as `flydsl-translate convert` builds them."""
    with cli.loaded_script(path) as module:
        model, inputs = cli.build_model(module, path)
        get_inputs = module.get_inputs
    return model, inputs, get_inputs


def like_trained(model: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:  # norm weights and biases, linear / conv biases
                p.add_(0.1 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
            elif name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)


_CACHE: dict = {}


def translated(path: Path):
    if path not in _CACHE:
        model, inputs, get_inputs = load(path)
        like_trained(model)
        tm = translator.translate(model, inputs, backend="reference", name=path.stem)
        _CACHE[path] = (model, get_inputs, tm)
    return _CACHE[path]


def test_every_model_has_expectations():
    assert MODEL_FILES, "no models/*.py found"
    assert sorted(IDS) == sorted(EXPECTED)


@pytest.mark.parametrize("path", MODEL_FILES, ids=IDS)
def test_model_is_deterministic_and_exports(path):
    model, inputs, _ = load(path)
    again, inputs_again, _ = load(path)
    assert all(torch.equal(a, b) for a, b in zip(inputs, inputs_again))
    with torch.no_grad():
        out = model(*inputs)
        assert torch.equal(out, again(*inputs))
    assert torch.isfinite(out).all()
    ep = torch.export.export(model.eval(), tuple(inputs))
    assert any(n.op == "call_function" for n in ep.graph.nodes)


@pytest.mark.parametrize("path", MODEL_FILES, ids=IDS)
def test_translation_verifies_and_matches_eager(path):
    model, get_inputs, tm = translated(path)
    v = tm.report.verification
    assert v.ran and v.passed, v.message
    torch.manual_seed(7)
    fresh = get_inputs()
    with torch.no_grad():
        expected = model(*fresh)
        got = tm(*fresh)
    check = verify_outputs(expected, got, "fp32", calibrate(model, tuple(fresh), expected)[0])  # translate()'s bound
    assert check.passed, check.message


@pytest.mark.parametrize("path", MODEL_FILES, ids=IDS)
def test_report_accounts_for_expected_ops(path):
    _, _, tm = translated(path)
    rows = tm.report.rows
    for op, (target, count) in EXPECTED[path.stem].items():
        mine = [r for r in rows if r.op == op]
        assert len(mine) == count, f"{op}: {len(mine)} nodes in the report, expected {count}"
        for r in mine:
            family = r.detail.split()[0] if r.where != "pytorch" else None
            if target == BY_DESIGN:
                assert r.where == "pytorch" and r.detail == BY_DESIGN, f"{r.node}: {r.where}, {r.detail}"
            elif target == "flydsl":
                assert family and family.startswith("flydsl."), f"{r.node} ({op}) runs in PyTorch: {r.detail}"
            else:
                assert family == target, f"{r.node} ({op}) should run in {target}, runs in {r.where}: {r.detail}"


@pytest.mark.parametrize("path", MODEL_FILES, ids=IDS)
def test_every_pytorch_node_says_why(path):
    _, _, tm = translated(path)
    counts = Counter()
    for r in tm.report.rows:
        counts[r.where] += 1
        if r.where == "pytorch":
            assert r.detail.strip() and r.detail.strip().lower() != "unsupported", (r.node, r.op, r.detail)
    assert set(counts) <= {"flydsl-kernel", "flydsl-reference", "pytorch", "folded", "removed"}
    # the reference backend is never reported as a FlyDSL kernel
    assert counts["flydsl-kernel"] == 0 and tm.report.backend == "reference"
    assert tm.report.summary()["flydsl_flop_share"] > 0
