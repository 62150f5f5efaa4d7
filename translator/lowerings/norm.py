"""Norm family: `flydsl.layer_norm` and `flydsl.rms_norm` over the trailing dims.

Both normalize each row of ``x.reshape(-1, prod(normalized_shape))`` with fp32 statistics
and an optional per-element affine.

Forms matched (where they appear):
- ``aten.layer_norm(x, shape, w, b, eps)`` — nn.LayerNorm in BERT, GPT-2, ViT, nanoGPT.
- ``aten.native_layer_norm`` whose mean / rstd outputs are unused — traces that decompose.
- ``aten.rms_norm(x, shape, w, eps)`` — nn.RMSNorm / F.rms_norm (torch >= 2.4 models).
Hand-written RMSNorm / LayerNorm and residual-add + norm arrive with the row-kernel issue.
"""

from __future__ import annotations

import math
import operator
from typing import List, Optional

import torch
import torch.nn.functional as F

from ..registry import Lowering, OpFamily, register_family, register_lowering
from ..runtime.ops import dispatch
from ._common import aten, dtype_of, dtype_reason, is_static, shape_of


@torch.library.custom_op("flydsl::layer_norm", mutates_args=())
def layer_norm(x: torch.Tensor, normalized_shape: List[int], weight: Optional[torch.Tensor],
               bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    return dispatch("layer_norm", x, normalized_shape, weight, bias, eps)


@layer_norm.register_fake
def _(x, normalized_shape, weight, bias, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("flydsl::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, normalized_shape: List[int], weight: Optional[torch.Tensor],
             eps: float) -> torch.Tensor:
    return dispatch("rms_norm", x, normalized_shape, weight, eps)


@rms_norm.register_fake
def _(x, normalized_shape, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _f(t):
    return None if t is None else t.float()


def ref_layer_norm(x, normalized_shape, weight, bias, eps):
    return F.layer_norm(x.float(), normalized_shape, _f(weight), _f(bias), eps).to(x.dtype)


def ref_rms_norm(x, normalized_shape, weight, eps):
    return F.rms_norm(x.float(), normalized_shape, _f(weight), eps).to(x.dtype)


def _rows(x, normalized_shape):
    n = math.prod(normalized_shape)
    return x.reshape(-1, n), n


def kernel_layer_norm(x, normalized_shape, weight, bias, eps):
    from translator_kernels.norm import layer_norm as run

    x2, n = _rows(x, normalized_shape)
    w = weight.reshape(n) if weight is not None else None
    b = bias.reshape(n) if bias is not None else None
    return run(x2, w, b, eps).reshape(x.shape)


def kernel_rms_norm(x, normalized_shape, weight, eps):
    from translator_kernels.norm import rms_norm as run

    x2, n = _rows(x, normalized_shape)
    w = weight.reshape(n) if weight is not None else None
    return run(x2, w, eps).reshape(x.shape)


register_family(OpFamily(
    name="layer_norm", description="LayerNorm over trailing dims, fp32 statistics",
    reference=ref_layer_norm, kernel=kernel_layer_norm, kernel_entry="translator_kernels.norm:layer_norm",
    sample_inputs=lambda dt: (torch.randn(4, 48).to(dt), [48], torch.randn(48).to(dt), torch.randn(48).to(dt), 1e-5),
))
register_family(OpFamily(
    name="rms_norm", description="RMSNorm over trailing dims, fp32 statistics",
    reference=ref_rms_norm, kernel=kernel_rms_norm, kernel_entry="translator_kernels.norm:rms_norm",
    sample_inputs=lambda dt: (torch.randn(4, 48).to(dt), [48], torch.randn(48).to(dt), 1e-6),
))


def _norm_reason(x, normalized_shape, *params):
    r = dtype_reason(x)
    if r:
        return r
    if not is_static(*normalized_shape):
        return "normalized_shape is dynamic"
    if tuple(shape_of(x)[-len(normalized_shape):]) != tuple(normalized_shape):
        return f"normalized_shape {list(normalized_shape)} does not match the input's trailing dims"
    for p in params:
        if p is not None and dtype_reason(p, "weight/bias"):
            return dtype_reason(p, "weight/bias")
    return None


def layer_norm_supported(node, ctx):
    x, shape = node.args[0], node.args[1]
    w = node.args[2] if len(node.args) > 2 else None
    b = node.args[3] if len(node.args) > 3 else None
    if node.target is aten.native_layer_norm.default:
        if any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
            return "native_layer_norm's mean/rstd outputs are used"
    return _norm_reason(x, shape, w, b)


def lower_layer_norm(node, ctx):
    x, shape = node.args[0], list(node.args[1])
    w = node.args[2] if len(node.args) > 2 else None
    b = node.args[3] if len(node.args) > 3 else None
    eps = node.args[4] if len(node.args) > 4 else 1e-5
    args = (ctx.cast_in(x, node), shape, ctx.cast_in(w, node), ctx.cast_in(b, node), float(eps))
    if node.target is aten.native_layer_norm.default:
        (get0,) = list(node.users)
        new = ctx.replace(get0, "layer_norm", "layer_norm", args, [get0, node], out_dtype=dtype_of(x))
        return new
    return ctx.replace(node, "layer_norm", "layer_norm", args, [node])


def rms_norm_supported(node, ctx):
    x, shape = node.args[0], node.args[1]
    w = node.args[2] if len(node.args) > 2 else node.kwargs.get("weight")
    return _norm_reason(x, shape, w)


def lower_rms_norm(node, ctx):
    x, shape = node.args[0], list(node.args[1])
    w = node.args[2] if len(node.args) > 2 else node.kwargs.get("weight")
    eps = node.args[3] if len(node.args) > 3 else node.kwargs.get("eps")
    if eps is None:  # torch's default: the input dtype's machine epsilon
        eps = torch.finfo(dtype_of(x)).eps
    args = (ctx.cast_in(x, node), shape, ctx.cast_in(w, node), float(eps))
    return ctx.replace(node, "rms_norm", "rms_norm", args, [node])


register_lowering(Lowering("layer_norm", "layer_norm", (aten.layer_norm.default, aten.native_layer_norm.default),
                           layer_norm_supported, lower_layer_norm, doc="nn.LayerNorm / F.layer_norm"))
register_lowering(Lowering("rms_norm", "rms_norm", (aten.rms_norm.default,), rms_norm_supported, lower_rms_norm,
                           doc="nn.RMSNorm / F.rms_norm"))
