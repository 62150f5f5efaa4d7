"""Timing helpers in the style of FlyDSL's tests/test_common.py perftest (written here, no upstream
code): a memory probe launch, warm-up launches, then N timed launches under torch.profiler.
Under flysim.pytest_plugin the whole call must cost one launch."""

import torch
import torch.profiler as tpf


def run_iters(num_iters, func, *args, **kwargs):
    out = None
    for _ in range(num_iters):
        out = func(*args, **kwargs)
    return out


def run_iters_rotate(num_iters, func, rotate_args):
    out = None
    for i in range(num_iters):
        args, kwargs = rotate_args[i % len(rotate_args)]
        out = func(*args, **kwargs)
    return out


def device_memory_profiling(func, *args, **kwargs):
    size = sum(a.nbytes for a in args if isinstance(a, torch.Tensor)) + 1
    func(*args, **kwargs)
    return 2 * size, size, 0, 0


def get_trace_perf(prof, num_iters):
    assert num_iters > 1
    events = [e for e in prof.events() if "launch" in e.name]
    assert events, "the profiler recorded no launch"
    return sum(e.cpu_time_total for e in events) / num_iters


def run_perftest(func, *args, num_iters=20, num_warmup=3, **kwargs):
    used, size, _, _ = device_memory_profiling(func, *args, **kwargs)
    copies = max(0, min(num_iters, int((1 << 30) // max(used, 1))) - 1)
    rotate = [([a.clone() if isinstance(a, torch.Tensor) else a for a in args], kwargs) for _ in range(copies)]
    rotate.append((args, kwargs))
    run_iters(num_warmup, func, *args, **kwargs)
    with tpf.profile(activities=[tpf.ProfilerActivity.CPU]) as prof:
        with tpf.record_function("launch"):
            data = run_iters_rotate(num_iters, func, rotate)
    return data, get_trace_perf(prof, num_iters)
