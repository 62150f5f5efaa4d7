"""Data-movement ops as one FlyDSL kernel family: host entry points.

Each entry point (`pad`, `roll`, `repeat`, `expand`, `index_select`, `index`, `unfold`,
`repeat_interleave`, `fill`) writes its op as a `Layout` (translator_kernels.layout.kernel: per
source dim an affine / modular / clamped / indexed map of the output index) from the shapes it is
given at run time, and `run` launches the one layout kernel built for it. Nothing here computes
an output in torch: every element is stored by the kernel.

The source is read in place whatever its strides (a slice, a transpose, an expanded view): its
bytes are addressed as a flat buffer from the view's first element, and the strides are part of
the map. The output is a new contiguous tensor; nothing given is modified.

Index tensors (`index_select`, `index`) are bounds-checked on the device: an id outside the dim
reads element 0, stores the fill value and raises a flag word. The host raises `IndexError`
naming the first bad id where reading the flag costs no device synchronization (CPU tensors,
which is where flysim runs); on a GPU the flag stays on the device and those elements are zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from translator_kernels import launch as kl
from translator_kernels import replay as kr
from translator_kernels.errors import KernelInputError
from translator_kernels.codegen.host import current_arch
from translator_kernels.layout.kernel import Layout, SrcDim, build_layout

__all__ = ["Layout", "SrcDim", "run", "pad", "roll", "repeat", "expand", "index_select", "index", "unfold",
           "repeat_interleave", "fill", "PAD_MODES"]

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
MAX_BYTES = 2**31  # buffer offsets are 32-bit
MAX_VEC = 16
PAD_MODES = {"constant": "fill", "replicate": "clamp", "reflect": "reflect", "circular": "mod"}


def _bits_view(t: torch.Tensor) -> torch.Tensor:
    """`t` as the integer dtype of its element width (a free view)."""
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    if t.is_complex() or t.element_size() not in _INT:
        raise KernelInputError(f"layout: dtype {t.dtype} is not supported; use a real or bool dtype of 1, 2, 4 or 8 bytes")
    return t if t.dtype == _INT[t.element_size()] else t.view(_INT[t.element_size()])


def _fill_bits(value, dtype) -> int:
    return int(torch.tensor(value, dtype=dtype).reshape(1).view(_INT[torch.empty((), dtype=dtype).element_size()])[0]) \
        if dtype != torch.bool else int(bool(value))


def _check_tensor(op, x):
    if not isinstance(x, torch.Tensor):
        raise KernelInputError(f"{op}: expected a torch.Tensor, got {type(x).__name__}")
    _bits_view(x[:0] if x.dim() else x)  # dtype check


@dataclass
class _Geometry:
    """What a call needs once its op, shapes, strides and dtypes are known (cached per those)."""

    src: tuple | None  # SrcDim per source dim; None: a fill
    shape: tuple
    dtype: torch.dtype
    itype: torch.dtype  # the integer dtype of the element width
    extent: int  # source elements the flat view spans
    strides: tuple
    fill_bits: int
    words: int  # 0, or 32-bit words per id
    numel: int
    launchers: dict = field(default_factory=dict)  # (base addresses mod 16, arch) -> launcher

    def launcher(self, tensors):
        k = (tuple(t.data_ptr() % 16 for t in tensors), _arch())
        hit = self.launchers.get(k)
        if hit is None:
            esize = torch.empty((), dtype=self.itype).element_size()
            vec = min(MAX_VEC, 16 // esize)
            while vec > 1:
                lay = Layout(self.shape, esize * 8, self.src, self.strides, self.fill_bits, self.words, vec)
                if lay.vectorizable(vec) and all(t.data_ptr() % (vec * esize) == 0 for t in tensors):
                    break
                vec //= 2
            lay = Layout(self.shape, esize * 8, self.src, self.strides, self.fill_bits, self.words, vec)
            hit = self.launchers[k] = build_layout(lay, k[1])
        return hit


def geometry(lay_src: tuple | None, out_shape, dtype, *, src: torch.Tensor | None = None, ids: torch.Tensor | None = None,
         fill=0, op: str = "layout") -> _Geometry:
    """Validate one call and make its geometry: `lay_src` the SrcDim per source dim (None: a fill)."""
    out_shape = tuple(int(s) for s in out_shape)
    numel = math.prod(out_shape)
    esize = torch.empty((), dtype=dtype).element_size()
    if numel * esize >= MAX_BYTES:
        raise KernelInputError(f"{op}: output {out_shape} {dtype} spans >= 2 GiB (32-bit buffer offsets); split it")
    extent, strides = 0, ()
    if lay_src is not None:
        if src.numel() == 0 and numel:
            raise KernelInputError(f"{op}: the source {tuple(src.shape)} is empty but the output {out_shape} is not")
        extent = 1 + sum((s - 1) * st for s, st in zip(src.shape, src.stride()))
        if extent * esize >= MAX_BYTES:
            raise KernelInputError(f"{op}: the source spans >= 2 GiB (32-bit buffer offsets); split it")
        strides = tuple(src.stride())
    words = 0 if ids is None else (2 if ids.dtype == torch.int64 else 1)
    itype = torch.uint8 if dtype == torch.bool else _INT[esize]
    return _Geometry(lay_src, out_shape, dtype, itype, extent, strides, _fill_bits(fill, dtype), words, numel)


_DUMMY: dict = {}  # device -> a one-word int32 tensor the kernel never writes (no ids / no flag)


def launch(p: _Geometry, src: torch.Tensor | None, ids: torch.Tensor | None, device, op: str = "layout") -> torch.Tensor:
    """Allocate the output and launch the planned kernel."""
    out = torch.empty(p.shape, dtype=p.dtype, device=device)
    if not p.numel:
        return out
    out_flat = out.view(p.itype).view(-1)
    if p.src is None:
        src_flat = out_flat
    else:
        src_flat = torch.as_strided(src if src.dtype == p.itype else src.view(p.itype), (p.extent,), (1,))
    dummy = _DUMMY.get(device)
    if dummy is None:
        dummy = _DUMMY[device] = torch.zeros(1, dtype=torch.int32, device=device)
    if ids is None:
        ids32, flag = dummy, dummy
    else:
        ids32 = ids.reshape(-1).contiguous().view(torch.int32)
        flag = torch.zeros(1, dtype=torch.int32, device=device)
    kl.call(p.launcher((out_flat, src_flat)), src_flat, ids32, out_flat, flag)
    if ids is not None and flag.device.type == "cpu":  # a host read: a per-call replay repeats it (replay_effect)
        kr.replay_effect(_check_flag, flag, ids, p.src, op)
    return out


def _check_flag(flag, ids, src, op):
    if int(flag[0]):
        size = next(s.size for s in src if s.mode == "index")
        wrap = next(s.wrap for s in src if s.mode == "index")
        flat = ids.reshape(-1)
        bad = flat[(flat >= size) | (flat < (-size if wrap else 0))]
        raise IndexError(f"{op}: index {int(bad[0])} is out of range for a dim of size {size} "
                         f"({bad.numel()} indices out of range); indices must lie in "
                         f"[{-size if wrap else 0}, {size})")


def run(lay_src: tuple | None, out_shape, dtype, device, *, src: torch.Tensor | None = None,
        ids: torch.Tensor | None = None, fill=0, op: str = "layout") -> torch.Tensor:
    """Make the geometry of one call and launch it (no geometry cache: the op entry points below cache theirs)."""
    return launch(geometry(lay_src, out_shape, dtype, src=src, ids=ids, fill=fill, op=op), src, ids, device, op)


MAX_GEOMETRIES = 4096
_GEOMETRIES: dict = {}  # (op, its constants, source / ids shape, strides, dtype, device) -> _Geometry


def _cached(op: str, params: tuple, x, ids, planner) -> torch.Tensor:
    """The op's geometry for these inputs (made once: the tensor is checked, then `planner()`
    validates the op's arguments and returns geometry's), then the launch. A repeated call
    allocates, views and launches, nothing more."""
    if not isinstance(x, torch.Tensor):
        raise KernelInputError(f"{op}: expected a torch.Tensor, got {type(x).__name__}")
    key = (op, params, x.shape, x.stride(), x.dtype, x.device,
           None if ids is None else (ids.shape, ids.dtype, ids.device))
    p = _GEOMETRIES.get(key)
    if p is None:
        _check_tensor(op, x)
        lay_src, shape, kw = planner()
        p = geometry(lay_src, shape, kw.pop("dtype", x.dtype), src=None if lay_src is None else x, ids=ids, op=op, **kw)
        if len(_GEOMETRIES) >= MAX_GEOMETRIES:
            _GEOMETRIES.clear()
        _GEOMETRIES[key] = p
    return launch(p, x, ids, x.device, op)


def _arch() -> str:
    return current_arch()


def _dim(op, d, r):
    if not -max(r, 1) <= d < max(r, 1):
        raise KernelInputError(f"{op}: dim {d} is out of range for a tensor of {r} dims")
    return d % max(r, 1)


# --- the ops -----------------------------------------------------------------------------------

def pad(x: torch.Tensor, pads, mode: str = "constant", value=0.0) -> torch.Tensor:
    """F.pad: `pads` (before, after) pairs from the last dim backwards; a negative pad crops.
    Modes constant, replicate, reflect, circular."""
    return _cached("pad", (tuple(pads), mode, value), x, None, lambda: _geometry_pad(x, pads, mode, value))


def _geometry_pad(x: torch.Tensor, pads, mode: str = "constant", value=0.0):
    op = "pad"
    pads = [int(p) for p in pads]
    if len(pads) % 2 or len(pads) // 2 > x.dim():
        raise KernelInputError(f"{op}: {len(pads)} pad values for a {x.dim()}-d tensor; give (before, after) pairs "
                               "for at most every dim")
    if mode not in PAD_MODES:
        raise KernelInputError(f"{op}: mode {mode!r} is not supported; use one of {sorted(PAD_MODES)}")
    dims, shape = [], []
    for d, s in enumerate(x.shape):
        k = x.dim() - 1 - d
        before, after = (pads[2 * k], pads[2 * k + 1]) if 2 * k < len(pads) else (0, 0)
        o = s + before + after
        if o < 0:
            raise KernelInputError(f"{op}: pads ({before}, {after}) leave dim {d} of size {s} with {o} elements")
        m = PAD_MODES[mode] if (before or after) else "none"
        if m == "fill" and before <= 0 and after <= 0:
            m = "none"  # a crop: every index is inside
        if m in ("clamp", "reflect", "mod") and (before < 0 or after < 0):
            raise KernelInputError(f"{op}: negative pads with mode {mode!r}; only constant mode crops")
        if m == "reflect" and (before >= s or after >= s):
            raise KernelInputError(f"{op}: reflect pad ({before}, {after}) must be smaller than dim {d} of size {s}")
        if m == "mod" and (before > s or after > s):
            raise KernelInputError(f"{op}: circular pad ({before}, {after}) is larger than dim {d} of size {s}")
        off = (-before) % s if m == "mod" else -before
        dims.append(SrcDim(s, ((d, 1, 1),), off, m))
        shape.append(o)
    return tuple(dims), shape, dict(fill=value if mode == "constant" else 0)


def roll(x: torch.Tensor, shifts, dims) -> torch.Tensor:
    """torch.roll along the given dims (out[i] = x[(i - shift) mod n])."""
    return _cached("roll", (tuple(shifts), tuple(dims)), x, None, lambda: _geometry_roll(x, shifts, dims))


def _geometry_roll(x: torch.Tensor, shifts, dims):
    op = "roll"
    shifts, dims = [int(s) for s in shifts], [int(d) for d in dims]
    if not dims or len(shifts) != len(dims):
        raise KernelInputError(f"{op}: needs one dim per shift, got shifts {shifts} and dims {dims} (a roll of the "
                               "flattened tensor: reshape it first)")
    total = [0] * x.dim()
    for s, d in zip(shifts, dims):
        total[_dim(op, d, x.dim())] += s
    src = tuple(SrcDim(n, ((d, 1, 1),), (-total[d]) % n if n else 0, "mod" if total[d] % max(n, 1) else "none")
                for d, n in enumerate(x.shape))
    return src, x.shape, {}


def repeat(x: torch.Tensor, repeats) -> torch.Tensor:
    """Tensor.repeat: tile `repeats[k]` times along each dim (new leading dims broadcast)."""
    return _cached("repeat", tuple(repeats), x, None, lambda: _geometry_repeat(x, repeats))


def _geometry_repeat(x: torch.Tensor, repeats):
    op = "repeat"
    repeats = [int(r) for r in repeats]
    if len(repeats) < x.dim() or any(r < 0 for r in repeats):
        raise KernelInputError(f"{op}: repeats {repeats} must be non-negative, one per dim of a {x.dim()}-d tensor "
                               "(or more)")
    lead = len(repeats) - x.dim()
    shape = repeats[:lead] + [s * r for s, r in zip(x.shape, repeats[lead:])]
    return _broadcast(x, lead, lambda d: "mod" if repeats[d + lead] > 1 else "none"), shape, {}


def expand(x: torch.Tensor, size) -> torch.Tensor:
    """Tensor.expand materialized: size-1 dims broadcast, -1 keeps a dim, new leading dims."""
    return _cached("expand", tuple(size), x, None, lambda: _geometry_expand(x, size))


def _geometry_expand(x: torch.Tensor, size):
    op = "expand"
    size = [int(s) for s in size]
    lead = len(size) - x.dim()
    if lead < 0:
        raise KernelInputError(f"{op}: size {size} has fewer dims than the tensor {tuple(x.shape)}")
    shape = size[:lead] + [s if o == -1 else o for s, o in zip(x.shape, size[lead:])]
    for d, (s, o) in enumerate(zip(x.shape, shape[lead:])):
        if s != 1 and o != s:
            raise KernelInputError(f"{op}: dim {d} of size {s} cannot expand to {o} (only size-1 dims do)")
    return _broadcast(x, lead, lambda d: "none"), shape, {}


def _broadcast(x, lead, mode) -> tuple:
    """Source dims of repeat / expand: a size-1 dim broadcasts, dim d reads output dim d + lead
    (`mode(d)`: "mod" where it is tiled)."""
    return tuple(SrcDim(s) if s == 1 else SrcDim(s, ((d + lead, 1, 1),), 0, mode(d)) for d, s in enumerate(x.shape))


def _check_ids(op, x, ids):
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int32, torch.int64):
        raise KernelInputError(f"{op}: indices must be an int64 or int32 tensor, got "
                               f"{ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__}")
    if ids.device != x.device:
        raise KernelInputError(f"{op}: indices are on {ids.device} but the tensor is on {x.device}; move them together")


def index_select(x: torch.Tensor, dim: int, ids: torch.Tensor) -> torch.Tensor:
    """torch.index_select: ids (1-D, non-negative) pick entries of `dim`."""
    return _cached("index_select", dim, x, ids, lambda: _geometry_index_select(x, dim, ids))


def _geometry_index_select(x: torch.Tensor, dim: int, ids: torch.Tensor):
    op = "index_select"
    _check_ids(op, x, ids)
    if ids.dim() > 1:
        raise KernelInputError(f"{op}: indices must be 1-D, got shape {tuple(ids.shape)}")
    if x.dim() == 0:
        raise KernelInputError(f"{op}: a 0-d tensor has no dim to select from; reshape it to 1-d")
    d = _dim(op, dim, x.dim())
    src = [SrcDim(s, ((k, 1, 1),)) if k != d else SrcDim(s, mode="index", ids=((d, 1),)) for k, s in enumerate(x.shape)]
    shape = list(x.shape)
    shape[d] = ids.numel()
    return tuple(src), shape, {}


def index(x: torch.Tensor, dim: int, ids: torch.Tensor) -> torch.Tensor:
    """x[:, ..., ids] with one integer index tensor at `dim` (negative ids count from the end): the
    ids' dims replace `dim` in the output."""
    return _cached("index", dim, x, ids, lambda: _geometry_index(x, dim, ids))


def _geometry_index(x: torch.Tensor, dim: int, ids: torch.Tensor):
    op = "index"
    _check_ids(op, x, ids)
    d = _dim(op, dim, x.dim())
    k = ids.dim()
    ist = [math.prod(ids.shape[j + 1:]) for j in range(k)]
    src = []
    for j, s in enumerate(x.shape):
        if j < d:
            src.append(SrcDim(s, ((j, 1, 1),)))
        elif j == d:
            src.append(SrcDim(s, mode="index", ids=tuple((d + q, ist[q]) for q in range(k)), wrap=True))
        else:
            src.append(SrcDim(s, ((j + k - 1, 1, 1),)))
    shape = list(x.shape[:d]) + list(ids.shape) + list(x.shape[d + 1:])
    return tuple(src), shape, {}


def unfold(x: torch.Tensor, dim: int, size: int, step: int) -> torch.Tensor:
    """Tensor.unfold: windows of `size` every `step` along `dim`, the window as a new last dim."""
    return _cached("unfold", (dim, size, step), x, None, lambda: _geometry_unfold(x, dim, size, step))


def _geometry_unfold(x: torch.Tensor, dim: int, size: int, step: int):
    op = "unfold"
    if x.dim() == 0:
        raise KernelInputError(f"{op}: a 0-d tensor has no dim to unfold")
    d = _dim(op, dim, x.dim())
    n = x.shape[d]
    if size < 0 or step <= 0 or size > n:
        raise KernelInputError(f"{op}: window size {size} / step {step} do not fit dim {d} of size {n} "
                               "(need 0 <= size <= dim size and step > 0)")
    r = x.dim()
    src = [SrcDim(s, ((j, 1, 1),)) if j != d else SrcDim(s, ((d, step, 1), (r, 1, 1))) for j, s in enumerate(x.shape)]
    shape = list(x.shape) + [size]
    shape[d] = (n - size) // step + 1
    return tuple(src), shape, {}


def repeat_interleave(x: torch.Tensor, repeats: int, dim: int) -> torch.Tensor:
    """torch.repeat_interleave with one repeat count along `dim` (out[i] = x[i // repeats])."""
    return _cached("repeat_interleave", (repeats, dim), x, None, lambda: _geometry_repeat_interleave(x, repeats, dim))


def _geometry_repeat_interleave(x: torch.Tensor, repeats: int, dim: int):
    op = "repeat_interleave"
    if isinstance(repeats, torch.Tensor) or int(repeats) < 0:
        raise KernelInputError(f"{op}: repeats must be one non-negative int, got {repeats!r}")
    repeats = int(repeats)
    d = _dim(op, dim, x.dim())
    src = [SrcDim(s, ((j, 1, repeats if j == d else 1),)) for j, s in enumerate(x.shape)]
    shape = list(x.shape)
    shape[d] *= repeats
    return tuple(src), shape, {}


def fill(shape, value, dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """torch.full(shape, value, dtype=dtype): every element stored by the kernel."""
    shape = [int(s) for s in shape]
    if any(s < 0 for s in shape):
        raise KernelInputError(f"fill: negative size in {shape}")
    _bits_view(torch.empty(0, dtype=dtype))  # dtype check
    device = torch.device(device)
    key = ("fill", tuple(shape), value, dtype, device)
    p = _GEOMETRIES.get(key)
    if p is None:
        p = _GEOMETRIES[key] = geometry(None, shape, dtype, fill=value, op="fill")
    return launch(p, None, None, device, "fill")
