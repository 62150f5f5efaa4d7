"""One exception hierarchy. Every message states what was wrong and how to fix it.

A verification mismatch is a result, not an error: `report.verification` says which FlyDSL node
diverges first, the translated module stays available to inspect (or to translate again with
fallback_on_mismatch=True), and the CLI exits 1 from it."""

from __future__ import annotations

from translator_kernels.errors import KernelCacheError


class TranslatorError(Exception):
    """Base of every error the translator raises on purpose."""


class InputError(TranslatorError, ValueError):
    """The model, its inputs or an option given by the user cannot be used as given."""


class CaptureError(TranslatorError):
    """Neither torch.export nor torch.fx.symbolic_trace could capture the model."""


class StrictError(TranslatorError):
    """strict=True and some ops would stay in PyTorch."""


class ShapeError(TranslatorError, ValueError):
    """A call's input shapes cannot be served by the translated module."""


class BackendError(TranslatorError, RuntimeError):
    """The requested execution backend is not usable here (no GPU, no kernel, no flysim)."""


class DtypeError(TranslatorError, TypeError):
    """A call's input dtype differs from the dtype the model was translated for."""


class EmptyInputError(InputError):
    """An example input has a size-0 dim: kernels cannot be chosen or checked on no data."""


class DeviceError(InputError):
    """An input lives on a device the translator cannot compute on (the meta device)."""


class InternalError(TranslatorError, RuntimeError):
    """A translator bug surfaced while lowering a model: the message names the pass and the cause."""


class GradError(InputError):
    """A translated module was called with an input that requires grad: translation is for inference."""


class CacheDirError(TranslatorError, KernelCacheError):
    """The kernel cache folder cannot be created or written (a file in the way, no permission, a full disk)."""


KernelCacheError.raised_as = CacheDirError  # the kernel library raises this one (it cannot import translator)
