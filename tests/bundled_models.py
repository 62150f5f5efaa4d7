"""The bundled example models (models/*.py, the ones without a leading underscore) as the tests
load them: each file's `Model(*get_init_inputs())` in eval mode, built after
seeding torch with 0, and the module for its `get_inputs`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
MODELS = sorted(p.stem for p in (REPO / "models").glob("*.py") if not p.name.startswith("_"))


def load_module(name, prefix="_e2e_model"):
    """models/<name>.py imported as the module `<prefix>_<name>` (each prefix its own copy)."""
    spec = importlib.util.spec_from_file_location(f"{prefix}_{name}", REPO / "models" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_model(name, prefix="_e2e_model", **module_values):
    """(model, module) of models/<name>.py; `module_values` set the module's globals of those
    names (sizes such as seq_len) before the model is built, where the module has them."""
    mod = load_module(name, prefix)
    for k, v in module_values.items():
        if hasattr(mod, k):
            setattr(mod, k, v)
    torch.manual_seed(0)
    return mod.Model(*mod.get_init_inputs()).eval(), mod
