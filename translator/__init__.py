"""flydsl-translator: make a PyTorch model's hot ops run as FlyDSL kernels on AMD Instinct GPUs.

    import translator
    tm = translator.translate(model, (x,), arch="gfx942", backend="auto")
    y = tm(x); print(tm.report.headline())
"""

from .errors import (BackendError, CaptureError, DeviceError, DtypeError, EmptyInputError, InputError,  # noqa: F401
                     ShapeError, StrictError, TranslatorError)
from .api import TranslatedModule, translate  # noqa: F401
from .frontends.serialize import load, save  # noqa: F401
from .report.export import export_kernels  # noqa: F401
from .frontends import compile_backend  # noqa: F401,E402  (registers torch.compile(backend="flydsl"))
from .version import __version__  # noqa: F401

__all__ = ["translate", "TranslatedModule", "save", "load", "export_kernels", "TranslatorError", "InputError",
           "CaptureError", "StrictError", "ShapeError", "BackendError", "DtypeError", "DeviceError", "EmptyInputError"]
