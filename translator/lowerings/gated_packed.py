"""A gated MLP over one packed gate/up weight -> `flydsl.gemm_gated` (Phi-3's `gate_up_proj`).

Phi-3 (and Phi-3.5, Phi-4-mini) keep the gate and up projections as one [2N, K] weight:

    up_states = self.gate_up_proj(x)                         aten.linear(x, W)       W = [Wg; Wu]
    gate, up_states = up_states.chunk(2, dim=-1)             chunk / split / two slices of the last dim
    return self.down_proj(up_states * self.activation_fn(gate))

Lowered op by op that is one GEMM writing the [M, 2N] intermediate and a SiLU-multiply elementwise kernel
reading it back. The first half of the output is x @ Wg.T, the second x @ Wu.T, so this is the gated MLP of
gated_mlp.py with Wg = W[:N], Wu = W[N:] (and the bias likewise): one `gemm_gated` launch over the arranged
weight, made from the packed parameter (rebuilt when it changes, state.prepared). Matched at the mul, either
operand order; the linear's only reader is the split (or the two slices), whose halves are read only by the
activation and the mul. Counter `gated_mlp_packed`.
"""

from __future__ import annotations

import functools

import torch

from ..graph import aten, arg, dtype_of, getitem_of, shape_of, static_int
from ..registry import NO_MATCH, Match, Stage, rule
from .gated_mlp import gate_pairs, gated_weight, param_linear
from .gemm import _gemm_reason, cast_weight

SPLITS = {aten.chunk.default, aten.split.Tensor, aten.split_with_sizes.default}


def _last_dim(node, d) -> bool:
    rank = len(shape_of(node))
    return d in (-1, rank - 1)


def _half(node):
    """(the split tensor's node, 0 or 1) where `node` is the first or second half of its last dim, else None."""
    if node.op != "call_function":
        return None
    if (part := getitem_of(node)) is not None:
        sp, i = part
        if not isinstance(sp, torch.fx.Node) or sp.target not in SPLITS or i not in (0, 1):
            return None
        src = arg(sp, "self")
        n2 = static_int(shape_of(src)[-1])
        if n2 is None or n2 % 2:
            return None
        parts = {aten.chunk.default: lambda: arg(sp, "chunks") == 2,
                 aten.split.Tensor: lambda: arg(sp, "split_size") == n2 // 2,
                 aten.split_with_sizes.default: lambda: list(arg(sp, "split_sizes")) == [n2 // 2, n2 // 2]}
        if not parts[sp.target]() or not _last_dim(src, arg(sp, "dim", 0)) or len(sp.users) != 2:
            return None
        return src, i
    if node.target is aten.slice.Tensor and _last_dim(arg(node, "self"), arg(node, "dim", 0)):
        src = arg(node, "self")
        n2 = static_int(shape_of(src)[-1])
        start, end, step = arg(node, "start", 0) or 0, arg(node, "end"), arg(node, "step", 1)
        if n2 is None or n2 % 2 or step != 1 or len(src.users) != 2:
            return None
        end = n2 if end is None or (isinstance(end, int) and end >= n2) else end
        return (src, 0) if (start, end) == (0, n2 // 2) else (src, 1) if (start, end) == (n2 // 2, n2) else None
    return None


def _packed_linear(node, ctx):
    """(x, W, bias node) of an aten.linear with a parameter weight read only by one split or by two slices."""
    users = list(node.users)
    split = len(users) == 1 and users[0].target in SPLITS
    if not split and not (len(users) == 2 and all(u.target is aten.slice.Tensor for u in users)):
        return None
    return param_linear(node, ctx)


def _match(node, ctx):
    for gate, act, up in gate_pairs(node):
        g, u = _half(arg(act, "self")), _half(up)
        if len(up.users) != 1 or g is None or u is None or g != (u[0], 0) or u[1] != 1 \
                or len(arg(act, "self").users) != 1:
            continue
        lin = _packed_linear(g[0], ctx)
        if lin is None:
            continue
        return gate, act, up, arg(act, "self"), g[0], lin
    return None


def gated_packed_supported(node, ctx):
    if ctx.precision == "fp8":  # fp8: the fp8 gated GEMM's own matchers
        return NO_MATCH
    m = _match(node, ctx)
    if m is None:
        return NO_MATCH
    gate, act, up, gpart, lin_node, (x, w, b) = m
    if b is not None and (ctx.constant(b) is None or tuple(ctx.constant(b).shape) != (w.shape[0],)):
        return "the packed gate / up bias is not a [2N] parameter"
    if [str(s) for s in shape_of(node) or ()] != [str(s) for s in shape_of(up) or ()]:
        return "the product broadcasts (its shape is not the halves' shape)"
    half = w[: w.shape[0] // 2]
    return _gemm_reason(x, half) or Match(gate=gate, nodes=[node, act, up, gpart, lin_node], x=x, w=w, b=b)


def _arranged(dtype, w):
    n = w.shape[0] // 2
    return gated_weight(cast_weight(dtype, w[:n]), cast_weight(dtype, w[n:]))


def _natural(dtype, w):
    n = w.shape[0] // 2
    return cast_weight(dtype, w[:n]), cast_weight(dtype, w[n:])


def _arranged_bias(b):
    n = b.shape[0] // 2
    return gated_weight(b.detach().float()[:n], b.detach().float()[n:])


@rule(Stage.PATTERN, aten.mul.Tensor, family="gemm_gated", supported=gated_packed_supported, name="gated_mlp_packed",
      doc="act(chunk(linear(x, [Wg; Wu]))[0]) * chunk(..)[1] (Phi-3's gate_up_proj) -> one gated GEMM")
def lower_gated_packed(node, ctx, m):
    n, k = m.w.shape[0] // 2, m.w.shape[1]
    dt = None if ctx.precision == "fp32" else ctx.compute_dtype
    bias = None
    if m.b is not None:
        cb = ctx.constant(m.b)
        bias = ctx.add_constant(_arranged_bias(cb), "gated_b", node, derive=_arranged_bias, sources=(cb,))
    w_node = ctx.add_constant(None, "gated_w", node, derive=functools.partial(_arranged, dt), sources=(m.w,),
                              natural=functools.partial(_natural, dt))
    xin = ctx.cast_in(m.x, node)
    split = [u for u in m.nodes[4].users]  # the chunk / split node, or the two slices
    return ctx.replace(node, "gemm_gated", "gated_mlp_packed", (xin, w_node, n, k, bias, m.gate),
                       [*m.nodes[:4], *split, m.nodes[4]], out_dtype=dtype_of(node))
