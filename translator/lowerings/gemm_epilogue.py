"""GEMM epilogue fusion: fold what follows a `flydsl.gemm` into its epilogue.

The kernel's epilogue is ``out = act(scale * (a @ W.T) + bias) + residual`` in fp32. Walking
forward from a gemm whose output has one user, each of these is absorbed in turn while the
order above still holds:

    y = x @ W.t()  * s                  scale      (only before bias / activation / residual)
    y = torch.mm(x, W) + self.bias      bias       (HF Conv1D / hand-written projections)
    y = F.gelu(self.fc1(x))             activation (relu, gelu erf / tanh, silu: every MLP)
    x = x + self.dropout(self.proj(h))  residual   (eval dropout is the identity; GPT-2, ViT, BERT)

so ``x + drop(proj(gelu(fc(h))))`` becomes two gemm nodes: fc with a gelu epilogue, proj
with the residual add. Under precision bf16/fp16 the gemm's output is cast back to the
model's dtype before its users; those gemms keep their epilogue unfused (the cast stands
between), which is correct, just not fused.
"""

from __future__ import annotations

import torch

from ..registry import Lowering, register_lowering
from ._common import aten, dtype_of, shape_of

GEMM = torch.ops.flydsl.gemm.default
ACTS = {aten.relu.default: "relu", aten.silu.default: "silu", aten.gelu.default: None}


def _identity_dropout(n) -> bool:
    return n.target is aten.dropout.default and len(n.args) > 2 and not n.args[2]


def _step(g, ctx):
    """(kind, user, new args, absorbed nodes) for the next op to fold into gemm node `g`, or None."""
    a, w, n, k, bias, act, residual, scale = g.args
    users = list(g.users)
    if len(users) != 1:
        return None
    u = users[0]
    absorbed = [u]
    while u.op == "call_function" and _identity_dropout(u) and len(u.users) == 1:
        u = next(iter(u.users))
        absorbed.append(u)
    if u.op != "call_function" or u.kwargs.get("alpha", 1) != 1:
        return None
    if residual is not None:
        return None
    t = u.target
    if t in (aten.mul.Tensor, aten.mul.Scalar) and isinstance(u.args[1], (int, float)) and bias is None and act is None:
        return "scale", u, (a, w, n, k, bias, act, residual, scale * float(u.args[1])), absorbed
    if t in ACTS and act is None:
        name = ACTS[t]
        if t is aten.gelu.default:
            approx = u.kwargs.get("approximate", u.args[1] if len(u.args) > 1 else "none")
            name = "gelu_tanh" if approx == "tanh" else "gelu"
        return "activation", u, (a, w, n, k, bias, name, residual, scale), absorbed
    if t is aten.add.Tensor:
        other = u.args[1] if _feeds(u.args[0], g, absorbed) else u.args[0] if _feeds(u.args[1], g, absorbed) else None
        if not isinstance(other, torch.fx.Node) or dtype_of(other) != dtype_of(g):
            return None
        so, sg = shape_of(other), shape_of(g)
        if bias is None and act is None and len(so) == 1 and str(so[0]) == str(n):
            return "bias", u, (a, w, n, k, other, act, residual, scale), absorbed
        if [str(s) for s in so] == [str(s) for s in sg] and _before(other, g):
            return "residual", u, (a, w, n, k, bias, act, other, scale), absorbed
    return None


def _feeds(x, g, absorbed) -> bool:
    return x is g or (len(absorbed) > 1 and x is absorbed[-2])


def _before(x, g) -> bool:
    """x is computed before g (so g may read it): not g itself nor anything after it."""
    if not isinstance(x, torch.fx.Node) or x is g or x.graph is not g.graph or x._erased or g._erased:
        return False
    return x < g  # FX orders the nodes of one graph by their place (Node._sort_key)


def epilogue_check(node, ctx):
    return None if _step(node, ctx) is not None else False


def fuse_epilogue(node, ctx):
    g = node
    while (step := _step(g, ctx)) is not None:
        kind, user, args, absorbed = step
        g.args = args
        user.replace_all_uses_with(g)
        info = g.meta["flydsl"]
        info["sources"] = info["sources"] + [s.meta.get("orig_name", s.name) for s in absorbed]
        info["anchor"] = user.meta.get("orig_name", user.name)
        for s in reversed(absorbed):
            ctx.gm.graph.erase_node(s)
        ctx.counters[f"epilogue_{kind}"] = ctx.counters.get(f"epilogue_{kind}", 0) + 1
    return g


register_lowering(Lowering("gemm_epilogue", "gemm", (GEMM,), epilogue_check, fuse_epilogue,
                           doc="scale / bias / activation / residual after a gemm -> its epilogue", stage="epilogue"))
