"""Real-size translation: Llama-architecture models with random weights (transformers' LlamaConfig,
no download) at 0.3 B, 1.1 B and 3 B parameters, fp32 and bf16, one sequence of 64 tokens,
`translate(..., backend="reference", verify=True)`.

    python -m bench.scale                      # every point (the 1.1 B and 3 B ones take minutes)
    python -m bench.scale --only 0.3B-fp32     # one point (names: SIZE-DTYPE, as printed)
    python -m bench.scale --layers 4           # every point at 4 layers (a quick look)

Each point runs in its own child process (`python -m bench.scale --child NAME`), so its peak RSS is
its own. Per point it prints:
- translate time split (wall, and the process's CPU time over all its threads, which a machine
  shared with other jobs disturbs less): eager (the model's own forward), truth (the more exact run that
  verification judges against: fp32 for bf16, at once; fp64 for fp32, only if an output fails the fp32
  table, which it only widens: verify.Calibration; translator.truth), capture, passes,
  compile (precompile), verify (the translated forward and the comparison); and per layer;
- RSS: the model's weight bytes, the RSS with the model built (before translate), eager's own
  activation peak (one forward of the model over that), and translate's peak over the whole call,
  as a multiple of the weight bytes, with the peak of each stage (Linux's VmHWM, reset before each
  stage by writing 5 to /proc/self/clear_refs);
- the verdict, with eager's error and the translation's error against the truth (RMS relative).
Goals (issue 31): 1.1 B fp32 translated and verified in under 60 s within 1.5x its weight bytes
(plus eager's activation peak); 3 B bf16 translated and verified at all.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> LlamaConfig arguments (TinyLlama's shape for 1.1 B; a Llama-3.2-3B-like shape, 32 k vocabulary, for 3 B)
SIZES = {
    "0.3B": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=24, num_attention_heads=16,
                 num_key_value_heads=4),
    "1.1B": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                 num_key_value_heads=4),
    "3B": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
               num_key_value_heads=8),
}
POINTS = ["0.3B-fp32", "0.3B-bf16", "1.1B-fp32", "1.1B-bf16", "3B-bf16"]
SEQ = 64
GiB = 1 << 30


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def build(name: str, layers: int | None = None):
    import torch
    import transformers as T

    size, dtype = name.split("-")
    kw = dict(SIZES[size])
    if layers:
        kw["num_hidden_layers"] = layers
    torch.manual_seed(0)
    cfg = T.LlamaConfig(vocab_size=32000, max_position_embeddings=2048, **kw)
    cfg._attn_implementation = "sdpa"
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    old = torch.get_default_dtype()
    torch.set_default_dtype(dt)  # built in its dtype: no fp32 copy of a bf16 model on the way
    try:
        m = T.LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(old)
    ids = torch.randint(0, 32000, (1, SEQ))
    return m, (ids,), kw["num_hidden_layers"]


def child(name: str, layers: int | None) -> dict:
    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    import translator
    from translator import api
    from translator import progress

    m, inputs, n_layers = build(name, layers)
    weight_bytes = sum(t.numel() * t.element_size() for t in (*m.parameters(), *m.buffers()))
    rss_model = _status("VmRSS")
    _reset_peak()
    with torch.no_grad():
        m(*inputs)
    eager_act = max(0, _status("VmHWM") - rss_model)

    times: dict = {}
    cpu: dict = {}
    peaks: dict = {}

    def timed(key, fn):
        def run(*a, **k):
            _reset_peak()
            t, c = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                times[key] = times.get(key, 0.0) + time.perf_counter() - t
                cpu[key] = cpu.get(key, 0.0) + time.process_time() - c
                peaks[key] = max(peaks.get(key, 0), _status("VmHWM"))
        return run

    api._eager = timed("eager", api._eager)
    api.calibrate = timed("truth", api.calibrate)
    api.precompile = timed("compile", api.precompile)
    starts: dict = {}

    def listen(stage, done):
        if not done:
            _reset_peak()
            starts[stage] = (time.perf_counter(), time.process_time())
        else:
            times[stage] = times.get(stage, 0.0) + time.perf_counter() - starts[stage][0]
            cpu[stage] = cpu.get(stage, 0.0) + time.process_time() - starts[stage][1]
            peaks[stage] = max(peaks.get(stage, 0), _status("VmHWM"))

    token = progress._listener.set(listen)
    _reset_peak()
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        tm = translator.translate(m, inputs, backend="reference")
    finally:
        progress._listener.reset(token)
    total, total_cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = max([_status("VmHWM"), *peaks.values()])
    v = tm.report.verification
    c = v.outputs[0] if v.outputs else None
    return dict(point=name, layers=n_layers, params=sum(p.numel() for p in m.parameters()), weight_bytes=weight_bytes,
                rss_model=rss_model, eager_act=eager_act, peak=peak, peaks=peaks, total_s=total, times=times,
                total_cpu_s=total_cpu, cpu=cpu,
                passed=v.passed, message=v.message[:300], calibration=v.calibration,
                eager_rms_rel=getattr(c, "eager_rms_rel", None), truth_rms_rel=getattr(c, "truth_rms_rel", None),
                rms_rel_vs_eager=getattr(c, "rms_rel", None), bound=getattr(c, "bound", None))


def run_point(name: str, layers: int | None, timeout: int) -> dict:
    cmd = [sys.executable, "-m", "bench.scale", "--child", name] + (["--layers", str(layers)] if layers else [])
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(point=name, error=f"did not finish in {timeout} s")
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1]
        return dict(point=name, error=f"exit {p.returncode} after {time.perf_counter() - t:.0f} s: {tail[:300]}")
    return json.loads(lines[-1])


def show(r: dict) -> None:
    if "error" in r:
        print(f"{r['point']}: NOT RUN — {r['error']}")
        return
    w = r["weight_bytes"]
    t = r["times"]
    stages = ("eager", "truth", "capture", "passes", "compile", "verify")
    split = ", ".join(f"{k} {t[k]:.1f}" for k in stages if k in t)
    cpu = ", ".join(f"{k} {r['cpu'][k]:.1f}" for k in stages if k in r["cpu"])
    print(f"{r['point']}: {r['params'] / 1e9:.2f} B params, {r['layers']} layers, weights {w / GiB:.2f} GiB")
    print(f"  translate wall {r['total_s']:.1f} s ({split}); {r['total_s'] / r['layers']:.2f} s per layer")
    print(f"  translate CPU {r['total_cpu_s']:.1f} s, all threads ({cpu}); {r['total_cpu_s'] / r['layers']:.2f} s per layer")
    over = r["peak"] - r["rss_model"] + w  # the weights plus what translate added over the built model
    print(f"  RSS: model built {r['rss_model'] / GiB:.2f} GiB, eager activation peak {r['eager_act'] / GiB:.2f} GiB, "
          f"translate peak {r['peak'] / GiB:.2f} GiB = {r['peak'] / w:.2f}x weights "
          f"(weights + translate's growth: {over / w:.2f}x; goal <= 1.5x + eager's activations = "
          f"{(1.5 * w + r['eager_act']) / GiB:.2f} GiB: {'met' if r['peak'] <= 1.5 * w + r['eager_act'] else 'NOT met'})")
    print("  stage peaks (GiB): " + ", ".join(f"{k} {v / GiB:.2f}" for k, v in r["peaks"].items()))
    er, tr = r.get("eager_rms_rel"), r.get("truth_rms_rel")
    both = (f"eager {er:.3g}, translation {tr:.3g} RMS rel err against the truth" if er is not None and tr is not None
            else "no truth run")
    print(f"  verification: {'PASSED' if r['passed'] else 'FAILED'} — {both}; vs eager {r['rms_rel_vs_eager']:.3g}; "
          f"{r['bound']}; {r['calibration']}")
    if not r["passed"]:
        print(f"    {r['message']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", choices=POINTS, help="run only this point (repeatable)")
    p.add_argument("--layers", type=int, help="override the layer count (a quick look)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per point")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="one JSON line per point")
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.layers)))
        return 0
    print(f"bench.scale: Llama random init, seq {SEQ}, backend reference, verify=True; "
          f"{os.cpu_count()} cores; one child process per point")
    for name in a.only or POINTS:
        r = run_point(name, a.layers, a.timeout)
        print(json.dumps(r)) if a.json else show(r)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
