"""Per-row fp8 output, the device pieces shared by the kernels that quantize what they produce
(the row norms with `quant=`, gemm/quantize.py's standalone kernel).

For a row y (fp32 in registers) and a format of the arch (fmt "fp8" = e4m3, "bf8" = e5m2; fnuz on
gfx942, OCP on gfx950, the formats the fp8 GEMM's MFMA reads):

    s = max(max_j |y_j| / FMAX, 1e-12)      q_j = fp8(clamp(y_j / s, -FMAX, FMAX))

with an fp32 divide (not a multiply by 1 / s) and round-to-nearest-even packing by
v_cvt_pk_{fp8,bf8}_f32, four values per 32-bit word: the numbers of
translator_kernels.gemm.fp8.quantize_fp8(y, dtype, dim=-1) bit for bit. q is stored as bytes at
byte offsets through a raw buffer resource (so a lane's VEC values go out as VEC / 4 words), and
stores a lane must not make go to an out-of-range offset, which the buffer drops.
"""

from __future__ import annotations

import torch

import flydsl.expr as fx
from flydsl.expr import range_constexpr, rocdl
from flydsl.expr.typing import T

from translator_kernels.gemm.common import OOB, _raw
from translator_kernels.gemm.fp8 import fp8_dtype

EPS = 1e-12
FORMATS = ("fp8", "bf8")


def fmax(arch: str, fmt: str) -> float:
    """The format's largest finite value on `arch` (e4m3: 240 fnuz / 448 OCP)."""
    return float(torch.finfo(fp8_dtype(arch, fmt)).max)


def cvt(fmt: str):
    return rocdl.cvt_pk_fp8_f32 if fmt == "fp8" else rocdl.cvt_pk_bf8_f32


def fusable(n: int, vec: int, affine: str) -> bool:
    """Whether a row norm can write fp8 itself: the row resident in registers, whole words per lane."""
    from translator_kernels.rows import common as rc

    return affine == "row" and vec >= 4 and n % 4 == 0 and rc.row_fits(rc.row_tiling(n, vec))


def rsrc(t, nbytes):
    return rocdl.get_buffer_rsrc(rocdl.make_buffer_ptr(fx.get_iter(t), num_records_bytes=fx.Int64(nbytes)))


def lane_absmax(v, vec: int):
    m = fx.math.absf(v[0])
    for i in range_constexpr(1, vec):
        m = fx.max(m, fx.math.absf(v[i]))
    return m


def row_scale(amax, fmax_: float):
    return fx.max(amax / fx.Float32(fmax_), fx.Float32(EPS))


def pack(vals, scale, fmax_: float, cvt_):
    """fp32 values (a multiple of 4) -> i32 words of fp8 (value 4w + i in byte i of word w)."""
    hi, lo, zero = fx.Float32(fmax_), fx.Float32(-fmax_), _raw(fx.Int32(0))
    y = [fx.max(fx.min(v / scale, hi), lo) for v in vals]
    words = []
    for w in range_constexpr(len(vals) // 4):
        word = cvt_(T.i32, _raw(y[4 * w]), _raw(y[4 * w + 1]), zero, False)
        words.append(cvt_(T.i32, _raw(y[4 * w + 2]), _raw(y[4 * w + 3]), word, True))
    return words


def store_words(res, words, byte_off, ok=None):
    """Store words at byte offset `byte_off` (dropped where `ok` is false)."""
    data = words[0] if len(words) == 1 else fx.Vector.from_elements([fx.Int32(w) for w in words], fx.Int32)
    off = byte_off if ok is None else ok.select(byte_off, fx.Int32(OOB))
    rocdl.raw_ptr_buffer_store(_raw(data), res, _raw(off), _raw(fx.Int32(0)))


def store_q(Q, nbytes, byte_off, v, scale, vec: int, fmax_: float, cvt_, ok=None):
    """Quantize VEC fp32 values of vector `v` with the row's scale and store them at `byte_off` of Q."""
    store_words(rsrc(Q, nbytes), pack([v[i] for i in range(vec)], scale, fmax_, cvt_), byte_off, ok)


def store_scale(S, m, row, scale, ok):
    off = ok.select(row * 4, fx.Int32(OOB))
    rocdl.raw_ptr_buffer_store(_raw(scale), rsrc(S, m * 4), _raw(off), _raw(fx.Int32(0)))
