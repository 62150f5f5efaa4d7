"""128 x 128 block scales (the DeepSeek-V3 layout) inside the GEMM's K loop (kernel.py, fp8 operands).

    y[r, c] = sum_kb  sa[r, kb] * sw[c // 128, kb] * sum_{k in block kb} A_q[r, k] W_q[c, k]

sa: fp32 [M, KB], one scale per row (token) and K block of 128 values; sw: fp32 [ceil(N / 128), KB],
one per 128 x 128 block of W; KB = ceil(K / 128). The scales change along K, so they cannot wait for the
epilogue: each 16x16x128 MFMA block (kernel.py's 32-unit block of fp8, exactly one scale block of K)
runs into a fresh zero accumulator, and the partial sum joins the fp32 accumulator as
acc + partial * (sa * sw) (fp32: the product of the two scales, then the partial times it, then the
add: the reference's order, `ref_gemm_fp8_block`).

The scales of a K tile are loaded with that tile's A and W (one tile ahead, the scheduled loop's
prefetch) and ride in the loop's carried W registers (kernel.py's load_w appends them, compute takes
them off): per K block a lane loads sa of its 4 x m_rep rows and sw of its n_rep columns' N blocks,
one dword each; the per-lane part of the offset is computed once, the K block is a uniform soffset.
Rows >= M read 0 through the descriptor bounds (never stored); K blocks past K (tile padding) read
whatever scale lies there, times an exact-zero partial (A and W are zero past K).

Split-K needs nothing: each split applies its blocks' scales before the partials meet. A per-tensor or
per-row activation scale with block weight scales (a static activation scheme) stays in the epilogue
(a_scale "tensor" / "row"); the K loop then multiplies by sw only.
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl.expr import range_constexpr, rocdl
from flydsl.expr.typing import T

from translator_kernels.gemm.common import OOB, _raw

BLOCK = 128  # fp8 values per scale block, along K and along N
UNITS = BLOCK // 4  # 4-byte units per K block: one MFMA block of kernel.py


def kblocks(k_units: int) -> int:
    """KB: scale blocks along K for K given in 4-byte units."""
    return -(-k_units // UNITS)


class BlockScales:
    """The per-lane offsets into Sa [M, KB] / Sw [NB, KB] and the loads of one K tile's scales."""

    def __init__(self, rsa, rsw, a_block: bool, k_units: int, m, n: int, row0, q, col0, m_rep: int, n_rep: int,
                 k_blk: int, wk):
        kb_total = kblocks(k_units)
        self.rsa, self.rsw, self.a_block, self.k_blk, self.wk = rsa, rsw, a_block, k_blk, wk
        self.a_off = []
        if a_block:
            for mr in range_constexpr(m_rep):
                for i in range_constexpr(4):
                    row = row0 + mr * 16 + q * 4 + i
                    self.a_off.append((row < m).select(row * (kb_total * 4), fx.Int32(OOB)))
        self.w_off = []
        for nr in range_constexpr(n_rep):
            c = col0 + nr * 16
            self.w_off.append((c < n).select((c // BLOCK) * (kb_total * 4), fx.Int32(OOB)))
        self.per_blk = len(self.a_off) + n_rep

    def count(self) -> int:
        """Scalar loads per K tile per lane."""
        return self.per_blk * self.k_blk

    def load(self, kt, bk_units: int) -> list:
        """The scales of K tile kt: for each of this wave's K blocks, sa (rows) then sw (columns)."""
        out = []
        for kb in range_constexpr(self.k_blk):
            soff = _raw((kt * (bk_units // UNITS) + self.wk + kb) * 4)
            for r, offs in ((self.rsa, self.a_off), (self.rsw, self.w_off)):
                for off in offs:
                    out.append(rocdl.raw_ptr_buffer_load(T.f32, r, _raw(off), soff, 0))
        return out

    def apply(self, acc, partial, scales, kb: int, mr: int, nr: int):
        """acc + partial * (sa * sw) for accumulator (mr, nr) of K block kb (fp32, in that order)."""
        base = kb * self.per_blk
        sw = fx.Float32(scales[base + len(self.a_off) + nr])
        if self.a_block:
            s = fx.Vector.from_elements([fx.Float32(scales[base + mr * 4 + i]) * sw for i in range(4)], fx.Float32)
        else:
            s = fx.Vector.filled(4, sw, fx.Float32)
        return _raw(fx.Vector(_raw(acc)) + fx.Vector(_raw(partial)) * s)

