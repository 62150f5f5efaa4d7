"""Measured bf16 decode GEMMs on an MI355X (gfx950) from a public source, against the timing MODEL: validation only.

The points (blog_gemm_points.json beside this module) are the latencies printed in Figures 6 and 9 of the ROCm
blog "Accelerating LLM Inference on AMD GPUs with Low-Latency GEMMs" (29 Jun 2026, github.com/ROCm/rocm-blogs, the
figures' SVG text): Figure 6, K = 7168, N = 64 / 384 / 512 / 1024, no bias; Figure 9, six bf16 model-shape families
(N = 128..5120, K = 2048..7168, bias or not); M = 1..128 in both. Per shape: the latency of AITER's FlyDSL split-K
GEMM (aiter/ops/flydsl/kernels/splitk_hgemm.py at AITER eb57cf26) and of the fastest of hipBLASLt, AITER Triton
and AITER ASM. The JSON names the figures, their commits and the software; tests/unit/test_calibration_blog.py
checks ten cells against the SVG text and all 80 against the printed speedups.

How they were timed (an inference: the blog names no harness). AITER's benchmark harness (aiter/test_common.py
`perftest`, eb57cf26) reports the device time of the kernels a call launches, from the torch profiler's trace, over
101 iterations whose inputs rotate through copies sized to exceed the L2 (cold operands, no launch or host time).
The smallest cell (N = 64, M = 1: 0.9 MB of weights, 4.6 us) is far above a launch-and-sync harness's floor
(T_LAUNCH, 12 us, the profiling study's CUDA-graph replay) and far above its HBM time (0.2 us): a device-time
floor of about 4.5 us for one split-K launch. So the time to compare is the MODEL's `kernel_t` (T_LAUNCH left out)
plus T_DEVICE (`device_launch_s`: the per-launch device-side time, dispatch to drain and the split-K protocol), fitted
here (`fit_device`) on every other priced point (`roles`) and validated on the rest (`summary`, `device_line`: the
part of timing.CALIBRATION these points give).

The MODEL runs on the measured kernel itself: `compile_entry` builds AITER's `compile_hgemm_kernel` for gfx950 from
an AITER checkout named by $AITER_SRC (nothing of AITER is copied here), with flydsl 0.5.0 and three API moves
bridged at run time (AITER pins flydsl 0.1.9.dev599): `flydsl.expr.buffer_ops` is $FLYDSL_SRC's
kernels/common/buffer_ops, `flydsl.expr.vector` is FlyDSL's own expr/vector.py read from $FLYDSL_SRC's git history
(the commit before it was removed, 7dac0826^), and `SMEM_CAPACITY_MAP` comes from flydsl.runtime.device. The
per-shape config is the flydsl kernel AITER's tuner chose at that shape (aiter/configs/model_configs/
*_bf16_tuned_gemm.csv, the `aiter_tuned` field): the blog does not publish its configs, so this is an assumption,
and shapes whose tuned winner is another backend have no config (those rows print our own GEMM's MODEL time beside
the best measured time instead: a sanity check, not validation). `prefetch` is STAGES - 1, the K tiles the
kernel's LDS ring keeps in flight (as tiles.model_estimate sets it for ours: the ISA parse does not find it); the
loops without an MFMA (the split-K spin-waits) run no iteration. Features are cached in blog_gemm_isa.json
(`python -m bench.calibration --blog-refresh` with AITER_SRC and FLYDSL_SRC set).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import re
import subprocess
import sys
import types

from translator_kernels.arch import GPUS
from translator_kernels.timing import KernelFeatures, Launch, gemm_hbm_bytes, iterations_for, launch_time, xcd_reread_bytes

ARCH = "gfx950"
HERE = os.path.dirname(os.path.abspath(__file__))
POINTS_FILE = os.path.join(HERE, "blog_gemm_points.json")
CACHE = os.path.join(HERE, "blog_gemm_isa.json")
VECTOR_REV = "7dac0826^"  # the last FlyDSL commit with python/flydsl/expr/vector.py
_NAME = re.compile(r"^flydsl_gemm(?P<stages>\d+)_abf16_wbf16_bf16_t(?P<tm>\d+)x(?P<tn>\d+)x(?P<tk>\d+)_split_k(?P<sk>\d+)"
                   r"_block_m_warp(?P<wm>\d+)_block_n_warp(?P<wn>\d+)(?:_block_k_warp(?P<wk>\d+))?_async_copyTrue"
                   r"_b_to_lds(?P<blds>True|False)_b_preshuffleFalse_c_to_ldsFalse_gfx950$")


def load_points() -> dict:
    with open(POINTS_FILE) as f:
        return json.load(f)


def load_features() -> dict:
    if not os.path.exists(CACHE):
        return {}
    with open(CACHE) as f:
        return json.load(f)


def config_of(kernel_name: str) -> dict:
    """compile_hgemm_kernel's parameters from an AITER tuned-CSV kernel name."""
    g = _NAME.match(kernel_name)
    if not g:
        raise ValueError(f"not a splitk_hgemm bf16 kernel name: {kernel_name}")
    return dict(TILE_M=int(g["tm"]), TILE_N=int(g["tn"]), TILE_K=int(g["tk"]), STAGES=int(g["stages"]),
                SPLIT_K=int(g["sk"]), BLOCK_M_WARPS=int(g["wm"]), BLOCK_N_WARPS=int(g["wn"]),
                BLOCK_K_WARPS=int(g["wk"] or 1), B_TO_LDS=g["blds"] == "True")


def config_label(c: dict) -> str:
    return (f"{c['TILE_M']}x{c['TILE_N']}x{c['TILE_K']} st{c['STAGES']} sk{c['SPLIT_K']} "
            f"w{c['BLOCK_M_WARPS']}x{c['BLOCK_N_WARPS']}x{c['BLOCK_K_WARPS']}{' B->LDS' if c['B_TO_LDS'] else ''}")


def compile_key(n: int, k: int, bias: bool, c: dict) -> str:
    return f"splitk_hgemm:n={n},k={k},bias={int(bias)}," + ",".join(f"{a}={int(b)}" for a, b in sorted(c.items()))


# ---- the compile (runs in translator_kernels.isa's child, COMPILE_ONLY) -------------------------
def _bridge_flydsl_api(flydsl_src: str) -> None:
    """Point the three names AITER eb57cf26 imports and flydsl 0.5.0 moved at their current homes."""
    import flydsl.expr as fx
    import flydsl.runtime.device as device
    import flydsl.utils.smem_allocator as smem

    sys.path.insert(0, flydsl_src)
    from kernels.common import buffer_ops

    fx.buffer_ops = buffer_ops
    sys.modules["flydsl.expr.buffer_ops"] = buffer_ops
    text = subprocess.run(["git", "-C", flydsl_src, "show", f"{VECTOR_REV}:python/flydsl/expr/vector.py"],
                          capture_output=True, text=True, check=True).stdout
    vec = types.ModuleType("flydsl.expr.vector")
    vec.__package__, vec.__file__ = "flydsl.expr", f"<FlyDSL {VECTOR_REV} python/flydsl/expr/vector.py>"
    sys.modules[vec.__name__] = vec
    exec(compile(text, vec.__file__, "exec"), vec.__dict__)  # noqa: S102 - FlyDSL's own module, from its history
    fx.vector = vec
    smem.SMEM_CAPACITY_MAP = device.SMEM_CAPACITY_MAP


def compile_entry(n: int, k: int, bias: bool, c: dict) -> None:
    """Build AITER's splitk_hgemm for (n, k, bias, config) and call its launcher with null pointers: under
    COMPILE_ONLY that compiles (and dumps the ISA) without touching memory."""
    aiter, fly = os.environ.get("AITER_SRC"), os.environ.get("FLYDSL_SRC")
    if not aiter or not fly:
        raise LookupError("AITER_SRC (an AITER checkout, eb57cf26) and FLYDSL_SRC (a FlyDSL git checkout) must be set")
    _bridge_flydsl_api(fly)
    import flydsl.compiler as flyc
    import flydsl.expr as fx

    pkg = types.ModuleType("aiter_flydsl_kernels")  # the kernels folder alone: importing aiter needs a GPU build
    pkg.__path__ = [os.path.join(aiter, "aiter", "ops", "flydsl", "kernels")]
    sys.modules[pkg.__name__] = pkg
    from aiter_flydsl_kernels.splitk_hgemm import compile_hgemm_kernel

    fn = compile_hgemm_kernel("bf16", n, k, HAS_BIAS=bias, **c)
    null = lambda: flyc.from_c_void_p(fx.Uint8, 0)  # noqa: E731
    fn(null(), null(), null(), null(), c["TILE_M"], null(), null(), fx.Stream(None))


def kernel_features(text: str) -> dict:
    """The MODEL features of one compiled splitk_hgemm, its loops without an MFMA skipped: those are the split-K
    spin-waits (partitions > 0 wait for partition 0's signal), which the MODEL prices at no iteration. Left in,
    they become the "hot loop" of the configs whose K loop the compiler unrolled completely (K / SPLIT_K / TILE_K
    close to STAGES), and the whole K reduction is then priced as straight-line code behind a 4-instruction loop."""
    from translator_kernels.hotloop import find_loops
    from translator_kernels.timing import features, parse_isa

    kernel = max(parse_isa(text, ARCH), key=lambda st: st.instructions).kernel
    waits = tuple(lp.header for lp in find_loops(text, kernel) if lp.cycles(ARCH)["matrix_cycles"] == 0)
    return dict(features(text, ARCH, skip=waits).to_dict(), skipped_loops=len(waits))


def refresh() -> dict:
    """Compile every distinct (N, K, bias, config) of the points for gfx950 and cache its MODEL features."""
    from translator_kernels.hotloop import compile_isa_texts, main_text

    cache = {}
    for r in load_points()["rows"]:
        if "aiter_tuned" not in r:
            continue
        c = config_of(r["aiter_tuned"]["kernel"])
        key = compile_key(r["n"], r["k"], r["bias"], c)
        if key in cache:
            continue
        try:
            text = main_text(compile_isa_texts("translator_kernels.measure.blog_gemm:compile_entry",
                                               (r["n"], r["k"], r["bias"], c), arch=ARCH))
            cache[key] = kernel_features(text)
        except Exception as e:  # noqa: BLE001 - a kernel that does not compile is reported, not hidden
            cache[key] = {"error": str(e).splitlines()[-1][:300]}
        print(f"  compiled {key}: {cache[key]}", file=sys.stderr, flush=True)
    with open(CACHE, "w") as f:
        json.dump(cache, f, indent=1, sort_keys=True)
    return cache


# ---- the MODEL at each point ---------------------------------------------------------------------
def launch_of(m: int, n: int, k: int, c: dict, feat: KernelFeatures, arch: str = ARCH) -> Launch:
    """splitk_hgemm's launch: grid (ceil(M / TILE_M) x N / TILE_N, SPLIT_K), column tiles first in x; each
    workgroup runs K / SPLIT_K of one tile. HBM: A and W once (with the L2 / LLC reuse rule of the other GEMM
    rows), C once; the split partials are atomics into C in the L2 (not priced as HBM bytes)."""
    g = GPUS[arch]
    bm, bn, sk = c["TILE_M"], c["TILE_N"], c["SPLIT_K"]
    grid = -(-m // bm) * (n // bn) * sk
    slots = g.cus * max(1, feat.waves_per_simd * g.simds // feat.waves_per_wg)
    hbm = gemm_hbm_bytes(m, n, k, 2, 2, 2, bm, bn, slots, g.llc_bytes)
    return Launch(grid, iterations_for(2 * bm * bn * (k // sk), feat), hbm, 2.0 * m * n * k,
                  xcd_reread_bytes(m, n, k, 2, 2, bm, bn, g.xcds, sk, rows_first=False), grid * (bm + bn) * (k // sk) * 2)


def roles(points: list | None = None) -> list:
    """Each point's role: the priced points (a tuned FlyDSL config) in the file's order alternate, validation first,
    so every other one (the second, fourth, ...) fits T_DEVICE and the rest validate; a point without a config has
    none (None)."""
    out, i = [], 0
    for p in (load_points()["rows"] if points is None else points):
        if "aiter_tuned" not in p:
            out.append(None)
            continue
        out.append("fit" if i % 2 == 1 else "validation")
        i += 1
    return out


def evaluate(feats: dict | None = None, consts: dict | None = None, ours: bool = True) -> list[dict]:
    """One row per point: the measured FlyDSL and best-baseline times, and, where AITER's tuner chose a FlyDSL config,
    the MODEL of a device-timed launch of it, `kernel_t` + T_DEVICE (`model_us`; ratio = MODEL / measured FlyDSL) and
    its role (fit / validation, `roles`); where it did not, our GEMM's MODEL time (`ours_*`; skipped with ours=False)."""
    from translator_kernels.gemm import choose_config, m_bucket
    from translator_kernels.gemm.tiles import model_estimate

    feats = load_features() if feats is None else feats
    g = GPUS[ARCH]
    points = load_points()["rows"]
    rows = []
    for p, role in zip(points, roles(points)):
        m, n, k = p["m"], p["n"], p["k"]
        row = dict(m=m, n=n, k=k, bias=p["bias"], flydsl_us=p["flydsl_us"], best_baseline_us=p["best_baseline_us"],
                   config=None, role=role, model_us=None, kernel_us=None, ratio=None, bound=None, has_loop=None,
                   note="")
        if "aiter_tuned" in p:
            c = config_of(p["aiter_tuned"]["kernel"])
            row["config"] = config_label(c)
            f = feats.get(compile_key(n, k, p["bias"], c))
            if not f or "error" in f:
                row["note"] = (f or {}).get("error", "not compiled (bench.calibration --blog-refresh)")
            else:
                feat = KernelFeatures(**{a: b for a, b in f.items() if a != "skipped_loops"})
                # the LDS ring keeps STAGES - 1 K tiles in flight (the kernel's design, as tiles.model_estimate sets
                # `prefetch` for ours: the ISA parse does not find it)
                feat = dataclasses.replace(feat, prefetch=max(1, c["STAGES"] - 1))
                r = launch_time(feat, launch_of(m, n, k, c, feat), ARCH, consts)
                if not feat.has_loop:
                    row["note"] = (f"K loop unrolled (no hot loop): {feat.inflight_bytes // 1024} KiB / wave in flight, "
                                   f"{feat.straight_trips} round trips")
                row.update(model_us=r["t_device"] * 1e6, kernel_us=r["kernel_t"] * 1e6,
                           ratio=r["t_device"] * 1e6 / p["flydsl_us"], bound=r["bound"], has_loop=feat.has_loop,
                           model_graph_us=r["t_graph"] * 1e6)
        else:
            row["note"] = "no flydsl config published for this shape (AITER's tuned winner is another backend)"
        if ours:
            oc = choose_config(m_bucket(m), n, k, "bf16", ARCH)
            e = model_estimate(m, n, k, "bf16", ARCH, oc)
            # compared with a device-timed measurement as AITER's kernel is: kernel_t + T_DEVICE (our split-K's
            # ticket protocol is not priced either; T_DEVICE's fit absorbed AITER's)
            dev = (e["kernel_t"] + g.timing.get("device_launch_s", 0.0)) * 1e6
            row.update(ours_kernel_us=e["kernel_t"] * 1e6, ours_device_us=dev,
                       ours_graph_us=(e["kernel_t"] + g.timing.get("graph_launch_s", 0.0)) * 1e6,
                       ours_vs_best=dev / min(p["flydsl_us"], p["best_baseline_us"], p.get("fastest", {}).get("us", 1e9)))
        rows.append(row)
    return rows


def summary(rows: list[dict], role: str = "validation") -> dict:
    """The error of the device-timed MODEL over the rows of one role: count, max and median |MODEL / measured - 1|,
    and how many lie within 25 %."""
    errs = [abs(r["ratio"] - 1) for r in rows if r["role"] == role and r["ratio"]]
    return dict(n=len(errs), max=max(errs) if errs else None, median=statistics.median(errs) if errs else None,
                within=sum(e <= 0.25 for e in errs))


def device_line(rows: list[dict]) -> str:
    """The device-timed set's part of the calibration line (timing.CALIBRATION quotes it)."""
    f, v = summary(rows, "fit"), summary(rows, "validation")
    return (f"device-timed MI355X decode GEMMs (kernel + T_DEVICE), fit on {f['n']}, validated on {v['n']}: max |error| "
            f"{100 * v['max']:.0f}%, median {100 * v['median']:.0f}%; {v['within']} of {v['n']} within 25%")


def fit_device(feats: dict | None = None, consts: dict | None = None) -> float:
    """T_DEVICE (`device_launch_s`): the per-launch device-side time the fit points' measured kernel times hold beyond
    the MODEL's `kernel_t`, by a grid search (0 to 4 us by 0.05 us) on the RMS of log(MODEL / measured) over the fit
    rows (`roles`). Every other constant as given (the MI350X fit's)."""
    feats = load_features() if feats is None else feats
    base = dict(GPUS[ARCH].timing, **(consts or {}))
    kt = [(r["kernel_us"], r["flydsl_us"]) for r in evaluate(feats, base, ours=False) if r["role"] == "fit" and r["ratio"]]
    return min((round(0.05 * i, 2) * 1e-6 for i in range(81)),
               key=lambda t: sum(math.log((a + t * 1e6) / b) ** 2 for a, b in kt))
