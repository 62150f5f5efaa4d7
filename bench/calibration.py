"""The timing MODEL (translator_kernels.timing) against measured MI350X kernel times.

    FLYDSL_SRC=/work/flydsl-src python -m bench.calibration [--refresh | --missing] [--fit]
    python -m bench.calibration --gemm-tables     (our GEMM: decode and mid-M tables, both archs)
    python -m bench.calibration --gemm-terms      (its variant and MODEL-term tables alone, no compile)
    python -m bench.calibration --rereads         (our mid-M tiles with the XCD re-reads priced, no compile)

The measured points, their sources (FlyDSL's own upstream kernels timed on an MI350X by a public
profiling study) and how the model is run on them: translator_kernels.measure.calibration's docstring.

The points, the model's time for each, the error and the fit are translator_kernels.measure.calibration
(the tests check against it); this program prints them. `--fit` prints the fitted constants; without
it the constants in translator_kernels.arch are used. ISA features are cached in
translator_kernels/measure/calibration_isa.json (regenerate with --refresh; needs FLYDSL_SRC and a
compile toolchain).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from translator_kernels import timing
from translator_kernels.arch import GPUS
from translator_kernels.measure.calibration import (ARCH, CACHE, KNOWN_MISSES, MI300X_POINTS, POINTS,
                                                    attention_block_m, calibration_line, compile_key, error_summary,
                                                    evaluate, fit, load_features)

# the device-timed validation points the MODEL misses by more than 25 %, and why (docs/timing-model.md): (M, N, K) -> why
BLOG_MISSES: dict = {}


# ---- upstream builds (run in translator_kernels.isa's compile child) -----------------------------
def _upstream(kernel, params):
    import torch

    src = os.environ.get("FLYDSL_SRC")
    if not src:
        raise LookupError("FLYDSL_SRC is not set")
    sys.path.insert(0, src)
    p = dict(params)
    if kernel in ("softmax", "rms_norm"):
        from bench._isa_child import flydsl

        return flydsl(kernel, "bf16", (max(p.get("m", 256), 256), p["n"]))
    if kernel == "vec_add":
        sys.path.insert(0, os.path.join(src, "tests", "kernels"))
        import flydsl.expr as fx

        available = torch.cuda.is_available
        torch.cuda.is_available = lambda: True  # the test module skips itself at import without a GPU
        try:
            from test_vec_add import vecAdd
        finally:
            torch.cuda.is_available = available

        n = 1024 * 256
        a = torch.empty(n)
        vecAdd(a, a, torch.empty(n), n, n, 256, 4, fx.Stream(None))
        return None
    if kernel == "attention":
        from kernels.attention.flash_attn_generic import build_flash_attn_func_module

        b, s, h, d = 1, p["s"], p["h"], p["d"]
        q = torch.empty(b, s, h, d, dtype=torch.bfloat16)
        bm = attention_block_m(p)
        exe = build_flash_attn_func_module(num_heads=h, head_dim=d, causal=p["causal"], dtype_str="bf16",
                                           num_kv_heads=h, cross_seqlen=False, block_m=bm, flat_work_group_size=2 * bm,
                                           path_tag="auto", waves_per_eu=2, daz=True, return_lse=False)
        exe(q, torch.empty_like(q), torch.empty_like(q), torch.empty_like(q), b, s, lse=None, stream=None)
        return None
    if kernel in ("gemm_fp8", "gemm_bf16"):
        from kernels.gemm.preshuffle_gemm import compile_preshuffle_gemm

        fp8 = kernel == "gemm_fp8"
        n, k, bm = p["n"], p["k"], p["bm"]
        fn = compile_preshuffle_gemm(N=n, K=k, tile_m=bm, tile_n=p["bn"], tile_k=p["bk"],
                                     in_dtype="fp8" if fp8 else "bf16", out_dtype="bf16")
        m = 2 * bm + 1
        edt = torch.float8_e4m3fn if fp8 else torch.bfloat16
        a, w = torch.empty(m * k, dtype=edt), torch.empty(n * k, dtype=edt)
        c = torch.empty(m * n, dtype=torch.bfloat16)
        sa, sw = (torch.empty(m), torch.empty(n)) if fp8 else (torch.empty(0), torch.empty(0))
        fn(c, a, w, sa, sw, torch.empty(0, dtype=torch.bfloat16), m, n, None)
        return None
    if kernel == "gemm_fp8_4w":
        import flydsl.expr as fx
        from kernels.gemm.fp8_gemm_4wave import compile_fp8_gemm_4w

        fn = compile_fp8_gemm_4w(K=p["k"], BLOCK_M=p["bm"], BLOCK_N=p["bn"])
        m, n, k = 2 * p["bm"], 2 * p["bn"], p["k"]
        f8 = torch.float8_e4m3fn
        fn(torch.empty(m, k, dtype=f8), torch.empty(n, k, dtype=f8), torch.empty(m, n, dtype=torch.bfloat16),
           torch.empty(m), torch.empty(n), m, n, fx.Stream(None))
        return None
    raise ValueError(kernel)


def refresh(points=POINTS, everything: bool = True) -> dict:
    """Compile every distinct upstream kernel (gfx950; gfx942 for MI300X_POINTS) and cache its model
    features (only the missing or failed ones unless `everything`)."""
    from translator_kernels.hotloop import compile_isa_texts, main_text
    from translator_kernels.timing import features

    cache = {} if everything or not os.path.exists(CACHE) else load_features()
    cache = {k: v for k, v in cache.items() if "error" not in v}
    todo = [(k, p, ARCH) for k, p, *_ in points] + [(k, p, "gfx942") for k, p, *_ in MI300X_POINTS]
    for kernel, params, arch in todo:
        key = compile_key(kernel, params, arch)
        if key in cache:
            continue
        try:
            text = main_text(compile_isa_texts("bench.calibration:_upstream", (kernel, params), arch=arch))
            cache[key] = features(text, arch).to_dict()
        except Exception as e:  # noqa: BLE001 - a kernel that does not compile is reported, not hidden
            cache[key] = {"error": str(e).splitlines()[-1][:300]}
        print(f"  compiled {key}: {cache[key]}", file=sys.stderr, flush=True)
    wanted = {compile_key(k, p, a) for k, p, a in todo}
    cache = {k: v for k, v in cache.items() if k in wanted}
    with open(CACHE, "w") as f:
        json.dump(cache, f, indent=1, sort_keys=True)
    return cache


# ---- decode and mid-M GEMM tables (issue 29 item 3) ---------------------------------------------
LLAMA3_8B = {"N=K=4096 (attn out)": (4096, 4096), "qkv": (6144, 4096), "gate+up": (28672, 4096),
             "down": (4096, 14336)}
TABLE_M = (1, 16, 64, 128, 256, 512, 1024, 2048)


def gemm_tables(archs=("gfx942", "gfx950"), ms=TABLE_M, shapes=LLAMA3_8B, dtype="bf16") -> None:
    """Our GEMM's chosen tile per M and shape, with the compiled ISA's bytes in flight, and the timing
    MODEL (translator_kernels.timing via tiles.model_estimate) against the HBM and FLOP floors."""
    from bench.isa_gemm import _ENTRY, _spec
    from translator_kernels.gemm import choose_config, m_bucket
    from translator_kernels.gemm.tiles import model_estimate
    from translator_kernels.hotloop import compile_isa_texts, main_text
    from translator_kernels.timing import features

    from translator_kernels.measure.gemm_flysim import N_RUN, cfg_key, load as load_flysim

    fly = load_flysim()
    isa = {}
    print(f"## GEMM decode and mid-M, {dtype} (MODEL: translator_kernels.timing, calibration: {_calibration()})\n")
    print("Kernel time = MODEL time less the measuring harness's launch floor. Floor = max(HBM floor, FLOP floor) "
          "at the vendor peaks; fraction = floor / kernel time; of achievable HBM = the HBM floor at the fitted achievable "
          "bandwidth (the best the model lets any kernel stream) / kernel time. ISA in flight = the vector-memory bytes one hot-loop "
          "iteration of the compiled kernel loads (A and W) x its resident waves per CU; W in flight = W's K tile "
          "per resident workgroup (the HBM bytes). prefetch 2 = the MODEL with two K tiles of W in flight per "
          "workgroup (a kernel change: ours keeps one). flysim MB = global bytes flysim counted running the chosen "
          f"tile at N = {N_RUN} (same M, K, split), extrapolated to the full N with the no-cache byte formula "
          "(translator_kernels.measure.gemm_flysim; N = K = 4096, M <= 256 only: flysim is too slow beyond); "
          "MODEL MB = the HBM bytes the MODEL charges (L2 / last-level-cache reuse, split-K partials). In a graph = "
          "of achievable HBM per launch of a graph-replayed step: the kernel time + the measured per-launch cost "
          "(GRAPH_LAUNCH, 1.7 us), which the published device-timed decode GEMMs (the MI355X table of "
          "`python -m bench.calibration`) need beside the kernel time.\n")
    print("| arch | shape NxK | M | tile BMxBNxBK kw split | grid | grid / CU | flysim MB | MODEL MB | "
          "ISA in flight / CU (KiB) | W in flight / CU (KiB) | MODEL kernel us | HBM floor us | FLOP floor us | "
          "floor / kernel | of achievable HBM | in a graph | prefetch 2: kernel us | bound |")
    print("|" + "---|" * 18)
    for arch in archs:
        g = GPUS[arch]
        for label, (n, k) in shapes.items():
            for m in ms:
                c = choose_config(m_bucket(m), n, k, dtype, arch)
                key = (arch, n, k, c)
                if key not in isa:
                    try:
                        spec = dict(_spec(n, k, dtype, arch, c.bm, c.bn, c.bk), split=c.split, kw=c.kw, wm=c.wm, head=c.head,
                                    ring=c.ring, quad=c.quad)
                        isa[key] = features(main_text(compile_isa_texts(_ENTRY, (spec,), arch=arch)), arch)
                    except Exception as e:  # noqa: BLE001 - a failed compile is a table entry
                        isa[key] = str(e).splitlines()[-1][:80]
                e = model_estimate(m, n, k, dtype, arch, c)
                e2 = model_estimate(m, n, k, dtype, arch, c, prefetch=2)
                f = isa[key]
                res = min(e["wg_per_cu"], e["grid"] / g.cus)
                isa_cell = (f"{res * f.waves_per_wg * f.inflight_bytes / 1024:.0f}" if not isinstance(f, str)
                            else f"compile failed: {f}")
                w_cell = res * c.bn * c.bk * 2 / 1024
                launch = g.timing["launch_s"]
                fp = (fly.get(f"{arch}:{m}:{n}:{k}") or load_flysim().get(f"{arch}:{m}:{n}:{k}")) if m <= 256 else None
                fly_cell = f"{fp['flysim_full'] / 1e6:.1f}" if fp and fp["cfg"] == cfg_key(c) else "-"
                print(f"| {arch} | {label} {n}x{k} | {m} | {tile_label(c)} | {e['grid']} | {e['grid'] / g.cus:.2f} | {fly_cell} | "
                      f"{e['bytes'] / 1e6:.1f} | {isa_cell} | "
                      f"{w_cell:.0f} | {e['kernel_t'] * 1e6:.1f} | {e['hbm_floor'] * 1e6:.1f} | "
                      f"{e['flop_floor'] * 1e6:.1f} | {e['floor_fraction']:.2f} | "
                      f"{e['hbm_floor'] / g.timing['hbm_efficiency'] / e['kernel_t']:.2f} | {e['of_achievable_graph']:.2f} | "
                      f"{(e2['t'] - launch) * 1e6:.1f} | "
                      f"{e['bound']} |", flush=True)
    print()
    variant_table(archs)
    terms_table(archs)


def tile_label(c) -> str:
    """A GemmConfig as the tables print it: BMxBNxBK kw split, then 8 waves / head / ring / 2x2 where set."""
    return (f"{c.bm}x{c.bn}x{c.bk} kw{c.kw} s{c.split}{' 8 waves' if c.wm > 1 else ''}"
            f"{f' head {c.head}' if c.head else ''}{' ring' if c.ring else ''}{' 2x2' if c.quad else ''}")


def variant_table(archs=("gfx942", "gfx950"), ms=(128, 256, 512, 1024), n=4096, k=4096, dtype="bf16") -> None:
    """The best tile of each kernel variant (translator_kernels.gemm.variants: priced, not built) under the MODEL."""
    from translator_kernels.gemm.variants import VARIANTS, best

    print(f"### Kernel variants at N = K = {n} (MODEL; the best legal tile of each; of achievable HBM)\n")
    print("| arch | M | " + " | ".join(VARIANTS) + " |")
    print("|" + "---|" * (2 + len(VARIANTS)))
    for arch in archs:
        for m in ms:
            cells = []
            for v in VARIANTS:
                e, c = best(m, n, k, dtype, arch, v)
                g = f", {e['grid']} WGs" if v.startswith("persistent") else ""
                cells.append(f"{e['of_achievable']:.2f} ({tile_label(c)}{g})")
            print(f"| {arch} | {m} | " + " | ".join(cells) + " |", flush=True)
    print()


def terms_table(archs=("gfx942", "gfx950"), ms=(128, 256, 512, 1024, 2048), n=4096, k=4096, dtype="bf16") -> None:
    """Which MODEL term stops each M (translator_kernels.gemm.variants.model_terms) at the chosen tile."""
    from translator_kernels.gemm import choose_config, m_bucket
    from translator_kernels.gemm.variants import model_terms

    print(f"### What each MODEL term adds at N = K = {n} (chosen tile; us, launch floor left out)\n")
    print("goal = the time issue 29 asks for: 0.8 of the achievable HBM bandwidth for M <= 256, else 1.5 x the better "
          "of the HBM floor (at the achievable bandwidth) and the FLOP floor. t_issue = MFMA and the rest (the MFMAs, "
          "the prologue's one latency, latency floors, rounds) + A's LDS traffic + loop vector work + exposed latency "
          "of each K step + prologue bytes; each is what taking that term alone away saves from t_issue. "
          "t_mem's partials: split-K's fp32 partial tiles. t_l2: the bytes every workgroup loads through the L2s "
          "(tiles.l2_bytes) at the fitted share of their peak. Gain = what the kernel time loses without the term.\n")
    print("| arch | M | tile | kernel | goal | binds | t_mem (partials) | t_issue | t_l2 (MB loaded) | MFMA and rest | LDS | "
          "vector | exposed latency | prologue bytes | gain without partials / LDS / exposed latency / prologue |")
    print("|" + "---|" * 15)
    for arch in archs:
        eff = GPUS[arch].timing["hbm_efficiency"]
        for m in ms:
            c = choose_config(m_bucket(m), n, k, dtype, arch)
            r = model_terms(m, n, k, dtype, arch, c)
            goal = r["hbm_floor"] / eff / 0.8 if m <= 256 else max(r["hbm_floor"] / eff, r["flop_floor"]) * 1.5
            t, gw = r["terms"], r["gain_without"]
            print(f"| {arch} | {m} | {tile_label(c)} | "
                  f"{r['kernel_t'] * 1e6:.2f} | {goal * 1e6:.2f} | {r['binds']} | {r['t_mem'] * 1e6:.2f} "
                  f"({r['partial_t'] * 1e6:.2f}) | {r['t_issue'] * 1e6:.2f} | {r['t_l2'] * 1e6:.2f} "
                  f"({r['l2_bytes'] / 1e6:.0f}) | {r['mfma_and_rest'] * 1e6:.2f} | "
                  f"{t['lds'] * 1e6:.2f} | {t['vector'] * 1e6:.2f} | {t['exposed_latency'] * 1e6:.2f} | "
                  f"{t['prologue_bytes'] * 1e6:.2f} | {gw['partials'] * 1e6:.2f} / {gw['lds'] * 1e6:.2f} / "
                  f"{gw['exposed_latency'] * 1e6:.2f} / {gw['prologue_bytes'] * 1e6:.2f} |", flush=True)
    print()


def reread_table(archs=("gfx942", "gfx950"), ms=(16, 64, 128, 256, 512, 1024, 2048), n=4096, k=4096,
                 dtype="bf16") -> list[dict]:
    """Our GEMM's chosen tiles at N = K = 4096 with the XCD re-reads the calibration prices (timing.xcd_reread_bytes
    at REREAD_EFFICIENCY): without them, in the hardware's rows-first order, and in the XCD-grouped order the
    kernel launches (gemm/xcd.py; what `tiles.model_estimate` prices and the tile heuristic ranks with)."""
    from translator_kernels.gemm import choose_config, m_bucket
    from translator_kernels.gemm.tiles import model_estimate
    from translator_kernels.timing import xcd_reread_bytes

    print(f"### Our GEMM at N = K = {n} with the XCD re-reads (MODEL; kernel us, launch floor left out)\n")
    print("| arch | M | chosen tile | row tiles | re-read MB rows first / grouped | kernel us: no re-reads | rows first "
          "| XCD-grouped | of achievable: no re-reads | rows first | XCD-grouped |")
    print("|" + "---|" * 11)
    rows = []
    for arch in archs:
        g = GPUS[arch]
        t = g.timing
        for m in ms:
            c = choose_config(m_bucket(m), n, k, dtype, arch)
            e = model_estimate(m, n, k, dtype, arch, c)  # the XCD-grouped order
            free = model_estimate(m, n, k, dtype, arch, c, consts=dict(t, reread_efficiency=1e30))
            rr = xcd_reread_bytes(m, n, k, 2, 2, c.bm, c.bn, g.xcds, c.split)
            rr_g = xcd_reread_bytes(m, n, k, 2, 2, c.bm, c.bn, g.xcds, c.split, grouped=True)
            with_rr = max(free["t_mem"] + rr / (t["reread_efficiency"] * g.hbm_bytes_per_s), free["t_issue"], free["t_l2"])
            ach = e["hbm_floor"] / t["hbm_efficiency"]
            rows.append(dict(arch=arch, m=m, kernel_t=free["kernel_t"], with_rereads=with_rr, reread_bytes=rr,
                             grouped_t=e["kernel_t"], grouped_bytes=rr_g))
            print(f"| {arch} | {m} | {c.bm}x{c.bn}x{c.bk} s{c.split}{f' head {c.head}' if c.head else ''} | "
                  f"{-(-m // c.bm)} | {rr / 1e6:.0f} / {rr_g / 1e6:.0f} | {free['kernel_t'] * 1e6:.2f} | "
                  f"{with_rr * 1e6:.2f} | {e['kernel_t'] * 1e6:.2f} | {ach / free['kernel_t']:.2f} | "
                  f"{ach / with_rr:.2f} | {ach / e['kernel_t']:.2f} |", flush=True)
    print()
    return rows


def _calibration() -> str:
    from translator_kernels.timing import CALIBRATION

    return CALIBRATION


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--refresh", action="store_true", help="recompile upstream's kernels (needs FLYDSL_SRC)")
    ap.add_argument("--missing", action="store_true", help="compile only kernels missing from the cache")
    ap.add_argument("--fit", action="store_true", help="refit the constants and print them")
    ap.add_argument("--gemm-tables", action="store_true", help="print the decode / mid-M GEMM tables (compiles ours)")
    ap.add_argument("--flysim-bytes", action="store_true",
                    help="run the N = K = 4096 table tiles (M <= 256) under flysim and cache their bytes")
    ap.add_argument("--rereads", action="store_true",
                    help="our GEMM's mid-M tiles with the XCD re-reads the calibration prices (no compile)")
    ap.add_argument("--blog-refresh", action="store_true",
                    help="recompile AITER's splitk_hgemm at the blog points' configs (needs AITER_SRC, FLYDSL_SRC)")
    ap.add_argument("--gemm-terms", action="store_true",
                    help="print the mid-M variant and MODEL-term tables only (no compile)")
    a = ap.parse_args(argv)
    if a.blog_refresh:
        from translator_kernels.measure.blog_gemm import refresh as blog_refresh

        blog_refresh()
        _print_blog()
        return 0
    if a.rereads:
        reread_table()
        return 0
    if a.gemm_terms:
        variant_table()
        terms_table()
        return 0
    if a.flysim_bytes:
        from translator_kernels.measure.gemm_flysim import refresh as flysim_refresh

        flysim_refresh([m for m in TABLE_M if m <= 256])
        return 0
    if a.gemm_tables:
        gemm_tables()
        return 0
    if a.refresh or a.missing or not os.path.exists(CACHE):
        feats = refresh(everything=not a.missing)
    else:
        feats = load_features()
    from translator_kernels.measure.blog_gemm import evaluate as blog_evaluate, fit_device

    consts = None
    if a.fit:
        consts = fit(feats)
        consts["device_launch_s"] = fit_device(consts=consts)  # on the device-timed fit points, the others as fitted
        print(f"fitted constants: {consts}\n")
    rows = evaluate(feats, consts)
    blog_rows = blog_evaluate(consts=consts)
    used = consts or GPUS[ARCH].timing
    print(f"## Timing MODEL vs measured (MI350X, gfx950; upstream FlyDSL kernels, ISA compiled from $FLYDSL_SRC)\n")
    print(f"constants: launch {used['launch_s'] * 1e6:.1f} us, HBM {used['hbm_efficiency']:.2f} x "
          f"{GPUS[ARCH].hbm_bytes_per_s / 1e12:.1f} TB/s, memory latency {used['mem_latency_s'] * 1e6:.2f} us, "
          f"overlap {used['overlap']:.2f}, latency exposed per loop iteration {used.get('exposed', 0):.2f}, "
          f"L2 latency (a later straight-line round trip) {used.get('l2_latency_s', 0) * 1e6:.2f} us, GEMM blocks other "
          f"XCDs read again at {used.get('reread_efficiency', 1.0):.2f} x the HBM peak, loaded bytes through the L2s at "
          f"{used.get('l2_efficiency', 1.0):.2f} x their peak ({timing.l2_bytes_per_s(ARCH) / 1e12:.1f} TB/s); measured, not "
          f"fitted: a launch replayed back to back in one graph {used.get('graph_launch_s', 0) * 1e6:.1f} us; fitted on the "
          f"device-timed points (last table): T_DEVICE {used.get('device_launch_s', 0) * 1e6:.2f} us\n")
    print("| kernel | shape | measured us | source | MODEL us | MODEL / measured | role | bound | "
          "in flight / CU (KiB) | waves/SIMD | note |")
    print("|" + "---|" * 11)
    for r in rows:
        if r["model_us"] is None:
            print(f"| {r['kernel']} | {r['shape']} | {r['measured_us']:.1f} | {r['source']} | - | - | {r['role']} | | | | "
                  f"{r['note']} |")
            continue
        print(f"| {r['kernel']} | {r['shape']} | {r['measured_us']:.1f} | {r['source']} | {r['model_us']:.1f} | "
              f"{r['ratio']:.2f} | {r['role']} | {r['bound']} | {r['in_flight_per_cu'] / 1024:.0f} | "
              f"{r['waves_per_simd']:.1f} | {r['note']} |")
    s = error_summary(rows)
    print(f"\ncalibration: {calibration_line(rows, blog_rows)}; MI350X fit points max |error| {100 * s['max_fit']:.0f}%")
    misses = [r for r in rows if r["role"] == "validation" and r["ratio"] and abs(r["ratio"] - 1) > 0.25]
    for r in misses:
        why = KNOWN_MISSES.get((r["kernel"], r["shape"]), "not explained (a new miss)")
        print(f"validation miss: {r['kernel']} {r['shape']}: MODEL / measured {r['ratio']:.2f} ({why})")
    _print_mi300x(feats, consts)
    _print_blog(consts, blog_rows)
    return 0


def _print_mi300x(feats, consts) -> None:
    rows = evaluate(feats, consts, MI300X_POINTS, "gfx942")
    print("\n## MI300X (gfx942): published vendor-kernel measurements against the MODEL (validation only)\n")
    print("The MODEL runs upstream FlyDSL's kernel compiled for gfx942 at the measured shape (the measured kernel "
          "is AMD's hipBLASLt); gfx942 takes gfx950's fitted constants and the 2.1 GHz boost clock.\n")
    print("| kernel | shape | measured us | source | MODEL us | MODEL / measured | bound | note |")
    print("|" + "---|" * 8)
    for r in rows:
        if r["model_us"] is None:
            print(f"| {r['kernel']} | {r['shape']} | {r['measured_us']:.1f} | {r['source']} | - | - | | {r['note']} |")
            continue
        print(f"| {r['kernel']} | {r['shape']} | {r['measured_us']:.1f} | {r['source']} | {r['model_us']:.1f} | "
              f"{r['ratio']:.2f} | {r['bound']} | {r['note']} |")


def _print_blog(consts=None, rows=None) -> None:
    """The ROCm blog's measured MI355X bf16 decode GEMMs (translator_kernels.measure.blog_gemm): device-timed points,
    MODEL = kernel_t + T_DEVICE; every other priced row fits T_DEVICE, the rest validate."""
    from translator_kernels.measure.blog_gemm import device_line, evaluate as blog_evaluate, load_points, summary

    src = load_points()["source"]
    rows = blog_evaluate(consts=consts) if rows is None else rows
    t_dev = dict(GPUS[ARCH].timing, **(consts or {})).get("device_launch_s", 0.0)
    print("\n## MI355X (gfx950) bf16 decode GEMMs: published device-timed measurements against the MODEL\n")
    print(f"Measured: ROCm blog \"{src['title']}\" ({src['date']}), Figures 6 and 9 ({src['repo']} {src['path']}); device "
          "time per kernel (AITER's harness: profiler kernel time, rotated inputs), so MODEL = kernel_t + T_DEVICE "
          f"({t_dev * 1e6:.2f} us, the per-launch device-side time, fitted on the rows marked fit: every other priced row "
          "in the file's order; the harness's T_LAUNCH left out). Kernel: AITER's FlyDSL splitk_hgemm compiled from "
          "$AITER_SRC at the config AITER's tuner chose at that shape (the blog's own configs are not published), "
          "prefetch = STAGES - 1 (its LDS ring). Every row: our GEMM's MODEL (kernel_t, + T_DEVICE as a device-timed run of it, and in a graph) "
          "beside the best measured time, a sanity check, not validation. Figure 6: K = 7168, no bias; Figure 9: bf16 "
          "model shapes.\n")
    print("| M | N | K | AITER config | FLYDSL measured us | best other backend us | MODEL kernel_t us | MODEL us "
          "(kernel_t + T_DEVICE) | MODEL / measured | role | bound | our GEMM MODEL us: kernel_t / + T_DEVICE / in a graph | "
          "ours (+ T_DEVICE) / best measured "
          "| note |")
    print("|" + "---|" * 14)
    for r in rows:
        model = (f"{r['kernel_us']:.1f} | {r['model_us']:.1f} | {r['ratio']:.2f} | {r['role']} | {r['bound']}"
                 if r["model_us"] else "- | - | - | - |")
        print(f"| {r['m']} | {r['n']} | {r['k']} | {r['config'] or '-'} | {r['flydsl_us']:.1f} | "
              f"{r['best_baseline_us']:.1f} | {model} | {r['ours_kernel_us']:.1f} / {r['ours_device_us']:.1f} / {r['ours_graph_us']:.1f} | "
              f"{r['ours_vs_best']:.2f} | {r['note']} |")
    print()
    for label, has_loop in (("with a K loop", True), ("K loop unrolled", False)):
        group = [r for r in rows if r["ratio"] and r["has_loop"] == has_loop]
        if group:
            ks = sorted(r["kernel_us"] / r["flydsl_us"] for r in group)
            rs = sorted(r["ratio"] for r in group)
            print(f"{label}, {len(rs)} points: kernel_t / measured {ks[0]:.2f} - {ks[-1]:.2f} (median {ks[len(ks) // 2]:.2f}, "
                  f"{sum(abs(x - 1) <= 0.25 for x in ks)} within 25%); MODEL / measured {rs[0]:.2f} - {rs[-1]:.2f} (median "
                  f"{rs[len(rs) // 2]:.2f}, {sum(abs(x - 1) <= 0.25 for x in rs)} within 25%)")
    f = summary(rows, "fit")
    print(f"calibration: {device_line(rows)}; fit points max |error| {100 * f['max']:.0f}%, {f['within']} of "
          f"{f['n']} within 25%")
    for r in rows:
        if r["role"] == "validation" and r["ratio"] and abs(r["ratio"] - 1) > 0.25:
            print(f"validation miss: M = {r['m']}, N = {r['n']}, K = {r['k']} ({r['config']}): MODEL / measured "
                  f"{r['ratio']:.2f} ({BLOG_MISSES.get((r['m'], r['n'], r['k']), 'not explained (a new miss)')})")


if __name__ == "__main__":
    sys.exit(main())
