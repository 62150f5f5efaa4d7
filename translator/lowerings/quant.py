"""Quantized GEMMs: `torch._scaled_mm` with an fp8 weight -> `flydsl.gemm_fp8`; weight-only int8 ->
`flydsl.gemm_w8`.

`flydsl.gemm_fp8(a, w, n, k, a_scale, w_scale, bias, out_dtype)` computes
``(a @ W.T) * w_scale[col] * a_scale[row] + bias`` in fp32 and casts once to out_dtype, for an
8-bit float activation ``a[M, k]`` and weight ``W[n, k]`` preshuffled at translate time
(translator_kernels.gemm.fp8: the family's GEMM kernel with fp8 / bf8 MFMAs; scales per tensor,
per row of a (per token) or per column of W (per output channel), fp32, applied in the epilogue).

Form matched (where it appears):
- ``torch._scaled_mm(x_fp8, w_fp8.t(), scale_a, scale_b, bias=b, out_dtype=torch.bfloat16)`` with a
  parameter / buffer weight: torchao's float8 inference linears (dynamic per-token or per-tensor
  activation scaling, per-channel or per-tensor weights) and hand-written fp8 linears. The activation's
  quantization (amax, divide, clamp, cast) before it stays as it was traced (elementwise kernels or
  PyTorch): precision="fp8" (translator.lowerings.fp8_mode) writes its own.

- ``F.linear(x, w_int8.to(x.dtype)) * scales`` (PATTERN ``w8_linear``; gpt-fast's WeightOnlyInt8Linear):
  `flydsl.gemm_w8(x, W8, n, k, scale, bias)`, the int8 weight preshuffled once and converted to x's
  dtype in the GEMM's load path (translator_kernels.gemm.w8), the scale per output channel in the
  epilogue. Eager rounds the linear to x's dtype before the scale; the kernel rounds once.

- the same with float8_e8m0fnu scales (MX, gfx950): quant_mx.py's check and rewrite (the op's `w_scale` is then the
  MX weight's uint8 scale bytes; the adapters below hand such calls to quant_mx).

Stays in PyTorch, with the reason: fp8 formats the target's MFMA does not take (gfx942: e4m3fnuz /
e5m2fnuz; gfx950: OCP e4m3fn / e5m2), an fp8 output (out_dtype None), scale_result, a weight computed
at run time, other block-wise scales (HF's 128 x 128 form is quant_block.py's), K not a multiple of 16.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
from torch.fx import Node

from translator_kernels.arch import FLOAT_NAMES, NAMED_DTYPES
from translator_kernels.gemm.fp8 import (FP8_DTYPES, fp8_dtype, quantize_fp8, ref_gemm_fp8, shuffle_weight_fp8,
                                         unshuffle_weight_fp8)

from ..graph import aten, arg, dtype_of, shape_of
from ..registry import NO_MATCH, Match, OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch
from . import quant_mx
from .gemm import _sources, _weight_nk

_OUT = NAMED_DTYPES  # the op's out_dtype: "bf16" / "f16" / "f32"
_OUT_NAME = FLOAT_NAMES


@torch.library.custom_op("flydsl::gemm_fp8", mutates_args=())
def gemm_fp8(a: torch.Tensor, w: torch.Tensor, n: int, k: int, a_scale: Optional[torch.Tensor],
             w_scale: Optional[torch.Tensor], bias: Optional[torch.Tensor], out_dtype: str) -> torch.Tensor:
    return dispatch("gemm_fp8", a, w, n, k, a_scale, w_scale, bias, out_dtype)


@gemm_fp8.register_fake
def _(a, w, n, k, a_scale, w_scale, bias, out_dtype):
    return a.new_empty((*a.shape[:-1], n), dtype=_OUT[out_dtype])


def ref_gemm_fp8_op(a, w, n, k, a_scale, w_scale, bias, out_dtype):
    if w_scale is not None and w_scale.dtype == torch.uint8:  # an MX weight (quant_mx.py)
        return quant_mx.ref_gemm_mx_op(a, w, n, k, a_scale, w_scale, bias, _OUT[out_dtype])
    wq = unshuffle_weight_fp8(w, n, k)
    return ref_gemm_fp8(a, wq, _flat(a_scale), _flat(w_scale), bias=bias, out_dtype=_OUT[out_dtype])


def _flat(s):
    return None if s is None else s.reshape(-1)


def kernel_gemm_fp8(a, w, n, k, a_scale, w_scale, bias, out_dtype):
    from translator_kernels.gemm.fp8 import gemm_fp8 as run

    if w_scale is not None and w_scale.dtype == torch.uint8:  # an MX weight (quant_mx.py)
        return quant_mx.kernel_gemm_mx(a, w, n, k, a_scale, w_scale, bias, _OUT[out_dtype])
    return run(a, w, n, k, a_scale=_flat(a_scale), w_scale=_flat(w_scale), bias=bias, out_dtype=_OUT[out_dtype])


def _sample_gemm_fp8(dtype):
    g = torch.Generator().manual_seed(0)
    dt = fp8_dtype("gfx942")  # the registry tests run gfx942
    aq, sa = quantize_fp8(torch.randn(5, 48, generator=g), dt, dim=-1)
    wq, sw = quantize_fp8(torch.randn(24, 48, generator=g), dt, dim=-1)
    return (aq, shuffle_weight_fp8(wq), 24, 48, sa, sw.reshape(1, 24), torch.randn(24, generator=g), "bf16")


register_family(OpFamily(
    name="gemm_fp8", description="C = (A_q @ W_q.T) * w_scale[col] * a_scale[row] + bias, 8-bit float A and W",
    reference=ref_gemm_fp8_op, kernel=kernel_gemm_fp8, kernel_entry="translator_kernels.gemm.fp8:gemm_fp8",
    sample_inputs=_sample_gemm_fp8,
    tolerance_overrides={torch.float32: (1e-4, 1e-4, "K-length fp32 sums of exact fp8 products in MFMA order")},
))


def _fp8_reason(dt, arch, what) -> str | None:
    formats = FP8_DTYPES["gfx950" if arch.startswith("gfx950") else "gfx942"]
    if dt in formats.values():
        return None
    name = str(dt).replace("torch.", "")
    want = " / ".join(str(d).replace("torch.", "") for d in formats.values())
    return f"{what} dtype {name} is not an 8-bit float format of {arch}'s MFMA ({want})"


def _scale_reason(shape, rows, what) -> str | None:
    """None when the scale is one value or one per row / column (shape [rows, 1] / [1, rows] / [rows])."""
    if shape is None:
        return f"{what} is not a tensor"
    numel = 1
    for d in shape:
        numel *= d
    if numel == 1 or (numel == rows and sum(d != 1 for d in shape) == 1):
        return None
    return f"{what} of shape {list(shape)} is neither per tensor nor per {'row' if 'a' in what else 'column'} " \
           f"(block-wise scales are not implemented)"


def scaled_mm_supported(node, ctx):
    x, m2 = arg(node, "self"), arg(node, "mat2")
    sa, sb, bias = arg(node, "scale_a"), arg(node, "scale_b"), arg(node, "bias")
    if arg(node, "scale_result") is not None:
        return "scale_result (an fp8 output's scale) is not supported"
    out_dt = arg(node, "out_dtype")
    if out_dt not in _OUT_NAME:
        return f"out_dtype {out_dt} is not bf16 / fp16 / fp32 (an fp8 output stays in PyTorch)"
    w = _weight_nk(m2, ctx)
    if w is None:
        return "right operand is not a parameter (no translate-time preshuffle)"
    if quant_mx.is_mx_scale(sa) or quant_mx.is_mx_scale(sb):  # e8m0 block scales (MX)
        return quant_mx.mx_scaled_mm_check(ctx, x, m2, w, sa, sb, bias, _OUT_NAME[out_dt])
    r = _fp8_reason(dtype_of(x), ctx.arch, "input") or _fp8_reason(w.dtype, ctx.arch, "weight")
    if r:
        return r
    (m, k), n = shape_of(x), w.shape[0]
    if not isinstance(k, int) or k % 16:
        return f"K={k} is not a multiple of 16"
    r = _scale_reason(shape_of(sa), m, "scale_a") or _scale_reason(shape_of(sb), n, "scale_b")
    if r:
        return r
    if bias is not None and shape_of(bias) != (n,):
        return f"bias of shape {shape_of(bias)} is not [N]"
    return Match(x=x, w=w, b=m2, sa=sa, sb=sb, bias=bias, out=_OUT_NAME[out_dt])


@rule(Stage.CANONICAL, aten._scaled_mm.default, family="gemm_fp8", supported=scaled_mm_supported,
      doc="torch._scaled_mm(x_fp8, W_fp8.t(), scale_a, scale_b) with a parameter weight")
def lower_scaled_mm(node, ctx, m):
    if getattr(m, "mx", False):
        return quant_mx.lower_mx(node, ctx, m)
    n, k = m.w.shape
    w_node = ctx.add_constant(shuffle_weight_fp8(m.w), "w8", node, derive=shuffle_weight_fp8, sources=(m.w,))
    return ctx.replace(node, "gemm_fp8", "scaled_mm", (m.x, w_node, n, k, m.sa, m.sb, m.bias, m.out),
                       _sources(node, m.b))




# ---- weight-only int8: F.linear(x, w_int8.to(x.dtype)) * scales -> flydsl.gemm_w8 ------------------------
@torch.library.custom_op("flydsl::gemm_w8", mutates_args=())
def gemm_w8(a: torch.Tensor, w: torch.Tensor, n: int, k: int, scale: torch.Tensor,
            bias: Optional[torch.Tensor]) -> torch.Tensor:
    return dispatch("gemm_w8", a, w, n, k, scale, bias)


@gemm_w8.register_fake
def _(a, w, n, k, scale, bias):
    return a.new_empty((*a.shape[:-1], n))


def ref_gemm_w8_op(a, w, n, k, scale, bias):
    from translator_kernels.gemm.w8 import ref_gemm_w8, unshuffle_weight_w8

    return ref_gemm_w8(a, unshuffle_weight_w8(w, n, k, a.dtype), scale, bias)


def kernel_gemm_w8(a, w, n, k, scale, bias):
    from translator_kernels.gemm.w8 import gemm_w8 as run

    return run(a, w, n, k, scale, bias=bias)


def _sample_gemm_w8(dtype):
    from translator_kernels.gemm.w8 import shuffle_weight_w8

    g = torch.Generator().manual_seed(0)
    w8 = torch.randint(-127, 128, (24, 48), generator=g, dtype=torch.int8)
    return (torch.randn(5, 48, generator=g).to(dtype), shuffle_weight_w8(w8, dtype), 24, 48,
            torch.rand(24, generator=g) / 50, None)


register_family(OpFamily(
    name="gemm_w8", description="C = (A @ W8.T) * scale[col] + bias, int8 weight dequantized in the load path",
    reference=ref_gemm_w8_op, kernel=kernel_gemm_w8, kernel_entry="translator_kernels.gemm.w8:gemm_w8",
    sample_inputs=_sample_gemm_w8,
    tolerance_overrides={torch.float32: (1e-4, 1e-4, "K-length fp32 sums in a different order than BLAS")},
))


def w8_linear_supported(node, ctx):
    """mul(linear(x, W8.to(x.dtype)), s): W8 an int8 parameter / buffer [N, K], s a constant of N values."""
    from ..graph import CASTS

    lin, s = arg(node, "self"), arg(node, "other")
    if not (isinstance(lin, Node) and lin.op == "call_function" and lin.target == aten.linear.default
            and len(lin.users) == 1 and arg(lin, "bias") is None):
        return NO_MATCH
    cast = arg(lin, "weight")
    if not (isinstance(cast, Node) and cast.target in CASTS and len(cast.users) == 1):
        return NO_MATCH
    w8, sc = ctx.constant(arg(cast, "self")), ctx.constant(s)
    if w8 is None or w8.dtype != torch.int8 or w8.dim() != 2 or sc is None:
        return NO_MATCH
    x = arg(lin, "input")
    if dtype_of(x) not in (torch.float32, torch.bfloat16, torch.float16) or dtype_of(cast) != dtype_of(x):
        return "weight-only int8: the activation must be fp32 / bf16 / fp16 and the weight cast to its dtype"
    n, k = w8.shape
    if sc.numel() != n or (sc.dim() > 1 and sc.shape[-1] != n):
        return f"scales of shape {list(sc.shape)} are not one per output channel ({n})"
    return Match(x=x, w8=w8, scale=sc, lin=lin, cast=cast)


@rule(Stage.PATTERN, aten.mul.Tensor, family="gemm_w8", supported=w8_linear_supported,
      doc="F.linear(x, w_int8.to(x.dtype)) * scales (weight-only int8)")
def lower_w8_linear(node, ctx, m):
    n, k = m.w8.shape
    prep = functools.partial(_w8_weight, dtype_of(m.x))
    w_node = ctx.add_constant(prep(m.w8), "w8", node, derive=prep, sources=(m.w8,))
    s_node = ctx.add_constant(_w8_scale(m.scale), "w8scale", node, derive=_w8_scale, sources=(m.scale,))
    return ctx.replace(node, "gemm_w8", "w8_linear", (m.x, w_node, n, k, s_node, None), [node, m.lin, m.cast])


def _w8_weight(dt, w8):
    from translator_kernels.gemm.w8 import shuffle_weight_w8

    return shuffle_weight_w8(w8.detach(), dt)


def _w8_scale(s):
    return s.detach().float().reshape(-1).contiguous()
