"""Decode a compiled module once into closures, then run its host function.

``Decoder`` walks the MLIR (flydsl's own bindings) once per artifact and turns
each op into a closure ``f(ex)`` over a flat register list ``ex.R``; regions
(scf.if / scf.for bodies) become nested closure lists. ``Exec`` is the state of
one launch: all lanes of all workgroups as the leading dimension of torch
tensors, the active-lane mask (None = every lane), LDS, global memory and the
counters. Pure ops ignore the mask (a value defined under a mask is only used
under it); side effects and region results honour it.
"""

from __future__ import annotations

import re
from collections import Counter

import torch

from .errors import OutOfBoundsError, SimulationError, UnsupportedOpError
from .types import tinfo, zeros_of

OPS = {}
PREFIX_OPS = {}  # op-name prefix -> handler (e.g. every rocdl.mfma.*)


def op(*names):
    def deco(fn):
        for n in names:
            OPS[n] = fn
        return fn

    return deco


_LOC_RE = re.compile(r'"([^"]+)":(\d+):(\d+)')


def loc_text(location) -> str:
    """The innermost user-code ``file:line`` of an MLIR location, or ''."""
    s = str(location)
    hits = _LOC_RE.findall(s)
    for f, line, _c in hits:
        if "site-packages/flydsl" not in f and "/flydsl/" not in f:
            return f"{f}:{line}"
    return f"{hits[0][0]}:{hits[0][1]}" if hits else ""


def loc_chain(location) -> str:
    """``loc_text`` and, for an op of a helper function that the kernel calls (an MLIR callsite
    location), the user-code lines it was called from: ``k.py:167 (called from k.py:408)``."""
    user = []
    for f, line, _c in _LOC_RE.findall(str(location)):
        if "site-packages/flydsl" not in f and "/flydsl/" not in f and (not user or user[-1] != (f, line)):
            user.append((f, line))
    if len(user) < 2:
        return loc_text(location)
    head = f"{user[0][0]}:{user[0][1]}"
    callers = ", ".join(f"{f}:{line}" for f, line in user[1:4])
    return f"{head} (called from {callers})"


class Decoder:
    def __init__(self, name, module_info):
        self.name = name
        self.info = module_info
        self.slots = {}
        self.census = Counter()
        self.depth = 0  # region nesting: 1 = the function body
        self.nested_barrier = False  # a barrier under control flow (see waves.py)

    def s(self, v):
        k = self.slots.get(v)
        if k is None:
            k = self.slots[v] = len(self.slots)
        return k

    def ins(self, o):
        return [self.s(v) for v in o.operands]

    def outs(self, o):
        return [self.s(v) for v in o.results]

    def block(self, block):
        fns = []
        for o in block.operations:
            o = o.operation
            h = OPS.get(o.name)
            if h is None:
                h = next((v for k, v in PREFIX_OPS.items() if o.name.startswith(k)), None)
            if h is None:
                raise UnsupportedOpError(f"flysim does not implement op '{o.name}'", kernel=self.name, loc=loc_chain(o.location))
            f = h(self, o)
            if f is None:
                continue
            f.loc = loc_chain(o.location)
            f.opname = o.name
            self.census[o.name] += 1
            fns.append(f)
        return fns

    def region(self, region):
        b = region.blocks[0]
        self.depth += 1
        try:
            return [self.s(a) for a in b.arguments], self.block(b)
        finally:
            self.depth -= 1


class Exec:
    """State of one launch (or of the host function, with N = 1 and no lanes)."""

    def __init__(self, kernel, nregs, device):
        self.kernel = kernel
        self.R = [None] * nregs
        self.mask = None
        self.device = device
        self.yielded = None
        self.ops = Counter()
        self.lane_ops = 0
        self.N = 1
        self.regions = None  # simulate(count_regions=True): region key -> [waves, ...] (see tally)

    def run(self, fns):
        try:
            for f in fns:
                f(self)
        except SimulationError as e:
            if e.loc is None:
                rs = getattr(f, "rsrc", None)  # a buffer op: its descriptor's num_records
                if rs is not None and isinstance(e, OutOfBoundsError):
                    nrec = self.R[rs][1]
                    e.num_records = int(nrec.reshape(-1)[0]) if torch.is_tensor(nrec) else int(nrec)
                e.place(self.kernel, f.opname, f.loc)
            raise
        except Exception as e:  # a torch error inside an op: name the op and the line
            raise SimulationError(f"{f.opname} failed: {type(e).__name__}: {e}", kernel=self.kernel, loc=f.loc) from e

    def count(self, fns):
        n = self.N if self.mask is None else int(self.mask.sum())
        for f in fns:
            self.ops[f.opname] += 1
        self.lane_ops += n * len(fns)


def mask_like(m, x):
    """Reshape a lane mask [N] so it broadcasts against x [N, ...]."""
    return m.view(m.shape[0], *([1] * (x.dim() - 1))) if x.dim() > 1 else m


def merge(m, new, old):
    if isinstance(new, tuple):
        return tuple(merge(m, a, b) for a, b in zip(new, old))
    if new is None:
        return None
    if new is old:
        return new
    if new.dim() == 0 and old.dim() == 0 and bool((new == old).all()):
        return new
    mm = m if new.dim() <= 1 and old.dim() <= 1 else mask_like(m, new if new.dim() >= old.dim() else old)
    return torch.where(mm, new, old)


def is_uniform(x):
    return x.dim() == 0


WAVE = 64


def waves_in(ex, m) -> int:
    """Waves with at least one lane in mask m (None: every lane of the launch)."""
    return ex.N // WAVE if m is None else int(m.view(-1, WAVE).any(1).sum())


def tally(ex, key, *waves):
    """Add per-side wave counts to region `key` (scf.if: then, else; scf.for: iterations)."""
    got = ex.regions.get(key)
    if got is None:
        ex.regions[key] = list(waves)
    else:
        for i, w in enumerate(waves):
            got[i] += w


def run_block(ex, fns):
    if ex.counting:
        ex.count(fns)
    ex.run(fns)


# -- structured control flow ------------------------------------------------


@op("scf.yield", "gpu.return", "func.return")
def _yield(d, o):
    ins = d.ins(o)

    def f(ex):
        ex.yielded = [ex.R[i] for i in ins]

    return f


@op("scf.if")
def _if(d, o):
    cond = d.s(o.operands[0])
    outs = d.outs(o)
    _, then_fns = d.region(o.regions[0])
    else_fns = d.region(o.regions[1])[1] if len(o.regions[1].blocks) else []
    key = f"{loc_text(o.location)} scf.if"

    def f(ex):
        c = ex.R[cond]
        if c.dim() == 0:
            if ex.regions is not None:
                w = waves_in(ex, ex.mask)
                tally(ex, key, w if bool(c) else 0, 0 if bool(c) else w)
            run_block(ex, then_fns if bool(c) else else_fns)
            if outs:
                for k, v in zip(outs, ex.yielded):
                    ex.R[k] = v
            return
        m = ex.mask
        mt = c if m is None else (m & c)
        mf = ~c if m is None else (m & ~c)
        any_t, any_f = bool(mt.any()), bool(mf.any())
        if ex.regions is not None:
            tally(ex, key, waves_in(ex, mt) if any_t else 0, waves_in(ex, mf) if any_f else 0)
        if not (any_t and any_f):
            run_block(ex, then_fns if any_t or not any_f else else_fns)
            if outs:
                for k, v in zip(outs, ex.yielded):
                    ex.R[k] = v
            return
        ex.mask = mt
        run_block(ex, then_fns)
        ty = ex.yielded
        ex.mask = mf
        run_block(ex, else_fns)
        fy = ex.yielded
        ex.mask = m
        for k, a, b in zip(outs, ty or [], fy or []):
            ex.R[k] = merge(c, a, b)

    return f


@op("scf.for")
def _for(d, o):
    lb, ub, step, *inits = d.ins(o)
    outs = d.outs(o)
    (iv, *iters), body = d.region(o.regions[0])
    ivt = tinfo(str(o.operands[0].type)).dtype
    key = f"{loc_text(o.location)} scf.for"

    def f(ex):
        R = ex.R
        vals = [R[i] for i in inits]
        L, U, S = R[lb], R[ub], R[step]
        if L.dim() == 0 and U.dim() == 0 and S.dim() == 0:
            trips = range(int(L), int(U), int(S))
            if ex.regions is not None:
                tally(ex, key, len(trips) * waves_in(ex, ex.mask))
            for i in trips:
                R[iv] = torch.tensor(i, dtype=ivt, device=L.device)
                for k, v in zip(iters, vals):
                    R[k] = v
                run_block(ex, body)
                vals = ex.yielded
        else:
            trips = torch.clamp((U.to(torch.int64) - L.to(torch.int64) + S - 1) // S, min=0)
            m = ex.mask
            if m is not None:
                trips = torch.where(m, trips, 0)
            n = int(trips.max()) if trips.numel() else 0
            for t in range(n):
                act = trips > t
                ex.mask = act if (m is not None or not bool(act.all())) else None
                if ex.regions is not None:
                    tally(ex, key, waves_in(ex, ex.mask))
                R[iv] = (L + S * t).to(ivt)
                for k, v in zip(iters, vals):
                    R[k] = v
                run_block(ex, body)
                new = ex.yielded
                vals = [merge(act, a, b) for a, b in zip(new, vals)] if ex.mask is not None else list(new)
            ex.mask = m
        for k, v in zip(outs, vals):
            R[k] = v

    return f


@op("scf.while")
def _while(d, o):
    inits = d.ins(o)
    outs = d.outs(o)
    before_args, before = d.region(o.regions[0])
    after_args, after = d.region(o.regions[1])
    cond_op = list(o.regions[0].blocks[0].operations)[-1].operation
    cslot = d.s(cond_op.operands[0])

    def f(ex):
        R = ex.R
        vals = [R[i] for i in inits]
        m = ex.mask
        while True:
            for k, v in zip(before_args, vals):
                R[k] = v
            run_block(ex, before)
            c = R[cslot]
            carried = ex.yielded
            if c.dim() == 0:
                if not bool(c):
                    vals = carried
                    break
                act = None
            else:
                act = c if ex.mask is None else (ex.mask & c)
                if not bool(act.any()):
                    vals = carried
                    break
                ex.mask = act
            for k, v in zip(after_args, carried):
                R[k] = v
            run_block(ex, after)
            vals = ex.yielded if act is None else [merge(act, a, b) for a, b in zip(ex.yielded, carried)]
        ex.mask = m
        for k, v in zip(outs, vals):
            R[k] = v

    return f


@op("scf.condition")
def _condition(d, o):
    ins = d.ins(o)[1:]

    def f(ex):
        ex.yielded = [ex.R[i] for i in ins]

    return f


# -- constants ---------------------------------------------------------------


def const_value(attr, ti, device):
    from flydsl._mlir import ir

    def scalar(a):
        for cls in (ir.IntegerAttr, ir.FloatAttr, ir.BoolAttr):
            try:
                return cls(a).value
            except (ValueError, TypeError):
                continue
        raise TypeError(f"cannot read constant {a}")

    if ti.kind == "scalar":
        v = scalar(attr)
    else:
        da = ir.DenseElementsAttr(attr)
        if da.is_splat:
            v = scalar(da.get_splat_value())
            return _const_tensor(v, ti, device).expand(ti.vshape).contiguous()
        try:
            typed = ir.DenseIntElementsAttr(attr) if ti.bits else ir.DenseFPElementsAttr(attr)
            v = [typed[i] for i in range(len(typed))]
        except (ValueError, TypeError):
            v = [float(x) for x in re.findall(r"[-+0-9.eEinfa]+", str(attr).split(">")[0].split("<", 1)[1])]
        return _const_tensor(v, ti, device).reshape(ti.vshape)
    return _const_tensor(v, ti, device)


def _const_tensor(v, ti, device):
    if ti.bits == 1:
        return torch.tensor(v, device=device).ne(0) if not isinstance(v, bool) else torch.tensor(v, device=device)
    if ti.bits:
        def wrap(x):
            x = int(x) & ((1 << ti.bits) - 1)
            return x - (1 << ti.bits) if x >= 1 << (ti.bits - 1) else x
        v = [wrap(x) for x in v] if isinstance(v, list) else wrap(v)
        return torch.tensor(v, dtype=ti.dtype, device=device)
    return torch.tensor(v, dtype=torch.float64, device=device).to(ti.dtype)


@op("arith.constant", "llvm.mlir.constant")
def _constant(d, o):
    (out,) = d.outs(o)
    ti = tinfo(str(o.results[0].type))
    val = const_value(o.attributes["value"], ti, d.info.device)

    def f(ex):
        ex.R[out] = val

    return f


@op("ub.poison", "llvm.mlir.undef", "llvm.mlir.poison", "llvm.mlir.zero")
def _poison(d, o):
    (out,) = d.outs(o)
    val = zeros_of(tinfo(str(o.results[0].type)), d.info.device)

    def f(ex):
        ex.R[out] = val

    return f
