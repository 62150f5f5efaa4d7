"""Fine-grained (128 x 128 block) fp8 linears -> `flydsl.fp8_block_linear`.

`flydsl.fp8_block_linear(x, w, n, k, w_scale, bias)`: x quantized per token and K block of 128 values
(e4m3fn math), then the block-scaled fp8 GEMM, whose scales are applied inside its K loop
(translator_kernels.gemm.fp8_block: two launches, the quantize kernel and the GEMM; gfx942 runs the e4m3fn
values as e4m3fnuz halves, exactly). Output in x's dtype, + bias.

Form matched (where it appears):
- HF transformers' `FP8Linear` (quantization_config `FineGrainedFP8Config(weight_block_size=(128, 128))`, the
  DeepSeek-V3 / Qwen3-FP8 checkpoints' layout; `activation_scheme="dynamic"`): its call of
  `finegrained_fp8.fp8_linear` is captured as one `flydsl_hf.fp8_linear` node (translator/adapters/hf_quant.py)
  holding the e4m3fn weight [N, K], `weight_scale_inv` [ceil(N / 128), K / 128] (fp32 or ue8m0) and the block size.
  The weight is prepared once at translate time (rebuilt if the parameters change).

`flydsl.fp8_static_linear(x, w, n, k, w_scale, a_scale, bias)`: the same FP8Linear with
`activation_scheme="static"` (`FP8Linear.activation_scale`, one fp32 value per linear, calibrated offline): x
quantized with that fixed scale (``e4m3fn(clamp(x / sa, ±448))``: the quantize kernel reading the scale from the
device, no |max| reduction), then the fp8 GEMM with sa in its epilogue and the weight's 128 x 128 block scales in
its K loop, or its one per-tensor scale (`weight_block_size=None`) in the epilogue (translator_kernels.gemm.
fp8_static; two launches). The scale stays a device tensor: a value changed after translation is used as it is.

Stays in PyTorch (HF's own fp8_linear runs), with the reason: a block size other than 128 x 128 or the whole
weight, a per-tensor weight scale with dynamic activations (the hub kernel's per-token rule for it is not
re-typed here), FP4-packed weights, K not a multiple of 128 (blocks) / 16, an activation that is not fp32 / bf16 /
fp16, a static activation scale that is not one fp32 value.
"""

from __future__ import annotations

import functools
import sys
from typing import Optional

import torch

from translator_kernels.gemm.blockscale import BLOCK
from translator_kernels.gemm.fp8 import quantize_fp8_blocks, unshuffle_weight_fp8
from translator_kernels.gemm.fp8_block import HF_FP8, prepare_weight, ref_fp8_block_linear
from translator_kernels.gemm.fp8_static import prepare_static_weight, ref_fp8_static_linear

from ..graph import arg, dtype_of, shape_of
from ..registry import NO_MATCH, Match, OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch

HF_FP8_MODULE = "transformers.integrations.finegrained_fp8"


# ---- the captured form: HF's fp8_linear as one op (translator/adapters/hf_quant.py points HF's name at it) ----
@torch.library.custom_op("flydsl_hf::fp8_linear", mutates_args=())
def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor, block_size: list[int],
               bias: Optional[torch.Tensor], activation_scale: Optional[torch.Tensor]) -> torch.Tensor:
    hf = sys.modules.get(HF_FP8_MODULE)
    orig = getattr(hf, "_flydsl_original_fp8_linear", None) or getattr(hf, "fp8_linear", None)
    if orig is not None:  # inside the translator's run HF's name points here: the original was kept aside
        try:
            return orig(x, weight, weight_scale_inv, list(block_size) or None, bias, activation_scale)
        except ImportError:  # the hub kernel is not installed (no GPU build here): its math in torch
            pass
    if activation_scale is not None and (list(block_size) == [BLOCK, BLOCK] or weight_scale_inv.numel() == 1):
        return ref_fp8_static_linear(x, weight, weight_scale_inv, activation_scale, bias)
    if list(block_size) != [BLOCK, BLOCK] or activation_scale is not None:
        raise NotImplementedError(f"flydsl_hf::fp8_linear without transformers' kernel: only 128 x 128 block scales "
                                  f"and static per-tensor ones have a torch reference here (block_size "
                                  f"{list(block_size)}, static: {activation_scale is not None})")
    return ref_fp8_block_linear(x, weight, weight_scale_inv.float(), bias)


@fp8_linear.register_fake
def _(x, weight, weight_scale_inv, block_size, bias, activation_scale):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


# ---- the FlyDSL op ----
@torch.library.custom_op("flydsl::fp8_block_linear", mutates_args=())
def fp8_block_linear(x: torch.Tensor, w: torch.Tensor, n: int, k: int, w_scale: torch.Tensor,
                     bias: Optional[torch.Tensor]) -> torch.Tensor:
    return dispatch("fp8_block_linear", x, w, n, k, w_scale, bias)


@fp8_block_linear.register_fake
def _(x, w, n, k, w_scale, bias):
    return x.new_empty((*x.shape[:-1], n))


def _e4m3fn(w, n, k, s, factor):
    """The e4m3fn weight and its scale back from a prepared one (gfx942's: e4m3fnuz halves, scales x factor)."""
    wq = unshuffle_weight_fp8(w, n, k)
    if wq.dtype != HF_FP8:
        wq, s = (wq.float() * 2).to(HF_FP8), s / factor
    return wq, s


def ref_fp8_block_linear_op(x, w, n, k, w_scale, bias):
    return ref_fp8_block_linear(x, *_e4m3fn(w, n, k, w_scale, 2), bias)  # gfx942: doubled scales (fp8_block.py)


def kernel_fp8_block_linear(x, w, n, k, w_scale, bias):
    from translator_kernels.gemm.fp8_block import fp8_block_linear as run

    return run(x, w, n, k, w_scale, bias=bias)


def _sample(dtype, static=False):
    g = torch.Generator().manual_seed(0)
    wq, s = quantize_fp8_blocks(torch.randn(160, 256, generator=g), HF_FP8, (BLOCK, BLOCK))
    wp, sp = (prepare_static_weight if static else prepare_weight)("gfx942", wq, s)  # the registry tests run gfx942
    return (torch.randn(5, 256, generator=g).to(dtype), wp, 160, 256, sp, *([torch.tensor([0.01])] if static else []),
            torch.randn(160, generator=g))


def _register(name, description, reference, kernel, sample):
    register_family(OpFamily(
        name=name, description=description, reference=reference, kernel=kernel,
        kernel_entry=f"translator_kernels.gemm.{name.replace('_linear', '')}:{name}", sample_inputs=sample,
        tolerance_overrides={torch.float32: (1e-4, 1e-4, "K-length fp32 sums of exact fp8 products in MFMA order")},
    ))


_register("fp8_block_linear", "y = x @ dequant(W)^T + b: x quantized per (token, 128), W fp8 with 128 x 128 block "
          "scales", ref_fp8_block_linear_op, kernel_fp8_block_linear, _sample)


def _hf_fp8_reason(node, ctx):
    """(x, W, scales, block size) of a captured HF fp8 linear both rules can take, or the reason it stays."""
    x, bs = arg(node, "x"), list(arg(node, "block_size") or [])
    w, s = ctx.constant(arg(node, "weight")), ctx.constant(arg(node, "weight_scale_inv"))
    if w is None or s is None:
        return "the fp8 weight or its scales are not parameters (no translate-time preparation)"
    if w.dtype != HF_FP8 or w.dim() != 2:
        return f"weight {w.dtype} {list(w.shape)} is not a 2-D float8_e4m3fn [N, K] (FP4-packed weights are not taken)"
    if not (s.is_floating_point() or s.dtype == torch.float8_e8m0fnu):
        return f"weight_scale_inv has dtype {s.dtype}"
    n, k = w.shape
    if bs == [BLOCK, BLOCK]:
        if k % BLOCK or tuple(s.shape) != (-(-n // BLOCK), k // BLOCK):
            return f"weight_scale_inv {list(s.shape)} is not one scale per 128 x 128 block of W[{n}, {k}] (K % 128)"
    elif bs and bs != [n, k]:
        return f"block_size {bs}: only 128 x 128 block scales or one per tensor are taken"
    elif s.numel() != 1:
        return f"weight_scale_inv {list(s.shape)} is not one value (block_size {bs or None}: per tensor)"
    if dtype_of(x) not in (torch.float32, torch.bfloat16, torch.float16) or shape_of(x)[-1] != k or k % 16:
        return f"the activation ({dtype_of(x)}) is not fp32 / bf16 / fp16 with K={k} last (K % 16 == 0)"
    return x, w, s, bs == [BLOCK, BLOCK]


def hf_fp8_linear_supported(node, ctx):
    if arg(node, "activation_scale") is not None:
        return NO_MATCH  # the static rule below
    r = _hf_fp8_reason(node, ctx)
    if isinstance(r, str):
        return r
    x, w, s, block = r
    if not block:
        return "one weight scale per tensor with dynamic activations is not taken (128 x 128 blocks are; " \
               "activation_scheme='static' is)"
    return Match(x=x, w=w, s=s, bias=arg(node, "bias"))


@rule(Stage.CANONICAL, torch.ops.flydsl_hf.fp8_linear.default, family="fp8_block_linear",
      supported=hf_fp8_linear_supported,
      doc="HF transformers' FP8Linear (FineGrainedFP8Config, 128 x 128 blocks, dynamic activations)")
def lower_hf_fp8_linear(node, ctx, m):
    n, k = m.w.shape
    w_node, s_node = _prepared(ctx, node, m, prepare_weight)
    return ctx.replace(node, "fp8_block_linear", "hf_fp8_block", (m.x, w_node, n, k, s_node, m.bias), [node])


def _prepared(ctx, node, m, prep):
    """Constants for the kernel's weight and weight scale, prep(arch, W, s) of the parameters (rebuilt when they
    change after translation)."""
    wp, sp = (functools.partial(_part, prep, ctx.arch, i) for i in (0, 1))
    return (ctx.add_constant(wp(m.w, m.s), "w8", node, derive=wp, sources=(m.w, m.s)),
            ctx.add_constant(sp(m.w, m.s), "w8scale", node, derive=sp, sources=(m.w, m.s)))


def _part(prep, arch, i, w, s):
    return prep(arch, w, s)[i]



# ---- a static activation scale (activation_scheme="static"): flydsl.fp8_static_linear ----
@torch.library.custom_op("flydsl::fp8_static_linear", mutates_args=())
def fp8_static_linear(x: torch.Tensor, w: torch.Tensor, n: int, k: int, w_scale: torch.Tensor, a_scale: torch.Tensor,
                      bias: Optional[torch.Tensor]) -> torch.Tensor:
    return dispatch("fp8_static_linear", x, w, n, k, w_scale, a_scale, bias)


@fp8_static_linear.register_fake
def _(x, w, n, k, w_scale, a_scale, bias):
    return x.new_empty((*x.shape[:-1], n))


def ref_fp8_static_linear_op(x, w, n, k, w_scale, a_scale, bias):
    return ref_fp8_static_linear(x, *_e4m3fn(w, n, k, w_scale, 4), a_scale, bias)  # gfx942: scales x 4


def kernel_fp8_static_linear(x, w, n, k, w_scale, a_scale, bias):
    from translator_kernels.gemm.fp8_static import fp8_static_linear as run

    return run(x, w, n, k, w_scale, a_scale, bias=bias)


_register("fp8_static_linear", "y = x @ dequant(W)^T + b: x quantized by a fixed activation scale, W fp8 (128 x 128 "
          "blocks or per tensor)", ref_fp8_static_linear_op, kernel_fp8_static_linear,
          functools.partial(_sample, static=True))


def hf_fp8_static_supported(node, ctx):
    act = arg(node, "activation_scale")
    if act is None:
        return NO_MATCH  # the dynamic rule above
    r = _hf_fp8_reason(node, ctx)
    if isinstance(r, str):
        return r
    x, w, s, _ = r
    shape = shape_of(act)
    if shape is None or len([d for d in shape if d != 1]) or dtype_of(act) != torch.float32:
        return f"activation_scale {dtype_of(act)} {list(shape or [])} is not one fp32 value"
    return Match(x=x, w=w, s=s, act=act, bias=arg(node, "bias"))


@rule(Stage.CANONICAL, torch.ops.flydsl_hf.fp8_linear.default, family="fp8_static_linear",
      supported=hf_fp8_static_supported, name="hf_fp8_static",
      doc="HF transformers' FP8Linear with activation_scheme='static' (128 x 128 or per-tensor weight scales)")
def lower_hf_fp8_static(node, ctx, m):
    n, k = m.w.shape
    w_node, s_node = _prepared(ctx, node, m, prepare_static_weight)
    return ctx.replace(node, "fp8_static_linear", "hf_fp8_static", (m.x, w_node, n, k, s_node, m.act, m.bias),
                       [node])

