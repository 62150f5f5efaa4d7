"""The GEMM tile heuristic: which BM x BN x BK tile and split-K factor a call runs with.

`choose_config(m_bucket, n, k, dtype, arch)` is called per launch with the M bucket of the
call (`m_bucket`: 4, 16, 32, 64, then M rounded up to a multiple of 128), so one compiled
kernel serves every M of a bucket. 256 lanes = 4 waves; `kw` says how they share a tile:
kw = 1 splits BN (each wave BM x BN/4), kw = 4 splits each BK tile (each wave BM x BN, the
waves' sums added through LDS).

Skinny M (bucket <= 64: decode, small batches) is bound by streaming the weight:
  - BM in {16, 32, max(16, bucket)} (at most the bucket): no MFMAs on padded rows beyond the 16-row
    MFMA minimum; row tiles of 16 / 32 at M = 64 give more workgroups, each with fewer A rows
    (N = K = 4096: 0.66 -> 0.82 of achievable HBM on gfx942 under the refit MODEL).
  - Candidates: kw = 1 with BN = 64, kw = 4 with BN in {16, 32, 64}; BK in {32, ..., 256}; split-K
    factor S (dividing K_pad / BK, at most MAX_SPLIT) whose partials meet inside the launch
    (splitk.py). Each is ranked by the timing MODEL (`model_estimate`, below).
  - `stream_estimate`, the decode estimator, is a Little's-law cost: each resident workgroup keeps
    one K tile of W in flight (BN x BK bytes: the HBM bytes in flight; A, which every column
    tile re-reads, comes from L2 when it fits, L2_BYTES, and is not HBM traffic in flight); the
    GPU reaches min(HBM bandwidth, bytes in flight / HBM_LATENCY_S); split-K adds its fp32
    partials (`partial_bytes`: S - 1 tiles written and read back, all counted at HBM).
    Counting A's bytes in flight (before issue 29) made tiles whose in-flight bytes were mostly A
    look as fast as ones streaming W, and gave 0.82-0.99 of HBM where W alone gives 0.24-0.75.
  - Among the candidates whose grid covers GRID_PER_CU (2) x the CUs, the least modeled time
    wins; within 2 % of it, fewer splits, then the smaller BK.

Mid M (65 <= M <= 2048: batched decode, chunked prefill) ranks the same way: the large tiles
(128 x 128, 128 x 256, gfx950's 8-wave tile) beside split-K and small-N 4-wave tiles with BM = 16..128,
BK up to 512, with and without a short first K tile (`head` = 32: kernel.py; the prologue every resident
workgroup loads at once shrinks BK / head times) and a W register ring (`ring`, BK <= 256: one W set instead
of two, so twice the columns per wave fit and A's LDS bytes per MFMA halve), all by `model_estimate`, among those whose grid gives
every CU a workgroup (all when none does, or when one that leaves CUs idle is modeled MID_MARGIN faster), by
`rank_t` (the MODEL's cycles at the boost clock: timing's measured matrix ceiling t_maf, the same for every tile of
a launch, left out);
within 2 % of the least time the large tile, then fewer splits, then the smaller BK. The
large tile stays unless the best other one is modeled at least MID_MARGIN (12 %, the model's median
validation error) faster; margins compare kernel times (the harness's launch floor left out). Above
M = 256 the 16-row, small-N and split > 8 candidates are skipped (none wins there; each evaluation is
linear in the grid). Decode ranks head 0 / 32 too. Only weights of at least L2_BYTES (4 MiB: N = K = 1448 in bf16) take this
path, and smaller ones whose large tile starves the GPU (`_starved`: a grid under half the CUs and K >= 1024, at
any M: a MoE router, N = 64, K = 7168, at M = 128 ran one workgroup over all of K, 237 us in the MODEL, now a
split-K tile at 2 us): a short-K small GEMM is a few microseconds, below every measured point the model was
validated on (and a split small-N tile at 256 x 512 x 512 moves 6x the bytes, 30x the flysim time). Before issue 29, M = 128 at N = K = 4096 took 128 x 128 unsplit:
32 workgroups on 256-304 CUs.

`model_estimate` runs translator_kernels.timing (a MODEL fitted on measured MI350X kernels; its
calibration error is timing.CALIBRATION) on features estimated from the config (no compile): the
MFMA cycles of one K tile per wave, A's LDS round trip, W's K tile per workgroup as the HBM bytes
in flight, occupancy from `workgroups_per_cu`, the grid with its split-K factor, HBM bytes with
L2 / last-level-cache reuse (timing.gemm_hbm_bytes) plus the split-K partials, and the bytes every workgroup
loads through the L2s (`l2_bytes`: timing's t_l2, which makes small row tiles pay for re-reading W). A short first tile's
two partial K steps are priced by their share of a tile's MFMA and LDS work (`_partial_step`: each
still pays the loop's vector work, a round trip and the latency floor), not as two full steps.

Large M (bucket > 64) is bound by the MFMAs; the tile trades A/W reuse against how evenly the
workgroups fill the machine (wave quantization):
  - 4-wave candidates 128x128 and 128x256, BK = 64 (fp32 32). Workgroups per CU come from the
    estimated VGPRs (512 per lane / VGPRs) and LDS (2 stages of BM x BK), slots = CUs x that;
    the candidate whose tiles fill the most of their waves (tiles / (waves x slots)) wins, ties
    go to 128x128 (more workgroups per CU to hide latency). gfx942, 4096^2: both 0.84, so 128x128.
  - gfx950 (bf16 / fp16, N a multiple of 8, K_pad of 64) adds the 8-wave 256x256x64 tile
    (wm = 2, wide.py: A and W into LDS by DMA, 2 stages = 128 KiB of the 160 KiB,
    one workgroup = 2 waves per SIMD per CU). It is taken over the 4-wave choice when its wave
    efficiency is at least as high AND its modeled time (`large_estimate`) is not longer: then
    it does the same MFMA work moving a third fewer bytes per FLOP than 128x256 (half of
    128x128's). Where 256 tiles waste work (row or column tiles mostly padding, or too few
    tiles to give every CU one) the model's time is longer and the 4-wave tile stays:
    4096^2 -> 256x256 (256 tiles on 256 CUs), 2048^2 or 3072^2 -> 128x128 (docs/gemm.md's table).
  - Checked for every choice: 2 LDS stages fit the arch (64 KiB gfx942, 160 KiB gfx950) and
    the register estimate stays under MAX_VGPR_EST (240; 256 for the 8-wave tile, compiled 220).

`large_estimate` (a MODEL): the busiest CU runs ceil(tiles / CUs) tiles one after another at its
full matrix rate (its resident workgroups share the MFMA units), each tile taking the longer of
its MFMA time (2 BM BN K_pad / the CU's dense peak) and its operand feed ((BM + BN) K_pad bytes at
L1_FILL_BYTES_PER_CLK, an assumed 64 B per clock per CU); no faster than the vendor's measured
Max-Achievable FLOPs where published (MI300X: `t_boost` is the time without that ceiling). At 4096^3 bf16 on gfx950 every
candidate is MFMA-bound at 54.6 us; the feed takes 100 % (128x128), 75 % (128x256) and 50 %
(256x256) of the MFMA time: the 256 tile leaves the most slack to L2 / HBM.

Everything here is a model of a GPU we do not have: `register_config` overrides the choice for
one key and `autotune` (translator_kernels.gemm) times candidates on a real GPU and registers
the fastest.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from translator_kernels.gemm.kernel import THREADS
from translator_kernels.arch import FLOAT_NAMES, GPUS
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.preshuffle import padded_shape
from translator_kernels.replay import clear_replays

_DT = FLOAT_NAMES
# views of the one table of hardware facts (translator_kernels.arch.GPUS)
LDS_BYTES = {a: g.lds_bytes for a, g in GPUS.items()}
CUS = {a: g.cus for a, g in GPUS.items()}
HBM_BW = {a: g.hbm_bytes_per_s for a, g in GPUS.items()}  # vendor peak, bytes/s
HBM_LATENCY_S = 1.0e-6  # assumed loaded HBM latency (not calibrated on hardware)
GRID_PER_CU = 2  # decode tiles: workgroups per CU the grid should at least cover (latency hiding)
MAX_SPLIT = 16
L2_BYTES = GPUS["gfx942"].l2_bytes  # L2 per XCD (the same on MI300X and MI355X)
MAX_VGPR_EST = 240  # 256 is the hard limit; fp32 128x256 estimated at 248 compiled with SGPR spills
VGPR_FILE = GPUS["gfx942"].vgpr_file  # unified VGPR + AGPR entries per lane of a SIMD (both archs)
MAX_VGPR_WIDE = 256  # the 8-wave tile: 2 waves per SIMD per workgroup, 512 / 2 registers each
CLOCK_HZ = {a: g.clock_hz for a, g in GPUS.items()}  # boost clocks
MATRIX_FLOPS_PER_CLK = {a: g.matrix_flops_per_clk for a, g in GPUS.items()}  # dense, per CU
L1_FILL_BYTES_PER_CLK = 64  # assumed operand feed per CU (L2 -> L1), not calibrated on hardware
WIDE = (256, 256, 64)  # gfx950's 8-wave tile (wide.py)
MID_M = 2048  # buckets up to this take `_mid` (split-K / small-N candidates beside the large tiles)
MID_MARGIN = 0.12  # `_mid` leaves the large tile only for a modeled gain above the model's median error
# a weight under L2_BYTES takes `_mid` too when its large tile's grid covers under 1 / STARVED_SHARE of the CUs and
# its K is at least STARVED_K (a long K loop on few workgroups); short-K small GEMMs keep the large tile
STARVED_SHARE, STARVED_K = 2, 1024


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    bm: int
    bn: int
    bk: int
    split: int = 1  # split-K factor across workgroups (splitk.py); divides K_pad / BK
    kw: int = 1  # waves splitting each K tile inside a workgroup (1: the 4 waves split BN; 4: they split BK)
    wm: int = 1  # waves along M: 2 = gfx950's 8-wave workgroup (wide.py: 2 x 4 waves, A and W in LDS by DMA)
    head: int = 0  # K elements of each workgroup's first tile (0: a whole BK; kernel.build_gemm's `head`)
    ring: bool = False  # one W register set, reloaded K block by K block (kernel.build_gemm's `ring`)
    quad: bool = False  # 2 x 2 waves: each BM / 2 rows x BN / 2 columns (kernel.build_gemm's `quad`)


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


def vgpr_estimate(cfg: GemmConfig, dtype: str, prefetch: int = 1) -> int:
    """Accumulators + 2 W register sets + A staging + ~3 live A operands + addresses (the scheduled
    loop keeps A operands two ahead; compiled 128x128x64 bf16: 134, estimate 140); a kernel keeping
    `prefetch` K tiles in flight holds prefetch + 1 W sets and `prefetch` A staging sets. The 8-wave
    tile, an upper bound: accumulators + every A and W operand of one K step + addresses
    (estimate 248; compiled 256x256x64 bf16 with the full epilogue: 220)."""
    if cfg.wm > 1:
        m_rep, n_rep, k_blk = cfg.bm // 32, cfg.bn // 64, cfg.bk // 32
        return m_rep * n_rep * 4 + (m_rep + n_rep) * k_blk * 4 + 24
    m_rep, n_rep, k_blk = cfg.bm // 16, cfg.bn * cfg.kw // 64, cfg.bk // 32 // cfg.kw
    if cfg.quad:  # per wave: half the rows, half the columns
        m_rep, n_rep = cfg.bm // 32, cfg.bn // 32
    lph = 2 if dtype == "f32" else 1
    a_loads = -(-(cfg.bm * cfg.bk * _esize(dtype) // 16) // THREADS)
    # a ring (kernel.py): one W set and the next tile's blocks landing in it, ~2 blocks more (compiled gfx942 bf16
    # 32x128x256: 136, estimate 136; 32x256x256: 240, estimate 232)
    w_regs = (prefetch * n_rep * k_blk + 2 * n_rep) if cfg.ring else (prefetch + 1) * n_rep * k_blk
    return (m_rep * n_rep * 4 + w_regs * lph * 4 + prefetch * a_loads * 4
            + min(m_rep, 3) * lph * 4 + 16)


def lds_bytes(cfg: GemmConfig, dtype: str) -> int:
    """Two stages of A (and of W for the 8-wave tile, which stages both)."""
    return 2 * (cfg.bm + (cfg.bn if cfg.wm > 1 else 0)) * cfg.bk * _esize(dtype)


def workgroups_per_cu(cfg: GemmConfig, dtype: str, arch: str, prefetch: int = 1) -> int:
    """Estimated resident workgroups per CU (one wave per SIMD each, two for wm = 2), by VGPRs and LDS."""
    by_vgpr = VGPR_FILE // (cfg.wm * -(-vgpr_estimate(cfg, dtype, prefetch) // 8) * 8)
    return max(1, min(8, by_vgpr, LDS_BYTES[arch_key(arch)] // lds_bytes(cfg, dtype)))


def config_fits(cfg: GemmConfig, dtype: str, arch: str) -> str | None:
    """None if the config is legal on `arch`, else the reason."""
    if cfg.wm not in (1, 2):
        return "wm (waves along M) must be 1 or 2"
    if cfg.wm == 2:
        return _wide_fits(cfg, dtype, arch)
    if cfg.kw not in (1, 4):
        return "kw (waves splitting K) must be 1 or 4"
    if cfg.ring and (cfg.kw != 1 or dtype not in ("bf16", "f16", "f32") or cfg.bk > 256):
        # BK 512 in a loop: gfx950 bf16 32x128x512 compiled to 288 registers (AGPRs, 1 wave per SIMD; estimate 216)
        return "a W register ring (ring=True) needs kw 1, a bf16 / f16 / f32 operand and BK <= 256"
    if cfg.quad and (cfg.kw != 1 or dtype not in ("bf16", "f16", "f32") or cfg.bm % 32 or cfg.bn % 32):
        return "2 x 2 waves (quad=True) need kw 1, a bf16 / f16 / f32 operand and BM, BN multiples of 32"
    if cfg.head and (cfg.kw != 1 or cfg.head % 32 or not 0 < cfg.head < cfg.bk):
        return f"a short first tile (head={cfg.head}) needs kw 1, head % 32 == 0 and 0 < head < BK"
    if cfg.bm % 16 or cfg.bn % (64 // cfg.kw) or cfg.bk % (32 * cfg.kw) or cfg.split < 1:
        return (f"BM must be a multiple of 16, BN of {64 // cfg.kw}, BK of {32 * cfg.kw} (kw={cfg.kw}), "
                f"split >= 1")
    lds = lds_bytes(cfg, dtype)
    if lds > LDS_BYTES[arch_key(arch)]:
        return f"LDS {lds} B exceeds {LDS_BYTES[arch_key(arch)]} B on {arch}"
    if vgpr_estimate(cfg, dtype) > MAX_VGPR_EST:
        return f"~{vgpr_estimate(cfg, dtype)} VGPRs exceeds {MAX_VGPR_EST}"
    waves = THREADS // 64
    acc = waves * (cfg.bm // 16) * (cfg.bn * cfg.kw // (16 * waves)) * 256  # dwords the waves sum through LDS
    if cfg.kw > 1 and acc > 2 * cfg.bm * cfg.bk * _esize(dtype) // 4:
        return (f"the two A stages of {cfg.bm}x{cfg.bn}x{cfg.bk} ({lds} B) cannot hold the {waves} waves' "
                f"accumulators (kw={cfg.kw}, {4 * acc} B)")
    return None


def _wide_fits(cfg: GemmConfig, dtype: str, arch: str) -> str | None:
    if arch_key(arch) != "gfx950" or dtype not in ("bf16", "f16"):
        return f"the 8-wave tile (wm=2) runs bf16/f16 on gfx950 only (got {dtype} on {arch})"
    if cfg.kw != 1 or cfg.split != 1:
        return "the 8-wave tile (wm=2) takes no split-K and no kw"
    if cfg.bm % 32 or cfg.bn % 64 or cfg.bk % 32 or (cfg.bm * cfg.bk // 8) % 512 or (cfg.bn * cfg.bk // 8) % 512:
        return "the 8-wave tile needs BM % 32, BN % 64, BK % 32 == 0 and whole DMA rounds (BM x BK, BN x BK >= 4096)"
    if lds_bytes(cfg, dtype) > LDS_BYTES["gfx950"]:
        return f"LDS {lds_bytes(cfg, dtype)} B exceeds {LDS_BYTES['gfx950']} B on {arch}"
    if vgpr_estimate(cfg, dtype) > MAX_VGPR_WIDE:
        return f"~{vgpr_estimate(cfg, dtype)} registers exceeds {MAX_VGPR_WIDE} (2 waves per SIMD)"
    return None


def partial_bytes(m: int, n: int, k: int, cfg: GemmConfig) -> tuple[int, int]:
    """(written, read) bytes of split-K's fp32 partial tiles (splitk.py): every split but the last arriver
    stores its lanes' accumulators (rows rounded up to 4 per lane), the last arriver reads them back."""
    if cfg.split == 1:
        return 0, 0
    n_pad = padded_shape(n, k)[0]
    tiles_m = -(-m // cfg.bm)
    rows = min(tiles_m * cfg.bm, -(-m // 4) * 4)
    per_split = rows * (-(-n_pad // cfg.bn) * cfg.bn) * 4
    return (cfg.split - 1) * per_split, (cfg.split - 1) * per_split


def l2_bytes(m: int, n: int, k: int, dtype: str, cfg: GemmConfig, partial_reads: int | None = None) -> int:
    """Bytes every workgroup of our GEMM at `cfg` loads through the vector-memory path (timing.Launch.l2_bytes:
    L2 hits and misses alike, what flysim counts): each workgroup its A rows (the valid ones: masked lanes load
    nothing) and its W columns over its K slice, so A once per column tile and W once per row tile over the whole
    K; the 2 x 2 wave layout (`quad`) loads each W column in both wave rows (twice); split-K's last arriver reads
    the others' fp32 partial tiles back (`partial_bytes`, or `partial_reads` where given: model_estimate's
    "free" bound passes 0). The output's stores are posted, not counted."""
    esz = _esize(dtype)
    n_pad, k_pad = padded_shape(n, k)
    a = m * k_pad * esz * -(-n_pad // cfg.bn)
    w = n_pad * k_pad * esz * -(-m // cfg.bm) * (2 if cfg.quad else 1)
    return a + w + (partial_bytes(m, n, k, cfg)[1] if partial_reads is None else partial_reads)


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
    in_flight = cfg.bn * cfg.bk * esz  # one K tile of W per workgroup: the HBM bytes in flight (A comes from L2)

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
    """The decode tile: the candidate with the least MODEL time (`model_estimate`) among those whose grid covers
    GRID_PER_CU x the CUs (all candidates when none does)."""
    k_pad = padded_shape(n, k)[1]
    cands = []
    for bm in sorted({16, 32, max(16, mb)} & set(range(16, max(16, mb) + 1))):  # row tiles of 16 or 32 too
        for kw, bn in ((1, 64), (4, 16), (4, 32), (4, 64)):
            for bk in (32, 64, 128, 256):
                if k_pad % bk or bk % (32 * kw):
                    continue
                nkt = k_pad // bk
                for s in (d for d in range(1, min(nkt, MAX_SPLIT) + 1) if nkt % d == 0):
                    for head in (0, 32) if kw == 1 and bk > 32 else (0,):  # a short first tile (kernel.py `head`)
                        cfg = GemmConfig(bm, bn, bk, s, kw, head=head)
                        if not config_fits(cfg, dt, arch):
                            cands.append((model_estimate(mb, n, k, dt, arch, cfg), cfg))
    if not cands:
        return GemmConfig(max(16, mb), 64, 32)
    full = [c for c in cands if c[0]["grid"] >= GRID_PER_CU * CUS[arch_key(arch)]] or cands
    best_t = min(e["t"] for e, _ in full)
    # within 2 % of the best: fewer splits (less partial traffic), then the smaller BK (less LDS)
    return min((c for c in full if c[0]["t"] <= best_t * 1.02), key=lambda c: (c[1].split, c[1].bk, c[1].head))[1]


def model_features(cfg: GemmConfig, dtype: str, arch: str, prefetch: int = 1):
    """timing.KernelFeatures of our GEMM at `cfg`, estimated from the config (module docstring).
    `prefetch` > 1 prices a kernel variant (not built) that keeps that many K tiles in flight: its W
    bytes in flight, its extra register sets (occupancy) and the extra W tiles its prologue loads."""
    from translator_kernels.timing import KernelFeatures

    a = arch_key(arch)
    g = GPUS[a]
    waves = 4 * cfg.wm
    esz = _esize(dtype)
    flops = 2 * cfg.bm * cfg.bn * cfg.bk // waves  # one K tile, per wave
    matrix = flops / (MATRIX_FLOPS_PER_CLK[a][dtype] / g.simds)
    a_tile = cfg.bm * cfg.bk * esz  # A through LDS: written once, read by every wave (its K share for kw = 4,
    # its half of the rows for quad)
    lds = (a_tile / waves) / (g.lds_write_bytes_per_clk / g.simds) + (a_tile / cfg.kw / (2 if cfg.quad else 1)) / (
        g.lds_read_bytes_per_clk / g.simds)
    per_simd = workgroups_per_cu(cfg, dtype, a, prefetch) * waves // g.simds
    # outside the K loop: the first A tile and the first `prefetch` W tiles (`head` K elements for a short
    # first tile), loaded while every resident workgroup is in the same phase (the output's stores are
    # posted: no wave waits for them); one memory round trip per K tile
    edge = (cfg.bm + cfg.bn) * (cfg.head or cfg.bk) * esz + (prefetch - 1) * cfg.bn * cfg.bk * esz
    return KernelFeatures("gemm (estimated)", max(1, per_simd), waves, prefetch * cfg.bn * cfg.bk * esz // waves,
                          round(matrix), 16 * 4, round(lds), flops, True, 0, 0, prefetch,
                          loop_trips=1, straight_trips=1, straight_bytes=edge // waves)


def model_estimate(m: int, n: int, k: int, dtype: str, arch: str, cfg: GemmConfig, prefetch: int = 1,
                   persistent: int = 0, prologue: bool = True, partials: str = "all", edit: dict | None = None,
                   consts: dict | None = None) -> dict:
    """The timing MODEL of one GEMM launch at `cfg` (translator_kernels.timing; module docstring).

    persistent = G > 0 prices a persistent variant (variants.py; not built): G workgroups walk the
    output tiles (x split) round-robin, each loading its first tile in its prologue and every later
    tile's first K tile under the previous tile's last K step (one prologue per workgroup, not per tile).
    prologue=False prices no prologue loads at all (a bound no kernel reaches; variants.py).
    partials: "all" (splitk.py: every split but the last arriver stores its partial tile, which the last one
    reads back) or "free" (a bound no kernel here reaches: no partial bytes; variants.py). edit (KernelFeatures fields) and consts (timing constants) override the MODEL's
    inputs: variants.model_terms prices each term by taking it away."""
    from translator_kernels.timing import Launch, gemm_hbm_bytes, launch_time, xcd_reread_bytes

    a = arch_key(arch)
    g = GPUS[a]
    esz = _esize(dtype)
    n_pad, k_pad = padded_shape(n, k)
    feat = dataclasses.replace(model_features(cfg, dtype, a, prefetch), **(edit or {}))
    if not prologue:
        feat = dataclasses.replace(feat, straight_bytes=0)
    units = -(-m // cfg.bm) * -(-n_pad // cfg.bn) * cfg.split
    slots = g.cus * max(1, feat.waves_per_simd * g.simds // feat.waves_per_wg)
    hbm = gemm_hbm_bytes(m, n_pad, k_pad, esz, esz, esz, cfg.bm, cfg.bn, slots, g.llc_bytes)
    pw, pr = partial_bytes(m, n, k, cfg)
    if partials == "free":
        pw = pr = 0
    nk = k_pad // (cfg.bk * cfg.split)
    if cfg.head:  # one more K step: the first holds head / BK of a tile's MFMAs and LDS work, the last the rest
        nk = nk - 1 + sum(_partial_step(feat, f, units, a, consts) for f in (cfg.head / cfg.bk, 1 - cfg.head / cfg.bk))
    grid, iters = units, nk
    if persistent:
        grid = min(units, persistent)
        iters = tuple(nk * len(range(i, units, grid)) for i in range(grid))
    r = launch_time(feat, Launch(grid, iters, hbm + pw + pr, 2.0 * m * n * k, reread_bytes=xcd_reread_bytes(
                                     m, n_pad, k_pad, esz, esz, cfg.bm, cfg.bn, g.xcds, cfg.split, grouped=True),
                                 l2_bytes=l2_bytes(m, n, k, dtype, cfg, partial_reads=pr), dtype=dtype),
                     a, consts)
    t_hbm = (m * k + n * k + m * n) * esz / g.hbm_bytes_per_s
    t_flop = 2.0 * m * n * k / g.peak_flops(dtype)
    # the floors against the kernel's own time: the launch floor of the measuring harness left out
    kernel_t = r["t"] - g.timing["launch_s"]
    # rank_t: the kernel time at the boost clock (timing's t_maf left out: the measured matrix ceiling is the same
    # for every tile of a launch, and the tile with fewer cycles wins at any clock): what the heuristics rank by
    return dict(r, grid=grid, units=units, bytes=hbm + pw + pr, hbm_floor=t_hbm, flop_floor=t_flop,
                kernel_t=kernel_t, rank_t=r["kernel_t_boost"], floor_fraction=max(t_hbm, t_flop) / kernel_t,
                of_achievable=t_hbm / g.timing["hbm_efficiency"] / kernel_t,
                # the same per launch in a graph-replayed step (t_graph: + GRAPH_LAUNCH, the measured per-launch cost,
                # which the device-timed decode GEMMs of measure/blog_gemm.py need beside kernel_t: 40 of 44 within 25 %)
                of_achievable_graph=t_hbm / g.timing["hbm_efficiency"] / r["t_graph"], inflight_wave=feat.inflight_bytes)


def _partial_step(feat, frac: float, grid: int, arch: str, consts: dict | None = None) -> float:
    """The MODEL's time of a K step holding `frac` of a tile's MFMA and LDS work (`head`'s first and last steps:
    their empty K blocks are neither loaded nor computed, kernel.py), in full steps: the same loop vector work,
    memory round trip and latency floor. Read off timing.launch_time as the cost of one more iteration."""
    from translator_kernels.timing import Launch, launch_time

    def step(f):
        return (launch_time(f, Launch(grid, 2, 0.0), arch, consts)["t_issue"]
                - launch_time(f, Launch(grid, 1, 0.0), arch, consts)["t_issue"])

    part = dataclasses.replace(feat, loop_matrix=round(feat.loop_matrix * frac), loop_lds=round(feat.loop_lds * frac),
                               loop_flops=round(feat.loop_flops * frac))
    return step(part) / step(feat)


def _starved(mb: int, n: int, k: int, dt: str, arch: str) -> bool:
    """A narrow weight with a long K whose large tile leaves most CUs idle (a MoE router, N = 64, K = 7168, at
    M = 128: one workgroup walks all of K, 237 us in the MODEL): `_mid` ranks split-K tiles beside it."""
    n_pad, k_pad = padded_shape(n, k)
    large = _large(mb, n, k, dt, arch)
    return k_pad >= STARVED_K and -(-mb // large.bm) * -(-n_pad // large.bn) * STARVED_SHARE < CUS[arch_key(arch)]


def _mid(mb: int, n: int, k: int, dt: str, arch: str) -> GemmConfig:
    """65 <= M <= 2048 (and a starved large tile at any M, `_starved`): the large tile or a split-K / small-N
    4-wave tile, whichever the timing MODEL gives the least time (module docstring)."""
    k_pad = padded_shape(n, k)[1]
    cands = [_large(mb, n, k, dt, arch)]
    small = mb <= 256  # 16-row and small-N (kw = 4) tiles, splits above 8: for small M only (each costs a
    # model evaluation linear in the grid; none of them wins above M = 256 at the table's shapes)
    for bm in (16, 32, 64) if small else (32, 64, 128):
        for kw, bns in ((1, (64, 128, 256)), (4, (16, 32, 64))) if small else ((1, (64, 128, 256)),):
            for bn in bns:
                for bk in (64, 128, 256, 512):
                    if k_pad % bk or bk % (32 * kw):
                        continue
                    nkt = k_pad // bk
                    for sp in (d for d in range(1, min(nkt, MAX_SPLIT if small else 8) + 1) if nkt % d == 0):
                        for head, ring, quad in head_ring(kw):  # short first tile, W register ring, 2 x 2 waves
                            c = GemmConfig(bm, bn, bk, sp, kw, head=head, ring=ring, quad=quad)
                            if not config_fits(c, dt, arch):
                                cands.append(c)
    est = [(model_estimate(mb, n, k, dt, arch, c), c) for c in cands]
    # a grid that gives every CU a workgroup, unless one that leaves CUs idle is modeled at least MID_MARGIN
    # faster (no M of the table's shapes takes one since the short first tile; before it, gfx942 M = 128 at
    # N = K = 4096 took 64 x 64 x 256 kw4 split 2: 256 workgroups on 304 CUs).
    # Margins compare kernel times: the measuring harness's launch floor (the same for every candidate) would
    # dilute them (gfx950 M = 128 at N = K = 4096: 12 % of the 7.6 us kernel time is 5 % of 19.6 us with the floor)
    every = [(e["rank_t"], c) for e, c in est]
    scored = [(e["rank_t"], c) for e, c in est if e["grid"] >= CUS[arch_key(arch)]] or every
    if min(every, key=lambda tc: tc[0])[0] < min(t for t, _ in scored) * (1 - MID_MARGIN):
        scored = every
    best = min(t for t, _ in scored)
    if best > est[0][0]["rank_t"] * (1 - MID_MARGIN):  # a gain inside the model's error: keep the large tile
        return cands[0]
    # within 2 %: the large tile first (no partials), then 4 x 1 waves (a 2 x 2 tile reads W twice: L1 / L2 traffic
    # the MODEL does not price), fewer splits, the smaller BK, no ring, the least time
    return min((sc for sc in scored if sc[0] <= best * 1.02),
               key=lambda sc: (sc[1] != cands[0], sc[1].quad, sc[1].split, sc[1].bk, sc[1].head, sc[1].ring, sc[0]))[1]


def head_ring(kw: int) -> tuple:
    """(head, ring, quad) a mid-M candidate of this kw is ranked with."""
    return tuple((h, r, q) for h in (0, 32) for r in (False, True) for q in (False, True)) if kw == 1 else \
        ((0, False, False),)


def without_ring(cfg: GemmConfig, dtype: str, arch: str) -> GemmConfig:
    """`cfg` for a call kernel.py's ring / quad do not take (scales, gate, rownorm, an in-place operand): 4 x 1
    waves with two W sets, BK halved until their registers fit (split still divides the K tiles; a short first tile
    stays under BK)."""
    if not (cfg.ring or cfg.quad):
        return cfg
    c = dataclasses.replace(cfg, ring=False, quad=False)
    while config_fits(c, dtype, arch) and c.bk > 64:
        c = dataclasses.replace(c, bk=c.bk // 2, head=c.head if c.head < c.bk // 2 else 0)
    return c


def wave_efficiency(tiles: int, slots: int) -> float:
    return tiles / (-(-tiles // slots) * slots)


def large_estimate(m: int, n: int, k: int, dtype: str, arch: str, cfg: GemmConfig,
                   wg_per_cu: int | None = None) -> dict:
    """Modeled time of an MFMA-bound GEMM (module docstring): tiles, slots, wave efficiency, seconds."""
    a = arch_key(arch)
    n_pad, k_pad = padded_shape(n, k)
    tiles = -(-m // cfg.bm) * -(-n_pad // cfg.bn)
    wpc = wg_per_cu or workgroups_per_cu(cfg, dtype, a)
    t_mat = 2 * cfg.bm * cfg.bn * k_pad / (MATRIX_FLOPS_PER_CLK[a][dtype] * CLOCK_HZ[a])
    t_feed = (cfg.bm + cfg.bn) * k_pad * _esize(dtype) / (L1_FILL_BYTES_PER_CLK * CLOCK_HZ[a])
    t_boost = -(-tiles // CUS[a]) * max(t_mat, t_feed)
    # no faster than the vendor's measured Max-Achievable FLOPs where published (timing's t_maf; MI300X)
    t_maf = 2.0 * m * n * k / GPUS[a].maf_flops[dtype] if dtype in GPUS[a].maf_flops else 0.0
    return dict(tiles=tiles, wg_per_cu=wpc, slots=CUS[a] * wpc, wave_efficiency=wave_efficiency(tiles, CUS[a] * wpc),
                feed_over_mfma=t_feed / t_mat, t=max(t_boost, t_maf), t_boost=t_boost)


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
    best = max(scored, key=lambda sc: sc[0] + 1e-9 * (sc[1] == cands[0]))[1]
    wide = GemmConfig(*WIDE, wm=2)
    if config_fits(wide, dt, arch) or k_pad % wide.bk or n % 8:
        return best
    w_est, b_est = (large_estimate(mb, n, k, dt, arch, c) for c in (wide, best))
    take = w_est["wave_efficiency"] >= b_est["wave_efficiency"] and w_est["t"] <= b_est["t"]
    return wide if take else best


def choose_config(m_bucket: int, n: int, k: int, dtype, arch: str) -> GemmConfig:
    """The documented tile heuristic (module docstring); `dtype` is a torch dtype or 'f32'/'bf16'/'f16'."""
    dt = _DT.get(dtype, dtype)
    key = (m_bucket, n, k, dt, arch_key(arch))
    if key in _OVERRIDES:
        return _OVERRIDES[key]
    return _heuristic(m_bucket, n, k, dt, arch_key(arch))


@functools.lru_cache(maxsize=4096)
def _heuristic(m_bucket: int, n: int, k: int, dt: str, arch: str) -> GemmConfig:
    """choose_config without the overrides, once per key (the ranking models are not per-call work)."""
    k_pad = padded_shape(n, k)[1]
    if m_bucket <= 64:
        cfg = _skinny(m_bucket, n, k, dt, arch)
    elif (m_bucket <= MID_M and padded_shape(n, k)[0] * k_pad * _esize(dt) >= L2_BYTES) or _starved(m_bucket, n, k, dt,
                                                                                                 arch):
        cfg = _mid(m_bucket, n, k, dt, arch)
    else:
        cfg = _large(m_bucket, n, k, dt, arch)
    while (config_fits(cfg, dt, arch) or k_pad % cfg.bk) and cfg.bk > 32:
        cfg = dataclasses.replace(cfg, bk=cfg.bk // 2)
    reason = config_fits(cfg, dt, arch)
    if reason:
        raise KernelInputError(f"gemm: no legal tile for M<={m_bucket} N={n} K={k} {dt} {arch}: {reason}")
    return cfg


def four_wave(cfg: GemmConfig) -> GemmConfig:
    """The 4-wave tile standing in for the 8-wave one where a call needs kernel.py's layout (the
    gated epilogue, bmm's in-place [K, N] operand): 128 x 256, same BK."""
    return GemmConfig(128, 256, cfg.bk) if cfg.wm > 1 else cfg


def gated_config(cfg: GemmConfig, dtype, arch: str) -> GemmConfig:
    """The gated epilogue's tile for a chosen `cfg`: a gate / up column pair lives in one wave (BN >= 128,
    kw 1, no split, no short first tile); BK halves until the wider tile's registers fit."""
    g = GemmConfig(cfg.bm, max(cfg.bn, 128), cfg.bk)
    while config_fits(g, _DT.get(dtype, dtype), arch) and g.bk > 32:
        g = dataclasses.replace(g, bk=g.bk // 2)
    return g


def register_config(m_bucket: int, n: int, k: int, dtype, arch: str, cfg: GemmConfig) -> None:
    """Use `cfg` for this key from the next call on (per-call replays that kept the old tile are dropped)."""
    reason = config_fits(cfg, _DT.get(dtype, dtype), arch)
    if not reason and (padded_shape(n, k)[1] // cfg.bk) % cfg.split:
        reason = f"split {cfg.split} does not divide the K tiles"
    if reason:
        raise KernelInputError(f"gemm: config {cfg} rejected: {reason}")
    _OVERRIDES[(m_bucket, n, k, _DT.get(dtype, dtype), arch_key(arch))] = cfg
    clear_replays()
