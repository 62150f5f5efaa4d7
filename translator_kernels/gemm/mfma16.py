"""One 16x16x32 (M x N x K) MFMA block of the 4-wave GEMM (kernel.py) for fp32 / bf16 / f16 operands,
and how many MFMA instructions a block is on each arch (8-bit float operands: mfma8.py).

A lane's operands are `lph` 16-byte chunks (vector<4xi32>) of A and of W, as kernel.py loads them:
- fp32: 8 x v_mfma_f32_16x16x4_f32 per block (4 per chunk, one K element each);
- bf16 / f16 on gfx942: 2 x v_mfma_f32_16x16x16 (the chunk's two halves of 4 K elements);
- bf16 / f16 on gfx950: 1 x v_mfma_f32_16x16x32 (the whole chunk).
Accumulation is fp32 in every case.
"""

from flydsl._mlir import ir
from flydsl._mlir.dialects import vector
from flydsl.expr import range_constexpr, rocdl
from flydsl.expr.typing import T

from translator_kernels.gemm.common import _v4f32
from translator_kernels.gemm.mfma8 import FORMATS as _F8, mfma8_block, mfma8_per_block


def mfma_per_block(dtype: str, arch: str) -> int:
    """MFMA instructions per 16x16x32 (M x N x K) block (K in the kernel's elements: for fp8 / bf8, 4-byte
    units of 4 values, mfma8.py)."""
    if dtype.split("x")[0] in _F8:
        return mfma8_per_block(arch)
    if dtype == "f32":
        return 8
    return 1 if arch.startswith("gfx950") else 2


def _none_blgp():
    return ir.Attribute.parse("#rocdl<mfma_perm_b none>")


def mfma_block(acc, a_regs, b_regs, dtype: str, fmts, arch: str, lph: int, scales=None):
    """acc += one 16x16x32 block; a_regs / b_regs: lists of `lph` vector<4xi32> chunks; fmts: the 8-bit float
    formats (A, W) or None; scales: MX scale bytes (mxscale.py)."""
    if fmts is not None:
        return mfma8_block(acc, a_regs, b_regs, fmts[0], fmts[-1], arch, scales)
    if dtype == "f32":
        for h in range_constexpr(lph):
            af = vector.bitcast(_v4f32(), a_regs[h])
            bf = vector.bitcast(_v4f32(), b_regs[h])
            for e in range_constexpr(4):
                a_s = vector.extract(af, [], [e])
                b_s = vector.extract(bf, [], [e])
                acc = rocdl.mfma_f32_16x16x4f32_(_v4f32(), a_s, b_s, acc, 0, 0, _none_blgp())
        return acc
    half_t = T.bf16 if dtype == "bf16" else T.f16
    if arch.startswith("gfx950"):
        av = vector.bitcast(T.vec(8, half_t), a_regs[0])
        bv = vector.bitcast(T.vec(8, half_t), b_regs[0])
        op = rocdl.mfma_f32_16x16x32_bf16 if dtype == "bf16" else rocdl.mfma_f32_16x16x32_f16
        return op(_v4f32(), [av, bv, acc])
    lane_t = T.i16 if dtype == "bf16" else T.f16
    av = vector.bitcast(T.vec(8, lane_t), a_regs[0])
    bv = vector.bitcast(T.vec(8, lane_t), b_regs[0])
    op = rocdl.mfma_f32_16x16x16bf16_1k if dtype == "bf16" else rocdl.mfma_f32_16x16x16f16
    for s in range_constexpr(2):
        sel = [4 * s + i for i in range(4)]
        acc = op(_v4f32(), [vector.shuffle(av, av, sel), vector.shuffle(bv, bv, sel), acc])
    return acc
