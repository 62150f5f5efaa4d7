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


def epilogue_scales(rsw, rsa, w_scale: str, a_scale: str, col0, row0, q, m, n, m_rep: int, n_rep: int):
    """The epilogue's scales for one lane (kernel.py's a_scale / w_scale): sw[nr] (column col0 + 16 nr, or
    the one value) and sa[mr] = the 4 values of rows row0 + 16 mr + 4 q + i; None where not asked.
    rsw / rsa: buffer descriptors of Sw / Sa. Columns / rows past N / M read 0 (never stored)."""
    from flydsl.expr import range_constexpr, rocdl

    zero = _raw(fx.Int32(0))
    sw_v, sa_v = [None] * n_rep, [None] * m_rep
    if w_scale:
        for nr in range_constexpr(n_rep):
            c = col0 + nr * 16
            off = (c < n).select(c * 4, fx.Int32(OOB)) if w_scale == "col" else fx.Int32(0)
            sw_v[nr] = fx.Float32(rocdl.raw_ptr_buffer_load(T.f32, rsw, _raw(off), zero))
    if a_scale:
        for mr in range_constexpr(m_rep):
            vals = []
            for i in range_constexpr(4):
                row = row0 + mr * 16 + q * 4 + i
                off = (row < m).select(row * 4, fx.Int32(OOB)) if a_scale == "row" else fx.Int32(0)
                vals.append(fx.Float32(rocdl.raw_ptr_buffer_load(T.f32, rsa, _raw(off), zero)))
            sa_v[mr] = vals
    return sw_v, sa_v


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
