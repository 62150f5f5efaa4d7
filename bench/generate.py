"""Host time per decode step and launches per token, LLM generation with a static KV cache.

    python -m bench.generate [--arch gfx942] [--repeat 50] [--tiny]
    torchrun --nproc-per-node 2 -m bench.generate --tp      # tensor parallel, one rank per GPU (RCCL on ROCm)

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
step (all FlyDSL kernels of the graph, the cache writes among them: flydsl.cache_write, the scatter
kernel, in place).

MODEL (no GPU here, labeled as such): the HBM limit of one decode step of Llama-3-8B (bf16 weights
and KV cache) on MI300X and MI355X, batch 1 / 16 / 64 at context 2k / 8k: every weight but the
embedding table read once per step, plus every sequence's K and V up to its context, over the
vendor's peak bandwidth from translator_kernels/arch.py (the one hardware table), and over the measured
streaming bandwidth (arch.STREAM_MEASURED: 0.81 of the peak, the seed's vec_add on MI350X). What a
decode step can cost at best; the issue's goal is >= 0.8 of it at batch 1 (the vendor peak's is the
limit the issue's formula names; both are printed), to be measured on the GPU.
Beside it, our kernels' MODEL time per decode step (`model_rows`): the launches one layer makes
(docs/llama-layer.md's 8, the K and V cache writes inside RoPE's launch; the split-KV combine where
translator_kernels.attention.split_geometry splits) x 32, plus the final norm, LM head and embedding
gather, each timed by the calibrated timing MODEL (translator_kernels.timing, its CALIBRATION line
printed): GEMMs at the tile tiles.choose_config picks for M = batch, through tiles.model_estimate
(features estimated from the tile, no compile); RMSNorm on the cached features of upstream's kernel
(translator_kernels/measure/calibration_isa.json); the fused RoPE + cache-write launch on the features
of our kernel compiled for the arch (a COMPILE_ONLY child, ~10-20 s per arch); decode attention, the
combine and the gather as bandwidth floors (launch floor + bytes at the fitted achievable bandwidth:
the model has no features for them without compiling), said so per row. The 'before' columns price
the launch list before that fusion (RoPE q, RoPE k, two cache writes: bandwidth floors). Each step is
priced three ways: with the fitted per-launch floor T_LAUNCH (12 us, one kernel replayed alone),
graph-replayed (GRAPH_LAUNCH per launch, 1.7 us measured back to back in one HIP graph: an upper
bound of the gap), and kernels alone; the fraction limit / MODEL for each, against both limits.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch
from dataclasses import dataclass

GOAL = 1.2
ROOT = Path(__file__).resolve().parents[1]


def _decoder():
    spec = importlib.util.spec_from_file_location("_bench_static_cache_decoder",
                                                  ROOT / "models" / "_static_cache_decoder.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@dataclass(frozen=True)
class LlmShape:
    """A decoder's shapes: what its decode step reads."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False
    bytes_per_elem: int = 2  # bf16 weights and KV cache

    def weight_bytes(self) -> int:
        """Bytes a decode step reads of the weights: every layer's projections and MLP, the final norm and the
        LM head (the embedding table is read at batch rows only: not counted)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        layer = h * (q + 2 * kv) + q * h + 3 * h * self.intermediate + 2 * h
        return (self.layers * layer + h + self.vocab * h) * self.bytes_per_elem

    def kv_bytes(self, batch: int, context: int) -> int:
        """K and V of every layer, read up to `context` per sequence."""
        return batch * context * self.layers * 2 * self.kv_heads * self.head_dim * self.bytes_per_elem


LLAMA3_8B = LlmShape("Llama-3-8B", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336,
                     vocab=128256)


def hbm_limit_rows(shape: LlmShape = LLAMA3_8B, batches=(1, 16, 64), contexts=(2048, 8192)) -> list[dict]:
    """MODEL: per GPU, batch and context, the decode step's bytes and its time at peak HBM bandwidth."""
    from translator_kernels.arch import GPUS, STREAM_MEASURED

    rows = []
    for arch, g in GPUS.items():
        for b in batches:
            for ctx in contexts:
                w, kv = shape.weight_bytes(), shape.kv_bytes(b, ctx)
                step = (w + kv) / g.hbm_bytes_per_s
                rows.append(dict(gpu=g.gpu, arch=arch, batch=b, context=ctx, weight_gb=w / 1e9, kv_gb=kv / 1e9,
                                 bandwidth_tb=g.hbm_bytes_per_s / 1e12, step_ms=step * 1e3, tokens_s=b / step,
                                 streaming_ms=step / STREAM_MEASURED * 1e3))
    return rows


def print_model_table(rows) -> None:
    from translator_kernels.arch import STREAM_MEASURED

    print(f"\nMODEL (not measured): {LLAMA3_8B.name} decode step at the HBM limit (weight bytes + KV bytes over "
          "bandwidth, bf16), at the vendor's peak (translator_kernels/arch.py) and at the measured streaming bandwidth "
          f"({STREAM_MEASURED:.2f} of it: the seed's vec_add on MI350X, 6468 GB/s; MI300X assumed the same fraction)")
    print("| GPU | batch | context | weights GB | KV GB | HBM TB/s (vendor) | ms per step at vendor peak | tokens/s | "
          "ms per step at measured streaming |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['gpu']} ({r['arch']}) | {r['batch']} | {r['context']} | {r['weight_gb']:.2f} | {r['kv_gb']:.2f} | "
              f"{r['bandwidth_tb']:.1f} | {r['step_ms']:.2f} | {r['tokens_s']:.0f} | {r['streaming_ms']:.2f} |")


# ---- MODEL: our kernels' time per decode step, against the HBM limit ------------------------------
def _floor_launch(name: str, nbytes: float, arch: str) -> dict:
    """A launch the model has no features for: its launch floor plus its HBM bytes at the achievable
    bandwidth (the fitted efficiency x the vendor peak): a bandwidth floor, optimistic."""
    from translator_kernels.arch import GPUS

    g = GPUS[arch]
    t_mem = nbytes / (g.timing["hbm_efficiency"] * g.hbm_bytes_per_s)
    return dict(name=name, t=g.timing["launch_s"] + t_mem, kernel_t=t_mem, how="bandwidth floor")


def _gemm_launch(name: str, m: int, n: int, k: int, arch: str) -> dict:
    """Our GEMM at the tile the heuristic picks for M = batch (tiles.choose_config), timed by the MODEL
    on features estimated from that tile (tiles.model_estimate: no compile)."""
    from translator_kernels.gemm.tiles import choose_config, m_bucket, model_estimate

    c = choose_config(m_bucket(m), n, k, "bf16", arch)
    e = model_estimate(m, n, k, "bf16", arch, c)
    return dict(name=name, t=e["t"], kernel_t=e["kernel_t"],
                how=f"GEMM {c.bm}x{c.bn}x{c.bk} kw{c.kw} s{c.split}, MODEL (estimated features)")


def _norm_launch(name: str, rows: int, hidden: int, arch: str) -> dict:
    """RMSNorm over `rows` rows: the MODEL on the cached features of upstream's RMSNorm at n = hidden
    (translator_kernels/measure/calibration_isa.json, compiled for gfx950: gfx942 takes them too)."""
    from translator_kernels.arch import GPUS
    from translator_kernels.measure.calibration import load_features
    from translator_kernels.timing import KernelFeatures, Launch, launch_time

    feat = KernelFeatures(**load_features()[f"rms_norm:n={hidden}"])
    r = launch_time(feat, Launch(rows, 1, 2 * rows * hidden * 2 + hidden * 2), arch)
    return dict(name=name, t=r["t"], kernel_t=r["t"] - GPUS[arch].timing["launch_s"],
                how="MODEL (cached RMSNorm features, upstream's kernel)")


_ROPE_FEATURES: dict = {}  # arch -> KernelFeatures of the fused RoPE + cache-write kernel, or the compile error


def _rope_cache_launch(batch: int, shape: LlmShape, context: int, arch: str) -> dict:
    """RoPE q + k and the K / V cache writes, one launch (translator_kernels/layout/rope_cache.py): the MODEL on
    the features of the kernel compiled for `arch` (COMPILE_ONLY in a child, once per arch at batch 1: the
    instruction mix does not depend on the batch; grid and bytes do), else a bandwidth floor, labelled."""
    from translator_kernels.layout.rope_cache import DECODE_STEP, decode_step_launch

    args = (batch, shape.heads, shape.kv_heads, shape.head_dim, context)
    name = "RoPE q + k, K / V cache writes (one kernel)"
    feat = _ROPE_FEATURES.get(arch)
    if feat is None:
        from translator_kernels.hotloop import compile_isa_texts, main_text
        from translator_kernels.timing import features

        try:
            feat = features(main_text(compile_isa_texts(DECODE_STEP, (1, *args[1:]), arch=arch)), arch)
        except Exception as e:  # noqa: BLE001 - no toolchain: the floor below, said so
            feat = f"{type(e).__name__}: {str(e)[:80]}"
        _ROPE_FEATURES[arch] = feat
    grid, nbytes = decode_step_launch(*args)
    if isinstance(feat, str):
        return dict(_floor_launch(name, nbytes, arch), how=f"bandwidth floor (no compile: {feat})")
    from translator_kernels.arch import GPUS
    from translator_kernels.timing import Launch, launch_time

    r = launch_time(feat, Launch(grid, 1, nbytes), arch)
    return dict(name=name, t=r["t"], kernel_t=r["t"] - GPUS[arch].timing["launch_s"],
                how="MODEL (features of our compiled kernel)")


def decode_step_launches(arch: str, batch: int, context: int, shape: LlmShape = LLAMA3_8B,
                         fused_rope: bool = True) -> list[dict]:
    """The launches of one decode step (one token per sequence) of `shape` on our kernels: per layer the 8
    of docs/llama-layer.md (RoPE q, k and the K / V cache writes one launch; `fused_rope=False`: the 9 +
    2 cache writes before it, bandwidth floors) and the split-KV combine where attention splits, x layers;
    then the final norm, the LM head and the embedding gather. Each with its MODEL time."""
    from translator_kernels.attention import split_geometry

    e = shape.bytes_per_elem
    h, d, q, kv = shape.hidden, shape.head_dim, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    rope_table = 2 * d * e  # cos and sin rows of this position
    nsplit, _ = split_geometry(batch, shape.heads, 1, context, d, "bf16", arch)
    rope = [_rope_cache_launch(batch, shape, context, arch)] if fused_rope else [
        _floor_launch("RoPE q", 2 * batch * q * e + rope_table, arch),
        _floor_launch("RoPE k", 2 * batch * kv * e + rope_table, arch),
        _floor_launch("cache write K", 2 * batch * kv * e, arch),
        _floor_launch("cache write V", 2 * batch * kv * e, arch)]
    layer = [
        _norm_launch("RMSNorm (attention)", batch, h, arch),
        _gemm_launch("QKV GEMM", batch, q + 2 * kv, h, arch),
        *rope,
        # K and V read once per sequence (the query heads of a KV group share it through L2), q in, out
        _floor_launch(f"decode attention (split {nsplit})", shape.kv_bytes(batch, context) // shape.layers
                      + 2 * batch * q * e + (nsplit > 1) * nsplit * batch * shape.heads * (d + 2) * 4, arch),
    ]
    if nsplit > 1:
        layer.append(_floor_launch("split-KV combine", nsplit * batch * shape.heads * (d + 2) * 4 + batch * q * e,
                                   arch))
    layer += [
        _gemm_launch("O projection (+ residual)", batch, h, q, arch),
        _norm_launch("RMSNorm (MLP)", batch, h, arch),
        _gemm_launch("gated MLP GEMM (gate + up)", batch, 2 * shape.intermediate, h, arch),
        _gemm_launch("down projection (+ residual)", batch, h, shape.intermediate, arch),
    ]
    step = [dict(r, count=shape.layers) for r in layer]
    step += [dict(_floor_launch("embedding gather", batch * h * e * 2, arch), count=1),
             dict(_norm_launch("RMSNorm (final)", batch, h, arch), count=1),
             dict(_gemm_launch("LM head", batch, shape.vocab, h, arch), count=1)]
    return step


def model_rows(shape: LlmShape = LLAMA3_8B, batches=(1, 16, 64), contexts=(2048, 8192), fused_rope: bool = True) -> list[dict]:
    """hbm_limit_rows with our kernels' MODEL time per decode step beside the limit: with every launch's
    fitted launch floor (T_LAUNCH, one kernel replayed alone), and the kernels alone (that floor left out)."""
    from translator_kernels.arch import GPUS

    rows = []
    for r in hbm_limit_rows(shape, batches, contexts):
        launches = decode_step_launches(r["arch"], r["batch"], r["context"], shape, fused_rope)
        t = sum(x["t"] * x["count"] for x in launches)
        kt = sum(x["kernel_t"] * x["count"] for x in launches)
        floors = sum(x["count"] for x in launches if x["how"].startswith("bandwidth floor"))
        n = sum(x["count"] for x in launches)
        tg = kt + n * GPUS[r["arch"]].timing["graph_launch_s"]  # graph-replayed: the measured per-launch upper bound
        limit, streaming = r["step_ms"] * 1e-3, r["streaming_ms"] * 1e-3
        eff = GPUS[r["arch"]].timing["hbm_efficiency"]
        rows.append(dict(r, limit_us=limit * 1e6, streaming_us=streaming * 1e6, model_us=t * 1e6, graph_us=tg * 1e6,
                         kernels_us=kt * 1e6, fraction=limit / t, graph_fraction=limit / tg, kernels_fraction=limit / kt,
                         streaming_fraction=streaming / t, streaming_graph_fraction=streaming / tg,
                         streaming_kernels_fraction=streaming / kt, of_model_cap=limit / eff / kt, launches=n,
                         floors=floors))
    return rows


def print_ours_table(rows, before=None, breakdown=("gfx942", 1, 8192)) -> None:
    from translator_kernels.arch import GPUS, STREAM_MEASURED
    from translator_kernels.timing import CALIBRATION

    t0 = GPUS["gfx950"].timing
    print(f"\nMODEL (not measured): our kernels' time per decode step of {LLAMA3_8B.name} (bf16; one token per "
          "sequence), translator_kernels.timing; calibration: " + CALIBRATION)
    print(f"gfx942 has no measured point: it takes gfx950's fitted constants (an extrapolation). Three prices per launch: "
          f"'alone' = T_LAUNCH ({t0['launch_s'] * 1e6:.0f} us, one kernel replayed alone, what the calibration's "
          f"measurements time) + the kernel; 'graph' = GRAPH_LAUNCH ({t0['graph_launch_s'] * 1e6:.1f} us, measured "
          "back to back in one HIP graph on MI350X, an upper bound of the gap) + the kernel: a decode step replayed as one "
          "graph; 'kernels' = the kernels alone (no gap at all, a lower bound). Two limits: 'vendor' = weights + KV over the "
          f"vendor's peak HBM bandwidth; 'streaming' = over the measured streaming bandwidth ({STREAM_MEASURED:.2f} of the "
          "peak, the seed's vec_add). fraction = limit / MODEL; issue 23's goal: >= 0.8 at batch 1. cap = the vendor limit "
          f"at the model's fitted streaming cap ({t0['hbm_efficiency']:.2f} of the peak, the most it lets any kernel "
          "stream) / kernels. The fused RoPE + cache-write launch is priced on its compiled ISA's features; attention, its "
          "combine and the embedding gather have no features here: bandwidth floors (optimistic). 'before' = the launch "
          "list of a layer in 9 launches + 2 cache writes (RoPE q, RoPE k, the K and V scatters apart, bandwidth floors).")
    print("| GPU | batch | context | limit us: vendor / streaming | MODEL us: alone / graph / kernels | "
          "fraction of vendor: alone / graph / kernels | fraction of streaming: alone / graph / kernels | cap | "
          "fraction before (alone, vendor) | launches | before | of them bandwidth floors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        b = before[i] if before else None
        print(f"| {r['gpu']} ({r['arch']}) | {r['batch']} | {r['context']} | {r['limit_us']:.0f} / "
              f"{r['streaming_us']:.0f} | {r['model_us']:.0f} / {r['graph_us']:.0f} / {r['kernels_us']:.0f} | "
              f"{r['fraction']:.2f} / {r['graph_fraction']:.2f} / {r['kernels_fraction']:.2f} | "
              f"{r['streaming_fraction']:.2f} / {r['streaming_graph_fraction']:.2f} / "
              f"{r['streaming_kernels_fraction']:.2f} | {r['of_model_cap']:.2f} | "
              f"{b['fraction'] if b else float('nan'):.2f} | {r['launches']} | {b['launches'] if b else '-'} | "
              f"{r['floors']} |")
    arch, b, ctx = breakdown
    print(f"\nMODEL per launch, {GPUS[arch].gpu} ({arch}), batch {b}, context {ctx}:")
    print("| launch | how | x | MODEL us each | kernel us each | MODEL us per step |")
    print("|---|---|---|---|---|---|")
    for x in decode_step_launches(arch, b, ctx):
        print(f"| {x['name']} | {x['how']} | {x['count']} | {x['t'] * 1e6:.1f} | {x['kernel_t'] * 1e6:.1f} | "
              f"{x['t'] * x['count'] * 1e6:.0f} |")


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


def tensor_parallel(new_tokens: int = 8) -> int:
    """One rank of `torchrun ... -m bench.generate --tp`: the decoder sharded over the ranks (heads and MLP
    split, all_reduce in forward hooks: models/_static_cache_decoder.shard), translated on this rank's device
    (rocm where a GPU is visible, else flysim on CPU), greedy tokens against this rank's eager."""
    import dataclasses
    import os

    import torch.distributed as dist
    from translator import translate

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gpu = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if gpu else "gloo")  # nccl is RCCL on a ROCm build of torch
    try:
        D = _decoder()
        c = dataclasses.replace(D.DEFAULT, n_head=2 * world, n_kv_head=world, dim=32 * 2 * world,
                                intermediate=96 * world)
        torch.manual_seed(0)
        model = D.shard(D.Model("view", c).eval(), rank, world).to(device)
        prompt, pos = (t.to(device) for t in D.get_inputs(c))
        want = D.generate(model, prompt, new_tokens)
        D.reset_caches(model)
        tm = translate(model, (prompt, pos), backend="auto" if gpu else "flysim")
        got = D.generate(tm, prompt, new_tokens)
        collectives = sum(1 for n in tm.gm.graph.nodes if "all_reduce" in str(n.target))
        print(f"rank {rank}/{world} on {device}: verification {'passed' if tm.report.verification.passed else 'FAILED'}, "
              f"{collectives} all_reduce in the graph, tokens {'equal' if got == want else 'DIFFER'} "
              f"(translated {got}, eager {want})", flush=True)
        return 0 if got == want and tm.report.verification.passed else 1
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.generate", description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="gfx942", choices=["gfx942", "gfx950"])
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--tiny", action="store_true", help="the test-sized decoder (1 layer, dim 64)")
    p.add_argument("--tp", action="store_true", help="tensor parallel under torchrun (one rank per process)")
    a = p.parse_args(argv)
    if a.tp:
        return tensor_parallel()
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
    print_model_table(hbm_limit_rows())
    print_ours_table(model_rows(), model_rows(fused_rope=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
