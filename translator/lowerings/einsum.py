"""einsum strings that are a matmul -> `flydsl.gemm` (parameter operand) or `flydsl.bmm`.

Forms matched (where they appear):
- ``torch.einsum("bhqd,bhkd->bhqk", q, k)`` / ``("bhqk,bhkd->bhqd", p, v)`` — attention
  written with einsum (Perceiver, lucidrains' x-transformers, many research repos).
- ``torch.einsum("bnd,de->bne", x, self.W)`` / ``("...d,ed->...e")`` — projections with a
  parameter (Mamba / MLP-Mixer style code): a gemm with a translate-time preshuffled weight.

Two operands; every letter at most once per operand; exactly one contracted letter; at most one
letter private to each operand (M and N); the rest are batch letters present everywhere. The
operands are permuted (views, in PyTorch) to [batch..., M, K] and [batch..., K, N], and the
result permuted to the output's order. Anything else stays in PyTorch with the reason.
"""

from __future__ import annotations

import torch

from ..graph import aten, dtype_of, dtype_reason
from ..registry import Stage, rule
from .gemm import _emit_gemm


def _parse(eq: str, ranks):
    eq = eq.replace(" ", "")
    if "->" not in eq:
        return "implicit output (no '->')"
    lhs, out = eq.split("->")
    ops = lhs.split(",")
    if len(ops) != 2:
        return f"{len(ops)} operands (only two-operand einsums are matmuls)"
    a, b = ops
    if "." in eq:
        if not (a.startswith("...") and out.startswith("...") and "." not in b):
            return "an ellipsis outside the leading dims of the first operand"
        extra = ranks[0] - (len(a) - 3)
        letters = "".join(chr(0x3B1 + i) for i in range(extra))  # stand-ins for the ellipsis dims
        a, out = letters + a[3:], letters + out[3:]
    if any(len(set(s)) != len(s) for s in (a, b, out)):
        return "a letter repeats within one operand (a diagonal / trace)"
    if len(a) != ranks[0] or len(b) != ranks[1]:
        return "equation does not match the operand ranks"
    k = [c for c in a if c in b and c not in out]
    batch = [c for c in a if c in b and c in out]
    m = [c for c in a if c not in b]
    n = [c for c in b if c not in a]
    if any(c not in out for c in m + n):
        return "a letter is summed out of a single operand"
    if len(k) != 1 or len(n) > 1:
        return f"contracts {len(k)} letters with {len(n)} free letters in the second operand (a matmul has one each)"
    return a, b, out, batch, m, n, k[0]


def einsum_supported(node, ctx):
    eq, operands = node.args[0], node.args[1]
    if len(operands) != 2 or not all(isinstance(o, torch.fx.Node) for o in operands):
        return "einsum with other than two tensor operands"
    for o in operands:
        r = dtype_reason(o)
        if r:
            return r
    if dtype_of(operands[0]) != dtype_of(operands[1]):
        return "operand dtypes differ"
    p = _parse(eq, [len(o.meta["val"].shape) for o in operands])
    if isinstance(p, str):
        return p
    a, b, out, batch, m, n, k = p
    weight = ctx.constant(operands[1]) is not None and not batch
    if len(m) > 1 and not weight:
        return f"{len(m)} free letters in the first operand of an activation x activation einsum (bmm takes one)"
    return None


def _permute(ctx, x, order, before):
    if order == list(range(len(order))):
        return x
    return ctx.insert(aten.permute.default, x, order, before=before)


def _unsqueeze(ctx, x, dim, before):
    return ctx.insert(aten.unsqueeze.default, x, dim, before=before)


@rule(Stage.CANONICAL, aten.einsum.default, family="bmm", supported=einsum_supported,
      doc="two-operand einsum that is a (batched) matmul")
def lower_einsum(node, ctx):
    eq, (A, B) = node.args[0], node.args[1]
    a, b, out, batch, m, n, k = _parse(eq, [len(A.meta["val"].shape), len(B.meta["val"].shape)])
    wb = ctx.constant(B)
    if wb is not None and not batch:
        # gemm: W[N, K] from the parameter; A -> [rest in output order..., K]
        rest = [c for c in out if c in a]
        w = wb.permute([b.index(c) for c in n + [k]]) if n else wb.unsqueeze(0)
        a2 = _permute(ctx, A, [a.index(c) for c in rest + [k]], node)
        g = _emit_gemm(node, ctx, a2, w.reshape(w.shape[0], -1) if n else w, None, "einsum", [node])
        got = rest + (n if n else [])
        if not n:
            with ctx.gm.graph.inserting_after(g):
                sq = ctx.gm.graph.call_function(aten.squeeze.dim, (g, -1))
            ctx.infer(sq)
            g.replace_all_uses_with(sq, delete_user_cb=lambda u: u is not sq)
            return g
        res = _permute_after(ctx, g, [got.index(c) for c in out])
        return res
    a2 = _permute(ctx, A, [a.index(c) for c in batch + m + [k]], node)
    b2 = _permute(ctx, B, [b.index(c) for c in batch + [k] + n], node)
    if not m:
        a2 = _unsqueeze(ctx, a2, -2, node)
    if not n:
        b2 = _unsqueeze(ctx, b2, -1, node)
    new = ctx.replace(node, "bmm", "einsum", (ctx.cast_in(a2, node), ctx.cast_in(b2, node)), [node])
    got = batch + (m or ["<m>"]) + (n or ["<n>"])
    return _fix_output(ctx, new, got, out)


def _permute_after(ctx, g, order):
    if order == list(range(len(order))):
        return g
    users = [u for u in g.users]
    with ctx.gm.graph.inserting_after(g):
        p = ctx.gm.graph.call_function(aten.permute.default, (g, order))
    ctx.infer(p)
    for u in users:
        u.replace_input_with(g, p)
    return p


def _fix_output(ctx, new, got, out):
    """`new` has dims labelled `got` (with <m>/<n> placeholders of size 1); permute/squeeze to `out`."""
    res = new
    for ph in ("<n>", "<m>"):
        if ph in got:
            users = list(res.users)
            with ctx.gm.graph.inserting_after(res):
                sq = ctx.gm.graph.call_function(aten.squeeze.dim, (res, got.index(ph)))
            ctx.infer(sq)
            for u in users:
                u.replace_input_with(res, sq)
            got = [c for c in got if c != ph]
            res = sq
    return _permute_after(ctx, res, [got.index(c) for c in out])
