"""pytest plugin: FlyDSL's own kernel tests (or any GPU kernel tests) under flysim, on CPU.

    cd $FLYDSL_SRC && python -m pytest -p flysim.pytest_plugin --flysim-arch gfx950 \\
        --flysim-max-lanes 65536 --flysim-report report.md tests/kernels

What it changes, for the whole session:
  - device tensors live on the CPU: a TorchFunctionMode rewrites every ``device=`` that names
    CUDA (strings, ``torch.device``, ordinals) to ``cpu``, makes ``Tensor.cuda()`` the
    identity and ``Tensor.is_cuda`` True (``.device`` stays the CPU); ``torch.cuda.is_available()`` answers True, ``synchronize`` / streams / events
    are inert (events time nothing: elapsed_time is 0).
  - raw pointers (``t.data_ptr()`` passed as an integer) may address any tensor the test made
    and still holds, as device memory would: the launch sees those storages after its
    argument tensors;
  - ``flydsl.runtime.device.get_rocm_arch`` answers the ``--flysim-arch``, and so does
    ``FLYDSL_GPU_ARCH``;
  - each test runs inside ``flysim.simulate(arch)``: every launch goes through the
    interpreter (race and bounds checks on).
  - timed regions run once: ``torch.profiler.profile`` / ``record_function`` are no-ops (no
    events), and in every imported module that defines the perftest helpers of FlyDSL's
    ``tests/test_common.py`` (``run_iters``, ``run_iters_rotate``, ``device_memory_profiling``,
    ``get_trace_perf``), those are replaced on the module object at collection (the checkout's
    files are never edited): warm-up runs nothing, the timed loop runs the kernel once on the
    caller's own arguments, the memory probe launches nothing (and reports no room for rotated
    copies of the arguments), the measured time is 1 us (tests divide by it). A ``run_perftest`` call costs one launch.
Selection: ``--flysim-per-file N`` keeps, per test file, the N tests whose parameter ids have
the smallest product of numbers (a proxy for the smallest shapes; ties keep file order);
tests that time GPU code (a ``benchmark`` marker or "bench" in the name) are left out, since
flysim models no timing. Both are listed in the report as "not selected".
The size cap: a launch of more than ``--flysim-max-lanes`` lanes (grid x block, padded to
whole waves) is refused before it runs and the test is reported "over cap"; a test that
runs longer than ``--flysim-timeout`` seconds too. Nothing is shrunk behind the user's back:
the cap only admits or refuses a test at the shapes the test itself chose.

Each test gets one category (the report's ``flysim`` line and the summary table):
  passed; failed (numerics: the assertion text, which names the worst element when the test
  uses torch.testing); unsupported (the MLIR op or instruction flysim lacks, named); not
  applicable (another arch family - RDNA, gfx1250 - or an API newer than the installed
  flydsl, or a multi-GPU / profiler / benchmark-only test); over cap; error (anything else:
  a flysim bug or an upstream one, with the exception).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import weakref
from collections import Counter, defaultdict

import pytest
import torch
from torch.overrides import TorchFunctionMode

from .errors import SimulationError

_STATE = {"arch": "gfx950", "max_lanes": None, "timeout": None, "results": {}, "t0": None,
          "not_selected": Counter(), "collect": {}}


def pytest_addoption(parser):
    g = parser.getgroup("flysim")
    g.addoption("--flysim-arch", default=os.environ.get("FLYSIM_ARCH", "gfx950"), help="gfx942 or gfx950")
    g.addoption("--flysim-max-lanes", type=int, default=int(os.environ.get("FLYSIM_MAX_LANES", "0")) or None,
                help="refuse launches of more lanes than this (the test is reported 'over cap')")
    g.addoption("--flysim-timeout", type=float, default=float(os.environ.get("FLYSIM_TIMEOUT", "0")) or None,
                help="seconds per test before it is reported 'over cap'")
    g.addoption("--flysim-per-file", type=int, default=int(os.environ.get("FLYSIM_PER_FILE", "0")) or None,
                help="keep the N tests of each file with the smallest parameter numbers (a shape proxy)")
    g.addoption("--flysim-check-waits", action="store_true", help="simulate(check_waits=True): report missing vmcnt waits")
    g.addoption("--flysim-report", default=os.environ.get("FLYSIM_REPORT"), help="write the summary (markdown; .json too)")


# -- CUDA on the CPU ---------------------------------------------------------


def _cpu(dev):
    if isinstance(dev, torch.device):
        return torch.device("cpu") if dev.type == "cuda" else dev
    if isinstance(dev, str) and dev.startswith("cuda"):
        return "cpu"
    return dev


_LIVE = weakref.WeakValueDictionary()  # storage address -> a live tensor on it: the "device memory"


def _remember(out):
    if isinstance(out, torch.Tensor):
        if out.device.type == "cpu" and out.numel():
            _LIVE[out.untyped_storage().data_ptr()] = out
    elif isinstance(out, (tuple, list)):
        for o in out:
            _remember(o)
    return out


def device_memory():
    """Byte views of every live tensor storage the test made: what a raw device pointer may address."""
    views = []
    for t in list(_LIVE.values()):
        st = t.untyped_storage()
        views.append(torch.empty(0, dtype=torch.uint8).set_(st))
    return views


class CudaToCpu(TorchFunctionMode):
    """Every device= that names CUDA becomes the CPU; Tensor.cuda() is the identity; every tensor
    made is remembered (raw pointers from ``data_ptr()`` may address any of them, as on a GPU)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if "device" in kwargs:
            d = kwargs["device"]
            kwargs["device"] = "cpu" if isinstance(d, int) else _cpu(d)
        if func in (torch.Tensor.to,):
            args = tuple(_cpu(a) for a in args)
        return _remember(func(*args, **kwargs))


class _Event:
    def __init__(self, *a, **k):
        self.t = 0.0

    def record(self, *a, **k):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 0.0

    def query(self):
        return True


class _Stream:
    cuda_stream = 0
    device = torch.device("cpu")

    def __init__(self, *a, **k):
        pass

    def synchronize(self):
        pass

    def wait_stream(self, other):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class _Props:
    name = "AMD Instinct (flysim)"
    gcnArchName = "gfx950"
    multi_processor_count = 256
    total_memory = 192 << 30


def install_cuda_shim(arch):
    """Make CUDA calls of a GPU test work on CPU tensors (see the module docstring); returns the undo."""
    import flydsl.runtime.device as dev

    c = torch.cuda
    _Props.gcnArchName = arch
    patch = dict(
        is_available=lambda: True, device_count=lambda: 1, current_device=lambda: 0,
        set_device=lambda *a, **k: None, synchronize=lambda *a, **k: None, empty_cache=lambda: None,
        manual_seed=lambda s: None, manual_seed_all=lambda s: None,  # torch.manual_seed seeds the CPU already
        Event=_Event, Stream=_Stream, device=_Stream, device_of=_Stream, current_stream=lambda *a, **k: _Stream(),
        default_stream=lambda *a, **k: _Stream(), stream=lambda s=None: _Stream(),
        get_device_name=lambda *a, **k: _Props.name, get_device_properties=lambda *a, **k: _Props(),
        get_device_capability=lambda *a, **k: (9, 5), is_bf16_supported=lambda *a, **k: True,
        reset_peak_memory_stats=lambda *a, **k: None, reset_max_memory_allocated=lambda *a, **k: None,
        max_memory_allocated=lambda *a, **k: 0, memory_allocated=lambda *a, **k: 0,
        memory_reserved=lambda *a, **k: 0, max_memory_reserved=lambda *a, **k: 0,
        mem_get_info=lambda *a, **k: (_Props.total_memory, _Props.total_memory))
    saved = {k: getattr(c, k, None) for k in patch}
    saved_arch, saved_env = dev.get_rocm_arch, os.environ.get("FLYDSL_GPU_ARCH")
    for k, v in patch.items():
        setattr(c, k, v)
    os.environ["FLYDSL_GPU_ARCH"] = arch
    dev.get_rocm_arch = lambda *a, **k: arch
    real_gen = torch.Generator
    # "cuda" generators too; a class (annotations such as `torch.Generator | None` must still work)
    torch.Generator = type("Generator", (), {"__new__": lambda cls, device=None: real_gen(device=_cpu(device) or "cpu")})
    mode = CudaToCpu()
    mode.__enter__()
    torch.Tensor.is_cuda = property(lambda self: True)  # shadows TensorBase's; removed by undo
    import torch.profiler as tpf

    saved_prof = tpf.profile, tpf.record_function
    tpf.profile = tpf.record_function = _NoProfile

    def undo():
        mode.__exit__(None, None, None)
        del torch.Tensor.is_cuda
        tpf.profile, tpf.record_function = saved_prof
        torch.Generator = real_gen
        for k, v in saved.items():
            setattr(c, k, v)
        dev.get_rocm_arch = saved_arch
        if saved_env is None:
            os.environ.pop("FLYDSL_GPU_ARCH", None)
        else:
            os.environ["FLYDSL_GPU_ARCH"] = saved_env

    return undo


class _NoProfile:
    """torch.profiler.profile / record_function under flysim: records nothing (timing is not modelled)."""

    def __init__(self, *a, **k):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def __call__(self, fn):  # used as a decorator
        return fn

    def step(self):
        pass

    def events(self):
        return []

    def key_averages(self, *a, **k):
        return []


def _once_rotate(num_iters, func, rotate_args):
    args, kwargs = rotate_args[-1]  # the caller's own arguments (the others are copies)
    return func(*args, **kwargs)


def _no_memory_probe(func, *args, **kwargs):
    size = sum(a.nbytes for a in args if isinstance(a, torch.Tensor)) + 1
    return float("inf"), size, 0, 0  # "no free memory": perftest makes no rotated copies


_TIMED = {"run_iters": lambda num_iters, func, *a, **k: None, "run_iters_rotate": _once_rotate,
          "device_memory_profiling": _no_memory_probe, "get_trace_perf": lambda prof, num_iters: 1.0}  # 1 us: tests divide by it


def shrink_timed_regions(modules=None):
    """Replace the perftest helpers (see the module docstring) in every module that defines them;
    returns the names of the modules changed now."""
    import sys

    changed = []
    for name, mod in list((modules or sys.modules).items()):
        d = getattr(mod, "__dict__", None)  # the namespace itself: no module __getattr__ runs
        if not isinstance(d, dict) or d.get("_flysim_timed") or not callable(d.get("run_iters_rotate")):
            continue
        for attr, stub in _TIMED.items():
            fn = d.get(attr)
            if callable(fn) and getattr(fn, "__module__", None) == d.get("__name__"):
                setattr(mod, attr, stub)
        mod._flysim_timed = True
        changed.append(name)
    return changed


# -- the size cap --------------------------------------------------------------


class OverCap(SimulationError):
    """A launch or a test larger than the user's cap (--flysim-max-lanes / --flysim-timeout)."""


def _cap_launches(max_lanes):
    from . import launch as L

    real = L.launch

    def capped(kernel, program, grid, block, *rest):
        bsz = block[0] * block[1] * block[2]
        lanes = grid[0] * grid[1] * grid[2] * ((bsz + 63) // 64 * 64)
        if max_lanes and lanes > max_lanes:
            raise OverCap(f"launch of {kernel.name} has {lanes} lanes (grid {grid}, block {block}) > cap {max_lanes}")
        with torch._C.DisableTorchFunction():  # flysim's own tensor ops skip the CUDA-to-CPU mode
            host = rest[2]
            if getattr(host, "n_args", None) is None:  # OutOfBoundsError names arguments, not these
                host.n_args = len(host.tensors)
            host.tensors = list(host.tensors) + device_memory()  # after the arguments: they match first
            return real(kernel, program, grid, block, *rest)

    L.launch = capped


# -- categories -----------------------------------------------------------------

_NA_SKIP = re.compile(r"rdna|gfx1[012]\d\d|wmma|gfx12|gfx11|multi.?gpu|>=\s*\d+ (physical )?gpus|world_size", re.I)
_NA_FILES = re.compile(r"rdna|gfx1250|wmma|allreduce|shmem|profiler|benchmark|perf", re.I)


def categorize(report, excinfo_text, exc_type, nodeid):
    """(category, detail) of one test's outcome."""
    from .errors import UnsupportedOpError

    if report.skipped:
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if _NA_SKIP.search(reason) or _NA_FILES.search(nodeid.split("::")[0]):
            return "not applicable", reason[:200]
        if "over cap" in reason:
            return "over cap", reason[:200]
        return "skipped", reason[:200]
    if report.passed:
        return "passed", ""
    text = excinfo_text or ""
    if exc_type is not None and issubclass(exc_type, (OverCap, OverTime)) or "OverCap" in text[:200]:
        return "over cap", text.splitlines()[0][:200] if text else ""
    if exc_type is not None and issubclass(exc_type, UnsupportedOpError):
        m = re.search(r"'([^']+)'", text)
        return "unsupported", (m.group(1) if m else text.splitlines()[0])[:200]
    if exc_type is not None and issubclass(exc_type, (ImportError, AttributeError)) and "flydsl" in text:
        return "not applicable", "needs newer flydsl: " + text.splitlines()[0][:200]
    if exc_type is not None and issubclass(exc_type, AssertionError):
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return "failed", " / ".join(lines[:4])[:300]
    first = text.splitlines()[0] if text else ""
    return "error", f"{exc_type.__name__ if exc_type else ''}: {first}"[:300]


# -- hooks -------------------------------------------------------------------------


def _volume(item):
    nums = [int(x) for x in re.findall(r"(?<![A-Za-wyz])\d+", item.nodeid.split("[", 1)[1])] if "[" in item.nodeid else []
    v = 10 ** 12 if re.search(r"large|big|long", item.name, re.I) else 1
    for x in nums:
        v *= max(x, 1)
    return v


def pytest_collection_modifyitems(config, items):
    shrink_timed_regions()
    per_file = config.getoption("--flysim-per-file")
    keep, drop = [], []
    by_file = defaultdict(list)
    for it in items:
        timing = it.get_closest_marker("benchmark") is not None or "bench" in it.name.lower()
        (drop if timing else by_file[it.nodeid.split("::")[0]]).append(it)
    for f, its in by_file.items():
        if per_file:
            ranked = sorted(range(len(its)), key=lambda i: (_volume(its[i]), i))[:per_file]
            chosen = set(ranked)
            keep += [it for i, it in enumerate(its) if i in chosen]
            drop += [it for i, it in enumerate(its) if i not in chosen]
        else:
            keep += its
    for it in drop:
        _STATE["not_selected"][it.nodeid.split("::")[0]] += 1
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collectreport(report):
    if report.failed:
        text = str(report.longrepr)
        last = [ln for ln in text.splitlines() if ln.startswith("E ")]
        msg = last[-1][1:].strip() if last else text.splitlines()[-1]
        newer = "flydsl" in msg and ("cannot import name" in msg or "has no attribute" in msg)
        _STATE["collect"][report.nodeid] = ("not applicable: needs newer flydsl" if newer else "collection error", msg[:200])


def pytest_configure(config):
    _STATE["arch"] = config.getoption("--flysim-arch")
    _STATE["max_lanes"] = config.getoption("--flysim-max-lanes")
    _STATE["timeout"] = config.getoption("--flysim-timeout")
    _STATE["report"] = config.getoption("--flysim-report")
    _STATE["check_waits"] = config.getoption("--flysim-check-waits")
    _STATE["t0"] = time.perf_counter()
    config.option.continue_on_collection_errors = True  # a file that cannot import is a report line
    install_cuda_shim(_STATE["arch"])
    _cap_launches(_STATE["max_lanes"])


class OverTime(BaseException):
    """A test ran past --flysim-timeout (a BaseException, so a test's own `except Exception` cannot
    swallow it; the timer repeats every 5 s in case a handler does)."""


def _alarm(signum, frame):
    raise OverTime(f"over cap: test ran past the --flysim-timeout of {_STATE['timeout']} s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    import flysim

    shrink_timed_regions()  # a helper module the test imports late
    t = _STATE["timeout"]
    if t:
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, t, 5.0)
    try:
        with flysim.simulate(_STATE["arch"], check_waits=_STATE["check_waits"]) as sim:
            item._flysim_sim = sim
            yield
    finally:
        if t:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    out = yield
    rep = out.get_result()
    if rep.when == "call" or (rep.when == "setup" and not rep.passed):
        exc = call.excinfo
        text = exc.exconly() if exc is not None else ""
        cat, detail = categorize(rep, text, exc.type if exc is not None else None, item.nodeid)
        sim = getattr(item, "_flysim_sim", None)
        launches = sim.launches if sim is not None else []
        n = len(launches)
        _STATE["results"][item.nodeid] = {
            "category": cat, "detail": detail, "launches": n, "seconds": round(rep.duration, 2),
            "lane_ops": sum(r.lane_ops for r in launches), "sim_s": round(sum(r.wall_s for r in launches), 3),
            "split_launches": sum(1 for r in launches if r.counters.get("wave_split")),
            "kernels": sorted({r.kernel for r in launches})[:8]}
        rep.sections.append(("flysim", f"{cat}: {detail}"))
        if cat == "passed" and n == 0:  # a test that launched nothing proves nothing about flysim
            _STATE["results"][item.nodeid]["category"] = "passed (no launch)"


def summary(results, not_selected=None, collect=None):
    """Markdown: counts per category, per file, then each test that did not pass."""
    cats = ["passed", "passed (no launch)", "failed", "unsupported", "not applicable", "over cap", "skipped", "error",
            "not selected"]
    per_file = defaultdict(Counter)
    for nid, r in results.items():
        per_file[nid.split("::")[0]][r["category"]] += 1
    for f, n in (not_selected or {}).items():
        per_file[f]["not selected"] += n
    tot = Counter()
    for c in per_file.values():
        tot.update(c)
    lines = ["| file | " + " | ".join(cats) + " |", "|---|" + "---|" * len(cats)]
    for f in sorted(per_file):
        lines.append(f"| {f} | " + " | ".join(str(per_file[f][c]) for c in cats) + " |")
    lines.append("| **total** | " + " | ".join(str(tot[c]) for c in cats) + " |")
    lines.append("")
    for f, (cat, msg) in sorted((collect or {}).items()):
        lines.append(f"- `{f}` (whole file): {cat}: {msg}")
    for nid, r in sorted(results.items()):
        if r["category"] not in ("passed", "passed (no launch)"):
            lines.append(f"- `{nid}`: {r['category']}: {r['detail']}")
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter):
    res = _STATE["results"]
    if not res and not _STATE["collect"]:
        return
    from .launch import DECODED

    wall = time.perf_counter() - _STATE["t0"]
    launches = sum(r["launches"] for r in res.values())
    ops = sum(r.get("lane_ops", 0) for r in res.values())
    sim_s = sum(r.get("sim_s", 0.0) for r in res.values())
    rate = f"{ops / sim_s:.3g}" if sim_s else "-"
    text = (f"flysim {_STATE['arch']}, cap {_STATE['max_lanes']} lanes / {_STATE['timeout']} s, wall {wall:.0f} s; "
            f"{launches} launches, {ops:.3g} lane-ops in {sim_s:.0f} s of simulation ({rate} lane-ops/s), "
            f"{DECODED[0]} programs decoded\n\n" + summary(res, _STATE["not_selected"], _STATE["collect"]))
    terminalreporter.write_sep("=", "flysim")
    terminalreporter.write_line(text)
    if _STATE.get("report"):
        with open(_STATE["report"], "w") as f:
            f.write(text + "\n")
        with open(_STATE["report"] + ".json", "w") as f:
            json.dump({"arch": _STATE["arch"], "wall_s": wall, "launches": launches, "lane_ops": ops, "sim_s": sim_s,
                       "programs_decoded": DECODED[0], "results": res, "collect": _STATE["collect"],
                       "not_selected": dict(_STATE["not_selected"])}, f, indent=1)
