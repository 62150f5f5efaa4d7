"""Execution backends for the flydsl custom ops, chosen at run time.

The translated graph calls `torch.ops.flydsl.<op>`; what that call executes is decided
by the backend active on this thread when it runs, not baked into the graph:

- ``rocm``: our FlyDSL kernel, JIT-compiled for the GPU found, on the tensors' stream.
- ``flysim``: the same kernel, compiled for ``arch`` and executed by flysim (the
  interpreter of the compiled MLIR) on the tensors' device (CPU or CUDA).
- ``reference``: the op's plain-torch math. Never reported as a FlyDSL kernel.

`TranslatedModule.forward` enters `use_backend(...)` around each call.

Threads: the backend choice is per thread. Kernel execution is not: a flysim session patches
FlyDSL's process-wide JIT entry points and environment, and FlyDSL's tracing and compiling
(on rocm too) keep process-wide state. So `use_backend` holds `EXECUTION_LOCK` (one
re-entrant lock per process) for a flysim or rocm block: calls of translated modules from
several threads are safe and run their kernels one call at a time (on rocm only the host
side is serialized; launches stay asynchronous on the stream). The reference backend is
plain torch and takes no lock.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

from translator_kernels.arch import ARCHS  # noqa: F401  (translator.runtime.ARCHS)

from ..errors import BackendError

BACKENDS = ("rocm", "flysim", "reference")

_state = threading.local()
EXECUTION_LOCK = threading.RLock()


@dataclass
class ExecState:
    backend: str
    arch: str
    launches: list = field(default_factory=list)  # flysim launch records of this call
    calls: list = field(default_factory=list)  # one runtime.ops.OpCall per FlyDSL op call, in order


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
    held = False
    try:  # pushed inside the try, popped only if pushed: an interrupt anywhere leaves the stack as it was
        stack.append(state)
        # taken and noted in one line, given back in `finally`: not `with EXECUTION_LOCK:` (see
        # translator_kernels.launch.locked: a Ctrl-C on the with line can skip __exit__ and hang other threads)
        held = EXECUTION_LOCK.acquire() if backend != "reference" else False
        yield from _run(state, backend, arch)
    finally:
        if held:
            EXECUTION_LOCK.release()
        if stack and stack[-1] is state:
            stack.pop()


def _run(state, backend, arch):
    if backend == "flysim":
        import flysim

        with flysim.simulate(arch=arch) as sim:
            state.launches = sim.launches  # live: dispatch reads what each op call appended
            yield state
    elif backend == "rocm":
        from translator_kernels.launch import launch_log

        with launch_log(state.launches):  # the launch path appends one record per device launch
            yield state
    else:
        yield state


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
    if flysim.toolchain.find_ld_lld() is None:  # flysim.toolchain is the one ld.lld finder
        return "no ld.lld found (FlyDSL links the AMDGPU code object with it): apt-get install lld-19"
    return None
