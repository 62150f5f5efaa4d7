"""The int4 weight's device side (kernel.py, w_int4 = G; the host side and the design note: w4.py): the group
scales s, b a lane loads with each K tile, and the unpack + dequantization of one chunk of 8 codes. Kept apart from
w4.py so that kernel.py imports no host entry point (which imports the gemm package back)."""

from __future__ import annotations

import flydsl.expr as fx
from flydsl._mlir.dialects import arith, vector
from flydsl.expr import range_constexpr, rocdl
from flydsl.expr.typing import T

from translator_kernels.gemm.common import OOB, _raw

GROUPS = (32, 64, 128)


class GroupScales:
    """s and b of a lane's columns for each K block of a tile: per-lane offsets once, the group a uniform soffset."""

    def __init__(self, rs, rb, n: int, group: int, col0, n_rep: int, k_blk: int, wk):
        self.rs, self.rb, self.n, self.group, self.k_blk, self.wk, self.n_rep = rs, rb, n, group, k_blk, wk, n_rep
        self.off = []
        for nr in range_constexpr(n_rep):
            c = col0 + nr * 16
            self.off.append((c < n).select(c * 4, fx.Int32(OOB)))

    def count(self) -> int:
        return 2 * self.n_rep * self.k_blk

    def load(self, kt, bk: int) -> list:
        """For each of this wave's K blocks (32 values) of tile kt: s then b of each column block."""
        out = []
        for kb in range_constexpr(self.k_blk):
            soff = _raw(((kt * bk + (self.wk + kb) * 32) // self.group) * (self.n * 4))
            for r in (self.rs, self.rb):
                for off in self.off:
                    out.append(rocdl.raw_ptr_buffer_load(T.f32, r, _raw(off), soff, 0))
        return out

    def pick(self, scales, kb: int, nr: int):
        base = kb * 2 * self.n_rep
        return scales[base + nr], scales[base + self.n_rep + nr]


def w4_to_chunk(raw, s, b, dtype: str):
    """8 packed codes (one i32) -> q * s + b in `dtype` (bf16 / fp16) as the lane's vector<4xi32> chunk."""
    v = vector.broadcast(T.vec(8, T.i32), raw)
    shifts = vector.from_elements(T.vec(8, T.i32), [_raw(fx.Int32(4 * j)) for j in range(8)])
    codes = arith.andi(arith.shrui(v, shifts), vector.broadcast(T.vec(8, T.i32), _raw(fx.Int32(15))))
    f = fx.Vector(arith.uitofp(T.vec(8, T.f32), codes))
    w = f * fx.Vector.filled(8, fx.Float32(s), fx.Float32) + fx.Vector.filled(8, fx.Float32(b), fx.Float32)
    h = arith.truncf(T.vec(8, T.bf16 if dtype == "bf16" else T.f16), _raw(w))
    return vector.bitcast(T.vec(4, T.i32), h)
