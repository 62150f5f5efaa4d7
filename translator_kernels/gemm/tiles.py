"""The GEMM tile heuristic: which BM x BN x BK tile and split-K factor a call runs with.

`choose_config(m_bucket, n, k, dtype, arch)` is called per launch with the M bucket of the
call (`m_bucket`: 4, 16, 32, 64, then M rounded up to a multiple of 128), so one compiled
kernel serves every M of a bucket. 256 lanes = 4 waves; `kw` says how they share a tile:
kw = 1 splits BN (each wave BM x BN/4), kw = 4 splits each BK tile (each wave BM x BN, the
waves' sums added through LDS).

Skinny M (bucket <= 64: decode, small batches) is bound by streaming the weight:
  - BM = max(16, bucket): no MFMAs on padded rows beyond the 16-row MFMA minimum.
  - Candidates: kw = 1 with BN = 64, kw = 4 with BN in {16, 32, 64}; BK in {32, ..., 256}; split-K
    factor S (dividing K_pad / BK, at most MAX_SPLIT) whose partials meet inside the launch
    (splitk.py). Each is scored by `stream_estimate`, a Little's-law cost: each resident workgroup
    keeps one K tile of loads in flight ((rows + BN) x BK bytes); A, which every column tile
    re-reads, comes from L2 when it fits (L2_BYTES), W streams from HBM once per row tile; the
    GPU reaches min(HBM bandwidth, bytes in flight / HBM_LATENCY_S); split-K adds its fp32
    partials (`partial_bytes`: S x the tile written, S - 1 read back, all counted at HBM).
  - Among the candidates whose grid covers GRID_PER_CU (2) x the CUs, the least modeled time
    wins; within 2 % of it, fewer splits, then the smaller BK.
  - For N = K = 4096 bf16 this picks BN = 16, kw = 4 (256 column tiles): on gfx942 S = 4 (grid
    1024 = 3.4 x 304 CUs), on gfx950 S = 4 (M <= 4) or 2 (grid 512 = 2 x 256 CUs); modeled HBM
    fraction 0.82-0.99 (bench.kernels prints the rows beside the unsplit 16x64 tile).

Large M (bucket > 64) is bound by the MFMAs; the tile trades A/W reuse against how evenly the
workgroups fill the machine (wave quantization):
  - candidates 128x128 and 128x256, BK = 64 (fp32 32). Workgroups per CU come from the
    estimated VGPRs (512 per lane / VGPRs) and LDS (2 stages of BM x BK), slots = CUs x that;
  - the candidate whose tiles fill the most of their waves (tiles / (waves x slots)) wins,
    ties go to 128x128 (more workgroups per CU to hide latency). gfx950, 4096^2: 128x128 is
    1024 tiles on 3 x 256 = 768 slots (0.67), 128x256 is 512 tiles on 2 x 256 = 512 (1.00).
    gfx942: both 0.84, so 128x128. A 256x256 tile would need 2 waves per SIMD of accumulators
    (it spills with this kernel's 4-wave layout), so it is not a candidate.
  - Checked for every choice: 2 LDS stages fit the arch (64 KiB gfx942, 160 KiB gfx950) and
    the register estimate stays under MAX_VGPR_EST (240) VGPRs.

Everything here is a model of a GPU we do not have: `register_config` overrides the choice for
one key and `autotune` (translator_kernels.gemm) times candidates on a real GPU and registers
the fastest.
"""

from __future__ import annotations

import dataclasses

import torch

from translator_kernels.gemm.kernel import THREADS
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.preshuffle import padded_shape
from translator_kernels.plan import clear_plans

_DT = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
LDS_BYTES = {"gfx942": 64 * 1024, "gfx950": 160 * 1024}
CUS = {"gfx942": 304, "gfx950": 256}  # MI300X, MI355X
HBM_BW = {"gfx942": 5.3e12, "gfx950": 8.0e12}  # vendor peak, bytes/s
HBM_LATENCY_S = 1.0e-6  # assumed loaded HBM latency (not calibrated on hardware)
GRID_PER_CU = 2  # decode tiles: workgroups per CU the grid should at least cover (latency hiding)
MAX_SPLIT = 16
L2_BYTES = 4 * 1024 * 1024  # L2 per XCD on MI300X and MI355X
MAX_VGPR_EST = 240  # 256 is the hard limit; fp32 128x256 estimated at 248 compiled with SGPR spills
VGPR_FILE = 512  # unified VGPR + AGPR entries per lane of a SIMD


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    bm: int
    bn: int
    bk: int
    split: int = 1  # split-K factor across workgroups (splitk.py); divides K_pad / BK
    kw: int = 1  # waves splitting each K tile inside a workgroup (1: the 4 waves split BN; 4: they split BK)


_OVERRIDES: dict[tuple, GemmConfig] = {}


def m_bucket(m: int) -> int:
    for b in (4, 16, 32, 64):
        if m <= b:
            return b
    return -(-m // 128) * 128


def arch_key(arch: str) -> str:
    return "gfx950" if arch.startswith("gfx950") else "gfx942"


def _esize(dtype: str) -> int:
    return 4 if dtype == "f32" else 2


def vgpr_estimate(cfg: GemmConfig, dtype: str) -> int:
    """Accumulators + 2 W register sets + A staging + ~3 live A operands + addresses (the scheduled
    loop keeps A operands two ahead; compiled 128x128x64 bf16: 134, estimate 140)."""
    m_rep, n_rep, k_blk = cfg.bm // 16, cfg.bn * cfg.kw // 64, cfg.bk // 32 // cfg.kw
    lph = 2 if dtype == "f32" else 1
    a_loads = -(-(cfg.bm * cfg.bk * _esize(dtype) // 16) // THREADS)
    return m_rep * n_rep * 4 + 2 * n_rep * k_blk * lph * 4 + a_loads * 4 + min(m_rep, 3) * lph * 4 + 16


def lds_bytes(cfg: GemmConfig, dtype: str) -> int:
    return 2 * cfg.bm * cfg.bk * _esize(dtype)


def workgroups_per_cu(cfg: GemmConfig, dtype: str, arch: str) -> int:
    """Estimated resident workgroups per CU (one wave per SIMD each), by VGPRs and LDS."""
    by_vgpr = VGPR_FILE // (-(-vgpr_estimate(cfg, dtype) // 8) * 8)
    return max(1, min(8, by_vgpr, LDS_BYTES[arch_key(arch)] // lds_bytes(cfg, dtype)))


def config_fits(cfg: GemmConfig, dtype: str, arch: str) -> str | None:
    """None if the config is legal on `arch`, else the reason."""
    if cfg.kw not in (1, 4):
        return "kw (waves splitting K) must be 1 or 4"
    if cfg.bm % 16 or cfg.bn % (64 // cfg.kw) or cfg.bk % (32 * cfg.kw) or cfg.split < 1:
        return (f"BM must be a multiple of 16, BN of {64 // cfg.kw}, BK of {32 * cfg.kw} (kw={cfg.kw}), "
                f"split >= 1")
    lds = lds_bytes(cfg, dtype)
    if lds > LDS_BYTES[arch_key(arch)]:
        return f"LDS {lds} B exceeds {LDS_BYTES[arch_key(arch)]} B on {arch}"
    if vgpr_estimate(cfg, dtype) > MAX_VGPR_EST:
        return f"~{vgpr_estimate(cfg, dtype)} VGPRs exceeds {MAX_VGPR_EST}"
    return None


def partial_bytes(m: int, n: int, k: int, cfg: GemmConfig) -> tuple[int, int]:
    """(written, read) bytes of split-K's fp32 partial tiles (splitk.py): every split stores its
    lanes' accumulators (rows rounded up to 4 per lane), the last arriver reads the other splits."""
    if cfg.split == 1:
        return 0, 0
    n_pad = padded_shape(n, k)[0]
    tiles_m = -(-m // cfg.bm)
    rows = min(tiles_m * cfg.bm, -(-m // 4) * 4)
    per_split = rows * (-(-n_pad // cfg.bn) * cfg.bn) * 4
    return cfg.split * per_split, (cfg.split - 1) * per_split


def stream_estimate(m: int, n: int, k: int, dtype: str, arch: str, cfg: GemmConfig,
                    wg_per_cu: int | None = None) -> dict:
    """Modeled time of a weight-streaming GEMM (module docstring): grid, bytes, seconds."""
    a = arch_key(arch)
    esz = _esize(dtype)
    n_pad, k_pad = padded_shape(n, k)
    tiles_m, tiles_n = -(-m // cfg.bm), -(-n_pad // cfg.bn)
    grid = tiles_m * tiles_n * cfg.split
    wpc = wg_per_cu or workgroups_per_cu(cfg, dtype, a)
    slots = CUS[a] * wpc
    rows = min(m, cfg.bm)
    in_flight = (rows + cfg.bn) * cfg.bk * esz  # one K tile of A and W per workgroup

    def bw(resident):
        return min(HBM_BW[a], resident * in_flight / HBM_LATENCY_S)

    a_bytes = m * k * esz
    a_reads = 1 if a_bytes <= L2_BYTES else tiles_n  # A is re-read by every column tile: from L2 if it fits
    gemm_bytes = a_reads * a_bytes + tiles_m * n_pad * k_pad * esz
    p_written, p_read = partial_bytes(m, n, k, cfg)
    out_bytes = m * n * esz
    per_wg = (gemm_bytes + p_written + p_read + out_bytes) / grid
    full, rem = divmod(grid, slots)
    t = full * slots * per_wg / bw(slots) + (rem * per_wg / bw(rem) if rem else 0.0)
    compulsory = (m * k + n * k + m * n) * esz
    return dict(grid=grid, wg_per_cu=wpc, resident=min(grid, slots), in_flight=in_flight * min(grid, slots),
                bytes=gemm_bytes + p_written + p_read + out_bytes, partial_bytes=p_written + p_read,
                compulsory=compulsory, t=t, hbm_fraction=compulsory / HBM_BW[a] / t)


def _skinny(mb: int, n: int, k: int, dt: str, arch: str) -> GemmConfig:
    """The decode tile: the candidate with the least modeled time among those whose grid covers
    GRID_PER_CU x the CUs (all candidates when none does)."""
    k_pad = padded_shape(n, k)[1]
    cands = []
    for kw, bn in ((1, 64), (4, 16), (4, 32), (4, 64)):
        for bk in (32, 64, 128, 256):
            if k_pad % bk or bk % (32 * kw):
                continue
            nkt = k_pad // bk
            for s in (d for d in range(1, min(nkt, MAX_SPLIT) + 1) if nkt % d == 0):
                cfg = GemmConfig(max(16, mb), bn, bk, s, kw)
                if not config_fits(cfg, dt, arch):
                    cands.append((stream_estimate(mb, n, k, dt, arch, cfg), cfg))
    if not cands:
        return GemmConfig(max(16, mb), 64, 32)
    full = [c for c in cands if c[0]["grid"] >= GRID_PER_CU * CUS[arch_key(arch)]] or cands
    best_t = min(e["t"] for e, _ in full)
    # within 2 % of the best: fewer splits (less partial traffic), then the smaller BK (less LDS)
    return min((c for c in full if c[0]["t"] <= best_t * 1.02), key=lambda c: (c[1].split, c[1].bk))[1]


def wave_efficiency(tiles: int, slots: int) -> float:
    return tiles / (-(-tiles // slots) * slots)


def _large(mb: int, n: int, k: int, dt: str, arch: str) -> GemmConfig:
    n_pad, k_pad = padded_shape(n, k)
    bk = 32 if dt == "f32" else 64
    cands = [GemmConfig(128, 128 if n_pad >= 256 else 64, bk)] + ([GemmConfig(128, 256, bk)] if n_pad >= 512 else [])
    scored = []
    for c in cands:
        if config_fits(c, dt, arch) or k_pad % c.bk:
            continue
        tiles = -(-mb // c.bm) * -(-n_pad // c.bn)
        scored.append((wave_efficiency(tiles, CUS[arch_key(arch)] * workgroups_per_cu(c, dt, arch)), c))
    if not scored:
        return cands[0]
    return max(scored, key=lambda sc: sc[0] + 1e-9 * (sc[1] == cands[0]))[1]


def choose_config(m_bucket: int, n: int, k: int, dtype, arch: str) -> GemmConfig:
    """The documented tile heuristic (module docstring); `dtype` is a torch dtype or 'f32'/'bf16'/'f16'."""
    dt = _DT.get(dtype, dtype)
    key = (m_bucket, n, k, dt, arch_key(arch))
    if key in _OVERRIDES:
        return _OVERRIDES[key]
    k_pad = padded_shape(n, k)[1]
    cfg = _skinny(m_bucket, n, k, dt, arch) if m_bucket <= 64 else _large(m_bucket, n, k, dt, arch)
    while (config_fits(cfg, dt, arch) or k_pad % cfg.bk) and cfg.bk > 32:
        cfg = GemmConfig(cfg.bm, cfg.bn, cfg.bk // 2)
    reason = config_fits(cfg, dt, arch)
    if reason:
        raise KernelInputError(f"gemm: no legal tile for M<={m_bucket} N={n} K={k} {dt} {arch}: {reason}")
    return cfg


def register_config(m_bucket: int, n: int, k: int, dtype, arch: str, cfg: GemmConfig) -> None:
    """Use `cfg` for this key from the next call on (per-call plans that kept the old tile are dropped)."""
    reason = config_fits(cfg, _DT.get(dtype, dtype), arch)
    if not reason and (padded_shape(n, k)[1] // cfg.bk) % cfg.split:
        reason = f"split {cfg.split} does not divide the K tiles"
    if reason:
        raise KernelInputError(f"gemm: config {cfg} rejected: {reason}")
    _OVERRIDES[(m_bucket, n, k, _DT.get(dtype, dtype), arch_key(arch))] = cfg
    clear_plans()
