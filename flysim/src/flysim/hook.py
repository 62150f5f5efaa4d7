"""simulate(): run FlyDSL launchers and compiled functions under the interpreter.

Inside the context, FlyDSL compiles with a backend registered under the name
``rocm`` (so ``flydsl.extension`` traces the same implementations the GPU
runs) whose pipeline stops after ``convert-fly-to-rocdl`` + ``canonicalize``,
where scf control flow remains. ``COMPILE_ONLY=1`` keeps FlyDSL from building
an execution engine; the disk cache is switched off so a truncated artifact is
never stored or confused with a real one. The in-memory cache of a JitFunction
is keyed by the backend hash (``flysim:<target>``) and pipeline text, so gfx942
and gfx950 artifacts (and real vs simulated ones) never collide.

Two entry points, as in FlyDSL:
  - ``flyc.compile(launcher, *args)`` returns a `SimulatedFunction`: FlyDSL's
    `CompiledFunction` calling convention (positional, every parameter, the stream
    last), traced and compiled once. Each call packs the arguments with FlyDSL's own
    C-ABI fills and interprets the program decoded once per (arch, device); it never
    traces again. As FlyDSL does with live device tensors, `compile` itself launches
    once when no argument is a compile placeholder: here a placeholder is a meta
    tensor (or a null pointer with no live buffer), a live tensor is any other.
  - calling a ``@flyc.jit`` launcher compiles (tracing, as FlyDSL's ``__call__``
    does) and runs it once.
Nothing FlyDSL would execute is skipped: a launch flysim cannot run raises.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading

import torch

from . import toolchain
from .errors import SimulationError

_state = threading.local()
_LAST = [None]


def _sim():
    return getattr(_state, "sim", None)


def last_launch():
    """The launch record of the most recent simulated kernel launch (any session), or None."""
    return _LAST[0]


@functools.lru_cache(maxsize=None)
def _make_backend_class():
    from flydsl.compiler.backends.rocm import RocmBackend

    class FlysimRocmBackend(RocmBackend):
        """RocmBackend whose pipeline stops where scf control flow is still present."""

        def pipeline_fragments(self, *, compile_hints):
            pre, _binary = self._pipeline_parts(compile_hints=compile_hints)
            stop = pre.index("convert-fly-to-rocdl")
            assert pre[stop + 1] == "canonicalize"
            return pre[: stop + 2]

        def external_binary_pipeline_fragments(self, *, compile_hints):
            return self.pipeline_fragments(compile_hints=compile_hints), ""

        def hash(self):
            return f"flysim:{self.target}"

    return FlysimRocmBackend


class Simulation:
    """One simulate() session: its arch, options and the launches it ran."""

    def __init__(self, arch, device, check_races, strict_oob, count_regions=False, check_waits=False):
        self.arch = arch
        self.check_waits = check_waits
        self.count_regions = count_regions
        self.device = torch.device(device) if device is not None else None
        self.check_races = check_races
        self.strict_oob = strict_oob
        self.launches = []
        self.extra_tensors = []

    def register(self, *tensors):
        """Declare tensors that raw-pointer arguments (``fx.Pointer``) of later launches address."""
        self.extra_tensors.extend(tensors)
        return self

    @property
    def last(self):
        return self.launches[-1] if self.launches else None


_CACHE_ENV = {"FLYDSL_RUNTIME_ENABLE_CACHE": "0", "FLYDSL_COMPILE_LLVM_DIR": "", "FLYDSL_KTRACE_ENABLE": "0"}


@contextlib.contextmanager
def simulate(arch="gfx942", *, device=None, check_races=True, strict_oob=True, count_regions=False, check_waits=False):
    """Run every ``@flyc.jit`` launcher called inside the block under flysim.

    ``device``: where lane tensors live (default: the arguments' device).
    ``check_races``: detect LDS races between waves. ``strict_oob``: raise on a
    raw-pointer access outside every argument tensor (else count and warn).
    ``check_waits``: also report an LDS read of bytes that another wave may not have written
    yet (needs check_races): ``"vmcnt"``, bytes of its buffer load to LDS (LDS DMA) that no
    ``s_waitcnt vmcnt`` of that wave retired before the barrier; ``"lgkmcnt"``, bytes of its
    LDS store that it did not retire (``s_waitcnt lgkmcnt``) before a bare ``s_barrier``
    (gpu.barrier has the fence); ``True``: both.
    ``count_regions``: count, per scf.if and scf.for of a kernel, the waves that run each side
    (scf.if: then / else) or each iteration (scf.for), into the ``region_waves`` counter.
    """
    from flydsl.compiler import backends as B
    from flydsl.compiler import jit_function as JF

    if _sim() is not None:
        raise SimulationError("flysim.simulate() sessions do not nest")
    sim = Simulation(arch, device, check_races, strict_oob, count_regions, check_waits)
    old_env = toolchain.ensure_compile_env(arch)
    old_env.update({k: os.environ.get(k) for k in _CACHE_ENV})
    os.environ.update(_CACHE_ENV)
    orig_backend = B._registry.get("rocm")
    orig_call = JF.JitFunction.__call__
    orig_compile = JF.MlirCompiler.__dict__["compile"]
    orig_compile_impl = JF._compile_impl
    B.register_backend("rocm", _make_backend_class(), force=True)
    B._make_backend.cache_clear()

    def compile_and_keep_locations(cls, asm, *, func_name, config):
        module = orig_compile.__func__(cls, asm, func_name=func_name, config=config)
        _state.compiled_asm = module.operation.get_asm(enable_debug_info=True)
        return module

    def call(self, *args, **kwargs):
        from flydsl._mlir import ir

        if ir.Context.current is not None or _sim() is None:
            return orig_call(self, *args, **kwargs)
        fn = _compile_simulated(_sim(), self, args, kwargs)
        fn(*fn.bound_args)
        fn.bound_args = None
        return None

    def compile_impl(func, *args, **kwargs):
        """flyc.compile() under simulation: a SimulatedFunction, launched once here when given live data."""
        jf, bound_self = JF._unwrap_jit_function(func)
        if jf is None:
            return orig_compile_impl(func, *args, **kwargs)
        fn = _compile_simulated(_sim() or sim, jf, ((bound_self,) if bound_self is not None else ()) + args, kwargs)
        if not fn.placeholders:
            fn(*fn.bound_args)
        fn.bound_args = None
        return fn

    JF.JitFunction.__call__ = call
    JF._compile_impl = compile_impl
    JF.MlirCompiler.compile = classmethod(compile_and_keep_locations)
    _state.sim = sim
    try:
        yield sim
    finally:
        _state.sim = None
        JF.JitFunction.__call__ = orig_call
        JF._compile_impl = orig_compile_impl
        JF.MlirCompiler.compile = orig_compile
        if orig_backend is not None:
            B.register_backend("rocm", orig_backend, force=True)
        B._make_backend.cache_clear()
        toolchain.restore_env(old_env)


def _compile_simulated(sim, jf, args, kwargs):
    """Trace + compile (FlyDSL's own code, pipeline cut for flysim) one specialization."""
    from flydsl.compiler.jit_function import _build_call_spec

    _state.compiled_asm = None
    jf._compile_or_execute(args, kwargs, execute=False)
    artifact = jf._last_compiled[1]
    if getattr(artifact, "_flysim_asm", None) is None:
        if _state.compiled_asm is None:
            raise SimulationError(f"FlyDSL returned a cached artifact flysim cannot read for {jf.func.__name__}")
        artifact._flysim_asm = _state.compiled_asm
        dump = os.environ.get("FLYSIM_DUMP_DIR")
        if dump:
            os.makedirs(dump, exist_ok=True)
            with open(os.path.join(dump, f"{jf.func.__name__}_{sim.arch}.mlir"), "w") as fh:
                fh.write(artifact._flysim_asm)
    bound_self, rest = jf._split_self(args)
    bound = jf._sig.bind(*rest, **kwargs)
    bound.apply_defaults()
    values = tuple(bound.arguments.values())
    jf._resolve_arguments(bound.arguments)
    spec = _build_call_spec(jf._sig, tuple(bound.arguments.values()))
    fn = SimulatedFunction(jf.func.__name__, artifact, spec, sim.arch)
    fn.bound_args = values
    live = any(_is_live(v) for v in values)  # FlyDSL: a null pointer beside live buffers is an argument
    fn.placeholders = [n for n, v in zip(bound.arguments, values) if _is_meta(v) or (not live and _is_null(v))]
    return fn


def _is_meta(v) -> bool:
    t = v if isinstance(v, torch.Tensor) else getattr(v, "torch_tensor", None)
    return isinstance(t, torch.Tensor) and t.is_meta


def _is_null(v) -> bool:
    from flydsl.compiler.jit_argument import PointerJitArg

    return isinstance(v, PointerJitArg) and v.pointer.value is None


def _is_live(v) -> bool:
    from flydsl.compiler.jit_argument import PointerJitArg

    if isinstance(v, PointerJitArg):
        return v.pointer.value is not None
    t = v if isinstance(v, torch.Tensor) else getattr(v, "torch_tensor", None)
    return isinstance(t, torch.Tensor) and not t.is_meta


class SimulatedFunction:
    """FlyDSL's CompiledFunction calling convention, executed by flysim.

    ``fn(*args)``: every launcher parameter positionally (constexpr values are ignored, as
    FlyDSL ignores them), the stream last. Runs inside any ``simulate()`` of the same arch.
    """

    def __init__(self, name, artifact, call_spec, arch):
        self.name = name
        self.artifact = artifact
        self.call_spec = call_spec
        self.arch = arch
        self.bound_args = None
        self.placeholders = []

    def __repr__(self):
        return f"<flysim SimulatedFunction {self.name} {self.arch}>"

    def __call__(self, *args):
        from flydsl.compiler.jit_executor import build_abi_storage

        from .launch import program_for

        sim = _sim()
        if sim is None:
            raise SimulationError(f"{self.name}: a flysim-compiled function runs only inside flysim.simulate() "
                                  "(there is no GPU here); call it inside `with flysim.simulate(...)`")
        if sim.arch != self.arch:
            raise SimulationError(f"{self.name} was compiled for {self.arch} but the simulate() session is "
                                  f"{sim.arch}; compile it again inside this session")
        meta = [i for i, a in enumerate(args) if _is_meta(a)]
        if meta:
            raise SimulationError(f"{self.name}: argument(s) {meta} are meta tensors (compile placeholders); "
                                  "pass tensors that hold data")
        storages, _packed = build_abi_storage([ct for _i, ct, _f in self.call_spec])
        raw = []
        for (i, _ct, fill), s in zip(self.call_spec, storages):
            if fill is not None:
                fill(args[i], s)
            raw.append(ctypes.string_at(ctypes.addressof(s), ctypes.sizeof(s)))
        own = _collect_tensors(args)
        tensors = own + list(sim.extra_tensors)
        device = sim.device or (tensors[0].device if tensors else torch.device("cpu"))
        program = program_for(self.artifact, sim.arch, device)
        records = program.run_host(raw, tensors, sim, n_args=len(own))
        sim.launches.extend(records)
        if records:
            _LAST[0] = records[-1]
        return None


def _collect_tensors(values):
    out = []
    for v in values:
        t = getattr(v, "torch_tensor", None)
        if isinstance(v, torch.Tensor):
            t = v
        if isinstance(t, torch.Tensor):
            out.append(t)
        elif hasattr(v, "__dict__") and not isinstance(v, type):
            for f in vars(v).values():
                if isinstance(f, torch.Tensor) or hasattr(f, "torch_tensor"):
                    out.extend(_collect_tensors([f]))
    return out
