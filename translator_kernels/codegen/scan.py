"""Row scans: cumsum / cumprod / logcumsumexp along one dim, with a fused elementwise prologue.

`scan(inputs, program, kind, dim, reverse=False, exclusive=False)` scans, along `dim` of the
inputs' broadcast shape, the value that `program` (translator_kernels.program; its
one output names the value and the result dtype) computes from `inputs`, so a masked cumsum
``cumsum(x * mask)`` reads x and the mask once and writes the scan. The host moves `dim` last
and views the problem as [M, N] rows (a copy only when `dim` was not already last and
contiguous; broadcast inputs are materialized); scan_codegen writes one kernel per (program,
dtypes, kind, N, tiling, reverse, exclusive) into the kernel cache folder beside the elementwise
kernels, and its compiled launcher is cached with the arch.

Accumulation is fp32 for every dtype, as torch's CPU cumsum / cumprod accumulate bf16 / fp16;
the result is rounded once per element to the program's output dtype. `reverse` scans from the
row end (``x.flip(d).cumsum(d).flip(d)``); `exclusive` stores the combine of the elements
before each one (identity first: ``cumsum(x) - x`` without its cancellation).
"""

from __future__ import annotations

import functools
import hashlib
import math

import torch

from translator_kernels import launch as kl
from translator_kernels import replay as kr
from translator_kernels.errors import KernelInputError
from translator_kernels.codegen.host import current_arch, load_launch, note_use, write_source
from translator_kernels.program import (BITS, DTYPES, TORCH, Program, as_program, broadcast_inputs, parse,
                                        ref_program)
from translator_kernels.codegen.scan_codegen import KINDS, MAX_BLOCK, MAX_TILES, kernel_source, scan_tiling

GENERATED: dict[str, str] = {}  # kernel name -> generated file path
CALLS: dict[str, dict] = {}  # kernel name -> one call's arguments (emit_sources writes a check from it)


@functools.lru_cache(maxsize=4096)  # per call otherwise: a sha1 of the whole key
def kernel_name(text, dtypes, kind, tiling, reverse, exclusive) -> str:
    key = hashlib.sha1(f"{text}|{dtypes}|{kind}|{tiling}|{reverse}|{exclusive}".encode()).hexdigest()[:16]
    return f"scan_{key}"


@kl.builder
def build_scan(text: str, dtypes: tuple, kind: str, tiling, reverse: bool, exclusive: bool, arch: str):
    """Compiled launcher `launch(*inputs, out, M)` of one row scan for `arch`."""
    name = kernel_name(text, dtypes, kind, tiling, reverse, exclusive)
    src = kernel_source(parse(text), dtypes, kind, tiling, reverse, exclusive, name)
    return load_launch(write_source(src, name, GENERATED), "_flydsl_scan_")


def max_row_length(vec: int = 1) -> int:
    return MAX_BLOCK * MAX_TILES * vec


def row_vec(n: int, dtypes, flat=()) -> int:
    """Elements per access: 128 bits of the widest input, halved until it divides N and the bases."""
    vec = min(8, 128 // max([BITS[d] for d in dtypes] or [32]))
    while vec > 1 and (n % vec or any(f.data_ptr() % (vec * f.element_size()) for f in flat)):
        vec //= 2
    return vec


_LAYOUTS: dict = {}  # (program, kind, dim, reverse, exclusive, per input (shape, strides, dtype, device)) -> _Layout
MAX_LAYOUTS = 4096


class _Layout:
    """A validated scan call: shapes, dtypes and, per (base-address alignment, arch), launcher and name."""

    def __init__(self, prog, inputs, kind, dim, reverse, exclusive):
        self.prog, self.text, self.kind, self.reverse, self.exclusive = prog, prog.text(), kind, reverse, exclusive
        self.shape = shape = tuple(torch.broadcast_shapes(*[t.shape for t in inputs]))
        self.dim = dim % max(len(shape), 1)
        self.shape1 = shape or (1,)
        self.out_dt = TORCH[prog.out[0][1]]
        self.n = self.shape1[self.dim]
        self.m = math.prod(self.shape1) // self.n if self.n else 0
        self.dtypes = tuple(DTYPES[t.dtype] for t in inputs)
        self.moved = list(self.shape1)
        self.moved.append(self.moved.pop(self.dim))
        self.launches: dict = {}  # (addresses mod 16, arch) -> (launcher, kernel name)


def _validate(inputs, program, kind, dim):
    op = f"scan({kind})"
    if kind not in KINDS:
        raise KernelInputError(f"{op}: unknown scan kind; expected one of {sorted(KINDS)}")
    prog = as_program(program)
    if len(inputs) != prog.n or len(prog.out) != 1 or prog.out[0][1] == "bool":
        raise KernelInputError(f"{op}: program takes {prog.n} inputs and must have one float output, got {len(inputs)} "
                               f"inputs and outputs {prog.out}")
    shape = broadcast_inputs(op, prog, inputs, " (float64 scans stay in PyTorch)")
    r = max(len(shape), 1)
    if not -r <= dim < r:
        raise KernelInputError(f"{op}: dim {dim} is out of range for shape {shape}")
    n = (shape or (1,))[dim % r]
    if n and math.prod(shape) > 2**31 - 1:
        raise KernelInputError(f"{op}: {shape} has more than 2^31 - 1 elements; split it (buffer offsets are 32-bit)")
    return prog


def _layout(inputs, program, kind, dim, reverse, exclusive) -> _Layout:
    """The validated layout of this call, looked up by shapes, strides, dtypes and devices (planned once)."""
    try:
        key = (program, kind, dim, reverse, exclusive, tuple([(t.shape, t.stride(), t.dtype, t.device) for t in inputs]))
        lay = _LAYOUTS.get(key)
    except (AttributeError, TypeError):  # not tensors, or an unhashable program: validation says why
        key = lay = None
    if lay is None:
        lay = _Layout(_validate(inputs, program, kind, dim), inputs, kind, dim, bool(reverse), bool(exclusive))
        if key is not None:
            if len(_LAYOUTS) >= MAX_LAYOUTS:
                _LAYOUTS.clear()
            _LAYOUTS[key] = lay
    return lay


def _launch_for(lay: _Layout, inputs, flat):
    arch = current_arch()
    k = (tuple([f.data_ptr() % 16 for f in flat]), arch)
    hit = lay.launches.get(k)
    if hit is None:
        tiling = scan_tiling(lay.n, row_vec(lay.n, lay.dtypes, flat))
        if not tiling.fits:
            raise KernelInputError(f"scan({lay.kind}): rows of N={lay.n} elements are longer than one workgroup scans "
                                   f"({max_row_length(tiling.vec)} at VEC={tiling.vec}); keep this scan in PyTorch")
        args = (lay.text, lay.dtypes, lay.kind, tiling, lay.reverse, lay.exclusive)
        name = kernel_name(*args)
        if name not in CALLS:  # one call's arguments per kernel, built once
            CALLS[name] = dict(family="scan", program=lay.text, kind=lay.kind, dim=lay.dim, reverse=lay.reverse,
                               exclusive=lay.exclusive, shapes=[list(t.shape) for t in inputs], dtypes=list(lay.dtypes))
        hit = lay.launches[k] = (build_scan(*args, arch), name)
    return hit


@kr.replayed
def scan(inputs, program, kind: str, dim: int, reverse: bool = False, exclusive: bool = False) -> torch.Tensor:
    """Run `program` on `inputs` and scan its value along `dim`; returns the result tensor.

    A repeated call (same program, kind, dim, flags, input shapes, strides, dtypes, devices, base-address
    alignment and arch) plans nothing: it flattens the inputs, allocates and launches."""
    lay = _layout(inputs, program, kind, dim, reverse, exclusive)
    if lay.m == 0 or lay.n == 0:
        return torch.empty(lay.shape, dtype=lay.out_dt, device=inputs[0].device)
    flat = []
    for t in inputs:
        f = t.reshape((1,) * (len(lay.shape1) - t.dim()) + tuple(t.shape)).expand(lay.shape1).movedim(lay.dim, -1)
        f = f.contiguous().reshape(-1)
        flat.append(f.view(torch.uint8) if f.dtype == torch.bool else f)
    res = torch.empty(lay.m * lay.n, dtype=lay.out_dt, device=inputs[0].device)
    launch, name = _launch_for(lay, inputs, flat)
    note_use(name)
    kl.call(launch, *flat, res.view(torch.uint8) if lay.out_dt == torch.bool else res, lay.m)
    moved = res.view(lay.moved).movedim(-1, lay.dim)
    if moved.is_contiguous():  # the scanned dim is the last (of size > 1): the rows are the output
        return moved.view(lay.shape)
    out = torch.empty(lay.shape, dtype=lay.out_dt, device=res.device)
    out.copy_(moved.reshape(lay.shape))
    return out


def identity_program(dtype) -> str:
    return Program(1, (), ((0, DTYPES[dtype]),)).text()


def ref_scan(inputs, program, kind, dim, reverse, exclusive):
    """fp32 reference: the program's value unrounded, scanned in fp32, rounded once (as the kernel)."""
    p = parse(program)
    (y,) = ref_program(inputs, Program(p.n, p.ops, ((p.out[0][0], "f32"),)).text())
    d = dim % max(y.dim(), 1)
    if y.dim() == 0:
        y = y.reshape(1)
    if reverse:
        y = y.flip(d)
    if exclusive:  # shift by one along d, identity first
        ident = {"cumsum": 0.0, "cumprod": 1.0, "logcumsumexp": float("-inf")}[kind]
        y = torch.cat([torch.full_like(y.narrow(d, 0, 1), ident), y.narrow(d, 0, y.shape[d] - 1)], d)
    r = getattr(torch, kind)(y, d)
    if reverse:
        r = r.flip(d)
    shape = torch.broadcast_shapes(*[t.shape for t in inputs])
    return r.reshape(shape).to(TORCH[p.out[0][1]]).contiguous()
