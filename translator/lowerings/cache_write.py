"""State writes as the scatter kernel, in place: `flydsl.cache_write(dst, values, ids, dim)`.

Forms matched (where they appear):
- ``cache[:, :, input_pos] = k`` (``aten.index_put_`` with one integer index tensor): gpt-fast's
  KVCache.update, the static caches written by hand in most fast-generation references;
- ``keys.index_copy_(2, cache_position, k)`` (``aten.index_copy_``): HF's StaticCache;
- ``cache[:, :, a:b].copy_(k)`` / ``buf.copy_(x)`` (``aten.copy_`` left after functionalize: its
  destination is state or a view of it), recurrent state written in place;
- ``index_copy(zeros(...), 2, pos, k)``, functional, on a tensor the graph has just allocated and
  reads nowhere else: dynamo's prefill graph of HF's StaticCache, where the cache is made in the
  compiled region (`lazy_initialization`: `self.keys = torch.zeros(...)`, then `index_copy_`, which
  functionalization made out of place; the result is a graph output that dynamo hands to the cache
  object, the storage every later decode graph writes). Nothing else can see the allocation, so
  writing it in place is the same value, with no clone of the whole cache: the allocation stays (a
  fresh zeros per call, never folded: the write marks it written, translator.aliases), the write is
  `flydsl.cache_write` into it, which the RoPE rule takes into its launch (rope_cache.py).

What the state contract (docs/state.md) asks: the storage the graph writes is the one the user's
buffer (torch.compile) or the translated module's one copy (translate) holds. So the node writes
`dst` where it lies and returns nothing: the custom op's schema says it mutates `dst`
(``Tensor(a!)``), which keeps it out of dead-code elimination, and every later reader of the
in-place op's result reads `dst` itself (the storage analysis of translator/aliases.py sees the
write through the schema, so no pass moves a read of that storage across it). No functionalized
clone, no copy: the kernel (translator_kernels.layout.scatter) walks the values and stores each
element at its destination offset, the indexed dim read from the ids on the device.

An index out of range raises IndexError on CPU tensors (flysim), as eager's index_put_ does; on a
GPU the flag stays on the device (no host read on the per-call path) and the row is not written.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..graph import arg, dtype_of, shape_of, val
from ..registry import NO_MATCH, Match, OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch
from .layout import LAYOUT_DTYPES, _ids_reason, one_index

aten = torch.ops.aten


@torch.library.custom_op("flydsl::cache_write", mutates_args=("dst",))
def cache_write(dst: torch.Tensor, values: torch.Tensor, ids: Optional[torch.Tensor], dim: int) -> None:
    dispatch("cache_write", dst, values, ids, dim)


@cache_write.register_fake
def _(dst, values, ids, dim):
    return None


def ref_cache_write(dst, values, ids, dim):
    """The write in plain torch, in place (dim < 0: a copy into all of dst)."""
    if ids is None:
        dst.copy_(values)
    else:
        dst[(slice(None),) * dim + (ids,)] = values
    return None


def kernel_cache_write(dst, values, ids, dim):
    from translator_kernels.layout.scatter import write

    return write(dst, values, None if ids is None else dim, ids)


register_family(OpFamily(
    name="cache_write", description="a state write (KV cache slot, slice copy) stored in place by the scatter kernel",
    reference=ref_cache_write, kernel=kernel_cache_write, kernel_entry="translator_kernels.layout.scatter:write",
    sample_inputs=lambda dt: (torch.zeros(1, 2, 8, 4, dtype=dt), torch.randn(1, 2, 3, 4).to(dt), torch.tensor([1, 4, 6]),
                              2),
))


# --- support ------------------------------------------------------------------------------------

def _common(node, dst, values) -> str | None:
    if not isinstance(val(dst), torch.Tensor) or not isinstance(val(values), torch.Tensor):
        return "the destination or the values are not a tensor"
    if dtype_of(dst) not in LAYOUT_DTYPES:
        return f"dtype {str(dtype_of(dst)).replace('torch.', '')} is not moved by the scatter kernel (real and bool only)"
    if dtype_of(values) != dtype_of(dst):
        return (f"values are {str(dtype_of(values)).replace('torch.', '')} but the destination is "
                f"{str(dtype_of(dst)).replace('torch.', '')} (a write with a cast)")
    if val(dst).device != val(values).device:
        return "values and destination on different devices"
    return None


def index_put_supported(node, ctx):
    if arg(node, "accumulate", False):
        return "index_put_ with accumulate=True (a scatter-add, not a state write)"
    d, reason = one_index(list(arg(node, "indices")))
    return reason or _common(node, arg(node, "self"), arg(node, "values")) or Match(dim=d)


def _in_place(node, ctx, dst, values, ids, dim, lowering):
    """The write before `node`; `node`'s readers read `dst` (the storage it wrote)."""
    ctx.emit("cache_write", (dst, values, ids, dim), lowering=lowering, sources=[node], anchor=node, before=node)
    node.replace_all_uses_with(dst)
    ctx.graph.erase_node(node)
    return dst


@rule(Stage.CANONICAL, aten.index_put_.default, family="cache_write", supported=index_put_supported,
      doc="cache[:, :, pos] = k (index_put_ with one index tensor), written in place")
def lower_index_put_(node, ctx, m):
    return _in_place(node, ctx, arg(node, "self"), arg(node, "values"), arg(node, "indices")[m.dim], m.dim, "index_put_")


def index_copy_supported(node, ctx):
    ids = arg(node, "index")
    if isinstance(val(ids), torch.Tensor) and val(ids).dim() > 1:
        return "index_copy_ with a multi-dim index"
    return _ids_reason(ids) or _common(node, arg(node, "self"), arg(node, "source"))


@rule(Stage.CANONICAL, aten.index_copy_.default, family="cache_write", supported=index_copy_supported,
      doc="keys.index_copy_(dim, pos, k) (HF's StaticCache), written in place")
def lower_index_copy_(node, ctx):
    dst = arg(node, "self")
    dim = int(arg(node, "dim")) % max(len(shape_of(dst)), 1)
    return _in_place(node, ctx, dst, arg(node, "source"), arg(node, "index"), dim, "index_copy_")


FRESH = (aten.zeros.default, aten.new_zeros.default, aten.zeros_like.default, aten.full.default,
         aten.new_full.default, aten.full_like.default)


def index_copy_fresh_supported(node, ctx):
    base = arg(node, "self")
    if not (isinstance(base, torch.fx.Node) and base.op == "call_function" and base.target in FRESH):
        return NO_MATCH  # a functional write into a tensor something else holds: its own value, left as it is
    if len(base.users) != 1:
        return NO_MATCH
    return index_copy_supported(node, ctx)


@rule(Stage.CANONICAL, aten.index_copy.default, family="cache_write", supported=index_copy_fresh_supported,
      doc="index_copy(zeros(..), dim, pos, k) on a fresh allocation read nowhere else: written into it in place")
def lower_index_copy_fresh(node, ctx):
    return lower_index_copy_(node, ctx)


def copy_supported(node, ctx):
    return _common(node, arg(node, "self"), arg(node, "src"))


@rule(Stage.CANONICAL, aten.copy_.default, family="cache_write", supported=copy_supported,
      doc="dst.copy_(src) into state or a view of it (a slice of a cache), written in place")
def lower_copy_(node, ctx):
    return _in_place(node, ctx, arg(node, "self"), arg(node, "src"), None, -1, "copy_")
