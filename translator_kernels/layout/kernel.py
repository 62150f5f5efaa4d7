"""The layout kernel: out[i] = src[map(i)], or a fill value where the map says so.

Every data-movement op (pad, roll, repeat, expand, index_select / index, unfold,
repeat_interleave, zeros / full) is one `Layout`: the output shape, the source's shape and
strides (any strided view: a slice or a transpose is read in place, never copied first), and per
source dim one `SrcDim` saying how its index comes from the output index:

    x = offset + sum(coef * (i[d] // div) for (d, coef, div) in terms)      (affine in the out index)
    mode "none":   x                         (in range by construction: expand, unfold, repeat_interleave)
         "mod":    x mod size                (roll, repeat; the host keeps x >= 0)
         "fill":   x, or the fill value where x is outside [0, size)    (constant pad, negative pad crops)
         "clamp":  x clamped to [0, size)    (replicate pad)
         "reflect": -x below 0, 2 (size - 1) - x past the end            (reflect pad, pad < size)
         "index":  ids[sum(i[d] * stride)] read from an int32 / int64 tensor (index_select, x[ids]);
                   negative ids count from the end where `wrap` (advanced indexing), an id out of
                   range reads element 0, stores the fill value and raises the flag word.

A source dim with no terms reads index `offset` (broadcast: expand's size-1 dims). With no
source at all (zeros, full) the kernel only stores the fill value.

The kernel moves bits: every dtype is read and written as the unsigned / signed integer of its
width (8: bool, int8, uint8; 16: bf16, f16, int16; 32: f32, int32; 64: int64, f64), so there is
no conversion and NaN payloads survive. The fill value is given as those bits.

One thread per output vector of VEC elements, BLOCK threads per workgroup, the last workgroup
masked (tail threads compute vector 0 and store nothing). VEC > 1 (up to 128 bits) only where
the map keeps a vector contiguous in the source: the output's last dim is read as source index
x = i_last + offset along a unit-stride source dim (no div, no index, VEC divides the offset,
the sizes and the other strides). Everything is static: the builder is memoized per `Layout`
and arch, like the generated elementwise kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import flydsl.compiler as flyc
import flydsl.expr as fx

from translator_kernels import launch as kl
from translator_kernels.gather import _word  # one 32-bit word of a flat int32 buffer (the ids' reader)

BLOCK = 256
MODES = ("none", "mod", "fill", "clamp", "reflect", "index")
ELEM = {8: fx.Uint8, 16: fx.Int16, 32: fx.Int32, 64: fx.Int64}
_COPY = {8: fx.rocdl.BufferCopy8b, 16: fx.rocdl.BufferCopy16b, 32: fx.rocdl.BufferCopy32b,
         64: fx.rocdl.BufferCopy64b, 128: fx.rocdl.BufferCopy128b}


@dataclass(frozen=True)
class SrcDim:
    """How one source dim's index is computed from the output index (see the module docstring)."""

    size: int
    terms: tuple = ()  # ((out dim, coef, div), ...)
    offset: int = 0
    mode: str = "none"
    ids: tuple = ()  # mode "index": ((out dim, stride in the flat ids tensor), ...)
    wrap: bool = False  # mode "index": negative ids count from the end


@dataclass(frozen=True)
class Layout:
    """A whole data-movement op, static: what the builder is memoized on."""

    out_shape: tuple
    bits: int  # element width: 8, 16, 32, 64
    src: tuple | None = None  # SrcDim per source dim; None: a fill
    src_strides: tuple = ()  # in elements
    fill: int = 0  # the fill value's bits
    id_words: int = 0  # 1: int32 ids, 2: int64 ids, 0: no ids tensor
    vec: int = 1

    @property
    def numel(self) -> int:
        return math.prod(self.out_shape)

    @property
    def has_fill(self) -> bool:
        return self.src is None or any(s.mode in ("fill", "index") for s in self.src)

    def reads_last(self) -> bool:
        """Whether any source index depends on the output's last dim (else a vector is one splat)."""
        last = len(self.out_shape) - 1
        return self.src is not None and any(t[0] == last for s in self.src for t in s.terms + s.ids)

    def vectorizable(self, vec: int) -> bool:
        """Whether VEC-element vectors of the output's last dim are contiguous source vectors (or one
        source element splat: no source index depends on the last dim)."""
        if vec == 1:
            return True
        if not self.out_shape or self.out_shape[-1] % vec:
            return False
        if not self.reads_last():
            return True
        last = len(self.out_shape) - 1
        for s, st in zip(self.src, self.src_strides):
            uses = [t for t in s.terms if t[0] == last] + [t for t in s.ids if t[0] == last]
            if not uses:
                if st % vec and (s.terms or s.ids or s.offset):
                    return False
                continue
            if s.mode == "index" or uses != [(last, 1, 1)] or st != 1:
                return False
            if any(t[0] != last and (t[1] % vec or t[2] != 1) for t in s.terms):
                return False
            if s.offset % vec or s.size % vec or s.mode in ("clamp", "reflect"):
                return False
        return True


def _access(t, bits: int, vec: int):
    atom = fx.make_copy_atom(_COPY[vec * bits](), bits)
    return atom, fx.logical_divide(fx.rocdl.make_buffer_tensor(t), fx.make_layout(vec, 1))


def _source_index(s: SrcDim, coords, Ids, words: int):
    """(index into the source dim, in-range flag or None, bad-id flag or None) for one source dim."""
    if s.mode == "index":
        j = 0
        for d, stride in s.ids:
            j = j + coords[d] * stride
        lo = _word(Ids, j * words)
        hi = _word(Ids, j * 2 + 1) if words == 2 else (lo < 0).select(-1, 0)
        pos = (hi == 0) & (lo >= 0) & (lo < s.size)
        if s.wrap:
            neg = (hi == -1) & (lo < 0) & (lo >= -s.size)
            good = pos | neg
            x = neg.select(lo + s.size, lo)
        else:
            good, x = pos, lo
        return good.select(x, 0), None, good
    x = s.offset
    for d, coef, div in s.terms:
        c = coords[d] if div == 1 else coords[d] // div
        x = x + (c if coef == 1 else c * coef)
    if isinstance(x, int):  # broadcast: no out dim reaches this source dim
        return x, None, None
    if s.mode == "mod":
        return x % s.size, None, None
    if s.mode == "fill":
        inside = (x >= 0) & (x < s.size)
        return inside.select(x, 0), inside, None
    if s.mode == "clamp":
        x = (x < 0).select(0, x)
        return (x >= s.size).select(s.size - 1, x), None, None
    if s.mode == "reflect":
        x = (x < 0).select(-x, x)
        return (x >= s.size).select(2 * (s.size - 1) - x, x), None, None
    return x, None, None


def vector_grid(lay: Layout):
    """(vector shape, vectors, the vector shape's strides, workgroups) of a kernel that gives one
    thread each VEC-element vector of `lay.out_shape`."""
    shape = lay.out_shape or (1,)
    vshape = shape[:-1] + (shape[-1] // lay.vec,)
    nv = math.prod(vshape)
    ostride = [1] * len(vshape)
    for d in range(len(vshape) - 2, -1, -1):
        ostride[d] = ostride[d + 1] * vshape[d + 1]
    return vshape, nv, ostride, max(1, -(-nv // BLOCK))


def out_coords(v, vshape, ostride, vec: int) -> list:
    """The element index per dim of vector `v`'s first element."""
    last = len(vshape) - 1
    coords = []
    for d in range(len(vshape)):
        c = v if ostride[d] == 1 else v // ostride[d]
        if d > 0:
            c = c % vshape[d]
        coords.append(c * vec if d == last and vec > 1 else c)
    return coords


def _value(lay: Layout, v, Src, Ids, vshape, ostride):
    """(the vector thread `v` stores, the all-ids-in-range flag or None): plain Python over the
    static map, so the kernel's AST rewriter sees no loops."""
    vec, et = lay.vec, ELEM[lay.bits]
    coords = out_coords(v, vshape, ostride, vec)
    fill = fx.Vector.filled(vec, lay.fill, et)
    if lay.src is None:
        return fill, None
    off, inside, good = 0, None, None
    for s, stride in zip(lay.src, lay.src_strides):
        idx, ins, ok = _source_index(s, coords, Ids, lay.id_words)
        if not isinstance(idx, int) or idx:
            off = off + idx * stride
        if ins is not None:
            inside = ins if inside is None else inside & ins
        if ok is not None:
            good = ok if good is None else good & ok
    keep = inside if good is None else (good if inside is None else inside & good)
    if keep is not None:
        off = keep.select(off, 0)
    off = fx.Int32(off)
    width = vec if lay.reads_last() else 1  # else one element, splat
    atom, view = _access(Src, lay.bits, width)
    r = fx.make_rmem_tensor(width, et)
    fx.copy(atom, fx.slice(view, (None, off // width if width > 1 else off)), r)
    x = fx.memref_load_vec(r)
    if width < vec:
        x = fx.Vector.filled(vec, x[0], et)
    if keep is not None:
        x = fx.Vector.filled(vec, keep, fx.Boolean).select(x, fill)
    return x, good


def _store(Out, bits: int, vec: int, x, v):
    atom, view = _access(Out, bits, vec)
    r = fx.make_rmem_tensor(vec, ELEM[bits])
    fx.memref_store_vec(x, r)
    fx.copy(atom, r, fx.slice(view, (None, v)))


def _raise_flag(Flag):
    one = fx.make_rmem_tensor(1, fx.Int32)
    fx.memref_store_vec(fx.Vector.filled(1, 1, fx.Int32), one)
    view = fx.logical_divide(fx.rocdl.make_buffer_tensor(Flag), fx.make_layout(1, 1))
    fx.copy(fx.make_copy_atom(fx.rocdl.BufferCopy32b(), 32), one, fx.slice(view, (None, 0)))


@kl.builder
def build_layout(lay: Layout, arch: str):
    """Launcher `launch(src, ids, out, flag)`: flat src / out buffers of `lay.bits`-wide elements,
    ids as int32 words (a one-word dummy when the map reads none), flag one int32 word. arch keys
    the cache."""
    VEC, bits = lay.vec, lay.bits
    vshape, nv, ostride, grid = vector_grid(lay)
    checks = lay.id_words > 0

    @flyc.kernel
    def layout_kernel(Src: fx.Tensor, Ids: fx.Tensor, Out: fx.Tensor, Flag: fx.Tensor):
        v = fx.Int32(fx.block_idx.x) * BLOCK + fx.thread_idx.x
        live = v < nv
        v = live.select(v, 0)
        x, good = _value(lay, v, Src, Ids, vshape, ostride)
        if live:
            _store(Out, bits, VEC, x, v)
        if checks:
            if live & ~good:
                _raise_flag(Flag)

    @flyc.jit
    def launch(Src: fx.Tensor, Ids: fx.Tensor, Out: fx.Tensor, Flag: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        layout_kernel(Src, Ids, Out, Flag).launch(grid=(grid, 1, 1), block=(BLOCK, 1, 1), stream=stream)

    return launch
