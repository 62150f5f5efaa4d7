"""Masks of a step on a static KV cache that are a causal offset, not a mask tensor.

A decoder with a static cache ([B, Hkv, S_max, D] buffers written at the step's positions)
attends from query row i to the cache keys k <= pos[i]. Written as gpt-fast does it:

    mask = self.causal_mask[None, None, input_pos]      # a bool tril buffer [S_max, S_max]
    y = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)

the mask is a gather of tril rows, [1, 1, Sq, S_max] (one launch before the attention, and a
mask read per score). Row p of a tril buffer keeps exactly the keys k <= p, so the mask is
`q_pos = input_pos`: the kernel reads the positions on the device, compares each key with its
row's position, and ends its key loop at the block's largest position + 1, reading the cache in
place up to the current length (translator_kernels.attention, `q_pos`). Nothing is read on the
host, so the step stays capturable in a HIP graph.

Proved, not assumed: the buffer is a translate-time constant whose every plane is tril
(attention_forms.is_tril, bool: SDPA's keep-mask), the gather indexes its row dim with a 1-D
integer tensor and leaves the key dim whole (or sliced from 0), and the key dim is the keys'.
Written as HF transformers builds it in forward (masking_utils' sdpa mask, no padding mask: the
static-cache step of translate_for_generation, attention_mask=None), the same mask is computed:

    kv = arange(S_max) + 0                     # [1, 1, 1, S_max] after unsqueezes
    q = cache_position-derived positions       # [1, 1, Sq, 1]
    mask = (kv <= q).expand(B, -1, Sq, S_max)  # Mistral: & (kv > q - window) & new_ones(.., bool)

Its every element is `k <= pos[i]` by construction, whatever `pos` holds at run time, so it is
`q_pos = pos` (`computed_positions`). Terms that `and` in are accepted only where they keep every
key of the cache: a 0-dim True (HF's `new_ones`), and a sliding window `kv > q - w` with
w >= S_max (a query inside the cache, q < S_max, keeps every key k >= 0 > q - w; a position past
the cache is an IndexError of the cache write before it), or where they are a key start per
batch row (below). A window shorter than the cache, a padding mask read from data (a gather of
the user's attention_mask), any other term or form keeps the mask.

A left-padded batch (translate_for_generation's step with `key_start`, generation.py) hands HF a
2-D attention mask it computes itself, `am = arange(L)[None, :] >= start[:, None]` (L >= S_max),
and HF's sdpa mask ands in its padding term, a gather of it at the batch and key indices:

    b = arange(B)[:, None, None, None]; kv = arange(S_max)[None, None, None, :]
    mask = (kv <= q) & am[b, kv]          # the padding term: am[b, k] = k >= start[b]

so the term is `k_start = start` (`padding_start`): the kernel starts row b's key loop at
start[b] (no mask tensor, no compare per score). A padding mask that is data (the user's own
attention_mask) is not a start: it keeps its mask tensor.
Anything else keeps its mask tensor.
"""

from __future__ import annotations

import torch

from ..graph import arg, asserts, aten, dtype_of, is_call, shape_of, static_int
from .attention_forms import full_slice, is_tril, node_int


def _strip_unsqueeze(n, chain):
    while is_call(n, aten.unsqueeze.default):
        chain.append(n)
        n = arg(n, "self")
    return n


def cache_positions(mask, keys, ctx, chain):
    """(pos, start): pos a 1-D int node when `mask` is tril_buffer[None, None, pos] or the mask HF computes
    from the positions (module notes) over the keys of `keys` ([B, Hkv, Sk, D]), start the 1-D [B] key
    starts of its padding term (None without one); None when the mask is neither. The nodes of the
    mask's chain are appended to `chain`."""
    if mask is None or dtype_of(mask) != torch.bool or len(shape_of(mask) or ()) != 4:
        return None
    if str(shape_of(mask)[-1]) != str(shape_of(keys)[-2]):
        return None
    got = computed_positions(mask, keys, chain)
    if got is not None:
        return got
    pos = _tril_positions(mask, ctx, chain)
    return None if pos is None else (pos, None)


def _tril_positions(mask, ctx, chain):
    """pos when `mask` is tril_buffer[None, None, pos] (the key dim checked by the caller)."""
    seen = []
    n = mask
    while is_call(n, aten.slice.Tensor):  # mask[..., :Sk]
        if arg(n, "dim") not in (-1, 3) or node_int(arg(n, "start") or 0) != 0 or arg(n, "step") != 1:
            return None
        seen.append(n)
        n = arg(n, "self")
    n = _strip_unsqueeze(n, seen)
    if not is_call(n, aten.index.Tensor):
        return None
    seen.append(n)
    base = _strip_unsqueeze(arg(n, "self"), seen)
    idx = list(arg(n, "indices"))
    rank = len(shape_of(arg(n, "self")) or ())
    # exactly one index tensor, on the buffer's row dim (rank - 2 of the indexed tensor)
    if len(idx) != rank - 1 or any(i is not None for i in idx[:-1]) or idx[-1] is None:
        return None
    pos = idx[-1]
    if dtype_of(pos) not in (torch.int32, torch.int64) or len(shape_of(pos) or ()) != 1:
        return None
    buf = ctx.constant(base)
    if buf is None or buf.dtype != torch.bool or buf.dim() != 2 or buf.shape[0] != buf.shape[1] or not is_tril(buf):
        return None
    chain += seen
    return pos


# --- the mask HF computes in forward ------------------------------------------------------------

_AND = (aten.__and__.Tensor, aten.bitwise_and.Tensor, aten.logical_and.default)
_CASTS = (aten.to.dtype_layout, aten.to.dtype, aten.to.device, aten._to_copy.default)
_TRUE = (aten.new_ones.default, aten.ones.default)


def _strip(n, seen, ops):
    """Skip unsqueezes and full slices ("view" in ops) or bool-to-bool casts ("cast" in ops)."""
    while True:
        view = is_call(n, aten.unsqueeze.default) or is_call(n, aten.slice.Tensor) and full_slice(n)
        cast = is_call(n, *_CASTS) and dtype_of(n) == torch.bool == dtype_of(arg(n, "self"))
        if not (view and "view" in ops or cast and "cast" in ops):
            return n
        seen.append(n)
        n = arg(n, "self")


def _ones_but(n, dim: int) -> bool:
    """n's shape is all 1 but (maybe) at `dim`."""
    shape = shape_of(n)
    return shape is not None and all(str(d) == "1" for i, d in enumerate(shape) if i != dim % len(shape))


def _key_index(n, sk, seen, dim: int = -1) -> bool:
    """n is arange(Sk) (from 0, step 1, maybe `+ 0`) laid along `dim` (the last: key k's index is k;
    dim 0: batch row b's is b)."""
    if not _ones_but(n, dim):
        return False
    x = _strip(n, seen, ("view",))
    if is_call(x, aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar) and \
            node_int(arg(x, "other")) == 0:  # HF's kv_offset, 0 for a static cache
        seen.append(x)
        x = arg(x, "self")
    start = 0 if is_call(x, aten.arange.default) else arg(x, "start") if is_call(x, aten.arange.start) else None
    if node_int(start) != 0 or len(shape_of(x) or ()) != 1 or str(shape_of(x)[0]) != str(sk):
        return False
    seen.append(x)
    return True


def _query_positions(n, seen):
    """The 1-D integer tensor that n lays along dim -2 (query rows) with every other dim 1, else None."""
    if not _ones_but(n, -2) or len(shape_of(n)) < 2:
        return None
    x = _strip(n, seen, ("view",))
    if len(shape_of(x) or ()) != 1 or dtype_of(x) not in (torch.int32, torch.int64):
        return None
    return x


def _terms(n, seen, out):
    """The operands of a tree of `and`s (through bool casts)."""
    n = _strip(n, seen, ("cast",))
    if is_call(n, *_AND):
        seen.append(n)
        _terms(arg(n, "self"), seen, out)
        _terms(arg(n, "other"), seen, out)
    else:
        out.append(n)
    return out


def _always_true(t) -> bool:
    return is_call(t, *_TRUE) and dtype_of(t) == torch.bool and len(shape_of(t) or ()) == 0


def _window_keeps_all(t, pos, sk, seen) -> bool:
    """t is `kv > q - w` (or `q - w < kv`) over the same positions, with w >= Sk: true for every key."""
    a, b = (arg(t, "self"), arg(t, "other")) if is_call(t, aten.gt.Tensor) else \
        (arg(t, "other"), arg(t, "self")) if is_call(t, aten.lt.Tensor) else (None, None)
    if a is None or not is_call(b, aten.sub.Tensor, aten.sub.Scalar) or arg(b, "alpha", 1) != 1:
        return False
    w, sk = node_int(arg(b, "other")), static_int(sk)
    mine = []
    if w is None or sk is None or w < sk or not _key_index(a, sk, mine) or _query_positions(arg(b, "self"), mine) is not pos:
        return False
    seen += [t, b, *mine]
    return True


def _laid_along_rows(n, seen):
    """The 1-D integer tensor [B] that n lays along dim 0 with every other dim 1, else None."""
    if not _ones_but(n, 0):
        return None
    x = _strip(n, seen, ("view",))
    return x if len(shape_of(x) or ()) == 1 and dtype_of(x) in (torch.int32, torch.int64) else None


def _key_compare(x):
    """(key index side, start side) of `kv >= start` / `start <= kv`, else (None, None)."""
    if is_call(x, aten.ge.Tensor):
        return arg(x, "self"), arg(x, "other")
    if is_call(x, aten.le.Tensor):
        return arg(x, "other"), arg(x, "self")
    return None, None


def gather_start(x, seen):
    """(start, kv) when x is `am[b, kv]`: b = arange(B) along dim 0, kv = arange(Sk) along the last dim and
    am = (arange(L)[None, :] >= start[:, None]) with L >= Sk (module notes), so x is `kv >= start[b]`; else
    None. start: the 1-D int node [B]; the nodes read are appended to `seen` (with export's dtype checks)."""
    if not is_call(x, aten.index.Tensor) or len(arg(x, "indices")) != 2:
        return None
    src, (bi, ki) = arg(x, "self"), arg(x, "indices")
    shape, sk = shape_of(src) or (), (shape_of(ki) or (None,))[-1]
    mine = [x]
    if len(shape) != 2 or bi is None or ki is None or not (_key_index(bi, shape[0], mine, dim=0) and
                                                           _key_index(ki, sk, mine)):
        return None
    am = _strip(src, mine, ("cast",))
    kv, start = _key_compare(am)
    length, keys = static_int(shape[1]), static_int(sk)
    if kv is None or not (str(shape[1]) == str(sk) or None not in (length, keys) and length >= keys):
        return None
    start = _laid_along_rows(start, mine)
    if start is None or str(shape_of(start)[0]) != str(shape[0]) or not _key_index(kv, shape[1], mine):
        return None
    mine.append(am)
    seen += mine + [a for n in mine for a in asserts(n)]  # export's dtype checks of the chain go with it
    return start, ki


def padding_start(t, sk, seen):
    """start (a 1-D int node [B]) when t is `kv >= start[b]` over the Sk keys: `kv >= start4` with kv =
    arange(Sk) along the last dim and start4 the [B] starts along dim 0 (what `lower_padding_gather` makes of
    HF's term), or that gather itself (`gather_start`); else None."""
    mine = []
    x = _strip(t, mine, ("cast",))
    got = gather_start(x, mine)
    if got is not None:
        start, kv = got
    else:
        kv, start = _key_compare(x)
        start = None if kv is None else _laid_along_rows(start, mine)
        mine.append(x)
    if start is None or not _key_index(kv, sk, mine):
        return None
    seen += mine
    return start


def computed_positions(mask, keys, chain):
    """(pos, start) when `mask` is HF's causal mask computed from the positions `pos` over `keys`' Sk
    cache slots, and-ed with at most one padding term of key starts `start` (None without one; module
    notes), else None; the mask's nodes are appended to `chain`."""
    seen = []
    n = mask
    if is_call(n, aten.expand.default):
        seen.append(n)
        n = arg(n, "self")
    sk = shape_of(keys)[-2]
    pos, start, rest = None, None, []
    for t in _terms(n, seen, []):
        if _always_true(t):
            seen.append(t)
            continue
        if start is None and (start := padding_start(t, sk, seen)) is not None:
            continue
        if not is_call(t, aten.le.Tensor, aten.ge.Tensor):
            rest.append(t)
            continue
        kv, q = (arg(t, "self"), arg(t, "other")) if is_call(t, aten.le.Tensor) else (arg(t, "other"), arg(t, "self"))
        p = _query_positions(q, seen)
        if p is None or (pos is not None and p is not pos) or not _key_index(kv, sk, seen):
            return None
        pos = p
        seen.append(t)
    if pos is None or not all(_window_keeps_all(t, pos, sk, seen) for t in rest):
        return None
    chain += seen
    return pos, start
