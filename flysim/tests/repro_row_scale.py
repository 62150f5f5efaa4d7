"""A kernel of ours that reproduces, in a few lines, the per-row scale read of upstream FlyDSL's
preshuffle GEMM epilogue (written for these tests in the same style; no upstream code).

The pattern: a block covers ``TILE_M`` rows of an M x N result; lane l handles column l % 16
and the 4 rows ``bx_m + (l // 16) * 4 + (0..3)``, whose per-row scales it reads as one vec4
(a 16-byte ``BufferCopy128b``) from a buffer tensor of ``scale`` viewed in groups of 4.
X is read and Out written through descriptors bounded to M rows, so rows >= M read 0 and
their stores are dropped. The scale descriptor is the point:

- ``bounded=False``: ``make_buffer_tensor(scale, max_size=True)``: num_records 0xFFFFFFFF, so
  the last block's vec4 reads go past the M floats of ``scale`` (raw memory; flysim raises
  OutOfBoundsError, a GPU reads whatever lies there);
- ``bounded=True``: ``make_buffer_tensor(scale, max_size=False)``: num_records = 4 M (the
  tensor's own extent), so the dwords past row M read 0; the dword range check is per
  component, so the vec4 that straddles row M still returns its in-range rows.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import rocdl
from flydsl.expr import gpu
from flydsl.expr.typing import Vector as Vec

WAVE = 64
TILE_M = 16
N = 16


def build_row_scale(bounded):
    """Out[r, c] = X[r, c] * scale[r] for an M x 16 fp32 X; grid = ceil(M / 16) blocks of 64 lanes."""

    def rsrc(t, nbytes):
        return fx.rocdl.get_buffer_rsrc(fx.get_iter(fx.rocdl.make_buffer_tensor(t, num_records_bytes=nbytes)))

    @flyc.kernel(known_block_size=[WAVE, 1, 1])
    def row_scale_kernel(X: fx.Tensor, Scale: fx.Tensor, Out: fx.Tensor, m: fx.Int32):
        lane = fx.Int32(gpu.thread_idx.x)
        bx_m = fx.Int32(gpu.block_idx.x) * fx.Int32(TILE_M)
        col = lane % fx.Int32(16)
        first_row = bx_m + (lane // fx.Int32(16)) * fx.Int32(4)

        scale_buf = fx.logical_divide(fx.rocdl.make_buffer_tensor(Scale, max_size=not bounded), fx.make_layout(4, 1))
        vec4 = fx.make_copy_atom(fx.rocdl.BufferCopy128b(), fx.Float32)
        s = fx.make_rmem_tensor(4, fx.Float32)
        fx.copy(vec4, scale_buf[None, fx.Int32(first_row // fx.Int32(4))], s)
        s4 = Vec(s.load())

        extent = fx.Int64(m) * fx.Int64(N * 4)  # X and Out: M rows, bounded
        x_rs, out_rs = rsrc(X, extent), rsrc(Out, extent)
        f32 = ir.F32Type.get()
        zero = fx.Int32(0).ir_value()
        for ii in range(4):
            off = ((first_row + fx.Int32(ii)) * fx.Int32(N) + col) * fx.Int32(4)
            x = fx.Float32(rocdl.raw_ptr_buffer_load(f32, x_rs, off.ir_value(), zero))
            y = x * fx.Float32(s4[ii])
            rocdl.raw_ptr_buffer_store(y.ir_value(), out_rs, off.ir_value(), zero)

    @flyc.jit
    def row_scale(X: fx.Tensor, Scale: fx.Tensor, Out: fx.Tensor, m: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        blocks = (m + TILE_M - 1) // TILE_M
        row_scale_kernel(X, Scale, Out, m).launch(grid=(blocks, 1, 1), block=(WAVE, 1, 1), stream=stream)

    return row_scale
