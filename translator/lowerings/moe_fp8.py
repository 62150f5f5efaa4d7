"""precision="fp8": MoE experts -> `flydsl.moe_experts_fp8` (translator_kernels.moe.grouped_fp8).

The experts moe.py and moe_loops.py match (HF's grouped-mm form, the hand-written loop, dense dispatch) become,
under precision="fp8", the fp8 form of `moe_experts`: the same align / gather / un-permute, each gathered row
quantized per token (the quantize kernel), the gated grouped GEMM and the down grouped GEMM with fp8 operands and
per-expert column scales in the epilogue, the gated GEMM's output quantized per token again before the down GEMM.

Weights: every expert's gate, up and down rows quantized once at translate time per output channel to the arch's
e4m3 (fnuz on gfx942, OCP on gfx950), as fp8_mode quantizes a linear; arranged and stacked by
grouped_fp8.prepare_experts_fp8 (four constants: W13, S13, W2, S2), rebuilt when a parameter changes.

gpt-oss's experts (moe_gpt_oss.py) take the same path with their extras: the interleaved columns de-interleaved
before quantization, the fp32 biases added after the scales in both grouped GEMMs, the clamped SwiGLU's up program in
the gated epilogue (`emit_gpt_oss_fp8`, counter ``moe_experts_fp8_gpt_oss``).

Kept bf16 (the experts then run as under precision="bf16"; counter ``moe_experts_fp8_kept_bf16``, the reason in
gm.meta["fp8_kept_bf16"] beside fp8_mode's linears): H or I not a multiple of 16 (16-byte fp8 rows).
Counter: ``moe_experts_fp8`` (``moe_experts_fp8_loop`` / ``_dense`` for moe_loops' forms).
"""

from __future__ import annotations

from typing import Optional

import torch

from translator_kernels.moe import grouped_fp8 as K8
from translator_kernels.moe import ref_topk_gating

from ..graph import captured_name
from ..registry import OpFamily, register_family
from ..runtime.ops import dispatch


@torch.library.custom_op("flydsl::moe_experts_fp8", mutates_args=())
def moe_experts_fp8(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor,
                    w2: torch.Tensor, s2: torch.Tensor, inter: int, gate: str, residual: Optional[torch.Tensor],
                    first_expert: int, up: Optional[str] = None, b13: Optional[torch.Tensor] = None,
                    b2: Optional[torch.Tensor] = None) -> torch.Tensor:
    return dispatch("moe_experts_fp8", x, weights, ids, w13, s13, w2, s2, inter, gate, residual, first_expert, up, b13,
                    b2)


@moe_experts_fp8.register_fake
def _(x, weights, ids, w13, s13, w2, s2, inter, gate, residual, first_expert, up=None, b13=None, b2=None):
    return x.new_empty(x.shape)


def _rows(x, weights, ids, residual):
    """[..., H] / [..., k] as [T, H] / [T, k]."""
    h, k = x.shape[-1], ids.shape[-1]
    return (x.reshape(-1, h), weights.reshape(-1, k), ids.reshape(-1, k),
            None if residual is None else residual.reshape(-1, h))


def ref_moe_experts_fp8_op(x, weights, ids, w13, s13, w2, s2, inter, gate, residual, first_expert, up=None, b13=None,
                           b2=None):
    x2, w, i, r = _rows(x, weights, ids, residual)
    return K8.ref_moe_experts_fp8(x2, w, i, w13, s13, w2, s2, inter, gate, r, out_dtype=x.dtype,
                                  first_expert=first_expert, up=up, b13=b13, b2=b2).reshape(x.shape)


def kernel_moe_experts_fp8(x, weights, ids, w13, s13, w2, s2, inter, gate, residual, first_expert, up=None, b13=None,
                           b2=None):
    x2, w, i, r = _rows(x, weights, ids, residual)
    return K8.moe_experts_fp8(x2, w, i, w13, s13, w2, s2, inter, gate, residual=r, out_dtype=x.dtype,
                              first_expert=first_expert, up=up, b13=b13, b2=b2).reshape(x.shape)


def _sample(dt):
    g = torch.Generator().manual_seed(0)
    e, h, i, t = 4, 32, 48, 5
    w, ids = ref_topk_gating(torch.randn(t, e, generator=g), 2)
    prepared = K8.prepare_experts_fp8(torch.randn(e, 2 * i, h, generator=g) / 8, torch.randn(e, h, i, generator=g) / 8,
                                      "gfx942")  # the registry tests run gfx942
    return (torch.randn(t, h, generator=g).to(dt), w, ids, *prepared, i, "silu", None, 0)


register_family(OpFamily(
    name="moe_experts_fp8", description="MoE experts in fp8: permute, per-token quantize, gated fp8 grouped GEMM, "
                                        "quantize, fp8 grouped GEMM, weighted un-permute",
    reference=ref_moe_experts_fp8_op, kernel=kernel_moe_experts_fp8,
    kernel_entry="translator_kernels.moe.grouped_fp8:moe_experts_fp8", sample_inputs=_sample,
    tolerance_overrides={dt: (6e-2, 5e-2, "the hidden activation is quantized per token to e4m3 (a step is 2^-4 of "
                                          "a value) before the down GEMM sums I of them: 1.5 % RMS and 0.047 at most "
                                          "on tests/unit/test_registry.py's oracle, whose outputs reach 3.5")
                         for dt in (torch.float32, torch.bfloat16)},
))


def keep_bf16_reason(h: int, i: int) -> str | None:
    """Why E experts of H -> I -> H stay bf16 under precision="fp8", or None."""
    if h % 16 or i % 16:
        return f"H={h} / I={i} not multiples of 16 (16-byte rows of fp8)"
    return None


def given(p):
    """The stack of a parameter that is the stacked weight already (HF's gate_up_proj / down_proj)."""
    return p


def _kept_bf16(ctx, at, h, inter) -> bool:
    """Whether experts of H -> I -> H before node `at` stay bf16 (then the reason is recorded)."""
    why = keep_bf16_reason(h, inter)
    if why is not None:
        ctx.count("moe_experts_fp8_kept_bf16")
        ctx.gm.meta.setdefault("fp8_kept_bf16", {})[captured_name(at)] = why
    return why is not None


def emit_experts_fp8(ctx, at, x, weights, ids, gate_up, down, inter, gate, first, lowering, seen):
    """The fp8 experts before node `at`, or None where they stay bf16 (the reason recorded). gate_up / down:
    (stack, parameters): stack(*parameters) is HF's [E, 2I, H] / [E, H, I] (moe_loops stacks per-expert linears)."""
    (stack_gu, gu), (stack_dn, dn) = gate_up, down
    if _kept_bf16(ctx, at, stack_dn(*dn).shape[1], inter):
        return None
    arch, n = ctx.arch, len(gu)

    def part(j):
        return lambda *p: K8.prepare_experts_fp8(stack_gu(*p[:n]), stack_dn(*p[n:]), arch)[j]

    prepared = K8.prepare_experts_fp8(stack_gu(*gu), stack_dn(*dn), arch)
    consts = [ctx.add_constant(t, name, at, derive=part(j), sources=(*gu, *dn))
              for j, (t, name) in enumerate(zip(prepared, ("moe_w13_8", "moe_s13", "moe_w2_8", "moe_s2")))]
    return ctx.emit("moe_experts_fp8", (ctx.cast_in(x, at), weights, ids, *consts, inter, gate, None, first),
                    lowering=lowering, sources=seen, anchor=at, before=at)


def emit_gpt_oss_fp8(ctx, at, x, weights, ids, params, inter, gate, up, seen):
    """gpt-oss's experts (moe_gpt_oss.py) in fp8 before node `at`, or None where they stay bf16. params: HF's
    gate_up_proj [E, H, 2I], its bias, down_proj [E, I, H], its bias (grouped_fp8.prepare_gpt_oss_experts_fp8)."""
    if _kept_bf16(ctx, at, params[2].shape[2], inter):
        return None
    arch = ctx.arch

    def part(j):
        return lambda *p: K8.prepare_gpt_oss_experts_fp8(*p, arch)[j]

    names = ("moe_w13_8", "moe_s13", "moe_w2_8", "moe_s2", "moe_b13", "moe_b2")
    w13, s13, w2, s2, b13, b2 = (ctx.add_constant(t, name, at, derive=part(j), sources=params) for j, (t, name) in
                                 enumerate(zip(K8.prepare_gpt_oss_experts_fp8(*params, arch), names)))
    return ctx.emit("moe_experts_fp8", (ctx.cast_in(x, at), weights, ids, w13, s13, w2, s2, inter, gate, None, 0, up,
                                        b13, b2), lowering="moe_experts_fp8_gpt_oss", sources=seen, anchor=at, before=at)
