"""The rocm code path on a machine without an AMD GPU, device call replaced by a recorder.

`rocm_recorded(arch)` sets what a GPU-less compile of real code objects needs (the arch, an
ld.lld found by flysim.toolchain, COMPILE_ONLY off so `flyc.compile` returns FlyDSL's
`CompiledFunction`) and enters `translator_kernels.launch.record_device_calls()`: every FlyDSL op
then runs exactly the host code a GPU user runs — adapter, specialization key, compiled
function, FlyDSL's argument packing — and only the call of the host function pointer (the one
step that needs the HIP runtime) appends to the recorder instead. CI walks the rocm path this
way (tests/kernels/test_launch.py) and bench.host_overhead times it. Outputs are left
uninitialized: nothing ran on a device.
"""

from __future__ import annotations

import contextlib
import os

from ..errors import BackendError


@contextlib.contextmanager
def rocm_compile_env(arch: str = "gfx942"):
    """os.environ set for compiling real code objects for `arch` without a GPU (COMPILE_ONLY off)."""
    try:
        from flysim.toolchain import compile_env
    except ImportError as e:
        raise BackendError(f"compiling without a GPU finds its ld.lld through flysim.toolchain ({e}); "
                           "install the flysim extra") from None
    env = compile_env(arch)
    env.pop("COMPILE_ONLY")
    old = {k: os.environ.get(k) for k in (*env, "COMPILE_ONLY")}
    try:  # changed inside the try: an interrupt right after the change restores it too
        os.environ.update(env)
        os.environ.pop("COMPILE_ONLY", None)
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def rocm_recorded(arch: str = "gfx942", recorder=None):
    """Yields the recorder: by default a list of (kernel name, packed argument count), one per device
    call; else `recorder`, called as `recorder(kernel name, packed argument array)`."""
    from translator_kernels import launch

    from . import use_backend

    with rocm_compile_env(arch), use_backend("rocm", arch), launch.record_device_calls(recorder) as rec:
        yield rec
