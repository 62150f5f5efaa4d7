"""gfx950's 256x256-class GEMM tile: an 8-wave workgroup whose operands reach LDS by DMA.

Why a second layout. The 4-wave kernel (kernel.py) gives each wave all BM rows of BN/4 columns
and keeps W in registers; a 256x256 tile would need 64 accumulator blocks (256 VGPRs) per lane.
Here 8 waves (512 lanes) share the tile as WM x WN = 2 x 4 (FlyDSL's gfx950 bf16 GEMM uses the
same wave grid, tile and K tile): wave (wm, wn) owns rows [wm * BM/2, +BM/2) and columns
[wn * BN/4, +BN/4), i.e. 128 x 64 of C for 256x256 = 8 x 4 MFMA 16x16 accumulators (128 VGPRs
or AGPRs), and the tile moves (BM + BN) x BK bytes per K step instead of the 4-wave 128x256
tile's 384 x BK for half the MFMAs (bytes per FLOP down by a third; tiles.py models it).

Data path per K step (BK = 64: 2 MFMA K blocks):
  A and W  global --buffer_load_dwordx4 ... lds (LDS DMA, 16 B a lane)--> LDS stage (2 stages)
     Both land in the preshuffled layout (BM/16 or BN/16, BK/32, 4, 16, kpack): a wave's DMA
     writes 64 consecutive 16-byte units (lane l at unit base + l, the base uniform: M0), and
     each lane's global address is chosen so that unit c holds chunk c. A and a row-major W
     ("nk") use kernel.py's chunk order (16 consecutive rows fastest); a preshuffled W is
     already in that order, so its unit c is its 16-byte chunk c of the tile (1 KiB per block).
     No register staging, no ds_write: the 4-wave kernel's A staging registers and W register
     sets are gone (W would be read twice from global by the two waves of a column otherwise).
  MFMA operands: one conflict-free ds_read_b128 each (64 lanes x 16 contiguous bytes); per K
     block a wave reads its BN/64 W operands once and then, per 16-row block, one A operand and
     BN/64 v_mfma_f32_16x16x32_{bf16,f16}.
The scheduled K loop is kernel.py's: two steps per scf.for iteration (stage offsets are
immediates), the K-tail tile peeled, and each step's sched_group_barrier sequence from
kernel.hot_loop_schedule (A operands read two ahead, the W operands of a K block with the first of
its A operands). The next tile's DMA is issued at the top of the step (left to the scheduler: it
holds no registers, and pinning it among the MFMAs as the 4-wave plan does cost 28 VGPRs), so it
has the whole step's MFMAs to land. The DMA is the asynchronous form, which the compiler does not
track: each step ends with s_waitcnt vmcnt(0) and one barrier, after which the other stage holds
tile k + 1.

Tails: rows >= M of A, rows >= N (or blocks past N_pad) of W, and A chunks with k >= K in the
last tile get the sentinel offset OOB, so the DMA writes zeros into LDS (never a wrong sum).
Epilogue: kernel.py's (scale, bias, the per-element program, residual, one cast), C leaving in
16-byte row pieces staged through LDS (cstore.py, every wave its own region in the freed
stages). So N must be a multiple of 16 B / out size; tiles.py only picks this tile then.

Limits, stated by `build_gemm_wide`'s errors: bf16/f16 inputs on gfx950 (16x16x32 MFMA, 160 KiB
LDS: two stages of 256x256x64 are 128 KiB), no split-K (this tile is for large M and N), no gated
epilogue, W preshuffled or row-major [N, K] (bmm's q @ kᵀ).
"""

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir.dialects import vector
from flydsl.expr import const_expr, gpu, range_constexpr, rocdl
from flydsl.expr.typing import T

from translator_kernels.arch import GPUS
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm import cstore
from translator_kernels.gemm.common import OOB, _raw, _v4f32, _v4i32, gemm_launcher
from translator_kernels.gemm.xcd import xcd_tile

WM, WN = 2, 4  # waves along M and along N
THREADS = 64 * WM * WN
LDS_LIMIT = GPUS["gfx950"].lds_bytes  # the 8-wave tile is gfx950's


def build_gemm_wide(n, k, n_pad, k_pad, dtype, out_dtype, osz, out_t, arch, bm, bn, bk, activation, has_bias,
                    has_residual, w_layout, hot_loop_schedule, apply_epilogue):
    """The @flyc.jit launcher of the 8-wave tile, with kernel.build_gemm's calling convention
    (P / Cnt are unused placeholders: no split). Called by kernel.build_gemm (wm = 2)."""
    if dtype not in ("bf16", "f16") or not arch.startswith("gfx950"):
        raise KernelInputError(f"gemm: the 8-wave (wm=2) tile runs bf16/f16 on gfx950 (got {dtype} on {arch}); "
                               f"use a 4-wave tile (wm=1)")
    esz, kp = 2, 8
    if bm % (16 * WM) or bn % (16 * WN) or bk % 32 or k_pad % bk or k % kp:
        raise KernelInputError(f"gemm: bad 8-wave tile {bm}x{bn}x{bk} for K={k} (K_pad={k_pad}): BM % {16 * WM}, "
                               f"BN % {16 * WN}, BK % 32 must be 0")
    if w_layout not in ("shuffled", "nk"):
        raise KernelInputError(f"gemm: the 8-wave tile reads W preshuffled or row-major [N, K], not {w_layout!r}")
    vec = cstore.vec_of(osz)
    if n % vec:
        raise KernelInputError(f"gemm: the 8-wave tile stores C in 16-byte pieces; N={n} is not a multiple of {vec}")
    m_rep, n_rep, k_blk = bm // (16 * WM), bn // (16 * WN), bk // 32  # per wave
    a_units, w_units = bm * bk // kp, bn * bk // kp  # 16-byte chunks of one A / W tile
    if a_units % THREADS or w_units % THREADS:
        raise KernelInputError(f"gemm: tile {bm}x{bn}x{bk} is not whole DMA rounds of {THREADS} x 16 B")
    a_loads, w_loads = a_units // THREADS, w_units // THREADS
    a_cpr = bk // kp  # chunks per row of a row-major tile
    a_dw, w_dw = a_units * 4, w_units * 4
    stage_dw = a_dw + w_dw
    n_per_wave = bn // WN
    if 2 * stage_dw * 4 > LDS_LIMIT or WM * WN * cstore.region_dw(n_per_wave) > 2 * stage_dw:
        raise KernelInputError(f"gemm: two LDS stages of {bm}x{bn}x{bk} exceed {LDS_LIMIT} B")
    nk = k_pad // bk
    n_tiles = -(-n_pad // bn)
    nb_total, kb_total = n_pad // 16, k_pad // 32
    # no vmem groups: the DMA holds no registers and the scheduler issues it at the top of the step;
    # pinning it among the MFMAs (the 4-wave plan's spread) cost 28 VGPRs here (248 vs 220)
    hints = hot_loop_schedule(k_blk * m_rep, 1, n_rep, 0, 0, extra_reads={kb * m_rep: n_rep for kb in range(k_blk)})

    @fx.struct
    class Smem:
        buf: fx.Array[fx.Int32, 2 * stage_dw, 16]

    mfma = rocdl.mfma_f32_16x16x32_bf16 if dtype == "bf16" else rocdl.mfma_f32_16x16x32_f16

    @flyc.kernel
    def gemm_wide_kernel(C: fx.Tensor, A: fx.Tensor, W: fx.Tensor, Bias: fx.Tensor, Res: fx.Tensor, P: fx.Tensor,
                         Cnt: fx.Tensor, m: fx.Int32, a_bs: fx.Int32, w_bs: fx.Int32, c_bs: fx.Int32,
                         scale: fx.Float32, a_bytes: fx.Int32, w_bytes: fx.Int32, c_bytes: fx.Int32,
                         p_bytes: fx.Int32, cnt_bytes: fx.Int32):
        tid = fx.Int32(fx.thread_idx.x)
        bx, by, bz = (fx.Int32(v) for v in fx.block_idx)
        bx, by = xcd_tile(bx, by, (m + (bm - 1)) // bm, n_tiles)  # XCD-grouped launch order (xcd.py)
        lane = tid % 64
        wave = tid // 64
        wave_u = fx.Int32(rocdl.readfirstlane(T.i32, _raw(wave)))  # uniform: the DMA's LDS base is M0
        wmi, wni = wave // WN, wave % WN
        l16 = lane % 16

        def rsrc(t, nbytes):
            return rocdl.get_buffer_rsrc(rocdl.make_buffer_ptr(fx.get_iter(t), num_records_bytes=fx.Int64(nbytes)))

        ra, rw, rc = rsrc(A, a_bytes), rsrc(W, w_bytes), rsrc(C, c_bytes)
        lds = fx.SharedAllocator().allocate(Smem).peek()
        a_row0 = bx * bm

        def rowmajor_voffs(loads, row0, rows, base):
            """(byte offset, k of the chunk) per DMA round of a row-major [rows, K] operand: unit c
            = chunk (16 consecutive rows fastest, kernel.py's order); rows past `rows` read 0."""
            out = []
            for i in range_constexpr(loads):
                c = tid + i * THREADS
                rest = c // 16
                r, kc = (rest // a_cpr) * 16 + c % 16, rest % a_cpr
                ok = row0 + r < rows
                out.append((ok.select((base + (row0 + r) * k + kc * kp) * esz, fx.Int32(OOB)), kc * kp))
            return out

        a_voff = rowmajor_voffs(a_loads, a_row0, m, bz * a_bs)
        if const_expr(w_layout == "nk"):
            w_voff = rowmajor_voffs(w_loads, by * bn, n, bz * w_bs)
            w_tile_bytes = bk * esz
        else:  # preshuffled: unit c of the tile is chunk c of blocks (BN/16) x (BK/32), 64 chunks each
            w_voff = []
            for i in range_constexpr(w_loads):
                c = tid + i * THREADS
                nb = by * (bn // 16) + c // (k_blk * 64)
                off = bz * w_bs + ((nb * kb_total + (c // 64) % k_blk) * 64 + c % 64) * kp
                w_voff.append(((nb < nb_total).select(off * esz, fx.Int32(OOB)), None))
            w_tile_bytes = bk * 16 * esz

        def dma(rs, voffs, tile_bytes, kt, dw0, k_tail):
            soff = _raw(kt * tile_bytes)
            for i in range_constexpr(len(voffs)):
                voff, kk = voffs[i]
                if const_expr(k_tail and kk is not None):
                    voff = (kt * bk + kk < k).select(voff, fx.Int32(OOB))
                p = fx.to_llvm_ptr(fx.add_offset(lds.buf.ptr, _raw(dw0 + (wave_u * 64 + i * THREADS) * 4)))
                rocdl.raw_ptr_buffer_load_async_lds(rs, p, _raw(fx.Int32(16)), _raw(voff), soff, _raw(fx.Int32(0)))

        def load(kt, stage, k_tail=False):
            """Tile kt of A and W -> LDS stage `stage` (lands by the step's closing wait)."""
            dma(ra, a_voff, bk * esz, kt, stage * stage_dw, k_tail)
            dma(rw, w_voff, w_tile_bytes, kt, stage * stage_dw + a_dw, k_tail)

        def operand(dw):
            half_t = T.bf16 if dtype == "bf16" else T.f16
            return vector.bitcast(T.vec(8, half_t), fx.ptr_load(fx.add_offset(lds.buf.ptr, _raw(dw + lane * 4)),
                                                                _v4i32()))

        def compute(accs, stage):
            accs = list(accs)
            for kb in range_constexpr(k_blk):
                wops = [operand(stage * stage_dw + a_dw + ((wni * n_rep + nr) * k_blk + kb) * 256)
                        for nr in range_constexpr(n_rep)]
                for mr in range_constexpr(m_rep):
                    aop = operand(stage * stage_dw + ((wmi * m_rep + mr) * k_blk + kb) * 256)
                    for nr in range_constexpr(n_rep):
                        accs[mr * n_rep + nr] = mfma(_v4f32(), [aop, wops[nr], accs[mr * n_rep + nr]])
            return accs

        def step(accs, stage, nxt=None, k_tail=False):
            if const_expr(nxt is not None):
                load(nxt, 1 - stage, k_tail)
            accs = compute(accs, stage)
            for kind, cnt in hints if nxt is not None else [h for h in hints if h[0] in ("dsrd", "mfma")]:
                getattr(rocdl, "sched_" + kind)(cnt)
            rocdl.sched_barrier(0)
            if const_expr(nxt is not None):
                rocdl.cdna3.s_waitcnt(vmcnt=0)  # tile nxt has landed in LDS (async DMA: not tracked)
                gpu.barrier()
            return accs

        k_tail = k % bk != 0
        accs = [_raw(fx.Vector.filled(4, 0.0, fx.Float32)) for _ in range(m_rep * n_rep)]
        load(fx.Int32(0), 0, k_tail and nk == 1)
        rocdl.cdna3.s_waitcnt(vmcnt=0)
        gpu.barrier()
        pairs = max(0, (nk - 1 - int(k_tail)) // 2)
        if const_expr(pairs > 0):
            for it, st in range(fx.Index(0), fx.Index(pairs), fx.Index(1), init=accs):
                kt = fx.Int32(it) * 2
                res = yield [_raw(v) for v in step(step(list(st), 0, kt + 1), 1, kt + 2)]
            accs = list(res)
        for s in range_constexpr(2 * pairs, nk):
            accs = step(accs, s % 2, s + 1 if s + 1 < nk else None, k_tail and s + 1 == nk - 1)

        # ---- epilogue: every wave is past its last LDS read; C through LDS in 16-byte pieces ----
        gpu.barrier()
        col0 = by * bn + wni * n_per_wave
        bias_v = [None] * n_rep
        if const_expr(has_bias):
            rb = rsrc(Bias, n * 4)
            for nr in range_constexpr(n_rep):
                col = col0 + nr * 16 + l16
                bias_v[nr] = fx.Float32(rocdl.raw_ptr_buffer_load(T.f32, rb, _raw((col < n).select(col * 4, fx.Int32(OOB))),
                                                                  _raw(fx.Int32(0))))

        def y_of(mr, nr):
            yv = fx.Vector(_raw(accs[mr * n_rep + nr])) * fx.Vector.filled(4, scale, fx.Float32)
            if const_expr(has_bias):
                yv = yv + fx.Vector.filled(4, bias_v[nr], fx.Float32)
            return apply_epilogue(yv, activation)

        rr = rsrc(Res, c_bytes) if has_residual else None
        cstore.store_rows_vec(y_of, lds.buf.ptr, wave * cstore.region_dw(n_per_wave), lane, m_rep, n_rep, n_per_wave,
                              a_row0 + wmi * (m_rep * 16), col0, m, n, bz * c_bs, rc, rr, out_t, osz)

    return gemm_launcher(gemm_wide_kernel, bm, n_tiles, THREADS)
