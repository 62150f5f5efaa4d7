"""A per-head RMSNorm right before RoPE folded into `flydsl.rope` (`norm_w0` / `norm_w1`, `norm_eps`).

Qwen3 (and Gemma3) normalize each head of q and k over head_dim between the QKV projection and RoPE:

    q = self.q_norm(self.q_proj(x).view(*shape, head_dim)).transpose(1, 2)    # flydsl.rms_norm(.., [D], w)
    k = self.k_norm(self.k_proj(x).view(*shape, head_dim)).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)                               # flydsl.rope (rope.py)

Lowered op by op that is two row-norm launches, and the two rotations read two different norm outputs, so
rope_cache.py cannot pair them (nor take the V write with them): 14 launches per Qwen3 layer at decode against
Llama's 8. This CONSUMER rule (priority 3, ahead of rope_casts.py and rope_cache.py; it folds every rotation
of the graph at once, so that q's and k's rotations read views of the one QKV output by the time rope_cache
looks for a partner) takes, for each rotation of one tensor:

    x = views of flydsl.rms_norm(y, [D], w, eps)   (the norm's output read only by those views, D = x's last
                                                    dim, the views keeping it the last and contiguous)
    -> flydsl.rope([views of y], ..., norm_w0=w, norm_eps=eps)

The views are rebuilt over y (each replayed on a meta tensor of y's strides: a reshape that would copy is
refused). The rope kernel normalizes each row in fp32 and rounds it to x's dtype, as flydsl.rms_norm returns it,
then rotates (translator_kernels/layout/rope_cache.py): the same numbers as the two ops. Rotate-half only (the
head row is the last dim); a norm without a weight, over more than its input's last dim, under a partial
rotation, or read by anything else stays its own launch. Counter `rope_norm` (norms folded).

OLMo2 normalizes q_proj's whole output row (all heads of a token) before the split into heads:

    q = self.q_norm(self.q_proj(x)).view(*shape, head_dim).transpose(1, 2)   # flydsl.rms_norm(.., [H * D], w)

The same rule takes it when the views split the norm's row into whole dims of x with x's last dim innermost
(here x's dims 1 and 3: `norm_dims=[1, 3]`, the weight indexed row-major over them); the kernel then reduces
each token's row in one workgroup. A rotation that reads only part of the row (some of the heads) keeps the norm.
Counter `rope_norm_all_heads` (of those folded, the ones over several dims).
"""

from __future__ import annotations

import torch

from ..graph import arg, getitem_of, set_args, size_hint, static_int, val
from ..registry import NO_MATCH, Match, Stage, rule
from .rope_cache import ROPE, _replay, _view_of, rope_folds
from .rope_casts import _rebuild, _single_user_chain

RMS = torch.ops.flydsl.rms_norm.default


def _norm_fold(r):
    """(norm node, its input, the view chain from the norm's output to x, the norm row's dims of x or None for
    x's last) when rope r's x is views of an RMSNorm over its input's last dim read by nothing else, the row
    x's last dim (a per-head norm) or x's last dim and others that make it up whole (a norm over all heads)."""
    if r.target is not ROPE or len(arg(r, "xs")) != 1 or arg(r, "norm_w0") is not None or arg(r, "pairs") \
            or arg(r, "rot_dim"):  # a partial rotation (rope_pass.py): the norm would span the passed features
        return None
    x = arg(r, "xs")[0]
    n = x
    while (b := _view_of(n)) is not None and getitem_of(n) is None:
        n = b
    if n.target is not RMS or len(n.users) != 1 or arg(n, "weight") is None:
        return None
    d, shape = static_int(val(x).shape[-1]), list(arg(n, "normalized_shape"))
    if d is None or len(shape) != 1 or static_int(val(n).shape[-1]) != shape[0]:
        return None
    chain = _single_user_chain(n, x) if x is not n else []
    if chain is None:
        return None
    y, out = val(arg(n, "x")), val(n)
    meta = torch.empty_strided([size_hint(s) for s in y.shape], [size_hint(s) for s in y.stride()],
                               dtype=y.dtype, device="meta")
    if chain and _replay(chain, meta) is None:
        return None  # a reshape that would copy the norm's input
    # the views keep the norm's row as x's last dim: replayed on the norm's (contiguous) output, unit stride
    rows = _replay(chain, torch.empty([size_hint(s) for s in out.shape], dtype=out.dtype, device="meta")) \
        if chain else torch.empty([size_hint(s) for s in out.shape], device="meta")
    if rows is None or rows.stride(-1) != 1 or rows.shape[-1] != d:
        return None
    if shape[0] == d:
        return n, arg(n, "x"), chain, None
    return (n, arg(n, "x"), chain, dims) if (dims := _row_dims(rows, x, shape[0])) is not None else None


def _row_dims(rows, x, length):
    """x's dims that make up one norm row of `length` elements, outermost first, when the views split the row
    into whole dims of x (rows: the views replayed on the norm's contiguous output), else None. Dims of one
    element are left out (a sequence of one here may be longer in another call; a static one adds nothing)."""
    inner = [d for d in range(rows.dim()) if rows.stride(d) < length and rows.shape[d] > 1]
    if any(static_int(val(x).shape[d]) is None for d in inner):
        return None  # a symbolic size inside the row: not a fixed split of the heads
    dims, acc = sorted(inner, key=lambda d: -rows.stride(d)), 1
    for d in dims[::-1]:
        if rows.stride(d) != acc:
            return None
        acc *= rows.shape[d]
    if acc != length or dims[-1] != rows.dim() - 1:
        return None
    return dims


def rope_norm_supported(node, ctx):
    folds = rope_folds(node, ctx, _norm_fold)
    return Match(folds=folds) if folds else NO_MATCH


@rule(Stage.CONSUMER, ROPE, family="rope", supported=rope_norm_supported, priority=3,
      doc="q_norm / k_norm (an RMSNorm per head row) before RoPE -> flydsl.rope normalizes, then rotates")
def fuse_rope_norm(node, ctx, m):
    for r, (norm, y, chain, dims) in m.folds.items():
        x = _rebuild(ctx, chain, y, r)
        set_args(r, xs=[x], norm_w0=arg(norm, "weight"), norm_eps=float(arg(norm, "eps")))
        if dims is not None:
            set_args(r, norm_dims=dims)
            ctx.count("rope_norm_all_heads")
        ctx.absorb(r, [norm])
        ctx.count("rope_norm")
        ctx.erase_unused([*chain[::-1], norm])
    return node
