"""Our own argument packer for the launches of a per-call replay: data pointers in, host call out.

FlyDSL's `CompiledFunction` call packs every argument on every call: per C-ABI slot one fill
function (a tensor: its data pointer, then its dynamic sizes and strides packed into a byte
buffer; a scalar: its value; the stream: its handle) writes into a per-thread ctypes storage,
then the compiled host function is called with the array of the storages' addresses (the
"packed" argument array; flydsl/compiler/jit_executor.py `CallState`). That is ~0.5 us per slot:
a GEMM passes 18 slots, attention 40.

A replay (translator_kernels.replay) fixes everything but the data pointers: the geometry of every
tensor a launch takes is part of the replay's signature or recorded (allocations, views), and
every scalar is a constant of the generated code. So `Packer` runs FlyDSL's own fills once, on
the arguments of the launch the replay was recorded from, into storages it keeps; a replay only
writes the tensors' data pointers (one slice assignment into one pointer array that the pointer
slots of the packed array point into) and, on a GPU, the current stream, then calls the host
function with the same packed array. The bytes the host function sees are FlyDSL's: constant
slots were written by FlyDSL's fills, pointer slots hold what FlyDSL's pointer fill would read
(`data_ptr()`); tests/kernels/test_packer.py compares both byte for byte at the recorder, the
lowest layer, for every family.

It relies on FlyDSL internals, checked once per launch (`unavailable` gives the reason, logged
once: a warning where FlyDSL is not as expected, INFO where standing aside is expected, as under
flysim; the launch then goes through FlyDSL's own call): flydsl 0.5.0, a `CompiledFunction` with
its call spec (slot list of (argument index, ctype, fill)), per tensor a first slot that is
FlyDSL's torch pointer fill, no kernel-trace presets, and on the device path a ready call state
whose host function we call (`_func_exe`). flysim's compiled object is no `CompiledFunction`:
flysim runs the replay through its own call (tensors in), unchanged.

Threads: the constant storages are shared (written once, before any replay); each thread gets
its own pointer array and packed array, as FlyDSL's call state does.
"""

from __future__ import annotations

import ctypes
import logging
import threading

import torch

log = logging.getLogger(__name__)

FLYDSL_VERSION = "0.5.0"  # the FlyDSL whose call state layout this module reads
ENABLED = True  # `enabled(False)` turns the packer off (tests compare it with FlyDSL's own packing)
_PTR_FILL = "TorchTensorJitArg.__c_abi_spec__.<locals>.ptr_fill"
_STREAM_FILL = "Stream.__c_abi_spec__.<locals>.fill"
_SCALARS = (int, float, bool)
_REPORTED: set = set()


def _flydsl_ok() -> str | None:
    try:
        import flydsl
        from flydsl.compiler import jit_executor, jit_function
    except ImportError as e:
        return f"FlyDSL internals not importable ({e})"
    if flydsl.__version__ != FLYDSL_VERSION:
        return f"flydsl {flydsl.__version__} is not {FLYDSL_VERSION}, whose call state this packer reads"
    if not hasattr(jit_executor, "build_abi_storage") or "_call_spec" not in jit_function.CompiledFunction.__slots__:
        return "FlyDSL's CompiledFunction / build_abi_storage do not look as in 0.5.0"
    return None


_FLYDSL_REASON = _flydsl_ok()


def unavailable(fn, args, n_args: int, recording: bool) -> str | None:
    """None when `Packer(fn, args, ...)` can stand in for `fn(*args)`, else why not."""
    if not ENABLED:
        return "turned off"
    if _FLYDSL_REASON:
        return _FLYDSL_REASON
    from flydsl.compiler.jit_function import CompiledFunction

    if type(fn) is not CompiledFunction:
        return f"{type(fn).__name__} is not FlyDSL's CompiledFunction (flysim runs its own call)"
    spec = fn._call_spec
    if not isinstance(spec, tuple) or not all(isinstance(s, tuple) and len(s) == 3 for s in spec):
        return "the CompiledFunction has no call spec of (argument, ctype, fill) slots"
    if getattr(fn._keepalive, "_ktrace_traced", True):
        return "kernel tracing (ktrace) adds a preset slot and a pre-dispatch step"
    if not recording:
        state = fn._call_state
        if not fn._runtime_ready or state is None or getattr(state, "_predispatch", 1) is not None \
                or getattr(state, "_presets", 1) or not callable(getattr(state, "_func_exe", None)):
            return "FlyDSL's call state is not ready or has a pre-dispatch step"
    first = set()
    for idx, ctype, fill in spec:
        if fill is None:
            if idx != -1:
                return f"slot of argument {idx} has no fill"
            continue
        a = args[idx] if 0 <= idx < len(args) else None
        if isinstance(a, torch.Tensor):
            if idx not in first:
                first.add(idx)
                if ctype is not ctypes.c_void_p or fill.__qualname__ != _PTR_FILL:
                    return f"argument {idx} (a tensor) does not start with FlyDSL's torch pointer slot"
        elif idx == n_args:
            if fill.__qualname__ != _STREAM_FILL:
                return "the stream slot is not FlyDSL's Stream fill"
        elif type(a) not in _SCALARS:
            return f"argument {idx} is a {type(a).__name__}, not a tensor, a scalar or the stream"
    return None


def packer(fn, args, n_args: int, has_stream: bool, cuda: bool, recording: bool):
    """A Packer for `fn(*args[, stream])`, or None (reason logged once) where FlyDSL's own call must run."""
    reason = unavailable(fn, args, n_args, recording)
    if reason is not None:
        if reason not in _REPORTED and reason != "turned off":
            _REPORTED.add(reason)
            expected = "flysim" in reason or "ktrace" in reason or "not ready" in reason
            (log.info if expected else log.warning)(
                "replayed launches use FlyDSL's own argument packing (slower host path): %s", reason)
        return None
    return Packer(fn, args, n_args, has_stream, cuda)


class Packer:
    """The packed argument array of one replayed launch; `pack(pointers)` fills in the pointers."""

    __slots__ = ("storages", "template", "slots", "n", "stream_device", "_tls")

    def __init__(self, fn, args, n_args, has_stream, cuda):
        from flydsl.compiler.jit_executor import build_abi_storage

        spec = fn._call_spec
        full = tuple(args) + ((None,) if has_stream else ())  # the stream: written per call on a GPU
        storages, packed = build_abi_storage([ctype for _, ctype, _ in spec])
        slots, seen = [], set()  # packed-array indices written per call, in the order pointers come in
        for i, (idx, _ctype, fill) in enumerate(spec):
            if fill is None:
                continue
            a = full[idx]
            if isinstance(a, torch.Tensor) and idx not in seen:
                seen.add(idx)
                slots.append(i)
            elif idx == n_args and cuda:
                stream_slot = i
            else:
                fill(a, storages[i])  # FlyDSL's own bytes: geometry and scalars are fixed in a replay
        self.stream_device = None
        if has_stream and cuda:
            slots.append(stream_slot)
            self.stream_device = next(a.device for a in args if isinstance(a, torch.Tensor))
        self.storages, self.template, self.slots, self.n = storages, packed, tuple(slots), len(slots)
        self._tls = threading.local()

    def _thread_state(self):
        ptrs = (ctypes.c_uint64 * self.n)()
        packed = (ctypes.c_void_p * len(self.template))(*self.template)
        base = ctypes.addressof(ptrs)
        for j, i in enumerate(self.slots):
            packed[i] = base + 8 * j
        self._tls.state = state = (ptrs, packed)
        return state

    def pack(self, ptrs: tuple):
        """The packed array with `ptrs` (one data pointer per tensor argument, in order) written."""
        try:
            buf, packed = self._tls.state
        except AttributeError:
            buf, packed = self._thread_state()
        if self.stream_device is not None:
            ptrs += (torch.cuda.current_stream(self.stream_device).cuda_stream,)
        buf[:] = ptrs
        return packed

    def slot_bytes(self, packed) -> list:
        """Every slot's bytes as the host function reads them (tests)."""
        return [ctypes.string_at(packed[i], ctypes.sizeof(type(s))) if packed[i] else None
                for i, s in enumerate(self.storages)]
