"""Device helpers of the generated scan kernels (translator_kernels.codegen.scan).

Plain Python over FlyDSL fp32 scalars, inlined while a kernel traces. A scan combine is one of
"sum", "prod" or "logaddexp" (log(e^a + e^b), for logcumsumexp); all three are associative
and commutative, so the lane / wave / chunk order of the combines only changes rounding.
Shuffles always use the full wave (width 64) and mask invalid sources with a compare, so
the result does not depend on how a backend treats sub-wave widths.
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl.expr import gpu

F32 = fx.Float32
WAVE = 64
IDENTITY = {"sum": 0.0, "prod": 1.0, "logaddexp": float("-inf")}


def combine(a, b, op: str):
    if op == "sum":
        return a + b
    if op == "prod":
        return a * b
    m = fx.max(a, b)  # NaN-propagating
    r = m + fx.math.log(1.0 + fx.math.exp(fx.min(a, b) - m))
    return (fx.math.absf(m) == float("inf")).select(m, r)  # -inf, -inf -> -inf; inf wins


def local_scan(elems, op: str):
    """Inclusive scan of a lane's own elements (a Python list of scalars), in order."""
    out = [elems[0]]
    for e in elems[1:]:
        out.append(combine(out[-1], e, op))
    return out


def up(x, k: int):
    """Lane l reads lane l - k of its wave (lanes below k read themselves: mask them)."""
    return F32(gpu.shuffle_up(x, k, WAVE))


def read_lane(x, src):
    """Every lane reads lane `src` (lane index in the wave, may differ per lane)."""
    return F32(gpu.shuffle_idx(x, src, WAVE))


def lane_scan(x, ls, width: int, op: str):
    """(inclusive, exclusive) scan of `x` over aligned groups of `width` lanes (power of two
    <= 64); `ls` is the lane's index inside its group. Hillis-Steele: log2(width) shuffles."""
    k = 1
    while k < width:
        x = (ls >= k).select(combine(up(x, k), x, op), x)
        k *= 2
    if width == 1:
        return x, F32(IDENTITY[op])
    return x, (ls >= 1).select(up(x, 1), IDENTITY[op])


def mask(v, ok, vec: int, fill: float):
    """Elements of a vector past the row end take the scan's identity."""
    return fx.Vector.filled(vec, ok, fx.Boolean).select(v, fx.Vector.filled(vec, fill, F32))
