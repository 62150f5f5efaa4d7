"""128-bit C stores for the GEMM epilogue, through LDS.

After the MFMAs a lane holds C[q*4 + i, l16] (i = 0..3) of each 16x16 block: four rows of one
column, so a direct store is one 2- or 4-byte element per lane (buffer_store_short / _dword),
16 lanes covering 32-64 contiguous bytes of a row. FlyDSL's gfx950 GEMM instead stages C in LDS
and writes whole 16-byte pieces of rows; this module does the same for our layout:

  1. each wave owns a private LDS region of 16 rows x (its columns + 4) fp32 (the +4 dwords keep
     rows 16-byte aligned and break the row-to-bank aliasing); the A stages are free by then
     (the caller puts a barrier between the last K step and the first store);
  2. per 16-row block mr, the wave writes its epilogue values y = act(scale * acc + bias) in
     fp32 (one ds_write_b32 per element), then reads back 16-byte pieces of rows: lane c takes
     row c // (cols / VEC), columns VEC * (c % (cols / VEC)) .. + VEC, VEC = 16 B / out size
     (8 for bf16/fp16, 4 for fp32); LDS traffic of one wave is ordered, so no barrier is needed;
  3. the residual (if any) is loaded the same 16 bytes at a time, added in fp32, the row piece
     is cast once to the output dtype and written with one buffer_store_dwordx4.

The arithmetic (fp32 epilogue, one cast after the residual) is the scalar path's, so results
are bit-identical to it. Used when N % VEC == 0 (every row piece lies inside a row and is
16-byte aligned); the kernel keeps the scalar stores otherwise, and for the gated epilogue.
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl._mlir.dialects import arith, vector
from flydsl.expr import range_constexpr, rocdl
from flydsl.expr.typing import T

from translator_kernels.gemm.common import OOB, _raw, _v4f32, _v4i32

PAD_DW = 4  # dwords of padding per staged row


def vec_of(osz: int) -> int:
    return 16 // osz


def region_dw(n_per_wave: int) -> int:
    """LDS dwords one wave stages (16 rows)."""
    return 16 * (n_per_wave + PAD_DW)


def store_rows_vec(y_of, lds_ptr, region, lane, m_rep, n_rep, n_per_wave, row0, col0, m, n, c_base, rc, rr, out_t,
                   osz):
    """Steps 2-3 of the module docstring for one wave. y_of(mr, nr): the fp32 vector<4> of block
    (mr, nr) after scale, bias and the activation; region: the wave's first LDS dword; rc / rr:
    buffer descriptors of C and the residual (None without one); row0 / col0: the wave's first
    row and column of C."""
    vec = vec_of(osz)
    rs = n_per_wave + PAD_DW
    cpr = n_per_wave // vec  # 16-byte pieces per staged row
    pieces = 16 * cpr
    zero = _raw(fx.Int32(0))
    l16, q = lane % 16, lane // 16
    vty = T.vec(vec, out_t.ir_type)
    for mr in range_constexpr(m_rep):
        for nr in range_constexpr(n_rep):
            yv = y_of(mr, nr)
            for i in range_constexpr(4):
                p = fx.add_offset(lds_ptr, _raw(region + (q * 4 + i) * rs + nr * 16 + l16))
                fx.ptr_store(arith.bitcast(T.i32, _raw(yv[i])), p)
        for t in range_constexpr(-(-pieces // 64)):
            c = lane + 64 * t
            cl = c % pieces if pieces % 64 else c  # lanes past the last piece re-read one (stores masked)
            rl, cg = cl // cpr, cl % cpr
            parts = []
            for h in range_constexpr(vec // 4):
                p = fx.add_offset(lds_ptr, _raw(region + rl * rs + cg * vec + h * 4))
                parts.append(vector.bitcast(_v4f32(), fx.ptr_load(p, _v4i32())))
            y = fx.Vector(parts[0] if vec == 4 else vector.shuffle(parts[0], parts[1], list(range(8))))
            row, col = row0 + mr * 16 + rl, col0 + cg * vec
            ok = (row < m) & (col < n)
            if pieces % 64:
                ok = ok & (c < pieces)
            off = _raw(ok.select((c_base + row * n + col) * osz, fx.Int32(OOB)))
            if rr is not None:
                y = y + fx.Vector(rocdl.raw_ptr_buffer_load(vty, rr, off, zero)).to(fx.Float32)
            rocdl.raw_ptr_buffer_store(vector.bitcast(_v4i32(), _raw(y.to(out_t))), rc, off, zero)
