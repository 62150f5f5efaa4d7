"""Gated MLPs in one GEMM: ``act(x @ Wg.T + bg) * (x @ Wu.T + bu)`` -> `flydsl.gemm_gated`.

Matched (aten, before the canonical linear lowering, so both linears are still visible):

    mul(silu(linear(x, Wg[, bg])), linear(x, Wu[, bu]))          SwiGLU: Llama, Mistral, Qwen
    mul(gelu(linear(x, Wg)), linear(x, Wu)), gelu tanh or erf    GeGLU: Gemma (gelu tanh), T5 v1.1
    (either operand order of the mul; with or without biases)

as HF writes it: ``self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))``. Guards:
both weights are parameters of one [N, K] shape and dtype, the linears read the same `x`, the
activation and each linear have one user (the gate's activation, the mul).

Rewrite: one GEMM over the concatenated weights, its epilogue gating column pairs. The weight
is arranged at translate time (translator_kernels.gemm.gated_weight) so 16 gate rows and the
matching 16 up rows sit next to each other; each wave then holds a gate and an up accumulator
of the same output element in registers, and the epilogue writes act(g) * u: the [M, 2N]
intermediate of two separate GEMMs and the elementwise kernel's reads are gone (x is read once
instead of twice). The down projection stays an ordinary gemm (its residual add fuses there).
Counter: `gated_mlp`.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from translator_kernels.gemm.gated import gated_weight, unarrange_gated

from ..graph import aten, arg, dtype_of, shape_of
from ..registry import NO_MATCH, Match, OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch
from ..state import natural
from .gemm import _gemm_reason, cast_weight

GATES = {aten.silu.default: "silu", aten.silu_.default: "silu"}


@torch.library.custom_op("flydsl::gemm_gated", mutates_args=())
def gemm_gated(a: torch.Tensor, w: torch.Tensor, n: int, k: int, bias: Optional[torch.Tensor], gate: str,
               eps: Optional[float] = None) -> torch.Tensor:
    return dispatch("gemm_gated", a, w, n, k, bias, gate, eps)


@gemm_gated.register_fake
def _(a, w, n, k, bias, gate, eps=None):
    return a.new_empty((*a.shape[:-1], n))


def ref_gemm_gated(a, w, n, k, bias, gate, eps=None):
    from translator_kernels.gemm.kernel import apply_epilogue_torch

    from .gemm import rms_of

    wg, wu, bg, bu = unarrange_gated(w, bias, n, k)  # a lazy prepared w (state.settle): a meta tensor, no data
    nat = natural(w)  # ... and its gate and up weights come from the model's own
    if nat is not None:
        wg, wu = nat
    x = a.float()
    g, u = x @ wg.float().t(), x @ wu.float().t()
    if eps is not None:  # an RMSNorm folded in (norm_gemm.py)
        g, u = g * rms_of(x, eps), u * rms_of(x, eps)
    if bias is not None:
        g, u = g + bg.float(), u + bu.float()
    return (apply_epilogue_torch(g, gate) * u).to(a.dtype)


def kernel_gemm_gated(a, w, n, k, bias, gate, eps=None):
    from translator_kernels.gemm import gemm_gated as run

    return run(a, w, n, k, gate, bias=bias, rms_eps=eps)


register_family(OpFamily(
    name="gemm_gated", description="act(A @ Wg.T + bg) * (A @ Wu.T + bu) in one GEMM (SwiGLU / GeGLU)",
    reference=ref_gemm_gated, kernel=kernel_gemm_gated, kernel_entry="translator_kernels.gemm:gemm_gated",
    sample_inputs=lambda dt: (torch.randn(5, 40).to(dt), gated_weight(torch.randn(24, 40).to(dt),
                                                                      torch.randn(24, 40).to(dt)), 24, 40, None, "silu"),
    tolerance_overrides={torch.float32: (1e-4, 1e-4, "K-length fp32 sums in a different order than BLAS")},
))


def _gate_name(node) -> str | None:
    if node.op != "call_function":
        return None
    if node.target in GATES:
        return GATES[node.target]
    if node.target is aten.gelu.default:
        return "gelu_tanh" if arg(node, "approximate", "none") == "tanh" else "gelu"
    return None


def param_linear(node, ctx):
    """(x, W, bias node) of an aten.linear with a 2-D parameter weight, else None."""
    if node.op != "call_function" or node.target is not aten.linear.default:
        return None
    w = ctx.constant(arg(node, "weight"))
    if w is None or w.dim() != 2:
        return None
    return arg(node, "input"), w, arg(node, "bias")


def _linear(node, ctx):
    """param_linear of a single-user aten.linear, else None."""
    return param_linear(node, ctx) if len(node.users) == 1 else None


def gate_pairs(node):
    """(gate name, act node, the other operand) for each operand order of mul `node` whose one operand is a
    gate activation (read only by the mul) of a node."""
    pair = (arg(node, "self"), arg(node, "other"))
    if node.kwargs or not all(isinstance(a, torch.fx.Node) for a in pair):
        return
    for act, up in (pair, pair[::-1]):
        gate = _gate_name(act)
        if gate is not None and len(act.users) == 1 and isinstance(arg(act, "self"), torch.fx.Node):
            yield gate, act, up


def _match(node, ctx):
    """(gate name, act node, gate linear, up linear) of a gated MLP rooted at mul `node`, else None."""
    for gate, act, up in gate_pairs(node):
        g, u = _linear(arg(act, "self"), ctx), _linear(up, ctx)
        if g is None or u is None or g[0] is not u[0] or (g[2] is None) != (u[2] is None):
            continue
        return gate, act, arg(act, "self"), up
    return None


def gated_mlp_supported(node, ctx):
    if ctx.precision == "fp8":  # fp8: the fp8 gated GEMM (lowerings.gated_fp8)
        return NO_MATCH
    return gated_match(node, ctx)


def gated_match(node, ctx):
    """The gated MLP rooted at mul `node` (a Match), a reason, or NO_MATCH (any precision)."""
    m = _match(node, ctx)
    if m is None:
        return NO_MATCH
    _, _, gl, ul = m
    x, wg, bg = _linear(gl, ctx)
    _, wu, bu = _linear(ul, ctx)
    if wg.shape != wu.shape or wg.dtype != wu.dtype:
        return f"gate and up weights differ ({tuple(wg.shape)} {wg.dtype} vs {tuple(wu.shape)} {wu.dtype})"
    for b in (bg, bu):
        if b is not None and (ctx.constant(b) is None or tuple(ctx.constant(b).shape) != (wg.shape[0],)):
            return "gate / up bias is not an [N] parameter"
    if [str(s) for s in shape_of(node) or ()] != [str(s) for s in shape_of(gl) or ()]:
        return "the product broadcasts (its shape is not the linears' shape)"
    return _gemm_reason(x, wg) or Match(gate=m[0], act=m[1], gl=gl, ul=ul, x=x, wg=wg, bg=bg, wu=wu, bu=bu)


def _arranged(dtype, wg, wu):
    return gated_weight(cast_weight(dtype, wg), cast_weight(dtype, wu))


def _natural(dtype, wg, wu):
    return cast_weight(dtype, wg), cast_weight(dtype, wu)


def _arranged_bias(bg, bu):
    return gated_weight(bg.detach().float(), bu.detach().float())


@rule(Stage.PATTERN, aten.mul.Tensor, family="gemm_gated", supported=gated_mlp_supported,
      doc="act(linear(x, Wg)) * linear(x, Wu) (SwiGLU / GeGLU) -> one gated GEMM")
def lower_gated_mlp(node, ctx, m):
    gate, act, gl, ul, x, wg, bg, wu, bu = m.gate, m.act, m.gl, m.ul, m.x, m.wg, m.bg, m.wu, m.bu
    n, k = wg.shape
    dt = None if ctx.precision == "fp32" else ctx.compute_dtype
    prep = functools.partial(_arranged, dt)
    bias = None
    if bg is not None:  # both rebuilt when a parameter changes after translation (state.prepared)
        cb, cu = ctx.constant(bg), ctx.constant(bu)
        bias = ctx.add_constant(_arranged_bias(cb, cu), "gated_b", node, derive=_arranged_bias, sources=(cb, cu))
    w_node = ctx.add_constant(None, "gated_w", node, derive=prep, sources=(wg, wu),  # made after the passes where
                              natural=functools.partial(_natural, dt))  # needed (state.settle)
    xin = ctx.cast_in(x, node)
    return ctx.replace(node, "gemm_gated", "gated_mlp", (xin, w_node, n, k, bias, gate), [node, act, gl, ul],
                       out_dtype=dtype_of(node))

