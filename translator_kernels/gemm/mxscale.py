"""MX (OCP microscaling) scales inside the GEMM's K loop on gfx950 (kernel.py, w_scale "mx"; host side: mx.py).

    y[r, c] = sum_g 2^(sa[r, g] - 127) * 2^(sw[c, g] - 127) * sum_{k in group g} A_q[r, k] W_q[c, k]

g = k // 32; sa, sw are e8m0 bytes (float8_e8m0fnu: an exponent with bias 127). gfx950's
v_mfma_scale_f32_16x16x128_f8f6f4 applies them itself: lane l of a 16x16x128 block holds the 32 K values
32 (l // 16) .. 32 (l // 16) + 31 of row (A) / column (W) l % 16 and supplies one 32-bit scale register per
operand, of which op_sel picks the byte (0 here: the byte is loaded alone, zero-extended). So each lane's
32 values must be one scale group, contiguous in K:

  - A (LDS): lane (l16, q) reads chunks 2q and 2q + 1 of the block (kernel.py's chunk q and q + 4 for the
    plain fp8 kernel, where any pairing is exact; with scales it is not), `a_chunk_of_lane`;
  - W (translate time, mx.py): K is permuted inside each 128-block so that the ordinary preshuffle puts
    chunks 2q, 2q + 1 where the kernel's W load reads chunks q, q + 4; no kernel change.

Scales: sw is preshuffled (mx.shuffle_scale_mx) to [N_pad / 16, KB, 64] bytes: the 64 lane bytes of one
n-block and K block contiguous, so a lane's per-(nr, K block) load is one buffer_load_ubyte at a per-lane
offset computed once plus a uniform soffset. sa stays as the user's [M, K / 32] (a lane reads
sa[row0 + 16 mr + l16, 4 kb + q]); in the tile that crosses K the groups past K read the descriptor's 0
(2^-127 times an exact-zero product), never the next row's byte (an e8m0 255 is NaN). An activation with a
per-tensor / per-row fp32 scale instead (precision="fp8" with MXFP8 weights) passes the constant 127 (2^0)
as A's MFMA scale and keeps its scale in the epilogue.
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl._mlir.dialects import arith
from flydsl.expr import range_constexpr, rocdl
from flydsl.expr.typing import T

from translator_kernels.gemm.common import OOB, _raw

GROUP = 32  # K values per e8m0 scale
ONE = 127  # e8m0 of 2^0


def checked(a_scale: str, w_scale: str, fmts, w_fp4: bool, arch: str) -> bool:
    """kernel.py's MX switch (w_scale "mx"), after checking what it needs: 'mx' W scales for 'mx' A scales or
    fp4 W, 8-bit float A, gfx950's scaled MFMA."""
    from translator_kernels.errors import KernelInputError

    mx = w_scale == "mx"
    if (a_scale == "mx" and not mx) or (mx and (not fmts or not arch.startswith("gfx950"))) or (w_fp4 and not mx):
        raise KernelInputError(f"gemm: MX scales (a_scale {a_scale!r} / w_scale {w_scale!r}) need 'mx' W scales, "
                               f"8-bit float operands and gfx950's scaled MFMA (arch {arch}); fp4 W needs them")
    return mx


def a_lane(l16, q):
    """(LDS dword offset of a lane's first A chunk in a block, chunk distance to its second): its 32 values are K
    32 q .. 32 q + 31, chunks 2q and 2q + 1 (the plain kernel's are q and q + 4, offset lane * 4, distance 4)."""
    return (2 * q * 16 + l16) * 4, 1


class MxScales:
    """Per-lane offsets into Sa [M, KS] / Sw (preshuffled) and the byte loads of one K tile's scales."""

    def __init__(self, rsa, rsw, a_mx: bool, k_units: int, m, row0, l16, q, lane, nb0, nb_total: int, m_rep: int,
                 n_rep: int, k_blk: int, wk):
        self.ks = k_units * 4 // GROUP  # scale bytes per row of A
        kb_total = -(-self.ks // 4)
        self.rsa, self.rsw, self.a_mx, self.k_blk, self.wk, self.q = rsa, rsw, a_mx, k_blk, wk, q
        self.a_off = []
        if a_mx:
            for mr in range_constexpr(m_rep):
                row = row0 + mr * 16 + l16
                self.a_off.append((row < m).select(row * self.ks + q, fx.Int32(OOB)))
        self.w_off = []
        for nr in range_constexpr(n_rep):
            nb = nb0 + nr
            self.w_off.append((nb < nb_total).select(nb * (kb_total * 64) + lane, fx.Int32(OOB)))
        self.per_blk = len(self.a_off) + n_rep

    def count(self) -> int:
        """Byte loads per K tile per lane."""
        return self.per_blk * self.k_blk

    def load(self, kt, bk_units: int, k_tail: bool = False) -> list:
        """The scale bytes (as i32) of tile kt: per K block of this wave, sa of each mr, then sw of each nr."""
        out = []
        for kb in range_constexpr(self.k_blk):
            blk = kt * (bk_units // 32) + self.wk + kb
            for off in self.a_off:
                voff = off
                if k_tail:  # groups past K read 0, not the next row's scales
                    voff = (blk * 4 + self.q < self.ks).select(off, fx.Int32(OOB))
                out.append(_byte(self.rsa, voff, blk * 4))
            for off in self.w_off:
                out.append(_byte(self.rsw, off, blk * 64))
        return out

    def pick(self, scales, kb: int, mr: int, nr: int):
        """(A's, W's) scale register for MFMA block (kb, mr, nr); A's is the constant 2^0 without MX A."""
        base = kb * self.per_blk
        sa = scales[base + mr] if self.a_mx else _raw(fx.Int32(ONE))
        return sa, scales[base + len(self.a_off) + nr]


def _byte(r, voff, soff):
    b = rocdl.raw_ptr_buffer_load(T.i8, r, _raw(voff), _raw(soff), 0)
    return arith.extui(T.i32, b)
