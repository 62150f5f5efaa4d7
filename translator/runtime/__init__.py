"""Execution backends for the flydsl custom ops, chosen at run time.

The translated graph calls `torch.ops.flydsl.<op>`; what that call executes is decided
by the backend active on this thread when it runs, not baked into the graph:

- ``rocm``: our FlyDSL kernel, JIT-compiled for the GPU found, on the tensors' stream.
- ``flysim``: the same kernel, compiled for ``arch`` and executed by flysim (the
  interpreter of the compiled MLIR) on the tensors' device (CPU or CUDA).
- ``reference``: the op's plain-torch math. Never reported as a FlyDSL kernel.

`TranslatedModule.forward` enters `use_backend(...)` around each call.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from dataclasses import dataclass, field

from translator_kernels.arch import ARCHS  # noqa: F401  (translator.runtime.ARCHS)

from ..errors import BackendError

BACKENDS = ("rocm", "flysim", "reference")

_state = threading.local()


@dataclass
class ExecState:
    backend: str
    arch: str
    launches: list = field(default_factory=list)  # flysim launch records of this call


def current() -> ExecState:
    st = getattr(_state, "stack", None)
    if not st:
        return ExecState("reference", "gfx942")
    return st[-1]


@contextlib.contextmanager
def use_backend(backend: str, arch: str):
    if backend not in BACKENDS:
        raise BackendError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    state = ExecState(backend, arch)
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(state)
    try:
        if backend == "flysim":
            import flysim

            with flysim.simulate(arch=arch) as sim:
                try:
                    yield state
                finally:
                    state.launches.extend(sim.launches)
        else:
            yield state
    finally:
        stack.pop()


def rocm_gpu_present() -> bool:
    """True when torch sees a ROCm (HIP) device."""
    try:
        import torch

        return bool(getattr(torch.version, "hip", None)) and torch.cuda.is_available()
    except Exception:
        return False


def flysim_available() -> str | None:
    """None when flysim can run here, else the reason it cannot."""
    try:
        import flysim  # noqa: F401
    except ImportError as e:
        return f"flysim is not importable ({e})"
    if not hasattr(flysim, "simulate"):
        return "flysim has no simulate() yet"
    if not (shutil.which("ld.lld") or _glob_lld() or os.path.exists(os.path.join(os.environ.get("ROCM_PATH", "/opt/rocm"), "llvm/bin/ld.lld"))):
        return "no ld.lld found (FlyDSL links the AMDGPU code object with it): apt-get install lld-19"
    return None


def _glob_lld() -> bool:
    import glob

    return bool(glob.glob("/usr/lib/llvm-*/bin/ld.lld"))
