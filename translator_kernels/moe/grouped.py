"""The grouped GEMM over experts: C[r] = A[r] · W[expert of r's tile]ᵀ, one launch.

A is the permuted activation (permute.py: each expert's rows padded to the row tile BM, so every
BM-row tile belongs to one expert); `tile_expert[i]` is the expert of tile i. The kernel is the
dense GEMM's (translator_kernels/gemm/kernel.py, `grouped=True`): same tiles, same preshuffled
weight layout (one preshuffled [N_pad, K_pad] matrix per expert, stacked), same hot loop, the gated
SwiGLU epilogue for the gate/up projection. The only difference is where a workgroup's W starts:
the tile's expert, one int32 load per workgroup, times the per-expert stride.

The grid covers the worst-case row count `cap` (T·k + min(E, T·k)·(BM - 1), a multiple of BM), a size the
host knows without reading the routing. The tiles past the real total (tile map -1, written by the align
kernel on the device) exit before their first load (tile_exit.py): no A or W bytes, no MFMA, no store.
`real_tiles` counts the ones that run. No 8-wave tile.

Split-K (the plain epilogue only: the down projection): the dense kernel's in-launch split-K
(gemm/splitk.py: fp32 partials in P, a ticket per tile region in Cnt, the last split of a tile adds them
in split order), with the tile map moved from Cnt to the residual slot (a grouped split-K GEMM takes no
bias or residual). `grouped_split` picks it when the grid (row tiles x column tiles) fills under a third of
the CUs: decode's down projection (Mixtral-8x7B at T = 1: 2 x 32 = 64 workgroups on 304 CUs, 224 K tiles
each) gets the largest of 8, 4, 2 that keeps the grid within the CU count, divides the K tiles and leaves
each split at least 8 of them.

Tile choice (`grouped_config`): BM from the mean rows per expert (T·k / E) like the dense
heuristic's M buckets, capped at 128; BN 128 (64 for N < 128), BK 64 (32 for fp32 or a K_pad that
64 does not divide).
"""

from __future__ import annotations

import torch

from translator_kernels import launch as kl
from translator_kernels import replay as kr
from translator_kernels.arch import FLOAT_NAMES
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.gated import gated_shape
from translator_kernels.gemm.kernel import build_gemm, canonical_epilogue
from translator_kernels.gemm.preshuffle import kpack_for, padded_shape
from translator_kernels.gemm.splitk import give_back, splitk_workspace
from translator_kernels.gemm.tiles import GemmConfig

_INT32_MAX = 2**31 - 64


def grouped_config(rows_per_expert: int, n: int, k: int, dtype, gated: bool) -> GemmConfig:
    """The tile of a grouped GEMM whose experts get `rows_per_expert` rows on average."""
    bm = next((b for b in (16, 32, 64) if rows_per_expert <= b), 128)
    k_pad = padded_shape(n, k)[1]
    bk = 32 if FLOAT_NAMES.get(dtype, dtype) == "f32" or k_pad % 64 else 64
    bn = 128 if gated or n >= 128 else 64
    return GemmConfig(bm, bn, bk)


def grouped_split(m_tiles: int, n: int, k: int, cfg: GemmConfig, arch: str) -> GemmConfig:
    """cfg with the split-K factor for a plain (ungated) grouped GEMM of `m_tiles` row tiles (module notes)."""
    from translator_kernels.arch import GPUS

    cus = GPUS[arch].cus if arch in GPUS else 256
    n_pad, k_pad = padded_shape(n, k)
    grid, k_tiles = m_tiles * -(-n_pad // cfg.bn), k_pad // cfg.bk
    if 3 * grid > cus:
        return cfg
    split = next((s for s in (8, 4, 2) if grid * s <= cus and k_tiles % s == 0 and k_tiles // s >= 8), 1)
    return GemmConfig(cfg.bm, cfg.bn, cfg.bk, split)


def capacity(pairs: int, experts: int, bm: int) -> int:
    """Rows of the permuted buffer: every pair, plus each non-empty expert's padding to BM."""
    c = pairs + min(experts, pairs) * (bm - 1)
    return -(-c // bm) * bm


def real_tiles(ids, experts: int, bm: int, first: int = 0) -> int:
    """Row tiles that hold rows for expert ids [T, k] (each served expert's pairs padded to BM): the tiles whose
    workgroups run; the rest of the grid's cap / BM exit at once (tile_exit.py). Host-side, for tests (the launch
    path never reads ids on the host; bench.moe_model counts the same from its per-expert rows)."""
    local = ids.reshape(-1).long().cpu() - first
    counts = torch.bincount(local[(local >= 0) & (local < experts)], minlength=experts)
    return int((-(-counts // bm)).sum())


def grouped_gemm(a, w, tile_expert, n: int, k: int, cfg: GemmConfig, *, gate=None, up=None, bias=None,
                 out_dtype=None):
    """a [cap, k] (cap a multiple of cfg.bm) x w [E, N_pad, K_pad] (stacked preshuffled weights, or stacked
    gated.gated_weight arrangements with `gate`) -> [cap, n]; tile_expert [cap / bm] int32. bias: per expert,
    fp32 [E, n] (or [E, N_pad], the stacked gated arrangements of gate and up bias, with `gate`), added to the
    row's expert's accumulators; up: a program on the up value (gate(g) * up(u)), with `gate` only."""
    op = "grouped_gemm"
    gate, up = canonical_epilogue(gate), canonical_epilogue(up)
    if up and not gate:
        raise KernelInputError(f"{op}: an up program ({up}) needs a gated GEMM (gate=...)")
    dt = FLOAT_NAMES.get(a.dtype)
    if dt is None or a.dtype != w.dtype:
        raise KernelInputError(f"{op}: a {a.dtype} and w {w.dtype} must be one of float32/bfloat16/float16")
    n_pad, k_pad = gated_shape(n, k) if gate else padded_shape(n, k)
    if w.dim() != 3 or tuple(w.shape[1:]) != (n_pad, k_pad):
        raise KernelInputError(f"{op}: w has shape {tuple(w.shape)}, expected [E, {n_pad}, {k_pad}] for N={n}, K={k}; "
                               f"build it with translator_kernels.moe.prepare_experts")
    cap = a.shape[0]
    if a.dim() != 2 or a.shape[1] != k or cap % cfg.bm or tuple(tile_expert.shape) != (cap // cfg.bm,):
        raise KernelInputError(f"{op}: a {tuple(a.shape)} / tile map {tuple(tile_expert.shape)} do not fit "
                               f"[cap, {k}] with cap a multiple of BM={cfg.bm} and cap / BM tiles")
    if k % kpack_for(a.dtype):
        raise KernelInputError(f"{op}: K={k} is not a multiple of {kpack_for(a.dtype)} (16-byte rows); pad the "
                               f"hidden / intermediate size")
    if bias is not None and (bias.dtype != torch.float32 or tuple(bias.shape) != (w.shape[0], n_pad if gate else n)):
        raise KernelInputError(f"{op}: bias {tuple(bias.shape)} {bias.dtype} must be float32 [E, "
                               f"{n_pad if gate else n}] (one row per expert; gated: gated_weight of gate/up biases)")
    out_dtype = out_dtype or a.dtype
    out = torch.empty((cap, n), dtype=out_dtype, device=a.device)
    for name, t in (("a", a), ("w", w), ("out", out)):
        if t.numel() * t.element_size() > _INT32_MAX:
            raise KernelInputError(f"{op}: {name} {tuple(t.shape)} exceeds 2 GiB (32-bit buffer offsets)")
    if cap == 0:
        return out
    if cfg.split > 1 and (gate or bias is not None):
        raise KernelInputError(f"{op}: split-K (split={cfg.split}) takes the plain epilogue: no gate, no bias")
    a, w = a.contiguous(), w.contiguous()  # a strided view of a prepared weight is read as given
    launcher = build_gemm(n, k, n_pad, k_pad, dt, FLOAT_NAMES[out_dtype], kl.arch(), cfg.bm, cfg.bn, cfg.bk,
                          None, bias is not None, False, cfg.split, "shuffled", gate, 1, grouped=True, up=up)
    tile_expert = tile_expert.to(torch.int32).contiguous()
    sizes = (a.numel() * a.element_size(), w.numel() * w.element_size(), out.numel() * out.element_size())
    if cfg.split > 1:  # the tile map in the residual slot; P and Cnt are split-K's (gemm/splitk.py)
        p_ws, cnt = splitk_workspace(a.device, (cap // cfg.bm) * -(-n_pad // cfg.bn), cfg)
        kl.call(launcher, out, a, w, p_ws, tile_expert, p_ws, cnt, cap, 1, cap * k, n_pad * k_pad, cap * n, 1.0,
                *sizes, p_ws.numel() * 4, cnt.numel() * 4)
        kr.replay_effect(give_back, cnt)  # the launch returned: its counters are zero again
        return out
    b = tile_expert if bias is None else bias.contiguous()  # p_bytes carries the bias size (P is unused)
    kl.call(launcher, out, a, w, b, out, tile_expert, tile_expert, cap, 1, cap * k, n_pad * k_pad,
            cap * n, 1.0, *sizes, b.numel() * 4, tile_expert.numel() * 4)
    return out
