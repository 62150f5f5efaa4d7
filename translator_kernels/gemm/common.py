"""Constants and small trace-time helpers shared by the GEMM kernel (kernel.py) and its device
helpers (splitk.py: split-K and wave-part sums; cstore.py: 128-bit C stores), so that those
modules import this one instead of each other."""

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl.expr.typing import T, as_ir_value

WAVES = 4
THREADS = 64 * WAVES
OOB = 0x7FFFFFF0  # byte offset past every descriptor we build (tensors are < 2 GiB)


def _raw(v):
    return v if isinstance(v, ir.Value) else as_ir_value(v)


def _v4i32():
    return T.vec(4, T.i32)


def _v4f32():
    return T.vec(4, T.f32)


def gemm_launcher(kernel, bm: int, grid_y: int, threads: int):
    """The @flyc.jit launcher both GEMM kernels share (kernel.py, wide.py): grid (M tiles, grid_y, batch)."""

    @flyc.jit
    def launch(C: fx.Tensor, A: fx.Tensor, W: fx.Tensor, Bias: fx.Tensor, Res: fx.Tensor, P: fx.Tensor,
               Cnt: fx.Tensor, m: fx.Int32, batch: fx.Int32, a_bs: fx.Int32, w_bs: fx.Int32, c_bs: fx.Int32,
               scale: fx.Float32, a_bytes: fx.Int32, w_bytes: fx.Int32, c_bytes: fx.Int32, p_bytes: fx.Int32,
               cnt_bytes: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        kernel(C, A, W, Bias, Res, P, Cnt, m, a_bs, w_bs, c_bs, scale, a_bytes, w_bytes, c_bytes, p_bytes,
               cnt_bytes).launch(grid=((m + (bm - 1)) // bm, grid_y, batch), block=(threads, 1, 1), stream=stream)

    return launch
