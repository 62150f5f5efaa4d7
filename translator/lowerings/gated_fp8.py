"""precision="fp8": a gated MLP's gate and up projections in one fp8 GEMM -> `flydsl.gemm_fp8_gated`.

The gated-MLP pattern of gated_mlp.py (``act(gate_proj(x)) * up_proj(x)``, SwiGLU / GeGLU, either order, with or
without biases), matched the same way, under precision="fp8"::

    h = F.silu(self.gate_proj(x)) * self.up_proj(x)      # Llama / Mistral / Qwen MLP
 -> q, s = flydsl.quantize_fp8(x)                        # usually written by the norm before it (norm_fp8.py)
    h = flydsl.gemm_fp8_gated(q, W8, n, k, s, sw8, bias, "silu", "bf16")

W8 is gate and up each quantized once per output channel (e4m3 of the arch, as fp8_mode's linears) and arranged
for the gated epilogue (translator_kernels.gemm.fp8_gated: 16 gate rows beside the 16 up rows of the same
columns), sw8 their per-channel scales arranged the same way; the kernel's epilogue scales each accumulator by
its column's weight scale and the row's token scale, then writes act(g) * u in bf16. Against the two fp8 GEMMs
and the silu * up quantize kernel of before: one launch fewer, and g and u ([M, 2N] bf16) never go to memory;
the numbers differ from that path only where g and u were rounded to bf16 before the product (here they stay
fp32). down_proj reads h through its own quantize (a GEMM epilogue cannot see the row's |max| across its N tiles).

Not taken (the linears then go to fp8_mode's rule one by one, and the product to the elementwise kernel): either
linear kept bf16 by fp8_mode's rule (KEEP_BF16, K % 16), whatever gated_mlp.gated_match refuses (its reason), and
everything when the user sets ``translator.lowerings.gated_fp8.GATED = False``.
Counter: ``gated_mlp_fp8``.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from translator_kernels.gemm.fp8 import fp8_dtype, quantize_fp8
from translator_kernels.gemm.fp8_gated import (gated_scale, gated_weight_fp8, ref_gemm_fp8_gated,
                                               unarrange_gated_fp8)

from ..graph import aten, arg, dtype_of
from ..registry import NO_MATCH, Match, OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch
from .fp8_mode import keep_bf16_reason, quantized_input
from .gated_mlp import _arranged_bias, gated_match
from .quant import _OUT


@torch.library.custom_op("flydsl::gemm_fp8_gated", mutates_args=())
def gemm_fp8_gated(a: torch.Tensor, w: torch.Tensor, n: int, k: int, a_scale: Optional[torch.Tensor],
                   w_scale: Optional[torch.Tensor], bias: Optional[torch.Tensor], gate: str,
                   out_dtype: str) -> torch.Tensor:
    return dispatch("gemm_fp8_gated", a, w, n, k, a_scale, w_scale, bias, gate, out_dtype)


@gemm_fp8_gated.register_fake
def _(a, w, n, k, a_scale, w_scale, bias, gate, out_dtype):
    return a.new_empty((*a.shape[:-1], n), dtype=_OUT[out_dtype])


def ref_gemm_fp8_gated_op(a, w, n, k, a_scale, w_scale, bias, gate, out_dtype):
    wg, wu, sg, su = unarrange_gated_fp8(w, w_scale, n, k)
    bg = bu = None
    if bias is not None:
        _, _, bg, bu = unarrange_gated_fp8(w, bias, n, k)
    sa = None if a_scale is None else a_scale.reshape(-1)
    return ref_gemm_fp8_gated(a, wg, wu, gate, sa, sg, su, bg=bg, bu=bu, out_dtype=_OUT[out_dtype])


def kernel_gemm_fp8_gated(a, w, n, k, a_scale, w_scale, bias, gate, out_dtype):
    from translator_kernels.gemm.fp8_gated import gemm_fp8_gated as run

    return run(a, w, n, k, gate, a_scale=None if a_scale is None else a_scale.reshape(-1), w_scale=w_scale,
               bias=bias, out_dtype=_OUT[out_dtype])


def _sample(dtype):
    g = torch.Generator().manual_seed(0)
    dt = fp8_dtype("gfx942")  # the registry tests run gfx942
    aq, sa = quantize_fp8(torch.randn(5, 48, generator=g), dt, dim=-1)
    (wg, sg), (wu, su) = (quantize_fp8(torch.randn(24, 48, generator=g), dt, dim=-1) for _ in range(2))
    bias = _arranged_bias(torch.randn(24, generator=g), torch.randn(24, generator=g))
    return aq, gated_weight_fp8(wg, wu), 24, 48, sa, gated_scale(sg, su, 24), bias, "silu", "bf16"


register_family(OpFamily(
    name="gemm_fp8_gated", description="act(sa * sg * (A_q @ Wg_q.T) + bg) * (sa * su * (A_q @ Wu_q.T) + bu): the "
                                       "gated MLP in one fp8 GEMM",
    reference=ref_gemm_fp8_gated_op, kernel=kernel_gemm_fp8_gated,
    kernel_entry="translator_kernels.gemm.fp8_gated:gemm_fp8_gated", sample_inputs=_sample,
    tolerance_overrides={torch.float32: (1e-2, 1e-2, "precision='fp8' writes act(g) * u in bf16 (one rounding of "
                                                     "the fp32 value, 2^-8 relative)")},
))


GATED = True  # False: gate and up run as two fp8 linears and silu(g) * u joins down_proj's quantize (the path before)


def gated_fp8_supported(node, ctx):
    if ctx.precision != "fp8" or not GATED:
        return NO_MATCH
    m = gated_match(node, ctx)
    if not isinstance(m, Match):
        return m
    k = m.wg.shape[1]
    if any(keep_bf16_reason(lin, arg(lin, "weight"), k) for lin in (m.gl, m.ul)):
        return NO_MATCH  # fp8_mode's linear rule keeps each bf16 and says why
    return m


def _gated_w8(arch, wg, wu):
    dt = fp8_dtype(arch)
    return gated_weight_fp8(quantize_fp8(wg.detach(), dt, dim=-1)[0], quantize_fp8(wu.detach(), dt, dim=-1)[0])


def _gated_w8_scale(arch, wg, wu):
    dt = fp8_dtype(arch)
    return gated_scale(quantize_fp8(wg.detach(), dt, dim=-1)[1], quantize_fp8(wu.detach(), dt, dim=-1)[1],
                       wg.shape[0])


@rule(Stage.PATTERN, aten.mul.Tensor, family="gemm_fp8_gated", supported=gated_fp8_supported, name="gated_mlp_fp8",
      doc="precision='fp8': act(linear(x, Wg)) * linear(x, Wu) -> per-token quantize + one fp8 gated GEMM")
def lower_gated_fp8(node, ctx, m):
    n, k = m.wg.shape
    wq, ws = functools.partial(_gated_w8, ctx.arch), functools.partial(_gated_w8_scale, ctx.arch)
    w_node = ctx.add_constant(wq(m.wg, m.wu), "gated_w8", node, derive=wq, sources=(m.wg, m.wu))
    s_node = ctx.add_constant(ws(m.wg, m.wu), "gated_w8scale", node, derive=ws, sources=(m.wg, m.wu))
    bias = None
    if m.bg is not None:  # rebuilt when a parameter changes after translation (state.prepared)
        cb, cu = ctx.constant(m.bg), ctx.constant(m.bu)
        bias = ctx.add_constant(_arranged_bias(cb, cu), "gated_b", node, derive=_arranged_bias, sources=(cb, cu))
    q, s = quantized_input(ctx, m.x, node)
    return ctx.replace(node, "gemm_fp8_gated", "gated_mlp_fp8", (q, w_node, n, k, s, s_node, bias, m.gate, "bf16"),
                       [node, m.act, m.gl, m.ul], out_dtype=dtype_of(node))
