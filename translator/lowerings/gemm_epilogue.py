"""GEMM epilogue fusion: fold what follows a `flydsl.gemm` into its epilogue.

The kernel's epilogue is ``out = program(scale * (a @ W.T) + bias) + residual`` in fp32, where
``program`` is a chain of per-element steps with scalar constants (translator_kernels.gemm.kernel
STEPS: mul/div/add/sub by a scalar, relu, gelu, silu, sigmoid, tanh, clamp, leaky_relu,
hardswish, softplus, ...). Walking forward from a gemm, in graph order, while the running
value has one user, each op is absorbed if it keeps the kernel's order exact:

    y = x @ W.t() * s                   scale      (only before bias / any step)
    y = torch.mm(x, W) + self.bias      bias       (only before any step)
    y = torch.sigmoid(y * 2.0)          steps      (ops whose only tensor operand is the running
    y = F.gelu(y).clamp(-1, 1)                      value, the rest scalars; a scale after the
                                                    bias is a step, not the scale argument)
    x = x + self.dropout(y)             residual   (last; eval dropout passes through anywhere)

so ``x + drop(proj(gelu(fc(h))))`` becomes two gemm nodes: fc with a gelu epilogue, proj with
the residual add. Every absorbed op keeps the gemm's dtype and shape. `plan` is the one
description of what gets absorbed: translator.passes.partition leaves exactly those nodes out
of elementwise regions. Under precision bf16/fp16 the gemm's output is cast back to the
model's dtype before its users; those gemms keep their epilogue unfused (the cast stands
between), which is correct, just not fused.
"""

from __future__ import annotations

import math

import torch

from translator_kernels.gemm.kernel import epilogue_text, parse_epilogue

from ..graph import aten, arg, before, dtype_of, shape_of
from ..registry import NO_MATCH, Stage, rule
from . import gemm  # noqa: F401  (registers flydsl.gemm, whose epilogue this is)

GEMM = torch.ops.flydsl.gemm.default
INF = math.inf


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _bounds(lo, hi):
    if lo is not None and not _num(lo) or hi is not None and not _num(hi):
        return None
    return ("clamp", (-INF if lo is None else float(lo), INF if hi is None else float(hi)))


# aten op -> (node -> (step name, params) or None); the op's first argument is the running value.
UNARY = {
    aten.gelu.default: lambda n: ("gelu_tanh" if arg(n, "approximate", "none") == "tanh" else "gelu", ()),
    aten.clamp.default: lambda n: _bounds(arg(n, "min"), arg(n, "max")),
    aten.clamp_min.default: lambda n: _bounds(n.args[1], None),
    aten.clamp_max.default: lambda n: _bounds(None, n.args[1]),
    aten.hardtanh.default: lambda n: _bounds(arg(n, "min_val", -1.0), arg(n, "max_val", 1.0)),
    aten.hardtanh_.default: lambda n: _bounds(arg(n, "min_val", -1.0), arg(n, "max_val", 1.0)),
    aten.relu6.default: lambda n: ("clamp", (0.0, 6.0)),
    aten.leaky_relu.default: lambda n: ("leaky_relu", (float(arg(n, "negative_slope", 0.01)),)),
    aten.softplus.default: lambda n: ("softplus", (float(arg(n, "beta", 1.0)), float(arg(n, "threshold", 20.0)))),
    aten.elu.default: lambda n: (("elu", (float(arg(n, "alpha", 1.0)),))
                                 if arg(n, "scale", 1.0) == 1 and arg(n, "input_scale", 1.0) == 1 else None),
}
for _name in ("relu", "silu", "sigmoid", "tanh", "neg", "abs", "exp", "mish", "hardswish", "hardsigmoid"):
    UNARY[getattr(aten, _name).default] = (lambda s: lambda n: (s, ()))(_name)
for _name in ("relu_", "silu_", "sigmoid_", "tanh_", "hardswish_", "hardsigmoid_"):  # nn.ReLU(inplace=True)
    UNARY[getattr(aten, _name).default] = (lambda s: lambda n: (s, ()))(_name[:-1])

MUL = (aten.mul.Tensor, aten.mul.Scalar)
DIV = (aten.div.Tensor, aten.div.Scalar)
ADD = (aten.add.Tensor, aten.add.Scalar)
SUB = (aten.sub.Tensor, aten.sub.Scalar)
SCALAR_PARAMS = {aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, aten.hardtanh.default,
                 aten.hardtanh_.default, aten.leaky_relu.default, aten.softplus.default, aten.elu.default}


def _identity_dropout(n) -> bool:
    return n.target is aten.dropout.default and not arg(n, "train", False)


def _classify(u, cur, g, fresh):
    """(kind, payload) for op `u` applied to the running value `cur`, or None (not absorbable).

    fresh: no bias and no step yet (a scalar multiply may still become the scale argument)."""
    t = u.target
    args = u.args
    if not args or args[0] is not cur and t not in MUL + ADD:
        return None
    if _identity_dropout(u):
        return "dropout", None
    if t in UNARY:
        if any(isinstance(a, torch.fx.Node) for a in list(args[1:]) + list(u.kwargs.values())):
            return None  # a tensor bound: not a per-element constant
        if t not in SCALAR_PARAMS and (len(args) > 1 or u.kwargs) and t is not aten.gelu.default:
            return None
        step = UNARY[t](u)
        return ("activation", step) if step else None
    alpha = u.kwargs.get("alpha", 1)
    if len(args) != 2 or set(u.kwargs) - {"alpha"} or not _num(alpha):
        return None
    other = args[1] if args[0] is cur else args[0]
    if _num(other):
        c = float(other)
        if t in MUL:
            return ("scale", c) if fresh else ("arith", ("mul", (c,)))
        if t in DIV and args[0] is cur:
            return "arith", ("div", (c,))
        if t in ADD:
            return "arith", ("add", (c * alpha,))
        if t in SUB and args[0] is cur:
            return "arith", ("sub", (c * alpha,))
        if t is aten.rsub.Scalar and alpha == 1:
            return "arith", ("rsub", (c,))
        return None
    if t is not aten.add.Tensor or alpha != 1 or not isinstance(other, torch.fx.Node) \
            or dtype_of(other) != dtype_of(g):
        return None
    so = [str(s) for s in shape_of(other) or ()]
    if fresh and g.args[4] is None and so == [str(g.args[2])]:
        return "bias", other
    if so == [str(s) for s in shape_of(g)] and before(other, g):
        return "residual", other
    return None


def plan(g) -> list:
    """What to fold into gemm node `g`, in graph order: [(kind, absorbed node, gemm args after it)]."""
    a, w, n, k, bias, act, residual, scale = g.args
    steps = list(parse_epilogue(act))
    out, cur = [], g
    while residual is None and len(cur.users) == 1:
        u = next(iter(cur.users))
        if u.op != "call_function" or dtype_of(u) != dtype_of(g) or \
                [str(s) for s in shape_of(u) or ()] != [str(s) for s in shape_of(g)]:
            break
        r = _classify(u, cur, g, bias is None and not steps)
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
            steps.append(p)
        out.append((kind, u, (a, w, n, k, bias, epilogue_text(steps), residual, scale)))
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
