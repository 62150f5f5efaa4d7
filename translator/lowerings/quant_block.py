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

Stays in PyTorch (HF's own fp8_linear runs), with the reason: a block size other than 128 x 128 or none
(per-tensor scales), a static activation scale (`activation_scheme="static"`), FP4-packed weights, K not a
multiple of 128, an activation that is not fp32 / bf16 / fp16.
"""

from __future__ import annotations

import functools
import sys
from typing import Optional

import torch

from translator_kernels.gemm.blockscale import BLOCK
from translator_kernels.gemm.fp8 import quantize_fp8_blocks, unshuffle_weight_fp8
from translator_kernels.gemm.fp8_block import HF_FP8, prepare_weight, ref_fp8_block_linear

from ..graph import arg, dtype_of, shape_of
from ..registry import Match, OpFamily, Stage, register_family, rule
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
    if list(block_size) != [128, 128] or activation_scale is not None:
        raise NotImplementedError(f"flydsl_hf::fp8_linear without transformers' kernel: only dynamic 128 x 128 "
                                  f"block scales have a torch reference here (block_size {list(block_size)})")
    from translator_kernels.gemm.fp8_block import ref_fp8_block_linear

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


def ref_fp8_block_linear_op(x, w, n, k, w_scale, bias):
    wq, s = unshuffle_weight_fp8(w, n, k), w_scale
    if wq.dtype != HF_FP8:  # gfx942's prepared weight: e4m3fnuz halves, doubled scales (fp8_block.py)
        wq, s = (wq.float() * 2).to(HF_FP8), s / 2
    return ref_fp8_block_linear(x, wq, s, bias)


def kernel_fp8_block_linear(x, w, n, k, w_scale, bias):
    from translator_kernels.gemm.fp8_block import fp8_block_linear as run

    return run(x, w, n, k, w_scale, bias=bias)


def _sample(dtype):
    g = torch.Generator().manual_seed(0)
    wq, s = quantize_fp8_blocks(torch.randn(160, 256, generator=g), HF_FP8, (BLOCK, BLOCK))
    wp, sp = prepare_weight("gfx942", wq, s)  # the registry tests run gfx942
    return (torch.randn(5, 256, generator=g).to(dtype), wp, 160, 256, sp, torch.randn(160, generator=g))


register_family(OpFamily(
    name="fp8_block_linear",
    description="y = x @ dequant(W)^T + b: x quantized per (token, 128), W fp8 with 128 x 128 block scales",
    reference=ref_fp8_block_linear_op, kernel=kernel_fp8_block_linear,
    kernel_entry="translator_kernels.gemm.fp8_block:fp8_block_linear", sample_inputs=_sample,
    tolerance_overrides={torch.float32: (1e-4, 1e-4, "K-length fp32 sums of exact fp8 products in MFMA order")},
))


def hf_fp8_linear_supported(node, ctx):
    x, bs, act = arg(node, "x"), list(arg(node, "block_size") or []), arg(node, "activation_scale")
    w, s = ctx.constant(arg(node, "weight")), ctx.constant(arg(node, "weight_scale_inv"))
    if w is None or s is None:
        return "the fp8 weight or its scales are not parameters (no translate-time preparation)"
    if w.dtype != HF_FP8 or w.dim() != 2:
        return f"weight {w.dtype} {list(w.shape)} is not a 2-D float8_e4m3fn [N, K] (FP4-packed weights are not taken)"
    if bs != [BLOCK, BLOCK]:
        return f"block_size {bs or None}: only 128 x 128 block scales are taken (per-tensor: torch._scaled_mm's form)"
    if act is not None:
        return "activation_scheme='static' (one activation scale per tensor) is not taken; 'dynamic' is"
    n, k = w.shape
    if k % BLOCK:
        return f"K={k} is not a multiple of {BLOCK}"
    if tuple(s.shape) != (-(-n // BLOCK), k // BLOCK) or not (s.is_floating_point() or s.dtype == torch.float8_e8m0fnu):
        return f"weight_scale_inv {s.dtype} {list(s.shape)} is not one scale per 128 x 128 block of W[{n}, {k}]"
    if dtype_of(x) not in (torch.float32, torch.bfloat16, torch.float16) or shape_of(x)[-1] != k:
        return f"the activation ({dtype_of(x)}) is not fp32 / bf16 / fp16 with K={k} last"
    return Match(x=x, w=w, s=s, bias=arg(node, "bias"))


@rule(Stage.CANONICAL, torch.ops.flydsl_hf.fp8_linear.default, family="fp8_block_linear",
      supported=hf_fp8_linear_supported,
      doc="HF transformers' FP8Linear (FineGrainedFP8Config, 128 x 128 blocks, dynamic activations)")
def lower_hf_fp8_linear(node, ctx, m):
    n, k = m.w.shape
    wp = functools.partial(_weight, ctx.arch)
    sp = functools.partial(_scale, ctx.arch)
    w_node = ctx.add_constant(wp(m.w, m.s), "w8", node, derive=wp, sources=(m.w, m.s))
    s_node = ctx.add_constant(sp(m.w, m.s), "w8scale", node, derive=sp, sources=(m.w, m.s))
    return ctx.replace(node, "fp8_block_linear", "hf_fp8_block", (m.x, w_node, n, k, s_node, m.bias), [node])


def _weight(arch, w, s):
    return prepare_weight(arch, w, s)[0]


def _scale(arch, w, s):
    return prepare_weight(arch, w, s)[1]
