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
Anything else keeps its mask tensor.
"""

from __future__ import annotations

import torch

from ..graph import arg, aten, dtype_of, is_call, shape_of
from .attention_forms import is_tril, node_int


def _strip_unsqueeze(n, chain):
    while is_call(n, aten.unsqueeze.default):
        chain.append(n)
        n = arg(n, "self")
    return n


def cache_positions(mask, keys, ctx, chain):
    """pos (a 1-D int node) when `mask` is tril_buffer[None, None, pos] over the keys of `keys`
    ([B, Hkv, Sk, D]), else None; the nodes of the mask's chain are appended to `chain`."""
    if mask is None or dtype_of(mask) != torch.bool or len(shape_of(mask) or ()) != 4:
        return None
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
    if str(shape_of(mask)[-1]) != str(shape_of(keys)[-2]):
        return None
    chain += seen
    return pos
