"""The GEMM tile heuristic: which BM x BN x BK tile and split-K factor a call runs with.

`choose_config(m_bucket, n, k, dtype, arch)` is called per launch with the M bucket of the
call (`m_bucket`: 16, 32, 64, then M rounded up to a multiple of 128), so one compiled
kernel serves every M of a bucket. 256 lanes = 4 waves split along N, each wave BM x BN/4.

Skinny M (bucket <= 64: decode, small batches) is bound by streaming the weight:
  - BM = the bucket (16 / 32 / 64): no MFMAs on padded rows; BN = 64 (the most workgroups).
  - BK in {32, 64, 128, 256} and split-K factor S (dividing K_pad / BK) minimize
    `stream_estimate`, a Little's-law cost: each resident workgroup keeps one K tile of loads
    in flight ((BM + BN) x BK bytes); A, which every column tile re-reads, comes from L2 when
    it fits (L2_BYTES), W streams from HBM once per row tile; the GPU reaches min(HBM bandwidth, bytes in flight /
    HBM_LATENCY_S); split-K adds S x M x N x 4 bytes of fp32 partials written and read back
    and a second launch (LAUNCH_S). Grid = M/BM x N/BN x S.
  - For N = K = 4096 bf16 this picks, on gfx942, BK = 256 with S = 2 (M = 1, 16) and S = 1
    (M = 64); on gfx950 S = 4 (M = 1, 16) and S = 2 (M = 64). More splits fill more CUs but pay
    the extra launch and the partial bytes: bench.kernels prints the rows, grid and modeled HBM
    fraction with and without the launch gap.

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

_DT = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
LDS_BYTES = {"gfx942": 64 * 1024, "gfx950": 160 * 1024}
CUS = {"gfx942": 304, "gfx950": 256}  # MI300X, MI355X
HBM_BW = {"gfx942": 5.3e12, "gfx950": 8.0e12}  # vendor peak, bytes/s
HBM_LATENCY_S = 1.0e-6  # assumed loaded HBM latency (not calibrated on hardware)
LAUNCH_S = 2.0e-6  # assumed gap a second kernel launch adds
L2_BYTES = 4 * 1024 * 1024  # L2 per XCD on MI300X and MI355X
MAX_VGPR_EST = 240  # 256 is the hard limit; fp32 128x256 estimated at 248 compiled with SGPR spills
VGPR_FILE = 512  # unified VGPR + AGPR entries per lane of a SIMD


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    bm: int
    bn: int
    bk: int
    split: int = 1  # split-K factor (splitk.py); divides K_pad / BK


_OVERRIDES: dict[tuple, GemmConfig] = {}


def m_bucket(m: int) -> int:
    for b in (16, 32, 64):
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
    m_rep, n_rep, k_blk = cfg.bm // 16, cfg.bn // 64, cfg.bk // 32
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
    if cfg.bm % 16 or cfg.bn % 64 or cfg.bk % 32 or cfg.split < 1:
        return "BM must be a multiple of 16, BN of 64, BK of 32, split >= 1"
    lds = lds_bytes(cfg, dtype)
    if lds > LDS_BYTES[arch_key(arch)]:
        return f"LDS {lds} B exceeds {LDS_BYTES[arch_key(arch)]} B on {arch}"
    if vgpr_estimate(cfg, dtype) > MAX_VGPR_EST:
        return f"~{vgpr_estimate(cfg, dtype)} VGPRs exceeds {MAX_VGPR_EST}"
    return None


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
    partial = cfg.split * m * n * 4 if cfg.split > 1 else 0
    out_bytes = m * n * esz
    per_wg = (gemm_bytes + partial) / grid
    full, rem = divmod(grid, slots)
    t = full * slots * per_wg / bw(slots) + (rem * per_wg / bw(rem) if rem else 0.0)
    if cfg.split > 1:  # the reduction kernel: reads the partials, writes C (one pass, full grid)
        t += (partial + out_bytes) / HBM_BW[a] + LAUNCH_S
    else:
        t += out_bytes / HBM_BW[a]
    compulsory = (m * k + n * k + m * n) * esz
    return dict(grid=grid, wg_per_cu=wpc, resident=min(grid, slots), in_flight=in_flight * min(grid, slots),
                bytes=gemm_bytes + 2 * partial + out_bytes, compulsory=compulsory, t=t,
                hbm_fraction=compulsory / HBM_BW[a] / t,
                hbm_fraction_no_launch=compulsory / HBM_BW[a] / (t - (LAUNCH_S if cfg.split > 1 else 0.0)))


def _skinny(mb: int, n: int, k: int, dt: str, arch: str) -> GemmConfig:
    k_pad = padded_shape(n, k)[1]
    best = None
    for bk in (32, 64, 128, 256):
        if k_pad % bk:
            continue
        nkt = k_pad // bk
        for s in (d for d in range(1, nkt + 1) if nkt % d == 0):
            cfg = GemmConfig(mb, 64, bk, s)
            if config_fits(cfg, dt, arch):
                continue
            t = stream_estimate(mb, n, k, dt, arch, cfg)["t"]
            if best is None or t < best[0] * 0.98:  # a clear gain only: else fewer splits, smaller BK
                best = (t, cfg)
    return best[1] if best else GemmConfig(mb, 64, 32)


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
    reason = config_fits(cfg, _DT.get(dtype, dtype), arch)
    if not reason and (padded_shape(n, k)[1] // cfg.bk) % cfg.split:
        reason = f"split {cfg.split} does not divide the K tiles"
    if reason:
        raise KernelInputError(f"gemm: config {cfg} rejected: {reason}")
    _OVERRIDES[(m_bucket, n, k, _DT.get(dtype, dtype), arch_key(arch))] = cfg
