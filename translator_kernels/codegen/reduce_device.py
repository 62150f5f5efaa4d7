"""Device helpers of the generated row-reduction kernels (translator_kernels.codegen.reduce).

Plain Python over FlyDSL values, inlined while a kernel traces; no dynamic `if` here (the
generated kernel body holds those). A reduction is one of three combines: "sum", "max",
"min" (NaN-propagating, as torch), or an arg-combine that carries (value, index) pairs with
the index as an fp32 number (exact below 2^24; rows are far shorter). The arg-combine is
torch's rule: NaN beats every number, ties go to the smaller index.
"""

from __future__ import annotations

import math

import flydsl.expr as fx
from flydsl.expr import range_constexpr

F32 = fx.Float32
WAVE = 64
IDENTITY = {"sum": 0.0, "max": float("-inf"), "min": float("inf")}


def combine(a, b, op: str):
    if op == "sum":
        return a + b
    return fx.max(a, b) if op == "max" else fx.min(a, b)


def lanes(v, vec: int, op: str):
    """Combine the elements of one vector into a scalar."""
    r = v[0]
    for i in range_constexpr(1, vec):
        r = combine(r, v[i], op)
    return r


def allreduce(x, op: str, width: int):
    """Butterfly over aligned groups of `width` lanes (power of two <= 64); all lanes get the result."""
    for k in range_constexpr(int(math.log2(width))):
        x = combine(x, x.shuffle_xor(width >> (k + 1), WAVE), op)
    return x


def arg_better(a, ia, b, ib, op: str):
    """True where (a, ia) wins over (b, ib) for argmax ("max") / argmin ("min")."""
    a_nan = a != a
    b_num = b == b
    wins = (a > b) if op == "max" else (a < b)
    tie = (a == b) | (a_nan & (b != b))
    return wins | (a_nan & b_num) | (tie & (ia < ib))


def arg_pick(a, ia, b, ib, op: str):
    w = arg_better(a, ia, b, ib, op)
    return w.select(a, b), w.select(ia, ib)


def arg_lanes(v, vec: int, base, op: str):
    """(best value, its index) of one vector whose element 0 sits at index `base` (fp32)."""
    best, bi = v[0], base
    for i in range_constexpr(1, vec):
        best, bi = arg_pick(v[i], base + float(i), best, bi, op)
    return best, bi


def arg_allreduce(x, ix, op: str, width: int):
    for k in range_constexpr(int(math.log2(width))):
        off = width >> (k + 1)
        x, ix = arg_pick(x.shuffle_xor(off, WAVE), ix.shuffle_xor(off, WAVE), x, ix, op)
    return x, ix


def mask(v, ok, vec: int, fill: float):
    """Lanes of a partial tile past the row end take the reduction's identity."""
    return fx.Vector.filled(vec, ok, fx.Boolean).select(v, fx.Vector.filled(vec, fill, F32))


def absf(x):
    return fx.math.absf(x)


def log(x):
    return fx.math.log(x)


def sqrt(x):
    return fx.math.sqrt(x)


def pow_pos(x, c: float):
    """x ** c for x >= 0 (norm finalization): exp(c * log x), 0 ** c = 0 for c > 0."""
    r = fx.math.exp(fx.math.log(x) * c)
    return (x == 0.0).select(x, r)


def store_scalar(tensor, dt: str, x, idx):
    """Store fp32 scalar `x` at element `idx` of a flat tensor of dtype `dt`."""
    from translator_kernels.device_math import store_vec

    store_vec(tensor, dt, 1, fx.Vector.filled(1, x, F32), idx)


def store_index(tensor, ix, idx):
    """Store an fp32-held index as int64 at element `idx` of a flat int64 tensor."""
    atom = fx.make_copy_atom(fx.rocdl.BufferCopy64b(), 64)
    view = fx.logical_divide(fx.rocdl.make_buffer_tensor(tensor), fx.make_layout(1, 1))
    r = fx.make_rmem_tensor(1, fx.Int64)
    fx.memref_store_vec(fx.Vector.filled(1, ix.to(fx.Int64), fx.Int64), r)
    fx.copy(atom, r, fx.slice(view, (None, idx)))
