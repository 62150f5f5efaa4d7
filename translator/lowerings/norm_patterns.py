"""Hand-written RMSNorm / LayerNorm -> `flydsl.rms_norm` / `flydsl.layer_norm` (or, when a residual
add feeds them and is used later, `flydsl.add_rms_norm` / `flydsl.add_layer_norm`: norm_residual.py).

Anchored on the statistic (``mean(x²)``, ``mean((x - mean)²)``, ``var``, ``var_mean``), the
matcher walks forward through what real code writes after it:

    v = h.to(torch.float32).pow(2).mean(-1, keepdim=True)            # HF LlamaRMSNorm, Mistral,
    h = h * torch.rsqrt(v + self.variance_epsilon)                   #   Qwen2, T5LayerNorm
    return self.weight * h.to(input_dtype)                           #   (weight after the cast)
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * self.weight
                                                                     # Meta llama/model.py RMSNorm
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w     # tutorials, older repos
    mu = x.mean(-1, keepdim=True); var = x.var(-1, keepdim=True, unbiased=False)
    y = (x - mu) / torch.sqrt(var + eps) * self.weight + self.bias   # hand-written LayerNorm
                                                                     #   (ConvNeXt channels_last,
                                                                     #    minGPT forks, var or
                                                                     #    mean((x-mu)²) or var_mean)

``eps`` added to the statistic, then ``rsqrt`` / ``pow(-0.5)`` times, or ``sqrt`` divided
(or ``reciprocal`` times); then, in any order, casts, one weight multiply (a tensor of the
normalized shape) and, for LayerNorm, one bias add. A widening cast of the input
(bf16/fp16 -> fp32) is undone: the kernel reads the input in its own dtype and keeps fp32
statistics. The result is `flydsl.rms_norm` / `flydsl.layer_norm` over the reduced dims.

Stays in PyTorch with a reason: float64 or integer input / weight, a norm over dims that are
not the trailing ones (ConvNeXt channels_first ``x.mean(1, keepdim=True)``), dynamic
normalized dims, the unbiased variance, statistics that are also used outside the norm.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from ..graph import (CASTS, FLOAT_DTYPES, arg, asserts, aten, dtype_of, dtype_reason, in_order, is_call, same_shape,
                     getitem_of, shape_of, static_int, users)
from ..registry import NO_MATCH, Match, Reason, Stage, rule
from . import norm  # noqa: F401  (registers the norm families this rule lowers to)

Node = torch.fx.Node
STATS = (aten.mean.dim, aten.var.dim, aten.var.correction, aten.var_mean.correction)
RULE = {"rms": "rms_norm_handwritten", "layer": "layer_norm_handwritten"}


@dataclass
class NormMatch:
    kind: str  # "rms" | "layer"
    x: Node  # the tensor normalized, before any widening cast
    dims: tuple  # reduced dims, non-negative, sorted
    eps: float
    root: Node  # the last node of the norm; its uses get the FlyDSL result
    core: list  # statistic .. root: must all be absorbed
    inputs: list  # casts of x, x - mean, mean: absorbed when nothing else reads them
    weight: Node | None = None
    bias: Node | None = None
    correction: int = 0


# --- small graph predicates ----------------------------------------------------------------

def _only_user(n):
    us = users(n)
    return us[0] if len(us) == 1 else None


def _next(n, pred):
    """The one user of n that pred accepts (other users are checked when absorbing), else None."""
    us = [u for u in users(n) if pred(u)]
    return us[0] if len(us) == 1 else None


def _scalar(x):
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _is_cast(n) -> bool:
    if not is_call(n, *CASTS):
        return False
    if n.target is aten._to_copy.default:
        return set(n.kwargs) <= {"dtype"} and len(n.args) == 1
    if n.target is aten.to.dtype_layout:
        return set(n.kwargs) <= {"dtype", "layout", "device"} and len(n.args) == 1
    return True


def _other(n, x):
    """The operand of binary aten call `n` ("self" / "other") that is not x."""
    return arg(n, "other") if arg(n, "self") is x else arg(n, "self")


def _widening(src, dst) -> bool:
    return src == dst or (src in (torch.bfloat16, torch.float16) and dst == torch.float32)


def _origin(n):
    """x such that n is x through exact (widening or no-op) casts, and the casts walked."""
    chain = []
    while _is_cast(n) and _widening(dtype_of(arg(n, "self")), dtype_of(n)):
        chain.append(n)
        n = arg(n, "self")
    return n, chain


def _dims(x, dims) -> tuple | None:
    rank = len(shape_of(x) or ())
    if rank == 0:
        return None
    if dims is None or dims == []:
        return tuple(range(rank))
    dims = [dims] if isinstance(dims, int) else dims
    return tuple(sorted({d % rank for d in dims}))


def _is_mean_of(m, x, dims) -> bool:
    """m == x.mean(dims, keepdim=True), or the mean output of torch.var_mean(x, dims, keepdim=True)."""
    if is_call(m, aten.mean.dim):
        s = arg(m, "self")
        return _origin(s)[0] is _origin(x)[0] and arg(m, "keepdim") and _dims(s, arg(m, "dim")) == dims
    vm, j = getitem_of(m) or (None, None)
    if j == 1 and is_call(vm, aten.var_mean.correction):
        s = arg(vm, "self")
        return _origin(s)[0] is _origin(x)[0] and arg(vm, "keepdim") and _dims(s, arg(vm, "dim")) == dims
    return False


# --- the matcher -----------------------------------------------------------------------------

def _statistic(anchor):
    """(kind, x, dims, mean, stat node, nodes, correction) for a norm statistic, else None."""
    if is_call(anchor, aten.mean.dim):
        if not arg(anchor, "keepdim") or arg(anchor, "dtype") is not None:
            return None
        sq = arg(anchor, "self")
        if is_call(sq, aten.pow.Tensor_Scalar) and arg(sq, "exponent") == 2 or is_call(sq, aten.square.default):
            b = arg(sq, "self")
        elif is_call(sq, aten.mul.Tensor) and arg(sq, "self") is arg(sq, "other"):
            b = arg(sq, "self")
        else:
            return None
        dims = _dims(sq, arg(anchor, "dim"))
        if _only_user(sq) is not anchor:
            return None
        if is_call(b, aten.sub.Tensor) and _is_mean_of(arg(b, "other"), arg(b, "self"), dims):
            return "layer", arg(b, "self"), dims, arg(b, "other"), anchor, [sq, anchor], 0, [b]
        return "rms", b, dims, None, anchor, [sq, anchor], 0, []
    if is_call(anchor, aten.var.dim, aten.var.correction):
        x = arg(anchor, "self")
        dims = _dims(x, arg(anchor, "dim"))
        if anchor.target is aten.var.dim:
            keep, corr = arg(anchor, "keepdim"), int(bool(arg(anchor, "unbiased")))
        else:
            c = arg(anchor, "correction")
            keep, corr = arg(anchor, "keepdim"), 1 if c is None else c
        return ("layer", x, dims, None, anchor, [anchor], corr, []) if keep else None
    if is_call(anchor, aten.var_mean.correction) and arg(anchor, "keepdim"):
        x = arg(anchor, "self")
        dims = _dims(x, arg(anchor, "dim"))
        gets = {getitem_of(u)[1]: u for u in anchor.users if is_call(u, operator.getitem)}
        if 0 not in gets or 1 not in gets:
            return None
        c = arg(anchor, "correction")
        return "layer", x, dims, gets[1], gets[0], [anchor, gets[0]], 1 if c is None else c, [gets[1]]
    return None


def _param_ok(p, x, dims) -> bool:
    """p is a per-element tensor of the normalized shape (leading size-1 dims allowed)."""
    if not isinstance(p, Node) or shape_of(p) is None:
        return False
    want = [str(shape_of(x)[d]) for d in dims]
    ps = [str(s) for s in shape_of(p)]
    while len(ps) > len(want) and ps[0] == "1":
        ps = ps[1:]
    return ps == want and len(shape_of(p)) <= len(shape_of(x))


def match(anchor, ctx):
    """A NormMatch, or False when this statistic is not the start of a norm."""
    st = _statistic(anchor)
    if st is None:
        return False
    kind, x, dims, mean, stat, core, corr, inputs = st
    if dims is None:
        return False
    e = _next(stat, lambda u: is_call(u, aten.add.Tensor, aten.add.Scalar) and arg(u, "alpha") == 1
              and _scalar(_other(u, stat)) is not None)
    if e is None:
        return False
    eps = _scalar(_other(e, stat))
    core.append(e)
    f = _next(e, lambda u: is_call(u, aten.rsqrt.default, aten.sqrt.default)
              or is_call(u, aten.pow.Tensor_Scalar) and arg(u, "exponent") == -0.5)
    if f is None:
        return False
    core.append(f)
    inv, op = f, aten.mul.Tensor
    if f.target is aten.sqrt.default:
        g = _next(f, lambda u: is_call(u, aten.reciprocal.default))
        if g is not None:
            inv = g
            core.append(g)
        else:
            op = aten.div.Tensor
    n = _next(inv, lambda u: is_call(u, op) and (op is aten.mul.Tensor or arg(u, "other") is inv))
    if n is None:
        return False
    num = _other(n, inv)
    if kind == "rms":
        if _origin(num)[0] is not _origin(x)[0]:
            return False
        x, xcasts = _origin(x)
        inputs += xcasts + _origin(num)[1]
    else:
        if not (is_call(num, aten.sub.Tensor) and _origin(arg(num, "self"))[0] is _origin(x)[0]):
            return False
        if mean is None:
            mean = arg(num, "other")
            if not _is_mean_of(mean, x, dims):
                return False
        elif arg(num, "other") is not mean:
            return False
        x, xcasts = _origin(x)
        inputs += [num, mean, *_origin(arg(num, "self"))[1], *xcasts]
        if is_call(mean, operator.getitem):
            inputs.append(getitem_of(mean)[0])
        elif is_call(mean, aten.mean.dim):
            inputs += _origin(arg(mean, "self"))[1]
    core.append(n)
    m = NormMatch(kind, x, dims, float(eps), n, core, inputs, correction=corr)
    _epilogue(m)
    return m


def _epilogue(m: NormMatch) -> None:
    """Absorb casts, one weight multiply and (LayerNorm) one bias add after the normalized value."""
    cur = m.root
    while (u := _only_user(cur)) is not None:
        other = _other(u, cur) if is_call(u, aten.mul.Tensor, aten.add.Tensor) else None
        if _is_cast(u) and arg(u, "self") is cur:
            pass
        elif dtype_of(u) != dtype_of(cur):
            break  # a wider weight promotes a value eager rounded first: keep that multiply as written
        elif is_call(u, aten.mul.Tensor) and m.weight is None and m.bias is None and _param_ok(other, m.x, m.dims) \
                and same_shape(u, cur):
            m.weight = other
        elif is_call(u, aten.add.Tensor) and m.kind == "layer" and m.bias is None and arg(u, "alpha") == 1 \
                and _param_ok(other, m.x, m.dims) and same_shape(u, cur):
            m.bias = other
        else:
            break
        m.core.append(u)
        cur = u
    m.root = cur


def _absorb(m: NormMatch):
    """The nodes the rewrite removes, or the reason a core node cannot go."""
    keep = set(m.core) | {n for n in m.inputs if isinstance(n, Node)}
    changed = True
    while changed:
        changed = False
        for n in list(keep):
            if n is not m.root and any(u not in keep for u in users(n)):
                keep.discard(n)
                changed = True
    for n in m.core:
        if n not in keep:
            return f"{n.name} ({n.target}) inside the norm is also used outside it"
    return [a for n in in_order(keep) for a in (*asserts(n), n)]


def _norm_checks(m: NormMatch, ctx):
    """None, or the reason this norm cannot run as a row kernel."""
    xs = shape_of(m.x)
    rank = len(xs)
    if m.dims != tuple(range(rank - len(m.dims), rank)):
        return (f"normalizes over dim(s) {list(m.dims)} of a {rank}-D tensor {[str(s) for s in xs]}; the row "
                f"kernels normalize the trailing dims (contiguous rows), not these")
    if m.kind == "layer" and m.correction != 0:
        return (f"the variance uses correction={m.correction} (unbiased); LayerNorm divides by N "
                "(unbiased=False / correction=0)")
    r = dtype_reason(m.x)
    if r:
        return r
    if dtype_of(m.root) not in FLOAT_DTYPES:
        return dtype_reason(m.root, "output")
    for p, what in ((m.weight, "weight"), (m.bias, "bias")):
        if p is not None and dtype_reason(p, what):
            return dtype_reason(p, what)
    if any(static_int(xs[d]) is None for d in m.dims):
        return f"normalized dims {[str(xs[d]) for d in m.dims]} are dynamic (the kernel is specialized on N)"
    return None


# --- the hand-written rule -------------------------------------------------------------------

def param_arg(ctx, p, shape, at):
    """p reshaped to `shape` (from [1, .., N]) and cast to the compute dtype."""
    if p is None:
        return None
    if [str(s) for s in shape_of(p)] != [str(s) for s in shape]:
        p = ctx.insert(aten.reshape.default, p, list(shape), before=at)
    return ctx.cast_in(p, at)


def handwritten_supported(node, ctx, kind=None):
    """The matched norm (of `kind`, when given) and what it absorbs, or the reason it stays; the
    report shows a reason on every op of the norm, not only on the statistic."""
    m = match(node, ctx)
    if m is False or kind is not None and m.kind != kind:
        return NO_MATCH
    absorbed = _absorb(m)
    reason = absorbed if isinstance(absorbed, str) else ctx.denied(absorbed) or _norm_checks(m, ctx)
    if reason:
        return Reason(reason, also=[n for n in m.core if n is not node])
    return Match(norm=m, absorbed=absorbed)


def _for(kind):
    def supported(node, ctx):
        return handwritten_supported(node, ctx, kind)
    return supported


@rule(Stage.PATTERN, *STATS, family="rms_norm", supported=_for("rms"), name=RULE["rms"],
      doc="x·rsqrt(mean(x²)+eps)·w, x/sqrt(mean(x·x)+eps), fp32 upcast / cast back (+ residual add)")
@rule(Stage.PATTERN, *STATS, family="layer_norm", supported=_for("layer"), name=RULE["layer"],
      doc="(x-mean)/sqrt(var+eps)·w+b, var biased or mean((x-mean)²) (+ residual add)")
def lower_handwritten(node, ctx, found):
    m, absorbed = found.norm, found.absorbed
    shape = [static_int(shape_of(m.x)[d]) for d in m.dims]
    out = dtype_of(m.root)
    x = m.x if m.x.meta["val"].dtype.itemsize >= out.itemsize else ctx.cast(m.x, out, m.root)
    args = (ctx.cast_in(x, m.root), shape, param_arg(ctx, m.weight, shape, m.root))
    if m.kind == "layer":
        args += (param_arg(ctx, m.bias, shape, m.root),)
    family = "layer_norm" if m.kind == "layer" else "rms_norm"
    return ctx.replace(m.root, family, f"{family}_handwritten", args + (m.eps,), absorbed)
