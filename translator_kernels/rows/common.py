"""Shared pieces of the row kernels (softmax, norms): the compile-time row tiling, device
helpers (vector loads/stores, wave and block reductions) and the host-side glue (dtype map,
arch pick, launcher cache, stream).

A row kernel gives each row of an [M, N] tensor to one workgroup of BLOCK threads. The row is
read as NV = N / VEC vectors of VEC elements (VEC * elem_bits == 128 when N, the row stride and
the base address allow it, smaller otherwise) in NT tiles of BLOCK vectors; thread t holds
vectors t, t + BLOCK, ... in registers, so the input is read once and the output written
once. The last tile is partial when BLOCK does not divide NV: its out-of-row threads load
index 0 (in bounds), neutralize the value, and skip the store. Rows longer than
MAX_BLOCK * MAX_ELEMS_PER_THREAD elements use `stream_tiling` (the kernels loop over chunks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import flydsl.expr as fx
from flydsl.expr import range_constexpr

from translator_kernels.arch import ARCHS, FLOAT_NAMES
from translator_kernels.errors import KernelInputError

WAVE = 64  # gfx942 and gfx950 are wave64
MAX_BLOCK = 1024
TARGET_VECS_PER_THREAD = 4
MAX_ELEMS_PER_THREAD = 64  # fp32 values a thread holds; bounds register use (0 spills)

DTYPES = FLOAT_NAMES  # what the row kernels take (translator_kernels.arch)


def elem_type(dtype_str: str):
    return {"f32": fx.Float32, "bf16": fx.BFloat16, "f16": fx.Float16}[dtype_str]


def elem_bits(dtype_str: str) -> int:
    return 32 if dtype_str == "f32" else 16


@dataclass(frozen=True)
class RowTiling:
    """Compile-time shape of one row's work."""

    n: int  # row length in elements
    vec: int  # elements per vector access
    block: int  # threads per workgroup
    nt: int  # tiles (vectors per thread)
    lanes: int = 0  # threads per row: block, or a power of two < WAVE for short rows

    @property
    def lpr(self) -> int:
        return self.lanes or self.block

    @property
    def sub(self) -> bool:
        """Short rows: each wave holds WAVE / lpr rows, reduced by shuffles alone."""
        return self.lpr < WAVE

    @property
    def rows_per_block(self) -> int:
        return self.block // self.lpr

    @property
    def nv(self) -> int:
        return self.n // self.vec

    @property
    def waves(self) -> int:
        return self.block // WAVE

    @property
    def partial(self) -> bool:
        """Whether the last tile has threads past the end of the row."""
        return self.nv % self.lpr != 0


def pick_vec(n: int, dtype: torch.dtype, *tensors: torch.Tensor) -> int:
    """Widest vector (<= 128 bits) that divides N, every row stride and every base address."""
    esize = torch.empty((), dtype=dtype).element_size()
    vec = 16 // esize
    while vec > 1:
        ok = n % vec == 0
        for t in tensors:
            if t is None:
                continue
            te = t.element_size()
            if t.dim() >= 2 and t.stride(0) % vec:
                ok = False
            if t.data_ptr() % (vec * te):
                ok = False
        if ok:
            return vec
        vec //= 2
    return 1


SUB_BLOCK = 256  # workgroup size when several short rows share a wave
SUB_VECS_PER_THREAD = 2  # short rows: spread over more lanes, fewer registers per thread


def row_tiling(n: int, vec: int) -> RowTiling:
    nv = n // vec
    lanes = 1
    while lanes < WAVE and -(-nv // lanes) > SUB_VECS_PER_THREAD:
        lanes *= 2
    if lanes < WAVE:
        return RowTiling(n=n, vec=vec, block=SUB_BLOCK, nt=-(-nv // lanes), lanes=lanes)
    block = WAVE
    while block < MAX_BLOCK and -(-nv // block) > TARGET_VECS_PER_THREAD:
        block *= 2
    nt = -(-nv // block)
    return RowTiling(n=n, vec=vec, block=block, nt=nt)


def row_fits(tiling: RowTiling) -> bool:
    return tiling.nt * tiling.vec <= MAX_ELEMS_PER_THREAD


# ---------------------------------------------------------------------------
# device helpers (called from inside @flyc.kernel bodies; no dynamic `if` here)
# ---------------------------------------------------------------------------


def copy_atom(bits_per_access: int, ebits: int):
    kind = {16: fx.rocdl.BufferCopy16b, 32: fx.rocdl.BufferCopy32b, 64: fx.rocdl.BufferCopy64b,
            128: fx.rocdl.BufferCopy128b}[bits_per_access]
    return fx.make_copy_atom(kind(), ebits)


def row_view(tensor, row, vec: int):
    """Row `row` of a 2-D buffer tensor divided into vectors of `vec` elements."""
    buf = fx.rocdl.make_buffer_tensor(tensor)
    return fx.logical_divide(fx.slice(buf, (row, None)), fx.make_layout(vec, 1))


def vec_view(tensor, vec: int):
    """A 1-D tensor (weight, bias) divided into vectors of `vec` elements."""
    buf = fx.rocdl.make_buffer_tensor(tensor)
    return fx.logical_divide(buf, fx.make_layout(vec, 1))


def load_vec(atom, vec: int, dtype, view, idx):
    r = fx.make_rmem_tensor(vec, dtype)
    fx.copy(atom, fx.slice(view, (None, idx)), r)
    return fx.memref_load_vec(r)


def store_vec(atom, vec: int, dtype, val, view, idx):
    r = fx.make_rmem_tensor(vec, dtype)
    fx.memref_store_vec(val, r)
    fx.copy(atom, r, fx.slice(view, (None, idx)))


def lane_max(v, vec: int):
    """NaN-propagating max over the elements of a vector."""
    m = v[0]
    for i in range_constexpr(1, vec):
        m = fx.max(m, v[i])
    return m


def lane_sum(v, vec: int):
    s = v[0]
    for i in range_constexpr(1, vec):
        s = s + v[i]
    return s


def wave_allreduce(x, op: str, width: int = WAVE):
    """Butterfly reduction over aligned groups of `width` lanes (a power of two <= 64);
    every lane ends with its group's result."""
    for k in range_constexpr(int(math.log2(width))):
        peer = x.shuffle_xor(width >> (k + 1), WAVE)
        x = fx.max(x, peer) if op == "max" else x + peer
    return x


# ---------------------------------------------------------------------------
# host side
# ---------------------------------------------------------------------------

MAX_BUFFER_BYTES = 2**31  # buffer offsets are 32-bit


def current_arch() -> str:
    from flydsl.runtime.device import get_rocm_arch

    arch = get_rocm_arch()
    if arch not in ARCHS:
        raise KernelInputError(f"row kernels: arch {arch!r} is not supported; expected one of {ARCHS} "
                               "(set FLYDSL_GPU_ARCH or run under flysim.simulate(arch=...))")
    return arch


def check_rows(op: str, x: torch.Tensor, what: str = "x", ndim: int = 2) -> None:
    if not isinstance(x, torch.Tensor):
        raise KernelInputError(f"{op}: {what} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise KernelInputError(f"{op}: {what} must be {ndim}-D, got shape {tuple(x.shape)}; "
                               "reshape to [rows, N] (normalized dims last) before calling")
    if x.dtype not in DTYPES:
        raise KernelInputError(f"{op}: {what} dtype {x.dtype} (shape {tuple(x.shape)}) is not supported; "
                               "use float32, bfloat16 or float16 (keep other dtypes in PyTorch)")
    span = sum((s - 1) * st for s, st in zip(x.shape, x.stride())) + 1 if x.numel() else 0
    if span * x.element_size() >= MAX_BUFFER_BYTES:
        raise KernelInputError(f"{op}: {what} of shape {tuple(x.shape)} {x.dtype} spans >= 2 GiB; "
                               "split it into chunks of rows (buffer offsets are 32-bit)")


def check_vector(op: str, t, n: int, what: str, device) -> torch.Tensor | None:
    """Validate a per-feature weight/bias of length n; returns it contiguous (or None)."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] != n:
        shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise KernelInputError(f"{op}: {what} must be a 1-D tensor of length N={n}, got {shape}")
    if t.dtype not in DTYPES:
        raise KernelInputError(f"{op}: {what} dtype {t.dtype} is not supported; use float32, bfloat16 or float16")
    if t.device != device:
        raise KernelInputError(f"{op}: {what} is on {t.device} but x is on {device}; move it to x's device")
    return t.contiguous()


def launch(launcher, *args) -> None:
    """Run a launcher through the one launch path (translator_kernels.launch)."""
    from translator_kernels.launch import call

    call(launcher, *args)


STREAM_VECS_PER_THREAD = 4


def stream_tiling(n: int, vec: int) -> RowTiling:
    """Plan for rows too long to keep in registers: MAX_BLOCK threads loop over chunks."""
    nv = n // vec
    return RowTiling(n=n, vec=vec, block=MAX_BLOCK, nt=-(-nv // MAX_BLOCK))
