"""Gemma's sandwich norms: a post-norm, the residual add and the next pre-norm as one row-norm launch.

Gemma 2 / 3 normalize a sublayer's output before adding it to the residual stream, and the sum again before the
next sublayer:

    h = residual + self.post_attention_layernorm(self.o_proj(attn))    # flydsl.rms_norm(o, [N], w0)
    residual = h; h = self.pre_feedforward_layernorm(h)               # add_rms_norm (norm_residual.py)

Lowered rule by rule that is two launches after the O GEMM (a row norm, then the add + norm that
norm_residual.py makes), and the same after the down GEMM (post-feedforward norm, then the add and the next
layer's input norm): 10 launches per Gemma layer at decode against Llama's 8. This CONSUMER rule, on the post-norm
p (visited before the pre-norm q, which still reads a plain add), takes

    p = flydsl.rms_norm(x, [N], w0, eps0)       read only by the add
    s = r + p  (or p + r)                       also read elsewhere (the residual stream), as add_rms_norm takes it
    q = flydsl.rms_norm(s, [N], w1, eps1)
    -> s, q = flydsl.norm_add_rms_norm(x, r, [N], w0, w1, eps0, eps1)

one launch (translator_kernels/rows/norm.py, `pre_w`): the kernel normalizes x's row, rounds it to x's dtype as
flydsl.rms_norm returns it, adds r and rounds as eager's add, then normalizes the sum: the numbers of the three
ops. Both outputs contiguous, as add_rms_norm's. The last layer's post-feedforward norm, add and the model's final
norm have the same form with the sum read by the final norm alone: the same launch, its stored sum unread (one row
written per token that nothing reads; the kernel has no form without it). A norm without a weight, a cast between
(precision policies), a post-norm read elsewhere or a norm over other dims keeps its form. Counter `norm_sandwich`.

OLMo2 has the post-norms without the pre-norms: `h = residual + self.post_attention_layernorm(self.o_proj(..))`,
the sum read by the next GEMM directly. A second rule (priority 0, after the sandwich) takes

    p = flydsl.rms_norm(x, [N], w0, eps0)       read only by the add
    s = r + p  (or p + r)                       of one shape and dtype
    -> s = flydsl.norm_add(x, r, [N], w0, eps0)

the same kernel storing the sum alone (`sum_only`): a row norm and an elementwise add were 2 launches, twice per
OLMo2 layer. Its `claims` keep such an add out of the elementwise regions (partition.py), so the rule finds it
as an aten add. Counter `norm_add`.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from ..graph import arg, asserts, aten, dtype_of, is_call, same_shape, users
from ..registry import NO_MATCH, Match, OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch
from .norm import _rows, ref_rms_norm
from .norm_residual import _parts

RMS = torch.ops.flydsl.rms_norm.default


@torch.library.custom_op("flydsl::norm_add_rms_norm", mutates_args=())
def norm_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, normalized_shape: List[int],
                      pre_weight: torch.Tensor, weight: Optional[torch.Tensor], pre_eps: float,
                      eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    return dispatch("norm_add_rms_norm", x, residual, normalized_shape, pre_weight, weight, pre_eps, eps)


@norm_add_rms_norm.register_fake
def _(x, residual, normalized_shape, pre_weight, weight, pre_eps, eps):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format))


def ref_norm_add_rms_norm(x, residual, normalized_shape, pre_weight, weight, pre_eps, eps):
    s = (residual + ref_rms_norm(x, normalized_shape, pre_weight, pre_eps)).contiguous()
    return s, ref_rms_norm(s, normalized_shape, weight, eps).contiguous()


def kernel_norm_add_rms_norm(x, residual, normalized_shape, pre_weight, weight, pre_eps, eps):
    from translator_kernels.rows.norm import norm_add_rms_norm as run

    x2, n = _rows(x, normalized_shape)
    s, y = run(x2, residual.reshape(-1, n), pre_weight.reshape(n), weight.reshape(n) if weight is not None else None,
               pre_eps, eps)
    return s.reshape(x.shape), y.reshape(x.shape)


register_family(OpFamily(
    name="norm_add_rms_norm", description="(r + RMSNorm(x), RMSNorm(r + RMSNorm(x))) in one pass: a sandwich norm",
    reference=ref_norm_add_rms_norm, kernel=kernel_norm_add_rms_norm,
    kernel_entry="translator_kernels.rows.norm:norm_add_rms_norm",
    sample_inputs=lambda dt: (torch.randn(4, 48).to(dt), torch.randn(4, 48).to(dt), [48], torch.randn(48).to(dt),
                              torch.randn(48).to(dt), 1e-6, 1e-6),
))


@torch.library.custom_op("flydsl::norm_add", mutates_args=())
def norm_add(x: torch.Tensor, residual: torch.Tensor, normalized_shape: List[int], weight: torch.Tensor,
             eps: float) -> torch.Tensor:
    return dispatch("norm_add", x, residual, normalized_shape, weight, eps)


@norm_add.register_fake
def _(x, residual, normalized_shape, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def ref_norm_add(x, residual, normalized_shape, weight, eps):
    return (residual + ref_rms_norm(x, normalized_shape, weight, eps)).contiguous()


def kernel_norm_add(x, residual, normalized_shape, weight, eps):
    from translator_kernels.rows.norm import norm_add as run

    x2, n = _rows(x, normalized_shape)
    return run(x2, residual.reshape(-1, n), weight.reshape(n), eps).reshape(x.shape)


register_family(OpFamily(
    name="norm_add", description="r + RMSNorm(x) in one pass: a post-norm and its residual add",
    reference=ref_norm_add, kernel=kernel_norm_add, kernel_entry="translator_kernels.rows.norm:norm_add",
    sample_inputs=lambda dt: (torch.randn(4, 48).to(dt), torch.randn(4, 48).to(dt), [48], torch.randn(48).to(dt), 1e-6),
))


def _post_add(p):
    """(add, the residual addend) when post-norm p (with a weight) is read only by an add of one shape and dtype."""
    if p.target is not RMS or arg(p, "weight") is None or len(users(p)) != 1:
        return None
    add = users(p)[0]
    if not is_call(add, aten.add.Tensor) or arg(add, "alpha", 1) != 1:
        return None
    a, b = arg(add, "self"), arg(add, "other")
    r = b if a is p else a if b is p else None
    if not isinstance(r, torch.fx.Node) or r is p or not same_shape(r, p) or not same_shape(add, p) \
            or not dtype_of(arg(p, "x")) == dtype_of(r) == dtype_of(add) == dtype_of(p):
        return None
    return add, r


def _sandwich(p, ctx):
    """(add, the residual addend, pre-norm q) when post-norm p feeds a residual add read by a pre-norm q as
    norm_residual.py's add_rms_norm takes it, or by q alone, else None."""
    found = _post_add(p)
    if found is None:
        return None
    add, r = found
    qs = [u for u in users(add) if u.target is RMS]
    if len(qs) != 1:
        return None
    q = qs[0]
    if users(add) == [q]:  # the sum read by the norm alone (Gemma's last layer and the final norm): its s unread
        if arg(q, "x") is not add or ctx.denied([add]):
            return None
    else:
        parts = _parts(q, ctx)
        if parts is None or parts[0] is not add or parts[1] is not None:
            return None
    if list(arg(p, "normalized_shape")) != list(arg(q, "normalized_shape")):
        return None
    return add, r, q


def norm_sandwich_supported(node, ctx):
    found = _sandwich(node, ctx)
    if found is None:
        return NO_MATCH
    return ctx.denied([node, *found[::2]]) or Match(add=found[0], r=found[1], q=found[2])


@rule(Stage.CONSUMER, RMS, family="norm_add_rms_norm", supported=norm_sandwich_supported, priority=1,
      doc="r + rms_norm(x) read by rms_norm and more -> (sum, norm) with the first norm in the same launch")
def fuse_norm_sandwich(p, ctx, m):
    add, r, q = m.add, m.r, m.q
    info = q.meta["flydsl"]
    args = (arg(p, "x"), r, list(arg(q, "normalized_shape")), arg(p, "weight"), arg(q, "weight"),
            float(arg(p, "eps")), float(arg(q, "eps")))
    new, (s, y) = ctx.emit("norm_add_rms_norm", args, lowering="norm_sandwich", sources=[add], anchor=info["anchor"],
                           before=q, output_anchors=(add, info["anchor"]))
    ctx.absorb(new, [p, q])
    q.replace_all_uses_with(y)
    add.replace_all_uses_with(s)
    ctx.erase_unused([a for n in (q, add, p) for a in (*asserts(n), n)])  # with their dtype checks
    return new


def norm_add_supported(node, ctx):
    found = _post_add(node)
    if found is None:
        return NO_MATCH
    return ctx.denied([node, found[0]]) or Match(add=found[0], r=found[1])


def norm_add_claims(node, ctx) -> list:
    """The add this rule will take: kept out of the elementwise regions."""
    found = _post_add(node)
    return [found[0]] if found is not None else []


@rule(Stage.CONSUMER, RMS, family="norm_add", supported=norm_add_supported, claims=norm_add_claims,
      doc="r + rms_norm(x) (a post-norm's residual add) -> one row-norm launch storing the sum")
def fuse_norm_add(p, ctx, m):
    add, r = m.add, m.r
    args = (arg(p, "x"), r, list(arg(p, "normalized_shape")), arg(p, "weight"), float(arg(p, "eps")))
    new = ctx.emit("norm_add", args, lowering="norm_add", sources=[add], anchor=add, before=add)
    ctx.absorb(new, [p])
    add.replace_all_uses_with(new)
    ctx.erase_unused([a for n in (add, p) for a in (*asserts(n), n)])
    return new
