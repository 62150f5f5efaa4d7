"""Kernel evidence at the anchor shapes, no GPU needed:

    python -m bench.kernels [--arch gfx942 --arch gfx950] [--only softmax,gemm] [--no-traffic] [--small]

1. ISA statistics of our kernel (and FlyDSL's own, when $FLYDSL_SRC names a FlyDSL source
   checkout) at each anchor shape and arch: registers, spills, LDS, modeled occupancy, static
   instruction mix (bench.isa).
2. Traffic: flysim's counted global bytes at a reduced size / compulsory bytes, and the
   extrapolation to the anchor shape (translator_kernels.measure.traffic).
3. A roofline MODEL per kernel and arch (bench.roofline), from the compulsory bytes and from the
   extrapolated no-cache bytes (an upper bound for GEMM / attention, whose re-reads L2 serves
   in part), with the occupancy of (1).
4. GEMM (bench.isa_gemm): ours vs FlyDSL's preshuffle GEMM compiled at EQUAL tiles (ours' choice
   and FlyDSL's), with the hot-loop MODEL's matrix / vector / LDS cycles per K step
   (bench.hotloop) and the large-M MODEL (wave quantization, modeled time; on gfx950 the 8-wave
   256x256 tile beside FlyDSL's gfx950 GEMM at that tile); decode shapes (M = 1, 16, 64) with grid, workgroups per CU and the modeled
   HBM fraction (MODEL); flysim's bytes / compulsory, ours vs FlyDSL's, at countable shapes.
   The generic ISA table (1) shows our GEMM at its chosen tile only.
`--small` compiles at the reduced traffic shapes instead of the anchors (for smoke tests).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from translator_kernels.measure import traffic

from . import isa, roofline

# (label, family, dtype, anchor shape, reduced flysim shape)
ANCHORS = [
    ("softmax", "softmax", "bf16", (32768, 8192), (256, 8192)),
    ("layer_norm N=512", "layer_norm", "bf16", (32768, 512), (1024, 512)),
    ("layer_norm N=8192", "layer_norm", "bf16", (32768, 8192), (256, 8192)),
    ("rms_norm N=512", "rms_norm", "bf16", (32768, 512), (1024, 512)),
    ("rms_norm N=8192", "rms_norm", "bf16", (32768, 8192), (256, 8192)),
    ("gemm bf16", "gemm", "bf16", (4096, 4096, 4096), (256, 512, 512)),
    ("gemm f32", "gemm", "f32", (4096, 4096, 4096), (256, 512, 512)),
    ("attention causal", "attention", "bf16", (1, 2048, 32, 128), (1, 256, 2, 128)),
]


def shape_str(s) -> str:
    return "x".join(map(str, s))


def flops(family, shape) -> float:
    if family == "gemm":
        m, n, k = shape
        return 2.0 * m * n * k
    if family == "attention":
        b, s, h, d = shape
        return 4.0 * b * h * d * s * (s + 1) / 2  # causal: half of QK^T and PV
    return 0.0  # row kernels: memory-bound; their vector FLOPs are not modeled


def isa_table(rows, archs, small):
    impls = ["ours"] + (["flydsl"] if os.environ.get("FLYDSL_SRC") else [])
    # GEMM: ours only here; FlyDSL's GEMM is compared at equal tiles in the GEMM section (4)
    jobs = [(r, a, i) for r in rows for a in archs for i in impls if not (r[1] == "gemm" and i == "flydsl")]

    def one(job):
        (label, fam, dt, anchor, reduced), arch, impl = job
        try:
            return job, isa.compile_stats(impl, fam, dt, reduced if small else anchor, arch)
        except LookupError as e:
            return job, f"no FlyDSL kernel: {e}"
        except Exception as e:  # noqa: BLE001 - a failed compile is a table entry, with its reason
            return job, f"compile failed: {str(e).splitlines()[0][:120]}"

    with ThreadPoolExecutor(max_workers=2) as ex:
        results = list(ex.map(one, jobs))
    print("## ISA statistics (static; occupancy is the bench.isa MODEL)\n")
    if "flydsl" not in impls:
        print("(FlyDSL's own kernels: set FLYDSL_SRC to a FlyDSL source checkout to add them)\n")
    print("| kernel | shape | arch | impl | config | VGPR | SGPR | spills | LDS B | waves/SIMD (limit) | MFMA | "
          "VALU | SALU | VMEM loads (count x bits) | VMEM stores | LDS r/w/other | waits | barriers |")
    print("|" + "---|" * 18)
    occ = {}
    for ((label, fam, dt, anchor, reduced), arch, impl), s in results:
        shp = shape_str(reduced if small else anchor)
        if isinstance(s, str):
            print(f"| {label} | {shp} | {arch} | {impl} | {s} |" + " |" * 13)
            continue
        w, lim = s.occupancy
        occ[(label, arch, impl)] = w
        m = s.mix
        print(f"| {label} | {shp} | {arch} | {impl} | {s.config} | {s.meta['vgpr']} | {s.meta['sgpr']} | {s.spills} | "
              f"{s.meta['lds']} | {w} ({lim}) | {m.get('MFMA', 0)} | {m.get('VALU', 0)} | {m.get('SALU', 0)} | "
              f"{isa.fmt_widths(s.vmem_loads)} | {isa.fmt_widths(s.vmem_stores)} | {m.get('LDS_read', 0)}/"
              f"{m.get('LDS_write', 0)}/{m.get('LDS_other', 0)} | {m.get('wait', 0)} | {m.get('barrier', 0)} |")
    print()
    return occ


def traffic_table(rows, archs):
    print("## Global traffic (flysim counters at the reduced shape; anchor = model x flysim check)\n")
    print("| kernel | arch | flysim shape | moved B | compulsory B | moved/compulsory | flysim/model | "
          "anchor shape | anchor moved/compulsory | flysim s |")
    print("|" + "---|" * 10)
    out = {}
    for label, fam, dt, anchor, reduced in rows:
        for arch in archs[:1]:  # byte counts do not depend on the arch (same tiles, same launches)
            try:
                m = traffic.measure(fam, dt, reduced, arch)
            except Exception as e:  # noqa: BLE001 - a kernel failing under flysim is reported, not hidden
                print(f"| {label} | {arch} | {shape_str(reduced)} | flysim failed: {str(e).splitlines()[0][:160]} |"
                      + " |" * 6, flush=True)
                continue
            x = traffic.extrapolate(m, anchor)
            out[label] = x
            print(f"| {label} | {arch} | {shape_str(reduced)} | {m['moved']:,} | {m['compulsory']:,} | "
                  f"{m['moved'] / m['compulsory']:.4f} | {m['moved'] / m['model']:.4f} | {shape_str(anchor)} | "
                  f"{x['ratio']:.4f} | {m['wall_s']:.1f} |", flush=True)
    print()
    return out


def roofline_table(rows, archs, occ, moved):
    print("## Roofline MODEL at the anchor shapes (not a measurement; see bench/roofline.py)\n")
    print("| kernel | arch (GPU) | FLOPs | modeled bytes | bound | waves/SIMD | efficiency | ideal us "
          "(compulsory bytes, full occupancy) | model us (compulsory bytes, occupancy) | model us (no-cache bytes, "
          "occupancy) |")
    print("|" + "---|" * 10)
    for label, fam, dt, anchor, _ in rows:
        for arch in archs:
            f = flops(fam, anchor)
            comp = traffic.compulsory_bytes(fam, dt, anchor)
            b = moved[label]["bytes"] if label in moved else comp
            w = occ.get((label, arch, "ours"))
            ideal = roofline.kernel_time(f, comp, dt, arch)
            occ_c = roofline.kernel_time(f, comp, dt, arch, w)
            mod = roofline.kernel_time(f, b, dt, arch, w)
            print(f"| {label} | {arch} ({mod['gpu']}) | {f:.3g} | {b:,.0f} | {occ_c['bound']} | {w} | "
                  f"{occ_c['efficiency']:.2f} | {ideal['t'] * 1e6:.1f} | {occ_c['t'] * 1e6:.1f} | {mod['t'] * 1e6:.1f} |")
    print()


def gemm_section(archs, no_isa=False, no_traffic=False):
    from . import isa_gemm

    if not no_isa:
        isa_gemm.print_equal_tiles(isa_gemm.equal_tile_rows(archs))
        isa_gemm.print_decode(isa_gemm.decode_rows(archs))
    if not no_traffic:
        isa_gemm.print_flysim_traffic(isa_gemm.flysim_traffic_rows(archs[0]), archs[0])
        if "gfx950" in archs:  # the 8-wave 256x256 tile, ours and FlyDSL's
            isa_gemm.print_flysim_traffic(isa_gemm.flysim_wide_rows(), "gfx950")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernels", description=__doc__.splitlines()[0])
    p.add_argument("--arch", action="append", choices=sorted(roofline.GPUS))
    p.add_argument("--only", default="", help="comma-separated families (softmax,layer_norm,rms_norm,gemm,attention)")
    p.add_argument("--no-traffic", action="store_true")
    p.add_argument("--no-isa", action="store_true")
    p.add_argument("--small", action="store_true", help="compile at the reduced shapes (smoke test)")
    p.add_argument("--dtype", default="", help="fp8: the fp8 GEMM section only (bench.isa_fp8)")
    a = p.parse_args(argv)
    archs = a.arch or ["gfx942", "gfx950"]
    if a.dtype == "fp8":  # ours vs FlyDSL's fp8 preshuffle GEMM at equal tiles, MODEL TFLOPS beside the seed's
        from . import isa_fp8

        isa_fp8.print_rows(isa_fp8.rows(tuple(archs)))
        isa_fp8.print_decode_rows(isa_fp8.decode_rows(tuple(archs)))  # Llama-3-8B decode: split-K tiles
        return 0
    rows = [r for r in ANCHORS if not a.only or r[1] in a.only.split(",")]
    t0 = time.time()
    occ = {} if a.no_isa else isa_table(rows, archs, a.small)
    moved = {} if a.no_traffic else traffic_table(rows, archs)
    roofline_table(rows, archs, occ, moved)
    if any(r[1] == "gemm" for r in rows):
        gemm_section(archs, a.no_isa, a.no_traffic)
    print(f"(bench.kernels: {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
