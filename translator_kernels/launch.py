"""The one launch path: every kernel adapter calls `call(launcher, *args)`.

FlyDSL's `@flyc.jit` launcher traces the whole launcher (Python DSL -> MLIR) on every call,
before it looks at any cache (flydsl/compiler/jit_function.py). Only a `CompiledFunction`,
the object `flyc.compile(launcher, *args)` returns, skips the trace: its call packs the
arguments with pre-built C-ABI fills and calls the compiled host function. So this module
compiles each specialization once and calls the compiled object on every later call.

Specialization key (what FlyDSL bakes into the compiled code, and nothing else):
  - the launcher object: builders are memoized on their arguments (`@builder`), so the
    launcher stands for "builder X with arguments Y"; its origin is kept for logs and manifests;
  - per argument, what the compiled ABI depends on. A torch tensor is passed with FlyDSL's
    default dynamic layout: every size and every stride but the first unit stride are run-time
    values, so the key holds its dtype, rank and the index of its first unit stride (device
    kind is the target below). A Python int / float / bool becomes a run-time Int32 / Float32 /
    Boolean: only its type is in the key. A `fx.Constexpr` parameter is baked in: its value is;
  - the target: the active FlyDSL backend's hash (`rocm` + arch, or flysim's `flysim:` + arch
    inside `flysim.simulate`), COMPILE_ONLY and the environment variables FlyDSL itself keys
    its cache on, and FlyDSL's toolchain key (constant in a process; it keys the disk cache).
So M, batch or sequence length, passed as ints or as tensor sizes, never cause a compile.

Compiling: `flyc.compile(launcher, *placeholders)` with meta tensors of the same dtype,
shape and strides. A placeholder never launches (FlyDSL launches inside `compile()` when it
is given live device tensors), so compiling and running are separate steps on every path,
and a specialization can be compiled before any data exists (`TranslatedModule` does this at
translate time). A compile on first sight at run time is logged at INFO.

Calling (per call, nothing else): key -> dict lookup -> `compiled(*args, stream)`. On a ROCm
GPU the stream is torch's current stream of the tensors' device; nothing reads tensor data on
the host or synchronizes, so a forward can be captured in a CUDA (HIP) graph.
  - rocm: `compiled` is FlyDSL's `CompiledFunction`.
  - flysim: inside `flysim.simulate`, `flyc.compile` returns flysim's object with the same
    calling convention; its call interprets the compiled program. Same code path up to there.
  - `record_device_calls()`: the rocm path with the device call replaced at the lowest layer
    (the compiled function's call state: packed C arguments -> host function pointer) by a
    recorder, so CI walks the real-GPU host path on a CPU and benchmarks can time it.
  - COMPILE_ONLY=1 (ISA statistics): `flyc.compile` compiles and returns None; nothing runs.

Per-call replays (translator_kernels.replay) replay launches without the key: `replayed_launch` makes a
`PackedLaunch` (our packer, translator_kernels.packer, wrote every constant slot once; a replay
passes data pointers only) on the device path, or a `ReplayedLaunch` (tensors in, the compiled
object's own call) where the packer stands aside, flysim included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import threading
import time

import torch
from flydsl.compiler import backends as _backends
from flydsl.compiler import jit_function as _JF
from torch.utils._python_dispatch import _disable_current_modes

log = logging.getLogger(__name__)

_COMPILED: dict = {}  # key -> compiled callable, or _NOTHING under COMPILE_ONLY
_STUBBED: dict = {}  # (id(compiled), id(recorder)) -> CompiledFunction whose call state records instead of launching
_SPECS: dict = {}  # launcher -> _LauncherSpec
_ORIGIN: dict = {}  # id(launcher) -> (launcher, "module.builder(args)")
_CONTEXTS: dict = {}  # environment fingerprint -> target part of the key
_ARCHS: dict = {}  # (environment fingerprint, HSA_OVERRIDE_GFX_VERSION) -> FlyDSL's get_rocm_arch()
_LOCK = threading.RLock()
_local = threading.local()
_NOTHING = object()  # compiled under COMPILE_ONLY: there is nothing to call


def locked(lock, fn, *args, **kwargs):
    """`fn(*args, **kwargs)` with `lock` held. Not `with lock:`: CPython 3.11 runs a line event on the `with`
    line before `__exit__`, where the with does not protect, so a Ctrl-C (or a trace function) there
    leaves the lock held and the next taker waits for ever. Here it is taken and noted in one line
    and given back in `finally`."""
    held = False
    try:
        held = lock.acquire()
        return fn(*args, **kwargs)
    finally:
        if held:
            lock.release()
CLEAR_HOOKS: list = []  # called by clear(): caches built on top of this module (per-call replays) register here


def builder(fn):
    """Memoize a launcher builder on its arguments and remember how each launcher was made."""
    cached = functools.lru_cache(maxsize=None)(fn)

    @functools.wraps(fn)
    def build(*args, **kwargs):
        launcher = cached(*args, **kwargs)
        if id(launcher) not in _ORIGIN:
            args_text = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in sorted(kwargs.items())])
            _ORIGIN[id(launcher)] = (launcher, f"{fn.__module__}.{fn.__qualname__}({args_text})")
        return launcher

    build.cache_info = cached.cache_info
    build.cache_clear = cached.cache_clear
    return build


def origin(launcher) -> str:
    """How the launcher was made ("module.builder(args)"), or its function name."""
    entry = _ORIGIN.get(id(launcher))
    if entry is not None and entry[0] is launcher:
        return entry[1]
    return getattr(getattr(launcher, "func", None), "__name__", repr(launcher))


def kernel_name(launcher) -> str:
    """A short name: the builder's without `build_` ("gemm", "softmax"), or the launcher's."""
    return origin(launcher).split("(")[0].rsplit(".", 1)[-1].removeprefix("build_")


@dataclasses.dataclass(frozen=True)
class _LauncherSpec:
    """What the key needs from a launcher's signature (computed once per launcher)."""

    name: str
    n_args: int  # parameters the caller passes (all but a trailing stream)
    constexpr: frozenset  # indices of fx.Constexpr parameters (their values are baked in)
    has_stream: bool  # last parameter is an fx.Stream: we pass the launch stream there


def _launcher_spec(launcher) -> _LauncherSpec:
    spec = _SPECS.get(launcher)
    if spec is None:
        import inspect

        from flydsl.expr.typing import Constexpr

        if not isinstance(launcher, _JF.JitFunction):
            raise TypeError(f"launch.call expects a @flyc.jit launcher, got {type(launcher).__name__}")
        launcher._ensure_sig()
        params = list(launcher._sig.parameters.values())
        has_stream = bool(params) and getattr(params[-1].annotation, "_is_stream_param", False)
        constexpr = frozenset(i for i, p in enumerate(params) if p.annotation is not inspect.Parameter.empty
                              and Constexpr.is_constexpr_annotation(p.annotation))
        spec = _SPECS[launcher] = _LauncherSpec(launcher.func.__name__, len(params) - has_stream, constexpr, has_stream)
    return spec


def _arg_key(a):
    if isinstance(a, torch.Tensor):
        st = a.stride()
        return (a.dtype, len(st), st.index(1) if 1 in st else -1)
    return type(a)


_FAST_ENV = ("COMPILE_ONLY", "FLYDSL_GPU_ARCH", "ARCH")  # read per call; the rest at a target's first call
try:
    _ENV_DATA = os.environ._data if os.supports_bytes_environ else None
    _ENV_KEYS = tuple(os.fsencode(n) for n in _FAST_ENV)
except AttributeError:  # another Python's os.environ layout: the public (slower) read
    _ENV_DATA = None
_REGISTRY = _backends._registry  # flysim.simulate() registers its own `rocm` backend class


def _fingerprint():
    """What tells targets apart, cheaply: the registered `rocm` backend class (flysim.simulate
    registers its own) and the arch / COMPILE_ONLY variables."""
    if _ENV_DATA is not None:
        d, (k0, k1, k2) = _ENV_DATA, _ENV_KEYS
        return _REGISTRY.get("rocm"), d.get(k0), d.get(k1), d.get(k2)
    return (_REGISTRY.get("rocm"), *(os.environ.get(n) for n in _FAST_ENV))


def _truthy(value) -> bool:
    return value is not None and os.fsdecode(value).strip().lower() not in ("", "0", "false", "no", "off")


def _context():
    """The target part of the key, cached per fingerprint (FlyDSL's get_backend() costs ~20 us).

    FlyDSL's other cache-invalidating variables (opt level, debug info, ktrace) are read when a
    target is first seen; like a CompiledFunction, a compiled specialization does not follow
    later changes to them (`clear()` forgets every specialization)."""
    fp = _fingerprint()
    ctx = _CONTEXTS.get(fp)
    if ctx is None:
        ctx = _CONTEXTS[fp] = (_backends.get_backend().hash(), _truthy(fp[1]),
                               _JF._cache_invalidating_env_values(), toolchain_key())
    return ctx


def arch() -> str:
    """FlyDSL's `get_rocm_arch()`, looked up once per target rather than per call: keyed on the
    fingerprint (flysim.simulate(arch=...) registers its own backend and sets the arch variables)
    and the one other variable get_rocm_arch reads."""
    k = (_fingerprint(), os.environ.get("HSA_OVERRIDE_GFX_VERSION"))
    a = _ARCHS.get(k)
    if a is None:
        from flydsl.runtime.device import get_rocm_arch

        a = _ARCHS[k] = get_rocm_arch()
    return a


@functools.lru_cache(maxsize=1)
def toolchain_key() -> str:
    """A digest of FlyDSL's toolchain key (its sources, native libraries, version)."""
    return hashlib.sha256(_JF._flydsl_key().encode()).hexdigest()[:16]


def key(launcher, *args):
    """The specialization key of `launcher(*args)` (args without the stream)."""
    spec = _SPECS.get(launcher) or _launcher_spec(launcher)
    if len(args) != spec.n_args:
        raise TypeError(f"{spec.name} takes {spec.n_args} arguments (the launch stream is added here), "
                        f"got {len(args)}")
    if spec.constexpr:
        sig = tuple(a if i in spec.constexpr else _arg_key(a) for i, a in enumerate(args))
    else:
        sig = tuple(map(_arg_key, args))
    return launcher, _context(), sig


def _placeholder(a):
    if isinstance(a, torch.Tensor):
        return torch.empty_strided(tuple(a.shape), tuple(a.stride()), dtype=a.dtype, device="meta")
    return a


def _stream(args):
    """torch's current stream of the first CUDA (HIP) tensor's device, as FlyDSL's raw handle."""
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.is_cuda:
                return torch.cuda.current_stream(a.device).cuda_stream
            return None
    return None


def _compile(launcher, args, k):
    import flydsl.compiler as flyc

    spec = _launcher_spec(launcher)
    holders = tuple(_placeholder(a) for a in args) + ((None,) if spec.has_stream else ())
    start = time.perf_counter()
    compiled = flyc.compile(launcher, *holders)
    seconds = time.perf_counter() - start
    compiled = _NOTHING if compiled is None else compiled
    compiled = locked(_LOCK, _COMPILED.setdefault, k, compiled)
    log.info("compiled %s for %s in %.2f s", origin(launcher), k[1][0], seconds)
    for sink in getattr(_local, "sinks", ()):
        sink.append(Compiled(k, launcher, compiled, seconds))
    return compiled


@dataclasses.dataclass
class Compiled:
    """One compile this module performed: its key, launcher and compiled callable."""

    key: tuple
    launcher: object
    fn: object
    seconds: float

    @property
    def name(self) -> str:
        return _launcher_spec(self.launcher).name

    @property
    def origin(self) -> str:
        return origin(self.launcher)


@dataclasses.dataclass
class Use:
    """One `call` seen by `collect()`: the key, the compiled callable and the arguments' layout."""

    key: tuple
    launcher: object
    fn: object
    args: tuple  # per argument: ("tensor", dtype, shape, strides) or (type name, value)


def call(launcher, *args) -> None:
    """Run `launcher(*args)` through its compiled specialization (compiled on first sight)."""
    spec = _SPECS.get(launcher) or _launcher_spec(launcher)
    k = key(launcher, *args)
    fn = _COMPILED.get(k)
    if fn is None:
        fn = _compile(launcher, args, k)
    rec = getattr(_local, "replay_rec", None)
    if rec is not None:  # a replay (translator_kernels.replay) records this launch; run it untraced
        rec.launch(launcher, k, fn, args)
        with _disable_current_modes():
            return _run(launcher, spec, k, fn, args)
    return _run(launcher, spec, k, fn, args)


def _run(launcher, spec, k, fn, args):
    mode = getattr(_local, "mode", None)
    if mode is not None:
        if mode.uses is not None:
            mode.uses.append(Use(k, launcher, fn, tuple(_describe(a) for a in args)))
        if mode.compile_only or fn is _NOTHING:
            return
        if mode.recorder is not None:
            fn = _stubbed(k, launcher, fn, mode.recorder)
    elif fn is _NOTHING:
        return
    if spec.has_stream:
        fn(*args, _stream(args))
    else:
        fn(*args)
    log = getattr(_local, "log", None)
    if log is not None:  # the device path's own record (flysim records its launches itself)
        log.append(DeviceLaunch(kernel_name(launcher)))


class ReplayedLaunch:
    """One launch of a per-call replay (translator_kernels.replay): `launch.call` with everything the
    key decides already looked up. Its call does what `call` does after the lookup: the modes
    (collect and compile_only go through `call` itself), the stream, the launch log."""

    __slots__ = ("launcher", "key", "fn", "record", "cuda", "has_stream", "__weakref__")

    def __init__(self, launcher, k, fn, args):
        self.launcher, self.key, self.fn = launcher, k, fn
        self.record = DeviceLaunch(kernel_name(launcher))
        self.has_stream = _launcher_spec(launcher).has_stream
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        self.cuda = first is not None and first.is_cuda

    def __call__(self, *args):
        fn = self.fn
        mode = getattr(_local, "mode", None)
        if mode is not None:
            if mode.uses is not None or mode.compile_only:
                return call(self.launcher, *args)
            if fn is _NOTHING:
                return
            if mode.recorder is not None:
                fn = _stubbed(self.key, self.launcher, fn, mode.recorder)
        elif fn is _NOTHING:
            return
        if self.has_stream:
            fn(*args, _stream(args) if self.cuda else None)
        else:
            fn(*args)
        log = getattr(_local, "log", None)
        if log is not None:
            log.append(self.record)


class PackedLaunch(ReplayedLaunch):
    """A planned launch whose arguments our packer (translator_kernels.packer) packs: called with
    one data pointer per tensor argument, everything else was packed when the replay was built.
    Only on the device path (rocm, or rocm with the device call recorded; the replay's key says
    which): the modes that need the tensors (collect, compile_only) never replay a call."""

    __slots__ = ("packer", "exe", "_recorder")

    def __init__(self, launcher, k, fn, args, packer, recording):
        super().__init__(launcher, k, fn, args)
        self.packer = packer
        self.exe = None if recording else fn._call_state._func_exe  # the compiled host function
        self._recorder = (None, None)

    def __call__(self, *ptrs):
        mode = getattr(_local, "mode", None)
        if mode is None:
            exe = self.exe
        else:
            rec, exe = self._recorder
            if rec is not mode.recorder:
                exe = self._recording(mode.recorder)
        if exe is None:
            raise RuntimeError(f"a replay built {'with' if self.exe is None else 'without'} record_device_calls() "
                               "replayed outside it: plans are keyed on the launch mode")
        exe(self.packer.pack(ptrs))
        log = getattr(_local, "log", None)
        if log is not None:
            log.append(self.record)

    def _recording(self, recorder):
        if recorder is None:
            return None
        exe = _recording(recorder, self.record.kernel, self.fn)
        self._recorder = (recorder, exe)
        return exe


def replayed_launch(launcher, k, fn, args):
    """The launch a replay repeats: ours packs its arguments where FlyDSL's internals allow it
    (translator_kernels.packer says why not, once), else FlyDSL's CompiledFunction call does."""
    from translator_kernels.packer import packer

    mode = getattr(_local, "mode", None)
    recording = mode is not None and mode.recorder is not None
    p = _launcher_spec(launcher)
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    pk = packer(fn, args, p.n_args, p.has_stream, first is not None and first.is_cuda, recording)
    if pk is None:
        return ReplayedLaunch(launcher, k, fn, args)
    return PackedLaunch(launcher, k, fn, args, pk, recording)


@dataclasses.dataclass(frozen=True)
class DeviceLaunch:
    """A launch this thread made on the device path (rocm, or rocm with the device call recorded)."""

    kernel: str


@contextlib.contextmanager
def launch_log(into: list):
    """Append a `DeviceLaunch` to `into` for every device launch this thread makes in the block
    (one list append per launch: no synchronization, nothing read from the device)."""
    old = getattr(_local, "log", None)
    try:  # set inside the try: an interrupt right after it must not leave it set
        _local.log = into
        yield into
    finally:
        _local.log = old


def _describe(a):
    if isinstance(a, torch.Tensor):
        return ("tensor", str(a.dtype).replace("torch.", ""), tuple(a.shape), tuple(a.stride()))
    return (type(a).__name__, a)


@dataclasses.dataclass
class _Mode:
    compile_only: bool = False
    recorder: object = None
    uses: list | None = None


@contextlib.contextmanager
def _mode(**changes):
    old = getattr(_local, "mode", None)
    new = dataclasses.replace(old or _Mode(), **changes)
    try:  # set inside the try: an interrupt right after it must not leave the mode on for the thread
        _local.mode = new
        yield new
    finally:
        _local.mode = old


@contextlib.contextmanager
def compile_only():
    """Calls inside compile their specialization (if new) and launch nothing."""
    with _mode(compile_only=True):
        yield


@contextlib.contextmanager
def collect():
    """Yields (uses, compiles): every call made inside (key, compiled callable, argument layout)
    and every compile performed inside."""
    compiles: list = []
    sinks = getattr(_local, "sinks", ())
    try:
        _local.sinks = sinks + (compiles,)
        with _mode(uses=[]) as m:
            yield m.uses, compiles
    finally:
        _local.sinks = sinks


class DeviceCallRecorder(list):
    """What `record_device_calls` yields: one (kernel name, packed argument count) per call."""

    def __call__(self, name, packed):
        self.append((name, len(packed)))


@contextlib.contextmanager
def record_device_calls(recorder=None):
    """The rocm path with only the device call replaced by `recorder(name, packed_args)` (with a
    third argument, the compiled function's call spec, where `recorder.wants_spec` is true).

    Everything up to the call runs as on a GPU: the key, the compiled `CompiledFunction`
    (a real code object: COMPILE_ONLY must be off), FlyDSL's per-call argument packing. The
    call state's host function pointer, the one thing that needs the HIP runtime, is replaced.
    """
    rec = DeviceCallRecorder() if recorder is None else recorder
    try:
        with _mode(recorder=rec):
            yield rec
    finally:
        locked(_LOCK, _forget_stubs, id(rec))


def _forget_stubs(recorder_id):
    for k in [k for k in _STUBBED if k[1] == recorder_id]:
        del _STUBBED[k]


def _recording(recorder, name, fn):
    """What stands in for `fn`'s host function: `recorder(name, packed)`, or with `fn`'s call spec
    (per slot: argument index, ctype, fill) for a recorder whose `wants_spec` is true."""
    if getattr(recorder, "wants_spec", False):
        spec = fn._call_spec
        return lambda packed: recorder(name, packed, spec)
    return lambda packed: recorder(name, packed)


def _stubbed(k, launcher, fn, recorder):
    stub = _STUBBED.get((id(fn), id(recorder)))
    if stub is None:
        from flydsl.compiler.jit_executor import CallState

        if not isinstance(fn, _JF.CompiledFunction) or fn._call_spec is None:
            raise RuntimeError(f"record_device_calls() stands in for a GPU launch, but {k[1][0]} compiled "
                               f"{type(fn).__name__} (run it outside flysim.simulate, with COMPILE_ONLY off)")
        state = CallState(fn._call_spec, _recording(recorder, kernel_name(launcher), fn))
        stub = _JF.CompiledFunction(state, fn._keepalive)
        locked(_LOCK, _STUBBED.__setitem__, (id(fn), id(recorder)), stub)
    return stub


def compiled_count() -> int:
    """Specializations compiled in this process (each once)."""
    return len(_COMPILED)


def clear() -> None:
    """Forget every compiled specialization and every per-call replay (tests; FlyDSL's own caches
    are untouched)."""
    for hook in CLEAR_HOOKS:
        hook()
    locked(_LOCK, lambda: [t.clear() for t in (_COMPILED, _STUBBED, _CONTEXTS, _ARCHS)])

