"""fp8 GEMM evidence without a GPU: `python -m bench.kernels --only gemm --dtype fp8` (or `python -m bench.isa_fp8`).

Static ISA of our fp8 GEMM (translator_kernels.gemm.fp8: per-token x per-channel scales in the epilogue,
bf16 out) beside FlyDSL's fp8 preshuffle GEMM (kernels/gemm/preshuffle_gemm.py, in_dtype="fp8", its
per-row x per-column scales, bf16 out; compiled from $FLYDSL_SRC) at EQUAL tiles, at 4096^3 and at
Llama-3-8B shapes: VGPR / AGPR / spills, LDS, occupancy (translator_kernels.isa MODEL), the hot loop
per K step (MFMA / VALU / LDS ops / VMEM, and the bench.hotloop cycle MODEL), and a MODEL TFLOPS at
4096^3 (tiles.large_estimate with the fp8 matrix rate: wave quantization x dense peak; not a
measurement) beside the seed's measured 1347 TFLOPS for FlyDSL's kernel on MI350X.

Decode rows (`--decode`): M = 1 and 16 at Llama-3-8B's projections, our kernel at the tile WITH its split-K
and kw that choose_fp8_config picks (one compile per distinct (arch, N, K, tile): M = 1 and 16 share it when
the tile is the same, M being a runtime argument), with tiles.model_estimate's MODEL time and fraction of the
HBM limit; FlyDSL's preshuffle GEMM has no split-K, so only split-1 tiles get an upstream compile. The
block-scaled kernel (128 x 128 scales in the K loop) at the same tile, split-K and kw beside them.

Gated rows (`--gated`): Llama-3-8B's gate + up as the fp8 gated GEMM at M = 1, 16, 2048, beside the plain fp8
GEMM over the same [2N, K] weight at the same tile.

Tiles are given in fp8 values (BK = 128 values = 32 of our kernel's 4-byte units).
"""

from __future__ import annotations

import os
import sys

import torch

from translator_kernels.gemm.quant_isa import FP8_BLOCK_GEMM, FP8_GATED_GEMM
from translator_kernels.measure.fp8_isa import FP8_GEMM

SEED_TFLOPS = 1347  # ../shared/reference/seeds: FlyDSL preshuffle GEMM, fp8 4096^3, measured on MI350X
ENTRIES = {"ours": FP8_GEMM, "flydsl": "bench.isa_fp8:_compile_flydsl", "ours 128x128 block scales": FP8_BLOCK_GEMM}
SHAPES = [("4096^3", 4096, 4096, 4096), ("Llama-3-8B prefill qkv (M=4096)", 4096, 6144, 4096),
          ("Llama-3-8B prefill down (M=4096)", 4096, 4096, 14336), ("Llama-3-8B prefill qkv (M=2048)", 2048, 6144, 4096),
          ("Llama-3-8B prefill gate/up (M=2048)", 2048, 14336, 4096), ("Llama-3-8B prefill down (M=2048)", 2048, 4096, 14336)]


DECODE_SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate/up", 28672, 4096), ("down", 4096, 14336)]
NO_SPLIT_UPSTREAM = "no split-K upstream"


def _compile_flydsl(n, k, bm, bn, bk):
    """FlyDSL's fp8 preshuffle GEMM at one tile (runs in the compile child; needs $FLYDSL_SRC)."""
    src = os.environ.get("FLYDSL_SRC")
    if not src:
        raise LookupError("FLYDSL_SRC is not set")
    sys.path.insert(0, src)
    from kernels.gemm.preshuffle_gemm import compile_preshuffle_gemm

    m = 2 * bm + 1
    fn = compile_preshuffle_gemm(N=n, K=k, tile_m=bm, tile_n=bn, tile_k=bk, in_dtype="fp8", out_dtype="bf16")
    a, w = torch.zeros(m * k, dtype=torch.int8), torch.zeros(n * k, dtype=torch.int8)
    c = torch.zeros(m * n, dtype=torch.bfloat16)
    fn(c, a, w, torch.zeros(m), torch.zeros(n), torch.zeros(0, dtype=torch.bfloat16), m, n, None)


def rows(archs=("gfx942", "gfx950"), tiles=((128, 128, 128), (128, 128, 256)), shapes=SHAPES[:1]):
    from translator_kernels.gemm import GemmConfig, large_estimate
    from translator_kernels.gemm.fp8 import choose_fp8_config
    from translator_kernels.gemm.mfma8 import mfma8_per_block
    from translator_kernels.hotloop import compile_isa_texts, hot_loop, main_text
    from translator_kernels.isa import occupancy, parse_isa

    impls = ["ours"] + (["flydsl"] if os.environ.get("FLYDSL_SRC") else []) + ["ours 128x128 block scales"]
    out = []
    for i, (label, m, n, k) in enumerate(shapes):
        for arch in archs:
            c = choose_fp8_config(m, n, k, arch)
            chosen = (c.bm, c.bn, c.bk * 4)
            for tile in dict.fromkeys([chosen, *(tiles if i == 0 else ())]):  # other shapes: the chosen tile
                for impl in impls:
                    if impl.startswith("ours 128") and tile != chosen:
                        continue
                    r = dict(shape=label, arch=arch, tile=tile, impl=impl, chosen=tile == chosen and impl == "ours")
                    try:
                        text = main_text(compile_isa_texts(ENTRIES[impl], (n, k, *tile), arch=arch))
                        meta = max(parse_isa(text, arch), key=lambda st: st.instructions).meta
                        loop = hot_loop(text, arch)
                    except Exception as e:  # noqa: BLE001 - a failed compile is a table entry, with its reason
                        out.append(dict(r, error=str(e).strip().splitlines()[-1][:160]))
                        continue
                    per_step = (tile[0] // 16) * (tile[1] // 16) * (tile[2] // 128) * mfma8_per_block(arch) // 4
                    steps = max(1, loop["counts"]["MFMA"] // per_step)
                    w, lim = occupancy(meta["vgpr"] + meta["agpr"], meta["sgpr"], meta["lds"], 256, arch)
                    # the matrix rate is fp8's: large_estimate's dtype picks the rate and the bytes per value
                    est = large_estimate(m, n, k // 4, "f32", arch, GemmConfig(tile[0], tile[1], tile[2] // 4),
                                         wg_per_cu=max(1, w))
                    est = _fp8_time(est, m, n, k, arch, tile)
                    out.append(dict(r, meta=meta, loop=loop, steps=steps, waves=w, limit=lim, est=est,
                                    mnem=sorted({x for x in text.split() if x.startswith("v_mfma")})))
    return out


def _fp8_time(est, m, n, k, arch, tile):
    """large_estimate's tiles / slots with the fp8 dense rate: the busiest CU's tiles x one tile's MFMA time."""
    from translator_kernels.arch import GPUS

    g = GPUS[arch]
    t_tile = 2 * tile[0] * tile[1] * (-(-k // 128) * 128) / (g.matrix_flops_per_clk["fp8"] * g.clock_hz)
    t = -(-est["tiles"] // g.cus) * t_tile
    return dict(est, t=t, tflops=2 * m * n * k / t / 1e12, peak_tflops=g.cus * g.clock_hz * g.matrix_flops_per_clk["fp8"] / 1e12)


def decode_plan(archs=("gfx942", "gfx950"), ms=(1, 16)):
    """The decode rows without compiling: dicts of label, m, n, k, arch, cfg (K in 4-byte units), chosen, and
    the MODEL estimate. Besides the chosen tiles, one equal-tile row per arch: gate/up at M = 16 on 16x64x512,
    split 1 (the smallest tile FlyDSL's preshuffle GEMM compiles), so the two kernels meet at one decode tile."""
    from translator_kernels.gemm import GemmConfig
    from translator_kernels.gemm.fp8 import choose_fp8_config
    from translator_kernels.gemm.tiles import m_bucket, model_estimate

    out = []
    for arch in archs:
        todo = [(m, label, n, k, choose_fp8_config(m_bucket(m), n, k, arch))
                for m in ms for label, n, k in DECODE_SHAPES]
        todo.append((ms[-1], *DECODE_SHAPES[2], GemmConfig(16, 64, 128)))
        for i, (m, label, n, k, cfg) in enumerate(todo):
            # the f32 model at K / 4 moves the fp8 bytes (4 values per unit), the rule choose_fp8_config ranks by
            est = model_estimate(m, n, k // 4, "f32", arch, cfg)
            out.append(dict(shape=f"Llama-3-8B {label} M={m}", m=m, n=n, k=k, arch=arch, cfg=cfg,
                            chosen=i < len(todo) - 1, est=est))
    return out


def upstream_reason(cfg) -> str | None:
    """Why FlyDSL's preshuffle GEMM cannot take our tile (None: it can): it has no split-K, its 4 waves split
    BN into columns of 16 (BN a multiple of 64) and never split a K tile across waves (our kw = 4)."""
    if cfg.split > 1:
        return NO_SPLIT_UPSTREAM
    if cfg.kw > 1 or cfg.bn % 64:
        return f"BN={cfg.bn}, kw={cfg.kw}: upstream's 4 waves split BN (BN % 64 == 0), never K"
    return None


def _isa_cells(entry, args, arch, tile, k_steps):
    """VGPR / spills / waves and per-K-step counts of one compile; `k_steps`: the K tiles one workgroup runs.
    A kernel whose K loop the compiler unrolled (no backward branch) is counted whole and divided by k_steps."""
    from translator_kernels.gemm.mfma8 import mfma8_per_block
    from translator_kernels.hotloop import compile_isa_texts, hot_loop, main_text
    from translator_kernels.isa import occupancy, parse_isa

    try:
        text = main_text(compile_isa_texts(entry, args, arch=arch))
        st = max(parse_isa(text, arch), key=lambda st: st.instructions)
    except Exception as e:  # noqa: BLE001 - a failed compile is a table entry, with its reason
        return dict(error=str(e).strip().splitlines()[-1][:120])
    meta, mix = st.meta, st.mix
    try:
        n = hot_loop(text, arch)["counts"]
    except ValueError:  # no loop at all
        n = dict(MFMA=0)
    # one K tile's MFMAs per wave: the tile's 16x16x128 blocks over the 4 waves (kw = 4 splits K: same count)
    per_step = max(1, (tile[0] // 16) * (tile[1] // 16) * (tile[2] // 128) * mfma8_per_block(arch) // 4)
    steps, unrolled = max(1, n["MFMA"] // per_step), False
    if not n["MFMA"]:  # no K loop (a loop without MFMAs is a split-K wait): the whole kernel is k_steps K tiles
        n = dict(MFMA=mix.get("MFMA", 0), VALU=mix.get("VALU", 0),
                 vmem=mix.get("vmem_load", 0) + mix.get("vmem_store", 0))
        steps, unrolled = max(1, k_steps), True
    w, _ = occupancy(meta["vgpr"] + meta["agpr"], meta["sgpr"], meta["lds"], 256, arch)
    return dict(vgpr=meta["vgpr"] + meta["agpr"], spills=meta["vgpr_spill"] + meta["sgpr_spill"], waves=w,
                valu=n["VALU"] / steps, vmem=n["vmem"] / steps, mfma=n["MFMA"] / steps, mfma_total=mix.get("MFMA", 0),
                unrolled=unrolled)


def decode_rows(archs=("gfx942", "gfx950"), flydsl=None):
    """decode_plan's rows with the static ISA of ours (and FlyDSL's where upstream_reason allows), one compile
    per distinct kernel."""
    from translator_kernels.gemm.fp8 import padded_shape_fp8

    flydsl = bool(os.environ.get("FLYDSL_SRC")) if flydsl is None else flydsl
    cache, out = {}, []
    for r in decode_plan(archs):
        arch, n, k, cfg = r["arch"], r["n"], r["k"], r["cfg"]
        tile = (cfg.bm, cfg.bn, cfg.bk * 4)
        key = (arch, n, k, tile, cfg.split, cfg.kw)
        if key not in cache:
            k_steps = padded_shape_fp8(n, k)[1] // tile[2] // cfg.split
            cache[key] = {"ours": _isa_cells(FP8_GEMM, (n, k, *tile, cfg.split, cfg.kw), arch, tile, k_steps),
                          "block": _isa_cells(FP8_BLOCK_GEMM, (n, k, *tile, cfg.split, cfg.kw), arch, tile, k_steps)}
            why = upstream_reason(cfg) or (None if flydsl else "FLYDSL_SRC not set")
            cache[key]["flydsl"] = dict(error=why) if why else _isa_cells(ENTRIES["flydsl"], (n, k, *tile), arch,
                                                                          tile, k // tile[2])
        out.append(dict(r, tile=tile, **cache[key]))
    return out


def _cell(c):
    if "error" in c:
        return c["error"] + " |" * 5
    u = " (u)" if c["unrolled"] else ""
    return (f"{c['vgpr']} | {c['spills']} | {c['waves']} | {c['valu']:.3g} / {c['vmem']:.3g}{u} | "
            f"{c['mfma']:.3g} / {c['mfma_total']} |")


def _header(title, cols, groups):
    """Print a table's title and header: `cols` plain columns, then _cell's 5 columns per name in `groups`."""
    hd = "VGPR+AGPR | spills | waves/SIMD | per K step VALU / VMEM | MFMA per K step / static in kernel"
    print(title + "\n")
    print("| " + " | ".join(cols + [f"{g}: {hd}" for g in groups]) + " |")
    print("|" + "---|" * (len(cols) + 5 * len(groups)))


def print_decode_rows(rs):
    _header("## fp8 GEMM decode rows: ours at the chosen tile and split-K vs FlyDSL's fp8 preshuffle GEMM at the same "
            "tile (static ISA; MODEL = tiles.model_estimate, not a measurement)",
            ["shape", "arch", "tile (BK in fp8 values)", "split", "kw", "MODEL us", "MODEL HBM fraction"],
            ["ours", "FlyDSL", "ours, 128x128 block scales"])
    for r in rs:
        e = r["est"]
        tile = "x".join(map(str, r["tile"])) + ("" if r["chosen"] else " (equal-tile row, not chosen)")
        print(f"| {r['shape']} | {r['arch']} | {tile} | {r['cfg'].split} | {r['cfg'].kw} | "
              f"{e['kernel_t'] * 1e6:.1f} | {e['hbm_floor'] / e['kernel_t']:.2f} | {_cell(r['ours'])} "
              f"{_cell(r['flydsl'])} {_cell(r['block'])}")
    print("\nMODEL HBM fraction: the compulsory bytes (A, W, C once) at the HBM peak over the MODEL kernel time. "
          "M = 1 and 16 share one compile where their tile is the same (M is a runtime argument). (u): the compiler "
          "unrolled the K loop; the counts are the whole kernel's (prologue and split-K reduction included) over "
          "the K tiles one workgroup runs. Static in kernel: MFMA instructions in the ISA, a looped kernel's peeled "
          "iterations included.\n")


def gated_rows(archs=("gfx942", "gfx950"), ms=(1, 16, 2048), n=14336, k=4096):
    """Llama-3-8B's gate + up as the fp8 gated GEMM (fp8_gated.py, silu(g) * u of n columns) at its chooser's tile,
    beside the plain fp8 GEMM over the same [2n, k] weight at the same tile (split 1, kw 1): the gated epilogue's
    cost in registers and instructions."""
    from translator_kernels.gemm.fp8 import choose_fp8_config, padded_shape_fp8
    from translator_kernels.gemm.fp8_gated import choose_gated_fp8_config
    from translator_kernels.gemm.tiles import m_bucket, model_estimate

    cache, out = {}, []
    for arch in archs:
        for m in ms:
            cfg = choose_gated_fp8_config(m, n, k, arch)
            tile = (cfg.bm, cfg.bn, cfg.bk * 4)
            if (arch, tile) not in cache:
                steps = padded_shape_fp8(n, k)[1] // tile[2]
                cache[arch, tile] = dict(gated=_isa_cells(FP8_GATED_GEMM, (n, k, *tile), arch, tile, steps),
                                         plain=_isa_cells(FP8_GEMM, (2 * n, k, *tile, 1, 1), arch, tile, steps))
            # MODEL: the arranged [2n, k] GEMM at the gated tile (its C counted whole: an upper bound) against
            # the two fp8 GEMMs of before, each at the chooser's tile
            t_gated = model_estimate(m, 2 * n, k // 4, "f32", arch, cfg)["kernel_t"]
            two = choose_fp8_config(m_bucket(m), n, k, arch)
            t_two = 2 * model_estimate(m, n, k // 4, "f32", arch, two)["kernel_t"]
            out.append(dict(shape=f"Llama-3-8B gate+up M={m}", arch=arch, tile=tile, t_gated=t_gated, t_two=t_two,
                            **cache[arch, tile]))
    return out


def print_gated_rows(rs):
    _header("## fp8 gated GEMM (gate + up, silu(g) * u in the epilogue) vs the plain fp8 GEMM over the same weight at "
            "the same tile (static ISA)",
            ["shape", "arch", "tile (BK in fp8 values)", "MODEL us: gated / two fp8 GEMMs"],
            ["gated", "plain [2N, K]"])
    for r in rs:
        print(f"| {r['shape']} | {r['arch']} | {'x'.join(map(str, r['tile']))} | {r['t_gated'] * 1e6:.1f} / "
              f"{r['t_two'] * 1e6:.1f} | {_cell(r['gated'])} {_cell(r['plain'])}")
    print("\nMODEL = tiles.model_estimate (not a measurement): the gated GEMM as the arranged [2N, K] GEMM (its C "
          "counted whole, an upper bound), the two GEMMs of before each at the fp8 chooser's tile.\n")


def print_rows(rs):
    from .isa_gemm import loop_cells

    print("## fp8 GEMM (per-token x per-channel scales, bf16 out) at equal tiles: ours vs FlyDSL's fp8 preshuffle GEMM "
          "(static ISA; per-K-step cycles are the bench.hotloop MODEL, TFLOPS the wave-quantization MODEL)\n")
    print("| shape | arch | tile (BK in fp8 values) | impl | VGPR | AGPR | spills | LDS B | waves/SIMD (limit) | MFMA op | "
          "per K step: MFMA / VALU / LDS ops / VMEM | per K step: matrix / vector / LDS cycles | bound | "
          "tiles / CUs | MODEL TFLOPS (peak) |")
    print("|" + "---|" * 15)
    for r in rs:
        tile = "x".join(map(str, r["tile"])) + (" (ours' choice)" if r["chosen"] else "")
        if "error" in r:
            print(f"| {r['shape']} | {r['arch']} | {tile} | {r['impl']} | {r['error']} |" + " |" * 10)
            continue
        m, e = r["meta"], r["est"]
        print(f"| {r['shape']} | {r['arch']} | {tile} | {r['impl']} | {m['vgpr']} | {m['agpr']} | "
              f"{m['vgpr_spill'] + m['sgpr_spill']} | {m['lds']} | {r['waves']} ({r['limit']}) | {', '.join(r['mnem'])} | "
              f"{loop_cells(r['loop'], r['steps'])} | {e['tiles']} / {e['slots'] // max(1, e['wg_per_cu'])} | "
              f"{e['tflops']:.0f} ({e['peak_tflops']:.0f}) |")
    print(f"\nSeed (measured, MI350X): FlyDSL's fp8 preshuffle GEMM at 4096^3 ran at {SEED_TFLOPS} TFLOPS. The MODEL "
          "column is the dense fp8 peak times wave quantization, an upper bound no kernel reaches; compare the "
          "two kernels' rows with each other, not with the seed.\n")


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m bench.isa_fp8")
    p.add_argument("--arch", action="append")
    p.add_argument("--all-shapes", action="store_true", help="add the Llama-3-8B prefill shapes")
    p.add_argument("--decode", action="store_true",
                   help="only the Llama-3-8B decode rows (M = 1, 16; split-K tiles)")
    p.add_argument("--gated", action="store_true", help="only the fp8 gated GEMM rows (Llama-3-8B gate + up)")
    a = p.parse_args(argv)
    archs = tuple(a.arch or ("gfx942", "gfx950"))
    if a.gated:
        print_gated_rows(gated_rows(archs))
        return 0
    if a.decode:
        print_decode_rows(decode_rows(archs))
        return 0
    print_rows(rows(archs, shapes=SHAPES if a.all_shapes else SHAPES[:1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
