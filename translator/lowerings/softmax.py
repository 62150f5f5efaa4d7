"""Softmax family: `flydsl.softmax(x, dim, log)` — softmax / log-softmax along one dim.

The kernel reduces over the contiguous last dim; for dim != -1 the adapter moves the
dim last (a copy) and back, so any dim gives the right answer.

Forms matched (where they appear):
- ``aten.softmax.int(x, dim[, dtype])`` — ``F.softmax(att, dim=-1)`` in every attention
  written by hand (nanoGPT, HF eager BERT / GPT-2 / Llama), classifier heads.
- ``aten._softmax(x, dim, half_to_float)`` — what some traces and decompositions leave.
- ``aten.log_softmax.int`` / ``aten._log_softmax`` — LM losses, ``F.log_softmax(logits)``.
A softmax with ``dtype=torch.float32`` on bf16 input (HF: ``softmax(..., dtype=torch.float32)``)
becomes a cast then the op, as torch defines it.
"""

from __future__ import annotations

import torch

from ..graph import aten, arg, dtype_reason, shape_of
from ..registry import OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch


@torch.library.custom_op("flydsl::softmax", mutates_args=())
def softmax(x: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    return dispatch("softmax", x, dim, log)


@softmax.register_fake
def _(x, dim, log):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def ref_softmax(x, dim, log):
    f = torch.log_softmax if log else torch.softmax
    return f(x.float(), dim).to(x.dtype)


def kernel_softmax(x, dim, log):
    from translator_kernels.rows.softmax import softmax as run

    if x.dim() == 0:
        x = x.reshape(1)
        return kernel_softmax(x, 0, log).reshape(())
    xm = x.movedim(dim, -1)
    shape = xm.shape
    y = run(xm.reshape(-1, shape[-1]), log=log)
    return y.reshape(shape).movedim(-1, dim).contiguous()


register_family(OpFamily(
    name="softmax", description="softmax / log-softmax along one dim (numerically stable)",
    reference=ref_softmax, kernel=kernel_softmax, kernel_entry="translator_kernels.rows.softmax:softmax",
    sample_inputs=lambda dt: (torch.randn(6, 33).to(dt), -1, False),
))


_TARGETS = (aten.softmax.int, aten._softmax.default, aten.log_softmax.int, aten._log_softmax.default)


def softmax_supported(node, ctx):
    x = arg(node, "self")
    r = dtype_reason(x)
    if r:
        return r
    if node.target in (aten._softmax.default, aten._log_softmax.default) and arg(node, "half_to_float"):
        return "half_to_float=True (fp16 in, fp32 out) is not supported"
    if len(shape_of(x)) == 0:
        return "softmax of a 0-d tensor"
    return None


@rule(Stage.CANONICAL, *_TARGETS, family="softmax", supported=softmax_supported,
      doc="softmax / log_softmax over any dim")
def lower_softmax(node, ctx):
    x, dim = arg(node, "self"), arg(node, "dim")
    log = node.target in (aten.log_softmax.int, aten._log_softmax.default)
    want = arg(node, "dtype") if node.target in (aten.softmax.int, aten.log_softmax.int) else None
    xin = ctx.cast_in(ctx.cast(x, want, node) if want is not None else x, node)
    dim = dim % len(shape_of(x))
    return ctx.replace(node, "softmax", "log_softmax" if log else "softmax", (xin, dim, log), [node])
