"""Fused reduction family: `flydsl.fused_reduce(inputs, program, kind, dims, keepdim, params,
epi_inputs, epilogue)`.

One node reduces, over `dims` of the broadcast shape, the value an elementwise `program`
computes from `inputs` (the fused_elementwise program format). Canonical lowerings here map
each aten reduction with an identity program; the consumer rule `reduce_prologue` (fold.py, in
the fuse_consumers pass after partitioning) then folds a fused elementwise region whose only
reader is the reduction into its program, so ``(x * x).mean(-1)``, ``torch.exp(x - m).sum(-1)`` or a loss's
``(a - b).abs().sum()`` is one kernel reading only the region's inputs.

Forms matched (where they appear): ``x.sum(dim)`` / ``mean`` (pooling over tokens, loss
reductions), ``amax`` / ``amin`` (stable softmax written by hand, quantization scales),
``var`` / ``std`` (hand-written LayerNorm, statistics), ``torch.logsumexp`` (LM losses),
``argmax`` / ``max(dim)`` (greedy decoding, classifier heads), ``torch.linalg.vector_norm`` /
``x.norm(dim=-1)`` (cosine similarity, CLIP / triplet embeddings). Any dim or set of dims:
the kernel adapter moves reduced dims last, so none gives a wrong answer.
"""

from __future__ import annotations

import math

import torch

from ..graph import aten, arg, size_hint, static_int, val
from ..registry import Match, OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch

from translator_kernels.program import DTYPES, TORCH, Program, parse  # noqa: E402
from translator_kernels.codegen.reduce import (SPLIT, max_row_length, out_shape, ref_fused_reduce,  # noqa: E402
                                                 split_factor)


@torch.library.custom_op("flydsl::fused_reduce", mutates_args=())
def fused_reduce(inputs: list[torch.Tensor], program: str, kind: str, dims: list[int], keepdim: bool,
                 params: list[float], epi_inputs: list[torch.Tensor], epilogue: str) -> list[torch.Tensor]:
    return dispatch("fused_reduce", inputs, program, kind, dims, keepdim, params, epi_inputs, epilogue)


def _shape(inputs, dims, keepdim):
    shape = tuple(torch.broadcast_shapes(*[t.shape for t in inputs]))
    return out_shape(shape, {d % len(shape) for d in dims} if shape else set(), keepdim)


@fused_reduce.register_fake
def _(inputs, program, kind, dims, keepdim, params, epi_inputs, epilogue):
    shape = _shape(inputs, dims, keepdim)
    vdt = TORCH[parse(epilogue or program).out[0][1]]
    x = inputs[0]
    if kind in ("argmax", "argmin"):
        return [x.new_empty(shape, dtype=torch.int64)]
    if kind in ("max", "min"):
        return [x.new_empty(shape, dtype=vdt), x.new_empty(shape, dtype=torch.int64)]
    return [x.new_empty(shape, dtype=vdt)]


def kernel_fused_reduce(inputs, program, kind, dims, keepdim, params, epi_inputs=(), epilogue=""):
    from translator_kernels.codegen.reduce import fused_reduce as run

    return run(inputs, program, kind, dims, keepdim, params, epi_inputs, epilogue or None)


def _sample(dt):
    prog = Program(2, (("sub", (0, 1), ()), ("exp", (2,), ())), ((3, DTYPES[dt]),))
    epi = Program(2, (("log", (0,), ()), ("add", (2, 1), ())), ((3, DTYPES[dt]),))  # logsumexp by hand
    m = torch.randn(4, 1).to(dt)
    return ([torch.randn(4, 33).to(dt), m], prog.text(), "sum", [-1], False, [], [m[:, 0]], epi.text())


register_family(OpFamily(
    name="fused_reduce",
    description="a reduction (sum/mean/amax/amin/var/std/logsumexp/arg*/max/min/norm) over any dims, "
                "with its fused elementwise prologue, as one generated kernel",
    reference=ref_fused_reduce, kernel=kernel_fused_reduce,
    kernel_entry="translator_kernels.codegen.reduce:fused_reduce", sample_inputs=_sample,
    tolerance_overrides={torch.float32: (1e-5, 1e-5, "tree summation order differs from torch's; "
                                         "exp / log are 1-ulp sequences")},
))


# --- aten reductions -> (kind, dims, keepdim, params) ----------------------------------------

def _dims(d, rank):
    if d is None or (isinstance(d, (list, tuple)) and len(d) == 0):
        return list(range(rank))
    d = [d] if isinstance(d, int) else list(d)
    return sorted({x % rank for x in d}) if rank else []


def _correction(node):
    if node.target in (aten.var.dim, aten.std.dim):
        return 1.0 if arg(node, "unbiased", True) else 0.0
    c = arg(node, "correction")
    return 1.0 if c is None else float(c)


def describe(node):
    """(kind, dims, keepdim, params) of an aten reduction node, or None."""
    t = node.target
    rank = len(val(arg(node, "self")).shape)
    if t in (aten.sum.default, aten.mean.default):
        return ("sum" if t is aten.sum.default else "mean"), list(range(rank)), False, []
    if t in (aten.max.default, aten.min.default):
        return ("amax" if t is aten.max.default else "amin"), list(range(rank)), False, []
    if t in (aten.sum.dim_IntList, aten.mean.dim):
        kind = "sum" if t is aten.sum.dim_IntList else "mean"
        return kind, _dims(arg(node, "dim"), rank), bool(arg(node, "keepdim", False)), []
    if t in (aten.amax.default, aten.amin.default, aten.logsumexp.default):
        kind = t._overloadpacket.__name__
        return kind, _dims(arg(node, "dim", []), rank), bool(arg(node, "keepdim", False)), []
    if t in (aten.var.dim, aten.var.correction, aten.std.dim, aten.std.correction):
        kind = t._overloadpacket.__name__
        keep = arg(node, "keepdim", False)
        return kind, _dims(arg(node, "dim"), rank), bool(keep), [_correction(node)]
    if t in (aten.argmax.default, aten.argmin.default):
        return t._overloadpacket.__name__, _dims(arg(node, "dim"), rank), bool(arg(node, "keepdim", False)), []
    if t in (aten.max.dim, aten.min.dim):
        kind = "max" if t is aten.max.dim else "min"
        return kind, _dims(arg(node, "dim"), rank), bool(arg(node, "keepdim", False)), []
    if t is aten.linalg_vector_norm.default:
        return ("norm", _dims(arg(node, "dim"), rank), bool(arg(node, "keepdim", False)),
                [float(arg(node, "ord", 2))])
    return None


TARGETS = (aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim, aten.amax.default,
           aten.amin.default, aten.max.default, aten.min.default, aten.var.dim, aten.var.correction,
           aten.std.dim, aten.std.correction, aten.logsumexp.default, aten.argmax.default, aten.argmin.default,
           aten.max.dim, aten.min.dim, aten.linalg_vector_norm.default)


def reduce_supported(node, ctx):
    x = arg(node, "self")
    xv, out = val(x), val(node)
    if not isinstance(xv, torch.Tensor) or xv.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        dt = getattr(xv, "dtype", None)
        return f"input dtype {str(dt).replace('torch.', '')} is not supported (reductions take float32, bfloat16, float16)"
    vout = out[0] if isinstance(out, (tuple, list)) else out
    if vout.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
        return f"result dtype {vout.dtype} is not supported"
    if node.target is aten.linalg_vector_norm.default and arg(node, "dtype") is not None:
        return "linalg_vector_norm with dtype= stays in PyTorch"
    kind, dims, keepdim, params = describe(node)
    # a dynamic reduced dim (batch / sequence) is fine: kernels are generated per row length at
    # run time; the example size is checked here, longer rows at run time raise a clear error
    n = math.prod(size_hint(xv.shape[d]) for d in dims)
    if n == 0:
        return "reduction over an empty dim (torch's result depends on the op)"
    if n > max_row_length() and (kind not in SPLIT or split_factor(n) is None):
        why = "cannot be cut into equal chunks" if kind in SPLIT else f"{kind} has no two-stage form"
        return f"reduced size {n} exceeds {max_row_length()} elements per row and {why}"
    numel = [static_int(s) for s in xv.shape]
    if None not in numel and math.prod(numel) >= 2**31:
        return "more than 2^31 - 1 elements (buffer offsets are 32-bit)"
    return Match(kind=kind, dims=dims, keepdim=keepdim, params=params)


def identity_program(dtype) -> str:
    return Program(1, (), ((0, DTYPES[dtype]),)).text()


@rule(Stage.CANONICAL, *TARGETS, family="fused_reduce", supported=reduce_supported,
      doc="sum / mean / amax / amin / var / std / logsumexp / argmax / argmin / max / min / vector_norm "
          "over any dims")
def lower_reduce(node, ctx, m):
    kind, dims, keepdim, params = m.kind, m.dims, m.keepdim, m.params
    x = arg(node, "self")
    out = val(node)
    vdt = (out[0] if isinstance(out, (tuple, list)) else out).dtype
    if kind in ("argmax", "argmin"):
        vdt = val(x).dtype
    args = ([x], identity_program(vdt), kind, dims, keepdim, params, [], "")
    pair = kind in ("max", "min")  # users are already getitem(., 0) values and getitem(., 1) indices
    out = ctx.emit("fused_reduce", args, lowering=f"reduce_{kind}", sources=[node], anchor=node, before=node,
                   split=not pair)
    new = out if pair else out[0]
    node.replace_all_uses_with(new if pair else out[1][0])
    ctx.gm.graph.erase_node(node)
    return new
