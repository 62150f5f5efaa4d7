"""Constants and small trace-time helpers shared by the GEMM kernel (kernel.py) and its device
helpers (splitk.py: split-K and wave-part sums; cstore.py: 128-bit C stores), so that those
modules import this one instead of each other."""

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl.expr import const_expr
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


def gemm_launcher(kernel, bm: int, grid_y: int, threads: int, scales: str | None = None):
    """The @flyc.jit launcher both GEMM kernels share (kernel.py, wide.py): grid (M tiles, grid_y, batch).

    scales: None (wide.py: the kernel takes the 17 common arguments); "none" (kernel.py without
    epilogue scales: the kernel's Sa / Sw parameters get the Bias placeholder, never read);
    "take" (kernel.py with row / column scales, fp8.py: the launcher takes Sa, Sw after cnt_bytes)."""
    grid = lambda m, batch: ((m + (bm - 1)) // bm, grid_y, batch)  # noqa: E731

    if scales == "take":
        @flyc.jit
        def launch_scaled(C: fx.Tensor, A: fx.Tensor, W: fx.Tensor, Bias: fx.Tensor, Res: fx.Tensor, P: fx.Tensor,
                          Cnt: fx.Tensor, m: fx.Int32, batch: fx.Int32, a_bs: fx.Int32, w_bs: fx.Int32,
                          c_bs: fx.Int32, scale: fx.Float32, a_bytes: fx.Int32, w_bytes: fx.Int32, c_bytes: fx.Int32,
                          p_bytes: fx.Int32, cnt_bytes: fx.Int32, Sa: fx.Tensor, Sw: fx.Tensor,
                          stream: fx.Stream = fx.Stream(None)):
            kernel(C, A, W, Bias, Res, P, Cnt, m, a_bs, w_bs, c_bs, scale, a_bytes, w_bytes, c_bytes, p_bytes,
                   cnt_bytes, Sa, Sw).launch(grid=grid(m, batch), block=(threads, 1, 1), stream=stream)

        return launch_scaled
    extra = scales == "none"

    @flyc.jit
    def launch(C: fx.Tensor, A: fx.Tensor, W: fx.Tensor, Bias: fx.Tensor, Res: fx.Tensor, P: fx.Tensor,
               Cnt: fx.Tensor, m: fx.Int32, batch: fx.Int32, a_bs: fx.Int32, w_bs: fx.Int32, c_bs: fx.Int32,
               scale: fx.Float32, a_bytes: fx.Int32, w_bytes: fx.Int32, c_bytes: fx.Int32, p_bytes: fx.Int32,
               cnt_bytes: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        if const_expr(extra):
            kernel(C, A, W, Bias, Res, P, Cnt, m, a_bs, w_bs, c_bs, scale, a_bytes, w_bytes, c_bytes, p_bytes,
                   cnt_bytes, Bias, Bias).launch(grid=grid(m, batch), block=(threads, 1, 1), stream=stream)
        else:
            kernel(C, A, W, Bias, Res, P, Cnt, m, a_bs, w_bs, c_bs, scale, a_bytes, w_bytes, c_bytes, p_bytes,
                   cnt_bytes).launch(grid=grid(m, batch), block=(threads, 1, 1), stream=stream)

    return launch
