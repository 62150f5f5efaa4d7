"""ISA statistics of the GEMM for one tile config: compile to AMDGPU ISA without a GPU (through
translator_kernels.isa, in a child process) and read the kernel metadata (VGPRs, SGPRs, spills,
LDS bytes, static MFMA count, occupancy bound).

    python -m bench.isa_gemm --table   (regenerates docs/gemm.md's table)
"""

from __future__ import annotations

import json
import sys

import torch

from translator_kernels.arch import NAMED_DTYPES


from translator_kernels.measure.gemm_isa import ENTRY as _ENTRY  # noqa: F401
from translator_kernels.measure.gemm_isa import compile_one as _compile_one
from translator_kernels.measure.gemm_isa import gemm_isa_text as _ours_isa_text
from translator_kernels.measure.gemm_isa import isa_stats, isa_stats_many, waves_per_simd  # noqa: F401
from translator_kernels.measure.gemm_isa import row as _row  # noqa: F401
from translator_kernels.measure.gemm_isa import spec as _spec  # noqa: F401


def gemm_isa_text(impl: str, n: int, k: int, dtype: str, arch: str, bm: int, bn: int, bk: int, split: int = 1,
                  kw: int = 1, wm: int = 1, **epilogue):
    """(ISA text, metadata dict) of our GEMM ("ours") or FlyDSL's preshuffle GEMM ("flydsl", from the
    source checkout $FLYDSL_SRC names) at one tile, compiled without a GPU in a child process."""
    from translator_kernels.hotloop import compile_isa_texts, main_text
    from translator_kernels.isa import parse_isa

    if impl == "ours":
        return _ours_isa_text(n, k, dtype, arch, bm, bn, bk, split, kw, wm, **epilogue)
    entry = "bench.isa_gemm:_compile_flydsl" + ("_a16w16" if impl == "flydsl-a16w16" else "")
    text = main_text(compile_isa_texts(entry, (n, k, dtype, bm, bn, bk), arch=arch))
    return text, max(parse_isa(text, arch), key=lambda st: st.instructions).meta


def _compile_flydsl(n, k, dtype, bm, bn, bk):
    """FlyDSL's own preshuffle GEMM at one tile (runs in the compile child; needs $FLYDSL_SRC)."""
    import os

    src = os.environ.get("FLYDSL_SRC")
    if not src:
        raise LookupError("FLYDSL_SRC is not set")
    if dtype not in ("bf16", "f16"):
        raise LookupError("FlyDSL's preshuffle GEMM takes fp8/int8/fp16/bf16 inputs, not " + dtype)
    sys.path.insert(0, src)
    from kernels.gemm.preshuffle_gemm import compile_preshuffle_gemm

    tdt = NAMED_DTYPES[dtype]
    m = 2 * bm + 1
    fn = compile_preshuffle_gemm(N=n, K=k, tile_m=bm, tile_n=bn, tile_k=bk, in_dtype={"bf16": "bf16", "f16": "fp16"}[dtype],
                                 out_dtype=dtype)
    a, w, c = torch.zeros(m * k, dtype=tdt), torch.zeros(n * k, dtype=tdt), torch.zeros(m * n, dtype=tdt)
    e = torch.zeros(0, dtype=torch.float32)
    fn(c, a, w, e, e, torch.zeros(0, dtype=tdt), m, n, None)


def _compile_flydsl_a16w16(n, k, dtype, bm, bn, bk):
    """FlyDSL's gfx950 bf16/f16 GEMM (kernels/gemm/gemm_a16w16_gfx950.py: 8 waves, A and B into LDS
    by DMA) at its default config and the given tile, B = Wᵀ as its "nt" layout takes it (runs in
    the compile child; needs $FLYDSL_SRC)."""
    import os

    src = os.environ.get("FLYDSL_SRC")
    if not src:
        raise LookupError("FLYDSL_SRC is not set")
    sys.path.insert(0, src)
    import flydsl.expr as fx
    from kernels.gemm.gemm_a16w16_gfx950 import gemm_a16w16

    tdt = NAMED_DTYPES[dtype]
    a, w = torch.zeros(2 * bm, k, dtype=tdt), torch.zeros(n, k, dtype=tdt)
    gemm_a16w16(a, w.T, out=torch.zeros(2 * bm, n, dtype=tdt), user_kwargs=dict(block_m=bm, block_n=bn, block_k=bk),
                stream=fx.Stream(None))


def markdown_table(n=4096, k=4096, archs=("gfx942", "gfx950"), dtypes=("f32", "bf16", "f16"),
                   buckets=(4, 16, 32, 64, 128)):
    """The chosen tile of every (arch, dtype, M bucket) at N x K, compiled with the full epilogue."""
    from translator_kernels.gemm import choose_config

    rows = ["| arch | dtype | M bucket | tile BMxBNxBK | kw | split | VGPR | AGPR | SGPR | spills (v/s) | LDS B | "
            "waves/SIMD | MFMA op (static count) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = [(a, d, b) for a in archs for d in dtypes for b in buckets]
    cfgs = [choose_config(mb, n, k, dt, arch) for arch, dt, mb in keys]
    stats = isa_stats_many([dict(_spec(n, k, dt, arch, c.bm, c.bn, c.bk, "gelu", True, True), split=c.split, kw=c.kw,
                                 wm=c.wm)
                            for (arch, dt, _), c in zip(keys, cfgs)])
    for (arch, dt, mb), c, s in zip(keys, cfgs, stats):
        rows.append(f"| {arch} | {dt} | {mb} | {c.bm}x{c.bn}x{c.bk} | {c.kw} | {c.split} | {s['vgpr']} | {s['agpr']} | "
                    f"{s['sgpr']} | {s['vgpr_spill']}/{s['sgpr_spill']} | {s['lds_bytes']} | {s['waves_per_simd']} | "
                    f"{', '.join(s['mfma_ops'])} ({s['mfma_static']}) |")
    return "\n".join(rows)


HEURISTIC_SHAPES = [(4096, 4096, 4096), (8192, 8192, 4096), (4096, 11008, 4096), (4096, 14336, 4096),
                    (3072, 3072, 4096), (2048, 2048, 4096), (1024, 4096, 4096), (512, 4096, 4096), (4096, 4100, 4096)]


def heuristic_table(shapes=HEURISTIC_SHAPES, archs=("gfx942", "gfx950"), dtype="bf16"):
    """Large-M shapes -> the chosen tile, beside the other candidates, with the tiles.large_estimate
    MODEL (grid, slots, wave-quantization efficiency, operand feed / MFMA time, modeled us)."""
    from translator_kernels.gemm import GemmConfig, choose_config, config_fits, large_estimate, m_bucket

    rows = ["| arch | M x N x K | tile BMxBNxBK (waves) | chosen | grid | slots | wave eff. | feed / MFMA | modeled us |",
            "|---|---|---|---|---|---|---|---|---|"]
    for arch in archs:
        for m, n, k in shapes:
            c = choose_config(m_bucket(m), n, k, dtype, arch)
            cands = [GemmConfig(128, 128, 64), GemmConfig(128, 256, 64), GemmConfig(256, 256, 64, wm=2)]
            for cfg in cands:
                if config_fits(cfg, dtype, arch) and cfg != c:
                    continue
                e = large_estimate(m, n, k, dtype, arch, cfg)
                rows.append(f"| {arch} | {m}x{n}x{k} | {cfg.bm}x{cfg.bn}x{cfg.bk} ({8 if cfg.wm > 1 else 4}) | "
                            f"{'yes' if cfg == c else ''} | {e['tiles']} | {e['slots']} | {e['wave_efficiency']:.2f} | "
                            f"{e['feed_over_mfma']:.2f} | {e['t'] * 1e6:.1f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    if sys.argv[1:] == ["--table"]:
        print(markdown_table())
    elif sys.argv[1:] == ["--heuristic"]:
        print(heuristic_table())
    else:  # one spec as JSON, compiled in this process (the caller sets COMPILE_ONLY and the dump switches)
        _compile_one(json.loads(sys.argv[1]))


# ---- bench.kernels' GEMM section: equal tiles, hot loop, decode shapes, flysim bytes ---------------
def _per_step(cfg_tile, dtype, arch, waves=4):
    """MFMAs one wave issues per K step (16x16 MFMA blocks; the tile's blocks over `waves` waves)."""
    from translator_kernels.gemm.kernel import mfma_per_block

    bm, bn, bk = cfg_tile
    return (bm // 16) * (bn // 16) * (bk // 32) * mfma_per_block(dtype, arch) // waves


def _equal_tile_jobs(arch, chosen, impls):
    """(tile, impl, wm) rows: our choice for 4096^3 beside FlyDSL's kernel at that tile (its gfx950
    8-wave GEMM for the 8-wave tile, else its preshuffle GEMM), then gfx950's previous 4-wave choice
    128x256, then 128x128x64 and FlyDSL's 128x128x128 test tile for both."""
    tile = (chosen.bm, chosen.bn, chosen.bk)
    jobs = [(tile, "ours", chosen.wm)]
    if chosen.wm > 1:
        jobs += [(tile, "flydsl-a16w16", 2)] if "flydsl" in impls else []
        jobs += [((128, 256, chosen.bk), "ours", 1)]
    for t in dict.fromkeys([tile, (128, 128, 64), (128, 128, 128)]):
        if t != tile or chosen.wm == 1:
            jobs += [(t, i, 1) for i in impls]
    return list(dict.fromkeys(jobs))


def equal_tile_rows(archs, dtype="bf16", n=4096, k=4096):
    """Per arch, per tile (ours' choice for M=4096, FlyDSL's 128x128x128 test tile, 128x128x64 and on
    gfx950 the 4-wave 128x256), ours and FlyDSL's kernel compiled at that same tile: registers,
    occupancy, the hot-loop MODEL per K step (bench.hotloop) and the large-M MODEL
    (tiles.large_estimate: wave quantization, modeled time) at 4096^3."""
    import os

    from translator_kernels.hotloop import hot_loop
    from translator_kernels.gemm import GemmConfig, choose_config, large_estimate
    from translator_kernels.isa import occupancy

    impls = ["ours"] + (["flydsl"] if os.environ.get("FLYDSL_SRC") else [])
    rows = []
    for arch in archs:
        c = choose_config(4096, n, k, dtype, arch)
        for tile, impl, wm in _equal_tile_jobs(arch, c, impls):
            try:
                text, meta = gemm_isa_text(impl, n, k, dtype, arch, *tile, **({"wm": wm} if impl == "ours" else {}))
                loop = hot_loop(text, arch)
            except Exception as e:  # noqa: BLE001 - a failed compile is a table entry, with its reason
                rows.append(dict(arch=arch, tile=tile, impl=impl, error=str(e).splitlines()[-1][:160]))
                continue
            block = meta.get("block") or 256
            steps = max(1, loop["counts"]["MFMA"] // _per_step(tile, dtype, arch, block // 64))
            w, lim = occupancy(meta["vgpr"] + meta["agpr"], meta["sgpr"], meta["lds"], block, arch)
            est = large_estimate(4096, n, k, dtype, arch, GemmConfig(*tile, wm=wm), wg_per_cu=max(1, w * 256 // block))
            rows.append(dict(arch=arch, tile=tile, impl=impl, meta=meta, waves=w, limit=lim, steps=steps, block=block,
                             loop=loop, est=est, chosen=(tile, wm) == ((c.bm, c.bn, c.bk), c.wm) and impl == "ours"))
    return rows


def loop_cells(lp, s) -> str:
    """The hot-loop table cells per K step: MFMA / VALU / LDS ops / VMEM | matrix / vector / LDS cycles | bound."""
    n = lp["counts"]
    return (f"{n['MFMA'] / s:g} / {n['VALU'] / s:g} / {n['LDS'] / s:g} / {n['vmem'] / s:g} | "
            f"{lp['matrix_cycles'] / s:g} / {lp['vector_cycles'] / s:g} / {lp['lds_cycles'] / s:g} | {lp['bound']}")


def print_equal_tiles(rows):
    print("## GEMM bf16 4096^3 at equal tiles: ours vs FlyDSL's GEMMs (static ISA; cycles are the bench.hotloop "
          "MODEL, wave quantization and time the tiles.large_estimate MODEL)\n")
    print("| arch | tile | impl | lanes / WG | VGPR | AGPR | spills | LDS B | waves/SIMD (limit) | K steps / loop iter | "
          "per K step: MFMA / VALU / LDS ops / VMEM | per K step: matrix / vector / LDS cycles | bound | "
          "tiles / slots | wave eff. | modeled us |")
    print("|" + "---|" * 16)
    for r in rows:
        tile = "x".join(map(str, r["tile"])) + (" (ours' choice)" if r.get("chosen") else "")
        if "error" in r:
            print(f"| {r['arch']} | {tile} | {r['impl']} | {r['error']} |" + " |" * 12)
            continue
        m, s, e = r["meta"], r["steps"], r["est"]
        print(f"| {r['arch']} | {tile} | {r['impl']} | {r['block']} | {m['vgpr']} | {m['agpr']} | "
              f"{m['vgpr_spill'] + m['sgpr_spill']} | {m['lds']} | {r['waves']} ({r['limit']}) | {s} | "
              f"{loop_cells(r['loop'], s)} | {e['tiles']} / {e['slots']} | {e['wave_efficiency']:.2f} | "
              f"{e['t'] * 1e6:.1f} |")
    print()


DECODE_M = (1, 16, 64)


def decode_rows(archs, dtype="bf16", n=4096, k=4096):
    """Decode shapes: the chosen config (split-K inside the launch, kw = 4 small-N tiles) and, for
    comparison, the best unsplit 16 x 64 tile of the default layout, with the compiled kernel's
    occupancy fed to translator_kernels.gemm.tiles.stream_estimate (a MODEL)."""
    from translator_kernels.gemm import GemmConfig, choose_config, m_bucket, stream_estimate
    from translator_kernels.isa import occupancy

    keys = []
    for arch in archs:
        for m in DECODE_M:
            c = choose_config(m_bucket(m), n, k, dtype, arch)
            base = GemmConfig(c.bm, 64, 256 if k % 256 == 0 else 64)
            keys += [(arch, m, cfg, cfg == c) for cfg in dict.fromkeys([c, base])]
    specs = [dict(_spec(n, k, dtype, arch, cfg.bm, cfg.bn, cfg.bk), split=cfg.split, kw=cfg.kw) for arch, _, cfg, _ in keys]
    rows = []
    for (arch, m, cfg, chosen), s in zip(keys, isa_stats_many(specs)):
        wpc = occupancy(s["vgpr"], s["sgpr"], s["lds_bytes"], 256, arch)[0]
        rows.append(dict(arch=arch, m=m, cfg=cfg, chosen=chosen, vgpr=s["vgpr"], spills=s["vgpr_spill"] + s["sgpr_spill"],
                         **stream_estimate(m, n, k, dtype, arch, cfg, wg_per_cu=wpc)))
    return rows


def print_decode(rows):
    from translator_kernels.gemm.tiles import CUS, HBM_LATENCY_S

    print(f"## GEMM decode shapes, bf16 N = K = 4096: grid and modeled HBM fraction (MODEL: tiles.stream_estimate, "
          f"{HBM_LATENCY_S * 1e6:g} us HBM latency, partial sums counted at HBM; not a measurement)\n")
    print("| arch | M | tile BMxBNxBK | kw | split | chosen | grid | grid / CUs | VGPR | spills | WG per CU (ISA) | "
          "bytes in flight | partial-sum bytes | modeled us | HBM fraction |")
    print("|" + "---|" * 15)
    for r in rows:
        c = r["cfg"]
        print(f"| {r['arch']} | {r['m']} | {c.bm}x{c.bn}x{c.bk} | {c.kw} | {c.split} | {'yes' if r['chosen'] else 'no'} | "
              f"{r['grid']} | {r['grid'] / CUS[r['arch']]:.2f} | {r['vgpr']} | {r['spills']} | {r['wg_per_cu']} | "
              f"{r['in_flight'] / 1e6:.1f} MB | {r['partial_bytes'] / 1e6:.2f} MB | {r['t'] * 1e6:.1f} | "
              f"{r['hbm_fraction']:.2f} |")
    print()


def flysim_traffic_rows(arch="gfx942"):
    """flysim's counted global bytes / compulsory, ours vs FlyDSL's, at countable shapes and equal
    tiles: 256x512x512 at 128x128x64, and a decode shape M=16 at 16x64x128 (ours also split-K 4
    ways, partial sums and the reduction launch included; FlyDSL: one launch)."""
    import os

    import flysim
    from translator_kernels.gemm import GemmConfig, gemm
    from translator_kernels.gemm.preshuffle import shuffle_weight

    src = os.environ.get("FLYDSL_SRC")
    rows = []

    def moved(sim):
        return sum(r.counters["global_bytes_read"] + r.counters["global_bytes_written"] for r in sim.launches)

    for (m, n, k), tile in (((256, 512, 512), (128, 128, 64)), ((16, 512, 512), None)):
        g = torch.Generator().manual_seed(0)
        a = (torch.randn(m, k, generator=g) / 8).to(torch.bfloat16)
        b = torch.randn(n, k, generator=g).to(torch.bfloat16)
        ref = a.float() @ b.float().T
        comp = (m * k + n * k + m * n) * 2
        for cfg in [GemmConfig(*tile)] if tile else [GemmConfig(16, 64, 128), GemmConfig(16, 64, 128, 4)]:
            with flysim.simulate(arch=arch) as sim:
                out = gemm(a, shuffle_weight(b), n, k, _config=cfg)
            rows.append((f"{m}x{n}x{k}", "ours", f"{cfg.bm}x{cfg.bn}x{cfg.bk} split {cfg.split}", len(sim.launches),
                         moved(sim), comp, (out.float() - ref).abs().max().item()))
        if not src:
            continue
        sys.path.insert(0, src)
        from kernels.gemm.preshuffle_gemm import compile_preshuffle_gemm
        from tests.utils import shuffle_weight as flydsl_shuffle

        fm, fn_, fk = tile or (16, 64, 128)
        c = torch.empty(m, n, dtype=torch.bfloat16)
        e = torch.empty(0)
        with flysim.simulate(arch=arch, strict_oob=False) as sim:
            fn = compile_preshuffle_gemm(N=n, K=k, tile_m=fm, tile_n=fn_, tile_k=fk, in_dtype="bf16", out_dtype="bf16")
            fn(c.view(-1), a.view(-1), flydsl_shuffle(b, layout=(16, 16)).contiguous().view(-1), e, e,
               torch.empty(0, dtype=torch.bfloat16), m, n, None)
        rows.append((f"{m}x{n}x{k}", "flydsl", f"{fm}x{fn_}x{fk}", len(sim.launches), moved(sim), comp,
                     (c.float() - ref).abs().max().item()))
    return rows


def print_flysim_traffic(rows, arch="gfx942"):
    print(f"## GEMM global bytes under flysim ({arch}; counted, not modeled), ours vs FlyDSL's\n")
    print("| shape MxNxK | impl | tile | launches | bytes moved | compulsory | moved / compulsory | max abs err |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        if len(row) == 4:
            print(f"| {row[0]} | {row[1]} | {row[2]} | {row[3]} |" + " |" * 4)
            continue
        shape, impl, tile, nl, mv, comp, err = row
        print(f"| {shape} | {impl} | {tile} | {nl} | {mv:,} | {comp:,} | {mv / comp:.3f} | {err:.3g} |")
    print()


def flysim_wide_rows(m=512, n=512, k=256):
    """gfx950 under flysim at a countable shape: our 8-wave 256x256x64 tile, our 4-wave 128x128x64,
    and FlyDSL's gfx950 8-wave GEMM at its default 256x256x64 (when $FLYDSL_SRC is set). Read bytes
    are A x column tiles + W x row tiles for every one: the bigger tile reads half."""
    import os

    import flysim
    from translator_kernels.gemm import GemmConfig, gemm
    from translator_kernels.gemm.preshuffle import shuffle_weight

    g = torch.Generator().manual_seed(0)
    a = (torch.randn(m, k, generator=g) / 8).to(torch.bfloat16)
    b = torch.randn(n, k, generator=g).to(torch.bfloat16)
    ref, comp, shape = a.float() @ b.float().T, (m * k + n * k + m * n) * 2, f"{m}x{n}x{k}"
    rows = []

    def moved(sim):
        return sum(r.counters["global_bytes_read"] + r.counters["global_bytes_written"] for r in sim.launches)

    for cfg in (GemmConfig(256, 256, 64, wm=2), GemmConfig(128, 128, 64)):
        with flysim.simulate(arch="gfx950") as sim:
            out = gemm(a, shuffle_weight(b), n, k, _config=cfg)
        rows.append((shape, "ours", f"{cfg.bm}x{cfg.bn}x{cfg.bk} ({8 if cfg.wm > 1 else 4} waves)", len(sim.launches),
                     moved(sim), comp, (out.float() - ref).abs().max().item()))
    src = os.environ.get("FLYDSL_SRC")
    if src:
        sys.path.insert(0, src)
        import flydsl.expr as fx
        from kernels.gemm.gemm_a16w16_gfx950 import gemm_a16w16

        for variant, kw in (("default", {}), ("half-tile interleave off", dict(use_half_tile_interleaved=False))):
            c = torch.zeros(m, n, dtype=torch.bfloat16)
            label = f"256x256x64 (8 waves, {variant})"
            try:
                with flysim.simulate(arch="gfx950", strict_oob=False) as sim:
                    gemm_a16w16(a, b.T, out=c, stream=fx.Stream(None), user_kwargs=kw)
            except Exception as e:  # noqa: BLE001 - a kernel flysim cannot run is a row with the reason
                rows.append((shape, "flydsl-a16w16", label, f"flysim failed: {str(e).splitlines()[0][:120]}"))
                continue
            rows.append((shape, "flydsl-a16w16", label, len(sim.launches), moved(sim), comp,
                         (c.float() - ref).abs().max().item()))
    return rows
