"""Latency on a real AMD GPU, timed with device events (torch.cuda.Event on ROCm).

    python -m bench.rocm [--iters 50] [--only softmax,gemm] [--no-models]

Per kernel at the anchor shapes (bench.kernels.ANCHORS): our FlyDSL kernel vs the torch eager op
computing the same thing. Per model in models/: eager vs torch.compile (inductor) vs translated
(backend="rocm"). Each case: warm-up calls, then `iters` calls between two events; the median of
5 such repetitions is printed in microseconds per call.

Without a ROCm GPU (no `torch.version.hip` or no visible device) it prints that it needs one
and exits 0: nothing is simulated or estimated here (bench.kernels has the models).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from .kernels import ANCHORS
from .models import MODELS, build
from translator_kernels.measure.traffic import TD, run_ours


def rocm_available() -> bool:
    return bool(getattr(torch.version, "hip", None)) and torch.cuda.is_available()


def time_us(fn, iters: int) -> float:
    """Median over 5 repetitions of the mean device time of `iters` calls, in microseconds."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    reps = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        reps.append(start.elapsed_time(end) * 1000.0 / iters)
    return statistics.median(reps)


def eager_op(family, args):
    import torch.nn.functional as F

    if family == "softmax":
        return lambda: torch.softmax(args[0], -1)
    if family == "layer_norm":
        x, w, b = args
        return lambda: F.layer_norm(x, (x.shape[-1],), w.to(x.dtype), b.to(x.dtype))
    if family == "rms_norm":
        x, w = args
        return lambda: F.rms_norm(x, (x.shape[-1],), w)
    if family == "gemm":
        a, w = args
        return lambda: a @ w.T
    if family == "attention":
        q, k, v = args
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    raise ValueError(family)


def kernel_rows(only, iters):
    from translator_kernels.gemm import gemm
    from translator_kernels.gemm.preshuffle import shuffle_weight

    print(f"## Kernels on {torch.cuda.get_device_name()} (device events, us per call, median of 5 x {iters})\n")
    print("| kernel | shape | FlyDSL us | torch eager us | eager / FlyDSL |")
    print("|---|---|---|---|---|")
    for label, fam, dt, anchor, _ in ANCHORS:
        if only and fam not in only:
            continue
        from translator_kernels.measure.traffic import _inputs

        args = tuple(t.cuda() for t in _inputs(fam, dt, anchor))
        if fam == "gemm":  # weight preshuffled once, as the translator does at translation time
            a, w = args
            ws = shuffle_weight(w)
            ours = lambda: gemm(a, ws, w.shape[0], w.shape[1])  # noqa: E731
        else:
            ours = lambda: run_ours(fam, dt, args)  # noqa: E731
        t_ours, t_eager = time_us(ours, iters), time_us(eager_op(fam, args), iters)
        print(f"| {label} | {'x'.join(map(str, anchor))} | {t_ours:.1f} | {t_eager:.1f} | {t_eager / t_ours:.2f} |",
              flush=True)
    print()


def model_rows(iters):
    from translator import translate

    print("## Models (device events, us per call)\n")
    print("| model | eager us | torch.compile us | translated us | verified |")
    print("|---|---|---|---|---|")
    for name in MODELS:
        model, inputs = build(name)
        model = model.cuda()
        inputs = [t.cuda() for t in inputs]
        with torch.no_grad():
            tm = translate(model, tuple(inputs), backend="rocm", arch=_arch())
            compiled = torch.compile(model)
            row = [time_us(lambda f=f: f(*inputs), iters) for f in (model, compiled, tm)]
        print(f"| {name} | {row[0]:.1f} | {row[1]:.1f} | {row[2]:.1f} | {tm.report.verification.passed} |", flush=True)
    print()


def _arch() -> str:
    name = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    return "gfx950" if name.startswith("gfx95") else "gfx942"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rocm", description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--only", default="")
    p.add_argument("--no-models", action="store_true")
    a = p.parse_args(argv)
    if not rocm_available():
        why = "this torch is not a ROCm build" if not getattr(torch.version, "hip", None) else "no GPU is visible"
        print(f"bench.rocm needs a ROCm GPU (MI300X / MI355X) and {why}; nothing was timed. "
              "Run it on an AMD machine; `python -m bench.kernels` gives the GPU-free evidence.")
        return 0
    only = set(a.only.split(",")) - {""}
    kernel_rows(only, a.iters)
    if not a.no_models:
        model_rows(a.iters)
    return 0


if __name__ == "__main__":
    sys.exit(main())
