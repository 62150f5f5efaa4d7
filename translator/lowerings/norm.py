"""Norm family: `flydsl.layer_norm`, `flydsl.rms_norm`, their residual-add forms, `flydsl.group_norm`.

LayerNorm / RMSNorm normalize each row of ``x.reshape(-1, prod(normalized_shape))`` with fp32
statistics and an optional per-element affine. `flydsl.add_layer_norm(x, r, ...)` /
`flydsl.add_rms_norm(x, r, ...)` return ``(x + r, norm(x + r))`` from one pass (the sum
rounded to x's dtype before the statistics, as eager computes it). `flydsl.group_norm`
takes statistics per (sample, group) over channels-in-group x spatial, per-channel affine.

Forms matched here, canonical aten ops (where they appear):
- ``aten.layer_norm(x, shape, w, b, eps)`` — nn.LayerNorm in BERT, GPT-2, ViT, nanoGPT.
- ``aten.native_layer_norm`` whose mean / rstd outputs are unused — traces that decompose.
- ``aten.rms_norm(x, shape, w, eps)`` — nn.RMSNorm / F.rms_norm (torch >= 2.4 models).
- ``aten.group_norm`` / ``aten.native_group_norm`` — nn.GroupNorm in diffusion UNets / VAEs.
- ``aten.instance_norm`` with input statistics — nn.InstanceNorm{1,2,3}d (style transfer, GANs).
Hand-written RMSNorm / LayerNorm and residual add + norm: norm_patterns.py.
"""

from __future__ import annotations

import math
import operator
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from ..graph import aten, arg, dtype_of, dtype_reason, getitem_of, is_static, shape_of, static_int
from ..registry import OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch


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
    from translator_kernels.rows.norm import layer_norm as run

    x2, n = _rows(x, normalized_shape)
    w = weight.reshape(n) if weight is not None else None
    b = bias.reshape(n) if bias is not None else None
    return run(x2, w, b, eps).reshape(x.shape)


def kernel_rms_norm(x, normalized_shape, weight, eps):
    from translator_kernels.rows.norm import rms_norm as run

    x2, n = _rows(x, normalized_shape)
    w = weight.reshape(n) if weight is not None else None
    return run(x2, w, eps).reshape(x.shape)


register_family(OpFamily(
    name="layer_norm", description="LayerNorm over trailing dims, fp32 statistics",
    reference=ref_layer_norm, kernel=kernel_layer_norm, kernel_entry="translator_kernels.rows.norm:layer_norm",
    sample_inputs=lambda dt: (torch.randn(4, 48).to(dt), [48], torch.randn(48).to(dt), torch.randn(48).to(dt), 1e-5),
))
register_family(OpFamily(
    name="rms_norm", description="RMSNorm over trailing dims, fp32 statistics",
    reference=ref_rms_norm, kernel=kernel_rms_norm, kernel_entry="translator_kernels.rows.norm:rms_norm",
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


def _stats_used(node) -> bool:
    """A native_*_norm whose mean / rstd outputs are read (export adds unused getitems too)."""
    if any(u.target is not operator.getitem for u in node.users):
        return True
    outs = {getitem_of(u)[1] for u in node.users if u.users}
    return bool(outs - {0}) or 0 not in outs


def _output0(node):
    return next(u for u in node.users if getitem_of(u)[1] == 0 and u.users)


def layer_norm_supported(node, ctx):
    x, shape, w, b = (arg(node, k) for k in ("input", "normalized_shape", "weight", "bias"))
    if node.target is aten.native_layer_norm.default:
        if _stats_used(node):
            return "native_layer_norm's mean/rstd outputs are used"
    return _norm_reason(x, shape, w, b)


@rule(Stage.CANONICAL, aten.layer_norm.default, aten.native_layer_norm.default, family="layer_norm",
      supported=layer_norm_supported, doc="nn.LayerNorm / F.layer_norm")
def lower_layer_norm(node, ctx):
    x, shape, w, b, eps = (arg(node, k) for k in ("input", "normalized_shape", "weight", "bias", "eps"))
    shape = list(shape)
    args = (ctx.cast_in(x, node), shape, ctx.cast_in(w, node), ctx.cast_in(b, node), float(eps))
    if node.target is aten.native_layer_norm.default:
        get0 = _output0(node)
        return ctx.replace(get0, "layer_norm", "layer_norm", args, [*node.users, node], out_dtype=dtype_of(x))
    return ctx.replace(node, "layer_norm", "layer_norm", args, [node])


def rms_norm_supported(node, ctx):
    return _norm_reason(arg(node, "input"), arg(node, "normalized_shape"), arg(node, "weight"))


@rule(Stage.CANONICAL, aten.rms_norm.default, family="rms_norm", supported=rms_norm_supported,
      doc="nn.RMSNorm / F.rms_norm")
def lower_rms_norm(node, ctx):
    x, shape, w, eps = (arg(node, k) for k in ("input", "normalized_shape", "weight", "eps"))
    shape = list(shape)
    if eps is None:  # torch's default: the input dtype's machine epsilon
        eps = torch.finfo(dtype_of(x)).eps
    args = (ctx.cast_in(x, node), shape, ctx.cast_in(w, node), float(eps))
    return ctx.replace(node, "rms_norm", "rms_norm", args, [node])




# --- residual add + norm: two outputs (the residual stream, the normalized value) -------------

@torch.library.custom_op("flydsl::add_layer_norm", mutates_args=())
def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, normalized_shape: List[int],
                   weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                   eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    return dispatch("add_layer_norm", x, residual, normalized_shape, weight, bias, eps)


@add_layer_norm.register_fake
def _(x, residual, normalized_shape, weight, bias, eps):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format))


@torch.library.custom_op("flydsl::add_rms_norm", mutates_args=())
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, normalized_shape: List[int],
                 weight: Optional[torch.Tensor], eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    return dispatch("add_rms_norm", x, residual, normalized_shape, weight, eps)


@add_rms_norm.register_fake
def _(x, residual, normalized_shape, weight, eps):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format))


def ref_add_layer_norm(x, residual, normalized_shape, weight, bias, eps):
    s = (x + residual).contiguous()  # rounded to x's dtype, as eager's add; laid out as the kernel writes it
    return s, ref_layer_norm(s, normalized_shape, weight, bias, eps)


def ref_add_rms_norm(x, residual, normalized_shape, weight, eps):
    s = (x + residual).contiguous()
    return s, ref_rms_norm(s, normalized_shape, weight, eps)


def kernel_add_layer_norm(x, residual, normalized_shape, weight, bias, eps):
    from translator_kernels.rows.norm import add_layer_norm as run

    x2, n = _rows(x, normalized_shape)
    w = weight.reshape(n) if weight is not None else None
    b = bias.reshape(n) if bias is not None else None
    s, y = run(x2, residual.reshape(-1, n), w, b, eps)
    return s.reshape(x.shape), y.reshape(x.shape)


def kernel_add_rms_norm(x, residual, normalized_shape, weight, eps):
    from translator_kernels.rows.norm import add_rms_norm as run

    x2, n = _rows(x, normalized_shape)
    w = weight.reshape(n) if weight is not None else None
    s, y = run(x2, residual.reshape(-1, n), w, eps)
    return s.reshape(x.shape), y.reshape(x.shape)


register_family(OpFamily(
    name="add_layer_norm", description="(x + r, LayerNorm(x + r)) in one pass, fp32 statistics",
    reference=ref_add_layer_norm, kernel=kernel_add_layer_norm, kernel_entry="translator_kernels.rows.norm:add_layer_norm",
    sample_inputs=lambda dt: (torch.randn(4, 48).to(dt), torch.randn(4, 48).to(dt), [48], torch.randn(48).to(dt),
                              torch.randn(48).to(dt), 1e-5),
))
register_family(OpFamily(
    name="add_rms_norm", description="(x + r, RMSNorm(x + r)) in one pass, fp32 statistics",
    reference=ref_add_rms_norm, kernel=kernel_add_rms_norm, kernel_entry="translator_kernels.rows.norm:add_rms_norm",
    sample_inputs=lambda dt: (torch.randn(4, 48).to(dt), torch.randn(4, 48).to(dt), [48], torch.randn(48).to(dt), 1e-6),
))


# --- GroupNorm / InstanceNorm ---------------------------------------------------------------

@torch.library.custom_op("flydsl::group_norm", mutates_args=())
def group_norm(x: torch.Tensor, num_groups: int, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
               eps: float) -> torch.Tensor:
    return dispatch("group_norm", x, num_groups, weight, bias, eps)


@group_norm.register_fake
def _(x, num_groups, weight, bias, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def ref_group_norm(x, num_groups, weight, bias, eps):
    return F.group_norm(x.float(), num_groups, _f(weight), _f(bias), eps).to(x.dtype).contiguous()  # as the kernel


def kernel_group_norm(x, num_groups, weight, bias, eps):
    from translator_kernels.rows.norm import group_norm as run

    return run(x, num_groups, weight, bias, eps)


register_family(OpFamily(
    name="group_norm", description="GroupNorm / InstanceNorm: stats per (sample, group), per-channel affine",
    reference=ref_group_norm, kernel=kernel_group_norm, kernel_entry="translator_kernels.rows.norm:group_norm",
    sample_inputs=lambda dt: (torch.randn(2, 8, 3, 5).to(dt), 4, torch.randn(8).to(dt), torch.randn(8).to(dt), 1e-5),
))


def _group_reason(x, groups, *params):
    r = dtype_reason(x)
    if r:
        return r
    shape = shape_of(x)
    if len(shape) < 2:
        return f"input of shape {list(shape)} has no channel dim (GroupNorm takes [N, C, *spatial])"
    c = static_int(shape[1])
    if c is None:
        return "the channel dim is dynamic (the groups and the per-channel affine need a fixed C)"
    if groups is None or groups <= 0 or c % groups:
        return f"C={c} is not divisible by num_groups={groups}"
    for p in params:
        if p is not None and dtype_reason(p, "weight/bias"):
            return dtype_reason(p, "weight/bias")
    return None


def group_norm_supported(node, ctx):
    if node.target is aten.native_group_norm.default:
        if _stats_used(node):
            return "native_group_norm's mean/rstd outputs are used"
        return _group_reason(arg(node, "input"), arg(node, "group"), arg(node, "weight"), arg(node, "bias"))
    return _group_reason(arg(node, "input"), arg(node, "num_groups"), arg(node, "weight"), arg(node, "bias"))


@rule(Stage.CANONICAL, aten.group_norm.default, aten.native_group_norm.default, family="group_norm",
      supported=group_norm_supported, doc="nn.GroupNorm / F.group_norm")
def lower_group_norm(node, ctx):
    x = arg(node, "input")
    if node.target is aten.native_group_norm.default:
        w, b, groups, eps = (arg(node, k) for k in ("weight", "bias", "group", "eps"))
        root = _output0(node)
        sources = [*node.users, node]
    else:
        groups, w, b, eps = arg(node, "num_groups"), arg(node, "weight"), arg(node, "bias"), \
            arg(node, "eps", 1e-5)
        root, sources = node, [node]
    args = (ctx.cast_in(x, root), int(groups), ctx.cast_in(w, root), ctx.cast_in(b, root), float(eps))
    return ctx.replace(root, "group_norm", "group_norm", args, sources, out_dtype=dtype_of(x))


def instance_norm_supported(node, ctx):
    x = arg(node, "input")
    w, b = arg(node, "weight"), arg(node, "bias")
    if not arg(node, "use_input_stats", True):
        return ("instance_norm uses running statistics (track_running_stats=True in eval mode), "
                "an affine per channel that is not a per-sample norm")
    shape = shape_of(x)
    if shape is not None and len(shape) < 3:
        return f"input of shape {list(shape)} has no spatial dims (InstanceNorm takes [N, C, *spatial])"
    c = static_int(shape[1]) if shape is not None and len(shape) > 1 else None
    return _group_reason(x, c, w, b)


@rule(Stage.CANONICAL, aten.instance_norm.default, family="group_norm", supported=instance_norm_supported,
      doc="nn.InstanceNorm*d (input statistics): GroupNorm with G = C")
def lower_instance_norm(node, ctx):
    x = arg(node, "input")
    w, b, eps = arg(node, "weight"), arg(node, "bias"), arg(node, "eps", 1e-5)
    c = static_int(shape_of(x)[1])
    args = (ctx.cast_in(x, node), c, ctx.cast_in(w, node), ctx.cast_in(b, node), float(eps))
    return ctx.replace(node, "group_norm", "instance_norm", args, [node])
