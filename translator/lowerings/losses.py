"""Loss functions through their decomposition into elementwise ops and reductions.

A DECOMPOSE-stage rewrite replaces each aten loss node by the aten ops that define it; the later
stages then lower those as usual: the reduction becomes `flydsl.fused_reduce`, the
elementwise ops a fused region, and the consumer rule `reduce_prologue` (fold.py) folds the
region into the reduction. So ``F.mse_loss(x, y)`` becomes one kernel computing mean((x - y)^2), and
``F.triplet_margin_loss`` three (two distance norms with their differences fused in, then the
hinge and mean). Where real models have them: training / evaluation heads (regression:
mse / l1 / smooth_l1 / huber; distillation: kl_div; classification: cross_entropy;
metric learning: hinge_embedding / triplet_margin).

    mse            mean((x - y)^2)                l1         mean(|x - y|)
    smooth_l1(b)   z < b ? 0.5 z^2 / b : z - 0.5 b   (z = |x - y|; b = 0 is l1)
    huber(d)       z < d ? 0.5 z^2 : d (z - 0.5 d)
    kl_div         xlogy(t, t) - t * x,  or exp(t) (t - x) with log_target
    hinge_emb(m)   (y != 1 ? relu(m - x) : 0) + (y != -1 ? x : 0)
    cross_entropy  logsumexp(x, 1) - x[target] where target != ignore_index; mean over valid
                   targets (class indices); -sum(t * log_softmax(x), 1) for probability targets
    triplet(m, p)  relu(m + ||a - p + eps||_p - ||a - n + eps||_p)
A `reduction` of none / mean / sum follows (0 / 1 / 2, torch's enum).
"""

from __future__ import annotations

import torch

from ..graph import aten, arg, val
from ..registry import Stage, rule
from . import reduce  # noqa: F401  (registers fused_reduce, the family losses lower to)

_FLOAT = (torch.float32, torch.bfloat16, torch.float16)


class _Emit:
    """Inserts aten nodes before `node`, each with its fake metadata."""

    def __init__(self, ctx, node):
        self.ctx, self.node = ctx, node

    def __call__(self, target, *args, **kwargs):
        return self.ctx.insert(target, *args, before=self.node, **kwargs)

    def zeros_like(self, x):
        return self(aten.mul.Tensor, x, 0.0)

    def reduce(self, x, reduction):
        if reduction == 1:
            return self(aten.mean.default, x)
        if reduction == 2:
            return self(aten.sum.default, x)
        return x


def _finish(ctx, node, out, name):
    out = ctx.cast(out, val(node).dtype, node)
    node.replace_all_uses_with(out)
    ctx.gm.graph.erase_node(node)
    ctx.count(f"loss_{name}")
    return out


def _pointwise(e, node):
    """The unreduced loss of the pointwise losses (regression / divergence / hinge)."""
    t = node.target
    x, y = arg(node, "self"), arg(node, "target")
    if t is aten.kl_div.default:
        if arg(node, "log_target", False):
            return e(aten.mul.Tensor, e(aten.exp.default, y), e(aten.sub.Tensor, y, x))
        tlogt = e(aten.mul.Tensor, y, e(aten.log.default, y))
        xlogy = e(aten.where.self, e(aten.eq.Scalar, y, 0.0), e.zeros_like(y), tlogt)
        return e(aten.sub.Tensor, xlogy, e(aten.mul.Tensor, y, x))
    if t is aten.hinge_embedding_loss.default:
        margin = float(arg(node, "margin", 1.0))
        z = e.zeros_like(x)
        m = e(aten.where.self, e(aten.ne.Scalar, y, 1.0), e(aten.relu.default, e(aten.rsub.Scalar, x, margin)), z)
        s = e(aten.where.self, e(aten.ne.Scalar, y, -1.0), x, z)
        return e(aten.add.Tensor, m, s)
    d = e(aten.sub.Tensor, x, y)
    if t is aten.mse_loss.default:
        return e(aten.mul.Tensor, d, d)
    z = e(aten.abs.default, d)
    if t is aten.l1_loss.default:
        return z
    if t is aten.smooth_l1_loss.default:
        beta = float(arg(node, "beta", 1.0))
        if beta == 0:
            return z
        quad = e(aten.mul.Tensor, e(aten.mul.Tensor, z, z), 0.5 / beta)
        return e(aten.where.self, e(aten.lt.Scalar, z, beta), quad, e(aten.sub.Tensor, z, 0.5 * beta))
    delta = float(arg(node, "delta", 1.0))  # huber
    quad = e(aten.mul.Tensor, e(aten.mul.Tensor, z, z), 0.5)
    lin = e(aten.mul.Tensor, e(aten.sub.Tensor, z, 0.5 * delta), delta)
    return e(aten.where.self, e(aten.lt.Scalar, z, delta), quad, lin)


POINTWISE = (aten.mse_loss.default, aten.l1_loss.default, aten.smooth_l1_loss.default, aten.huber_loss.default,
             aten.kl_div.default, aten.hinge_embedding_loss.default)


def _float_args(node, names):
    for a in (arg(node, k) for k in names):
        v = val(a)
        if not isinstance(v, torch.Tensor) or v.dtype not in _FLOAT:
            return f"argument {getattr(a, 'name', a)} is not a float32 / bfloat16 / float16 tensor"
    return None


def pointwise_supported(node, ctx):
    r = _float_args(node, ("self", "target"))
    if r:
        return r
    x, y = val(arg(node, "self")), val(arg(node, "target"))
    if tuple(x.shape) != tuple(y.shape) and node.target is not aten.kl_div.default:
        return "input and target shapes differ (torch broadcasts them with a warning)"
    return None


@rule(Stage.DECOMPOSE, *POINTWISE, family="fused_reduce", supported=pointwise_supported, name="loss_pointwise",
      doc="mse / l1 / smooth_l1 / huber / kl_div / hinge_embedding -> elementwise + reduction")
def lower_pointwise(node, ctx):
    e = _Emit(ctx, node)
    loss = _pointwise(e, node)
    red = arg(node, "reduction", 1)
    return _finish(ctx, node, e.reduce(loss, red), node.target._overloadpacket.__name__)


def cross_entropy_supported(node, ctx):
    x, t = val(arg(node, "self")), val(arg(node, "target"))
    if x.dtype not in _FLOAT:
        return f"logits dtype {x.dtype} is not supported"
    if x.dim() < 2:
        return "unbatched logits (1-D) stay in PyTorch"
    if arg(node, "weight", None) is not None:
        return "class weights stay in PyTorch"
    if float(arg(node, "label_smoothing", 0.0)) != 0.0:
        return "label_smoothing > 0 stays in PyTorch"
    if t.dtype in _FLOAT and tuple(t.shape) != tuple(x.shape):
        return "probability targets must have the logits' shape"
    if t.dtype not in _FLOAT and t.dtype not in (torch.int64, torch.int32):
        return f"target dtype {t.dtype} is not supported"
    return None


@rule(Stage.DECOMPOSE, aten.cross_entropy_loss.default, family="fused_reduce", supported=cross_entropy_supported,
      name="loss_cross_entropy", doc="cross_entropy -> logsumexp + gather (PyTorch) + masked mean")
def lower_cross_entropy(node, ctx):
    """Class indices: logsumexp(x, 1) - x.gather(1, t) over valid targets (the gather and the
    integer mask stay in PyTorch); probability targets: sum(t * (lse - x), 1)."""
    e = _Emit(ctx, node)
    x, t = arg(node, "self"), arg(node, "target")
    red = arg(node, "reduction", 1)
    if val(t).dtype in _FLOAT:
        lse = e(aten.logsumexp.default, x, [1], True)
        loss = e(aten.sum.dim_IntList, e(aten.mul.Tensor, t, e(aten.sub.Tensor, lse, x)), [1])
        return _finish(ctx, node, e.reduce(loss, red), "cross_entropy")
    ignore = int(arg(node, "ignore_index", -100))
    lse = e(aten.logsumexp.default, x, [1])
    valid = e(aten.ne.Scalar, t, ignore)
    safe = e(aten.mul.Tensor, t, valid)  # ignored targets read class 0, masked below
    picked = e(aten.squeeze.dim, e(aten.gather.default, x, 1, e(aten.unsqueeze.default, safe, 1)), 1)
    nll = e(aten.sub.Tensor, lse, picked)
    loss = e(aten.where.self, valid, nll, e.zeros_like(nll))
    if red == 1:
        count = e(aten.sum.default, e(aten._to_copy.default, valid, dtype=val(x).dtype))
        out = e(aten.div.Tensor, e(aten.sum.default, loss), count)
    else:
        out = e.reduce(loss, red)
    return _finish(ctx, node, out, "cross_entropy")


def triplet_supported(node, ctx):
    r = _float_args(node, ("anchor", "positive", "negative"))
    if r:
        return r
    if arg(node, "swap", False):
        return "swap=True stays in PyTorch"
    return None


@rule(Stage.DECOMPOSE, aten.triplet_margin_loss.default, family="fused_reduce", supported=triplet_supported,
      name="loss_triplet_margin", doc="triplet_margin -> two vector norms + hinge + mean")
def lower_triplet(node, ctx):
    e = _Emit(ctx, node)
    a, pos, neg = arg(node, "anchor"), arg(node, "positive"), arg(node, "negative")
    margin, p = float(arg(node, "margin", 1.0)), float(arg(node, "p", 2.0))
    eps = float(arg(node, "eps", 1e-6))

    def dist(u, v):
        return e(aten.linalg_vector_norm.default, e(aten.add.Tensor, e(aten.sub.Tensor, u, v), eps), p, [-1])

    diff = e(aten.sub.Tensor, e(aten.add.Tensor, dist(a, pos), margin), dist(a, neg))
    loss = e(aten.clamp_min.default, diff, 0.0)
    return _finish(ctx, node, e.reduce(loss, arg(node, "reduction", 1)), "triplet_margin")
