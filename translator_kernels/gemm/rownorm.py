"""RMSNorm folded into the GEMM that reads it: rstd per A row, computed inside the GEMM launch.

    y = RMSNorm(x) · γ              (γ the norm's weight)
    out = y @ Wᵀ                    (a linear, the merged QKV GEMM or the gated gate / up GEMM)
      = rstd(x) ⊙ (x @ (W · diag(γ))ᵀ)   per row, rstd(x) = 1 / sqrt(mean(x²) + eps)

γ is folded into the prepared weight at translate time (translator/lowerings/norm_gemm.py), so the
kernel needs one number per A row, rstd, applied to the fp32 accumulator in the epilogue where
the fp8 path applies its per-row scale sa[row] (kernel.py `build_gemm(..., rownorm=(eps, K))`).

The prologue (`row_rstd`), after tile 0's A is in LDS stage 0 and while tile 0's W loads are in flight
(the two overlap), before the barrier that starts the K loop:
  1. every workgroup reads its BM rows of A over the FULL K, also a split-K workgroup that owns
     one K slice (the slices' partial sums would otherwise need a second reduction across
     workgroups). The rows go in groups of G (G x chunks-per-thread <= IN_FLIGHT = 4 16-byte loads
     per thread; K = 4096 bf16: 2 chunks per thread, G = 2); a group whose first row is >= M is skipped
     (a uniform branch): a decode workgroup (M = 1 in a 16-row tile) reads one row, not 16;
  2. all 256 threads share a row: thread t reads the 16-byte chunks t, t + 256, ... of it (coalesced),
     widens them to fp32 and sums the squares; a butterfly over the wave's 64 lanes, then lane 0 of
     each wave writes its sum to LDS (the second A stage, free until the first K step ends): slot
     row * 4 + wave;
  3. one barrier; each lane reads the 4 wave sums of the rows its accumulators hold (rows
     16 mr + 4 q + i), adds them in wave order and keeps rstd = rsqrt(sum / K + eps) in registers
     (4 x BM/16 VGPRs) for the epilogue. K is the norm's length (A's K before the kpack padding,
     which reads zeros).

Extra cost per workgroup (what the timing MODEL needs): the valid rows of its tile times K x the
element size read once more (A sits in L2 on hardware: the norm's input was just written), one
barrier, and the latency of ceil(rows / G) dependent rounds of loads before the K loop starts (tile
0's W loads overlap the first round). Registers (compiled, gfx942, K = 4096 bf16, M bucket 4 tiles):
QKV 16x16x128 split 2 kw 4 32 -> 54 VGPRs, LM head 16x64x32 30 -> 56 (both still 8 waves per SIMD),
gate + up 16x128x128 90 -> 106 (5 -> 4; its 224-workgroup grid keeps under one per CU anyway); no spills.
Rows with M <= row get rstd from a zero sum (finite), and are never stored.
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import arith, scf, vector
from flydsl.expr import gpu, range_constexpr, rocdl
from flydsl.expr.typing import T

from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.common import OOB, THREADS, WAVES, _raw, _v4f32, _v4i32

MAX_LOADS = 16  # 16-byte loads per thread per row: K x element size <= 64 KiB (Llama-3-70B's 8192 bf16: 4)
IN_FLIGHT = 4  # 16-byte loads per thread issued before their sums are needed (row groups): 8 took the decode tiles
# from 32 to 84 VGPRs (8 -> 5 waves per SIMD); 4 keeps the QKV and LM head tiles at 54 / 56 (8 waves)
AFN = fx.arith.FastMathFlags.afn  # v_rsq_f32, as the row-norm kernels (rows/norm.py)


def loads_per_row(k: int, esz: int) -> int:
    """16-byte loads each of the 256 threads makes for one row of K elements of `esz` bytes."""
    return -(-(k * esz // 16) // THREADS)


def checked(rownorm, fmts, w_layout: str, grouped: bool, wm: int, k: int, esz: int):
    """kernel.py's switch: (eps, norm length) or None, after checking what the prologue takes."""
    if not rownorm:
        return None
    eps, k_norm = rownorm
    if fmts or w_layout != "shuffled" or grouped or wm != 1:
        raise KernelInputError("gemm: rownorm (RMSNorm folded into the GEMM) takes fp32 / bf16 / f16 operands, a "
                               "preshuffled weight, one expert and the 4-wave tile")
    if loads_per_row(k, esz) > MAX_LOADS or not 0 < k_norm <= k:
        raise KernelInputError(f"gemm: rownorm over K={k_norm} (A rows of {k} elements) needs K x {esz} B <= "
                               f"{MAX_LOADS * THREADS * 16} B and 0 < norm length <= K")
    return float(eps), int(k_norm)


def row_rstd(rownorm, ra, a_base, a_row0, m, k: int, dtype: str, bm: int, m_rep: int, tid, lane, wave, q,
             lds_ptr, slot_dw: int):
    """The prologue (module docstring): [m_rep][4] fp32 rstd of rows a_row0 + 16 mr + 4 q + i.
    ra: A's buffer descriptor; a_base: the batch's first element; slot_dw: a free LDS dword offset
    (a multiple of 4) with 4 x bm dwords behind it."""
    eps, k_norm = rownorm
    esz = 4 if dtype == "f32" else 2
    kp = 16 // esz
    cpr = k // kp  # 16-byte chunks per row
    cpt = loads_per_row(k, esz)
    g = 1
    while g * 2 <= 16 and (g * 2) * cpt <= IN_FLIGHT:
        g *= 2  # rows per group: a power of two dividing 16 (so every group lies in one 16-row block)
    zero = _raw(fx.Int32(0))

    def row_sum(row):
        total = None
        for c in range_constexpr(cpt):
            kc = tid + c * THREADS
            ok = row < m
            if cpr % THREADS:
                ok = ok & (kc < cpr)
            off = ok.select((a_base + row * k + kc * kp) * esz, fx.Int32(OOB))
            raw = rocdl.raw_ptr_buffer_load(_v4i32(), ra, _raw(off), zero, 0)
            if dtype == "f32":
                v = fx.Vector(vector.bitcast(_v4f32(), raw))
            else:
                v = fx.Vector(vector.bitcast(T.vec(8, T.bf16 if dtype == "bf16" else T.f16), raw)).to(fx.Float32)
            for e in range_constexpr(kp):
                total = v[e] * v[e] if total is None else total + v[e] * v[e]
        for s in range_constexpr(6):  # butterfly over the wave's 64 lanes
            total = total + total.shuffle_xor(32 >> s, 64)
        return total

    def put(r, val):  # lane 0 of each wave: slot r * 4 + wave
        if_op = scf.IfOp(_raw(lane == 0), has_else=False)
        with ir.InsertionPoint(if_op.then_block):
            fx.ptr_store(arith.bitcast(T.i32, _raw(val)), fx.add_offset(lds_ptr, _raw(slot_dw + r * WAVES + wave)))
            scf.YieldOp([])

    for grp in range_constexpr(bm // g):
        if_op = scf.IfOp(_raw(a_row0 + grp * g < m), has_else=True)
        with ir.InsertionPoint(if_op.then_block):
            sums = [row_sum(a_row0 + grp * g + j) for j in range(g)]
            for j in range_constexpr(g):
                put(grp * g + j, sums[j])
            scf.YieldOp([])
        with ir.InsertionPoint(if_op.else_block):  # rows past M: a zero sum (finite rstd, never stored)
            for j in range_constexpr(g):
                put(grp * g + j, fx.Float32(0.0))
            scf.YieldOp([])
    gpu.barrier()
    inv_k = 1.0 / k_norm
    out = []
    for mr in range_constexpr(m_rep):
        vals = []
        for i in range_constexpr(4):
            r = mr * 16 + q * 4 + i
            parts = fx.Vector(vector.bitcast(_v4f32(), fx.ptr_load(fx.add_offset(lds_ptr, _raw(slot_dw + r * WAVES)),
                                                                   _v4i32())))
            tot = parts[0]
            for w in range_constexpr(1, WAVES):
                tot = tot + parts[w]
            vals.append(fx.math.rsqrt(tot * inv_k + eps, fastmath=AFN))
        out.append(vals)
    return out
