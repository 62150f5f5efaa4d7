"""Compile entries of the fp8 / int8 kernels for translator_kernels.isa's child (COMPILE_ONLY, no GPU):
our fp8 GEMM (per-token x per-channel scales in the epilogue, bf16 out), the per-token quantize kernel
and the weight-only int8 GEMM, each at one tile. Give `translator_kernels.hotloop.compile_isa_texts`
FP8_GEMM / QUANTIZE / W8_GEMM; tests/kernels/test_gemm_fp8_isa.py asserts on the ISA, bench.isa_fp8
prints it beside FlyDSL's fp8 GEMM. Tiles are in fp8 values (BK = 128 values = 32 of the kernel's
4-byte units).
"""

from __future__ import annotations

import torch

FP8_GEMM = "translator_kernels.measure.fp8_isa:compile_fp8"  # (n, k, bm, bn, bk[, split, kw])
QUANTIZE = "translator_kernels.measure.fp8_isa:compile_quantize"  # (k,)
W8_GEMM = "translator_kernels.measure.fp8_isa:compile_w8"  # (n, k, bm, bn, bk)


def compile_fp8(n, k, bm, bn, bk, split=1, kw=1):
    """Our fp8 GEMM at one tile (bk in fp8 values), launched under COMPILE_ONLY (runs in the compile child);
    split > 1 is the split-K variant (workspace P and counters Cnt sized as splitk.splitk_workspace does),
    kw = 4 the decode tile whose 4 waves split each K tile."""
    from translator_kernels.gemm.fp8 import padded_shape_fp8
    from translator_kernels.gemm.kernel import build_gemm
    from translator_kernels.launch import arch as current_arch

    arch = current_arch()
    n_pad, k_pad = padded_shape_fp8(n, k)
    m = 2 * bm + 1
    launch = build_gemm.__wrapped__(n, k // 4, n_pad, k_pad // 4, "fp8", "bf16", arch, bm, bn, bk // 4, None, False,
                                    False, split, "shuffled", None, kw, True, 1, a_scale="row", w_scale="col")
    a, w = torch.zeros(m, k // 4, dtype=torch.int32), torch.zeros(n_pad, k_pad // 4, dtype=torch.int32)
    c, z = torch.zeros(m, n, dtype=torch.bfloat16), torch.zeros(4)
    tiles = -(-m // bm) * -(-n_pad // bn) if split > 1 else 0  # split 1: P and Cnt are ignored placeholders
    p, cnt = torch.zeros(max(4, tiles * split * bm * bn)), torch.zeros(max(4, tiles * (4 // kw)), dtype=torch.int32)
    launch(c, a, w, z, c, p, cnt, m, 1, 0, 0, 0, 1.0, a.numel() * 4, w.numel() * 4,
           c.numel() * 2, p.numel() * 4, cnt.numel() * 4, torch.zeros(m), torch.zeros(n))


def compile_quantize(k):
    """The per-token quantize kernel for bf16 rows of K values (runs in the compile child)."""
    from translator_kernels.gemm.quantize import build_quantize_rows
    from translator_kernels.launch import arch as current_arch

    m = 3
    launch = build_quantize_rows.__wrapped__(k, "bf16", "fp8", current_arch())
    x = torch.zeros(m, k, dtype=torch.bfloat16)
    launch(torch.zeros(m, k // 4, dtype=torch.int32), torch.zeros(m), x, m, x.numel() * 2, m * k, x, x, x)


def compile_w8(n, k, bm, bn, bk):
    """The weight-only int8 GEMM (bf16 activations, per-channel scale) at one tile (runs in the compile child)."""
    from translator_kernels.gemm.kernel import build_gemm
    from translator_kernels.gemm.preshuffle import padded_shape
    from translator_kernels.launch import arch as current_arch

    n_pad, k_pad = padded_shape(n, k)
    m = 2 * bm + 1
    launch = build_gemm.__wrapped__(n, k, n_pad, k_pad, "bf16", "bf16", current_arch(), bm, bn, bk, None, False,
                                    False, 1, "shuffled", None, 1, True, 1, w_scale="col", w_int8=True)
    a, w = torch.zeros(m, k, dtype=torch.bfloat16), torch.zeros(n_pad, k_pad, dtype=torch.int8)
    c, z = torch.zeros(m, n, dtype=torch.bfloat16), torch.zeros(4)
    launch(c, a, w, z, c, z, torch.zeros(4, dtype=torch.int32), m, 1, 0, 0, 0, 1.0, a.numel() * 2, w.numel(),
           c.numel() * 2, 16, 16, z, torch.zeros(n))
