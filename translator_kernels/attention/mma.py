"""Per-lane building blocks of the attention kernel body (fwd.py): MFMA steps, P's conversion to
the 16-bit operand type, exp2 and the cross-lane xor exchange.

They are plain functions of static arguments (dtype, arch flags) called while the kernel is
traced, so they hold no dynamic control flow: everything here becomes straight-line code.
"""

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl.expr import rocdl

from translator_kernels.attention.tiles import AFN, FX_DTYPES


def f32v4():
    return ir.VectorType.get([4], ir.F32Type.get())


def mfma(dtype: str, a, b_, c):
    """One 16x16 MFMA step: fp32 16x16x4 (scalar operands) or 16x16x16 (4-vectors)."""
    if dtype == "f32":
        op = rocdl.mfma_f32_16x16x4f32(f32v4(), fx.Float32(a).ir_value(), fx.Float32(b_).ir_value(),
                                       fx.Vector(c).ir_value(), 0, 0, ir.Attribute.parse("#rocdl<mfma_perm_b none>"))
        return fx.Vector(op.result)
    if dtype == "bf16":
        a16 = fx.Vector(a).bitcast(fx.Int16)
        b16 = fx.Vector(b_).bitcast(fx.Int16)
        return fx.Vector(rocdl.mfma_f32_16x16x16bf16_1k(f32v4(), [a16, b16, c, 0, 0, 0]))
    return fx.Vector(rocdl.mfma_f32_16x16x16f16(f32v4(), [a, b_, c, 0, 0, 0]))


def mfma32(dtype: str, a, b_, c):
    """gfx950 16x16x32 step: lane (g, r) supplies k = 8g .. 8g+7 as an 8-vector."""
    if dtype == "bf16":
        return fx.Vector(rocdl.mfma_f32_16x16x32_bf16(f32v4(), [a, b_, c, 0, 0, 0]))
    return fx.Vector(rocdl.mfma_f32_16x16x32_f16(f32v4(), [a, b_, c, 0, 0, 0]))


def p_to_elem(ps, dtype: str, trunc: bool):
    """4 probabilities (finite, >= 0) -> the MFMA's 16-bit type. gfx942 has no bf16 convert
    instruction and LLVM's round-to-nearest-even with NaN care costs ~4.5 VALU per value;
    keeping the high half of the bits (`trunc`) is one v_perm per 2 values. Its bias (every
    weight rounded down) cancels in O / l because l sums the same rounded p (the ones-tile row
    sum); alone it measured 1.6x the mean error of round-to-nearest. fp16 likewise rounds toward
    zero with v_cvt_pkrtz_f16_f32 (one per 2 values; RTN costs a convert per value + a pack)."""
    pv = fx.Vector.from_elements(ps, fx.Float32)
    if dtype == "f16":  # v_cvt_pkrtz_f16_f32: 2 values, toward zero
        f16x2 = ir.VectorType.get([2], ir.F16Type.get())
        lo = fx.Vector(rocdl.cvt_pkrtz(f16x2, fx.Float32(ps[0]).ir_value(), fx.Float32(ps[1]).ir_value()))
        hi = fx.Vector(rocdl.cvt_pkrtz(f16x2, fx.Float32(ps[2]).ir_value(), fx.Float32(ps[3]).ir_value()))
        return lo.shuffle(hi, [0, 1, 2, 3])
    if not trunc:
        return pv.to(FX_DTYPES[dtype])
    halves = fx.Vector(pv.bitcast(fx.Int16))
    return fx.Vector(halves.shuffle(halves, [1, 3, 5, 7])).bitcast(fx.BFloat16)


def exp2(x):
    """Hardware v_exp_f32 (afn: no device-library call); exp2(-inf) = 0."""
    return fx.math.exp2(x, fastmath=AFN)


def xor_addresses(lane) -> dict:
    """ds_bpermute byte addresses of lane ^ 16 and lane ^ 32 (for lane_xor on gfx950)."""
    return {k: ((lane ^ k) * 4).ir_value() for k in (16, 32)}


def lane_xor(x, k: int, addr=None):
    """x of lane ^ k. With `addr` (xor_addresses) one ds_bpermute on the LDS pipe: gfx950's
    generic shuffle lowering (permlane swaps plus a compare and a select per step) costs ~7 VALU."""
    if addr is None:
        return fx.Float32(fx.gpu.shuffle_xor(x, k, 64))
    bits = rocdl.ds_bpermute(ir.IntegerType.get_signless(32), addr[k], fx.Float32(x).bitcast(fx.Int32).ir_value())
    return fx.Float32(fx.Int32(bits).bitcast(fx.Float32))


def elem(chunks, chunk: int, idx: int):
    """Element idx of a row held as `chunk`-element vectors."""
    return fx.Vector(chunks[idx // chunk])[idx % chunk]


def slice4(chunks, chunk: int, start: int):
    """Elements start .. start + 3 of a row held as `chunk`-element vectors, as one 4-vector."""
    v = fx.Vector(chunks[start // chunk])
    if chunk == 4:
        return v
    o = start % chunk
    return v.shuffle(v, [o, o + 1, o + 2, o + 3])
