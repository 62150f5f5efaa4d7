"""gpt-oss's experts (HF `GptOssExperts`, grouped-mm form) -> `flydsl.moe_experts` with biases and an up program.

HF marks these experts `is_transposed=True, has_bias=True, is_concatenated=False`; its grouped-mm
forward (transformers `grouped_mm_experts_forward`) then reads, matched at the final sum:

    ids_g, perm = sort(ids.reshape(-1));  xs = x[perm // k]
    offs = cumsum(histc(ids_g))                                          (then dead)
    gu = grouped_mm(xs, gate_up_proj, offs).add_(gate_up_proj_bias[ids_g])   gate_up_proj [E, H, 2I]
    g, u = gu[..., ::2], gu[..., 1::2]                                   interleaved gate / up columns
    c = clamp(g, max=L);  h = (clamp(u, -L, L) + 1) * (c * sigmoid(c * alpha))
    y = grouped_mm(h, down_proj, offs).add_(down_proj_bias[ids_g]) * weights.reshape(-1)[perm].unsqueeze(-1)
    out = y[inv].view(T, k, H).sum(1)                                    (inv: the inverse permutation)

The weights are used as stored (x @ W, no transpose). -> `moe_experts(x, weights, ids, W13, W2, I,
gate, ..., up, b13, b2)` with the gate / up programs of `moe.gpt_oss_programs(alpha, L)` and the
weights and biases de-interleaved and arranged once (`moe.prepare_gpt_oss_experts`), rebuilt if a
parameter changes. Counter: `moe_experts_gpt_oss` (under precision="fp8": `moe_experts_fp8_gpt_oss`, the
fp8 experts of moe_fp8.py with the same biases and programs). The module's own loop forward (no
experts_implementation: `one_hot`, `where`, `index_add_`) is not matched.
"""

from __future__ import annotations

from translator_kernels import moe as K

from ..graph import arg, aten, dtype_of, shape_of
from ..registry import NO_MATCH, Match, Stage, rule
from . import moe_fp8
from .moe import _erase_dead, _gmm, _is, _item, _one_index, _pair, _skip_to, _src, experts_fit, unpermuted_sum

ADDS = (aten.add.Tensor, aten.add_.Tensor)
_BIG = 2 ** 62


def _biased(n, ctx, sorted_ids=None):
    """(grouped-mm node, bias parameter, bias index node) of grouped_mm(...) + bias[sorted ids], else None."""
    if not _is(n, *ADDS) or arg(n, "alpha", 1) != 1:
        return None
    mm, sel = arg(n, "self"), arg(n, "other")
    if _gmm(mm) is None or not _is(sel, aten.index.Tensor):
        return None
    b, idx = ctx.constant(_src(sel)), _one_index(sel)
    if b is None or b.dim() != 2 or idx is None or (sorted_ids is not None and idx is not sorted_ids):
        return None
    return mm, b, sel


def _slice2(n, start):
    """The source of n = src[..., start::2] (dim 1 or -1 of a 2-d tensor), else None."""
    if not _is(n, aten.slice.Tensor) or arg(n, "step", 1) != 2 or arg(n, "start", 0) != start:
        return None
    if arg(n, "dim", 0) not in (1, -1) or (arg(n, "end") or _BIG) < _BIG // 2:
        return None
    return _src(n)


def _const(n):
    return n if isinstance(n, (int, float)) and not isinstance(n, bool) else None


def _gate_chain(h):
    """(gate_up node, alpha, limit, nodes) of h = (clamp(u, -L, L) + 1) * (c * sigmoid(c * alpha)) with
    c = clamp(g, max=L), g / u the even / odd columns of one node, else None."""
    if not _is(h, aten.mul.Tensor):
        return None
    for a, glu in _pair(h):
        if not (_is(a, *ADDS) and _const(arg(a, "other")) == 1 and _is(glu, aten.mul.Tensor)):
            continue
        cu = arg(a, "self")
        for c, sg in _pair(glu):
            if not (_is(c, aten.clamp.default) and _is(sg, aten.sigmoid.default) and _is(cu, aten.clamp.default)):
                continue
            sm = _src(sg)
            if not _is(sm, aten.mul.Tensor) or arg(sm, "self") is not c or _const(arg(sm, "other")) is None:
                continue
            lim = _const(arg(c, "max"))
            if arg(c, "min") is not None or lim is None or _const(arg(cu, "max")) != lim or \
                    _const(arg(cu, "min")) != -lim:
                continue
            gu = _slice2(_src(c), 0)
            if gu is None or _slice2(_src(cu), 1) is not gu:
                continue
            return gu, float(arg(sm, "other")), float(lim), [h, a, glu, cu, c, sg, sm, _src(c), _src(cu)]
    return None


def match_gpt_oss(node, ctx):
    """The gpt-oss grouped-mm experts ending at sum `node` (see the module docstring), or None."""
    s = unpermuted_sum(node)
    srt = _item(s[1], 1) if s is not None else None
    if not _is(srt, aten.sort.default):
        return None
    weighted, perm, seen = s
    ids_g = next((u for u in srt.users if _item(u, 0) is srt), None)
    if ids_g is None:
        return None
    for down, scale in _pair(weighted):
        d = _biased(down, ctx, ids_g)
        if d is not None and _is(scale, aten.unsqueeze.default):
            break
    else:
        return None
    wsel = _src(scale)
    wflat = _src(wsel) if _one_index(wsel) is perm else None
    if not _is(wflat, aten.view.default, aten.reshape.default):
        return None
    d_in, d_w, offs = _gmm(d[0])
    chain = _gate_chain(_skip_to(d_in))
    u = _biased(chain[0], ctx, ids_g) if chain is not None else None
    if u is None or _gmm(u[0])[2] is not offs:
        return None
    u_in, u_w, _ = _gmm(u[0])
    dn, gu = ctx.constant(d_w), ctx.constant(u_w)
    xs = _skip_to(u_in)
    fd = _one_index(xs)
    if dn is None or gu is None or not _is(fd, aten.floor_divide.default) or _src(fd) is not perm:
        return None
    ids_flat = _src(srt)
    if not _is(ids_flat, aten.view.default, aten.reshape.default):
        return None
    seen += [down, scale, wsel, wflat, d[0], d[2], *chain[3], chain[0], u[0], u[2], xs, fd, perm, ids_g, srt, ids_flat, offs]
    seen += [n for n in (d_in, u_in) if n not in (chain[3][0], xs)]
    return dict(x=_src(xs), ids=_src(ids_flat), weights=_src(wflat), k=arg(fd, "other"), gate_up=gu, gate_up_bias=u[1],
                down=dn, down_bias=d[1], alpha=chain[1], limit=chain[2], seen=seen)


def gpt_oss_reason(m):
    """Why the matched gpt-oss experts cannot run on moe_experts, else None."""
    x, gu, dn = m["x"], m["gate_up"], m["down"]
    xs, ws = shape_of(x), shape_of(m["weights"])
    if xs is None or len(xs) < 2 or ws is None or len(ws) != len(xs) or ws[-1] != m["k"]:
        return "the experts' input is not [..., H] with [..., k] routing weights"
    if gu.dim() != 3 or dn.dim() != 3:
        return f"gate_up_proj {tuple(gu.shape)} / down_proj {tuple(dn.shape)} are not [E, H, 2I] / [E, I, H]"
    e, h, two_i = gu.shape
    if two_i % 2 or tuple(dn.shape) != (e, two_i // 2, h) or tuple(m["gate_up_bias"].shape) != (e, two_i) or \
            tuple(m["down_bias"].shape) != (e, h):
        return (f"gate_up_proj {tuple(gu.shape)}, down_proj {tuple(dn.shape)} and their biases are not [E, H, 2I], "
                f"[E, I, H], [E, 2I], [E, H]")
    return experts_fit(m, e, h, two_i // 2)


def _prepared(i, dt):
    return lambda gu, gub, dn, dnb: K.prepare_gpt_oss_experts(gu, gub, dn, dnb, dt)[i]


def moe_gpt_oss_supported(node, ctx):
    m = match_gpt_oss(node, ctx)
    return NO_MATCH if m is None else gpt_oss_reason(m) or Match(**m)


@rule(Stage.PATTERN, aten.sum.dim_IntList, family="moe_experts", supported=moe_gpt_oss_supported,
      doc="HF gpt-oss grouped-mm experts (biases, x @ W, interleaved gate/up, clamped SwiGLU) -> moe_experts")
def lower_moe_experts_gpt_oss(node, ctx, m):
    srcs = (m.gate_up, m.gate_up_bias, m.down, m.down_bias)
    gate, up = K.gpt_oss_programs(m.alpha, m.limit)
    inter = m.down.shape[1]
    new = None
    if ctx.precision == "fp8":  # fp8 experts (moe_fp8.py); None where they stay bf16
        new = moe_fp8.emit_gpt_oss_fp8(ctx, node, m.x, m.weights, m.ids, srcs, inter, gate, up, m.seen)
    if new is None:
        dt = None if ctx.precision == "fp32" else ctx.compute_dtype
        w13, b13, w2, b2 = (ctx.add_constant(_prepared(i, dt)(*srcs), name, node, derive=_prepared(i, dt), sources=srcs)
                            for i, name in enumerate(("moe_w13", "moe_b13", "moe_w2", "moe_b2")))
        new = ctx.emit("moe_experts", (ctx.cast_in(m.x, node), m.weights, m.ids, w13, w2, inter, gate, None, 0, up, b13,
                                       b2), lowering="moe_experts_gpt_oss", sources=m.seen, anchor=node, before=node)
    node.replace_all_uses_with(ctx.cast(new, dtype_of(node), node))
    _erase_dead(ctx, m.seen)
    return new
