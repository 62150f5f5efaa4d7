"""The weight (and bias) arrangement of the gated GEMM: act(x @ Wg.T + bg) * (x @ Wu.T + bu).

Gate and up weights, each [N, K], are padded to N16 = ceil(N / 16) * 16 rows and interleaved in
blocks of 16 rows: rows [32j, 32j + 16) of the arranged [2 * N16, K] matrix are gate rows
[16j, 16j + 16), rows [32j + 16, 32j + 32) the up rows of the same output columns. The result
is preshuffled like any weight (preshuffle.shuffle_weight). A GEMM tile of BN arranged
columns then covers BN / 2 output columns; a wave's 16-column accumulator pairs (2j, 2j + 1)
hold the gate and the up value of one output element in the same lane (kernel.build_gemm with
`gate`), so the epilogue computes act(g) * u in registers. A bias vector is arranged the
same way, without the shuffle (1-D, fp32).
"""

from __future__ import annotations

import torch

from translator_kernels.gemm.preshuffle import N_TILE, padded_shape, shuffle_weight, unshuffle_weight
from translator_kernels.errors import KernelInputError


def _interleave(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    n = g.shape[0]
    n16 = -(-n // N_TILE) * N_TILE
    out = torch.zeros((n16 // N_TILE, 2, N_TILE) + tuple(g.shape[1:]), dtype=g.dtype, device=g.device)
    flat_g = torch.zeros((n16,) + tuple(g.shape[1:]), dtype=g.dtype, device=g.device)
    flat_u = torch.zeros_like(flat_g)
    flat_g[:n], flat_u[:n] = g, u
    out[:, 0] = flat_g.view((n16 // N_TILE, N_TILE) + tuple(g.shape[1:]))
    out[:, 1] = flat_u.view((n16 // N_TILE, N_TILE) + tuple(g.shape[1:]))
    return out.reshape((2 * n16,) + tuple(g.shape[1:]))


def gated_weight(wg: torch.Tensor, wu: torch.Tensor) -> torch.Tensor:
    """Gate and up [N, K] weights -> the arranged, preshuffled [2 * N16, K_pad] weight; [N] biases
    -> the arranged [2 * N16] bias (fp32 kept as given)."""
    if wg.shape != wu.shape or wg.dtype != wu.dtype:
        raise KernelInputError(f"gated_weight: gate {tuple(wg.shape)} {wg.dtype} and up {tuple(wu.shape)} {wu.dtype} differ")
    if wg.dim() == 1:
        return _interleave(wg, wu)
    return shuffle_weight(_interleave(wg, wu))


def gated_shape(n: int, k: int) -> tuple[int, int]:
    n16 = -(-n // N_TILE) * N_TILE
    return padded_shape(2 * n16, k)


def unarrange_gated(w: torch.Tensor, bias: torch.Tensor | None, n: int, k: int):
    """Inverse of gated_weight: (Wg, Wu, bg, bu) as [N, K] / [N] (biases None when absent)."""
    n16 = -(-n // N_TILE) * N_TILE
    wc = unshuffle_weight(w, 2 * n16, k).reshape(n16 // N_TILE, 2, N_TILE, k)
    wg, wu = wc[:, 0].reshape(n16, k)[:n], wc[:, 1].reshape(n16, k)[:n]
    if bias is None:
        return wg, wu, None, None
    bc = bias.reshape(n16 // N_TILE, 2, N_TILE)
    return wg, wu, bc[:, 0].reshape(n16)[:n], bc[:, 1].reshape(n16)[:n]
