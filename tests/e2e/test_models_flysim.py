"""End to end on flysim: every bundled model translates with its FlyDSL ops on our FlyDSL
kernels (executed by flysim, CPU) and verifies against eager PyTorch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from translator import translate

MODELS = sorted(p for p in (Path(__file__).resolve().parents[2] / "models").glob("*.py") if p.stem != "__init__")


def load(path):
    spec = importlib.util.spec_from_file_location(f"_model_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("path", MODELS, ids=[p.stem for p in MODELS])
def test_model_verifies_on_flysim(path):
    mod = load(path)
    torch.manual_seed(0)
    model = mod.Model(*mod.get_init_inputs()).eval()
    inputs = mod.get_inputs()
    tm = translate(model, inputs, backend="flysim", name=path.stem)
    r = tm.report
    assert r.backend == "flysim"
    assert r.verification.passed, f"{r.verification.message}\n{r.verification.divergence}"
    fly = [row for row in r.rows if row.where.startswith("flydsl")]
    assert fly, "no op was lowered to a FlyDSL op"
    assert all(row.where == "flydsl-kernel" for row in fly), [row.detail for row in fly if row.where != "flydsl-kernel"]
    assert tm.last_launches, "flysim recorded no kernel launch"


@pytest.mark.parametrize("stem,precision", [("mlp", "bf16"), ("mlp", "fp16"), ("mini_gpt", "bf16")])
def test_precision_policy_on_flysim(stem, precision):
    """An fp32 model under precision=bf16/fp16: weights cast once, FlyDSL ops run in that dtype on
    the MFMA kernels, outputs come back in fp32 and match eager within the model tolerance."""
    mod = load(next(p for p in MODELS if p.stem == stem))
    torch.manual_seed(0)
    model = mod.Model(*mod.get_init_inputs()).eval()
    inputs = mod.get_inputs()
    tm = translate(model, inputs, backend="flysim", precision=precision)
    assert tm.report.verification.passed, tm.report.verification.message
    low = {torch.bfloat16: "bf16", torch.float16: "fp16"}
    ws = [b for n, b in tm.gm.named_buffers() if n.startswith("_flydsl_w")]
    assert ws and {low[w.dtype] for w in ws} == {precision}
    assert tm(*inputs).dtype == torch.float32
    assert tm.last_launches and not tm.report.without_launch(), tm.report.without_launch()  # kernels ran
