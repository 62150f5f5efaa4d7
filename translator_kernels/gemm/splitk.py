"""Split-K for skinny GEMMs (decode, M <= 64): the deterministic reduction of the partial sums.

Why: a decode step's linear (M = 1..64 tokens, N = K = 4096) has M/BM x N/BN = 64 output tiles,
so 64 workgroups stream the weight while most of the GPU's 304 (MI300X) / 256 (MI355X) CUs idle
and few bytes are in flight. Splitting K over `split` workgroups per tile multiplies the grid
(and the bytes in flight) by `split`.

How (two launches, no atomics):
  1. the GEMM kernel (kernel.build_gemm with split > 1): workgroup (x, y + s * N_tiles) sums its
     K_pad / BK / split tiles of K and writes the raw fp32 sums to P[s, b, :, :], a workspace
     [split, batch, M, N] (only rows < M, columns < N);
  2. `build_splitk_reduce`: one thread per VEC consecutive outputs adds P[0], P[1], ...,
     P[split - 1] in that order and applies the GEMM epilogue (scale, bias, program, residual,
     cast) exactly as the single-pass kernel does.
The summation order is fixed by the code, never by timing, so a result is bit-identical from
run to run. It differs from split = 1 only in the fp32 rounding of K's partial sums (within
the tolerance table). Cost: split x M x N x 4 bytes written and read back; the tile heuristic
(translator_kernels.gemm.choose_config) weighs that against the fuller grid.
"""

from __future__ import annotations

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import const_expr, range_constexpr, rocdl
from flydsl.expr.typing import T

from translator_kernels import launch as kl
from translator_kernels.gemm.kernel import _ELEM, OOB, _raw, apply_epilogue_device, canonical_epilogue

THREADS = 256


@kl.builder
def build_splitk_reduce(n: int, split: int, out_dtype: str, activation, has_bias: bool, has_residual: bool):
    """The reduction launcher: launch(Out, P, Bias, Res, total, scale, p_bytes, out_bytes)

    Out / Res: [batch * M, N] in out_dtype; P: fp32 [split, batch * M, N]; total = batch * M * N."""
    activation = canonical_epilogue(activation)  # validates
    osz, out_t = _ELEM[out_dtype]
    vec = 4 if n % 4 == 0 else 1  # VEC outputs of one row per thread (16-byte partial loads)

    @flyc.kernel
    def splitk_reduce(Out: fx.Tensor, P: fx.Tensor, Bias: fx.Tensor, Res: fx.Tensor, total: fx.Int32,
                      scale: fx.Float32, p_bytes: fx.Int32, out_bytes: fx.Int32):
        e0 = (fx.Int32(fx.block_idx.x) * THREADS + fx.Int32(fx.thread_idx.x)) * vec
        ok = e0 < total
        zero = _raw(fx.Int32(0))

        def rsrc(t, nbytes):
            return rocdl.get_buffer_rsrc(rocdl.make_buffer_ptr(fx.get_iter(t), num_records_bytes=fx.Int64(nbytes)))

        rp, ro = rsrc(P, p_bytes), rsrc(Out, out_bytes)
        acc = fx.Vector.filled(vec, 0.0, fx.Float32)
        for s in range_constexpr(split):  # the fixed order that makes the result deterministic
            off = ok.select((total * s + e0) * 4, fx.Int32(OOB))
            acc = acc + fx.Vector(rocdl.raw_ptr_buffer_load(T.vec(vec, T.f32), rp, _raw(off), zero))
        y = acc * fx.Vector.filled(vec, scale, fx.Float32)
        if const_expr(has_bias):
            rb = rsrc(Bias, n * 4)
            b_off = ok.select((e0 % n) * 4, fx.Int32(OOB))
            y = y + fx.Vector(rocdl.raw_ptr_buffer_load(T.vec(vec, T.f32), rb, _raw(b_off), zero))
        y = apply_epilogue_device(y, activation)
        if const_expr(has_residual):
            rr = rsrc(Res, out_bytes)
        for i in range_constexpr(vec):
            o_off = ok.select((e0 + i) * osz, fx.Int32(OOB))
            v = y[i]
            if const_expr(has_residual):
                v = v + out_t(rocdl.raw_ptr_buffer_load(out_t.ir_type, rr, _raw(o_off), zero)).to(fx.Float32)
            rocdl.raw_ptr_buffer_store(_raw(v.to(out_t)), ro, _raw(o_off), zero)

    @flyc.jit
    def launch(Out: fx.Tensor, P: fx.Tensor, Bias: fx.Tensor, Res: fx.Tensor, total: fx.Int32, scale: fx.Float32,
               p_bytes: fx.Int32, out_bytes: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        splitk_reduce(Out, P, Bias, Res, total, scale, p_bytes, out_bytes).launch(
            grid=((total + (THREADS * vec - 1)) // (THREADS * vec), 1, 1), block=(THREADS, 1, 1), stream=stream)

    return launch
