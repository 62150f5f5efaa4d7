"""The preshuffle MFMA GEMM kernel: C[b] = epilogue(A[b] · W[b]ᵀ), W preshuffled (see preshuffle.py).

One workgroup = 4 waves (256 lanes) computes a BM x BN tile of C; wave w owns columns
[w*BN/4, (w+1)*BN/4) and all BM rows, as (BM/16) x (BN/64) MFMA 16x16 accumulators.

Data path per K step of BK elements (K_pad/BK steps; M is a runtime argument):
  A  global --128-bit buffer loads--> registers --ds_write_b128--> LDS (2 stages)
     LDS is laid out like the preshuffled weight, (BM/16, BK/32, 32/kpack, 16, kpack), so
     every MFMA A operand is one conflict-free ds_read_b128 (64 lanes x 16 B contiguous).
  W  global --128-bit buffer loads--> registers (no LDS): the preshuffle puts each lane's
     operand in one contiguous 16-byte chunk.
  MFMA: fp32 -> v_mfma_f32_16x16x4_f32 (8 per 16x16x32 block), bf16/fp16 -> 16x16x16
     (gfx942, 2 per block) or 16x16x32 (gfx950, 1 per block); fp32 accumulation. fp8 / bf8
     (fp8.py, mfma8.py) ride as 4-byte units of 4 values in the fp32 geometry, with per-row /
     per-column epilogue scales (Sa, Sw).

The scheduled K loop (the hot loop):
  - Step k computes on LDS stage k % 2 and W register set k % 2 while the loads of tile k+1
    are in flight; A of tile k+1 is written to the other stage at the end of the step, then
    one barrier.
  - The scf.for runs two steps per iteration, so stage offsets are immediates and the two W
    register sets swap without copies. It never loads the K-tail tile: the last 1-3 steps
    are peeled, and only the load of the tile that crosses K checks k < K per chunk.
  - Global offsets are per-thread VGPRs computed once (row < M and the N padding folded in as
    the sentinel offset); a tile adds a uniform SGPR soffset. The loop body has no VALU.
  - Each step ends with a sched_group_barrier sequence (`hot_loop_schedule`): A operands are read
    from LDS two operands ahead of their MFMAs (not all at once), the next tile's global loads
    spread over the first half of the MFMAs, the LDS writes of A follow the last MFMAs. FlyDSL's
    preshuffle GEMM schedules its hot loop with the same kind of hints; bench.kernels compares
    the two at equal tiles.

K ordering: lane (r, q) of a 16x16x32 block holds the 16-byte chunk q (and q+4 for fp32)
of its row; each MFMA sums over q, so A and W are permuted identically along K and the
dot product is exact up to fp32 summation order.

Tails (never an out-of-bounds access, never a wrong answer): K must be a multiple of
kpack (the entry point pads A otherwise); A chunks with row >= M or k >= K, W chunks past
N_pad, and C elements with row >= M or col >= N get a sentinel byte offset beyond the
buffer descriptor's num_records, so the hardware returns 0 / drops the store.

Epilogue, in this order: y = scale * acc; y += bias[col]; y = program(y); y += residual[row, col];
C = y cast to the output dtype. `program` is a one-input per-element program of
translator_kernels.program (the same program and op table as the generated elementwise, reduce
and scan kernels): any op of the table with compile-time constants, e.g. the chain spellings
"mul(0.5);sigmoid", "gelu;clamp(-1.0,1.0)", "sqrt;log", or an activation name ("relu", "gelu").
It runs on each lane's 4-accumulator vector through the table's device functions
(device_math.run), and its canonical text is part of the kernel's cache key. C leaves in 16-byte
row pieces staged through LDS (cstore.py) where N allows; split-K (splitk.py) adds its partial
sums inside the launch before the epilogue; kw = 4 tiles add the waves' K parts through LDS first.
Where the code lives: the operand loads (A to LDS, W to registers, their per-thread offsets) in
loads.py; the epilogue stores (plain and gated) in store.py; the K loop, its schedule and the split-K /
kw = 4 finish here.
"""


import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import scf
from flydsl.expr import const_expr, gpu, range_constexpr, rocdl
from flydsl.expr.typing import T

from translator_kernels import launch as kl
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm import blockscale as bsc, cstore, dequant as w4, mxscale as mxs, rownorm as rn, splitk as sk
from translator_kernels.gemm.mfma8 import FORMATS as _F8, w8_to_chunk
from translator_kernels.gemm.mfma16 import mfma_block as _mfma_block, mfma_per_block  # noqa: F401 (re-exported)
from translator_kernels.gemm.loads import Loads
from translator_kernels.gemm.store import Epilogue
from translator_kernels.gemm.schedule import hot_loop_schedule, ring_vmem  # noqa: F401 (re-exported)
from translator_kernels.gemm.xcd import xcd_tile
from translator_kernels.gemm.common import THREADS, WAVES, _raw, _v4i32, gemm_launcher  # noqa: F401 (THREADS re-exported)
from translator_kernels.gemm.epilogue import apply_epilogue_device, apply_epilogue_torch, canonical_epilogue  # noqa: F401,E501 (re-exported)

_ELEM = {  # name -> (bytes, DSL type)
    "f32": (4, fx.Float32),
    "bf16": (2, fx.BFloat16),
    "f16": (2, fx.Float16),
}


def _i32(v):
    return fx.Int32(v)


@kl.builder
def build_gemm(n: int, k: int, n_pad: int, k_pad: int, dtype: str, out_dtype: str, arch: str,
               bm: int, bn: int, bk: int, activation, has_bias: bool, has_residual: bool, split: int = 1,
               w_layout: str = "shuffled", gate=None, kw: int = 1, store_vec: bool = True, wm: int = 1,
               grouped: bool = False, a_scale: str = "", w_scale: str = "", w_int8: bool = False,
               w_int4: int = 0, up=None, head: int = 0, rownorm=None, ring: bool = False, quad: bool = False):
    """Compile-time specialization of the GEMM; returns the @flyc.jit launcher

    launch(C, A, W, bias, residual, P, Cnt, m, batch, a_bstride, w_bstride, c_bstride, scale,
           a_bytes, w_bytes, c_bytes, p_bytes, cnt_bytes)
    (batch strides in elements; bias/residual/P/Cnt are ignored placeholders when absent).

    split > 1 (split-K, splitk.py): workgroup (x, y + s * N_tiles, z) sums K tiles [s, s + 1) * K_pad / BK / split,
    stores them in the fp32 workspace P and takes a ticket from the int32 counters Cnt (zero before the
    launch, zero again after it); the last arriver of a tile adds the splits' partials in the fixed order
    0..split-1 and runs the epilogue. One launch, deterministic.

    kw = 4: the 4 waves share the BN columns and split each BK tile (wave w: K blocks [w, w + 1) * BK / 128),
    then add their accumulators through LDS in wave order; wave 0 runs the epilogue. Small-N tiles
    (BN = 16) for decode grids; kw = 1: the waves split BN (the default layout).

    store_vec: C leaves in 16-byte row pieces staged through LDS (cstore.py) where N allows (N a
    multiple of 16 bytes / out size, not gated); False keeps the one-element-per-lane stores.

    w_layout: "shuffled" (preshuffle.py, weights), or an activation read in place by bmm:
      "nk": W is an ordinary row-major [N, K] matrix (row stride K, a multiple of kpack): the right
            operand of q @ k.transpose(-2, -1). A lane's operand is still one 16-byte load; a wave
            reads 16 rows x 64 bytes;
      "kn": W is given as B = Wᵀ, a row-major [K, N] matrix (row stride N): the right operand of
            att @ v. A lane's operand (kpack consecutive K of one column) is kpack 2- or 4-byte
            loads; for each, the 16 lanes of a row read 16 consecutive columns (32 / 64 bytes).
            No reshuffle pass over B; more load instructions than the other layouts.

    gate (an epilogue program, e.g. "silu"): the gated MLP act(x Wg^T + bg) * (x Wu^T + bu). W is
    gated.gated_weight's arrangement ([2 * N16, K]: 16 gate rows, then the 16 up rows of the same
    output columns), `n` is the output N, n_pad = 2 * N16, BN covers BN / 2 output columns and the
    bias (if any) is arranged like W. Accumulator pairs (2j, 2j + 1) of a lane are the gate and
    the up value of one output element. `activation` still applies after the product. `up` (an epilogue
    program or None) maps the up value first: act(g) * up(u) (gpt-oss: clamp, then + 1).

    grouped (translator_kernels/moe/grouped.py): the int32 `Cnt` holds each M tile's expert, W is
    [experts, ...] with w_bs elements per expert; a bias stacked per expert ([E, N] fp32, [E, N_pad] gated), its
    bytes in p_bytes (P free); a "col" w_scale stacked per expert the same way (Sw [E, N] / [E, N_pad]). split > 1: the tile map is in `Res` (m / BM int32; no bias / residual), P / Cnt split-K's.

    wm = 2: gfx950's 8-wave tile (wide.py: 2 x 4 waves, A and W into LDS by DMA), bf16/f16, no
    split / gate / kw; its errors say what it takes.

    dtype "fp8" / "bf8" / "fp8xbf8" (A x W formats; fp8.py, mfma8.py): k, k_pad, bk in 4-byte units of 4 values.
    a_scale "" | "tensor" | "row" | "block", w_scale "" | "tensor" | "col" | "block": fp32 Sa, Sw (the launcher
    takes them after cnt_bytes); per tensor / row / column in the epilogue (y = scale * acc * sw[col] * sa[row]);
    "block" (128 x 128, blockscale.py) inside the K loop. w_int8 (w8.py) / w_int4 = G (w4.py): weight-only int8 /
    group-wise int4 W, converted to the activation dtype in the load path (int4: s, b per group in Sa, Sw).

    head > 0 (a short first tile, kw = 1, preshuffled W without block / int4 scales): the workgroup's first K
    tile holds `head` K elements and its last BK - head, so its prologue loads (BM + BN) x head instead of a
    whole tile (the fill the timing MODEL charges at the CU's share of the bandwidth, docs/gemm.md); one more
    K step, the same MFMAs (the empty K blocks of both partial tiles are neither loaded nor computed).

    ring (kw = 1, preshuffled bf16 / f16 / f32 W, no scales / gate / grouped): one W register set instead of two;
    the next tile's W block kb is loaded right after the MFMAs of this tile's block kb (schedule.ring_vmem), into
    the registers they freed. Every load still has a whole K step to land; the W registers halve (docs/gemm.md).

    quad (the ring's operands, BM and BN multiples of 32): a 2 x 2 wave layout, wave w owns rows (w // 2) * BM / 2
    and columns (w % 2) * BN / 2 of the tile (it reads half of A's rows from LDS; two waves load each W column).

    rownorm = (eps, K_norm) (rownorm.py: RMSNorm folded into the GEMM, γ in W): each workgroup computes
    rstd = rsqrt(mean(A_row²) + eps) of its rows over the full K, and the epilogue multiplies row by it."""
    fmts = dtype.split("x") if dtype not in _ELEM else None
    w_fp4 = bool(fmts) and fmts[-1] == "fp4"  # MXFP4 weights, 2 codes a byte (mx.py; needs w_scale "mx")
    if fmts and (len(fmts) > 2 or any(f not in _F8 for f in (fmts[:-1] if w_fp4 and len(fmts) == 2 else fmts))):
        raise KernelInputError(f"gemm: dtype {dtype} not in {sorted(_ELEM)} or fp8 / bf8 (A x W: 'fp8xbf8')")
    if out_dtype not in _ELEM:
        raise KernelInputError(f"gemm: out_dtype {out_dtype} not in {sorted(_ELEM)}")
    block = w_scale == "block"  # 128 x 128 block scales applied in the K loop (blockscale.py)
    if (a_scale not in ("", "tensor", "row", "block", "mx") or w_scale not in ("", "tensor", "col", "block", "mx")
            or (a_scale == "block" and not block) or (block and not fmts)):
        raise KernelInputError(f"gemm: a_scale {a_scale!r} / w_scale {w_scale!r}: want ''|'tensor'|'row'|'block' / "
                               f"''|'tensor'|'col'|'block' ('block' A needs 'block' W and 8-bit float operands)")
    mx = mxs.checked(a_scale, w_scale, fmts, w_fp4, arch)  # e8m0 scales per 32 of K in the MFMA (mxscale.py)
    block = block or mx  # the scales ride with the W registers
    a_ep, w_ep = ("" if a_scale in ("block", "mx") else a_scale), ("" if block else w_scale)  # the epilogue's part
    if (fmts or a_scale or w_scale or w_int8 or w_int4) and (wm != 1 or w_layout != "shuffled" or (
            gate is not None and (block or w_int8 or w_int4))):  # gated: epilogue scales (fp8_gated.py)
        raise KernelInputError("gemm: 8-bit float operands and epilogue scales run the 4-wave tile with a "
                               "preshuffled weight; a gate takes per-tensor / row / column scales only")
    activation = canonical_epilogue(activation)  # validates
    esz = 4 if fmts else _ELEM[dtype][0]
    rownorm = rn.checked(rownorm, fmts, w_layout, grouped, wm, k, esz)
    wsz, wdiv = (1, 2) if w_int4 else (1 if w_int8 else 2 if w_fp4 else esz, 1)  # W bytes per element: wsz / wdiv
    if w_int4 and (fmts or dtype == "f32" or w_int4 not in w4.GROUPS):
        raise KernelInputError(f"gemm: int4 weights take bf16 / fp16 activations and a group in {w4.GROUPS}")
    if w_int8 and fmts:
        raise KernelInputError("gemm: an int8 weight takes a bf16 / fp16 / fp32 activation")
    osz, out_t = _ELEM[out_dtype]
    if wm != 1:
        from translator_kernels.gemm.wide import WM, build_gemm_wide

        if wm != WM or split != 1 or gate is not None or kw != 1:
            raise KernelInputError(f"gemm: wm={wm} needs wm == {WM}, split 1, no gate, kw 1 (got split={split}, "
                                   f"gate={gate}, kw={kw})")
        return build_gemm_wide(n, k, n_pad, k_pad, dtype, out_dtype, osz, out_t, arch, bm, bn, bk, activation,
                               has_bias, has_residual, w_layout, hot_loop_schedule, apply_epilogue_device)
    kp = 16 // esz  # elements per 16-byte chunk
    cpb = 32 // kp  # chunks per row of a 16x16x32 block (bf16: 4, f32: 8)
    lph = cpb // 4  # 16-byte loads per lane per block (bf16: 1, f32: 2)
    if bm % 16 or bn % 16 or bk % 32 or k_pad % bk or k % kp:
        raise KernelInputError(f"gemm: bad tile {bm}x{bn}x{bk} for K={k} (K_pad={k_pad})")
    if kw not in (1, WAVES) or bn % (16 * WAVES // kw) or bk % (32 * kw):
        raise KernelInputError(f"gemm: kw={kw} needs kw in (1, {WAVES}), BN % {16 * WAVES // kw} == 0, "
                               f"BK % {32 * kw} == 0 (got BN={bn}, BK={bk})")
    m_rep, n_rep, k_blk = bm // 16, bn * kw // (16 * WAVES), bk // 32 // kw  # per wave
    if gate is not None:
        gate, up = canonical_epilogue(gate), canonical_epilogue(up)  # validates
        if bn % 128 or split != 1 or w_layout != "shuffled" or kw != 1:
            raise KernelInputError(f"gemm: a gated tile needs BN % 128 == 0 and no split / plain W / kw (got BN={bn})")
    if split < 1 or (k_pad // bk) % split:
        raise KernelInputError(f"gemm: split {split} does not divide the {k_pad // bk} K tiles of K_pad={k_pad}, BK={bk}")
    if grouped and split > 1 and (has_bias or has_residual):  # Res carries the tile map, P is the workspace
        raise KernelInputError("gemm: a grouped split-K GEMM takes no bias or residual")
    if grouped:  # tiles past the real rows exit (moe/tile_exit.py; imported here: moe imports this module)
        from translator_kernels.moe import tile_exit as tx
    nk = k_pad // bk // split  # K tiles per workgroup
    if head and (kw != 1 or w_layout != "shuffled" or block or w_int4 or head % 32 or not 0 < head < bk):
        raise KernelInputError(f"gemm: head={head} (a short first K tile) needs kw 1, a preshuffled W without block / "
                               f"int4 scales and head % 32 == 0, 0 < head < BK={bk}")
    if (ring or quad) and (kw != 1 or w_layout != "shuffled" or fmts or block or w_int8 or w_int4 or gate is not None
                           or grouped or rownorm or (quad and (bm % 32 or bn % 32))):
        raise KernelInputError("gemm: ring (one W register set) / quad (2 x 2 waves) need kw 1 and a preshuffled bf16 / "
                               "f16 / f32 W without scales, gate, rownorm or expert groups (quad: BM, BN % 32 == 0)")
    if quad:
        m_rep, n_rep = bm // 32, bn // 32
    nsteps, lead = nk + (1 if head else 0), (bk - head if head else 0)  # K steps; K shift of the later tiles
    n_tiles = -(-n_pad // bn)
    a_chunks = bm * bk // kp  # 16-byte chunks in one A tile
    a_loads = -(-a_chunks // THREADS)
    a_cpr = bk // kp  # chunks per A tile row
    stage_dw = bm * bk * esz // 4  # one LDS stage, in dwords
    nb_total = n_pad // 16
    kb_total = k_pad // 32
    n_per_wave = bn // 2 if quad else bn * kw // WAVES
    n_acc = m_rep * n_rep
    # 16-byte C stores through LDS: N in whole pieces, every staging wave's region inside the A stages
    store_vec = (store_vec and gate is None and n % cstore.vec_of(osz) == 0
                 and n_per_wave % cstore.vec_of(osz) == 0
                 and WAVES // kw * cstore.region_dw(n_per_wave) <= 2 * stage_dw)
    if kw > 1 and WAVES * n_acc * 256 > 2 * stage_dw:
        raise KernelInputError(f"gemm: the LDS of tile {bm}x{bn}x{bk} cannot hold the waves' accumulators (kw={kw})")

    @fx.struct
    class Smem:
        a: fx.Array[fx.Int32, 2 * stage_dw, 16]

    def mfma_block(acc, a_regs, b_regs, scales=None):  # acc += one 16x16x32 block (mfma16.py)
        return _mfma_block(acc, a_regs, b_regs, dtype, fmts, arch, lph, scales)

    mpb = mfma_per_block(dtype, arch)
    n_scl = ((m_rep if mx else 4 * m_rep) if a_scale in ("block", "mx") else 0) * k_blk + n_rep * k_blk if block \
        else 2 * n_rep * k_blk if w_int4 else 0
    hints = hot_loop_schedule(k_blk * m_rep, lph, n_rep * mpb, a_loads + n_rep * k_blk * lph + n_scl, a_loads,
                              vmem_at=ring_vmem(k_blk, m_rep * n_rep * mpb, a_loads, n_rep * lph) if ring else None)

    def schedule_step(prefetching: bool):
        """Emit one K step's sched_group_barrier sequence (`hot_loop_schedule`); ends the region."""
        for kind, cnt in hints if prefetching else [h for h in hints if h[0] in ("dsrd", "mfma")]:
            getattr(rocdl, "sched_" + kind)(cnt)
        rocdl.sched_barrier(0)

    @flyc.kernel
    def gemm_kernel(C: fx.Tensor, A: fx.Tensor, W: fx.Tensor, Bias: fx.Tensor, Res: fx.Tensor, P: fx.Tensor,
                    Cnt: fx.Tensor, m: fx.Int32, a_bs: fx.Int32, w_bs: fx.Int32, c_bs: fx.Int32, scale: fx.Float32,
                    a_bytes: fx.Int32, w_bytes: fx.Int32, c_bytes: fx.Int32, p_bytes: fx.Int32, cnt_bytes: fx.Int32,
                    Sa: fx.Tensor, Sw: fx.Tensor):
        tid = _i32(fx.thread_idx.x)
        bx, by, bz = fx.block_idx
        bx, by, bz = _i32(bx), _i32(by), _i32(bz)
        bx, by = xcd_tile(bx, by, (m + (bm - 1)) // bm, n_tiles * split)  # XCD-grouped launch order (xcd.py)
        kt0 = fx.Int32(0)
        if const_expr(split > 1):
            s_idx = by // n_tiles
            kt0 = s_idx * nk  # this workgroup's first K tile
            by = by % n_tiles
        lane = tid % 64
        wave = tid // 64
        l16 = lane % 16
        q = lane // 16
        wcol = ((wave % 2) if quad else wave) * n_per_wave if kw == 1 else 0  # this wave's first column in the tile
        wk = wave * k_blk if kw > 1 else 0  # this wave's first 32-deep K block in the tile

        def rsrc(t, nbytes):
            return rocdl.get_buffer_rsrc(rocdl.make_buffer_ptr(fx.get_iter(t), num_records_bytes=fx.Int64(nbytes)))

        ra, rw, rc = rsrc(A, a_bytes), rsrc(W, w_bytes), rsrc(C, c_bytes)
        lds = fx.SharedAllocator().allocate(Smem).peek()
        zero = _raw(fx.Int32(0))

        # ---- global offsets: the per-thread part once, here; each K tile adds a uniform
        # byte offset (an SGPR soffset), so the loop body does no per-lane address math. ----
        a_row0 = bx * bm
        a_rowe = a_row0 + (wave // 2) * (bm // 2) if quad else a_row0  # this wave's first row (the epilogue's)
        a_base = bz * a_bs

        ld = Loads(a_loads=a_loads, a_chunks=a_chunks, a_cpr=a_cpr, kp=kp, esz=esz, k=k, n=n, bk=bk, k_blk=k_blk,
                   lead=lead, stage_dw=stage_dw, n_rep=n_rep, lph=lph, cpb=cpb, w_layout=w_layout, wsz=wsz, wdiv=wdiv,
                   w_int8=w_int8, w_int4=w_int4, w_fp4=w_fp4, mx=mx, block=block, tid=tid, lane=lane, l16=l16, q=q,
                   wk=wk, m=m, ra=ra, rw=rw, lds=lds)
        ld.a_offsets(a_row0, a_base)
        load_a, store_a, load_w = ld.load_a, ld.store_a, ld.load_w  # (loads.py)

        # ---- W: global -> regs, per wave: n_rep x k_blk x lph chunks (block and half offsets are
        # compile-time constants the buffer instruction's immediate offset absorbs) ----
        nb0 = (by * bn + wcol) // 16
        w_base = bz * w_bs
        b_base = 0  # the bias row: the tile's expert's with `grouped` (stacked [E, N] or [E, N_pad] gated)
        if const_expr(grouped):  # the M tile's expert (moe): W of that expert
            tmap = rsrc(Res, m // bm * 4) if split > 1 else rsrc(Cnt, cnt_bytes)  # split-K: Cnt holds tickets
            expert = tx.uniform(rocdl.raw_ptr_buffer_load(T.i32, tmap, _raw(bx * 4), zero))
            exit_gate = tx.begin(expert)  # a tile past the real rows (map -1) skips the rest (moe/tile_exit.py)
            w_base = expert * w_bs
            b_base = expert * (n_pad if gate is not None else n)
        ld.w_offsets(nb0, w_base, nb_total, kb_total)
        bs = None
        if const_expr(mx):  # per-lane offsets of the e8m0 bytes (mxscale.py)
            bs = mxs.MxScales(rsrc(Sa, m * (k * 4 // mxs.GROUP)), rsrc(Sw, nb_total * kb_total * 64),
                              a_scale == "mx", k, m, a_row0, l16, q, lane, nb0, nb_total, m_rep, n_rep, k_blk, wk)
        elif const_expr(block):  # per-lane offsets of sa [M, KB] / sw [NB, KB] (blockscale.py)
            kbt = bsc.kblocks(k)
            bs = bsc.BlockScales(rsrc(Sa, m * (kbt * 4)), rsrc(Sw, -(-n // bsc.BLOCK) * kbt * 4),
                                 a_scale == "block", k, m, n, a_row0, q, by * bn + wcol + l16, m_rep, n_rep, k_blk, wk)
        if const_expr(w_int4):  # s, b [K / G, N] of the int4 groups (w4.py)
            bs = w4.GroupScales(rsrc(Sa, k // w_int4 * n * 4), rsrc(Sw, k // w_int4 * n * 4), n, w_int4,
                                by * bn + wcol + l16, n_rep, k_blk, wk)
        ld.bs = bs  # load_w appends their loads to W's

        # a lane's A reads of a block: chunks q, q + 4 (fp32 geometry), for MX 2q, 2q + 1; this wave's K blocks
        a_lane_dw, h_chunks = (lane * 4, 4) if not mx else mxs.a_lane(l16, q)
        a_lane_dw = a_lane_dw + wk * (cpb * 64)
        if const_expr(quad):  # this wave's half of A's rows: m_rep 16-row blocks on
            a_lane_dw = a_lane_dw + (wave // 2) * (m_rep * k_blk * cpb * 64)

        def compute(accs, w_regs, stage, nblk=k_blk, after=None):
            """This tile's MFMAs, K block by K block; after(kb) runs once block kb's MFMAs are issued (ring)."""
            accs = list(accs)
            if const_expr(w_int8):
                w_regs = [w8_to_chunk(r, kp, dtype) for r in w_regs]
            if const_expr(block or w_int4):  # the scales loaded with the tile
                scl, w_regs = w_regs[n_rep * k_blk * lph:], w_regs[:n_rep * k_blk * lph]
            if const_expr(w_int4):  # q * s + b of the lane's group, rounded once to the activation dtype
                w_regs = [w4.w4_to_chunk(w_regs[i], *bs.pick(scl, i % k_blk, i // k_blk), dtype)
                          for i in range(len(w_regs))]
            if const_expr(block and not mx):  # each block into a zero accumulator, then acc + partial * (sa * sw)
                zero4 = _raw(fx.Vector.filled(4, 0.0, fx.Float32))
            for kb in range_constexpr(nblk):
                for mr in range_constexpr(m_rep):
                    ops = []
                    for h in range_constexpr(lph):
                        dw = stage * stage_dw + (((mr * k_blk * kw + kb) * cpb + h * h_chunks) * 16) * 4 + a_lane_dw
                        ops.append(fx.ptr_load(fx.add_offset(lds.a.ptr, _raw(dw)), _v4i32()))
                    for nr in range_constexpr(n_rep):
                        wb = (nr * k_blk + kb) * lph
                        i = mr * n_rep + nr
                        if const_expr(block and not mx):
                            accs[i] = bs.apply(accs[i], mfma_block(zero4, ops, w_regs[wb:wb + lph]), scl, kb, mr, nr)
                        else:  # MX: the lane's scale bytes go to the MFMA (mxscale.py)
                            accs[i] = mfma_block(accs[i], ops, w_regs[wb:wb + lph],
                                                 bs.pick(scl, kb, mr, nr) if mx else None)
                if const_expr(after is not None):
                    after(kb)
            return accs

        def compute_ring(accs, w_cur, stage, nblk, nxt, nxt_blk, k_tail):
            """compute() with the next tile's W block kb loaded after this tile's block kb (ring): its registers."""
            loaded = []  # (index, register) of the next tile's W

            def load_block(kb):
                if const_expr(kb < nxt_blk):
                    loaded.extend((i, r) for i, r in enumerate(load_w(nxt, k_tail, nblk=nxt_blk, kbs=(kb,)))
                                  if r is not None)

            accs = compute(accs, w_cur, stage, nblk, load_block)
            for kb in range_constexpr(nblk, k_blk):  # a partial tile: the blocks it does not compute
                load_block(kb)
            regs = dict(loaded)
            return accs, [regs.get(i, loaded[0][1]) for i in range(len(w_cur))]

        def step(accs, w_cur, stage, nxt=None, k_tail=False, nblk=k_blk, nxt_blk=k_blk):
            """One K tile: MFMAs on LDS stage `stage` with W regs `w_cur`; when `nxt` (a tile index)
            is given, its A and W loads are in flight meanwhile and A lands in the other stage.
            nblk / nxt_blk: the K blocks of this / the next tile (fewer in `head`'s partial tiles).
            Returns (accs, W regs of nxt)."""
            w_next = None
            if const_expr(nxt is not None):
                a_next = load_a(nxt, k_tail, nblk=nxt_blk)
                if const_expr(not ring):
                    w_next = load_w(nxt, k_tail, nblk=nxt_blk)
            if const_expr(ring and nxt is not None):
                accs, w_next = compute_ring(accs, w_cur, stage, nblk, nxt, nxt_blk, k_tail)
            else:
                accs = compute(accs, w_cur, stage, nblk)
            if const_expr(nxt is not None):
                store_a(a_next, 1 - stage)
            schedule_step(nxt is not None)
            if const_expr(nxt is not None):
                gpu.barrier()
            return accs, w_next

        # ---- prologue: tile 0 -> LDS stage 0 and W regs ----
        k_tail = k % bk != 0  # only the last tile crosses K (K_pad - K < 32 <= BK, and <= BK - head)

        def blocks(s):  # K blocks of step s: `head`'s first and last tiles are partial
            return head // 32 if head and s == 0 else lead // 32 if head and s == nsteps - 1 else k_blk

        accs = [_raw(fx.Vector.filled(4, 0.0, fx.Float32)) for _ in range(m_rep * n_rep)]
        store_a(load_a(kt0, k_tail and nsteps == 1, True, blocks(0)), 0)
        w_cur = load_w(kt0, k_tail and nsteps == 1, True, blocks(0))
        if const_expr(rownorm):  # rstd of the tile's rows over the full K, while tile 0's W is in flight
            rn_v = rn.row_rstd(rownorm, ra, a_base, a_row0, m, k, dtype, bm, m_rep, tid, lane, wave, q, lds.a.ptr,
                               stage_dw)
        gpu.barrier()
        n_acc = len(accs)
        p0 = 1 if head else 0  # the partial first step runs before the loop
        if const_expr(p0):
            accs, w_cur = step(accs, w_cur, 0, kt0 + 1, k_tail and nsteps == 2, blocks(0), blocks(1))
        # ---- main loop, two tiles per iteration so both LDS stages and both W register sets are
        # fixed (no stage arithmetic, no register copies); it never loads the K-tail (or partial last) tile ----
        pairs = max(0, (nsteps - 1 - int(k_tail or head > 0) - p0) // 2)
        if const_expr(pairs > 0):
            for it, st in range(fx.Index(0), fx.Index(pairs), fx.Index(1), init=accs + w_cur):
                kt = kt0 + fx.Int32(it) * 2 + p0 if p0 else kt0 + fx.Int32(it) * 2
                accs1, w1 = step(st[:n_acc], st[n_acc:], p0, kt + 1)
                accs2, w2 = step(accs1, w1, 1 - p0, kt + 2)
                res = yield [_raw(v) for v in accs2] + [_raw(v) for v in w2]
            accs = list(res[:n_acc])
            w_cur = list(res[n_acc:])
        # ---- peeled steps: the rest of the tiles, the K-tail load among them ----
        for s in range_constexpr(p0 + 2 * pairs, nsteps):
            nxt = kt0 + (s + 1) if s + 1 < nsteps else None
            accs, w_cur = step(accs, w_cur, s % 2, nxt, k_tail and s + 1 == nsteps - 1, blocks(s),
                               blocks(s + 1) if s + 1 < nsteps else k_blk)

        ep = Epilogue(n, n_pad, bn, m_rep, n_rep, n_per_wave, kw, grouped, has_bias, has_residual, a_ep, w_ep, rownorm,
                      store_vec, activation, gate, up, osz, out_t, rsrc, Bias, Res, Sa, Sw, rc, lds, p_bytes, c_bytes, m,
                      scale, bz, by, c_bs, b_base, wcol, wave, lane, l16, q, a_row0, a_rowe, rn_v if rownorm else None,
                      zero)
        store = ep.store_gated if gate is not None else ep.store_c
        if const_expr(kw > 1):  # the waves' K parts, added through LDS in wave order; wave 0 stores
            accs = sk.add_wave_parts(accs, lds.a.ptr, wave, lane)
        if const_expr(store_vec):  # C is staged where A was: every wave is past its last LDS read
            gpu.barrier()

        def finish(accs):
            if const_expr(split > 1):  # partials, a ticket; the last split of the tile adds them and stores
                region = ((bz * ((m + (bm - 1)) // bm) + bx) * n_tiles + by) * (WAVES // kw) + (wave if kw == 1 else 0)
                rows_ok = [a_rowe + mr * 16 + q * 4 < m for mr in range(m_rep)]
                sk.reduce_splits(accs, store, P, Cnt, p_bytes, cnt_bytes, region, s_idx, split, rows_ok, n_rep, lane)
            else:
                store(accs)

        if const_expr(kw > 1):
            if_op = scf.IfOp(_raw(wave == 0), has_else=False)
            with ir.InsertionPoint(if_op.then_block):
                finish(accs)
                scf.YieldOp([])
        else:
            finish(accs)
        if const_expr(grouped):
            tx.end(exit_gate)

    return gemm_launcher(gemm_kernel, bm, n_tiles * split, THREADS, "take" if a_scale or w_scale or w_int4 else "none")


