"""Dynamic per-token fp8 linears: `flydsl.quantize_fp8` + `flydsl.gemm_fp8`, and precision="fp8".

`flydsl.quantize_fp8(x, fmt)` -> (q, s): per-row quantization of an activation (translator_kernels.gemm.
quantize: one launch, q[..., K] in fmt = a torch float8 dtype name, s[..., 1] fp32), bit-exact to
``s = clamp(amax(|x|, -1, keepdim) / FMAX, min=1e-12); q = clamp(x / s, -FMAX, FMAX).to(fp8)``.

Forms:
- PATTERN ``scaled_mm_dynamic``: exactly that quantization feeding ``torch._scaled_mm(q, W.t(), s, sw)``
  (torchao-style dynamic rowwise fp8 linears written with these ops; other spellings of the scale
  leave the quantization as traced and only the GEMM is lowered, translator.lowerings.quant)::

      amax = x.abs().amax(-1, keepdim=True).float(); s = (amax / FMAX).clamp(min=1e-12)
      q = (x.float() / s).clamp(-FMAX, FMAX).to(fp8); y = torch._scaled_mm(q, W8.t(), s, sw, ...)
  -> q, s = flydsl.quantize_fp8(x); y = flydsl.gemm_fp8(q, W8_shuffled, n, k, s, sw, ...)

- precision="fp8" (CANONICAL ``linear_fp8``, before the bf16 linear rule): every aten.linear with a
  parameter weight is quantized once at translate time per output channel (e4m3: fnuz on gfx942, OCP
  on gfx950) and runs quantize_fp8 + gemm_fp8 with a bf16 output (the rest of the model runs as under
  precision="bf16"). The rule that keeps a linear in bf16 (counter ``linear_fp8_kept_bf16``):
    * its output is a model output (through views / casts): the LM head or classifier, whose logits
      decide top-1 (KEEP_OUTPUT_LAYERS = False turns this off);
    * its weight's name contains one of KEEP_BF16 (default: "lm_head");
    * its output is an MoE router's logits (read by flydsl.moe_topk, through views / casts): a near tie between
      two experts' scores flips with fp8 rounding and sends the token to another expert (KEEP_ROUTER = False
      turns this off; the router is [E, H], a small share of the layer);
    * K is not a multiple of 16 (16-byte rows of fp8).
  Users override by setting translator.lowerings.fp8_mode.KEEP_BF16 / KEEP_OUTPUT_LAYERS / KEEP_ROUTER before
  translate.
  Activation quantization is one quantize_fp8 per distinct input (linears reading the same x, such as
  q / k / v or gate / up, share it); in fuse_consumers the kernel that produces x takes it over where it
  can: a norm writes fp8 + scale itself (norm_fp8.py), an elementwise region joins the quantize kernel
  (quantize_fold.py). A gated MLP's gate and up run as one fp8 gated GEMM (gated_fp8.py) unless this rule
  keeps one of them bf16; then both are linears here and silu(g) * u the quantize kernel's prologue.
"""

from __future__ import annotations

import functools

import torch
from torch.fx import Node

from translator_kernels.gemm.fp8 import fp8_dtype, fp8_format, quantize_fp8, shuffle_weight_fp8

from ..graph import ASSERT, CASTS, aten, arg, captured_name, dtype_of, shape_of
from ..registry import NO_MATCH, Match, OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch
from .gemm import _emit_gemm
from . import quant_mx
from .quant import scaled_mm_supported

KEEP_BF16 = ("lm_head",)  # weight-name fragments that stay bf16 under precision="fp8"
KEEP_OUTPUT_LAYERS = True  # a linear whose result is a model output stays bf16
KEEP_ROUTER = True  # a linear whose result is an MoE router's logits (flydsl.moe_topk reads it) stays bf16
FP8_WEIGHTS = "channel"  # or "mxfp8" / "mxfp4": e4m3fn / e2m1 + e8m0 per 32 of K, gfx950 (quant_mx.py)
EPS = 1e-12


@torch.library.custom_op("flydsl::quantize_fp8", mutates_args=())
def quantize_fp8_op(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    return dispatch("quantize_fp8", x, fmt)


@quantize_fp8_op.register_fake
def _(x, fmt):
    return x.new_empty(x.shape, dtype=getattr(torch, fmt)), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


def ref_quantize_fp8(x, fmt):
    q, s = quantize_fp8(x, getattr(torch, fmt), dim=-1)
    return q.contiguous(), s.contiguous()  # row-major like the kernel's (its only reader is gemm_fp8)


def kernel_quantize_fp8(x, fmt):
    from translator_kernels import launch as kl
    from translator_kernels.gemm.quantize import quantize_rows

    return quantize_rows(x, fp8_format(getattr(torch, fmt), kl.arch()))


register_family(OpFamily(
    name="quantize_fp8", description="per-row fp8 quantization: (q, s) with x ≈ q * s, s = amax / FMAX",
    reference=ref_quantize_fp8, kernel=kernel_quantize_fp8, kernel_entry="translator_kernels.gemm.quantize:quantize_rows",
    sample_inputs=lambda dt: (torch.randn(6, 48).to(dt), "float8_e4m3fnuz"),
    tolerance_overrides={torch.float32: (1e-4, 1e-4, "its values feed gemm_fp8, whose fp32 sums run in MFMA order")},
))


def _fmt(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


# ---- the dynamic rowwise form of torch._scaled_mm ------------------------------------------------------
def _call(n, target) -> bool:
    return isinstance(n, Node) and n.op == "call_function" and n.target == target


def _f32(n, seen=None):
    """Through casts to fp32 (x.float(), amax.float()) back to what was cast (the casts go to `seen`)."""
    while isinstance(n, Node) and n.op == "call_function" and n.target in CASTS and dtype_of(n) == torch.float32:
        if seen is not None:
            seen.append(n)
        n = arg(n, "self")
    return n


def dynamic_rowwise(xq, s, fmax):
    """(x, nodes of the form) when xq = fp8(clamp(x / s, -fmax, fmax)) and s = clamp(amax(|x|, -1, keepdim)
    / fmax, min=EPS), else None."""
    if not (isinstance(xq, Node) and xq.target in CASTS):
        return None
    c = arg(xq, "self")
    if not (_call(c, aten.clamp.default) and arg(c, "min") == -fmax and arg(c, "max") == fmax):
        return None
    d = arg(c, "self")
    if not (_call(d, aten.div.Tensor) and arg(d, "other") is s):
        return None
    casts = []
    x = _f32(arg(d, "self"), casts)
    if not (_call(s, aten.clamp.default) and arg(s, "min") == EPS and arg(s, "max") is None):
        return None
    d2 = arg(s, "self")
    if not (_call(d2, aten.div.Tensor) and arg(d2, "other") == fmax):
        return None
    am = _f32(arg(d2, "self"), casts)
    nd = len(shape_of(x) or ())
    if not (_call(am, aten.amax.default) and list(arg(am, "dim")) in ([-1], [nd - 1]) and arg(am, "keepdim")):
        return None
    ab = arg(am, "self")
    if not (_call(ab, aten.abs.default) and _f32(arg(ab, "self"), casts) is x):
        return None
    return x, [xq, c, d, s, d2, am, ab, *casts]


def scaled_mm_dynamic_supported(node, ctx):
    m = scaled_mm_supported(node, ctx)
    if not isinstance(m, Match):
        return NO_MATCH  # the canonical _scaled_mm rule states the reason
    fmax = float(torch.finfo(dtype_of(m.x)).max)
    form = dynamic_rowwise(m.x, m.sa, fmax)
    if form is None:
        return NO_MATCH
    chain = form[1] + [u for n in form[1] for u in n.users if u.target == ASSERT]  # export's dtype checks
    inside = set(chain) | {node}
    casts = form[1][7:]  # widening casts of x / amax: what else reads them keeps them (export merges h.float()
    if any(u not in inside for n in form[1][:7] if n is not form[1][3] for u in n.users) \
            or any(u not in inside for u in m.sa.users):  # with h where h is already fp32)
        return NO_MATCH  # a value of the form is read elsewhere: it stays as traced
    chain = [n for n in chain if n not in casts or all(u in inside for u in n.users)]
    return Match(**vars(m), src=form[0], chain=chain)


@rule(Stage.PATTERN, aten._scaled_mm.default, family="gemm_fp8", supported=scaled_mm_dynamic_supported,
      doc="per-token fp8 quantization (amax / FMAX, divide, clamp, cast) feeding torch._scaled_mm")
def lower_scaled_mm_dynamic(node, ctx, m):
    n, k = m.w.shape
    _, (q, s) = ctx.emit("quantize_fp8", (m.src, _fmt(dtype_of(m.x))), lowering="quantize_fp8", sources=[],
                         anchor=m.x, before=node)
    w_node = ctx.add_constant(shuffle_weight_fp8(m.w), "w8", node, derive=shuffle_weight_fp8, sources=(m.w,))
    return ctx.replace(node, "gemm_fp8", "scaled_mm_dynamic", (q, w_node, n, k, s, m.sb, m.bias, m.out),
                       [node, *m.chain, m.b])


# ---- precision="fp8" --------------------------------------------------------------------------------
_PASS_THROUGH = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.squeeze.dim,
                 aten.unsqueeze.default, *CASTS}


def _is_model_output(node, depth=4) -> bool:
    for u in node.users:
        if u.op == "output" or (depth and u.op == "call_function" and u.target in _PASS_THROUGH
                                and _is_model_output(u, depth - 1)):
            return True
    return False


def _is_router(node, depth=4) -> bool:
    for u in node.users:
        if u.op == "call_function" and (u.target is torch.ops.flydsl.moe_topk.default or (
                depth and u.target in _PASS_THROUGH and _is_router(u, depth - 1))):
            return True
    return False


def keep_bf16_reason(node, w_node, k) -> str | None:
    """Why this linear stays bf16 under precision="fp8" (the module docstring's rule), or None."""
    name = str(w_node.target) if isinstance(w_node, Node) else ""
    hit = next((f for f in KEEP_BF16 if f in name or f in captured_name(node)), None)
    if hit is not None:
        return f"weight name contains {hit!r} (fp8_mode.KEEP_BF16)"
    if KEEP_OUTPUT_LAYERS and _is_model_output(node):
        return "its result is a model output (LM head / classifier; fp8_mode.KEEP_OUTPUT_LAYERS)"
    if KEEP_ROUTER and _is_router(node):
        return "its result is an MoE router's logits: top-k picks the experts (fp8_mode.KEEP_ROUTER)"
    if k % 16:
        return f"K={k} is not a multiple of 16"
    return None


def linear_fp8_supported(node, ctx):
    if ctx.precision != "fp8":
        return NO_MATCH
    from .gemm import linear_supported

    m = linear_supported(node, ctx)
    if not isinstance(m, Match):
        return NO_MATCH  # the bf16 linear rule states the reason
    keep = keep_bf16_reason(node, arg(node, "weight"), m.w.shape[1])
    return Match(**vars(m), keep=keep)


def fp8_weight(arch, w):
    q, _ = quantize_fp8(w.detach(), fp8_dtype(arch), dim=-1)
    return shuffle_weight_fp8(q)


def fp8_weight_scale(arch, w):
    return quantize_fp8(w.detach(), fp8_dtype(arch), dim=-1)[1].reshape(-1)


def quantized_input(ctx, x, before):
    """(q, s) of x quantized per token (flydsl.quantize_fp8), one per distinct x: linears reading the same x
    (q / k / v) share one launch."""
    done = ctx.__dict__.setdefault("_fp8_quantized", {})
    if x not in done:
        _, done[x] = ctx.emit("quantize_fp8", (ctx.cast_in(x, before), _fmt(fp8_dtype(ctx.arch))),
                              lowering="quantize_fp8", sources=[], anchor=x, before=before)
    return done[x]


@rule(Stage.CANONICAL, aten.linear.default, family="gemm_fp8", supported=linear_fp8_supported, priority=10,
      doc="precision='fp8': linear with a parameter weight -> per-token quantize + fp8 GEMM (LM head stays bf16)")
def lower_linear_fp8(node, ctx, m):
    if m.keep:
        ctx.count("linear_fp8_kept_bf16")
        ctx.gm.meta.setdefault("fp8_kept_bf16", {})[captured_name(node)] = m.keep
        return _emit_gemm(node, ctx, m.x, m.w, m.bias, "linear", [node])
    n, k = m.w.shape
    wq = functools.partial(fp8_weight, ctx.arch)
    ws = functools.partial(fp8_weight_scale, ctx.arch)
    if FP8_WEIGHTS != "channel":  # MX weights (quant_mx.py): None where K % 32
        wq, ws = quant_mx.mode_weights(ctx.arch, FP8_WEIGHTS, k) or (wq, ws)
    w_node = ctx.add_constant(wq(m.w), "w8", node, derive=wq, sources=(m.w,))
    s_node = ctx.add_constant(ws(m.w), "w8scale", node, derive=ws, sources=(m.w,))
    q, s = quantized_input(ctx, m.x, node)
    return ctx.replace(node, "gemm_fp8", "linear_fp8", (q, w_node, n, k, s, s_node, m.bias, "bf16"), [node])
