"""MODEL times (not measurements: no AMD GPU here) of one MoE layer's experts on MI300X / MI355X.

Mixtral-8x7B (E = 8, k = 2, H = 4096, I = 14336) and Qwen3-30B-A3B (E = 128, k = 8, H = 2048, I = 768),
bf16, decode at batch 1 and 16 and a 2k-token prefill: the five launches of `moe_experts` and the gating
launch (translator_kernels/moe), each priced by the timing MODEL (translator_kernels.timing, read-only):

  grouped GEMMs   tiles.model_features at the tile `grouped_config` picks + timing.launch_time; grid =
                  the real row tiles (those that hold rows: the kernel's other workgroups, up to cap / BM
                  row tiles, exit after one tile-map read, moe/tile_exit.py; where the launch has more
                  workgroups than slots, each round of those is charged one memory latency), iterations
                  K_pad / BK, HBM bytes = per routed
                  expert, timing.gemm_hbm_bytes of its rows. Column "full grid": the same launch before the
                  early exit, every cap / BM row tile running its K loop (its HBM bytes as above: the tail
                  tiles read expert 0's weights, which the model counts only once, with expert 0's own tiles).
  moe_align       one workgroup; per pass (two) and per chunk of 256 ids one global load (a memory latency,
                  the model's) and a barrier, then every lane scans the chunk in LDS: T·k iterations per
                  pass, each max(its issue cycles from the compiled ISA's loop (timing.features),
                  LDS_LATENCY) as one LDS read feeds the next compare. LDS_LATENCY is an assumption (not
                  fitted). Column "align before": the kernel before the LDS staging, one dependent global
                  read per id, priced at the timing MODEL's loop floor (a memory latency per iteration);
                  the ids are L2 hits on hardware, so that column overstates it by the L2 / HBM latency
                  ratio, but it stays serial in T·k.
  gating, gather, un-permute   launch floor + bytes at the fitted HBM efficiency (row kernels, memory-bound);
                  the gather writes the rows of the real tiles only (permute.py: src_row -2 past the total).

Routing is taken as uniform: a decode batch of B tokens reaches E·(1 - (1 - k/E)^B) experts (expected),
each with B·k / that many rows; the prefill's T·k pairs spread evenly over all E experts.

    python -m bench.moe_model          # table, both archs (compiles moe_align once per arch and shape)
"""

from __future__ import annotations

import math

import torch

from bench.isa_moe import parse_archs
from translator_kernels.arch import GPUS
from translator_kernels.gemm.gated import gated_shape
from translator_kernels.gemm.preshuffle import padded_shape
from translator_kernels.gemm.tiles import arch_key, model_features, partial_bytes
from translator_kernels.moe.grouped import capacity, grouped_config, grouped_split
from translator_kernels.timing import CALIBRATION, Launch, features, gemm_hbm_bytes, launch_time

MODELS = {"Mixtral-8x7B": dict(e=8, k=2, h=4096, i=14336), "Qwen3-30B-A3B": dict(e=128, k=8, h=2048, i=768)}
PHASES = {"decode b=1": 1, "decode b=16": 16, "prefill 2k": 2048}
ESZ = 2  # bf16
LDS_LATENCY = 128  # cycles from an LDS read to its use (an assumption: not measured or fitted here)


def _align_entry(e: int, k: int, bm: int, t: int, arch: str):
    """Compile moe_align for T = t tokens (runs in the compile child, COMPILE_ONLY)."""
    from translator_kernels.moe.permute import build_moe_align

    cap = capacity(t * k, e, bm)
    ids = torch.zeros(t * k * 2, dtype=torch.int32)
    src, tiles, pos = (torch.zeros(n, dtype=torch.int32) for n in (cap, cap // bm, t * k))
    build_moe_align.__wrapped__(e, k, bm, 2, arch, 0)(ids, src, tiles, pos, t * k, cap, ids.numel() * 4)


def routed(e: int, k: int, t: int) -> tuple[float, list[int]]:
    """(experts reached, rows of each) under uniform routing."""
    if t * k >= 4 * e:  # prefill: every expert, T·k / E rows each
        return e, [t * k // e] * e
    n = e * (1 - (1 - k / e) ** t)
    active = max(k, round(n))
    per = t * k / active
    return n, [math.ceil(per)] * active


def memory_floor(nbytes: float, arch: str) -> float:
    g = GPUS[arch]
    return g.timing["launch_s"] + nbytes / (g.timing["hbm_efficiency"] * g.hbm_bytes_per_s)


def align_time(feat, pairs: int, arch: str) -> float:
    """moe_align's MODEL time (module docstring)."""
    g = GPUS[arch]
    chunks = -(-pairs // 256)
    per_id = max(feat.loop_vector + feat.loop_lds + feat.loop_matrix, LDS_LATENCY) / g.clock_hz
    return g.timing["launch_s"] + 2 * (chunks * g.timing["mem_latency_s"] + pairs * per_id)


def grouped_time(rows: list[int], cap: int, n: int, k: int, gated: bool, cfg, arch: str, early_exit: bool = True) -> float:
    """MODEL seconds of one grouped GEMM over experts holding `rows` rows each (module docstring)."""
    g = GPUS[arch]
    n_pad, k_pad = gated_shape(n, k) if gated else padded_shape(n, k)
    feat = model_features(cfg, "bf16", arch)
    m_tiles = sum(-(-r // cfg.bm) for r in rows) if early_exit else cap // cfg.bm
    per_row_tile = -(-n_pad // cfg.bn) * cfg.split
    slots = g.cus * max(1, feat.waves_per_simd * g.simds // feat.waves_per_wg)
    hbm = sum(gemm_hbm_bytes(r, n_pad, k_pad, ESZ, ESZ, ESZ, cfg.bm, cfg.bn, slots, g.llc_bytes) for r in rows)
    hbm += sum(partial_bytes(m_tiles * cfg.bm, n, k, cfg))  # split-K's fp32 partials (written, read back)
    flops = 2.0 * sum(rows) * n * k
    t = launch_time(feat, Launch(m_tiles * per_row_tile, k_pad // (cfg.bk * cfg.split), hbm, flops), arch)["t"]
    exiting = (cap // cfg.bm - m_tiles) * per_row_tile  # one tile-map read each, then gone
    if (m_tiles * per_row_tile + exiting) <= slots:  # they take slots the real tiles leave free
        return t
    return t + math.ceil(exiting / slots) * g.timing["mem_latency_s"]


def layer(name: str, phase: str, arch: str, align_feat) -> dict:
    c, t = MODELS[name], PHASES[phase]
    e, k, h, i = c["e"], c["k"], c["h"], c["i"]
    n_exp, rows = routed(e, k, t)
    up = grouped_config(-(-t * k // e), i, h, torch.bfloat16, gated=True)
    dn = grouped_config(-(-t * k // e), h, i, torch.bfloat16, gated=False)
    dn = type(dn)(up.bm, dn.bn, dn.bk)
    cap = capacity(t * k, e, up.bm)
    dn1 = dn
    dn = grouped_split(cap // up.bm, h, i, dn, arch)  # what moe_experts runs (split-K where the grid is small)
    pairs = t * k
    real_rows = sum(-(-r // up.bm) for r in rows) * up.bm
    out = {
        "gating": memory_floor(t * e * 4 + pairs * 12, arch),
        "align": align_time(align_feat, pairs, arch),
        "gather": memory_floor(t * h * ESZ + cap * 4 + real_rows * h * ESZ, arch),  # no row past the real total
        "gate/up": grouped_time(rows, cap, i, h, True, up, arch),
        "down": grouped_time(rows, cap, h, i, False, dn, arch),
        "unpermute": memory_floor(pairs * (h * ESZ + 8) + t * h * ESZ, arch),
    }
    full = grouped_time(rows, cap, i, h, True, up, arch, False) + grouped_time(rows, cap, h, i, False, dn, arch, False)
    down_unsplit = grouped_time(rows, cap, h, i, False, dn1, arch)
    weights = n_exp * 3 * h * i * ESZ
    g = GPUS[arch]
    before = g.timing["launch_s"] + 2 * pairs * g.timing["mem_latency_s"]
    return dict(model=name, phase=phase, arch=arch, align_before=before, experts=n_exp, tile=f"{up.bm}x{up.bn}/{dn.bn}" + (f" split {dn.split}" if dn.split > 1 else ""), cap=cap,
                down_unsplit=down_unsplit,
                parts=out, total=sum(out.values()), gemm_full=full, tiles=(sum(-(-r // up.bm) for r in rows), cap // up.bm), weight_floor=weights / GPUS[arch].hbm_bytes_per_s)


def rows(archs=("gfx942", "gfx950")) -> list[dict]:
    from translator_kernels.hotloop import compile_isa_texts, main_text

    out = []
    for arch in archs:
        a = arch_key(arch)
        for name, c in MODELS.items():
            for phase, t in PHASES.items():
                bm = grouped_config(-(-t * c["k"] // c["e"]), c["i"], c["h"], torch.bfloat16, gated=True).bm
                text = main_text(compile_isa_texts("bench.moe_model:_align_entry", (c["e"], c["k"], bm, t, a), arch=a))
                out.append(layer(name, phase, a, features(text, a)))
    return out


def markdown(rs) -> str:
    gpu = {"gfx942": "MI300X", "gfx950": "MI355X"}
    keys = list(rs[0]["parts"])
    lines = [f"| GPU | model | phase | experts reached | tile BMxBN (up/down) | row tiles run / launched | "
             f"{' | '.join(keys)} | total | GEMMs, full grid (before the exit) | weights at peak HBM | align before | "
             "down unsplit |", "|" + "---|" * (len(keys) + 11)]
    for r in rs:
        us = " | ".join(f"{1e6 * r['parts'][k]:.1f}" for k in keys)
        gemm = r["parts"]["gate/up"] + r["parts"]["down"]
        lines.append(f"| {gpu[r['arch']]} | {r['model']} | {r['phase']} | {r['experts']:.1f} | {r['tile']} | "
                     f"{r['tiles'][0]} / {r['tiles'][1]} | {us} | "
                     f"**{1e6 * r['total']:.1f}** | {1e6 * r['gemm_full']:.1f} (vs {1e6 * gemm:.1f}) | "
                     f"{1e6 * r['weight_floor']:.1f} | {1e6 * r['align_before']:.0f} | {1e6 * r['down_unsplit']:.1f} |")
    return "\n".join(lines)


def main(argv=None):
    archs = parse_archs(argv, __doc__)
    print("MODEL times in microseconds, one MoE layer's experts, bf16 (translator_kernels.timing; not measured)")
    print(markdown(rows(archs)))
    print(f"\ncalibration: {CALIBRATION}; gfx942 takes gfx950's fitted fractions and latency (no MI300X points)")


if __name__ == "__main__":
    main()
