"""Per model in models/: how long translation takes, and what it saves (a traffic MODEL).

    python -m bench.models [--arch gfx942] [--only mini_gpt,mlp] [--no-gpt2]

Timing table (measured on this machine, CPU): each model runs twice in a fresh process
(bench._model_child) with COMPILE_ONLY=1 — first with an empty FlyDSL kernel cache (cold), then
with the cache the first run filled (warm): capture (torch.export), the pass pipeline, compiling
every FlyDSL kernel of the translated graph, and translate() with verification on the reference
backend. `gpt2_small_12L` is models/mini_gpt.py at GPT-2-small size (12 layers, 768 wide, 12
heads, sequence 128).

Traffic table (a MODEL, bench.roofline.graph_traffic): op-by-op HBM bytes and kernel counts of
the eager graph vs the translated graph, at each model's example inputs, with the op-by-op
roofline time on MI300X / MI355X. `gpt2_block_T1024` is one GPT-2-small block at sequence 1024,
where activations rather than weights dominate the bytes.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from . import roofline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["mlp", "small_cnn", "mini_gpt", "bert_layer", "vit_block", "llama_block"]


def build(name):
    """(model in eval mode, example inputs) for a models/ script or a named GPT-2-sized variant."""
    torch.manual_seed(0)
    if name.startswith("gpt2_"):
        from models import mini_gpt

        layers, t = (12, 128) if name == "gpt2_small_12L" else (1, 1024)
        model = mini_gpt.Model(768, 12, layers, max(1024, t), 0.0)
        return model.eval(), [torch.randn(1, t, 768)]
    m = importlib.import_module(f"models.{name}")
    return m.Model(*m.get_init_inputs()).eval(), list(m.get_inputs())


def time_model(name, arch):
    from flysim.toolchain import compile_env  # finds an ld.lld (or names the fix) without touching os.environ

    env = dict(os.environ, PYTHONPATH=ROOT)
    env.update(compile_env(arch))
    runs = []
    with tempfile.TemporaryDirectory() as cache:
        env["FLYDSL_RUNTIME_CACHE_DIR"] = cache
        for _ in ("cold", "warm"):
            t = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "bench._model_child", name, arch], env=env, cwd=ROOT,
                               capture_output=True, text=True)
            wall = time.perf_counter() - t
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            if p.returncode or not line:
                return f"failed: {(p.stderr.strip().splitlines() or ['?'])[-1][:160]}"
            runs.append(dict(json.loads(line[-1]), wall_s=wall))
    return runs


def timing_table(names, arch):
    print(f"## Translation timings (measured, CPU, COMPILE_ONLY, arch {arch})\n")
    print("| model | FlyDSL ops | run | capture s | passes s | compile kernels s | traces / MLIR compiles | "
          "capture+passes+compile s | translate+verify (reference) s | process wall s |")
    print("|" + "---|" * 10)
    for name in names:
        runs = time_model(name, arch)
        if isinstance(runs, str):
            print(f"| {name} | {runs} |" + " |" * 8)
            continue
        for label, r in zip(("cold", "warm"), runs):
            tot = r["capture_s"] + r["passes_s"] + r["compile_s"]
            print(f"| {name} | {r['flydsl_ops']} | {label} | {r['capture_s']:.2f} | {r['passes_s']:.2f} | "
                  f"{r['compile_s']:.2f} | {r['traces']} / {r['mlir_compiles']} | {tot:.2f} | {r['translate_verify_ref_s']:.2f}"
                  f"{'' if r['verified'] else ' (MISMATCH)'} | {r['wall_s']:.1f} |", flush=True)
    print()


def traffic_table(names, archs):
    print("## Op-by-op HBM traffic MODEL: eager graph vs translated graph (bench.roofline)\n")
    print("| model | eager kernels | translated kernels | eager MB | translated MB | translated/eager | "
          + " | ".join(f"{roofline.GPUS[a]['name']} eager us / translated us" for a in archs) + " |")
    print("|" + "---|" * (6 + len(archs)))
    for name in names:
        model, inputs = build(name)
        res = {a: roofline.model_traffic(model, inputs, a) for a in archs}
        e, t = res[archs[0]]["eager"], res[archs[0]]["translated"]
        times = " | ".join(f"{res[a]['eager']['t'] * 1e6:.2f} / {res[a]['translated']['t'] * 1e6:.2f}" for a in archs)
        print(f"| {name} | {e['kernels']} | {t['kernels']} | {e['bytes'] / 1e6:.3f} | {t['bytes'] / 1e6:.3f} | "
              f"{t['bytes'] / e['bytes']:.3f} | {times} |", flush=True)
    print()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.models", description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="gfx942", choices=sorted(roofline.GPUS))
    p.add_argument("--only", default="", help="comma-separated model names")
    p.add_argument("--no-gpt2", action="store_true", help="skip the GPT-2-sized variants")
    p.add_argument("--no-timing", action="store_true")
    a = p.parse_args(argv)
    names = a.only.split(",") if a.only else MODELS
    t0 = time.time()
    if not a.no_timing:
        timing_table(names + ([] if a.no_gpt2 or a.only else ["gpt2_small_12L"]), a.arch)
    traffic_table(names + ([] if a.no_gpt2 or a.only else ["gpt2_block_T1024"]), ["gfx942", "gfx950"])
    print(f"(bench.models: {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
