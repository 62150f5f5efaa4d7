"""Fused reductions: an elementwise prologue program, then a reduction over some dims.

`fused_reduce(inputs, program, kind, dims, keepdim, params)` reduces the broadcast value that
`program` (translator_kernels.elementwise_program; its single output names the value and the
result dtype) computes from `inputs`. The host side moves the reduced dims last and views the
problem as [M, N] rows; each input becomes one of three roles so broadcast operands are not
materialized when their pattern is simple:

- "full": varies along kept and reduced dims; read as a flat [M, N] tensor (a copy only when
  the reduced dims were not already last and contiguous),
- "row":  depends on the reduced dims only (a weight [N]); read by every row,
- "col":  depends on the kept dims only (a per-row max or mean [M, 1]); one value per row.
Any other broadcast is materialized to "full". The kernel (reduce_codegen) is generated per
(program, roles, dtypes, kind, params, N, plan), written to the kernel cache folder beside the
elementwise kernels, imported, and its launcher cached with the arch.

Kinds: sum, mean, amax, amin, var / std (params: correction), logsumexp, argmax / argmin
(int64 indices), max / min (values and int64 indices), norm (params: ord). Statistics are
fp32; values are stored in the program's output dtype.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import math
import os

import torch

from .elementwise import cache_dir, current_arch
from .elementwise_program import BITS, DTYPES, TORCH, parse
from .reduce_codegen import KINDS, MAX_BLOCK, MAX_ELEMS_PER_LANE, kernel_source, plan_rows

GENERATED: dict[str, str] = {}  # kernel name -> generated file path (for emit_sources)
CALLS: dict[str, dict] = {}  # kernel name -> one call's arguments (emit_sources writes a check from it)


def kernel_name(text, roles, dtypes, kind, params, n, plan) -> str:
    key = hashlib.sha1(f"{text}|{roles}|{dtypes}|{kind}|{params}|{n}|{plan}".encode()).hexdigest()[:16]
    return f"fused_reduce_{key}"


def _write(src: str, name: str):
    path = cache_dir() / f"{name}.py"
    if not path.exists() or path.read_text() != src:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(src)
        os.replace(tmp, path)
    GENERATED[name] = str(path)
    return path


@functools.lru_cache(maxsize=None)
def build_reduce(text: str, roles: tuple, dtypes: tuple, kind: str, params: tuple, n: int, plan, arch: str):
    """Compiled launcher `launch(*inputs, *outputs, M)` of one fused reduction for `arch`."""
    name = kernel_name(text, roles, dtypes, kind, params, n, plan)
    src = kernel_source(parse(text), roles, dtypes, kind, params, n, plan, name)
    path = _write(src, name)
    spec = importlib.util.spec_from_file_location(f"_flydsl_red_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.launch


def out_shape(shape, dims, keepdim):
    if keepdim:
        return tuple(1 if d in dims else s for d, s in enumerate(shape))
    return tuple(s for d, s in enumerate(shape) if d not in dims)


def _role(t, shape, dims, perm):
    """(role, flat tensor) of input `t` against the broadcast `shape` reduced over `dims`."""
    r = len(shape)
    ts = (1,) * (r - t.dim()) + tuple(t.shape)
    kept = [d for d in range(r) if d not in dims]
    b_kept = all(ts[d] == 1 or shape[d] == 1 for d in kept)
    b_red = all(ts[d] == 1 or shape[d] == 1 for d in dims)
    tp = t.reshape(ts).expand(shape).permute(perm)
    if b_red:
        role, flat = "col", tp[(Ellipsis,) + (0,) * len(dims)]
    elif b_kept:
        role, flat = "row", tp[(0,) * len(kept)]
    else:
        role, flat = "full", tp
    flat = flat.contiguous().reshape(-1)
    return role, flat.view(torch.uint8) if flat.dtype == torch.bool else flat


def prepare(inputs, program, kind: str, dims, keepdim: bool, params=()):
    """Validate; return (outputs, launch arguments or None when there is nothing to do, build key)."""
    prog = parse(program) if isinstance(program, str) else program
    op = f"fused_reduce({kind})"
    if kind not in KINDS:
        raise ValueError(f"{op}: unknown reduction kind; expected one of {sorted(KINDS)}")
    if len(inputs) != prog.n or len(prog.out) != 1:
        raise ValueError(f"{op}: program takes {prog.n} inputs and must have one output, got {len(inputs)} "
                         f"inputs and {len(prog.out)} outputs")
    for i, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor) or t.dtype not in DTYPES:
            what = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{op}: input {i} ({what}) is not supported; use float32, bfloat16, float16 or bool")
        if t.device != inputs[0].device:
            raise ValueError(f"{op}: input {i} is on {t.device}, input 0 on {inputs[0].device}; move them to one device")
    try:
        shape = tuple(torch.broadcast_shapes(*[t.shape for t in inputs]))
    except RuntimeError as e:
        raise ValueError(f"{op}: input shapes {[tuple(t.shape) for t in inputs]} do not broadcast: {e}") from None
    r = len(shape)
    dims = sorted({d % r for d in dims}) if r else []
    perm = [d for d in range(r) if d not in dims] + dims
    m = math.prod(shape[d] for d in range(r) if d not in dims)
    n = math.prod(shape[d] for d in dims)
    oshape = out_shape(shape, dims, keepdim)
    dev = inputs[0].device
    val_dt = TORCH[prog.out[0][1]]
    if kind in ("argmax", "argmin"):
        outs = [torch.empty(oshape, dtype=torch.int64, device=dev)]
    elif kind in ("max", "min"):
        outs = [torch.empty(oshape, dtype=val_dt, device=dev), torch.empty(oshape, dtype=torch.int64, device=dev)]
    else:
        outs = [torch.empty(oshape, dtype=val_dt, device=dev)]
    if m == 0:
        return outs, None, None
    if n == 0:
        raise ValueError(f"{op}: reducing an empty dim of shape {shape} over {dims}; keep it in PyTorch")
    if m * n > 2**31 - 1:
        raise ValueError(f"{op}: {shape} has more than 2^31 - 1 elements; split it (buffer offsets are 32-bit)")
    roles, flat = zip(*[_role(t, shape, dims, perm) for t in inputs])
    dtypes = tuple(DTYPES[t.dtype] for t in inputs)
    wide = [BITS[dt] for role, dt in zip(roles, dtypes) if role != "col"] or [32]
    vec = min(8, 128 // max(wide))
    while vec > 1 and (n % vec or any(f.data_ptr() % (vec * f.element_size()) for f, role in zip(flat, roles)
                                      if role != "col")):
        vec //= 2
    plan = plan_rows(n, vec)
    if not plan.fits:
        raise ValueError(f"{op}: rows of N={n} elements are longer than a workgroup holds in registers "
                         f"({max_row_length()}); keep this reduction in PyTorch")
    key = (prog.text(), tuple(roles), dtypes, kind, tuple(float(p) for p in params), n, plan)
    return outs, list(flat) + [o.view(-1) for o in outs] + [m], key


def fused_reduce(inputs, program, kind: str, dims, keepdim: bool, params=()) -> list[torch.Tensor]:
    """Run prologue `program` on `inputs` and reduce its value over `dims`; returns the outputs
    (one tensor, or values and int64 indices for kind max / min)."""
    outs, args, key = prepare(inputs, program, kind, dims, keepdim, params)
    if args is None:
        return outs
    launch = build_reduce(*key, current_arch())
    CALLS.setdefault(kernel_name(*key), dict(
        family="reduce", program=key[0], kind=kind, dims=list(dims), keepdim=bool(keepdim),
        params=[float(p) for p in params], shapes=[list(t.shape) for t in inputs],
        dtypes=[DTYPES[t.dtype] for t in inputs]))
    if args[0].is_cuda:
        launch(*args, stream=torch.cuda.current_stream(args[0].device))
    else:
        launch(*args)
    return outs


def max_row_length() -> int:
    return MAX_BLOCK * MAX_ELEMS_PER_LANE
