"""Child process of bench.models: time one model's translation stages in a fresh process.

    python -m bench._model_child <model> <arch>

The parent sets COMPILE_ONLY=1 and FLYDSL_RUNTIME_CACHE_DIR (empty for a cold run, filled by a
previous run for a warm one). Compiling = running the translated graph once on the `rocm`
backend under COMPILE_ONLY: every FlyDSL launch compiles its kernel to a code object and
returns without executing; the child counts FlyDSL's traces and its MLIR compiles (a warm
run traces each specialization once and compiles none: the artifacts come from the disk cache).
Verification runs on the `reference` backend (graph logic only; the
kernels' numerics are covered by the flysim tests). Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import time

import torch


def _count(counts, cls, attr, name):
    orig = getattr(cls, attr)
    fn = orig.__func__ if isinstance(cls.__dict__[attr], classmethod) else orig

    def counting(*a, **k):
        counts[name] += 1
        return fn(*a, **k)

    setattr(cls, attr, classmethod(counting) if isinstance(cls.__dict__[attr], classmethod) else counting)


def main(name, arch):
    t0 = time.perf_counter()
    from flydsl.compiler import jit_function as JF

    counts = {"traces": 0, "mlir_compiles": 0}
    _count(counts, JF.JitFunction, "_trace", "traces")
    _count(counts, JF.MlirCompiler, "compile", "mlir_compiles")
    from bench.models import build

    from translator import runtime, translate
    from translator.capture import capture
    from translator.graph import LowerCtx
    from translator.passes import run_pipeline
    import translator.lowerings  # noqa: F401  (fills the registry: its import time is measured here)

    model, inputs = build(name)
    t_import = time.perf_counter() - t0
    with torch.no_grad():
        t = time.perf_counter()
        cap = capture(model, tuple(inputs))
        t_capture = time.perf_counter() - t
        ctx = LowerCtx(gm=cap.gm, arch=arch, precision="fp32")
        t = time.perf_counter()
        run_pipeline(ctx)
        t_passes = time.perf_counter() - t
        gm = cap.gm
        flydsl_nodes = [n for n in gm.graph.nodes if "flydsl" in n.meta]
        t = time.perf_counter()
        with runtime.use_backend("rocm", arch):
            gm(*inputs)
        t_compile = time.perf_counter() - t
        compile_counts = dict(counts)
        t = time.perf_counter()
        tm = translate(model, tuple(inputs), arch=arch, backend="reference")
        t_verify = time.perf_counter() - t
    print(json.dumps(dict(model=name, import_s=t_import, capture_s=t_capture, passes_s=t_passes,
                          compile_s=t_compile, translate_verify_ref_s=t_verify, flydsl_ops=len(flydsl_nodes),
                          counters=ctx.counters, verified=bool(tm.report.verification.passed), **compile_counts)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
