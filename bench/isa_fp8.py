"""fp8 GEMM evidence without a GPU: `python -m bench.kernels --only gemm --dtype fp8` (or `python -m bench.isa_fp8`).

Static ISA of our fp8 GEMM (translator_kernels.gemm.fp8: per-token x per-channel scales in the epilogue,
bf16 out) beside FlyDSL's fp8 preshuffle GEMM (kernels/gemm/preshuffle_gemm.py, in_dtype="fp8", its
per-row x per-column scales, bf16 out; compiled from $FLYDSL_SRC) at EQUAL tiles, at 4096^3 and at
Llama-3-8B shapes: VGPR / AGPR / spills, LDS, occupancy (translator_kernels.isa MODEL), the hot loop
per K step (MFMA / VALU / LDS ops / VMEM, and the bench.hotloop cycle MODEL), and a MODEL TFLOPS at
4096^3 (tiles.large_estimate with the fp8 matrix rate: wave quantization x dense peak; not a
measurement) beside the seed's measured 1347 TFLOPS for FlyDSL's kernel on MI350X.

Tiles are given in fp8 values (BK = 128 values = 32 of our kernel's 4-byte units).
"""

from __future__ import annotations

import os
import sys

import torch

from translator_kernels.gemm.quant_isa import FP8_BLOCK_GEMM
from translator_kernels.measure.fp8_isa import FP8_GEMM

SEED_TFLOPS = 1347  # ../shared/reference/seeds: FlyDSL preshuffle GEMM, fp8 4096^3, measured on MI350X
ENTRIES = {"ours": FP8_GEMM, "flydsl": "bench.isa_fp8:_compile_flydsl", "ours 128x128 block scales": FP8_BLOCK_GEMM}
SHAPES = [("4096^3", 4096, 4096, 4096), ("Llama-3-8B prefill qkv (M=4096)", 4096, 6144, 4096),
          ("Llama-3-8B prefill down (M=4096)", 4096, 4096, 14336), ("Llama-3-8B prefill qkv (M=2048)", 2048, 6144, 4096),
          ("Llama-3-8B prefill gate/up (M=2048)", 2048, 14336, 4096), ("Llama-3-8B prefill down (M=2048)", 2048, 4096, 14336)]


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
    a = p.parse_args(argv)
    print_rows(rows(tuple(a.arch or ("gfx942", "gfx950")), shapes=SHAPES if a.all_shapes else SHAPES[:1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
