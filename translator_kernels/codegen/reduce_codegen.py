"""Source generation of fused row-reduction kernels (see translator_kernels.codegen.reduce).

The generated module has a `prologue(x0, x1, ...)` function (the fused elementwise program,
written by the same expression generator as the elementwise kernels) and one kernel: each
row of the [M, N] problem goes to LPR lanes (a workgroup, or a power-of-two group inside a
wave for short rows); lane l reads vectors l, l + LPR, ... (NT unrolled tiles, the last one
masked when LPR does not divide NV), applies the prologue, combines in fp32, then the lanes
combine by butterfly shuffles and, across waves, through LDS. Lane 0 finalizes and stores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from translator_kernels.codegen.source import as_float, body, lit as _lit
from translator_kernels.program import Program

# kind -> (first combine, needs the values kept for a second sweep)
KINDS = {"sum": "sum", "mean": "sum", "amax": "max", "amin": "min", "var": "sum", "std": "sum",
         "logsumexp": "max", "argmax": "max", "argmin": "min", "max": "max", "min": "min", "norm": "sum"}
ARG = ("argmax", "argmin", "max", "min")  # carry indices
WAVE = 64
MAX_BLOCK = 1024
VECS_PER_LANE = 4  # target vectors a lane reads before the block grows
MAX_ELEMS_PER_LANE = 64  # fp32 values a lane may hold (var / logsumexp keep them): 0 spills


@dataclass(frozen=True)
class RowTiling:
    n: int  # row length
    vec: int  # elements per access
    lpr: int  # lanes per row: a power of two < 64 (rows share a wave) or the whole block
    block: int  # threads per workgroup
    nt: int  # vectors per lane

    @property
    def fits(self) -> bool:
        return self.nt * self.vec <= MAX_ELEMS_PER_LANE


def codegen_row_tiling(n: int, vec: int) -> RowTiling:
    """Fewest lanes per row that keep each lane at <= VECS_PER_LANE vectors (up to a 1024 block)."""
    nv = n // vec
    lpr = 1
    while lpr < MAX_BLOCK and -(-nv // lpr) > VECS_PER_LANE:
        lpr *= 2
    block = 256 if lpr < WAVE else lpr
    return RowTiling(n, vec, lpr, block, -(-nv // lpr))


def norm_op(p: float) -> str:
    return "max" if p == math.inf else "min" if p == -math.inf else "sum"


def prologue_source(prog: Program, kinds, args: str, feeds: str) -> list[str]:
    """Lines of the generated `prologue(...)`: the fused elementwise chain feeding a reduction or a
    scan, one fp32 vector expression per op (shared by reduce_codegen and scan_codegen)."""
    L = [f"def prologue({args}):", f'    """The fused elementwise chain feeding the {feeds} (fp32 math)."""']
    return L + body(prog, kinds, "VEC") + [as_float(prog, kinds), "", ""]


def row_module_head(doc: list[str], device: str, n: int, vec: int, lpr: int, block: int) -> list[str]:
    """Lines opening a generated row kernel module: its docstring (`doc`'s lines), imports (`device`: its
    device module, `from translator_kernels.codegen import <device>`) and row geometry constants.
    Shared by reduce_codegen and scan_codegen."""
    return [f'"""{doc[0]}', *doc[1:], '"""', "",
            "import flydsl.compiler as flyc", "import flydsl.expr as fx", "from flydsl.expr import gpu", "",
            "from translator_kernels import device_math as em", f"from translator_kernels.codegen import {device}", "",
            f"N = {n}", f"VEC = {vec}", f"NV = {n // vec}  # vectors per row", f"LPR = {lpr}  # lanes per row",
            f"BLOCK = {block}", f"RPB = {block // lpr}  # rows per workgroup"]


def row_kernel_header(name: str, sig: str, block: int, sub: bool) -> list[str]:
    """Lines opening a generated row kernel: decorator, signature, and each lane's row and lane
    index (several rows per workgroup when `sub`; rows past M recompute row M - 1, store nothing).
    Shared by reduce_codegen and scan_codegen."""
    deco = f"@flyc.kernel(known_block_size=[{block}, 1, 1])" if block > 256 else "@flyc.kernel"
    L = [deco, f"def {name}({sig}, M: fx.Int32):", "    tid = fx.thread_idx.x"]
    if sub:
        return L + ["    lane = tid % LPR",
                    "    row_raw = fx.Int32(fx.block_idx.x) * RPB + tid // LPR",
                    "    row_ok = row_raw < M",
                    "    row = row_ok.select(row_raw, M - 1)  # rows past M recompute row M - 1 and store nothing"]
    return L + ["    lane = tid", "    row = fx.Int32(fx.block_idx.x)"]


def kernel_source(prog: Program, in_roles, in_dtypes, kind: str, params, n: int, tiling, name: str, epi=None) -> str:
    """`in_roles[i]`: "full" ([M, N] flat), "row" ([N], same for every row), "col" ([M], one per row).
    `epi`: None or (epilogue Program, its extra inputs' dtypes): applied to each row's result."""
    vec, lpr, block, nt = tiling.vec, tiling.lpr, tiling.block, tiling.nt
    nv = n // vec
    rpb = block // lpr
    sub = lpr < block
    waves = 1 if lpr <= WAVE else lpr // WAVE
    partial = nv % lpr != 0
    op = norm_op(params[0]) if kind == "norm" else KINDS[kind]
    out_dt = prog.out[0][1]
    kinds = prog.kinds(in_dtypes)
    ins = [f"In{i}" for i in range(prog.n)] + [f"E{i}" for i in range(len(epi[1]) if epi else 0)]
    outs = ["Out0", "Out1"] if kind in ("max", "min") else ["Out0"]
    sig = ", ".join(f"{t}: fx.Tensor" for t in ins + outs)
    args = ", ".join(f"x{i}" for i in range(prog.n))
    L = row_module_head(
        [f"Fused row reduction {name} (generated by translator_kernels.codegen.reduce; do not edit).", "",
         f"kind: {kind} {list(params)} over rows of N={n}; prologue program: {prog.text()}",
         f"inputs: {list(zip(in_roles, in_dtypes))}",
         f"launch: {rpb} row(s) per workgroup of {block} threads, {lpr} lanes per row, "
         f"{nt} tile(s) of VEC={vec} per lane"],
        "reduce_device as rd", n, vec, lpr, block)
    L += [f"W = {waves}  # waves per row (LDS combine when > 1)", "", ""]
    L += prologue_source(prog, kinds, args, "reduction")
    if epi:
        ep, edts = epi
        ekinds = ep.kinds(["f32"] + list(edts))
        L += [f"def epilogue({', '.join(f'x{i}' for i in range(ep.n))}):",
              '    """The fused elementwise chain after the reduction (x0: the result, one lane vector)."""']
        L += body(ep, ekinds, "1") + [as_float(ep, ekinds), "", ""]
    if waves > 1:
        L += ["@fx.struct", "class Scratch:"]
        L += [f"    s{j}: fx.Array[fx.Float32, W, 16]" for j in range(3)]
        L += ["", ""]
    L += row_kernel_header(name, sig, block, sub)
    if waves > 1:
        L += ["    lds = fx.SharedAllocator().allocate(Scratch).peek()"]
        L += [f"    slot{j} = lds.s{j}.view(fx.make_layout(W, 1))" for j in range(3)]
    for i, (role, dt) in enumerate(zip(in_roles, in_dtypes)):
        if role == "col":
            L.append(f"    c{i} = em.load_splat(In{i}, {dt!r}, VEC, row)  # one value per row")
    arg = kind in ARG
    fill = _lit({"sum": 0.0, "max": -math.inf, "min": math.inf}[op])
    for t in range(nt):
        last = partial and t == nt - 1
        L.append(f"    v = lane + {t * lpr}")
        if last:
            L += ["    ok = v < NV", "    v = ok.select(v, 0)  # past the row end: read vector 0, neutralized below"]
        loads = []
        for i, (role, dt) in enumerate(zip(in_roles, in_dtypes)):
            if role == "full":
                loads.append(f"em.load_vec(In{i}, {dt!r}, VEC, row * NV + v)")
            elif role == "row":
                loads.append(f"em.load_vec(In{i}, {dt!r}, VEC, v)")
            else:
                loads.append(f"c{i}")
        L.append(f"    y{t} = prologue({', '.join(loads)})")
        L += _elementwise_transform(kind, params, f"y{t}")
        if last:
            L.append(f"    y{t} = rd.mask(y{t}, ok, VEC, {fill})")
        if arg:
            L.append(f"    b, bi = rd.arg_lanes(y{t}, VEC, (v * VEC).to(fx.Float32), {op!r})")
            L.append("    best, bidx = b, bi" if t == 0 else f"    best, bidx = rd.arg_pick(b, bi, best, bidx, {op!r})")
        else:
            red = f"rd.lanes(y{t}, VEC, {op!r})"
            L.append(f"    acc = {red}" if t == 0 else f"    acc = rd.combine(acc, {red}, {op!r})")
    if arg:
        L += _cross_arg(op, lpr, waves)
    else:
        L += _cross("acc", "r", op, lpr, waves, 0)
    if kind in ("var", "std"):
        L.append("    mean = r / float(N)")
        for t in range(nt):
            d = f"(y{t} - mean)"
            sq = f"{d} * {d}"
            if partial and t == nt - 1:
                sq = f"rd.mask({sq}, ok, VEC, 0.0)"
            L.append(f"    acc = {'' if t == 0 else 'acc + '}rd.lanes({sq}, VEC, 'sum')")
        L += _cross("acc", "r", "sum", lpr, waves, 1)
        dof = max(n - params[0], 0)
        L.append(f"    r = r / {float(dof)!r}" + ("  # N - correction <= 0: inf / NaN as torch" if dof == 0 else ""))
        if kind == "std":
            L.append("    r = rd.sqrt(r)")
    elif kind == "logsumexp":
        L.append("    shift = (rd.absf(r) == float('inf')).select(0.0, r)  # all -inf rows give -inf, +inf gives inf")
        for t in range(nt):
            e = f"em.exp(y{t} - shift)"
            if partial and t == nt - 1:
                e = f"rd.mask({e}, ok, VEC, 0.0)"
            L.append(f"    acc = {'' if t == 0 else 'acc + '}rd.lanes({e}, VEC, 'sum')")
        L += _cross("acc", "s", "sum", lpr, waves, 1)
        L.append("    r = rd.log(s) + shift")
    elif kind == "mean":  # params: an explicit count (the second stage of a split row), else N
        L.append(f"    r = r / {float(params[0]) if params else float(n)!r}")
    elif kind == "norm":
        p = params[0]
        if p == 2:
            L.append("    r = rd.sqrt(r)")
        elif p not in (0, 1, math.inf, -math.inf):
            L.append(f"    r = rd.pow_pos(r, {1.0 / p!r})")
    if epi:
        extra = "".join(f", em.load_vec(E{i}, {dt!r}, 1, row)" for i, dt in enumerate(epi[1]))
        L.append(f"    r = epilogue(fx.Vector.filled(1, r, fx.Float32){extra})[0]")
    L.append("    st = (lane == 0) & row_ok" if sub else "    st = lane == 0")
    L.append("    if st:")
    if kind in ("argmax", "argmin"):
        L.append("        rd.store_index(Out0, bidx, row)")
    elif arg:
        L.append(f"        rd.store_scalar(Out0, {out_dt!r}, best, row)")
        L.append("        rd.store_index(Out1, bidx, row)")
    else:
        L.append(f"        rd.store_scalar(Out0, {out_dt!r}, r, row)")
    grid = "(M + RPB - 1) // RPB" if sub else "M"
    call = ", ".join(ins + outs)
    L += ["", "", "@flyc.jit",
          f"def launch({sig}, M: fx.Int32, stream: fx.Stream = fx.Stream(None)):",
          f"    {name}({call}, M).launch(grid=({grid}, 1, 1), block=(BLOCK, 1, 1), stream=stream)", ""]
    return "\n".join(L)


def _elementwise_transform(kind, params, y):
    """Per-element work of a vector norm before the combine."""
    if kind != "norm":
        return []
    p = params[0]
    if p == 2:
        return [f"    {y} = {y} * {y}"]
    if p == 0:
        return [f"    {y} = em.from_bool({y} != 0.0)"]
    if p in (1, math.inf, -math.inf):
        return [f"    {y} = em.absf({y})"]
    return [f"    {y} = rd.pow_pos(em.absf({y}), {float(p)!r})"]


def _cross(a, r, op, lpr, waves, slot):
    """Lines combining per-lane `a` across the row's lanes into `r` (every lane gets it)."""
    L = [f"    {r} = rd.allreduce({a}, {op!r}, {min(lpr, WAVE)})"]
    if waves > 1:
        L += ["    if tid % 64 == 0:", f"        fx.memref_store({r}, slot{slot}, tid // 64)", "    gpu.barrier()",
              f"    {r} = fx.memref_load(slot{slot}, 0)"]
        L += [f"    {r} = rd.combine({r}, fx.memref_load(slot{slot}, {w}), {op!r})" for w in range(1, waves)]
    return L


def _cross_arg(op, lpr, waves):
    L = [f"    best, bidx = rd.arg_allreduce(best, bidx, {op!r}, {min(lpr, WAVE)})"]
    if waves > 1:
        L += ["    if tid % 64 == 0:", "        fx.memref_store(best, slot0, tid // 64)",
              "        fx.memref_store(bidx, slot1, tid // 64)", "    gpu.barrier()",
              "    best = fx.memref_load(slot0, 0)", "    bidx = fx.memref_load(slot1, 0)"]
        L += [f"    best, bidx = rd.arg_pick(fx.memref_load(slot0, {w}), fx.memref_load(slot1, {w}), best, bidx, "
              f"{op!r})" for w in range(1, waves)]
    return L
