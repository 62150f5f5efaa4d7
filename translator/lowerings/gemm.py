"""GEMM family: linear layers and matmuls -> `flydsl.gemm` / `flydsl.bmm`.

`flydsl.gemm(a, w, n, k, bias, activation, residual, scale)` computes
``act(scale * a @ W.T + bias) + residual`` (``act``: a one-input per-element program of
translator_kernels.program, the op table the elementwise kernels use; translator.lowerings.
gemm_epilogue writes it) for ``a[..., k]`` and a weight ``W[n, k]`` that was
preshuffled once at translate time (translator_kernels.gemm.preshuffle: the layout lives there,
next to the kernel). The reference un-shuffles it, so the layout is exercised even when
only the reference runs. `flydsl.bmm(a, b)` multiplies two activations
(``a[..., m, k] @ b[..., k, n]`` with broadcast batch dims): attention scores, einsum.

Forms matched (where they appear):
- ``aten.linear(x, W, b)`` — every nn.Linear (MLPs, attention projections, LM heads).
- ``aten.addmm(b, x, W.t())`` / ``aten.mm(x, W.t())`` — 2-D linears as older code and
  HF Conv1D (GPT-2) write them: ``torch.addmm(bias, x.view(-1, nx), weight)``.
- ``aten.matmul(x, W)`` with a parameter W — hand-written projections ``x @ self.W``.
- ``aten.matmul`` / ``aten.bmm`` of two activations — ``q @ k.transpose(-2, -1)`` and
  ``att @ v`` in hand-written attention (nanoGPT, HF eager) when not fused as attention.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from translator_kernels.gemm.kernel import apply_epilogue_torch
from translator_kernels.gemm.preshuffle import shuffle_weight, unshuffle_weight

from ..graph import aten, arg, dtype_of, dtype_reason, shape_of
from ..registry import Match, OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch
from ..state import natural

# ---- the ops ------------------------------------------------------------------------------
@torch.library.custom_op("flydsl::gemm", mutates_args=())
def gemm(a: torch.Tensor, w: torch.Tensor, n: int, k: int, bias: Optional[torch.Tensor],
         activation: Optional[str], residual: Optional[torch.Tensor], scale: float,
         out_dtype: Optional[torch.dtype] = None, eps: Optional[float] = None) -> torch.Tensor:
    return dispatch("gemm", a, w, n, k, bias, activation, residual, scale, out_dtype, eps)


@gemm.register_fake
def _(a, w, n, k, bias, activation, residual, scale, out_dtype=None, eps=None):
    return a.new_empty((*a.shape[:-1], n), dtype=out_dtype or a.dtype)  # out_dtype: passes/store_casts.py


@torch.library.custom_op("flydsl::bmm", mutates_args=())
def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return dispatch("bmm", a, b)


@bmm.register_fake
def _(a, b):
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.new_empty((*batch, a.shape[-2], b.shape[-1]))


# fp32 bytes of a low-precision weight the reference widens at a time: a whole LM head widened at once is a
# fresh buffer (131 MB at 0.3 B), whose page faults cost more than its multiply (docs/verification.md)
WIDEN_BYTES = 8 << 20


def rms_of(x, eps):
    """rsqrt(mean(x²) + eps) per row of fp32 x: an RMSNorm folded into the GEMM (norm_gemm.py; γ is in W)."""
    return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def ref_gemm(a, w, n, k, bias, activation, residual, scale, out_dtype=None, eps=None):
    wt = natural(w)  # a lazy prepared weight (state.settle): W itself, no copy to undo
    wt = unshuffle_weight(w, n, k) if wt is None else wt
    x, rows = a.float(), max(1, WIDEN_BYTES // (4 * k))
    if wt.dtype == torch.float32 or n <= rows:
        y = x @ wt.float().t()
    else:  # widened a block of rows at a time, into one fp32 output
        y = x.new_empty((*x.shape[:-1], n))
        for i in range(0, n, rows):
            y[..., i:i + rows] = x @ wt[i:i + rows].float().t()
    y = y * scale
    if eps is not None:  # the kernel's order: scale, then the row's rstd (rownorm.py)
        y = y * rms_of(x, eps)
    if bias is not None:
        y = y + bias.float()
    y = apply_epilogue_torch(y, activation)
    if residual is not None:
        y = y + residual.float()
    return y.to(out_dtype or a.dtype)


def ref_bmm(a, b):
    return torch.matmul(a.float(), b.float()).to(a.dtype)


def kernel_gemm(a, w, n, k, bias, activation, residual, scale, out_dtype=None, eps=None):
    from translator_kernels.gemm import gemm as run

    lead = a.shape[:-1]
    a2 = a.reshape(-1, k)
    r2 = residual.reshape(-1, n) if residual is not None else None
    y = run(a2, w, n, k, bias=bias, activation=activation, residual=r2, scale=scale, out_dtype=out_dtype,
            rms_eps=eps)
    return y.reshape(*lead, n)


def kernel_bmm(a, b):
    from translator_kernels.gemm import bmm as run

    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a3 = a.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b3 = b.expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    return run(a3, b3).reshape(*batch, a.shape[-2], b.shape[-1])


def _sample_gemm(dtype):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, 40, generator=g).to(dtype)
    w = torch.randn(24, 40, generator=g).to(dtype)
    return (a, shuffle_weight(w), 24, 40, torch.randn(24, generator=g).to(dtype), None, None, 1.0)


register_family(OpFamily(
    name="gemm", description="C = act(scale * A @ W.T + bias) + residual, W preshuffled",
    reference=ref_gemm, kernel=kernel_gemm, kernel_entry="translator_kernels.gemm:gemm",
    sample_inputs=_sample_gemm,
    tolerance_overrides={torch.float32: (1e-4, 1e-4, "K-length fp32 sums in a different order than BLAS")},
))
register_family(OpFamily(
    name="bmm", description="batched A @ B of two activations (broadcast batch dims)",
    reference=ref_bmm, kernel=kernel_bmm, kernel_entry="translator_kernels.gemm:bmm",
    sample_inputs=lambda dt: (torch.randn(2, 7, 16).to(dt), torch.randn(2, 16, 9).to(dt)),
    tolerance_overrides={torch.float32: (1e-4, 1e-4, "K-length fp32 sums in a different order than BLAS")},
))


# ---- support checks and rewrites -------------------------------------------------------------
def _weight_nk(node, ctx) -> torch.Tensor | None:
    """W[N, K] when `node` is a parameter used as the right operand (as [K, N] or via .t())."""
    if node.op == "call_function" and node.target in (aten.t.default, aten.numpy_T.default):
        c = ctx.constant(arg(node, "self"))
        return c if c is not None and c.dim() == 2 else None
    if node.op == "call_function" and node.target is aten.transpose.int:
        c = ctx.constant(arg(node, "self"))
        if c is not None and c.dim() == 2:
            return c
        return None
    c = ctx.constant(node)
    return c.t() if c is not None and c.dim() == 2 else None


def _gemm_reason(x, w: torch.Tensor | None) -> str | None:
    r = dtype_reason(x)
    if r:
        return r
    if w is None:
        return None
    if w.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"weight dtype {str(w.dtype).replace('torch.', '')} is not supported (float32/bfloat16/float16)"
    if w.dtype != dtype_of(x):
        return f"weight dtype {w.dtype} differs from activation dtype {dtype_of(x)}"
    return None  # K and N come from the weight; the input's last dim must equal K for torch too


def cast_weight(dtype, t: torch.Tensor) -> torch.Tensor:
    """An fp32 parameter at the compute dtype (None: fp32 precision, as given)."""
    t = t.detach()
    return t.to(dtype) if dtype is not None and t.dtype == torch.float32 else t


def natural_weight(dtype, w: torch.Tensor, to_nk=None) -> torch.Tensor:
    """W[N, K] at the compute dtype, as the reference computes with it (a view of `w` in fp32)."""
    return cast_weight(dtype, w if to_nk is None else to_nk(w))


def shuffled_weight(dtype, w: torch.Tensor, to_nk=None) -> torch.Tensor:
    return shuffle_weight(natural_weight(dtype, w, to_nk))


def _emit_gemm(node, ctx, x, w_nk: torch.Tensor, bias_node, lowering, sources, w_from=None):
    """w_from: (parameter, to_nk) when w_nk is a copy made from a parameter (to_nk(parameter) == w_nk)."""
    n, k = w_nk.shape
    dt = None if ctx.precision == "fp32" else ctx.compute_dtype
    src, to_nk = w_from or (w_nk, None)
    prep = functools.partial(shuffled_weight, dt, to_nk=to_nk)  # rebuilt when the parameter changes (state.prepared)
    w_node = ctx.add_constant(None, "w", node, derive=prep, sources=(src,),  # made after the passes where needed
                              natural=functools.partial(natural_weight, dt, to_nk=to_nk))
    b = bias_node
    if b is not None and ctx.precision != "fp32":
        c = ctx.constant(b)
        cast = functools.partial(cast_weight, dt)
        b = ctx.add_constant(cast(c), "b", node, derive=cast, sources=(c,)) if c is not None else ctx.cast_in(b, node)
    xin = ctx.cast_in(x, node)
    return ctx.replace(node, "gemm", lowering, (xin, w_node, n, k, b, None, None, 1.0), sources)


def linear_supported(node, ctx):
    x, w = arg(node, "input"), arg(node, "weight")
    wt = ctx.constant(w)
    if wt is None:
        return "weight is computed at run time, not a parameter (no translate-time preshuffle)"
    if wt.dim() != 2:
        return f"weight has {wt.dim()} dims, expected [N, K]"
    if len(shape_of(x)) < 1:
        return "input is a scalar"
    return _gemm_reason(x, wt) or Match(x=x, w=wt, bias=arg(node, "bias"))


@rule(Stage.CANONICAL, aten.linear.default, family="gemm", supported=linear_supported,
      doc="aten.linear with a parameter weight")
def lower_linear(node, ctx, m):
    return _emit_gemm(node, ctx, m.x, m.w, m.bias, "linear", [node])


def addmm_supported(node, ctx):
    bias, x, m2 = arg(node, "self"), arg(node, "mat1"), arg(node, "mat2")
    if arg(node, "beta") != 1 or arg(node, "alpha") != 1:
        return "addmm with beta/alpha other than 1"
    w = _weight_nk(m2, ctx)
    if w is None:
        return "right operand is not a parameter; addmm of two activations stays in PyTorch"
    if shape_of(bias) not in ((w.shape[0],), (1, w.shape[0])):
        return f"bias of shape {shape_of(bias)} is not a per-column [N] bias"
    return _gemm_reason(x, w) or Match(x=x, w=w, bias=bias, b=m2)


@rule(Stage.CANONICAL, aten.addmm.default, family="gemm", supported=addmm_supported,
      doc="addmm(bias, x, W.t()) with a parameter weight")
def lower_addmm(node, ctx, m):
    return _emit_gemm(node, ctx, m.x, m.w, m.bias, "addmm", _sources(node, m.b))


def _sources(node, b):
    """The node, and the transpose feeding its weight when nothing else reads it."""
    return [node] + ([b] if b.op == "call_function" and len(b.users) == 1 else [])


def mm_supported(node, ctx):
    a, b = _operands(node)
    w = _weight_nk(b, ctx)
    return _gemm_reason(a, w) or (None if w is not None else _bmm_reason(a, b)) or Match(a=a, b=b, w=w)


@rule(Stage.CANONICAL, aten.mm.default, family="gemm", supported=mm_supported,
      doc="mm with a parameter (gemm) or activation (bmm) right operand")
def lower_mm(node, ctx, m):
    if m.w is not None:
        return _emit_gemm(node, ctx, m.a, m.w, None, "mm", _sources(node, m.b))
    return ctx.replace(node, "bmm", "mm", (ctx.cast_in(m.a, node), ctx.cast_in(m.b, node)), [node])


def _operands(node):
    """(left, right) of mm / bmm (self, mat2) or matmul (self, other)."""
    return arg(node, "self"), arg(node, "other" if node.target is aten.matmul.default else "mat2")


def _bmm_reason(a, b):
    r = dtype_reason(a, "left operand") or dtype_reason(b, "right operand")
    if r:
        return r
    if dtype_of(a) != dtype_of(b):
        return f"operand dtypes differ ({dtype_of(a)} vs {dtype_of(b)})"
    if len(shape_of(a)) < 2 or len(shape_of(b)) < 2:
        return "matmul with a 1-D operand (a matrix-vector product) stays in PyTorch"
    if len(shape_of(a)) > 4 or len(shape_of(b)) > 4:
        return "matmul operands with more than 4 dims"
    return None


def bmm_supported(node, ctx):
    a, b = _operands(node)
    return _bmm_reason(a, b) or Match(a=a, b=b)


@rule(Stage.CANONICAL, aten.bmm.default, family="bmm", supported=bmm_supported, doc="bmm of two activations")
def lower_bmm(node, ctx, m):
    return ctx.replace(node, "bmm", "bmm", (ctx.cast_in(m.a, node), ctx.cast_in(m.b, node)), [node])


def matmul_supported(node, ctx):
    a, b = _operands(node)
    w = ctx.constant(b)
    if w is not None and w.dim() == 2:
        return _gemm_reason(a, w.t()) or Match(a=a, b=b, w=w.t())
    return _bmm_reason(a, b) or Match(a=a, b=b, w=None)


@rule(Stage.CANONICAL, aten.matmul.default, family="gemm", supported=matmul_supported,
      doc="matmul 2-D/3-D/4-D: parameter right operand -> gemm, activations -> bmm")
def lower_matmul(node, ctx, m):
    if m.w is not None:
        return _emit_gemm(node, ctx, m.a, m.w, None, "matmul", [node])
    return ctx.replace(node, "bmm", "matmul", (ctx.cast_in(m.a, node), ctx.cast_in(m.b, node)), [node])
