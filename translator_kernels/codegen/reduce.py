"""Fused reductions: an elementwise prologue program, then a reduction over some dims.

`fused_reduce(inputs, program, kind, dims, keepdim, params)` reduces the broadcast value that
`program` (translator_kernels.program; its single output names the value and the
result dtype) computes from `inputs`. The host side moves the reduced dims last and views the
problem as [M, N] rows; each input becomes one of three roles so broadcast operands are not
materialized when their pattern is simple:

- "full": varies along kept and reduced dims; read as a flat [M, N] tensor (a copy only when
  the reduced dims were not already last and contiguous),
- "row":  depends on the reduced dims only (a weight [N]); read by every row,
- "col":  depends on the kept dims only (a per-row max or mean [M, 1]); one value per row.
Any other broadcast is materialized to "full". The kernel (reduce_codegen) is generated per
(program, roles, dtypes, kind, params, N, tiling), written to the kernel cache folder beside the
elementwise kernels, imported, and its launcher cached with the arch.

Kinds: sum, mean, amax, amin, var / std (params: correction), logsumexp, argmax / argmin
(int64 indices), max / min (values and int64 indices), norm (params: ord). Statistics are
fp32; values are stored in the program's output dtype.
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
from translator_kernels.codegen.reduce_codegen import KINDS, MAX_BLOCK, MAX_ELEMS_PER_LANE, kernel_source, codegen_row_tiling

GENERATED: dict[str, str] = {}  # kernel name -> generated file path (for emit_sources)
CALLS: dict[str, dict] = {}  # kernel name -> one call's arguments (emit_sources writes a check from it)


@functools.lru_cache(maxsize=4096)  # per call otherwise: a sha1 of the whole key
def kernel_name(text, roles, dtypes, kind, params, n, tiling, epi=None) -> str:
    tail = "" if epi is None else f"|{epi}"
    key = hashlib.sha1(f"{text}|{roles}|{dtypes}|{kind}|{params}|{n}|{tiling}{tail}".encode()).hexdigest()[:16]
    return f"fused_reduce_{key}"


def _write(src: str, name: str):
    return write_source(src, name, GENERATED)


@kl.builder
def build_reduce(text: str, roles: tuple, dtypes: tuple, kind: str, params: tuple, n: int, tiling, epi, arch: str):
    """Compiled launcher `launch(*inputs, *epilogue inputs, *outputs, M)` of one fused reduction for
    `arch`; `epi` is None or (epilogue program text, epilogue input dtypes)."""
    name = kernel_name(text, roles, dtypes, kind, params, n, tiling, epi)
    src = kernel_source(parse(text), roles, dtypes, kind, params, n, tiling, name,
                        None if epi is None else (parse(epi[0]), epi[1]))
    return load_launch(_write(src, name), "_flydsl_red_")


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


def _axes(shape, dims):
    """(reduced dims sorted and non-negative, the permutation that moves them last)."""
    r = len(shape)
    dims = sorted({d % r for d in dims}) if r else []
    return dims, [d for d in range(r) if d not in dims] + dims


def prepare(inputs, program, kind: str, dims, keepdim: bool, params=(), epi_inputs=(), epilogue=None):
    """Validate; return (outputs, launch arguments or None when there is nothing to do, build key).

    `epilogue` (optional) is an elementwise program applied to each result: value 0 is the reduced
    value (fp32), values 1.. are `epi_inputs` (broadcast to the output's shape, read once per row);
    its output dtype is the result's."""
    prog = as_program(program)
    op = f"fused_reduce({kind})"
    epi = parse(epilogue) if epilogue else None
    if epi is not None:
        if kind in ("argmax", "argmin", "max", "min") or epi.n != 1 + len(epi_inputs) or len(epi.out) != 1 \
                or epi.out[0][1] == "bool":
            raise KernelInputError(f"{op}: the epilogue must take the result and {len(epi_inputs)} extra input(s) and "
                                   "return one float value; arg / max / min reductions take none")
        prog = Program(prog.n, prog.ops, ((prog.out[0][0], epi.out[0][1]),))
    if kind not in KINDS:
        raise KernelInputError(f"{op}: unknown reduction kind; expected one of {sorted(KINDS)}")
    if len(inputs) != prog.n or len(prog.out) != 1:
        raise KernelInputError(f"{op}: program takes {prog.n} inputs and must have one output, got {len(inputs)} "
                               f"inputs and {len(prog.out)} outputs")
    shape = broadcast_inputs(op, prog, inputs)
    dims, perm = _axes(shape, dims)
    r = len(shape)
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
    eflat, edt = [], ()
    if epi is not None:
        for i, t in enumerate(epi_inputs):
            if not isinstance(t, torch.Tensor) or t.dtype not in DTYPES or t.device != dev:
                raise KernelInputError(f"{op}: epilogue input {i} must be a float32 / bfloat16 / float16 / bool tensor "
                                       f"on {dev}")
            try:
                e = t.expand(oshape).contiguous().reshape(-1)
            except RuntimeError:
                raise KernelInputError(f"{op}: epilogue input {i} of shape {tuple(t.shape)} does not broadcast to the "
                                       f"result shape {oshape}") from None
            eflat.append(e.view(torch.uint8) if e.dtype == torch.bool else e)
        edt = tuple(DTYPES[t.dtype] for t in epi_inputs)
    epik = None if epi is None else (epi.text(), edt)
    if n == 0:
        raise KernelInputError(f"{op}: reducing an empty dim of shape {shape} over {dims}; keep it in PyTorch")
    if m * n > 2**31 - 1:
        raise KernelInputError(f"{op}: {shape} has more than 2^31 - 1 elements; split it (buffer offsets are 32-bit)")
    roles, flat = zip(*[_role(t, shape, dims, perm) for t in inputs])
    dtypes = tuple(DTYPES[t.dtype] for t in inputs)
    tiling = _tiling(n, roles, dtypes, flat)
    if not tiling.fits:
        if kind in SPLIT:
            return outs, None, ("split", prog, roles, list(flat), dtypes, m, n, epik, eflat)
        raise KernelInputError(f"{op}: rows of N={n} elements are longer than a workgroup holds in registers "
                               f"({max_row_length()}); keep this reduction in PyTorch")
    key = (prog.text(), tuple(roles), dtypes, kind, tuple(float(p) for p in params), n, tiling, epik)
    return outs, list(flat) + eflat + [o.view(-1) for o in outs] + [m], key


def _tiling(n, roles, dtypes, flat):
    wide = [BITS[dt] for role, dt in zip(roles, dtypes) if role != "col"] or [32]
    vec = min(8, 128 // max(wide))
    while vec > 1 and (n % vec or any(f.data_ptr() % (vec * f.element_size()) for f, role in zip(flat, roles)
                                      if role != "col")):
        vec //= 2
    return codegen_row_tiling(n, vec)


# kinds that reduce in two stages when a row is too long: stage-1 kind, stage-2 kind
SPLIT = {"sum": ("sum", "sum"), "mean": ("sum", "mean"), "amax": ("amax", "amax"), "amin": ("amin", "amin"),
         "logsumexp": ("logsumexp", "logsumexp"), "norm": ("norm", "norm")}


def _launch(key, args):
    launch = build_reduce(*key, current_arch())
    kl.call(launch, *args)


def _two_stage(out, kind, params, split):
    """Rows too long for one workgroup: each row is cut into K chunks (K divides N); stage 1
    reduces the [M * K, N / K] chunks to fp32 partials, stage 2 reduces the [M, K] partials."""
    _, prog, roles, flat, dtypes, m, n, epik, eflat = split
    k = split_factor(n)
    if k is None:
        raise KernelInputError(f"fused_reduce({kind}): rows of N={n} cannot be cut into <= {max_row_length()} equal "
                               "chunks; keep this reduction in PyTorch")
    f1 = []
    for role, f in zip(roles, flat):
        if role == "col":
            f1.append(f.repeat_interleave(k))
        elif role == "row":
            f1.append(f.reshape(1, n).expand(m, n).reshape(-1))
        else:
            f1.append(f)
    r1 = tuple("col" if r == "col" else "full" for r in roles)
    n1 = n // k
    k1, k2 = SPLIT[kind]
    p = float(params[0]) if kind == "norm" else None
    p1 = (p,) if kind == "norm" else ()
    part = torch.empty(m * k, dtype=torch.float32, device=flat[0].device)
    text1 = Program(prog.n, prog.ops, ((prog.out[0][0], "f32"),)).text()
    _launch((text1, r1, dtypes, k1, p1, n1, _tiling(n1, r1, dtypes, f1), None), f1 + [part, m * k])
    if kind == "norm" and p == 0:
        k2 = "sum"
    p2 = (float(n),) if kind == "mean" else p1 if k2 == "norm" else ()
    text2 = Program(1, (), ((0, prog.out[0][1]),)).text()
    pl2 = _tiling(k, ("full",), ("f32",), [part])
    _launch((text2, ("full",), ("f32",), k2, p2, k, pl2, epik), [part] + eflat + [out.view(-1), m])


class _Layout:
    """A validated one-stage reduction: what a repeated call with the same layout needs (from prepare)."""

    def __init__(self, inputs, dims, outs, key, m):
        self.text, self.roles, self.dtypes, self.kind, self.params, self.n, _, self.epik = key
        self.m, self.oshape, self.out_dtypes = m, tuple(outs[0].shape), [o.dtype for o in outs]
        self.shape = tuple(torch.broadcast_shapes(*[t.shape for t in inputs]))
        self.dims, self.perm = _axes(self.shape, dims)


_LAYOUTS: dict = {}  # (program, kind, dims, keepdim, params, epilogue, input and epilogue input layouts) -> _Layout
MAX_LAYOUTS = 4096


def _layout_key(inputs, program, kind, dims, keepdim, params, epi_inputs, epilogue):
    try:
        k = (program, kind, tuple(dims), keepdim, tuple(params), epilogue,
             tuple([(t.shape, t.stride(), t.dtype, t.device) for t in inputs]),
             tuple([(t.shape, t.stride(), t.dtype, t.device) for t in epi_inputs]))
        hash(k)
        return k
    except (AttributeError, TypeError):  # not tensors, or unhashable arguments: prepare says what is wrong
        return None


def _cached_call(lay: _Layout, inputs, epi_inputs):
    """prepare()'s work for a layout seen before: (outputs, launch arguments, build key), or None."""
    dev = inputs[0].device
    outs = [torch.empty(lay.oshape, dtype=dt, device=dev) for dt in lay.out_dtypes]
    flat = [_role(t, lay.shape, lay.dims, lay.perm)[1] for t in inputs]
    eflat = []
    for t in epi_inputs:
        e = t.expand(lay.oshape).contiguous().reshape(-1)
        eflat.append(e.view(torch.uint8) if e.dtype == torch.bool else e)
    tiling = _tiling(lay.n, lay.roles, lay.dtypes, flat)
    if not tiling.fits:  # a narrower vector for these addresses: prepare decides (two stages, or why not)
        return None
    key = (lay.text, lay.roles, lay.dtypes, lay.kind, lay.params, lay.n, tiling, lay.epik)
    return outs, flat + eflat + [o.view(-1) for o in outs] + [lay.m], key


@kr.replayed
def fused_reduce(inputs, program, kind: str, dims, keepdim: bool, params=(), epi_inputs=(),
                 epilogue=None) -> list[torch.Tensor]:
    """Run prologue `program` on `inputs` and reduce its value over `dims` (then `epilogue`, see
    prepare); returns the outputs (one tensor, or values and int64 indices for kind max / min).

    A repeated one-stage call with the same layout (program, kind, dims, flags, shapes, strides, dtypes,
    devices) validates nothing again: it allocates, flattens, picks the vector width for the base
    addresses and launches."""
    ck = _layout_key(inputs, program, kind, dims, keepdim, params, epi_inputs, epilogue)
    lay = _LAYOUTS.get(ck) if ck is not None else None
    hit = _cached_call(lay, inputs, epi_inputs) if lay is not None else None
    if hit is not None:
        outs, args, key = hit
    else:
        outs, args, key = prepare(inputs, program, kind, dims, keepdim, params, epi_inputs, epilogue)
        if key is not None and key[0] == "split":
            _two_stage(outs[0], kind, params, key)
            return outs
        if args is None:
            return outs
        if ck is not None:
            if len(_LAYOUTS) >= MAX_LAYOUTS:
                _LAYOUTS.clear()
            _LAYOUTS[ck] = _Layout(inputs, dims, outs, key, args[-1])
    name = kernel_name(*key)
    note_use(name)
    if name not in CALLS:  # one call's arguments per kernel, built once
        CALLS[name] = dict(
            family="reduce", program=key[0], kind=kind, dims=list(dims), keepdim=bool(keepdim),
            params=[float(p) for p in params], shapes=[list(t.shape) for t in inputs],
            dtypes=[DTYPES[t.dtype] for t in inputs], epilogue=epilogue or None,
            epi_shapes=[list(t.shape) for t in epi_inputs], epi_dtypes=[DTYPES[t.dtype] for t in epi_inputs])
    _launch(key, args)
    return outs


def split_factor(n: int) -> int | None:
    """Chunks K per row for a two-stage reduction of rows of length n (None: no usable divisor);
    prefers chunk lengths that allow 128-bit accesses."""
    limit = max_row_length()
    ks = [k for k in range(2, limit + 1) if n % k == 0 and n // k <= limit]
    if not ks:
        return None
    return next((k for k in ks if (n // k) % 8 == 0 and k <= 4 * ks[0]), ks[0])


def max_row_length() -> int:
    return MAX_BLOCK * MAX_ELEMS_PER_LANE


# ---- the reference (torch, fp32): what the kernel computes ----


def ref_fused_reduce(inputs, program, kind, dims, keepdim, params, epi_inputs=(), epilogue=""):
    if not epilogue:
        return _ref_reduce(inputs, program, kind, dims, keepdim, params)
    p = parse(program)  # the result enters the epilogue unrounded, as in the kernel
    outs = _ref_reduce(inputs, Program(p.n, p.ops, ((p.out[0][0], "f32"),)).text(), kind, dims, keepdim, params)
    e = parse(epilogue)
    f32 = Program(e.n, e.ops, ((e.out[0][0], "f32"),)).text()
    (y,) = ref_program([outs[0].float()] + list(epi_inputs), f32)
    return [y.expand(outs[0].shape).to(TORCH[e.out[0][1]]).contiguous()]


def _ref_reduce(inputs, program, kind, dims, keepdim, params):
    prog = parse(program)
    as_f32 = Program(prog.n, prog.ops, ((prog.out[0][0], "f32"),)).text()
    (y,) = ref_program(inputs, as_f32)
    vdt = TORCH[prog.out[0][1]]
    dims = sorted({d % y.dim() for d in dims}) if y.dim() else []
    if kind in ("argmax", "argmin", "max", "min"):
        shape = out_shape(tuple(y.shape), dims, keepdim)
        if y.dim() == 0:
            t = y.reshape(1)
        else:  # reduced dims last and flattened: indices count along them in row-major order
            t = y.movedim(dims, list(range(y.dim() - len(dims), y.dim()))).flatten(y.dim() - len(dims))
        if kind in ("max", "min"):
            r = getattr(torch, kind)(t, -1, keepdim=True)
            return [r.values.reshape(shape).to(vdt), r.indices.reshape(shape)]
        return [getattr(torch, kind)(t, -1, keepdim=True).reshape(shape)]
    f = {"sum": lambda: y.sum(dims, keepdim=keepdim), "mean": lambda: y.mean(dims, keepdim=keepdim),
         "amax": lambda: y.amax(dims, keepdim=keepdim), "amin": lambda: y.amin(dims, keepdim=keepdim),
         "var": lambda: y.var(dims, correction=params[0], keepdim=keepdim),
         "std": lambda: y.std(dims, correction=params[0], keepdim=keepdim),
         "logsumexp": lambda: torch.logsumexp(y, dims, keepdim=keepdim),
         "norm": lambda: torch.linalg.vector_norm(y, params[0], dims, keepdim=keepdim)}[kind]
    return [f().to(vdt)]
