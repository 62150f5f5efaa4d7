"""fp8 linears with a static activation scale: y = x @ dequant(W)ᵀ with x quantized by one fixed scale `sa`.

The form of fp8 checkpoints calibrated offline (HF transformers' `FineGrainedFP8Config(activation_scheme="static")`:
`FP8Linear.activation_scale`, one fp32 value per linear; the `input_scale` of other fp8 checkpoints)::

    xq = e4m3fn(clamp(x / sa, -448, 448))
    y  = sum_kb (xq_kb @ Wq_kbᵀ) * sa * sw[col // 128, kb]     128 x 128 block weight scales (`block`)
    y  = (xq @ Wqᵀ) * sw * sa                                   one weight scale (per tensor)
    (+ bias), in x's dtype

Two launches: the quantize kernel with the scale read from the device (gemm/quantize.py `quantize_static`: no
|max| reduction, one wave per row), then the fp8 GEMM with `sa` as its per-tensor activation scale in the
epilogue (fp8.gemm_fp8_block with the block weight scales in its K loop, or fp8.gemm_fp8). The scale is never
read on the host, so a checkpoint's value (or one changed after translation) is used as it is.

gfx942 runs the e4m3fn values as e4m3fnuz halves (as fp8_block.py does for the dynamic form): the weight is
stored as fnuz(Wq / 2), x is quantized with the scale 2 sa (the kernel's compile-time factor 2: x / (2 sa) is
(x / sa) / 2 exactly) and FMAX 224, so each product is a quarter of the e4m3fn product; the prepared weight scale
carries the factor 4. Both archs compute the e4m3fn products; nothing rounds differently.
"""

from __future__ import annotations

import torch

from translator_kernels import replay as kr
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.fp8 import gemm_fp8, gemm_fp8_block, ref_gemm_fp8, ref_gemm_fp8_block
from translator_kernels.gemm.fp8_block import _halves, prepare_weight

HF_FP8 = torch.float8_e4m3fn
_FMAX = float(torch.finfo(HF_FP8).max)  # 448


def prepare_static_weight(arch: str, w: torch.Tensor, w_scale: torch.Tensor):
    """(preshuffled weight, fp32 weight scale) the kernels read, from an e4m3fn W[N, K] and its scale ([NB, KB]
    block scales or one value; fp32 or e8m0). On gfx942 W is stored as fnuz halves and the scale times 4."""
    wp, s = prepare_weight(arch, w, w_scale)  # gfx942: fnuz(W / 2), the scale doubled
    if _halves(arch):
        s = s * 2  # ... and doubled again for the activation's halves
    return wp, (s if s.numel() > 1 else s.reshape(1)).contiguous()


def ref_fp8_static_linear(x, w, w_scale, a_scale, bias=None):
    """The math in torch (e4m3fn, any arch): x / sa rounded to e4m3fn, then the fp8 matmul with sa and the weight
    scale (block-wise where w_scale holds more than one value)."""
    k = x.shape[-1]
    sa = a_scale.float().reshape(1)
    xq = (x.reshape(-1, k).float() / sa).clamp(-_FMAX, _FMAX).to(HF_FP8)
    if w_scale.numel() > 1:
        y = ref_gemm_fp8_block(xq, w, sa, w_scale.float(), bias=bias, out_dtype=x.dtype)
    else:
        y = ref_gemm_fp8(xq, w, sa, w_scale.float().reshape(1), bias=bias, out_dtype=x.dtype)
    return y.reshape(*x.shape[:-1], w.shape[0])


@kr.replayed
def fp8_static_linear(x, w_prepared, n, k, w_scale, a_scale, *, bias=None):
    """x[..., k] (bf16 / fp16 / fp32) -> [..., n] in x's dtype: the static-scale quantize + the fp8 GEMM.
    w_prepared, w_scale: `prepare_static_weight`; a_scale: one fp32 value (the activation scale, on x's device)."""
    from translator_kernels import launch as kl
    from translator_kernels.gemm.quantize import quantize_static

    if x.dim() < 1 or x.shape[-1] != k or k % 16:
        raise KernelInputError(f"fp8_static_linear: x has shape {tuple(x.shape)}; expected [..., {k}], K % 16 == 0")
    if not isinstance(a_scale, torch.Tensor) or a_scale.numel() != 1:
        raise KernelInputError(f"fp8_static_linear: a_scale must be one value (a static per-tensor activation "
                               f"scale), got {getattr(a_scale, 'shape', type(a_scale))}")
    sa = a_scale.float().reshape(1)
    halves = _halves(kl.arch())
    xq = quantize_static(x, sa, "fp8", _FMAX / 2 if halves else None, 2.0 if halves else 1.0)
    if w_scale.numel() > 1:
        return gemm_fp8_block(xq, w_prepared, n, k, sa, w_scale, bias=bias, out_dtype=x.dtype)
    return gemm_fp8(xq, w_prepared, n, k, a_scale=sa, w_scale=w_scale.reshape(1), bias=bias, out_dtype=x.dtype)


__all__ = ["fp8_static_linear", "prepare_static_weight", "ref_fp8_static_linear"]
