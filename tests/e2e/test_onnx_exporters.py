"""Every bundled model, exported by both torch.onnx exporters, converted on flysim (issue 32 item 4).

Each export is translated on flysim at small shapes (batch and sequence shrunk; widths as bundled)
and must verify against ONNX Runtime's run of the file; attention must become flydsl.attention
wherever the PyTorch path fuses it; nothing may stay in PyTorch but the by-design ops; every
FlyDSL op must have launched a kernel. The TorchScript exporter runs at opset 17 here and at
17-21 on the reference backend for the models with the most shape arithmetic; the slow variant
sweeps every model at every opset. The other scripts of issue 32 (tests/e2e/onnx_zoo.py: GPT-2
Conv1D block, T5 block, GEMM + logsumexp, MQA decode, HF BERT / Llama / ViT) are checked on the
reference backend: import, ONNX Runtime verdict, what stays in PyTorch.
"""

from __future__ import annotations

import functools
import logging
import sys
import warnings
from pathlib import Path

import pytest
import torch

import translator
from translator.tolerances import model_tol

sys.path.insert(0, str(Path(__file__).resolve().parent))
from onnx_zoo import ZOO, build  # noqa: E402

from bundled_models import MODELS, load_model  # noqa: E402

SMALL = {"seq_len": 8, "batch_size": 2}  # bert_layer masks row 1: two rows at least
BY_DESIGN = "kept in PyTorch by design"
BY_DESIGN_HF = {"aten.index"}  # HF's 2-index mask gather: the PyTorch path keeps it too


def load_small(name):
    model, mod = load_model(name, "_onnx_exp", **SMALL)
    return model, tuple(mod.get_inputs())


def export(model, inputs, path, exporter, opset=None):
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kw = {"opset_version": opset} if opset else {}
            torch.onnx.export(model, inputs, str(path), dynamo=exporter == "dynamo", verbose=False, **kw)
    finally:
        logging.disable(logging.NOTSET)
    return path


def families(tm) -> set:
    return {n.meta["flydsl"]["family"] for n in tm.gm.graph.nodes if "flydsl" in n.meta}


def kept(tm) -> list:
    return [(r.op, r.detail) for r in tm.report.rows if r.where == "pytorch" and not r.layout]


@functools.lru_cache(maxsize=None)
def pytorch_path_fuses_attention(name) -> bool:
    model, x = load_small(name)
    return "attention" in families(translator.translate(model, x, backend="reference", verify=False))


def check_export(model, x, path, backend, name):
    tm = translator.translate(path, x, backend=backend)
    v = tm.report.verification
    assert v.passed, f"{v.message}\n{v.divergence}"
    assert v.truth.startswith("ONNX Runtime"), v.truth
    assert all(why == BY_DESIGN for _, why in kept(tm)), kept(tm)
    if pytorch_path_fuses_attention(name):  # where the PyTorch path fuses attention, the ONNX path does too
        assert "attention" in families(tm), sorted(families(tm))
    if backend == "flysim":
        assert tm.last_launches and not tm.report.without_launch(), tm.report.without_launch()
    return tm


FLYSIM = [("vit_block", "dynamo")]  # attention, GEMMs, layer norm on flysim by default; all pairs with -m slow


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", MODELS)
def test_bundled_model_exports_convert(name, exporter, tmp_path):
    """Every bundled model and exporter: on flysim for FLYSIM (the other pairs run on flysim in the slow
    variant, 20-60 s each here), on the reference backend for the rest (the same import, graph and
    verdict; the kernels of each model run on flysim in test_models_flysim)."""
    model, x = load_small(name)
    path = export(model, x, tmp_path / f"{name}.onnx", exporter, 17 if exporter == "torchscript" else None)
    tm = check_export(model, x, path, "flysim" if (name, exporter) in FLYSIM else "reference", name)
    fresh = tuple(torch.randn_like(t) for t in x)
    with torch.no_grad():
        torch.testing.assert_close(tm(*fresh), model(*fresh), **model_tol())


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", MODELS)
def test_bundled_model_exports_convert_on_flysim(name, exporter, tmp_path):
    model, x = load_small(name)
    path = export(model, x, tmp_path / f"{name}.onnx", exporter, 17 if exporter == "torchscript" else None)
    check_export(model, x, path, "flysim", name)


@pytest.mark.parametrize("opset", [19, 21])
def test_torchscript_opsets_19_and_21(opset, tmp_path):
    model, x = load_small("llama_block")  # the most shape arithmetic and ops; opset 17 above, 18-21 slow
    check_export(model, x, export(model, x, tmp_path / "m.onnx", "torchscript", opset), "reference", "llama_block")


@pytest.mark.slow
@pytest.mark.parametrize("opset", [17, 18, 19, 20, 21])
@pytest.mark.parametrize("name", MODELS)
def test_every_bundled_model_at_every_opset(name, opset, tmp_path):
    model, x = load_small(name)
    check_export(model, x, export(model, x, tmp_path / "m.onnx", "torchscript", opset), "reference", name)


ZOO_CASES = [pytest.param(n, e, marks=[] if (e == "torchscript") != n.startswith("hf_") else [pytest.mark.slow])
             for n in sorted(ZOO) for e in ("torchscript", "dynamo")]  # scripts: the exporter; HF: dynamo


@pytest.mark.parametrize("name,exporter", ZOO_CASES)
def test_scripts_and_hf_families_export_and_verify(name, exporter, tmp_path):
    if name.startswith("hf_"):
        pytest.importorskip("transformers")
    model, x = build(name)
    path = export(model, x, tmp_path / f"{name}.onnx", exporter, 17 if exporter == "torchscript" else None)
    tm = translator.translate(path, x, backend="reference")
    v = tm.report.verification
    assert v.passed and v.truth.startswith("ONNX Runtime"), v.message
    left = {op for op, why in kept(tm) if why != BY_DESIGN}
    assert left <= BY_DESIGN_HF, kept(tm)


class TwoScales(torch.nn.Module):
    """Scaled operands of a score matmul that are not the exporters' SDPA form (two different scales)."""

    def forward(self, q, k, v):
        return torch.softmax((q * 0.5) @ (k.transpose(-1, -2) * 0.25), dim=-1) @ v


class Sdpa(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_exported_sdpa_is_imported_as_one_attention(exporter, tmp_path):
    from translator.adapters.onnx_import import import_onnx

    x = tuple(torch.randn(1, 2, 8, 16) for _ in range(3))
    mod, _ = import_onnx(export(Sdpa(), x, tmp_path / "sdpa.onnx", exporter, 17 if exporter == "torchscript" else None),
                         x)
    assert mod.fused_attention == 1 and [n.op_type for n in mod.nodes].count("SDPA") == 1
    tm = translator.translate(tmp_path / "sdpa.onnx", x, backend="reference")
    assert tm.report.verification.passed and "attention" in families(tm)
    other, _ = import_onnx(export(TwoScales(), x, tmp_path / "two.onnx", exporter, 17), x)
    assert other.fused_attention == 0
    assert translator.translate(tmp_path / "two.onnx", x, backend="reference").report.verification.passed
