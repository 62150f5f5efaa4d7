"""Compile entries of the block-scaled fp8 GEMM and the int4 GEMM for translator_kernels.isa's child (COMPILE_ONLY,
no GPU), at one tile: tests/kernels/test_gemm_fp8_isa.py asserts on their ISA, bench.isa_fp8 prints the
block-scaled one beside the epilogue-scaled one (translator_kernels.measure.fp8_isa). Tiles in fp8 values for
fp8 (BK = 128 values = 32 4-byte units), in bf16 values for int4."""

from __future__ import annotations

import torch

FP8_BLOCK_GEMM = "translator_kernels.gemm.quant_isa:compile_fp8_block"  # (n, k, bm, bn, bk[, split, kw])
FP8_GATED_GEMM = "translator_kernels.gemm.quant_isa:compile_fp8_gated"  # (n, k, bm, bn, bk): n output columns
W4_GEMM = "translator_kernels.gemm.quant_isa:compile_w4"  # (n, k, bm, bn, bk, group)


def compile_fp8_block(n, k, bm, bn, bk, split=1, kw=1):
    """fp8 x fp8 with 128 x 128 block scales in the K loop (sa per token and K block), bf16 out; split > 1 / kw = 4:
    the decode tiles (split-K workspace and counters sized as splitk.splitk_workspace does)."""
    from translator_kernels.gemm.blockscale import BLOCK
    from translator_kernels.gemm.fp8 import padded_shape_fp8
    from translator_kernels.gemm.kernel import build_gemm
    from translator_kernels.launch import arch as current_arch

    n_pad, k_pad = padded_shape_fp8(n, k)
    m = 2 * bm + 1
    launch = build_gemm.__wrapped__(n, k // 4, n_pad, k_pad // 4, "fp8", "bf16", current_arch(), bm, bn, bk // 4, None,
                                    False, False, split, "shuffled", None, kw, True, 1, a_scale="block",
                                    w_scale="block")
    a, w = torch.zeros(m, k // 4, dtype=torch.int32), torch.zeros(n_pad, k_pad // 4, dtype=torch.int32)
    c, z = torch.zeros(m, n, dtype=torch.bfloat16), torch.zeros(4)
    tiles = -(-m // bm) * -(-n_pad // bn) if split > 1 else 0
    p, cnt = torch.zeros(max(4, tiles * split * bm * bn)), torch.zeros(max(4, tiles * (4 // kw)), dtype=torch.int32)
    kb = -(-k // BLOCK)
    launch(c, a, w, z, c, p, cnt, m, 1, 0, 0, 0, 1.0, a.numel() * 4, w.numel() * 4, c.numel() * 2, p.numel() * 4,
           cnt.numel() * 4, torch.zeros(m, kb), torch.zeros(-(-n // BLOCK), kb))


def compile_fp8_gated(n, k, bm, bn, bk):
    """The fp8 gated GEMM (fp8_gated.py: silu(g) * u of n output columns, per-token x per-channel scales, bf16 out)
    at one tile of the arranged [2 * N16, K] weight."""
    from translator_kernels.gemm.fp8 import padded_shape_fp8
    from translator_kernels.gemm.gated import gated_shape
    from translator_kernels.gemm.kernel import build_gemm
    from translator_kernels.launch import arch as current_arch

    n2, k_pad = gated_shape(n, k)[0], padded_shape_fp8(n, k)[1]
    m = 2 * bm + 1
    launch = build_gemm.__wrapped__(n, k // 4, n2, k_pad // 4, "fp8", "bf16", current_arch(), bm, bn, bk // 4, None,
                                    False, False, 1, "shuffled", "silu", 1, True, 1, a_scale="row", w_scale="col")
    a, w = torch.zeros(m, k // 4, dtype=torch.int32), torch.zeros(n2, k_pad // 4, dtype=torch.int32)
    c, z = torch.zeros(m, n, dtype=torch.bfloat16), torch.zeros(4)
    launch(c, a, w, z, c, z, torch.zeros(4, dtype=torch.int32), m, 1, 0, 0, 0, 1.0, a.numel() * 4, w.numel() * 4,
           c.numel() * 2, 16, 16, torch.zeros(m), torch.zeros(n2))


def compile_w4(n, k, bm, bn, bk, group=128):
    """The group-wise int4 GEMM (bf16 activations) at one tile."""
    from translator_kernels.gemm.kernel import build_gemm
    from translator_kernels.gemm.preshuffle import padded_shape
    from translator_kernels.launch import arch as current_arch

    n_pad, k_pad = padded_shape(n, k)
    m = 2 * bm + 1
    launch = build_gemm.__wrapped__(n, k, n_pad, k_pad, "bf16", "bf16", current_arch(), bm, bn, bk, None, False,
                                    False, 1, "shuffled", None, 1, True, 1, w_int4=group)
    a, w = torch.zeros(m, k, dtype=torch.bfloat16), torch.zeros(n_pad, k_pad // 2, dtype=torch.uint8)
    c, z = torch.zeros(m, n, dtype=torch.bfloat16), torch.zeros(4)
    s = torch.zeros(k // group, n)
    launch(c, a, w, z, c, z, torch.zeros(4, dtype=torch.int32), m, 1, 0, 0, 0, 1.0, a.numel() * 2, w.numel(),
           c.numel() * 2, 16, 16, s, s)
