"""One exception hierarchy. Every message states what was wrong and how to fix it."""

from __future__ import annotations


class TranslatorError(Exception):
    """Base of every error the translator raises on purpose."""


class InputError(TranslatorError, ValueError):
    """The model, its inputs or an option given by the user cannot be used as given."""


class CaptureError(TranslatorError):
    """Neither torch.export nor torch.fx.symbolic_trace could capture the model."""


class StrictError(TranslatorError):
    """strict=True and some ops would stay in PyTorch."""


class VerificationError(TranslatorError):
    """The translated model's outputs do not match eager PyTorch."""


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
