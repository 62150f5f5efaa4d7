"""RoPE of q and k and the K / V cache writes of a layer as one launch (`flydsl.rope` with a cache).

After the RoPE rules (rope.py) and the state writes (cache_write.py) a Llama-style attention block
reads, between its QKV GEMM and attention:

    q_rot = flydsl.rope([q], [cos], [sin])            q, k, v: views of the QKV GEMM's output
    k_rot = flydsl.rope([k], [cos], [sin])
    flydsl.cache_write(k_cache, view(k_rot), pos, 2)  gpt-fast's cache[:, :, input_pos] = k,
    flydsl.cache_write(v_cache, view(v), pos, 2)      HF StaticCache's index_copy_(2, pos, k)

four launches of a few KB each at decode. This CONSUMER rule makes them one (translator_kernels/
layout/rope_cache.py): `flydsl.rope([q, k], [cos_q, cos_k], [sin_q, sin_k], pairs, k_cache, order,
v, v_cache, pos, 2)` returns q rotated and stores the rotated k and v into the caches in place. It
takes, starting from a rope node:
- a second rope of the same form whose input is a view of the same tensor (the QKV output);
- a cache write whose values are a chain of views read only by it of one of the two rotations:
  that rotation goes straight into the cache. `order` lists the written region's dims innermost
  first as the chain lays them over the rotated tensor (found from the captured strides; the
  chain must be a permutation that splits or merges dims, each region element one rotated
  element);
- a cache write at the same positions and dim whose values are a view of the same tensor (v).
Without a cache (HF's plain forward) the two rotations are still one launch.

Each part is optional but at least two must be there. Safe against reordering: the fused node
takes the place of the first member, so the writes move up to it: a write is left out (its own
launch, where it was) when anything in between reads or writes its cache. Counters:
`rope_cache_write` (a launch that writes a cache), `rope_qk` (q and k rotated in one launch, no cache).
"""

from __future__ import annotations

import math
import operator

import torch

from ..graph import aten, arg, asserts, getitem_of, position, size_hint, static_int, users, val
from ..registry import NO_MATCH, Match, Stage, rule
from . import cache_write, rope  # noqa: F401  (register flydsl.rope and flydsl.cache_write)

ROPE = torch.ops.flydsl.rope.default
WRITE = torch.ops.flydsl.cache_write.default


VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.flatten.using_ints,
         aten.unflatten.int, aten.transpose.int, aten.permute.default, aten.unsqueeze.default, aten.squeeze.dim,
         aten.squeeze.dims, aten.squeeze.default, aten.slice.Tensor, aten.select.int, aten.expand.default,
         aten.alias.default, aten.t.default}
SPLITS = {aten.split_with_sizes.default, aten.split.Tensor, aten.chunk.default}


def _view_of(n):
    """The node `n` reshapes or slices (a view op, or a part of a split), else None. Whether it is a
    view at run time is checked where it matters (`_order` replays the chain)."""
    part = getitem_of(n)
    if part is not None:
        return arg(part[0], "self") if isinstance(part[0], torch.fx.Node) and part[0].target in SPLITS else None
    if not isinstance(n, torch.fx.Node) or n.op != "call_function" or n.target not in VIEWS:
        return None
    base = arg(n, "self")
    return base if isinstance(base, torch.fx.Node) else None


def _root(n):
    while (b := _view_of(n)) is not None:
        n = b
    return n


def _single(r):
    """True for a rope node of one tensor with no cache (what rope.py emits)."""
    return r.target is ROPE and len(arg(r, "xs")) == 1 and arg(r, "kc") is None and arg(r, "vc") is None


def rope_folds(node, ctx, find) -> dict | None:
    """{RoPE op: find(op)} over the graph's RoPE ops `find` matches (its result's first item is the node the fold
    absorbs), when `node` is one of them and no op involved is denied; else None."""
    found = {r: f for r in node.graph.nodes if r.target is ROPE and (f := find(r)) is not None}
    if node not in found or ctx.denied([*found, *(f[0] for f in found.values())]):
        return None
    return found


def _out(r):
    """The getitem of rope node r's one output, else None."""
    gs = [u for u in r.users if u.target is operator.getitem]
    return gs[0] if len(gs) == 1 and len(r.users) == 1 else None


def _chain_to_write(r):
    """(cache_write node, the view nodes between) when r's result is read only through views by one
    cache write's values, else None."""
    u, chain = _out(r), []
    if u is None:
        return None
    while len(users(u)) == 1:  # export's dtype asserts (a no-op `.to(dtype)`, OLMo2's) read no data
        nxt = users(u)[0]
        if nxt.target is WRITE and arg(nxt, "values") is u and arg(nxt, "dst") is not u:
            return nxt, [_out(r), *chain]
        if _view_of(nxt) is not u:
            return None
        chain.append(nxt)
        u = nxt
    return None


def _replay(chain, t):
    """The chain's view ops applied to meta tensor t (sizes at their hints), else None."""
    for n in chain:
        prev = arg(n, "self")

        def sub(a, prev=prev):
            if a is prev:
                return t
            v = val(a)
            return size_hint(v) if isinstance(v, torch.SymInt) else v
        args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), sub)
        args = tuple(size_hint(a) if isinstance(a, torch.SymInt) else a for a in args)
        try:
            out = n.target(*args, **kwargs)
        except (RuntimeError, TypeError, ValueError):
            return None
        if not isinstance(out, torch.Tensor) or not torch._C._is_alias_of(out, t):
            return None  # a copy (a reshape that cannot view): the values are not the rotation's storage
        t = out
    return t


def _order(r, chain, w, ids, dim):
    """The written region's dims innermost first as the cache write's values lay them over r's
    rotated tensor (contiguous, as flydsl.rope returns it), else None."""
    rv, dv = val(_out(r)), val(arg(w, "dst"))
    rshape = [size_hint(s) for s in rv.shape]
    cv = _replay(chain[1:], torch.empty(rshape, dtype=rv.dtype, device="meta"))
    if cv is None or cv.storage_offset() != 0:
        return None
    region = [size_hint(s) for s in dv.shape]
    region[dim] = math.prod(size_hint(s) for s in val(ids).shape)
    lead = len(region) - cv.dim()
    if lead < 0:
        return None
    st = [0] * lead + [s if n > 1 else 0 for s, n in zip(cv.stride(), cv.shape)]
    big = [d for d in range(len(region)) if region[d] > 1]
    order, acc = sorted(big, key=lambda d: st[d]), 1
    for d in order:
        if st[d] != acc:
            return None
        acc *= region[d]
    if acc != math.prod(rshape):
        return None
    if any(static_int(dv.shape[d] if d != dim else val(ids).numel()) != 1 for d in range(len(region)) if d not in big):
        return None  # a dim of one element here that could hold more in another call
    return order


def _crosses(members, writes) -> bool:
    """Whether a node outside `members` between the first member and a write reads its cache."""
    start = min(position(m) for m in members)
    for w in writes:
        dst = arg(w, "dst")
        bases = [dst]
        while (b := _view_of(bases[-1])) is not None:
            bases.append(b)
        for b in bases:
            if any(u not in members and start <= position(u) < position(w) for u in b.users):
                return True
    return False


def _dtypes_agree(a, b) -> bool:
    """Two rotations' out_dtypes may share a launch: equal, or one unset (it may be the cached one)."""
    return a == b or a is None or b is None


def _norm(r):
    """What rope_norm.py folded into rotation r: (normalized, eps, the norm row's dims), and the rotated features
    rope_pass.py set (rot_dim). Two rotations share a launch with the same."""
    return arg(r, "norm_w0") is not None, arg(r, "norm_eps") if arg(r, "norm_w0") is not None else None, \
        arg(r, "rot_dim") or 0, tuple(arg(r, "norm_dims") or ())


def rope_cache_supported(node, ctx):
    if not _single(node) or ctx.denied([node]):
        return NO_MATCH
    pairs, root = arg(node, "pairs"), _root(arg(node, "xs")[0])
    partner = next((r for r in node.graph.nodes if r is not node and _single(r) and position(r) > position(node)
                    and arg(r, "pairs") == pairs and _root(arg(r, "xs")[0]) is root
                    and _dtypes_agree(arg(r, "out_dtype"), arg(node, "out_dtype")) and _norm(r) == _norm(node)), None)
    ropes = [node] + ([partner] if partner is not None else [])
    k_write = chain = order = None
    for r in ropes[::-1]:
        found = _chain_to_write(r)
        if found is None:
            continue
        w, ch = found
        ids, dim = arg(w, "ids"), arg(w, "dim")
        if ids is None or dim < 0 or val(ids).dim() > 1 or val(arg(w, "dst")).dtype != val(_out(r)).dtype:
            continue
        order = _order(r, ch, w, ids, dim)
        if order is not None:
            k_write, chain = w, ch
            ropes = [x for x in ropes if x is not r] + [r]  # the one written into the cache goes last
            break
    # one out_dtype (rope_casts.py) for the rotations returned; the one stored in the cache is rounded to
    # the cache's dtype (its result's dtype: checked above)
    kept = ropes[:-1] if k_write is not None else ropes
    if len({arg(r, "out_dtype") for r in kept}) > 1:
        ropes, k_write, chain, order = [node], None, None, None
    v_write = None  # a write of a view of the same tensor (v), at k's positions and dim where k is written
    for u in node.graph.nodes:
        if u.target is not WRITE or u is k_write or _root(arg(u, "values")) is not root:
            continue
        ids, dim = arg(u, "ids"), arg(u, "dim")
        if ids is None or dim < 0 or val(ids).dim() > 1:
            continue
        if k_write is None or (ids is arg(k_write, "ids") and dim == arg(k_write, "dim")
                               and arg(u, "dst") is not arg(k_write, "dst")):
            v_write = u
            break
    # a write that would move up past a reader of its cache stays its own launch (its reader keeps order)
    taken = set(ropes) | {w for w in (k_write, v_write) if w is not None} | set(chain or ())
    if k_write is not None and _crosses(taken, [k_write]):
        k_write, chain, order = None, None, None
    if v_write is not None and _crosses(taken, [v_write]):
        v_write = None
    members = [*ropes, *([k_write] if k_write else []), *([v_write] if v_write else [])]
    if len(members) < 2 or ctx.denied(members):
        return NO_MATCH
    return Match(ropes=ropes, outs=[_out(r) for r in ropes], k_write=k_write, chain=chain or [], v_write=v_write,
                 order=order)


@rule(Stage.CONSUMER, ROPE, family="rope", supported=rope_cache_supported, name="rope_cache",
      doc="RoPE of q and k and the K / V cache writes at the step's positions -> one flydsl.rope launch")
def fuse_rope_cache(node, ctx, m):
    ropes, kw, vw = m.ropes, m.k_write, m.v_write
    first = min([*ropes, *(w for w in (kw, vw) if w is not None)], key=position)
    xs, coss, sins = ([arg(r, k)[0] for r in ropes] for k in ("xs", "coss", "sins"))
    w = kw or vw
    args = (xs, coss, sins, arg(node, "pairs"), arg(kw, "dst") if kw else None, m.order,
            arg(vw, "values") if vw else None, arg(vw, "dst") if vw else None,
            arg(w, "ids") if w else None, arg(w, "dim") if w else 0,
            next((arg(r, "out_dtype") for r in ropes[:len(ropes) - (kw is not None)] if arg(r, "out_dtype")), None),
            *([arg(r, "norm_w0") for r in ropes] + [None])[:2], arg(node, "norm_eps") or 0.0, arg(node, "rot_dim") or 0,
            arg(node, "norm_dims"))
    kept = ropes[:-1] if kw is not None else ropes
    lowering = "rope_cache_write" if w is not None else "rope_qk"
    new = ctx.emit("rope", args, lowering=lowering, sources=[],
                   anchor=kept[0].meta["flydsl"]["anchor"] if kept else node.meta["flydsl"]["anchor"],
                   before=first, split=False)
    ctx.absorb(new, [*ropes, *(x for x in (kw, vw) if x is not None)])  # the captured nodes each one replaced
    prev = new
    for j, (r, out) in enumerate(zip(kept, m.outs)):
        with ctx.gm.graph.inserting_after(prev):
            g = ctx.gm.graph.call_function(operator.getitem, (new, j))
        g.meta["val"], g.meta["orig_name"] = val(new)[j], None
        g.meta["replaces"] = r.meta["flydsl"]["anchor"]
        out.replace_all_uses_with(g)
        prev = g
    for n in m.chain:  # the rotation stored into the cache: no tensor left to check the dtype of
        for a in asserts(n):
            ctx.gm.graph.erase_node(a)
    dead = dict.fromkeys([x for x in (kw, vw) if x is not None] + m.chain + m.outs + ropes)
    for n in sorted(dead, key=position, reverse=True):
        if not n.users:
            ctx.gm.graph.erase_node(n)
    return new
