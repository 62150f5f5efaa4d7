"""The scatter kernel: dst[map(i)] = values[i], in place, in the destination's own storage.

The layout kernel (translator_kernels.layout.kernel) computes a new tensor: per output element,
where to read. A state write (a KV cache written by `cache[:, :, pos] = k`, `index_copy_`, or
`copy_` into a slice) is the other direction: per element of the values, where to write in a
tensor that already exists and that other graphs and the user hold. So this kernel walks the
*values* (the written region's shape, values broadcast to it by stride 0) and computes each
element's destination offset with the layout family's `SrcDim` maps over the destination's dims:

    copy_ into a view         every destination dim reads one region dim (mode "none")
    index_put_ / index_copy_  one destination dim is `ids[...]` (mode "index", negative ids
                              counting from the end); the others read region dims

The destination is addressed as a flat buffer from its first element with its strides (a slice of
a buffer is written where it lies); nothing is allocated, nothing is returned. An id out of range
stores nothing and raises the flag word; the host raises `IndexError` where reading the flag costs
no device synchronization (CPU tensors, where flysim runs), as the gather kernels do.

One thread per region vector of VEC elements (up to 128 bits where both the values and the
destination keep the region's last dim contiguous and aligned), BLOCK threads per workgroup, the
last workgroup masked. Static like the layout kernel: the builder is memoized per `Scatter`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch

from translator_kernels import launch as kl
from translator_kernels import replay as kr
from translator_kernels.codegen.host import current_arch
from translator_kernels.errors import KernelInputError
from translator_kernels.layout import _DUMMY, _INT, MAX_BYTES, MAX_VEC, _bits_view, _geometry_index
from translator_kernels.layout.kernel import (BLOCK, Layout, SrcDim, _raise_flag, _source_index, _store, _value,
                                             out_coords, vector_grid)


@dataclass(frozen=True)
class Scatter:
    """One in-place write, static: what the builder is memoized on."""

    read: Layout  # the region's shape, the values' map (identity with the values' strides), vec
    dst: tuple  # SrcDim per destination dim
    dst_strides: tuple  # in elements

    def vectorizable(self, vec: int) -> bool:
        """Whether VEC-element vectors of the region's last dim are contiguous, aligned destination
        vectors (the read side checks itself: Layout.vectorizable)."""
        if vec == 1:
            return True
        last = len(self.read.out_shape) - 1
        if not self.read.vectorizable(vec):
            return False
        for s, st in zip(self.dst, self.dst_strides):
            uses = [t for t in s.terms if t[0] == last] + [t for t in s.ids if t[0] == last]
            if not uses:
                if st % vec and (s.terms or s.ids or s.offset):
                    return False
                continue
            if s.mode != "none" or uses != [(last, 1, 1)] or st != 1 or s.offset % vec or s.size % vec:
                return False
        return True


def _dst_offset(sc: Scatter, v, Ids, vshape, ostride):
    """(destination element offset of vector `v`, all-ids-in-range flag or None): plain Python over the
    static map, outside the kernel body, so the kernel's AST rewriter sees no loops."""
    return dst_offset(sc.dst, sc.dst_strides, out_coords(v, vshape, ostride, sc.read.vec), Ids, sc.read.id_words)


def dst_offset(dst, dst_strides, coords, Ids, words):
    """(element offset in the destination of the element at `coords` of the written region, all-ids-in-range
    flag or None): each destination dim's index (a slice or ids read on the device) times its stride."""
    off, good = 0, None
    for s, stride in zip(dst, dst_strides):
        idx, _, ok = _source_index(s, coords, Ids, words)
        if not isinstance(idx, int) or idx:
            off = off + idx * stride
        if ok is not None:
            good = ok if good is None else good & ok
    return fx.Int32(off), good


@kl.builder
def build_scatter(sc: Scatter, arch: str):
    """Launcher `launch(values, ids, dst, flag)`: flat values / dst buffers of the element width's
    integer type, ids as int32 words (a one-word dummy when no dim is indexed), flag one int32
    word. arch keys the cache."""
    lay = sc.read
    VEC, bits = lay.vec, lay.bits
    vshape, nv, ostride, grid = vector_grid(lay)
    checks = lay.id_words > 0

    @flyc.kernel
    def scatter_kernel(Val: fx.Tensor, Ids: fx.Tensor, Dst: fx.Tensor, Flag: fx.Tensor):
        v = fx.Int32(fx.block_idx.x) * BLOCK + fx.thread_idx.x
        live = v < nv
        v = live.select(v, 0)
        x, _ = _value(lay, v, Val, Ids, vshape, ostride)
        off, good = _dst_offset(sc, v, Ids, vshape, ostride)
        if checks:
            if live & good:
                _store(Dst, bits, VEC, x, off // VEC if VEC > 1 else off)
            if live & ~good:
                _raise_flag(Flag)
        else:
            if live:
                _store(Dst, bits, VEC, x, off // VEC if VEC > 1 else off)

    @flyc.jit
    def launch(Val: fx.Tensor, Ids: fx.Tensor, Dst: fx.Tensor, Flag: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        scatter_kernel(Val, Ids, Dst, Flag).launch(grid=(grid, 1, 1), block=(BLOCK, 1, 1), stream=stream)

    return launch


# --- host entry ----------------------------------------------------------------------------------

MAX_PLANS = 4096
_PLANS: dict = {}  # (dst / values / ids geometry, dim, arch, base alignments) -> (Scatter, launcher)


def _region(dst: torch.Tensor, dim, ids):
    """(region shape, SrcDim per destination dim) of a write into `dst`, indexed at `dim` by ids."""
    if ids is None:
        return tuple(dst.shape), tuple(SrcDim(s, ((j, 1, 1),)) for j, s in enumerate(dst.shape))
    src, shape, _ = _geometry_index(dst, dim, ids)  # the read x[..., ids] addresses what the write stores
    return tuple(shape), src


def _plan(dst, values, dim, ids, arch):
    sc, extent = scatter_map(dst, values, dim, ids)
    return sc, extent, build_scatter(sc, arch)


def scatter_map(dst, values, dim, ids, op: str = "scatter"):
    """(Scatter, destination extent in elements) of the write dst[..., ids, ...] = values (checked);
    the fused RoPE + cache-write kernel (layout/rope_cache.py) stores its V section with it."""
    if values.dtype != dst.dtype:
        raise KernelInputError(f"{op}: values are {values.dtype} but the destination is {dst.dtype}; cast them first")
    if values.device != dst.device:
        raise KernelInputError(f"{op}: values are on {values.device} but the destination is on {dst.device}")
    _bits_view(dst[:0] if dst.dim() else dst)  # dtype check
    if ids is not None:
        if ids.dtype not in (torch.int32, torch.int64) or ids.device != dst.device:
            raise KernelInputError(f"{op}: indices must be an int64 or int32 tensor on {dst.device}, got "
                                   f"{ids.dtype} on {ids.device}")
        if not 0 <= dim < dst.dim():
            raise KernelInputError(f"{op}: dim {dim} is out of range for a destination of {dst.dim()} dims")
    shape, dmap = _region(dst, dim, ids)
    try:
        if len(values.shape) > len(shape) or torch.broadcast_shapes(values.shape, shape) != torch.Size(shape):
            raise RuntimeError
    except RuntimeError:
        raise KernelInputError(f"{op}: values {tuple(values.shape)} do not broadcast to the written region "
                               f"{shape}") from None
    vals = values.expand(shape)
    esize = dst.element_size()
    extent = 1 + sum((s - 1) * st for s, st in zip(dst.shape, dst.stride()))
    if max(extent, vals.numel()) * esize >= MAX_BYTES:
        raise KernelInputError(f"{op}: a tensor spans >= 2 GiB (32-bit buffer offsets); split it")
    vst = vals.stride()
    read = tuple(SrcDim(1) if st == 0 or s == 1 else SrcDim(s, ((d, 1, 1),)) for d, (s, st) in enumerate(zip(shape, vst)))
    words = 0 if ids is None else (2 if ids.dtype == torch.int64 else 1)
    vec = min(MAX_VEC, 16 // esize)
    while vec > 1:
        sc = Scatter(Layout(shape, esize * 8, read, tuple(vst), 0, words, vec), dmap, tuple(dst.stride()))
        if sc.vectorizable(vec) and all(t.data_ptr() % (vec * esize) == 0 for t in (dst, vals)):
            break
        vec //= 2
    sc = Scatter(Layout(shape, esize * 8, read, tuple(vst), 0, words, vec), dmap, tuple(dst.stride()))
    return sc, extent


def _check_ids(flag, ids, size):
    if int(flag[0]):
        flat = ids.reshape(-1)
        bad = flat[(flat >= size) | (flat < -size)]
        raise IndexError(f"scatter: index {int(bad[0])} is out of range for a dim of size {size} "
                         f"({bad.numel()} indices out of range); indices must lie in [{-size}, {size})")


@kr.replayed
def write(dst: torch.Tensor, values: torch.Tensor, dim: int | None = None, ids: torch.Tensor | None = None) -> None:
    """dst[..., ids, ...] = values (ids at `dim`), or dst.copy_(values) with no ids: in place, values
    broadcast to the written region. Returns nothing: `dst` (any strided view) holds the result."""
    if ids is not None and isinstance(ids, torch.Tensor) and ids.dim() == 0:
        ids = ids.reshape(1)
    arch = current_arch()
    try:
        key = (dst.shape, dst.stride(), dst.dtype, dst.device, values.shape, values.stride(), values.dtype, dim,
               None if ids is None else (ids.shape, ids.dtype, ids.device), arch, dst.data_ptr() % 16,
               values.data_ptr() % 16)
    except AttributeError:
        raise KernelInputError(f"scatter: expected tensors, got {type(dst).__name__} and "
                               f"{type(values).__name__}") from None
    hit = _PLANS.get(key)
    if hit is None:
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        hit = _PLANS[key] = _plan(dst, values, dim, ids, arch)
    sc, extent, launcher = hit
    vals = values.expand(sc.read.out_shape)
    if not sc.read.numel:
        return None
    itype = _INT[dst.element_size()] if dst.dtype != torch.bool else torch.uint8
    # flat views first, then the integer dtype: a per-call replay replays an as_strided of an argument
    # relative to the argument's own storage offset
    dst_flat = torch.as_strided(dst, (extent,), (1,))
    dst_flat = dst_flat if dst.dtype == itype else dst_flat.view(itype)
    vext = 1 + sum((s - 1) * st for s, st in zip(vals.shape, vals.stride()))
    val_flat = torch.as_strided(vals, (vext,), (1,))
    val_flat = val_flat if vals.dtype == itype else val_flat.view(itype)
    dummy = _DUMMY.get(dst.device)
    if dummy is None:
        dummy = _DUMMY[dst.device] = torch.zeros(1, dtype=torch.int32, device=dst.device)
    if ids is None:
        kl.call(launcher, val_flat, dummy, dst_flat, dummy)
        return None
    flag = torch.zeros(1, dtype=torch.int32, device=dst.device)
    ids32 = ids.reshape(-1).contiguous().view(torch.int32)
    kl.call(launcher, val_flat, ids32, dst_flat, flag)
    if flag.device.type == "cpu":  # a host read: a per-call replay repeats it (replay_effect)
        kr.replay_effect(_check_ids, flag, ids, dst.shape[dim])
    return None
