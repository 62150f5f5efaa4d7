"""Compile entry of the MX GEMM (gfx950) for translator_kernels.isa's child (COMPILE_ONLY, no GPU), at one tile:
tests/kernels/test_gemm_mx_isa.py asserts on its ISA. Tile in fp8 values (BK = 128 values = 32 4-byte units)."""

from __future__ import annotations

import torch

MX_GEMM = "translator_kernels.gemm.mx_isa:compile_mx"  # (n, k, bm, bn, bk, a_mode, w_fmt)


def compile_mx(n, k, bm, bn, bk, a_mode="mx", w_fmt="fp8"):
    """e4m3fn A x e4m3fn (w_fmt "fp8") or e2m1 ("fp4") W with e8m0 W scales per 32 of K in the scaled MFMA; A's
    scales MX (a_mode "mx") or an fp32 per-row epilogue scale ("row"); bf16 out."""
    from translator_kernels.gemm.fp8 import padded_shape_fp8
    from translator_kernels.gemm.kernel import build_gemm
    from translator_kernels.launch import arch as current_arch

    n_pad, k_pad = padded_shape_fp8(n, k)
    m = 2 * bm + 1
    launch = build_gemm.__wrapped__(n, k // 4, n_pad, k_pad // 4, "fp8" if w_fmt == "fp8" else f"fp8x{w_fmt}", "bf16", current_arch(), bm, bn, bk // 4, None,
                                    False, False, 1, "shuffled", None, 1, True, 1, a_scale=a_mode, w_scale="mx")
    a = torch.zeros(m, k // 4, dtype=torch.int32)
    w = torch.zeros(n_pad, k_pad // 4, dtype=torch.int16 if w_fmt == "fp4" else torch.int32)
    c, z = torch.zeros(m, n, dtype=torch.bfloat16), torch.zeros(4)
    sa = torch.zeros(m, k // 32, dtype=torch.uint8) if a_mode == "mx" else torch.zeros(m)
    sw = torch.zeros(n_pad // 16, k_pad // 128, 64, dtype=torch.uint8)
    launch(c, a, w, z, c, z, torch.zeros(4, dtype=torch.int32), m, 1, 0, 0, 0, 1.0, a.numel() * 4, w.numel() * w.element_size(),
           c.numel() * 2, 16, 16, sa, sw)
