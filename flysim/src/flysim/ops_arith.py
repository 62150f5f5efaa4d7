"""arith, math and vector ops: one small function each over torch tensors.

Integers are signless two's complement of their width; ops with unsigned
semantics widen to int64 (or flip the sign bit for 64-bit compares). Integer
division by zero is poison in MLIR: flysim yields 0 there instead of raising.
Float ops run in the value's own format (torch rounds to nearest even).
"""

from __future__ import annotations

import torch

from .program import op
from .types import bitcast, tinfo

CMPI = {0: "eq", 1: "ne", 2: "slt", 3: "sle", 4: "sgt", 5: "sge", 6: "ult", 7: "ule", 8: "ugt", 9: "uge"}


def _ti(v):
    return tinfo(str(v.type))


def _unsigned(x, bits):
    if bits >= 64:
        return x
    if x.dtype == torch.bool:
        return x.to(torch.int64)
    return x.to(torch.int64) & ((1 << bits) - 1)


def unary(*names):
    def deco(fn):
        @op(*names)
        def h(d, o):
            (a,) = d.ins(o)[:1]
            (out,) = d.outs(o)
            ti, to = _ti(o.operands[0]), _ti(o.results[0])
            g = fn(ti, to, o)

            def f(ex):
                ex.R[out] = g(ex.R[a])

            return f

        return h

    return deco


def binary(*names):
    def deco(fn):
        @op(*names)
        def h(d, o):
            a, b = d.ins(o)[:2]
            (out,) = d.outs(o)[:1]
            g = fn(_ti(o.operands[0]), o)

            def f(ex):
                ex.R[out] = g(ex.R[a], ex.R[b])

            return f

        return h

    return deco


_SIMPLE = {
    "arith.addi": torch.add, "arith.subi": torch.sub, "arith.muli": torch.mul,
    "arith.addf": torch.add, "arith.subf": torch.sub, "arith.mulf": torch.mul, "arith.divf": torch.div,
    "arith.andi": torch.bitwise_and, "arith.ori": torch.bitwise_or, "arith.xori": torch.bitwise_xor,
    "arith.maxsi": torch.maximum, "arith.minsi": torch.minimum,
    "arith.maximumf": torch.maximum, "arith.minimumf": torch.minimum,
    "arith.maxnumf": torch.fmax, "arith.minnumf": torch.fmin, "arith.remf": torch.fmod,
    "math.powf": torch.pow, "math.copysign": torch.copysign, "math.atan2": torch.atan2,
    "llvm.fadd": torch.add, "llvm.fmul": torch.mul, "llvm.fsub": torch.sub, "llvm.add": torch.add,
    "llvm.mul": torch.mul, "llvm.sub": torch.sub, "llvm.and": torch.bitwise_and, "llvm.or": torch.bitwise_or,
    "llvm.xor": torch.bitwise_xor,
}
for _n, _fn in _SIMPLE.items():
    binary(_n)(lambda ti, o, _fn=_fn: _fn)


def _safe_div(kind):
    def mk(ti, o):
        bits = ti.bits

        def g(a, b):
            if kind.endswith("ui"):
                a, b = _unsigned(a, bits), _unsigned(b, bits)
            z = b == 0
            bb = torch.where(z, torch.ones_like(b), b)
            if kind in ("divsi", "divui"):
                r = torch.div(a, bb, rounding_mode="trunc")
            elif kind == "floordivsi":
                r = torch.div(a, bb, rounding_mode="floor")
            elif kind == "ceildivsi":
                r = -torch.div(-a, bb, rounding_mode="floor")
            elif kind == "remsi":
                r = torch.fmod(a, bb)
            else:
                r = torch.remainder(a, bb)
            r = torch.where(z, torch.zeros_like(r), r)
            return r.to(ti.dtype)

        return g

    return mk


for _k in ("divsi", "divui", "floordivsi", "ceildivsi", "remsi", "remui"):
    binary(f"arith.{_k}")(_safe_div(_k))


@binary("arith.maxui", "arith.minui")
def _minmaxu(ti, o):
    fn = torch.maximum if o.name.endswith("maxui") else torch.minimum
    return lambda a, b: torch.where(fn(_unsigned(a, ti.bits), _unsigned(b, ti.bits)) == _unsigned(a, ti.bits), a, b)


@binary("arith.shli", "llvm.shl")
def _shl(ti, o):
    return lambda a, b: torch.bitwise_left_shift(a, b.to(a.dtype))


@binary("arith.shrsi", "llvm.ashr")
def _shrs(ti, o):
    return lambda a, b: torch.bitwise_right_shift(a, b.to(a.dtype))


@binary("arith.shrui", "llvm.lshr")
def _shru(ti, o):
    bits = ti.bits

    def g(a, b):
        if bits < 64:
            return torch.bitwise_right_shift(_unsigned(a, bits), b.to(torch.int64)).to(a.dtype)
        s = b.to(torch.int64)
        sh = torch.bitwise_right_shift(a, s)
        keep = torch.where(s > 0, torch.bitwise_left_shift(torch.ones_like(s), 64 - s) - 1, torch.full_like(s, -1))
        return sh & keep

    return g


@binary("arith.cmpi", "llvm.icmp")
def _cmpi(ti, o):
    from flydsl._mlir import ir

    pred = CMPI[ir.IntegerAttr(o.attributes["predicate"]).value]
    bits = ti.bits
    if pred[0] == "u":
        if bits >= 64:
            flip = lambda x: x ^ torch.iinfo(torch.int64).min  # noqa: E731
        else:
            flip = lambda x: _unsigned(x, bits)  # noqa: E731
        base = {"ult": torch.lt, "ule": torch.le, "ugt": torch.gt, "uge": torch.ge}[pred]
        return lambda a, b: base(flip(a), flip(b))
    return {"eq": torch.eq, "ne": torch.ne, "slt": torch.lt, "sle": torch.le, "sgt": torch.gt, "sge": torch.ge}[pred]


@binary("arith.cmpf")
def _cmpf(ti, o):
    from flydsl._mlir import ir

    p = ir.IntegerAttr(o.attributes["predicate"]).value
    ordered = {1: torch.eq, 2: torch.gt, 3: torch.ge, 4: torch.lt, 5: torch.le, 6: torch.ne}
    if p == 0:
        return lambda a, b: torch.zeros_like(a + b, dtype=torch.bool)
    if p == 15:
        return lambda a, b: torch.ones_like(a + b, dtype=torch.bool)
    if p in ordered:
        fn = ordered[p]
        return lambda a, b: fn(a, b) & ~(torch.isnan(a) | torch.isnan(b))
    if p == 7:
        return lambda a, b: ~(torch.isnan(a) | torch.isnan(b))
    if p == 14:
        return lambda a, b: torch.isnan(a) | torch.isnan(b)
    fn = {8: torch.eq, 9: torch.gt, 10: torch.ge, 11: torch.lt, 12: torch.le, 13: torch.ne}[p]
    return lambda a, b: fn(a, b) | torch.isnan(a) | torch.isnan(b)


@op("arith.select", "llvm.select")
def _select(d, o):
    c, a, b = d.ins(o)
    (out,) = d.outs(o)

    def f(ex):
        cv, av, bv = ex.R[c], ex.R[a], ex.R[b]
        if isinstance(av, tuple):
            ex.R[out] = av if bool(cv.all()) else bv if not bool(cv.any()) else None
            return
        if cv.dim() == 0:
            ex.R[out] = av if bool(cv) else bv
            return
        nd = max(av.dim(), bv.dim())
        if nd > 1 and cv.dim() == 1:
            lane_dim = av.dim() > 1 and av.shape[0] == cv.shape[0] or bv.dim() > 1 and bv.shape[0] == cv.shape[0]
            if lane_dim or cv.shape[0] != (av.shape[-1] if av.dim() else 0):
                cv = cv.view(-1, *([1] * (nd - 1)))
        ex.R[out] = torch.where(cv, av, bv)

    return f


# -- casts -------------------------------------------------------------------


@unary("arith.extsi", "arith.trunci", "arith.index_cast", "llvm.sext", "llvm.trunc")
def _sext_trunc(ti, to, o):
    if to.bits == 1:
        return lambda x: (x & 1).to(torch.bool) if x.dtype != torch.bool else x
    return lambda x: x.to(to.dtype)


@unary("arith.extui", "arith.index_castui", "llvm.zext")
def _zext(ti, to, o):
    return lambda x: _unsigned(x, ti.bits).to(to.dtype) if to.bits > ti.bits else x.to(to.dtype)


@unary("arith.extf", "arith.truncf", "llvm.fpext", "llvm.fptrunc")
def _fcast(ti, to, o):
    return lambda x: x.to(to.dtype)


@unary("arith.sitofp", "llvm.sitofp")
def _sitofp(ti, to, o):
    return lambda x: x.to(torch.float64).to(to.dtype) if to.dtype != torch.float64 else x.to(to.dtype)


@unary("arith.uitofp", "llvm.uitofp")
def _uitofp(ti, to, o):
    return lambda x: _unsigned(x, ti.bits).to(torch.float64).to(to.dtype)


@unary("arith.fptosi", "arith.fptoui", "llvm.fptosi", "llvm.fptoui")
def _fptoi(ti, to, o):
    return lambda x: torch.nan_to_num(x.to(torch.float64)).trunc().to(torch.int64).to(to.dtype)


@unary("arith.bitcast", "vector.bitcast", "llvm.bitcast")
def _bitcast(ti, to, o):
    if ti.kind == "ptr":
        return lambda x: x
    if ti.dtype == to.dtype and ti.vshape == to.vshape:
        return lambda x: x
    return lambda x: bitcast(x, ti, to)


@unary("arith.negf", "llvm.fneg")
def _neg(ti, to, o):
    return torch.neg


_MATH1 = {
    "math.exp2": torch.exp2, "math.exp": torch.exp, "math.log": torch.log, "math.log2": torch.log2,
    "math.sqrt": torch.sqrt, "math.rsqrt": torch.rsqrt, "math.absf": torch.abs, "math.absi": torch.abs,
    "math.tanh": torch.tanh, "math.erf": torch.erf, "math.sin": torch.sin, "math.cos": torch.cos,
    "math.floor": torch.floor, "math.ceil": torch.ceil, "math.round": torch.round, "math.trunc": torch.trunc,
    "math.roundeven": torch.round, "math.log1p": torch.log1p, "math.expm1": torch.expm1,
    "math.fpowi": None,
}
for _n, _fn in _MATH1.items():
    if _fn is not None:
        unary(_n)(lambda ti, to, o, _fn=_fn: _fn)


@op("math.fma", "llvm.intr.fma", "llvm.intr.fmuladd", "vector.fma")
def _fma(d, o):
    a, b, c = d.ins(o)
    (out,) = d.outs(o)

    def f(ex):
        x, y, z = ex.R[a], ex.R[b], ex.R[c]
        if x.dtype == torch.float32:
            ex.R[out] = (x.double() * y.double() + z.double()).float()
        else:
            ex.R[out] = (x.float() * y.float() + z.float()).to(x.dtype)

    return f


# -- vector ------------------------------------------------------------------


def _positions(o, attr="static_position"):
    from flydsl._mlir import ir

    return list(ir.DenseI64ArrayAttr(o.attributes[attr]))


_DYN = -(1 << 63)


@op("vector.extract", "vector.extractelement", "llvm.extractelement")
def _vextract(d, o):
    src = d.s(o.operands[0])
    dyn = [d.s(v) for v in list(o.operands)[1:]]
    (out,) = d.outs(o)
    pos = _positions(o) if "static_position" in o.attributes else [_DYN]
    vr = len(_ti(o.operands[0]).vshape)

    def f(ex):
        x = ex.R[src]
        it = iter(dyn)
        p = [ex.R[next(it)] if q == _DYN else q for q in pos]
        if any(isinstance(q, torch.Tensor) and q.dim() > 0 for q in p):
            q = p[0].to(torch.int64)
            lane = x.dim() - vr
            xx = x.expand(q.shape[0], *x.shape[lane:]) if lane == 0 else x
            ex.R[out] = xx.gather(1, q.view(-1, 1)).squeeze(1)
            return
        p = [int(q) for q in p]
        ex.R[out] = x[(Ellipsis, *p) + (slice(None),) * (vr - len(p))]

    return f


@op("vector.insert", "vector.insertelement", "llvm.insertelement")
def _vinsert(d, o):
    if o.name == "vector.insert":
        val, dst = d.s(o.operands[0]), d.s(o.operands[1])
        pos = _positions(o)
    else:
        val, dst = d.s(o.operands[0]), d.s(o.operands[1])
        pos = None
        idx = d.s(o.operands[2])
        if o.name == "llvm.insertelement":
            dst, val = d.s(o.operands[0]), d.s(o.operands[1])
    (out,) = d.outs(o)
    vr = len(_ti(o.results[0]).vshape)

    def f(ex):
        v, x = ex.R[val], ex.R[dst]
        p = pos if pos is not None else [int(ex.R[idx])]
        lanes = [t.shape[0] for t in (v, x) if t.dim() > (vr - len(p) if t is v else vr)]
        shape = ((lanes[0],) if lanes else ()) + tuple(x.shape[x.dim() - vr:])
        y = x.expand(shape).clone()
        y[(Ellipsis, *p) + (slice(None),) * (vr - len(p))] = v
        ex.R[out] = y

    return f


@op("vector.from_elements")
def _from_elements(d, o):
    ins = d.ins(o)
    (out,) = d.outs(o)
    shape = _ti(o.results[0]).vshape

    def f(ex):
        xs = [ex.R[i] for i in ins]
        if any(x.dim() for x in xs):
            xs = torch.broadcast_tensors(*xs)
        ex.R[out] = torch.stack(xs, dim=-1).reshape(*xs[0].shape, *shape)

    return f


@op("vector.broadcast", "vector.splat")
def _broadcast(d, o):
    (a,) = d.ins(o)
    (out,) = d.outs(o)
    vs = _ti(o.results[0]).vshape
    sr = len(_ti(o.operands[0]).vshape)

    def f(ex):
        x = ex.R[a]
        lane = x.shape[: x.dim() - sr]
        x = x.reshape(*lane, *([1] * (len(vs) - sr)), *x.shape[x.dim() - sr:])
        ex.R[out] = x.expand(*lane, *vs)

    return f


@op("vector.shape_cast")
def _shape_cast(d, o):
    (a,) = d.ins(o)
    (out,) = d.outs(o)
    si, so = _ti(o.operands[0]), _ti(o.results[0])

    def f(ex):
        x = ex.R[a]
        ex.R[out] = x.reshape(*x.shape[: x.dim() - len(si.vshape)], *so.vshape)

    return f


@op("vector.shuffle")
def _vshuffle(d, o):
    a, b = d.ins(o)
    (out,) = d.outs(o)
    idx = torch.tensor(_positions(o, "mask"), dtype=torch.int64)

    def f(ex):
        x, y = ex.R[a], ex.R[b]
        if x.dim() != y.dim():
            x, y = torch.broadcast_tensors(x, y) if x.dim() and y.dim() else (x, y)
            if x.dim() != y.dim():
                n = max(x.shape[0] if x.dim() > 1 else 1, y.shape[0] if y.dim() > 1 else 1)
                x = x.expand(n, *x.shape[-1:]) if x.dim() == 1 else x
                y = y.expand(n, *y.shape[-1:]) if y.dim() == 1 else y
        ex.R[out] = torch.cat([x, y], dim=-1)[..., idx.to(x.device)]

    return f


@op("vector.extract_strided_slice")
def _ess(d, o):
    (a,) = d.ins(o)
    (out,) = d.outs(o)
    from flydsl._mlir import ir

    offs = [ir.IntegerAttr(x).value for x in ir.ArrayAttr(o.attributes["offsets"])]
    sizes = [ir.IntegerAttr(x).value for x in ir.ArrayAttr(o.attributes["sizes"])]
    strides = [ir.IntegerAttr(x).value for x in ir.ArrayAttr(o.attributes["strides"])]
    vr = len(_ti(o.operands[0]).vshape)
    sl = tuple(slice(of, of + sz * st, st) for of, sz, st in zip(offs, sizes, strides))
    sl = sl + (slice(None),) * (vr - len(sl))

    def f(ex):
        x = ex.R[a]
        ex.R[out] = x[(slice(None),) * (x.dim() - vr) + sl]

    return f


@op("vector.insert_strided_slice")
def _iss(d, o):
    a, b = d.ins(o)
    (out,) = d.outs(o)
    from flydsl._mlir import ir

    offs = [ir.IntegerAttr(x).value for x in ir.ArrayAttr(o.attributes["offsets"])]
    strides = [ir.IntegerAttr(x).value for x in ir.ArrayAttr(o.attributes["strides"])]
    ss = _ti(o.operands[0]).vshape
    vr = len(_ti(o.results[0]).vshape)
    lead = vr - len(ss)
    sl = tuple(slice(of, of + 1) if i < lead else slice(of, of + ss[i - lead] * st, st)
               for i, (of, st) in enumerate(zip(offs, [1] * lead + strides)))

    def f(ex):
        v, x = ex.R[a], ex.R[b]
        n = [t.shape[0] for t, r in ((v, len(ss)), (x, vr)) if t.dim() > r]
        y = x.expand(*n[:1], *x.shape[x.dim() - vr:]).clone()
        y[(Ellipsis,) + sl] = v.reshape(*v.shape[: v.dim() - len(ss)], *y[(Ellipsis,) + sl].shape[-vr:])
        ex.R[out] = y

    return f


_RED = {
    "add": lambda x: x.sum(-1, dtype=x.dtype), "mul": lambda x: x.prod(-1, dtype=x.dtype),
    "maximumf": lambda x: x.amax(-1), "minimumf": lambda x: x.amin(-1),
    "maxnumf": lambda x: x.amax(-1), "minnumf": lambda x: x.amin(-1),
    "maxsi": lambda x: x.amax(-1), "minsi": lambda x: x.amin(-1),
    "and": lambda x: x.bitwise_and_reduce(-1) if hasattr(x, "bitwise_and_reduce") else x.all(-1),
    "or": lambda x: x.any(-1), "xor": lambda x: x.sum(-1) % 2,
}
_COMB = {"add": torch.add, "mul": torch.mul, "maximumf": torch.maximum, "minimumf": torch.minimum,
         "maxnumf": torch.fmax, "minnumf": torch.fmin, "maxsi": torch.maximum, "minsi": torch.minimum}


@op("vector.reduction")
def _reduction(d, o):
    ins = d.ins(o)
    (out,) = d.outs(o)
    kind = str(o.attributes["kind"]).split("<")[-1].rstrip(">").strip()
    red, comb = _RED[kind], _COMB.get(kind)

    def f(ex):
        x = ex.R[ins[0]]
        if kind == "add" and x.dtype.is_floating_point:
            # sequential order, as LLVM's ordered reduction would do
            r = x[..., 0]
            for i in range(1, x.shape[-1]):
                r = r + x[..., i]
        else:
            r = red(x)
        if len(ins) > 1:
            r = comb(ex.R[ins[1]], r)
        ex.R[out] = r

    return f
