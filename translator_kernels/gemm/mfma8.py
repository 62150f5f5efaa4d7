"""The 8-bit float MFMA of the GEMM kernel (kernel.py): one 16x16 block of 128 K values.

fp8 / bf8 operands ride in the kernel's 4-byte units (kernel.py treats them as "4-byte
elements": kpack = 4 units = 16 fp8 values per 16-byte chunk, a 32-unit block = 128 fp8 values
of K, two 16-byte chunks per lane per block, the f32 path's geometry). So the weight layout is the
ordinary preshuffle of the fp8 weight viewed as int32 (fp8.py), the same on both archs.

A lane (row l16, group q) of a block holds chunk q (K values 16 q .. 16 q + 15 of the block) and
chunk q + 4 (64 + 16 q ..). A and W hold the same K values in the same lanes and registers, so any
fixed pairing of register bytes with the MFMA's K index gives the exact dot product (up to the
fp32 summation order):
  - gfx942 (e4m3fnuz / e5m2fnuz): v_mfma_f32_16x16x32_{fp8,bf8}_{fp8,bf8}, 8 values per lane
    (one i64): four per block, one per 8-byte half of each chunk.
  - gfx950 (OCP e4m3fn / e5m2): v_mfma_scale_f32_16x16x128_f8f6f4 with the operand formats in
    cbsz / blgp and constant-zero scales (LLVM then selects the unscaled v_mfma_f32_16x16x128_f8f6f4):
    the two chunks concatenated are the lane's 32 values; one per block, at twice gfx942's K per
    instruction. The MX formats (mxscale.py) pass the lane's e8m0 scales here instead of the zeros.
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl._mlir.dialects import vector
from flydsl.expr import range_constexpr, rocdl
from flydsl.expr.typing import T

from translator_kernels.gemm.common import _raw, _v4f32

FORMATS = ("fp8", "bf8")  # e4m3 / e5m2 (fnuz on gfx942, OCP on gfx950)
_FMT_CODE = {"fp8": 0, "bf8": 1, "fp4": 4}  # the f8f6f4 MFMA's matrix_format codes (fp4: MX weights only, mx.py)


def mfma8_per_block(arch: str) -> int:
    """MFMA instructions per 16x16x128 (fp8 values) block."""
    return 1 if arch.startswith("gfx950") else 4


def mfma8_block(acc, a_regs, b_regs, a_fmt: str, w_fmt: str, arch: str, scales=None):
    """acc += one block; a_regs / b_regs: the lane's two vector<4xi32> chunks (kernel.py's lph = 2).
    scales (gfx950, MX: mxscale.py): the lane's (A, W) e8m0 scale registers (byte 0), else constant zeros."""
    if arch.startswith("gfx950"):
        av = vector.shuffle(a_regs[0], a_regs[1], list(range(8)))
        bv = vector.shuffle(b_regs[0], b_regs[1], list(range(4 if w_fmt == "fp4" else 8)))  # fp4: 2 x 8 bytes
        sa, sb = scales or (_raw(fx.Int32(0)), _raw(fx.Int32(0)))
        return rocdl.mfma_scale_f32_16x16x128_f8f6f4(
            _v4f32(), [av, bv, acc, _FMT_CODE[a_fmt], _FMT_CODE[w_fmt], 0, sa, 0, sb])
    op = rocdl.mfma_f32_16x16x32_fp8_fp8
    if (a_fmt, w_fmt) != ("fp8", "fp8"):  # flydsl wraps fp8_fp8 only; the others come from the dialect
        from flydsl._mlir.dialects import rocdl as _d

        raw = getattr(_d, f"mfma_f32_16x16x32_{a_fmt}_{w_fmt}")

        def op(rt, ops):
            return raw(rt, ops[0], ops[1], ops[2], 0, 0, rocdl._blgp_attr(0)).result
    for h in range_constexpr(2):
        a64 = vector.bitcast(T.vec(2, T.i64), a_regs[h])
        b64 = vector.bitcast(T.vec(2, T.i64), b_regs[h])
        for e in range_constexpr(2):
            acc = op(_v4f32(), [vector.extract(a64, [], [e]), vector.extract(b64, [], [e]), acc])
    return acc


# ---- int8 weights (w8.py): a chunk of kpack int8 values -> the activation's 16-byte chunk ----
def w8_load_type(kp: int):
    """What one lane loads for a chunk of kp int8 weights (8 bytes for bf16 / fp16, 4 for fp32)."""
    return T.vec(kp // 4, T.i32) if kp > 4 else T.i32


def w8_to_chunk(raw, kp: int, dtype: str):
    """kp int8 values (raw load) -> the same values in `dtype` as a vector<4xi32> chunk (exact: |v| <= 128)."""
    from flydsl._mlir.dialects import arith

    v8 = vector.bitcast(T.vec(kp, T.i8), raw if kp > 4 else vector.from_elements(T.vec(1, T.i32), [raw]))
    f = arith.sitofp(T.vec(kp, T.f32), v8)
    if dtype != "f32":
        f = arith.truncf(T.vec(kp, T.bf16 if dtype == "bf16" else T.f16), f)
    return vector.bitcast(T.vec(4, T.i32), f)
