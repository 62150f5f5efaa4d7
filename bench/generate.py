"""Host time per decode step and launches per token, LLM generation with a static KV cache.

    python -m bench.generate [--arch gfx942] [--repeat 50] [--tiny]

The model is models/_static_cache_decoder.py (gpt-fast's form: 2 layers, dim 128, 4 query / 2
key-value heads, cache [1, 2, 48, 32] per layer written with `cache[:, :, pos] = k`). It is
translated once (reference capture, no verification) and run on the rocm code path with the device
call recorded (translator.runtime.stub.rocm_recorded, as bench.host_overhead does): every FlyDSL op
walks the host path a GPU user runs, and ops that stay in PyTorch (the cache writes) run for real
on CPU tensors. One prefill (8 tokens) fills the cache; then each decode step (one token) is timed.
Outputs of recorded launches are uninitialized, so the decode tokens are fixed, not sampled.

Eager (measured, same run, interleaved): the same decode step of the eager model on CPU tensors,
its compute included (at dim 128 and one token it is a few microseconds per op).

Times are the calling thread's CPU time (time.thread_time_ns) with torch on one thread: the least
of `repeat` steps (a loaded host only adds), and the median per-pair ratio beside it. Goal: a
decode step <= 1.2x eager's host time. Launches per token: the recorded device calls of one decode
step (all FlyDSL kernels of the graph; the cache writes are not launches: they stay in PyTorch).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

GOAL = 1.2
ROOT = Path(__file__).resolve().parents[1]


def _decoder():
    spec = importlib.util.spec_from_file_location("_bench_static_cache_decoder",
                                                  ROOT / "models" / "_static_cache_decoder.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def measure(arch: str, repeat: int, tiny: bool) -> dict:
    from translator import translate
    from translator.runtime.stub import rocm_recorded

    D = _decoder()
    config = D.TINY if tiny else D.DEFAULT
    torch.manual_seed(0)
    model = D.Model("reshape", config).eval()
    prompt, pos = D.get_inputs(config)
    tm = translate(model, (prompt, pos), arch=arch, backend="reference", verify=False)
    tok = prompt[:, :1]
    t = prompt.shape[1]
    steps = [torch.tensor([t + i % (config.max_seq - t)]) for i in range(repeat + 3)]
    tm.backend = "rocm"  # translated without a GPU; inside rocm_recorded it walks the rocm path
    clock = time.thread_time_ns
    ours, eager = [], []
    with torch.no_grad():
        model(prompt, pos)
        with rocm_recorded(arch) as rec:
            t_cold = time.perf_counter()
            tm(prompt, pos)  # prefill: compiles every specialization once (or loads FlyDSL's disk cache)
            tm(tok, steps[0])  # the decode specializations
            t_cold = time.perf_counter() - t_cold
            rec.clear()
            tm(tok, steps[0])
            launches = len(rec)
            for p in steps:
                a = clock()
                model(tok, p)
                eager.append(clock() - a)
                a = clock()
                tm(tok, p)
                ours.append(clock() - a)
    ratios = [o / e for o, e in zip(ours, eager)]
    return {"config": config, "launches": launches, "ours_us": min(ours) / 1e3, "eager_us": min(eager) / 1e3,
            "median_ratio": statistics.median(ratios), "cold_s": t_cold,
            "flydsl_ops": sum(1 for r in tm.report.rows if r.where.startswith("flydsl")),
            "pytorch_ops": [r.op for r in tm.report.rows if r.where == "pytorch" and "no FlyDSL lowering" in r.detail]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.generate", description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="gfx942", choices=["gfx942", "gfx950"])
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--tiny", action="store_true", help="the test-sized decoder (1 layer, dim 64)")
    a = p.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        r = measure(a.arch, a.repeat, a.tiny)
    finally:
        torch.set_num_threads(threads)
    c = r["config"]
    print(f"static-cache decoder: {c.n_layer} layers, dim {c.dim}, {c.n_head} q / {c.n_kv_head} kv heads, "
          f"cache S_max {c.max_seq}; {a.arch}, rocm path with the device call recorded; CPU time, torch on 1 thread")
    print("| decode step | host us (least) | launches per token |")
    print("|---|---|---|")
    print(f"| translated (rocm path, recorded) | {r['ours_us']:.1f} | {r['launches']} |")
    print(f"| eager PyTorch (CPU, compute included) | {r['eager_us']:.1f} | - |")
    ratio = r["ours_us"] / r["eager_us"]
    print(f"ratio {ratio:.2f} (least over least), median per-pair {r['median_ratio']:.2f}; goal <= {GOAL}: "
          f"{'met' if ratio <= GOAL else 'not met'}")
    print(f"compute ops left in PyTorch without a lowering: {', '.join(r['pytorch_ops']) or 'none'}; "
          f"first prefill + decode (compile or disk cache) {r['cold_s']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
