"""flydsl-translator: make a PyTorch model's hot ops run as FlyDSL kernels on AMD Instinct GPUs.

    import translator
    tm = translator.translate(model, (x,), arch="gfx942", backend="auto")
    y = tm(x); print(tm.report.headline())

The API names are imported on first use (PEP 562 `__getattr__`): `import translator` alone does
not import torch, so `flydsl-translate --version` and `--help` start in a fraction of a second
instead of ~5 s. `torch.compile(backend="flydsl")` finds the backend through the installed entry
point (pyproject's torch_dynamo_backends); the first API name read also imports compile_backend,
which registers the backend where no entry point is installed.
"""

import importlib

from .errors import (BackendError, CaptureError, DeviceError, DtypeError, EmptyInputError, GradError,  # noqa: F401
                     InputError, InternalError, ShapeError, StrictError, TranslatorError)
from .version import __version__  # noqa: F401

_LAZY = {"translate": ".api", "TranslatedModule": ".translated", "save": ".frontends.serialize",
         "load": ".frontends.serialize", "export_kernels": ".report.export",
         "compile_reports": ".frontends.compile_backend", "translate_for_generation": ".frontends.generation"}


def __getattr__(name):
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    importlib.import_module(".frontends.compile_backend", __name__)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["translate", "TranslatedModule", "save", "load", "export_kernels", "compile_reports", "translate_for_generation",
           "TranslatorError",
           "InputError", "CaptureError", "StrictError", "ShapeError", "BackendError", "DtypeError", "DeviceError", "EmptyInputError",
           "GradError", "InternalError"]
