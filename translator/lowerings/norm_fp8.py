"""A norm that feeds an fp8 GEMM writes the GEMM's fp8 input itself: `flydsl.norm_fp8` / `flydsl.add_norm_fp8`.

Under precision="fp8" (and the torchao-style dynamic form, fp8_mode.py) every fp8 linear reads
``q, s = flydsl.quantize_fp8(x)``: per token, s = amax|x| / FMAX, q = fp8(x / s). In a pre-norm
transformer x is a norm's output::

    h = self.input_layernorm(x)            # flydsl.rms_norm / layer_norm (or add_*_norm: r + attn)
    q = self.q_proj(h); k = ...; v = ...   # one quantize_fp8(h) shared by the three fp8 GEMMs

A CONSUMER rule on quantize_fp8 folds it into that norm: the norm kernel keeps its normalized row
in registers and writes (q, s) instead of h (translator_kernels.rows.norm, ``quant=``): one launch
where there were two, and h never goes to memory. Between the two there may be the precision
policy's round trip of h (an fp32 model under precision="fp8": the bf16 norm output cast to the
model's fp32 and back to bf16 for the GEMM), an elementwise region of exact casts only, which
goes too. The sum of ``add_*_norm`` (the residual stream) stays an output.

Stays as it was (standalone quantize): the norm's output also read by something else (a bf16 op, the
LM head), a norm over several trailing dims (its rows are not the quantize's), GroupNorm. An
elementwise producer (Llama's ``silu(gate) * up`` before down_proj) and a GEMM epilogue do not
write fp8 yet (docs/fp8.md).
"""

from __future__ import annotations

import json
import operator
from typing import List, Optional, Tuple

import torch
from torch.fx import Node

from translator_kernels.arch import FLOAT_NAMES

from ..graph import arg, dtype_of, getitem_of, is_call, users
from ..registry import NO_MATCH, Match, OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch
from . import elementwise, fp8_mode, norm  # noqa: F401  (register the ops read here)

Q = torch.ops.flydsl.quantize_fp8.default
FE = torch.ops.flydsl.fused_elementwise.default
NORMS = {torch.ops.flydsl.rms_norm.default: ("rms", False), torch.ops.flydsl.layer_norm.default: ("layer", False),
         torch.ops.flydsl.add_rms_norm.default: ("rms", True), torch.ops.flydsl.add_layer_norm.default: ("layer", True)}


@torch.library.custom_op("flydsl::norm_fp8", mutates_args=())
def norm_fp8(x: torch.Tensor, kind: str, normalized_shape: List[int], weight: Optional[torch.Tensor],
             bias: Optional[torch.Tensor], eps: float, fmt: str) -> Tuple[torch.Tensor, torch.Tensor]:
    return dispatch("norm_fp8", x, kind, normalized_shape, weight, bias, eps, fmt)


@norm_fp8.register_fake
def _(x, kind, normalized_shape, weight, bias, eps, fmt):
    return x.new_empty(x.shape, dtype=getattr(torch, fmt)), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


@torch.library.custom_op("flydsl::add_norm_fp8", mutates_args=())
def add_norm_fp8(x: torch.Tensor, residual: torch.Tensor, kind: str, normalized_shape: List[int],
                 weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float,
                 fmt: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return dispatch("add_norm_fp8", x, residual, kind, normalized_shape, weight, bias, eps, fmt)


@add_norm_fp8.register_fake
def _(x, residual, kind, normalized_shape, weight, bias, eps, fmt):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty(x.shape, dtype=getattr(torch, fmt)), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32))


def _ref_norm(x, kind, shape, w, b, eps):
    return norm.ref_layer_norm(x, shape, w, b, eps) if kind == "layer" else norm.ref_rms_norm(x, shape, w, eps)


def ref_norm_fp8(x, kind, normalized_shape, weight, bias, eps, fmt):
    return fp8_mode.ref_quantize_fp8(_ref_norm(x, kind, normalized_shape, weight, bias, eps), fmt)


def ref_add_norm_fp8(x, residual, kind, normalized_shape, weight, bias, eps, fmt):
    s = (x + residual).contiguous()
    return (s, *ref_norm_fp8(s, kind, normalized_shape, weight, bias, eps, fmt))


def _kernel(x, residual, kind, normalized_shape, weight, bias, eps, fmt):
    from translator_kernels import launch as kl
    from translator_kernels.gemm.fp8 import fp8_format
    from translator_kernels.rows import norm as rows

    n = normalized_shape[-1]
    f = fp8_format(getattr(torch, fmt), kl.arch())
    w = weight.reshape(n) if weight is not None else None
    b = bias.reshape(n) if bias is not None else None
    if residual is None:
        q, s = rows.norm_fp8(x.reshape(-1, n), kind, w, b, eps, f)
        total = None
    else:
        total, q, s = rows.add_norm_fp8(x.reshape(-1, n), residual.reshape(-1, n), kind, w, b, eps, f)
    q, s = q.reshape(x.shape), s.reshape(*x.shape[:-1], 1)
    return (q, s) if total is None else (total.reshape(x.shape), q, s)


def kernel_norm_fp8(x, kind, normalized_shape, weight, bias, eps, fmt):
    return _kernel(x, None, kind, normalized_shape, weight, bias, eps, fmt)


def kernel_add_norm_fp8(x, residual, kind, normalized_shape, weight, bias, eps, fmt):
    return _kernel(x, residual, kind, normalized_shape, weight, bias, eps, fmt)


_TOL = {torch.float32: (1e-4, 1e-4, "its values feed gemm_fp8, whose fp32 sums run in MFMA order")}
register_family(OpFamily(
    name="norm_fp8", description="RMSNorm / LayerNorm writing per-token fp8 (q, s): the fp8 GEMM's input, one launch",
    reference=ref_norm_fp8, kernel=kernel_norm_fp8, kernel_entry="translator_kernels.rows.norm:norm_fp8",
    sample_inputs=lambda dt: (torch.randn(6, 48).to(dt), "rms", [48], torch.randn(48).to(dt), None, 1e-6,
                              "float8_e4m3fnuz"),
    tolerance_overrides=_TOL,
))
register_family(OpFamily(
    name="add_norm_fp8", description="(x + r, per-token fp8 of norm(x + r)) in one pass",
    reference=ref_add_norm_fp8, kernel=kernel_add_norm_fp8, kernel_entry="translator_kernels.rows.norm:add_norm_fp8",
    sample_inputs=lambda dt: (torch.randn(6, 48).to(dt), torch.randn(6, 48).to(dt), "layer", [48],
                              torch.randn(48).to(dt), torch.randn(48).to(dt), 1e-5, "float8_e4m3fnuz"),
    tolerance_overrides=_TOL,
))


def _exact_casts(region: Node) -> Node | None:
    """The input of an elementwise region that is only exact casts back to its input's dtype (bf16 -> f32
    -> bf16), else None."""
    inputs, program = region.args
    try:
        prog = json.loads(program)
    except (TypeError, ValueError):
        return None
    if len(inputs) != 1 or prog.get("n") != 1 or len(prog.get("out", ())) != 1:
        return None
    src = FLOAT_NAMES.get(dtype_of(inputs[0]))
    for i, op in enumerate(prog["ops"]):
        if op[0] != "cast" or list(op[1]) != [i] or op[2][0] not in (src, "f32"):
            return None
    return inputs[0] if src and prog["out"][0] == [len(prog["ops"]), src] else None


def _producer(x: Node):
    """(norm node, its output x reads, the region of exact casts in between or []) or None."""
    chain = []
    g = getitem_of(x)
    if g and is_call(g[0], FE) and users(x) and len(users(g[0])) == 1:
        src = _exact_casts(g[0])
        if src is None:
            return None
        chain, x = [x, g[0]], src
    g = getitem_of(x)
    if g and g[0].target in NORMS and NORMS[g[0].target][1] and g[1] == 1:
        return g[0], x, chain
    if isinstance(x, Node) and x.target in NORMS and not NORMS[x.target][1]:
        return x, x, chain
    return None


def norm_quantize_supported(node, ctx):
    p = _producer(arg(node, "x"))
    if p is None:
        return NO_MATCH
    nrm, out, chain = p
    path = chain + [node]
    # not taken (the quantize stays its own kernel, which is no fallback: NO_MATCH, not a reason): the norm's
    # output also read elsewhere, a norm over several trailing dims (its rows are not the quantize's)
    if any(u not in path for n in [out, *chain] for u in users(n)) or len(arg(nrm, "normalized_shape")) != 1 \
            or ctx.denied([nrm]):
        return NO_MATCH
    return Match(norm=nrm, out=out, chain=chain)


@rule(Stage.CONSUMER, Q, family="norm_fp8", supported=norm_quantize_supported, name="norm_fp8", priority=1,
      doc="quantize_fp8(rms_norm / layer_norm(x)) -> the norm writes fp8 + per-token scale (one launch)")
def lower_norm_quantize(node, ctx, m):
    nrm, (kind, add) = m.norm, NORMS[m.norm.target]
    a = {p.name: arg(nrm, p.name) for p in nrm.target._schema.arguments}
    tail = (kind, a["normalized_shape"], a["weight"], a.get("bias"), a["eps"], arg(node, "fmt"))
    info = nrm.meta["flydsl"]
    if add:
        sum_get = next((u for u in users(nrm) if getitem_of(u)[1] == 0), None)
        anchors = (sum_get.meta["flydsl"]["anchor"],) if sum_get is not None and "flydsl" in sum_get.meta else ()
        new, outs = ctx.emit("add_norm_fp8", (a["x"], a["residual"], *tail), lowering="add_norm_fp8", sources=[],
                             anchor=info["anchor"], before=nrm, output_anchors=anchors)
        if sum_get is not None:
            sum_get.replace_all_uses_with(outs[0])
        outs = outs[1:]
    else:
        new, outs = ctx.emit("norm_fp8", (a["x"], *tail), lowering="norm_fp8", sources=[], anchor=info["anchor"],
                             before=nrm)
    ctx.absorb(new, [nrm, *(n for n in m.chain if "flydsl" in n.meta and n.target is not operator.getitem), node])
    for u in list(users(node)):
        u.replace_all_uses_with(outs[getitem_of(u)[1]])
    ctx.erase_unused([*users(node), node, *m.chain, *[u for u in users(nrm)], nrm])
    return new

