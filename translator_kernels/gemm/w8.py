"""Weight-only int8 GEMM: y = (a @ W8ᵀ) * s[col] (+ bias), W8 int8 [N, K], s per output channel.

The form of the public fast-generation reference (`F.linear(x, w_int8.to(x.dtype)) * scales`), with the
dequantization in the GEMM's load path: the kernel (kernel.py, w_int8=True) loads kpack int8 values per
lane per chunk (8 bytes for a bf16 / fp16 activation, 4 for fp32: half / a quarter of the bytes the
dequantized weight would take), converts them to the activation dtype where the MFMA uses them (exact:
|v| <= 128), accumulates in fp32 and applies the scale in the epilogue (w_scale="col"). The weight layout
is preshuffle.shuffle_weight with kpack = the activation's (`shuffle_weight_w8`).
"""

from __future__ import annotations

import torch

from translator_kernels import replay as kr
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.preshuffle import kpack_for, padded_shape, shuffle_weight, unshuffle_weight


def shuffle_weight_w8(w: torch.Tensor, act_dtype: torch.dtype) -> torch.Tensor:
    """W8[N, K] int8 -> the (N_pad, K_pad) int8 layout a kernel with `act_dtype` activations reads."""
    if w.dim() != 2 or w.dtype != torch.int8:
        raise KernelInputError(f"shuffle_weight_w8: want a 2-D int8 [N, K] weight, got {tuple(w.shape)} {w.dtype}")
    return shuffle_weight(w, kpack_for(act_dtype))


def unshuffle_weight_w8(ws: torch.Tensor, n: int, k: int, act_dtype: torch.dtype) -> torch.Tensor:
    return unshuffle_weight(ws, n, k, kpack_for(act_dtype))


def ref_gemm_w8(a, w8, scale, bias=None):
    """The kernel's math in torch: fp32 matmul of a and the int8 values, x scale[col], + bias, one cast."""
    y = (a.float() @ w8.float().t()) * scale.float().reshape(1, -1)
    if bias is not None:
        y = y + bias.float()
    return y.to(a.dtype)


@kr.replayed
def gemm_w8(a, w_shuffled, n, k, scale, *, bias=None, _config=None):
    """(a @ W8ᵀ) * scale[col] + bias for a [..., k] (fp32 / bf16 / fp16), W8 = shuffle_weight_w8(W8[n, k], a.dtype)."""
    from translator_kernels import launch as kl
    from translator_kernels.gemm import _epilogue_args, _launch, _prep_a, _rows
    from translator_kernels.gemm.tiles import choose_config, four_wave, m_bucket

    op = "gemm_w8"
    if w_shuffled.dtype != torch.int8 or tuple(w_shuffled.shape) != padded_shape(n, k):
        raise KernelInputError(f"{op}: weight {tuple(w_shuffled.shape)} {w_shuffled.dtype}; want int8 "
                               f"{padded_shape(n, k)} from w8.shuffle_weight_w8")
    if a.dim() < 1 or a.shape[-1] != k:
        raise KernelInputError(f"{op}: a has shape {tuple(a.shape)}, expected [..., {k}]")
    if not isinstance(scale, torch.Tensor) or scale.numel() != n:
        raise KernelInputError(f"{op}: scale must be a tensor of {n} values (one per output channel)")
    lead, m, out_dtype = _rows(op, a, None)
    if m == 0:
        return torch.empty(lead + (n,), dtype=out_dtype, device=a.device)
    a2 = _prep_a(op, a.reshape(m, k), k, a.dtype)
    bias, _ = _epilogue_args(op, bias, None, lead, n, out_dtype)
    cfg = _config or four_wave(choose_config(m_bucket(m), n, k, a.dtype, kl.arch()))
    out = _launch(op, a2.unsqueeze(0), w_shuffled.unsqueeze(0), n, k, 1, m, bias=bias, activation=None,
                  residual=None, scale=1.0, out_dtype=out_dtype, cfg=cfg,
                  scales=("", None, "col", scale.reshape(n).float().contiguous()), w_int8=True)
    return out.reshape(lead + (n,))
