"""Mixture-of-experts layers -> `flydsl.moe_topk` (routing) and `flydsl.moe_experts` (the experts).

Routing, matched at aten.topk (PATTERN stage, before softmax and the reductions take the nodes):

    topk(softmax(logits, -1[, dtype=float32]), k)                     HF Mixtral, Qwen2/3-MoE, OLMoE routers
    [values / values.sum(-1, keepdim=True)]                           renormalized (Mixtral; norm_topk_prob)
    softmax(topk(logits, k).values, -1)                               gpt-oss (= the renormalized form above)

-> `moe_topk(logits, k, "softmax", renormalize)`: one launch (translator_kernels.moe.routing) giving
fp32 weights and int64 ids, as topk does. The same op takes sigmoid scores and DeepSeek-V3's
group-limited routing (kernel options; no HF form of those is matched yet).

Experts, HF's grouped-mm form (transformers 5.x `grouped_mm_experts_forward`, the default
`experts_implementation` of Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE), matched at the final sum:

    perm = sort(ids.reshape(-1)).indices;  xs = x[perm // k]
    offs = cumsum(histc(sorted ids))                                   (then dead)
    h = act(chunk(grouped_mm(xs, gate_up_proj.transpose(-2, -1), offs), 2, -1)[0]) * chunk(...)[1]
                                                                       (split(I, -1) once AOT decomposed it)
    y = grouped_mm(h, down_proj.transpose(-2, -1), offs) * weights.reshape(-1)[perm].unsqueeze(-1)
    inv = empty_like(perm).index_put_([perm], arange(T·k));  out = y[inv].view(T, k, H).sum(1)

(`grouped_mm` is `transformers.grouped_mm_fallback` on the CPU, `aten._grouped_mm` where torch has
it.) -> `moe_experts(x, weights, ids, W13, W2, I, act)`: align, gather, the gated grouped GEMM, the
down grouped GEMM and the weighted un-permute (translator_kernels.moe). The weights are prepared once
(gated arrangement per expert, preshuffled down projections) and rebuilt if a parameter changes.
Guards: gate_up_proj [E, 2I, H] and down_proj [E, H, I] are parameters of the activation's dtype,
k and E fit the kernels (E <= 256), H and I are multiples of 8 (16-byte rows).

The experts loop written by hand (`torch.where(top_idx == e)`, `x[tok]`, `index_add_`) and dense
dispatch are in moe_loops.py; under precision="fp8" every form's experts go to moe_fp8.py. Counters: `moe_topk`,
`moe_experts`.
"""

from __future__ import annotations

from typing import Optional

import torch

from translator_kernels import moe as K
from translator_kernels.gemm.gated import gated_weight
from translator_kernels.gemm.preshuffle import shuffle_weight_batched

from ..graph import arg, aten, dtype_of, erased, getitem_of, shape_of
from ..registry import NO_MATCH, Match, OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch
from .gated_mlp import _gate_name
from . import moe_fp8
from .gemm import cast_weight

def _grouped_mm_ops() -> tuple:
    """The grouped-mm overloads HF's experts call (transformers' fallback op exists once transformers is imported)."""
    ops = [getattr(aten, "_grouped_mm", None)]
    try:
        ops.append(torch.ops.transformers.grouped_mm_fallback)
    except (AttributeError, RuntimeError):
        pass
    return tuple(o.default for o in ops if o is not None)
TO_OPS = (aten.to.dtype, aten._to_copy.default)


# ---- the ops ----


@torch.library.custom_op("flydsl::moe_topk", mutates_args=())
def moe_topk(logits: torch.Tensor, k: int, scoring: str, renormalize: bool, groups: int,
             topk_group: int) -> tuple[torch.Tensor, torch.Tensor]:
    return dispatch("moe_topk", logits, k, scoring, renormalize, groups, topk_group)


@moe_topk.register_fake
def _(logits, k, scoring, renormalize, groups, topk_group):
    shape = (*logits.shape[:-1], k)
    return logits.new_empty(shape, dtype=torch.float32), logits.new_empty(shape, dtype=torch.int64)


def ref_moe_topk(logits, k, scoring, renormalize, groups, topk_group):
    w, ids = K.ref_topk_gating(logits.reshape(-1, logits.shape[-1]), k, scoring, renormalize, groups, topk_group)
    return w.reshape(*logits.shape[:-1], k), ids.reshape(*logits.shape[:-1], k)


def kernel_moe_topk(logits, k, scoring, renormalize, groups, topk_group):
    w, ids = K.topk_gating(logits.reshape(-1, logits.shape[-1]), k, scoring=scoring, renormalize=renormalize,
                           groups=groups, topk_group=topk_group)
    return w.reshape(*logits.shape[:-1], k), ids.reshape(*logits.shape[:-1], k)


register_family(OpFamily(
    name="moe_topk", description="router scores (softmax / sigmoid), top-k experts, renormalized weights",
    reference=ref_moe_topk, kernel=kernel_moe_topk, kernel_entry="translator_kernels.moe:topk_gating",
    sample_inputs=lambda dt: (torch.randn(6, 8).to(dt), 2, "softmax", True, 1, 1),
))


@torch.library.custom_op("flydsl::moe_experts", mutates_args=())
def moe_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                inter: int, gate: str, residual: Optional[torch.Tensor], first_expert: int, up: Optional[str] = None,
                b13: Optional[torch.Tensor] = None, b2: Optional[torch.Tensor] = None) -> torch.Tensor:
    return dispatch("moe_experts", x, weights, ids, w13, w2, inter, gate, residual, first_expert, up, b13, b2)


@moe_experts.register_fake
def _(x, weights, ids, w13, w2, inter, gate, residual, first_expert, up=None, b13=None, b2=None):
    return x.new_empty(x.shape)


def _rows(x, weights, ids, residual):
    """[..., H] / [..., k] as [T, H] / [T, k] (views where the layout allows)."""
    h, k = x.shape[-1], ids.shape[-1]
    return (x.reshape(-1, h), weights.reshape(-1, k), ids.reshape(-1, k),
            None if residual is None else residual.reshape(-1, h))


def ref_moe_experts(x, weights, ids, w13, w2, inter, gate, residual, first_expert, up=None, b13=None, b2=None):
    x2, w, i, r = _rows(x, weights, ids, residual)
    return K.ref_moe_experts(x2.to(w13.dtype), w, i, w13, w2, inter, gate, r, out_dtype=x.dtype,
                             first_expert=first_expert, up=up, b13=b13, b2=b2).reshape(x.shape)


def kernel_moe_experts(x, weights, ids, w13, w2, inter, gate, residual, first_expert, up=None, b13=None, b2=None):
    x2, w, i, r = _rows(x, weights, ids, residual)
    return K.moe_experts(x2, w, i, w13, w2, inter, gate, residual=r, out_dtype=x.dtype,
                         first_expert=first_expert, up=up, b13=b13, b2=b2).reshape(x.shape)


register_family(OpFamily(
    name="moe_experts", description="MoE experts: permute, gated grouped GEMM, grouped GEMM, weighted un-permute",
    reference=ref_moe_experts, kernel=kernel_moe_experts, kernel_entry="translator_kernels.moe:moe_experts",
    sample_inputs=lambda dt: _sample_experts(dt),
    tolerance_overrides={torch.float32: (1e-4, 1e-4, "two K-length fp32 sums per expert, in the GEMM's order")},
))


def _sample_experts(dt):
    g = torch.Generator().manual_seed(0)
    e, h, i, t = 4, 32, 48, 5
    w, ids = K.ref_topk_gating(torch.randn(t, e, generator=g), 2)
    w13, w2 = K.prepare_experts((torch.randn(e, 2 * i, h, generator=g) / 8).to(dt),
                                (torch.randn(e, h, i, generator=g) / 8).to(dt))
    return torch.randn(t, h, generator=g).to(dt), w, ids, w13, w2, i, "silu", None, 0, None, None, None


# ---- routing ----


def _getitems(node) -> dict:
    return {getitem_of(u)[1]: u for u in node.users if getitem_of(u) is not None}


def _renorm(values):
    """(div node, sum node) where `values` is only divided by its own sum over the last dim, else None."""
    users = list(values.users)
    if len(users) != 2:
        return None
    s = next((u for u in users if u.target is aten.sum.dim_IntList), None)
    d = next((u for u in users if u.target in (aten.div.Tensor, aten.div_.Tensor)), None)
    if s is None or d is None or arg(d, "self") is not values or arg(d, "other") is not s:
        return None
    if list(arg(s, "dim")) not in ([-1], [len(shape_of(values)) - 1]) or not arg(s, "keepdim", False):
        return None
    return d, s


def _softmax_of_values(node, gets):
    """The softmax over the last dim that is the top-k values' only use (gpt-oss's router:
    softmax(topk(logits).values)), else None."""
    vals = gets.get(0)
    users = list(vals.users) if vals is not None else []
    nd = len(shape_of(vals) or ()) if vals is not None else 0
    if len(users) != 1 or users[0].target not in (aten.softmax.int, aten._softmax.default):
        return None
    sm = users[0]
    return sm if arg(sm, "self") is vals and arg(sm, "dim") in (-1, nd - 1) else None


def _topk_then_softmax(node):
    """Match of softmax(topk(logits, k).values) = the renormalized top-k of softmax(logits) (softmax is
    monotonic, and exp(l_i) / sum of exp(l_j) over the top k is both), else NO_MATCH."""
    logits, nd = arg(node, "self"), len(shape_of(arg(node, "self")) or ())
    gets = _getitems(node)
    sm = _softmax_of_values(node, gets)
    if sm is None or arg(node, "dim", -1) not in (-1, nd - 1) or not arg(node, "largest", True):
        return NO_MATCH
    e, k = shape_of(logits)[-1], arg(node, "k")
    if not isinstance(e, int) or not isinstance(k, int) or not 1 <= k <= e or e > K.MAX_EXPERTS:
        return NO_MATCH  # not a router (top-k sampling over a vocabulary has the same form)
    if dtype_of(logits) not in (torch.float32, torch.bfloat16, torch.float16):
        return f"router logits are {dtype_of(logits)} (float32 / bfloat16 / float16 only)"
    return Match(logits=logits, sm=None, k=k, gets=gets, renorm=None, after=sm)


def moe_topk_supported(node, ctx):
    sm = arg(node, "self")
    if not isinstance(sm, torch.fx.Node) or sm.target not in (aten.softmax.int, aten._softmax.default):
        return _topk_then_softmax(node)
    nd = len(shape_of(sm) or ())
    if arg(node, "dim", -1) not in (-1, nd - 1) or not arg(node, "largest", True) or len(sm.users) != 1:
        return NO_MATCH
    if arg(sm, "dim") not in (-1, nd - 1):
        return NO_MATCH
    logits = arg(sm, "self")
    if dtype_of(logits) not in (torch.float32, torch.bfloat16, torch.float16):
        return f"router logits are {dtype_of(logits)} (float32 / bfloat16 / float16 only)"
    e, k = shape_of(logits)[-1], arg(node, "k")
    if not isinstance(e, int) or not isinstance(k, int) or not 1 <= k <= e or e > K.MAX_EXPERTS:
        return f"top-{k} of {e} experts (the gating kernel takes 1 <= k <= E <= {K.MAX_EXPERTS}, static)"
    if dtype_of(sm) != torch.float32:
        return f"the router softmax is {dtype_of(sm)}; the gating kernel gives fp32 scores (HF routers use fp32)"
    gets = _getitems(node)
    return Match(logits=logits, sm=sm, k=k, gets=gets, renorm=_renorm(gets[0]) if 0 in gets else None, after=None)


@rule(Stage.PATTERN, aten.topk.default, family="moe_topk", supported=moe_topk_supported,
      doc="topk(softmax(router logits)) [/ sum], or softmax(topk(router logits).values) -> one gating kernel")
def lower_moe_topk(node, ctx, m):
    if m.after is not None:  # softmax of the top-k logits (gpt-oss)
        new, (w, ids) = ctx.emit("moe_topk", (m.logits, m.k, "softmax", True, 1, 1), lowering="moe_topk",
                                 sources=[node, m.after, m.gets[0]], anchor=node, before=node,
                                 output_anchors=[m.after, m.gets.get(1)])
        m.after.replace_all_uses_with(ctx.cast(w, dtype_of(m.after), m.after))
        if 1 in m.gets:
            m.gets[1].replace_all_uses_with(ids)
        _erase_dead(ctx, [m.after, *m.gets.values(), node])
        return new
    renorm = m.renorm is not None
    new, (w, ids) = ctx.emit("moe_topk", (m.logits, m.k, "softmax", renorm, 1, 1), lowering="moe_topk",
                             sources=[node, m.sm] + (list(m.renorm) if renorm else []), anchor=node, before=node,
                             output_anchors=[m.renorm[0] if renorm else m.gets.get(0), m.gets.get(1)])
    if renorm:
        m.renorm[0].replace_all_uses_with(w)
    elif 0 in m.gets:
        m.gets[0].replace_all_uses_with(w)
    if 1 in m.gets:
        m.gets[1].replace_all_uses_with(ids)
    _erase_dead(ctx, ([*m.renorm] if renorm else []) + list(m.gets.values()) + [node, m.sm])
    return new


# ---- experts (HF grouped-mm form) ----


def _skip_to(n):
    while isinstance(n, torch.fx.Node) and n.target in TO_OPS:
        n = arg(n, "self")
    return n


def _is(n, *targets):
    return isinstance(n, torch.fx.Node) and n.op == "call_function" and n.target in targets


def _src(n):
    """The tensor a view / reshape / index / unsqueeze / sort / transpose reads."""
    return arg(n, "self")


def _one_index(n):
    """The single index tensor of x[idx] (aten.index.Tensor), else None."""
    idx = arg(n, "indices") if _is(n, aten.index.Tensor) else None
    return idx[0] if idx is not None and len(idx) == 1 else None


def _item(n, i):
    """The source of getitem `n` when it takes item i, else None."""
    g = getitem_of(n)
    return g[0] if g is not None and g[1] == i else None


def _gmm(n):
    """(input, weight, offs) of a grouped-mm call, else None."""
    if not _is(n, *_grouped_mm_ops()):
        return None
    if n.target.namespace == "aten":
        return arg(n, "self"), arg(n, "mat2"), arg(n, "offs")
    return arg(n, "input"), arg(n, "weight"), arg(n, "offs")


def _param_t(n, ctx):
    """(parameter, nodes) of transpose(param, -2, -1), else None."""
    if not _is(n, aten.transpose.int) or sorted(arg(n, d) % 3 for d in ("dim0", "dim1")) != [1, 2]:
        return None
    p = ctx.constant(_src(n))
    return (p, [n]) if p is not None and p.dim() == 3 else None


def _pair(mul):
    """Both operand orders of a mul node."""
    a, b = arg(mul, "self"), arg(mul, "other")
    return ((a, b), (b, a))


def unpermuted_sum(node):
    """(weighted, perm, nodes) of sum `node` = weighted[inv].view(T, k, H).sum(1), inv the inverse of
    permutation perm (index_put_ of an arange), else None."""
    if list(arg(node, "dim") or []) != [1] or arg(node, "keepdim", False):
        return None
    view = _src(node)
    if not _is(view, aten.view.default, aten.reshape.default):
        return None
    idx = _src(view)
    inv = _one_index(idx)
    weighted = _src(idx) if inv is not None else None
    if not _is(inv, aten.index_put_.default, aten.index_put.default) or not _is(weighted, aten.mul.Tensor):
        return None
    perm = (arg(inv, "indices") or [None])[0]
    return weighted, perm, [node, view, idx, inv, weighted, _src(inv), arg(inv, "values")]


def _unmask(n, masks: list):
    """The tensor under HF's expert-parallel sentinel mask, `n` = masked_fill(t, (sorted_ids >= E).unsqueeze(-1), 0):
    t (n and the mask go to `masks`); else n itself."""
    if not _is(n, aten.masked_fill.Scalar, aten.masked_fill_.Scalar) or arg(n, "value") != 0:
        return n
    mask = arg(n, "mask")
    ge = _src(mask) if _is(mask, aten.unsqueeze.default) and arg(mask, "dim") in (-1, 1) else None
    if not _is(ge, aten.ge.Scalar) or _item(_src(ge), 0) is None:
        return n
    masks.append(n)
    return _src(n)


def _sentinel_ok(masks, srt, e):
    """The masks found are one mask, on the sorted ids of `srt`, at E (the local expert count): HF's expert-parallel
    experts (`_is_expert_parallel`), whose off-rank routes carry the id E and weight 0. Returns the mask's nodes and
    the in-place clamp of the sorted ids (dead once the experts are one op), or None."""
    if not masks:
        return []
    mask = {arg(m, "mask") for m in masks}
    if len(mask) != 1:
        return None
    (mask,) = mask
    ge = _src(mask)
    ids_sorted = _src(ge)
    if _item(ids_sorted, 0) is not srt or arg(ge, "other") != e:
        return None
    clamps = [u for u in ids_sorted.users if _is(u, aten.clamp_.default, aten.clamp.default) and not u.users]
    return masks + [mask, ge] + clamps


def _halves(n) -> bool:
    """n splits a [S, 2I] tensor into its two halves along the last dim: `chunk(2, -1)` as written, or what AOT
    autograd decomposes it to (`split(I, -1)`, `split_with_sizes([I, I], -1)`; a DTensor graph compiled
    directly, translator/distributed.py `desugared`)."""
    if not _is(n, aten.chunk.default, aten.split.Tensor, aten.split_with_sizes.default) or \
            arg(n, "dim") not in (-1, 1):
        return False
    two_i = (shape_of(_src(n)) or (None,))[-1]
    if n.target is aten.chunk.default:
        return arg(n, "chunks") == 2
    if not isinstance(two_i, int) or two_i % 2:
        return False
    if n.target is aten.split.Tensor:
        return arg(n, "split_size") == two_i // 2
    return list(arg(n, "split_sizes")) == [two_i // 2] * 2


def _match_grouped(node, ctx):
    """The HF grouped-mm experts ending at sum `node` (see the module docstring), or None."""
    u = unpermuted_sum(node)
    if u is None:
        return None
    weighted, perm, seen = u
    masks = []
    for down, scale in _pair(weighted):
        down = _unmask(down, masks)
        if _gmm(down) is not None and _is(scale, aten.unsqueeze.default):
            break
        masks.clear()
    else:
        return None
    wsel = _src(scale)
    if _one_index(wsel) is not perm:
        return None
    wflat = _src(wsel)
    if not _is(wflat, aten.view.default, aten.reshape.default):
        return None
    seen += [down, scale, wsel, wflat]
    d_in, d_w, offs = _gmm(down)
    pd, act = _param_t(d_w, ctx), _skip_to(d_in)
    if pd is None or not _is(act, aten.mul.Tensor):
        return None
    for g, u_get in _pair(act):
        gate_name = _gate_name(g) if isinstance(g, torch.fx.Node) else None
        chunk = _item(_src(g), 0) if gate_name else None
        if chunk is not None and _item(u_get, 1) is chunk:
            g_get = _src(g)
            break
    else:
        return None
    if not _halves(chunk):
        return None
    up = _unmask(_src(chunk), masks)
    if _gmm(up) is None or _gmm(up)[2] is not offs:
        return None
    u_in, u_w, _ = _gmm(up)
    pu, xs = _param_t(u_w, ctx), _unmask(_skip_to(u_in), masks)
    fd = _one_index(xs)
    if pu is None or not _is(fd, aten.floor_divide.default) or _src(fd) is not perm:
        return None
    srt = _item(perm, 1)
    ids_flat = _src(srt) if _is(srt, aten.sort.default) else None
    if not _is(ids_flat, aten.view.default, aten.reshape.default):
        return None
    sentinel = _sentinel_ok(masks, srt, pu[0].shape[0])
    if sentinel is None:
        return None
    x, ids, weights, k = _src(xs), _src(ids_flat), _src(wflat), arg(fd, "other")
    seen += [act, g, g_get, u_get, chunk, up, xs, fd, perm, srt, ids_flat, offs] + pd[1] + pu[1] + sentinel
    seen += [n for n in (d_in, u_in) if n not in (act, xs)]
    return dict(x=x, ids=ids, weights=weights, k=k, gate=gate_name, gate_up=pu[0], down=pd[0], seen=seen)


def _experts_reason(m, ctx):
    x, gu, dn = m["x"], m["gate_up"], m["down"]
    xs, ws = shape_of(x), shape_of(m["weights"])
    if xs is None or len(xs) < 2 or ws is None or len(ws) != len(xs) or ws[-1] != m["k"]:
        return "the experts' input is not [..., H] with [..., k] routing weights"
    e, two_i, h = gu.shape
    if tuple(dn.shape) != (e, h, two_i // 2) or two_i % 2:
        return f"gate_up_proj {tuple(gu.shape)} / down_proj {tuple(dn.shape)} are not [E, 2I, H] / [E, H, I]"
    return experts_fit(m, e, h, two_i // 2)


def experts_fit(m, e, h, i):
    """Why E experts of H -> I -> H (weights m["gate_up"] / m["down"], input m["x"], ids m["ids"]) do not
    fit the kernels, else None."""
    x, gu, dn = m["x"], m["gate_up"], m["down"]
    if e > K.MAX_EXPERTS:
        return f"{e} experts (the permutation kernel takes E <= {K.MAX_EXPERTS})"
    if h % 8 or i % 8:
        return f"H={h} / I={i} not multiples of 8 (16-byte rows)"
    if gu.dtype != dn.dtype or gu.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"expert weights {gu.dtype} / {dn.dtype} (float32 / bfloat16 / float16, one dtype)"
    if dtype_of(x) != gu.dtype and not (dtype_of(x) == torch.float32):
        return f"activation {dtype_of(x)} and expert weights {gu.dtype} differ"
    if dtype_of(m["ids"]) not in (torch.int32, torch.int64):
        return f"expert ids are {dtype_of(m['ids'])}"
    return None


def moe_experts_supported(node, ctx):
    m = _match_grouped(node, ctx)
    if m is None:
        return NO_MATCH
    return _experts_reason(m, ctx) or Match(**m)


def _w13(dtype, gu):
    i = gu.shape[1] // 2
    gu = cast_weight(dtype, gu)
    return torch.stack([gated_weight(gu[j, :i], gu[j, i:]) for j in range(gu.shape[0])])


def _w2(dtype, dn):
    return shuffle_weight_batched(cast_weight(dtype, dn))


@rule(Stage.PATTERN, aten.sum.dim_IntList, family="moe_experts", supported=moe_experts_supported,
      doc="HF grouped-mm experts (sort, grouped_mm x2, gate, weighted sum) -> moe_experts")
def lower_moe_experts(node, ctx, m):
    inter = m.down.shape[2]
    new = None
    if ctx.precision == "fp8":  # fp8 experts (moe_fp8.py); None where they stay bf16
        new = moe_fp8.emit_experts_fp8(ctx, node, m.x, m.weights, m.ids, (moe_fp8.given, (m.gate_up,)),
                                       (moe_fp8.given, (m.down,)), inter, m.gate, 0, "moe_experts_fp8", m.seen)
    if new is not None:
        node.replace_all_uses_with(ctx.cast(new, dtype_of(node), node))
        _erase_dead(ctx, m.seen)
        return new
    dt = None if ctx.precision == "fp32" else ctx.compute_dtype
    w13 = ctx.add_constant(_w13(dt, m.gate_up), "moe_w13", node, derive=lambda p: _w13(dt, p), sources=(m.gate_up,))
    w2 = ctx.add_constant(_w2(dt, m.down), "moe_w2", node, derive=lambda p: _w2(dt, p), sources=(m.down,))
    x = ctx.cast_in(m.x, node)
    new = ctx.emit("moe_experts", (x, m.weights, m.ids, w13, w2, inter, m.gate, None, 0), lowering="moe_experts",
                   sources=m.seen, anchor=node, before=node)
    node.replace_all_uses_with(ctx.cast(new, dtype_of(node), node))
    _erase_dead(ctx, m.seen)
    return new


_ASSERTS = (aten._assert_tensor_metadata.default, aten._assert_scalar.default,
            getattr(aten, "sym_constrain_range_for_size").default)


def _only_checks(u) -> bool:
    """u is a check on a value (a dtype assert, or a size-symbol chain ending in _assert_scalar) that
    nothing else reads: it goes with the value."""
    if u.target in _ASSERTS:
        return not u.users
    if u.target is aten.sym_size.int or (u.op == "call_function" and getattr(u.target, "__module__", "") in
                                         ("_operator", "operator")):
        return bool(u.users) and all(_only_checks(w) for w in u.users)
    return False


def _erase_checks(ctx, u):
    for w in list(u.users):
        _erase_checks(ctx, w)
    ctx.graph.erase_node(u)


def _erase_dead(ctx, roots):
    """Erase the matched nodes and what only they read (the sorted ids' histc and cumsum, the inverse
    permutation's arange, the loop's where), with the checks that would keep them alive."""
    work, done = [n for n in roots if isinstance(n, torch.fx.Node)], set()
    while work:
        n = work.pop()
        if n in done or erased(n) or n.op != "call_function":
            continue
        if not all(_only_checks(u) for u in n.users):
            continue  # still read; looked at again when its last reader goes
        done.add(n)
        for u in list(n.users):
            _erase_checks(ctx, u)
        work.extend(n.all_input_nodes)
        ctx.graph.erase_node(n)

