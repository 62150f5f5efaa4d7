"""Split-KV (flash-decoding) combine: the partial results of the KV slices -> the output.

With a short query (decode: Sq = 1) one workgroup per (query block, head, batch) leaves most
CUs idle (B=1, H=32: 32 workgroups for 304 CUs), so the forward kernel can split the keys into
`nsplit` slices of `chunk` keys, one workgroup each, and write per slice and row the running max
m (log2 units), the sum l and the unnormalized fp32 output O (fwd.py, `split=True`). This kernel
merges them, one workgroup of 64 lanes per (row, head, batch), lanes over the head dim:

    M = max_i m_i;  w_i = exp2(m_i - M);  out = sum_i w_i O_i / sum_i w_i l_i   (0 where l = 0)

With attention sinks (one logit per head in every row's denominator) the sink is added here,
once, not per slice: M = max(M, sink), and the denominator gains exp2(sink - M).

The slices are summed in index order by one lane per output element: the result does not
depend on scheduling (deterministic, run to run and across GPUs of one arch).
"""

from __future__ import annotations

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import const_expr, range_constexpr

_FX_DTYPES = {"f32": fx.Float32, "bf16": fx.BFloat16, "f16": fx.Float16}
AFN = fx.arith.FastMathFlags.afn


def make_combine_kernel(dtype: str, head_dim: int, padded_dim: int, sinks: bool = False):
    """@flyc.jit launcher: W [B, H, nsplit, Sq, padded_dim] f32, WML [B, H, nsplit, Sq, 2] -> O."""
    Elem = _FX_DTYPES[dtype]
    DV, D = head_dim, padded_dim
    PER_LANE = -(-DV // 64)

    @flyc.kernel(known_block_size=[64, 1, 1])
    def attention_combine_kernel(W: fx.Tensor, WML: fx.Tensor, O: fx.Tensor, SK: fx.Tensor, sq: fx.Int32, nh: fx.Int32,
                                 nsplit: fx.Int32, o_sb: fx.Int32, o_sh: fx.Int32, o_ss: fx.Int32):
        lane = fx.Int32(fx.thread_idx.x)
        row = fx.Int32(fx.block_idx.x)
        h = fx.Int32(fx.block_idx.y)
        b = fx.Int32(fx.block_idx.z)
        w_ptr = fx.get_iter(fx.rocdl.make_buffer_tensor(W))
        ml_ptr = fx.get_iter(fx.rocdl.make_buffer_tensor(WML))
        o_ptr = fx.get_iter(fx.rocdl.make_buffer_tensor(O))
        first = (b * nh + h) * nsplit  # partial row of slice i: (first + i) * sq + row

        def m_of(i):
            return fx.Float32(fx.ptr_load(ml_ptr + fx.Int64(((first + i) * sq + row) * 2), result_type=fx.Float32))

        neg_inf = fx.Float32(float("-inf"))
        for i_idx, st in range(fx.Index(0), fx.Index(nsplit), fx.Index(1), init=[neg_inf]):
            mx = fx.arith.maximumf(st[0], m_of(fx.Int32(i_idx)))
            res = yield [mx]
        m_all = res[0] if isinstance(res, (list, tuple)) else res  # one carried value comes back bare
        if const_expr(sinks):  # this head's sink logit, log2 units
            sk_ptr = fx.get_iter(fx.rocdl.make_buffer_tensor(SK))
            sink2 = fx.Float32(fx.ptr_load(sk_ptr + fx.Int64(h), result_type=fx.Float32)) * 1.4426950408889634
            m_all = fx.arith.maximumf(m_all, sink2)
        m_use = (m_all == neg_inf).select(fx.Float32(0.0), m_all)
        cols = [lane + 64 * j for j in range_constexpr(PER_LANE)]
        cols_c = [(c < DV).select(c, 0) for c in cols]
        init = [fx.Float32(0.0)] + [fx.Float32(0.0) for _ in range_constexpr(PER_LANE)]
        for i_idx, st in range(fx.Index(0), fx.Index(nsplit), fx.Index(1), init=init):
            prow = (first + fx.Int32(i_idx)) * sq + row
            w = fx.math.exp2(m_of(fx.Int32(i_idx)) - m_use, fastmath=AFN)
            lw = fx.Float32(fx.ptr_load(ml_ptr + fx.Int64(prow * 2 + 1), result_type=fx.Float32))
            acc = [st[1 + j] + w * fx.Float32(fx.ptr_load(w_ptr + fx.Int64(prow * D + cols_c[j]),
                                                          result_type=fx.Float32))
                   for j in range_constexpr(PER_LANE)]
            res = yield [st[0] + w * lw] + acc
        l_all = res[0]
        if const_expr(sinks):
            l_all = l_all + fx.math.exp2(sink2 - m_use, fastmath=AFN)
        inv = (l_all == fx.Float32(0.0)).select(fx.Float32(0.0), fx.Float32(1.0) / l_all)
        for j in range_constexpr(PER_LANE):
            if cols[j] < DV:
                out = fx.Float32(res[1 + j] * inv)
                if const_expr(dtype != "f32"):
                    out = out.to(Elem)
                fx.ptr_store(out, o_ptr + fx.Int64(b * o_sb + h * o_sh + row * o_ss + cols[j]))

    @flyc.jit
    def launch(W: fx.Tensor, WML: fx.Tensor, O: fx.Tensor, SK: fx.Tensor, sq: fx.Int32, nh: fx.Int32, nsplit: fx.Int32,
               o_sb: fx.Int32, o_sh: fx.Int32, o_ss: fx.Int32, nb: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        attention_combine_kernel(W, WML, O, SK, sq, nh, nsplit, o_sb, o_sh, o_ss).launch(
            grid=(sq, nh, nb), block=(64, 1, 1), stream=stream)

    return launch
