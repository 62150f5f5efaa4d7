"""The fine-grained (128 x 128 block) fp8 linear: y = x @ dequant(W)ᵀ with x quantized per token and K block of 128
at run time, the form of HF transformers' `FineGrainedFP8Config(weight_block_size=(128, 128))` and DeepSeek-V3.

    sa[r, kb] = max(amax(|x[r, 128 kb : 128 (kb + 1)]|) / 448, 1e-12),  xq = e4m3fn(clamp(x / sa, ±448))
    y = sum_kb (xq_kb @ Wq_kbᵀ) * sa[:, kb] * sw[col // 128, kb]  (+ bias), in x's dtype

Two launches: the per-row quantize kernel (gemm/quantize.py) over x viewed as [M * KB, 128] (each row one
group), then the block-scaled GEMM (fp8.gemm_fp8_block, blockscale.py). K must be a multiple of 128 (HF only
quantizes such weights).

gfx950's MFMA takes e4m3fn itself. gfx942's takes e4m3fnuz, whose values are e4m3fn's halved (exponent bias 8
instead of 7, the same 3 mantissa bits, subnormals included), so without any rounding:
  - the weight is stored as fnuz(Wq / 2) with its scales doubled (`prepare_weight`);
  - the activation is quantized with FMAX = 224 instead of 448: s' = amax / 224 = 2 sa exactly (fp32 division
    by a power-of-two multiple), and fnuz(x / s') = e4m3fn(x / sa) / 2 (the same grid, halved).
Both archs therefore compute the same products (up to the fp32 summation order) as the e4m3fn math.
"""

from __future__ import annotations

import torch

from translator_kernels import replay as kr
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.blockscale import BLOCK
from translator_kernels.gemm.fp8 import (fp8_dtype, gemm_fp8_block, quantize_fp8_blocks, ref_gemm_fp8_block,
                                         shuffle_weight_fp8)

HF_FP8 = torch.float8_e4m3fn
_FMAX = torch.finfo(HF_FP8).max  # 448


def _halves(arch: str) -> bool:
    """gfx942 runs e4m3fn values as e4m3fnuz halves."""
    return not arch.startswith("gfx950")


def prepare_weight(arch: str, w: torch.Tensor, w_scale: torch.Tensor):
    """(preshuffled weight, fp32 [NB, KB] scales) the kernel reads, from an e4m3fn W[N, K] and its block
    scales (HF's weight_scale_inv: fp32 or e8m0, both exact in fp32)."""
    if w.dtype != HF_FP8 or w.dim() != 2:
        raise KernelInputError(f"fp8_block_linear: the weight must be a 2-D float8_e4m3fn tensor, got "
                               f"{tuple(w.shape)} {w.dtype}")
    s = w_scale.detach().float()
    w = w.detach()
    if _halves(arch):
        w, s = (w.float() / 2).to(fp8_dtype(arch)), s * 2
    return shuffle_weight_fp8(w), s.contiguous()


def ref_fp8_block_linear(x, w, w_scale, bias=None):
    """The math in torch (e4m3fn, any arch): per-(token, 128) quantization of x, the block-scaled matmul."""
    k = x.shape[-1]
    xq, sa = quantize_fp8_blocks(x.reshape(-1, k), HF_FP8, (1, BLOCK))
    y = ref_gemm_fp8_block(xq, w, sa, w_scale.float(), bias=bias, out_dtype=x.dtype)
    return y.reshape(*x.shape[:-1], w.shape[0])


@kr.replayed
def fp8_block_linear(x, w_prepared, n, k, w_scale, *, bias=None):
    """x[..., k] (bf16 / fp16 / fp32) -> [..., n] in x's dtype: quantize kernel + block-scaled fp8 GEMM.
    w_prepared, w_scale: `prepare_weight` of the e4m3fn weight and its [ceil(n / 128), k / 128] scales."""
    from translator_kernels import launch as kl
    from translator_kernels.gemm.quantize import quantize_rows

    if k % BLOCK:
        raise KernelInputError(f"fp8_block_linear: K={k} is not a multiple of {BLOCK} (one scale per 128 values)")
    if x.dim() < 1 or x.shape[-1] != k:
        raise KernelInputError(f"fp8_block_linear: x has shape {tuple(x.shape)}, expected [..., {k}]")
    lead, kb = tuple(x.shape[:-1]), k // BLOCK
    fmax = _FMAX / 2 if _halves(kl.arch()) else None
    xq, sa = quantize_rows(x.reshape(*lead, kb, BLOCK), "fp8", fmax)
    return gemm_fp8_block(xq.reshape(*lead, k), w_prepared, n, k, sa.reshape(*lead, kb), w_scale, bias=bias,
                          out_dtype=x.dtype)
