"""GEMM epilogue fusion: fold what follows a `flydsl.gemm` into its epilogue.

The kernel's epilogue is ``out = program(scale * (a @ W.T) + bias) + residual`` in fp32, where
``program`` is a one-input per-element program of translator_kernels.program: the same program
and op table as the fused elementwise kernels, so every op an elementwise region takes can fold
here too (sqrt, log, erf, sin, floor, pow by a scalar, ...). Walking forward from a gemm, in graph
order, while the running value has one user, each op is absorbed if it keeps the kernel's order
exact:

    y = x @ W.t() * s                   scale      (only before bias / any step)
    y = torch.mm(x, W) + self.bias      bias       (only before any step)
    y = torch.sigmoid(y * 2.0)          steps      (any elementwise op whose only tensor operand is
    y = torch.sqrt(F.gelu(y)).clamp(0, 1)          the running value, the rest scalars; written
                                                    into the program by the elementwise lowering's
                                                    own table; a scale after the bias is a step)
    x = x + self.dropout(y)             residual   (last; eval dropout passes through anywhere)

so ``x + drop(proj(gelu(fc(h))))`` becomes two gemm nodes: fc with a gelu epilogue, proj with
the residual add. Every absorbed op keeps the gemm's dtype and shape. `plan` is the one
description of what gets absorbed: translator.passes.partition leaves exactly those nodes out
of elementwise regions. Under precision bf16/fp16 the gemm's output is cast back to the
model's dtype before its users; those gemms keep their epilogue unfused (the cast stands
between), which is correct, just not fused.
"""

from __future__ import annotations

import torch

from translator_kernels.program import Program, epilogue, parse, then

from ..graph import aten, arg, before, dtype_of, shape_of
from ..registry import NO_MATCH, Stage, rule
from . import gemm  # noqa: F401  (registers flydsl.gemm, whose epilogue this is)
from .elementwise import TABLE, ProgramBuilder, node_supported

GEMM = torch.ops.flydsl.gemm.default
MUL = (aten.mul.Tensor, aten.mul.Scalar)
ARITH = {aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar, aten.add.Tensor, aten.add.Scalar,
         aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Scalar}  # counted as epilogue_arith, the rest as activation


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _identity_dropout(n) -> bool:
    return n.target is aten.dropout.default and not arg(n, "train", False)


def _step(u, cur) -> Program | None:
    """`u` as a one-input program over the running value `cur` (its only tensor operand), or None."""
    if u.target not in TABLE or u.all_input_nodes != [cur] or node_supported(u) is not None:
        return None
    b = ProgramBuilder([u])
    b.add(u)
    prog = b.program([u])
    return Program(1, prog.ops, ((prog.out[0][0], "f32"),))


def _classify(u, cur, g, fresh):
    """(kind, payload) for op `u` applied to the running value `cur`, or None (not absorbable).

    fresh: no bias and no step yet (a scalar multiply may still become the scale argument)."""
    t, args = u.target, u.args
    if not args:
        return None
    if _identity_dropout(u) and args[0] is cur:
        return "dropout", None
    if t in MUL and len(args) == 2 and not u.kwargs and fresh:
        other = args[1] if args[0] is cur else args[0]
        if _num(other):
            return "scale", float(other)
    if t is aten.add.Tensor and u.kwargs.get("alpha", 1) == 1 and len(args) == 2 and cur in args:
        other = args[1] if args[0] is cur else args[0]
        if isinstance(other, torch.fx.Node) and other is not cur and dtype_of(other) == dtype_of(g):
            so = [str(s) for s in shape_of(other) or ()]
            if fresh and g.args[4] is None and so == [str(g.args[2])]:
                return "bias", other
            if so == [str(s) for s in shape_of(g)] and before(other, g):
                return "residual", other
            return None
    step = _step(u, cur)
    if step is None:
        return None
    return ("arith" if t in ARITH else "activation"), step


def plan(g) -> list:
    """What to fold into gemm node `g`, in graph order: [(kind, absorbed node, gemm args after it)]."""
    a, w, n, k, bias, act, residual, scale = g.args
    prog = parse(act) if act else None
    out, cur = [], g
    while residual is None and len(cur.users) == 1:
        u = next(iter(cur.users))
        if u.op != "call_function" or dtype_of(u) != dtype_of(g) or \
                [str(s) for s in shape_of(u) or ()] != [str(s) for s in shape_of(g)]:
            break
        r = _classify(u, cur, g, bias is None and prog is None)
        if r is None:
            break
        kind, p = r
        if kind == "scale":
            scale = scale * p
        elif kind == "bias":
            bias = p
        elif kind == "residual":
            residual = p
        elif kind in ("activation", "arith"):
            prog = p if prog is None else then(prog, p)
        out.append((kind, u, (a, w, n, k, bias, epilogue(prog), residual, scale)))
        cur = u
    return out


def epilogue_check(node, ctx):
    return None if plan(node) else NO_MATCH


def claims(node, ctx) -> list:
    """The nodes after gemm `node` its epilogue will fold (partitioning leaves them out of regions)."""
    return [u for _, u, _ in plan(node)]


@rule(Stage.CONSUMER, GEMM, family="gemm", supported=epilogue_check, name="gemm_epilogue", claims=claims,
      priority=1, doc="scale / bias / elementwise steps / residual after a gemm -> its epilogue")
def fuse_epilogue(node, ctx):
    g = node
    steps = plan(g)
    for kind, user, args in steps:
        g.args = args
        user.replace_all_uses_with(g)
        ctx.absorb(g, [user], anchor=user)
        ctx.count(f"epilogue_{kind}")
    ctx.erase_unused([user for _, user, _ in steps])
    return g
