"""End to end on flysim: every bundled model translates with its FlyDSL ops on our FlyDSL
kernels (executed by flysim, CPU) and verifies against eager PyTorch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from translator import translate

MODELS = sorted(p for p in (Path(__file__).resolve().parent.parent / "models").glob("*.py") if p.stem != "__init__")


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
