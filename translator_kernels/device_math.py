"""Device math of the per-element op table: vectors of the value kinds in and out (fp32, i1 for bool,
i32, i64; translator_kernels.program says which kind each op computes in).

Each row of translator_kernels.program.OPS names one function here, called as
`fn(*value args, *constants)`. Generated kernels (elementwise, reduce, scan) call them from their
source; the GEMM epilogue calls them through `run` while it traces. Each is plain Python over
`fx.Vector` values, so it inlines into the kernel. Only operations that lower to
AMDGPU instructions without the ocml device library are used (this toolchain has none):
exp / log (llvm.exp / llvm.log, 1-ulp hardware sequences), sqrt (correctly rounded), divide,
min / max (NaN-propagating), trunc / roundeven, fma, select. Everything else is built from those:

- expm1, log1p: Kahan's tricks (u = exp(x); (u - 1) * x / log(u)), accurate near 0.
- tanh: (1 - e) / (1 + e) with e = exp(-2|x|), an odd Taylor polynomial below |x| < 2^-8.
- erf: Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7 absolute), the classic rational form.
- floor / ceil from trunc and a compare.
- sin / cos: Cody-Waite reduction x = k * pi/2 + r, k = roundeven(x * 2/pi), pi/2 split in three
  fp32 parts applied with fma (the first step is exact); degree-7 / degree-8 polynomials (Cephes
  sinf / cosf coefficients) for sin(r) / cos(r) on [-pi/4, pi/4], chosen and negated by k mod 4.
  Measured against fp64: <= 1.6 ulp for |x| <= 1e5, <= 2 ulp to 1e6; past ~4e6 (k beyond 2^21)
  the three-part pi/2 is too short and the error grows without bound (no Payne-Hanek reduction).
  sin(+-0) = +-0; sin / cos of +-inf and NaN are NaN. The hardware v_sin_f32 is not used (flysim
  has no llvm.amdgcn.sin, and its input in revolutions needs the same reduction anyway).
- integers: the add / sub / mul / neg / min / max / compare / select of the op rows work on i32 and
  i64 vectors as they are (arith.addi, cmpi signed, ...): exact, never through fp32. Integer division
  is arith.divsi / remsi (truncating; the backend expands the 64-bit forms) with torch's rounding
  built on top: floor division and remainder step by one / add the divisor where the remainder is
  nonzero and its sign differs from the divisor's. A zero divisor is replaced by 1 and the result by
  0 (MLIR's divsi by 0 is poison; torch raises; the table's reference does the same as the kernel).
  abs is a select (math.absi needs a lowering the pipeline lacks). Casts: float -> int truncates
  toward zero (fptosi), int -> float rounds to nearest (sitofp), int -> int sign-extends or wraps.
- atan: Cephes' reduction to |t| <= tan(pi/8) by 1/x and (x-1)/(x+1), a degree-9 odd polynomial,
  pi/2 and pi/4 added in two fp32 parts; <= 1.25 ulp against fp64 measured on flysim.
"""

from __future__ import annotations

import operator

import flydsl.expr as fx

F32 = fx.Float32
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
INF = float("inf")


def splat(x, n: int, dtype=F32):
    return fx.Vector.filled(n, x, dtype)


def const_like(x, c):
    return fx.Vector.filled_like(x, float(c), F32)


def where(c, a, b):
    return c.select(a, b)


def kind_of(x) -> str:
    """The program kind of a traced vector: "f" (float), "b" (i1), "i" (i32), "l" (i64)."""
    t = x.dtype
    if getattr(t, "is_float", False):
        return "f"
    return {1: "b", 32: "i", 64: "l"}[t.width]


def _is_int(x) -> bool:
    return kind_of(x) in "il"


def to_bool(x):
    return x != (0 if _is_int(x) else 0.0)


def from_bool(b):
    return b.select(1.0, 0.0)


_KIND_T = {"f": F32, "i": fx.Int32, "l": fx.Int64}


def splat_int(c: int, dtype_str: str, n: int):
    """An exact integer constant ("i32" / "i64") splat to `n` lanes."""
    t = {"i32": fx.Int32, "i64": fx.Int64}[dtype_str]
    return fx.Vector.filled(n, t(int(c)), t)


def absf(x):
    if _is_int(x):
        return (x < 0).select(-x, x)
    return fx.math.absf(x)


def neg(x):
    return -x


def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def mul(a, b):
    return a * b


def div(a, b):
    return a / b


def reciprocal(x):
    return 1.0 / x


def maximum(a, b):
    if _is_int(a):
        return (a < b).select(b, a)
    return fx.max(a, b)  # NaN-propagating, as torch


def minimum(a, b):
    if _is_int(a):
        return (b < a).select(b, a)
    return fx.min(a, b)


def _divisor(b):
    """(b with zeros replaced by 1, the zero mask): MLIR's integer division by 0 is poison."""
    z = b == 0
    return z.select(1, b), z


def _divsi(a, b):
    return fx.Vector(fx.arith.divsi(a, b), a.shape, a.dtype)


def _remsi(a, b):
    return fx.Vector(fx.arith.remsi(a, b), a.shape, a.dtype)


def _wrong_sign(r, b):
    """Lanes where a truncating remainder `r` is nonzero and its sign differs from the divisor's."""
    return (r != 0) & ((r < 0) ^ (b < 0))


def div_trunc(a, b):
    if _is_int(a):
        bb, z = _divisor(b)
        return z.select(0, _divsi(a, bb))
    return trunc(a / b)


def div_floor(a, b):
    if _is_int(a):
        bb, z = _divisor(b)
        q = _divsi(a, bb)
        q = _wrong_sign(a - q * bb, bb).select(q - 1, q)
        return z.select(0, q)
    return floor(a / b)


def remainder(a, b):
    """torch.remainder: the result takes the divisor's sign (Python's %)."""
    if _is_int(a):
        bb, z = _divisor(b)
        r = _remsi(a, bb)
        r = _wrong_sign(r, bb).select(r + bb, r)
        return z.select(0, r)
    r = fx.math.fma(-trunc(a / b), b, a)  # fmod, up to the rounding of the quotient (|a / b| < 2**24)
    return ((r != 0.0) & ((r < 0.0) ^ (b < 0.0))).select(r + b, r)


# compares and bitwise / logical ops: the values' own operators (on i1 values & | ^ are the logical ones)
bitwise_and = logical_and = operator.and_
bitwise_or = logical_or = operator.or_
bitwise_xor = logical_xor = operator.xor
eq, ne, lt, le, gt, ge = operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge


def bitwise_not(x):
    return logical_not(x) if kind_of(x) == "b" else ~x


def logical_not(b):
    return from_bool(b) == 0.0


def relu(x):
    return fx.max(x, const_like(x, 0.0))  # maximumf: relu(NaN) = NaN as torch


def clamp(x, lo, hi):
    if lo is not None:
        x = fx.max(x, const_like(x, lo))
    if hi is not None:
        x = fx.min(x, const_like(x, hi))
    return x


def exp(x):
    return fx.math.exp(x)


def exp2(x):
    return fx.math.exp(x * LN2)


def log(x):
    return fx.math.log(x)


def log2(x):
    return fx.math.log(x) * LOG2E


def sqrt(x):
    return fx.math.sqrt(x)


def rsqrt(x):
    return 1.0 / fx.math.sqrt(x)


def expm1(x):
    u = fx.math.exp(x)
    um1 = u - 1.0
    r = um1 * (x / fx.math.log(u))
    r = (u == 1.0).select(x, r)
    r = (um1 == -1.0).select(const_like(x, -1.0), r)
    return (u == INF).select(u, r)


def log1p(x):
    u = x + 1.0
    d = u - 1.0
    r = fx.math.log(u) * (x / d)
    r = (d == 0.0).select(x, r)
    return (u == INF).select(u, r)


def sigmoid(x):
    return 1.0 / (fx.math.exp(-x) + 1.0)


def tanh(x):
    a = fx.math.absf(x)
    e = fx.math.exp(a * -2.0)
    big = (1.0 - e) / (1.0 + e)
    x2 = x * x
    small = x * (1.0 - x2 * (1.0 / 3.0 - x2 * (2.0 / 15.0)))
    r = (x < 0.0).select(-big, big)
    return (a < 0.00390625).select(small, r)


def erf(x):
    a = fx.math.absf(x)
    t = 1.0 / (a * 0.3275911 + 1.0)
    p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    r = 1.0 - p * fx.math.exp(-(a * a))
    return (x < 0.0).select(-r, r)


def gelu(x):
    return x * 0.5 * (erf(x * 0.7071067811865476) + 1.0)


def gelu_tanh(x):
    return x * 0.5 * (tanh((x + x * x * x * 0.044715) * 0.7978845608028654) + 1.0)


def silu(x):
    return x * sigmoid(x)


def softplus(x, beta=1.0, threshold=20.0):
    bx = x * beta
    soft = log1p(fx.math.exp(bx)) * (1.0 / beta)
    return (bx > threshold).select(x, soft)


def mish(x):
    return x * tanh(softplus(x))


def softsign(x):
    return x / (fx.math.absf(x) + 1.0)


def elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    neg = expm1(x * input_scale) * (alpha * scale)
    return (x > 0.0).select(x * scale, neg)


def celu(x, alpha=1.0):
    return (x > 0.0).select(x, expm1(x * (1.0 / alpha)) * alpha)


def leaky_relu(x, slope=0.01):
    return (x > 0.0).select(x, x * slope)


def hardsigmoid(x):
    return clamp(x * (1.0 / 6.0) + 0.5, 0.0, 1.0)


def hardswish(x):
    return x * clamp(x + 3.0, 0.0, 6.0) * (1.0 / 6.0)


def sign(x):
    return (x > 0.0).select(1.0, (x < 0.0).select(-1.0, x * 0.0))  # sign(NaN) = NaN


_PIO2 = (1.5707963705062866, -4.371138828673793e-08, -1.7151245100058819e-15)  # pi/2 = sum, fp32 each
_TWO_OVER_PI = 0.6366197466850281


def _sincos_reduced(x):
    """(k mod 4, sin r, cos r) for x = k * pi/2 + r, |r| <= ~pi/4."""
    k = fx.math.roundeven(x * _TWO_OVER_PI)
    nk = -k
    r = fx.math.fma(nk, const_like(x, _PIO2[0]), x)
    r = fx.math.fma(nk, const_like(x, _PIO2[1]), r)
    r = fx.math.fma(nk, const_like(x, _PIO2[2]), r)
    z = r * r
    ps = (z * -1.9515295891e-4 + 8.3321608736e-3) * z - 1.6666654611e-1
    s = fx.math.fma(r * z, ps, r)
    pc = ((z * 2.443315711809948e-5 - 1.388731625493765e-3) * z + 4.166664568298827e-2) * (z * z)
    c = (pc - z * 0.5) + 1.0
    q = k - floor(k * 0.25) * 4.0  # 0..3, exact while k is an integer in fp32
    return q, s, c


def sin(x):
    q, s, c = _sincos_reduced(x)
    v = ((q == 1.0) | (q == 3.0)).select(c, s)
    v = (q >= 2.0).select(-v, v)
    return (x == 0.0).select(x, v)  # keeps the sign of -0


def cos(x):
    q, s, c = _sincos_reduced(x)
    v = ((q == 1.0) | (q == 3.0)).select(s, c)
    return ((q == 1.0) | (q == 2.0)).select(-v, v)


_ATAN_Y0 = (1.5707963705062866, 0.7853981852531433)  # pi/2, pi/4 rounded to fp32
_ATAN_LO = (-4.371138828673793e-08, -2.1855694143368964e-08)  # what that rounding left out


def atan(x):
    """Cephes atanf: |x| > tan(3pi/8) -> pi/2 + atan(-1/|x|), |x| > tan(pi/8) -> pi/4 + atan((|x|-1)/(|x|+1)),
    then an odd degree-9 polynomial on |t| <= tan(pi/8); the fp32 rounding of pi/2, pi/4 is added back
    before the high part. Against fp64: <= 1.25 ulp on flysim (80k samples, |x| from 1e-30 to 1e30),
    <= 2.03 ulp in an fp32 emulation of this sequence; atan(+-inf) = +-pi/2, atan(-0) = -0, NaN -> NaN."""
    a = fx.math.absf(x)
    big = a > 2.414213562373095
    mid = a > 0.41421356237309503
    t = big.select(-1.0 / a, mid.select((a - 1.0) / (a + 1.0), a))
    zero = const_like(x, 0.0)
    y0 = big.select(const_like(x, _ATAN_Y0[0]), mid.select(const_like(x, _ATAN_Y0[1]), zero))
    lo = big.select(const_like(x, _ATAN_LO[0]), mid.select(const_like(x, _ATAN_LO[1]), zero))
    z = t * t
    p = ((z * 8.05374449538e-2 - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1
    r = y0 + (t + ((t * z) * p + lo))
    r = (x < 0.0).select(-r, r)
    return (x == 0.0).select(x, r)


def trunc(x):
    return fx.math.trunc(x)


def floor(x):
    t = fx.math.trunc(x)
    return (t > x).select(t - 1.0, t)


def ceil(x):
    t = fx.math.trunc(x)
    return (t < x).select(t + 1.0, t)


def round_even(x):
    return fx.math.roundeven(x)


def pow_scalar(x, c: float):
    """x ** c for a compile-time exponent: multiplies for small integers, else exp(c * log x)."""
    if c == 0:
        return const_like(x, 1.0)
    if c == 0.5:
        return fx.math.sqrt(x)
    if c == -0.5:
        return rsqrt(x)
    if float(c).is_integer() and abs(c) <= 16:
        n, base, acc = int(abs(c)), x, None
        while n:
            if n & 1:
                acc = base if acc is None else acc * base
            n >>= 1
            if n:
                base = base * base
        return 1.0 / acc if c < 0 else acc
    mag = fx.math.exp(fx.math.log(fx.math.absf(x)) * c)
    if float(c).is_integer():  # large integer exponent: sign from parity, negative bases allowed
        return (x < 0.0).select(-mag, mag) if int(c) % 2 else mag
    return (x < 0.0).select(const_like(x, float("nan")), mag)


_CAST_KIND = {"f32": "f", "bf16": "f", "f16": "f", "bool": "b", "i32": "i", "i64": "l"}


def cast(x, dtype_str: str):
    """An explicit `.to(dtype)` in the graph: a value of any kind as the kind of `dtype_str`, a float
    rounded to bf16 / f16 and back when that is the dtype; "bool": x != 0."""
    x = as_kind(x, kind_of(x), _CAST_KIND[dtype_str])
    if dtype_str in ("bf16", "f16"):
        t = {"bf16": fx.BFloat16, "f16": fx.Float16}[dtype_str]
        return x.to(t).to(F32)
    return x


def run(prog, xs, width: int, in_dtypes=None) -> list:
    """Every value of program `prog` (translator_kernels.program) on vectors `xs` while a kernel traces
    (the GEMM epilogue's path; generated kernels write the same calls out as source): each op is its
    table row's device function, each argument converted to the kind the op takes."""
    from translator_kernels.program import OPS, signature

    vals = list(xs)
    kinds = prog.kinds(in_dtypes or ["f32"] * prog.n)
    for name, args, params in prog.ops:
        op = OPS[name]
        if name == "const":
            vals.append(splat(float(params[0]), width))
            continue
        if name == "const_int":
            vals.append(splat_int(params[0], params[1], width))
            continue
        wants, _ = signature(name, params, [kinds[i] for i in args])
        a = [as_kind(vals[i], kinds[i], k) for i, k in zip(args, wants)]
        vals.append(globals()[op.device](*a, *params))
    return vals


def as_kind(x, have: str, want: str):
    """A value of kind `have` ("f" fp32, "b" i1, "i" i32, "l" i64) as kind `want`: bool is x != 0 and
    0 / 1; float -> int truncates toward zero, int -> float rounds, int -> int extends or wraps."""
    if have == want:
        return x
    if want == "b":
        return to_bool(x)
    if have == "b":
        return x.select(fx.Vector.filled_like(x, 1, _KIND_T[want]), fx.Vector.filled_like(x, 0, _KIND_T[want]))
    return x.to(_KIND_T[want])


# ---------------------------------------------------------------------------
# memory: 128-bit (or narrower) buffer loads/stores of one vector, single-element loads
# ---------------------------------------------------------------------------

_ELEM = {"f32": fx.Float32, "bf16": fx.BFloat16, "f16": fx.Float16, "bool": fx.Uint8, "i32": fx.Int32,
         "i64": fx.Int64}
_BITS = {"f32": 32, "bf16": 16, "f16": 16, "bool": 8, "i32": 32, "i64": 64}
_COPY = {8: fx.rocdl.BufferCopy8b, 16: fx.rocdl.BufferCopy16b, 32: fx.rocdl.BufferCopy32b,
         64: fx.rocdl.BufferCopy64b, 128: fx.rocdl.BufferCopy128b}


def _access(tensor, dt: str, vec: int):
    bits = _BITS[dt]
    atom = fx.make_copy_atom(_COPY[vec * bits](), bits)
    view = fx.logical_divide(fx.rocdl.make_buffer_tensor(tensor), fx.make_layout(vec, 1))
    return atom, view, _ELEM[dt]


def load_vec(tensor, dt: str, vec: int, idx):
    """Vector `idx` (VEC contiguous elements) of a flat tensor, as fp32 (bool: i1; int32 / int64 as they are)."""
    atom, view, et = _access(tensor, dt, vec)
    r = fx.make_rmem_tensor(vec, et)
    fx.copy(atom, fx.slice(view, (None, idx)), r)
    x = fx.memref_load_vec(r)
    if dt == "bool":
        return x != fx.Vector.filled(vec, 0, fx.Uint8)
    return x if dt in ("f32", "i32", "i64") else x.to(F32)


def load_splat(tensor, dt: str, vec: int, idx):
    """Element `idx` of a flat tensor broadcast to a vector of `vec` lanes."""
    x = load_vec(tensor, dt, 1, idx)
    return fx.Vector.filled(vec, x[0], {"bool": fx.Boolean, "i32": fx.Int32, "i64": fx.Int64}.get(dt, F32))


def store_vec(tensor, dt: str, vec: int, x, idx):
    atom, view, et = _access(tensor, dt, vec)
    if dt == "bool":
        x = x.select(fx.Vector.filled(vec, 1, fx.Uint8), fx.Vector.filled(vec, 0, fx.Uint8))
    elif dt not in ("f32", "i32", "i64"):
        x = x.to(et)
    r = fx.make_rmem_tensor(vec, et)
    fx.memref_store_vec(x, r)
    fx.copy(atom, r, fx.slice(view, (None, idx)))
