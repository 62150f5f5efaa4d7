"""Weight preshuffle for the MFMA GEMM: the one place that defines the layout.

The GEMM computes C = A · Bᵀ with B[N, K] (an nn.Linear weight). At translate time B is
padded with zeros to N % 16 == 0 and K % 32 == 0 and rearranged so that every lane of a
wave loads its MFMA B operand as one contiguous 16-byte chunk:

    B[N, K] -> view (N/16, 16, K/32, 32/kpack, kpack) -> permute (0, 2, 3, 1, 4)
            -> (N/16, K/32, 32/kpack, 16, kpack)            kpack = 16 bytes / element size

so for one 16-column tile of N and one 32-deep slice of K, the 16 rows' kpack-element
chunks of K sit next to each other: lane (n, kc) reads elements [kc*kpack, (kc+1)*kpack)
of row n with a single 128-bit load. This is the "(16, 16)" layout of FlyDSL's own
preshuffle GEMM. The shuffled tensor is stored flat as (N_pad, K_pad) so it prints and
saves as an ordinary weight. The kernel that reads this layout is gemm_kernel.py (its
docstring derives why the K permutation inside a 32-slice leaves the dot product unchanged).
"""

from __future__ import annotations

import torch

from translator_kernels.errors import KernelInputError

N_TILE = 16
K_TILE = 32


def kpack_for(dtype: torch.dtype) -> int:
    """Elements per 16-byte chunk."""
    return 16 // torch.empty((), dtype=dtype).element_size()


def padded_shape(n: int, k: int) -> tuple[int, int]:
    return (-(-n // N_TILE) * N_TILE, -(-k // K_TILE) * K_TILE)


def shuffle_weight(w: torch.Tensor, kpack: int | None = None) -> torch.Tensor:
    """B[N, K] -> preshuffled (N_pad, K_pad) tensor (a new tensor; `w` is untouched). kpack: elements per
    chunk when it is not 16 bytes of w's dtype (an int8 weight read by a bf16 kernel: 8, w8.py)."""
    if w.dim() != 2:
        raise KernelInputError(f"shuffle_weight expects a 2-D [N, K] weight, got shape {tuple(w.shape)}")
    n, k = w.shape
    n_pad, k_pad = padded_shape(n, k)
    kp = kpack or kpack_for(w.dtype)
    if K_TILE % kp:
        raise KernelInputError(f"dtype {w.dtype}: kpack {kp} does not divide the K tile {K_TILE}")
    if (n_pad, k_pad) == (n, k):  # no padding: one permuting copy
        wp = w.contiguous()
    else:
        wp = torch.zeros((n_pad, k_pad), dtype=w.dtype, device=w.device)
        wp[:n, :k] = w
    v = wp.view(n_pad // N_TILE, N_TILE, k_pad // K_TILE, K_TILE // kp, kp)
    return v.permute(0, 2, 3, 1, 4).contiguous().view(n_pad, k_pad)


def shuffle_weight_batched(w: torch.Tensor) -> torch.Tensor:
    """[B, N, K] (any strides) -> [B, N_pad, K_pad]: shuffle_weight applied to every batch entry."""
    b, n, k = w.shape
    n_pad, k_pad = padded_shape(n, k)
    kp = kpack_for(w.dtype)
    wp = torch.zeros((b, n_pad, k_pad), dtype=w.dtype, device=w.device)
    wp[:, :n, :k] = w
    v = wp.view(b, n_pad // N_TILE, N_TILE, k_pad // K_TILE, K_TILE // kp, kp)
    return v.permute(0, 1, 3, 4, 2, 5).contiguous().view(b, n_pad, k_pad)


def unshuffle_weight(ws: torch.Tensor, n: int, k: int, kpack: int | None = None) -> torch.Tensor:
    """Inverse of shuffle_weight: the preshuffled tensor back to B[n, k]."""
    n_pad, k_pad = ws.shape
    kp = kpack or kpack_for(ws.dtype)
    v = ws.reshape(n_pad // N_TILE, k_pad // K_TILE, K_TILE // kp, N_TILE, kp)
    return v.permute(0, 3, 1, 2, 4).reshape(n_pad, k_pad)[:n, :k]
