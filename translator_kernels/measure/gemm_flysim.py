"""flysim's global bytes of our GEMM at the decode / mid-M table's chosen tiles (bench.calibration
--gemm-tables prints them beside the MODEL), cached in gemm_flysim.json beside this module.

flysim interprets the compiled kernel on the CPU, far too slowly for N = K = 4096 at every M: each point
runs the tile chosen for the full shape (registered for the reduced key) at N = 512, the same M and K
(so the split-K factor and the K loop are the full shape's), counts global bytes read + written, and
extrapolates with the no-cache byte formula (translator_kernels.traffic's GEMM bytes: A re-read by
every column tile, W by every row tile, split-K partials): flysim bytes at the full shape = formula
(full) x flysim / formula at N = 512. `python -m bench.calibration --flysim-bytes` refreshes the cache.
"""

from __future__ import annotations

import json
import math
import os

CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemm_flysim.json")
N_RUN = 512


def formula_bytes(m: int, n: int, k: int, cfg, esz: int = 2) -> int:
    from translator_kernels.gemm.preshuffle import padded_shape
    from translator_kernels.gemm.tiles import partial_bytes

    n_pad, k_pad = padded_shape(n, k)
    written, read = partial_bytes(m, n, k, cfg)
    w_reads = math.ceil(m / cfg.bm) * (2 if cfg.quad else 1)  # the 2 x 2 layout loads W in both wave rows
    return (m * k * math.ceil(n / cfg.bn) + n_pad * k_pad * w_reads + m * n) * esz + written + read


def measure_point(m: int, n: int, k: int, arch: str) -> dict:
    import flysim
    import torch

    from translator_kernels.gemm import choose_config, gemm, m_bucket, register_config
    from translator_kernels.gemm.preshuffle import shuffle_weight
    from translator_kernels.gemm.tiles import _OVERRIDES

    cfg = choose_config(m_bucket(m), n, k, "bf16", arch)
    key = (m_bucket(m), N_RUN, k, "bf16", arch)
    saved = _OVERRIDES.get(key)
    register_config(m_bucket(m), N_RUN, k, "bf16", arch, cfg)
    try:
        a, w = torch.randn(m, k).bfloat16(), torch.randn(N_RUN, k).bfloat16()
        ws = shuffle_weight(w)
        with flysim.simulate(arch=arch, check_races=False) as sim:
            gemm(a, ws, N_RUN, k)
    finally:
        _OVERRIDES.pop(key, None)
        if saved is not None:
            _OVERRIDES[key] = saved
    recs = [r for r in sim.launches if "gemm" in r.kernel]
    if len(recs) != 1 or not recs[0].counters.get("global_bytes_read"):
        raise RuntimeError(f"flysim recorded {[(r.kernel, r.counters.get('global_bytes_read')) for r in sim.launches]} "
                           f"for one GEMM launch at {cfg}")
    rec = recs[0]
    moved = rec.counters["global_bytes_read"] + rec.counters["global_bytes_written"]
    small, full = formula_bytes(m, N_RUN, k, cfg), formula_bytes(m, n, k, cfg)
    return dict(cfg=cfg_key(cfg), moved_small=moved, formula_small=small, formula_full=full,
                flysim_full=round(full * moved / small))


def cfg_key(cfg) -> list:
    """The config as the cache stores it: every field that changes the bytes (head, ring and the 2 x 2 layout
    included: two tiles that differ only there are different kernels)."""
    return [cfg.bm, cfg.bn, cfg.bk, cfg.split, cfg.kw, cfg.wm, cfg.head, int(cfg.ring), int(cfg.quad)]


def refresh(ms, n: int = 4096, k: int = 4096, archs=("gfx942", "gfx950")) -> dict:
    out = load()
    for arch in archs:
        for m in ms:
            out[f"{arch}:{m}:{n}:{k}"] = measure_point(m, n, k, arch)
            print(f"  flysim {arch} M={m}: {out[f'{arch}:{m}:{n}:{k}']}", flush=True)
            with open(CACHE, "w") as f:
                json.dump(out, f, indent=1, sort_keys=True)
    return out


def load() -> dict:
    if not os.path.exists(CACHE):
        return {}
    with open(CACHE) as f:
        return json.load(f)
