"""Softmax and log-softmax over the last dimension of a 2-D tensor.

One workgroup per row, or for short rows several rows per wave (see row_common's tiling). Numerically stable three-step form,
all from registers: m = max(x); e = exp2((x - m) * log2e), s = sum(e); out = e / s, or for
log-softmax out = (x - m) - ln(s). Statistics are fp32 whatever the input dtype. A row of all
-inf gives m = -inf, x - m = NaN, hence NaN, as torch does. Out-of-row lanes of a partial tile
take -inf for the max and 0 for the sum. No fast-math flags that assume finite values.
Rows longer than 64K elements stream instead: pass 1 keeps a per-thread running max and a sum
rescaled whenever the max grows (online softmax), pass 2 re-reads x and writes.
"""


import torch

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import const_expr, gpu, range_constexpr

from translator_kernels import launch as kl
from translator_kernels import replay as kr
from translator_kernels.rows import common as rc

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
AFN = fx.arith.FastMathFlags.afn  # exp2 -> hardware v_exp_f32; keeps inf/NaN semantics


@kl.builder
def build_softmax(n: int, dtype_str: str, vec: int, log: bool, arch: str):
    """Compiled launcher `launch(x, out, m)` for rows of length `n` (arch keys the cache)."""
    tiling = rc.row_tiling(n, vec)
    STREAM = not rc.row_fits(tiling)
    if STREAM:  # too long for registers: two streaming passes (online max/sum, then write)
        tiling = rc.stream_tiling(n, vec)
    U = rc.STREAM_VECS_PER_THREAD
    NCH = -(-tiling.nv // (tiling.block * U))  # chunks of BLOCK * U vectors
    BLOCK, NT, NV, VEC, W = tiling.block, tiling.nt, tiling.nv, tiling.vec, tiling.waves
    SUB, LPR, RPB = tiling.sub, tiling.lpr, tiling.rows_per_block
    if SUB:
        W = 1  # rows live inside one wave: no LDS
    PARTIAL = tiling.partial
    ebits = rc.elem_bits(dtype_str)

    @fx.struct
    class Scratch:
        red_max: fx.Array[fx.Float32, W, 16]
        red_sum: fx.Array[fx.Float32, W, 16]

    kwargs = {"known_block_size": [BLOCK, 1, 1]} if BLOCK > 256 else {}

    @flyc.kernel(**kwargs)
    def softmax_kernel(X: fx.Tensor, Out: fx.Tensor, M: fx.Int32):
        tid = fx.thread_idx.x
        if const_expr(SUB):
            # RPB rows per workgroup, LPR lanes each; rows past M re-read row M - 1, store nothing
            lane = tid % LPR
            row_raw = fx.Int32(fx.block_idx.x) * RPB + tid // LPR
            row_ok = row_raw < M
            row = row_ok.select(row_raw, M - 1)
        else:
            lane = tid
            row = fx.block_idx.x
        edt = rc.elem_type(dtype_str)
        atom = rc.copy_atom(VEC * ebits, ebits)
        xv = rc.row_view(X, row, VEC)
        ov = rc.row_view(Out, row, VEC)

        def block_allreduce(val, op, slots):
            if const_expr(SUB):
                return rc.wave_allreduce(val, op, LPR)
            w = rc.wave_allreduce(val, op)
            if const_expr(W == 1):
                return w
            wave_lane = tid % rc.WAVE
            wave = tid // rc.WAVE
            if wave_lane == 0:
                fx.memref_store(w, slots, wave)
            gpu.barrier()
            r = fx.memref_load(slots, 0)
            for i in range_constexpr(1, W):
                v = fx.memref_load(slots, i)
                r = fx.max(r, v) if op == "max" else r + v
            return r

        lds = fx.SharedAllocator().allocate(Scratch).peek()
        s_max = lds.red_max.view(fx.make_layout(W, 1))
        s_sum = lds.red_sum.view(fx.make_layout(W, 1))

        neg_inf = fx.Float32(float("-inf"))
        zero = fx.Float32(0.0)

        def resident():
            xs = []
            valid = []
            tmax = None
            for t in range_constexpr(NT):
                idx = lane + t * LPR
                if const_expr(PARTIAL and t == NT - 1):
                    ok = idx < NV
                    idx_safe = ok.select(idx, 0)
                    x = rc.load_vec(atom, VEC, edt, xv, idx_safe).to(fx.Float32)
                    x = fx.Vector.filled(VEC, ok, fx.Boolean).select(x, neg_inf)
                    valid.append(ok)
                else:
                    x = rc.load_vec(atom, VEC, edt, xv, idx).to(fx.Float32)
                    valid.append(None)
                xs.append(x)
                tmax = x if t == 0 else fx.max(tmax, x)
            rmax = block_allreduce(rc.lane_max(tmax, VEC), "max", s_max)

            tsum = None
            es = []
            for t in range_constexpr(NT):
                # masked lanes hold -inf: exp2(-inf) = 0 unless the whole row is -inf (then NaN,
                # which only reaches lanes that are never stored)
                d = xs[t] - rmax
                e = fx.math.exp2(d * LOG2E, fastmath=AFN)
                if const_expr(valid[t] is not None):
                    e = fx.Vector.filled(VEC, valid[t], fx.Boolean).select(e, zero)
                es.append(e)
                if const_expr(log):
                    xs[t] = d
                tsum = e if t == 0 else tsum + e
            rsum = block_allreduce(rc.lane_sum(tsum, VEC), "sum", s_sum)

            if const_expr(log):
                # rocdl.log is v_log_f32 (log2); math.log2 would need the ocml device library
                shift = fx.Float32(fx.rocdl.log(fx.Float32.ir_type, fx.Float32(rsum).ir_value())) * LN2
            else:
                inv = 1.0 / rsum
            for t in range_constexpr(NT):
                idx = lane + t * LPR
                y = xs[t] - shift if const_expr(log) else es[t] * inv
                y = y.to(edt) if const_expr(dtype_str != "f32") else y
                if const_expr(SUB):
                    if row_ok:
                        store(y, idx, valid[t])
                else:
                    store(y, idx, valid[t])

        def store(y, idx, ok):
            if const_expr(ok is not None):
                if idx < NV:
                    rc.store_vec(atom, VEC, edt, y, ov, idx)
            else:
                rc.store_vec(atom, VEC, edt, y, ov, idx)

        def streamed():
            # pass 1: per-thread online max / rescaled sum over chunks of U vectors
            m = neg_inf
            acc = zero
            for c in range(fx.Int32(0), fx.Int32(NCH), fx.Int32(1)):
                cm = neg_inf
                xs = []
                oks = []
                for u in range_constexpr(U):
                    idx = tid + (c * U + u) * BLOCK
                    ok = idx < NV
                    x = rc.load_vec(atom, VEC, edt, xv, ok.select(idx, 0)).to(fx.Float32)
                    x = fx.Vector.filled(VEC, ok, fx.Boolean).select(x, neg_inf)
                    xs.append(x)
                    cm = fx.max(cm, rc.lane_max(x, VEC))
                m_new = fx.max(m, cm)
                # exp2 of -inf - -inf would be NaN: a thread that has seen only -inf keeps 0
                safe = (m_new == neg_inf).select(zero, m_new)
                acc = acc * fx.math.exp2((m - safe) * LOG2E, fastmath=AFN)
                for u in range_constexpr(U):
                    acc = acc + rc.lane_sum(fx.math.exp2((xs[u] - safe) * LOG2E, fastmath=AFN), VEC)
                m = m_new
            rmax = block_allreduce(m, "max", s_max)
            safe_r = (rmax == neg_inf).select(zero, rmax)
            mine = acc * fx.math.exp2((m - safe_r) * LOG2E, fastmath=AFN)
            rsum = block_allreduce(mine, "sum", s_sum)  # 0 for an all -inf row -> NaN below
            if const_expr(log):
                shift = rmax + fx.Float32(fx.rocdl.log(fx.Float32.ir_type, fx.Float32(rsum).ir_value())) * LN2
            else:
                inv = 1.0 / rsum
            # pass 2: re-read, normalize, store
            for c in range(fx.Int32(0), fx.Int32(NCH), fx.Int32(1)):
                for u in range_constexpr(U):
                    idx = tid + (c * U + u) * BLOCK
                    ok = idx < NV
                    x = rc.load_vec(atom, VEC, edt, xv, ok.select(idx, 0)).to(fx.Float32)
                    if const_expr(log):
                        y = x - shift
                    else:
                        y = fx.math.exp2((x - rmax) * LOG2E, fastmath=AFN) * inv
                    y = y.to(edt) if const_expr(dtype_str != "f32") else y
                    if ok:
                        rc.store_vec(atom, VEC, edt, y, ov, idx)

        if const_expr(STREAM):
            streamed()
        else:
            resident()

    @flyc.jit
    def launch(X: fx.Tensor, Out: fx.Tensor, m: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        softmax_kernel(X, Out, m).launch(grid=((m + RPB - 1) // RPB, 1, 1), block=(BLOCK, 1, 1), stream=stream)

    return launch


@kr.replayed
def softmax(x: torch.Tensor, *, log: bool = False) -> torch.Tensor:
    """softmax(x, dim=-1) (or log_softmax) of a 2-D tensor, as a new contiguous tensor."""
    op = "log_softmax" if log else "softmax"
    rc.check_rows(op, x)
    if x.stride(-1) != 1:
        x = x.contiguous()
    m, n = x.shape
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    vec = rc.pick_vec(n, x.dtype, x, out)
    launch = build_softmax(n, rc.DTYPES[x.dtype], vec, bool(log), rc.current_arch())
    rc.launch(launch, x, out, m)
    return out
