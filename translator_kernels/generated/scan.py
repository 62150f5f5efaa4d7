"""Row scans: cumsum / cumprod / logcumsumexp along one dim, with a fused elementwise prologue.

`scan(inputs, program, kind, dim, reverse=False, exclusive=False)` scans, along `dim` of the
inputs' broadcast shape, the value that `program` (translator_kernels.program; its
one output names the value and the result dtype) computes from `inputs`, so a masked cumsum
``cumsum(x * mask)`` reads x and the mask once and writes the scan. The host moves `dim` last
and views the problem as [M, N] rows (a copy only when `dim` was not already last and
contiguous; broadcast inputs are materialized); scan_codegen writes one kernel per (program,
dtypes, kind, N, plan, reverse, exclusive) into the kernel cache folder beside the elementwise
kernels, and its compiled launcher is cached with the arch.

Accumulation is fp32 for every dtype, as torch's CPU cumsum / cumprod accumulate bf16 / fp16;
the result is rounded once per element to the program's output dtype. `reverse` scans from the
row end (``x.flip(d).cumsum(d).flip(d)``); `exclusive` stores the combine of the elements
before each one (identity first: ``cumsum(x) - x`` without its cancellation).
"""

from __future__ import annotations

import hashlib
import math

import torch

from translator_kernels import launch as kl
from translator_kernels.errors import KernelInputError
from translator_kernels.generated.host import current_arch, load_launch, note_use, write_source
from translator_kernels.program import BITS, DTYPES, TORCH, Program, as_program, parse, ref_program
from translator_kernels.generated.scan_codegen import KINDS, MAX_BLOCK, MAX_TILES, kernel_source, plan_scan

GENERATED: dict[str, str] = {}  # kernel name -> generated file path
CALLS: dict[str, dict] = {}  # kernel name -> one call's arguments (emit_sources writes a check from it)


def kernel_name(text, dtypes, kind, plan, reverse, exclusive) -> str:
    key = hashlib.sha1(f"{text}|{dtypes}|{kind}|{plan}|{reverse}|{exclusive}".encode()).hexdigest()[:16]
    return f"scan_{key}"


@kl.builder
def build_scan(text: str, dtypes: tuple, kind: str, plan, reverse: bool, exclusive: bool, arch: str):
    """Compiled launcher `launch(*inputs, out, M)` of one row scan for `arch`."""
    name = kernel_name(text, dtypes, kind, plan, reverse, exclusive)
    src = kernel_source(parse(text), dtypes, kind, plan, reverse, exclusive, name)
    return load_launch(write_source(src, name, GENERATED), "_flydsl_scan_")


def max_row_length(vec: int = 1) -> int:
    return MAX_BLOCK * MAX_TILES * vec


def row_vec(n: int, dtypes, flat=()) -> int:
    """Elements per access: 128 bits of the widest input, halved until it divides N and the bases."""
    vec = min(8, 128 // max([BITS[d] for d in dtypes] or [32]))
    while vec > 1 and (n % vec or any(f.data_ptr() % (vec * f.element_size()) for f in flat)):
        vec //= 2
    return vec


def scan(inputs, program, kind: str, dim: int, reverse: bool = False, exclusive: bool = False) -> torch.Tensor:
    """Run `program` on `inputs` and scan its value along `dim`; returns the result tensor."""
    op = f"scan({kind})"
    if kind not in KINDS:
        raise KernelInputError(f"{op}: unknown scan kind; expected one of {sorted(KINDS)}")
    prog = as_program(program)
    if len(inputs) != prog.n or len(prog.out) != 1 or prog.out[0][1] == "bool":
        raise KernelInputError(f"{op}: program takes {prog.n} inputs and must have one float output, got {len(inputs)} "
                               f"inputs and outputs {prog.out}")
    for i, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor) or t.dtype not in DTYPES:
            what = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise KernelInputError(f"{op}: input {i} ({what}) is not supported; use float32, bfloat16, float16 or bool "
                                   "(integer and float64 scans stay in PyTorch)")
        if t.device != inputs[0].device:
            raise KernelInputError(f"{op}: input {i} is on {t.device}, input 0 on {inputs[0].device}; "
                                   "move them to one device")
    try:
        shape = tuple(torch.broadcast_shapes(*[t.shape for t in inputs]))
    except RuntimeError as e:
        raise KernelInputError(f"{op}: input shapes {[tuple(t.shape) for t in inputs]} do not broadcast: {e}") from None
    r = max(len(shape), 1)
    if not -r <= dim < r:
        raise KernelInputError(f"{op}: dim {dim} is out of range for shape {shape}")
    dim %= r
    shape1 = shape or (1,)
    out_dt = TORCH[prog.out[0][1]]
    out = torch.empty(shape, dtype=out_dt, device=inputs[0].device)
    n = shape1[dim]
    m = math.prod(shape1) // n if n else 0
    if m == 0 or n == 0:
        return out
    if m * n > 2**31 - 1:
        raise KernelInputError(f"{op}: {shape} has more than 2^31 - 1 elements; split it (buffer offsets are 32-bit)")
    flat = []
    for t in inputs:
        f = t.reshape((1,) * (len(shape1) - t.dim()) + tuple(t.shape)).expand(shape1).movedim(dim, -1)
        f = f.contiguous().reshape(-1)
        flat.append(f.view(torch.uint8) if f.dtype == torch.bool else f)
    dtypes = tuple(DTYPES[t.dtype] for t in inputs)
    plan = plan_scan(n, row_vec(n, dtypes, flat))
    if not plan.fits:
        raise KernelInputError(f"{op}: rows of N={n} elements are longer than one workgroup scans "
                               f"({max_row_length(plan.vec)} at VEC={plan.vec}); keep this scan in PyTorch")
    res = torch.empty(m * n, dtype=out_dt, device=out.device)
    launch = build_scan(prog.text(), dtypes, kind, plan, bool(reverse), bool(exclusive), current_arch())
    name = kernel_name(prog.text(), dtypes, kind, plan, bool(reverse), bool(exclusive))
    CALLS.setdefault(name, dict(family="scan", program=prog.text(), kind=kind, dim=dim, reverse=bool(reverse),
                                exclusive=bool(exclusive), shapes=[list(t.shape) for t in inputs], dtypes=list(dtypes)))
    note_use(name)
    args = flat + [res.view(torch.uint8) if out_dt == torch.bool else res, m]
    kl.call(launch, *args)
    moved = list(shape1)
    moved.append(moved.pop(dim))
    out.copy_(res.view(moved).movedim(-1, dim).reshape(shape))
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
