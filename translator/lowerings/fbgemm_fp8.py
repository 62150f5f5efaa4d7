"""HF transformers' FbgemmFp8Config: per-channel fp8 weights, dynamic per-token activations.

`transformers.integrations.fbgemm_fp8.FbgemmFp8Linear` (what `FbgemmFp8Config` puts in place of every
nn.Linear but the LM head) holds W as fp8 [N, K] with `weight_scale` [N, 1] fp32, and runs::

    xq, xs = torch.ops.fbgemm.quantize_fp8_per_row(x.view(-1, K).contiguous(), scale_ub=...)
    y = torch.ops.fbgemm.f8f8bf16_rowwise(xq, self.weight, xs, self.weight_scale.float(), use_fast_accum=True)
    y = y + bias                                    # when the linear has one

(on XPU, `torch._scaled_mm` instead of f8f8bf16_rowwise: lowerings/quant.py takes that form). Both ops
come from fbgemm_gpu's gen_ai library; the rules here exist only where it is loaded before the
translator (`torch.ops.fbgemm` has the ops at import), and are then:

- ``f8f8bf16_rowwise(XQ, WQ, x_scale, w_scale)`` with WQ a parameter in the arch's e4m3 (fnuz on
  gfx942, OCP on gfx950) -> `flydsl.gemm_fp8` (per-token x per-channel scales in the epilogue, bf16 out,
  W preshuffled once). use_fast_accum is fbgemm's choice of a shorter accumulation; ours sums in fp32.
  Stays in PyTorch with a reason: a weight of the other arch's format (HF declares e4m3fn: on gfx942
  the model must be quantized to fnuz), a run-time W, K % 16, an ``output=`` buffer.
- ``quantize_fp8_per_row`` stays fbgemm's kernel, with the reason: fbgemm rounds
  ``x * min(FMAX / amax, 512 * FMAX)`` (and clamps amax at scale_ub), where flydsl.quantize_fp8 (and the
  norms that write fp8) round ``x / max(amax / FMAX, 1e-12)``: the fp8 values differ in the last bit, so
  taking it would change the model's numbers. Its producer stays a kernel of its own.
"""

from __future__ import annotations

import torch

from ..graph import arg, dtype_of, shape_of
from ..registry import Match, Stage, rule
from . import quant
from .fp8_mode import shuffle_weight_fp8


def _ops():
    """(quantize_fp8_per_row, f8f8bf16_rowwise) overloads when fbgemm_gpu registered them, else None."""
    try:
        return torch.ops.fbgemm.quantize_fp8_per_row.default, torch.ops.fbgemm.f8f8bf16_rowwise.default
    except (AttributeError, RuntimeError):
        return None


QUANT_REASON = ("fbgemm's per-row quantization rounds x * min(FMAX / amax, 512 * FMAX) (amax clamped at "
                "scale_ub), flydsl.quantize_fp8 rounds x / max(amax / FMAX, 1e-12): not the same fp8 values, "
                "so fbgemm's kernel runs it")


def rowwise_supported(node, ctx):
    xq, wq, xs, ws = (arg(node, k) for k in ("XQ", "WQ", "x_scale", "w_scale"))
    if arg(node, "output") is not None:
        return "f8f8bf16_rowwise with an output= buffer is not supported"
    w = ctx.constant(wq)
    if w is None or w.dim() != 2:
        return "WQ is not a 2-D parameter (no translate-time preshuffle)"
    r = quant._fp8_reason(dtype_of(xq), ctx.arch, "XQ") or quant._fp8_reason(w.dtype, ctx.arch, "WQ")
    if r:
        return r
    shape = shape_of(xq)
    n, k = w.shape
    if shape is None or len(shape) != 2 or shape[1] != k or k % 16:
        return f"XQ of shape {shape} against WQ [{n}, {k}]: want [M, K] with K a multiple of 16"
    r = quant._scale_reason(shape_of(xs), shape[0], "x_scale") or quant._scale_reason(shape_of(ws), n, "w_scale")
    if r:
        return r
    bias = arg(node, "bias")
    if bias is not None and list(shape_of(bias) or ()) != [n]:
        return f"bias of shape {shape_of(bias)} is not [N]"
    return Match(x=xq, w=w, wq=wq, xs=xs, ws=ws, bias=bias)


def quantize_per_row_supported(node, ctx):
    return QUANT_REASON


OPS = _ops()
if OPS is not None:
    QUANTIZE_PER_ROW, F8F8BF16_ROWWISE = OPS

    @rule(Stage.CANONICAL, F8F8BF16_ROWWISE, family="gemm_fp8", supported=rowwise_supported, name="fbgemm_rowwise",
          doc="fbgemm f8f8bf16_rowwise (HF FbgemmFp8Linear): per-token x per-channel fp8 GEMM, parameter weight")
    def lower_fbgemm_rowwise(node, ctx, m):
        n, k = m.w.shape
        w_node = ctx.add_constant(shuffle_weight_fp8(m.w), "w8", node, derive=shuffle_weight_fp8, sources=(m.w,))
        return ctx.replace(node, "gemm_fp8", "fbgemm_rowwise", (m.x, w_node, n, k, m.xs, m.ws, m.bias, "bf16"),
                           [node])

    @rule(Stage.CANONICAL, QUANTIZE_PER_ROW, family="quantize_fp8", supported=quantize_per_row_supported,
          name="fbgemm_quantize_per_row", doc="fbgemm quantize_fp8_per_row: stays fbgemm's kernel (its rounding)")
    def lower_fbgemm_quantize_per_row(node, ctx):  # never called: the support check always gives the reason
        raise AssertionError(QUANT_REASON)
