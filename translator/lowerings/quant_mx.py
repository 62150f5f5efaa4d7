"""MX (OCP microscaling) GEMMs on gfx950: `torch._scaled_mm` with float8_e8m0fnu block scales, and the MX weights of
precision="fp8" with fp8_mode.FP8_WEIGHTS = "mxfp8" / "mxfp4", both as `flydsl.gemm_fp8` with an MX weight
(translator_kernels.gemm.mx: e8m0 scales per 32 of K in gfx950's scaled MFMA).

The op is gemm_fp8's (quant.py): `w_scale` a uint8 tensor is the MX weight's preshuffled e8m0 scales
(mx.prepare_weight_mx), and `a_scale` e8m0 [M', K / 32] (rows >= M ignored) the activation's, or an fp32 one
value / one per token applied in the epilogue (precision="fp8": MXFP8 weights with per-token activations).

Form matched: ``torch._scaled_mm(x_q, W_q.t(), scale_a, scale_b, bias=b, out_dtype=torch.bfloat16)`` with x_q,
W_q e4m3fn / e5m2, scale_a / scale_b float8_e8m0fnu (torch's BlockWise1x32 recipe), W_q and scale_b parameters /
buffers. torch's meta check wants scale_a to hold 128 ceil(M / 128) x ceil(K / 128) 4 values. On ROCm the v1
_scaled_mm reads them unswizzled: row-major [rows, K / 32] (pytorch/pytorch#190290 keeps v1 so; the 32x8
pre-swizzled layout is the v2 API's opt-in); on CUDA it reads cuBLAS's 128x4-swizzled layout (torchao's
`to_blocked`), whose 2-D form has shape [32 ceil(M / 128), 16 ceil(K / 128)]: the shapes tell them apart. Taken:
scale_a [M or 128 ceil(M / 128), K / 32] and scale_b [N or 128 ceil(N / 128), K / 32] (the ROCm layout), K % 128 == 0
(so the row stride is K / 32 in both readings). Stays in PyTorch with the reason: other archs (no scaled MFMA),
swizzled or 1-D scales, K % 128, a run-time weight or weight scale, fp4 (float4_e2m1fn_x2) operands, fp8 output.
torch's CPU _scaled_mm has no MX path (eager raises there); tests compare with the dequantized matmul.
"""

from __future__ import annotations

import functools

import torch

from translator_kernels.gemm.mx import E8M0, MX_DTYPES

from ..graph import aten, dtype_of, shape_of
from ..registry import Match, Stage, rule


def _rows_ok(rows, want: int) -> bool:
    return rows in (want, -(-want // 128) * 128)


def mx_scaled_mm_check(ctx, x, m2, w, sa, sb, bias, out):
    """The support check of an MX _scaled_mm (quant.scaled_mm_supported hands it the e8m0-scaled ones)."""
    if not ctx.arch.startswith("gfx950"):
        return f"MX block scales (float8_e8m0fnu) need gfx950's scaled MFMA; {ctx.arch} has none"
    for what, dt in (("input", dtype_of(x)), ("weight", w.dtype)):
        if dt not in MX_DTYPES.values():
            return f"MX {what} dtype {str(dt).replace('torch.', '')} is not e4m3fn / e5m2 (fp4 / fp6 MX not done)"
    (m, k), n = shape_of(x), w.shape[0]
    if not isinstance(k, int) or k % 128:
        return f"MX: K={k} is not a multiple of 128"
    sw = ctx.constant(sb)
    if sw is None:
        return "MX: scale_b is not a parameter / buffer (no translate-time layout)"
    sa_shape = shape_of(sa)
    if sa_shape is None or len(sa_shape) != 2 or sa_shape[1] != k // 32 or not _rows_ok(sa_shape[0], m) \
            or sw.dim() != 2 or sw.shape[1] != k // 32 or not _rows_ok(sw.shape[0], n):
        return (f"MX scales of shape {list(sa_shape or ())} / {list(sw.shape)} are not the unswizzled [rows, K / 32] "
                f"layout ROCm's _scaled_mm reads (a swizzled or 1-D layout is CUDA's)")
    if bias is not None and shape_of(bias) != (n,):
        return f"bias of shape {shape_of(bias)} is not [N]"
    return Match(x=x, w=w, b=m2, sa=sa, sb=sb, sw=sw, bias=bias, out=out, mx=True)


def is_mx_scale(node) -> bool:
    return dtype_of(node) == E8M0


def lower_mx(node, ctx, m):
    from translator_kernels.gemm.mx import shuffle_scale_mx, shuffle_weight_mx

    from .gemm import _sources

    n, k = m.w.shape

    def scales(s):
        return shuffle_scale_mx(s[:n], n, k)

    w_node = ctx.add_constant(shuffle_weight_mx(m.w), "wmx", node, derive=shuffle_weight_mx, sources=(m.w,))
    s_node = ctx.add_constant(scales(m.sw), "smx", node, derive=scales, sources=(m.sw,))
    return ctx.replace(node, "gemm_fp8", "scaled_mm_mx", (m.x, w_node, n, k, m.sa, s_node, m.bias, m.out),
                       _sources(node, m.b))


def _a_scale(a, k, s):
    """e8m0 [M', K / 32] -> its first M rows as [..., K / 32]; an fp32 scale flattened (one value / per row)."""
    if s is not None and s.dtype == E8M0:
        return s.reshape(-1, k // 32)[:a.reshape(-1, k).shape[0]].reshape(*a.shape[:-1], k // 32)
    return None if s is None else s.reshape(-1)


def kernel_gemm_mx(a, w, n, k, a_scale, w_scale, bias, out_dtype):
    """gemm_fp8's adapter for an MX weight (uint8 w_scale)."""
    from translator_kernels.gemm.mx import gemm_mx

    a_scale = _a_scale(a, k, a_scale)
    return gemm_mx(a, w, n, k, w_scale, a_scale=a_scale, bias=bias, out_dtype=out_dtype)


def ref_gemm_mx_op(a, w, n, k, a_scale, w_scale, bias, out_dtype):
    from translator_kernels.gemm.mx import ref_gemm_mx, unshuffle_scale_mx, unshuffle_weight_mx

    a_scale = _a_scale(a, k, a_scale)
    return ref_gemm_mx(a, a_scale, unshuffle_weight_mx(w, n, k), unshuffle_scale_mx(w_scale, n, k), bias=bias,
                       out_dtype=out_dtype)


# ---- precision="fp8" with MXFP8 weights (fp8_mode.FP8_WEIGHTS = "mxfp8") ----
def _mx_weight(fmt, w):
    from translator_kernels.gemm.mx import quantize_mx, shuffle_weight_mx

    return shuffle_weight_mx(quantize_mx(w.detach(), _MODE_DTYPES[fmt])[0])


def _mx_weight_scale(fmt, w):
    from translator_kernels.gemm.mx import quantize_mx, shuffle_scale_mx

    n, k = w.shape
    return shuffle_scale_mx(quantize_mx(w.detach(), _MODE_DTYPES[fmt])[1], n, k)


_MODE_DTYPES = {"mxfp8": torch.float8_e4m3fn, "mxfp4": torch.float4_e2m1fn_x2}


def mode_weights(arch: str, fmt: str, k: int):
    """(weight, scale) builders of precision="fp8" for fp8_mode.FP8_WEIGHTS = `fmt` ("mxfp8" / "mxfp4": W quantized
    once to e4m3fn / e2m1 with e8m0 scales per 32 of K; the activation stays per-token fp8 with its fp32 scale in
    the epilogue, the MFMA's A scale the constant 2^0); None where K % 32 (that linear keeps per-channel weights).
    InputError for another format or an arch without the scaled MFMA."""
    from ..errors import InputError

    if fmt not in _MODE_DTYPES:
        raise InputError(f"fp8_mode.FP8_WEIGHTS = {fmt!r} is not a weight format: want 'channel' (per output "
                         f"channel, both archs), 'mxfp8' or 'mxfp4' (gfx950)")
    if not arch.startswith("gfx950"):
        raise InputError(f"MX weights (fp8_mode.FP8_WEIGHTS = {fmt!r}) need gfx950's scaled MFMA; {arch} has "
                         f"none: set FP8_WEIGHTS = 'channel' (per-channel fp8) for {arch}")
    if k % 32:
        return None
    return functools.partial(_mx_weight, fmt), functools.partial(_mx_weight_scale, fmt)


# ---- a tensor-subclass weight (torchao's MXTensor, Float8Tensor): stays in PyTorch with this reason ----
def _subclass_weight(node, ctx):
    from torch.fx import Node
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    from ..graph import arg

    w = arg(node, "weight")
    if not (isinstance(w, Node) and w.op == "get_attr"):
        return None
    obj = ctx.gm
    for part in w.target.split("."):
        obj = getattr(obj, part, None)
    return obj if is_traceable_wrapper_subclass(obj) else None


def subclass_linear_supported(node, ctx):
    """A linear whose weight is a tensor subclass (ctx.constant gives None for it: no plain data to preshuffle)."""
    from ..registry import NO_MATCH

    w = _subclass_weight(node, ctx)
    if w is None:
        return NO_MATCH
    what = type(w).__name__
    if hasattr(w, "scale") and getattr(getattr(w, "scale", None), "dtype", None) == E8M0:
        return (f"weight is {what} (torchao MX, a tensor subclass): its dynamic MX activation quantization has no "
                f"FlyDSL kernel yet, so the linear stays in PyTorch; write it as torch._scaled_mm with e8m0 scales, "
                f"or use precision='fp8' with fp8_mode.FP8_WEIGHTS = 'mxfp8'")
    return f"weight is a tensor subclass ({what}): its data cannot be prepared at translate time"


@rule(Stage.CANONICAL, aten.linear.default, family="gemm", supported=subclass_linear_supported, priority=20,
      doc="a linear whose weight is a tensor subclass (torchao MXTensor / Float8Tensor) stays in PyTorch, with why")
def lower_subclass_linear(node, ctx):
    raise AssertionError("subclass_linear_supported never accepts")  # only reasons
