"""Flash-attention forward kernel body (FlyDSL): 16 or 32 query rows per wave.

Design notes
------------
A wave owns RG groups of 16 query rows (RG = 2 for 16-bit inputs up to D=128, else 1) and
walks the keys in blocks of BLOCK_N = 16 * N_TILES with an online softmax (running max `m`,
running sum `l`, fp32 accumulators). Both products run on 16x16 MFMAs (bf16/fp16: 16x16x16,
on gfx950 the full-rate 16x16x32; fp32: 16x16x4f32) in *transposed* form so that no data
crosses lanes except for the row max:

    Sᵀ = K · Qᵀ     A = K tile (16 keys x D),  B = Qᵀ (D x 16 rows)
    Oᵀ = Vᵀ · Pᵀ    A = Vᵀ (16 d x 16 keys),   B = Pᵀ (16 keys x 16 rows)

With lane = 16 * g + r, the Sᵀ accumulator of lane (g, r) holds row r, keys 4g..4g+3 of the
tile, which is exactly the Pᵀ B-operand layout of the second MFMA, and the Oᵀ accumulator
holds row r as well, so the per-row rescale by exp2(m_old - m_new) is lane-local. The row
max needs two xor exchanges (16, 32). The RG row groups of a wave share every K and V operand
read (A operands), so 32 rows per wave halve the LDS bytes and per-tile overhead per score.
Head-dim layouts, LDS staging and the tile plan: tiles.py; the specialization's build-time
constants (read as S.NAME): fwd_spec.py; the Q / K / V operand reads and the LDS tile copy's chunks:
operands.py; key ranges, causal positions, the user mask and a tile's scores: masking.py; MFMA steps,
the PV product, P's conversion, exp2 and the lane exchange: mma.py; the online-softmax steps:
softmax.py. What stays here is the code with dynamic control flow (FlyDSL rewrites the kernel
function's own branches and loops only): the tile copy, the KV loops and their step, the stores and
the split-KV merge.

With more than one wave the workgroup copies each K / V tile to LDS; the next tile's global
loads are issued before the current tile's math, and only if there is a next tile. Each tile
load goes through its own buffer descriptors (base at the tile's first key, bounds at the end
of key Sk - 1 of this head), so the per-thread offsets are loop-invariant and keys past Sk read
as zero (no address VALU in the loop). One wave reads K and V straight from global memory with
key indices clamped, every load of a tile issued before its first MFMA (HOIST_KV: one memory
round trip a tile). Out-of-range keys are masked to -inf and out-of-range rows not stored.

Vector work per score (the hot loop; translator_kernels.hotloop prices it):
  * tiles that need no mask (below Sk and below the block's first causal row, no user mask)
    run in a separate loop without any compare;
  * there the row max is taken over the raw scores and the scale goes into exp2's argument,
    exp2(c s - m) = one packed fma per two scores (c > 0: a negative scale flips Q's sign bits
    once in the prologue); masked tiles scale first, then mask;
  * the row max skips NaN canonicalization (a NaN score still reaches O through exp2 and l);
    gfx950 exchanges it with ds_bpermute (its generic shuffle lowering costs ~7 VALU a step);
  * unmasked tiles rescale O and l only when some row of the wave outgrows its reference max
    by more than RESCALE_TAU (log2 units), a wave-uniform branch (ballot): the loop carries
    the threshold (m_ref + TAU) / c, p = exp2(c s - m_ref) <= 2^TAU, and the steady state issues
    no alpha exp2 and none of the O multiplies (FlashAttention-4's conditional rescaling); the
    first unmasked tile of a row is peeled out of the loop and sets m_ref without the branch
    (it always ran there: m starts at -inf); masked tiles rescale every time (they are the few
    diagonal / tail tiles); the pieces are in softmax.py;
  * 16-bit inputs sum the row with one MFMA of a ones tile and the Pᵀ operand (ONES_L): no
    VALU adds, every element of that accumulator holds the full row sum, and l sums exactly
    the rounded p that weight V, so gfx942 may truncate P to bf16 (one v_perm per 2 values;
    the bias cancels in O / l); gfx950 has v_cvt_pk_bf16_f32.

Head dims 8..256: the tiles cover D rounded up to 16 (operands.py); the LDS padding columns are
zero-filled once, here.
Split KV (flash-decoding): `split` runs one workgroup per (query block, KV slice); each wave
writes its rows' fp32 partials (m, l in log2 units, unnormalized O), then lane 0 takes a ticket
(atomic add, acq_rel, agent scope: gemm/splitk.py's) on the int32 counter of its (batch, head,
query block, wave) region. The wave that draws nsplit - 1 arrived last: it zeroes the counter
(a completed launch leaves them all zero: no clearing launch) and merges its rows' slices in
slice order 0..nsplit-1 from W / WML (merge_rows: lanes over rows and head-dim columns, the
loads of a batch of slices in flight together, an online rescale). Who merges depends on
scheduling; what is added and in which order does not: the bits are the same run to run.

Rows whose keys are all masked end with l == 0 and are written as 0, as torch SDPA does.
Causal masking is SDPA's top-left aligned form: key k is visible to row q iff k <= q.
"""


import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl.expr import const_expr, gpu, range_constexpr, rocdl

from translator_kernels.attention import masking, mma, softmax
from translator_kernels.attention.fwd_spec import FwdSpec
from translator_kernels.attention.operands import Operands
from translator_kernels.attention.mma import elem, slice4, xor_addresses
from translator_kernels.attention.tiles import AFN, LOG2E
from translator_kernels.gemm.splitk import ticket


FLT_MAX = 3.4028234663852886e38


def gpu_barrier():
    gpu.barrier()


def make_attention_kernel(dtype: str, head_dim: int, causal: bool, mask_kind: int, mask_dtype: str,
                          num_waves: int, arch: str = "gfx942", softcap: bool = False, head_scale: bool = False,
                          split: bool = False, row_groups: int = 1, pos_causal: bool = False, sinks: bool = False,
                          sink_rows: bool = False, kv_dtype: str | None = None, key_start: bool = False):
    """Return the @flyc.jit launcher for one specialization (not cached here).

    pos_causal: key k is visible to query row i iff k <= P[i] (P: int32 positions read on the
    device, element stride p_s; a decode step on a static cache passes its cache positions), and
    the key loop ends at the block's largest position + 1 (the cache is read up to the current
    length, never past it). sinks: one learned logit per head (SK[h], natural units) joins every
    row's softmax denominator (gpt-oss); split KV adds it once, in the merge. sink_rows: the sink
    of row i is SK[h * sq + i] (packed GQA decode, gqa.py: the rows of a block are query heads).
    kv_dtype "f32" with a 16-bit dtype: K / V are fp32 in memory (a cache kept fp32 under
    precision="bf16") and each load is rounded to `dtype` in registers (round to nearest even, as
    torch's cast); one wave only (the LDS tile copy moves 16-bit chunks). key_start (no user mask): M holds
    each batch row's first visible key (int32, element stride m_sb; a left-padded batch's pads come first):
    the key loop starts there (masking.key_range), nothing is compared per score."""
    S = FwdSpec(dtype, head_dim, causal, mask_kind, mask_dtype, num_waves, arch, softcap, row_groups, kv_dtype)

    @fx.struct
    class KVStage:
        k: fx.Array[S.Elem, max(1, S.BLOCK_N * S.LSTR), 16]
        v: fx.Array[S.Elem, max(1, S.BLOCK_N * S.LSTR if S.VTR else S.D * S.VSTR), 16]

    @flyc.kernel(known_block_size=[S.THREADS, 1, 1])
    def attention_fwd_kernel(
        Q: fx.Tensor, K: fx.Tensor, V: fx.Tensor, O: fx.Tensor, M: fx.Tensor, HS: fx.Tensor,
        W: fx.Tensor, WML: fx.Tensor, P: fx.Tensor, SK: fx.Tensor, CNT: fx.Tensor,
        sq: fx.Int32, sk: fx.Int32, group: fx.Int32, c_qk: fx.Float32, cap: fx.Float32,
        nq: fx.Int32, chunk: fx.Int32, nh: fx.Int32, nsplit: fx.Int32,
        q_sb: fx.Int32, q_sh: fx.Int32, q_ss: fx.Int32,
        k_sb: fx.Int32, k_sh: fx.Int32, k_ss: fx.Int32,
        v_sb: fx.Int32, v_sh: fx.Int32, v_ss: fx.Int32,
        o_sb: fx.Int32, o_sh: fx.Int32, o_ss: fx.Int32,
        m_sb: fx.Int32, m_sh: fx.Int32, m_sq: fx.Int32, m_sk: fx.Int32, p_s: fx.Int32,
    ):
        tid = fx.Int32(fx.thread_idx.x)
        qblk = fx.Int32(fx.block_idx.x)
        if const_expr(split):  # block_idx.x = query block + nq * KV split
            part = qblk // nq
            qblk = qblk % nq
        h = fx.Int32(fx.block_idx.y)
        b = fx.Int32(fx.block_idx.z)
        lane = tid % 64
        wave = tid // 64
        r = lane % 16
        g = lane // 16
        kvh = h // group

        q_ptr = fx.get_iter(fx.rocdl.make_buffer_tensor(Q))
        k_ptr = fx.get_iter(fx.rocdl.make_buffer_tensor(K))
        v_ptr = fx.get_iter(fx.rocdl.make_buffer_tensor(V))
        o_ptr = fx.get_iter(fx.rocdl.make_buffer_tensor(O))
        m_ptr = fx.get_iter(fx.rocdl.make_buffer_tensor(M))
        if const_expr(head_scale):  # per-head multiplier of the scores (cosine attention)
            hs_ptr = fx.get_iter(fx.rocdl.make_buffer_tensor(HS))
            c_qk = c_qk * fx.Float32(fx.ptr_load(hs_ptr + fx.Int64(h), result_type=fx.Float32))

        q_base = b * q_sb + h * q_sh
        k_base = b * k_sb + kvh * k_sh
        v_base = b * v_sb + kvh * v_sh
        o_base = b * o_sb + h * o_sh
        m_base = b * m_sb + h * m_sh

        zero_i = fx.Int32(0)
        neg_inf = fx.Float32(float("-inf"))
        zero_f = fx.Float32(0.0)
        sk_last = sk - 1

        rows = [qblk * S.BLOCK_M + wave * (16 * S.RG) + 16 * u + r for u in range_constexpr(S.RG)]
        rows_c = [(rw < sq).select(rw, sq - 1) for rw in rows]
        kv_lo = None
        if const_expr(key_start):  # this batch row's first key: M is the int32 key starts
            kv_lo = masking.key_start(m_ptr, b * m_sb)
        pos_rows = p_lo = p_hi = None
        if const_expr(pos_causal):  # this lane's rows' positions, the block's smallest / largest one
            pos_rows, p_lo, p_hi = masking.causal_positions(S, P, p_s, rows_c, qblk, lane, sq)

        xaddr = xor_addresses(lane) if const_expr(S.BPERM) else None

        def lane_xor(x, k):
            return mma.lane_xor(x, k, xaddr)

        def mfma(a, b_, c):
            return mma.mfma(dtype, a, b_, c)

        def mfma32(a, b_, c):
            return mma.mfma32(dtype, a, b_, c)

        if const_expr(S.USE_LDS):
            stage = fx.SharedAllocator().allocate(KVStage).peek()
            lds_k = stage.k.ptr
            lds_v = stage.v.ptr
        ops = Operands(S, dtype, r, g, sk, sk_last, k_ptr, k_base, k_ss, v_ptr, v_base, v_ss,
                       lds_k if S.USE_LDS else None, lds_v if S.USE_LDS else None)
        # plain names for the calls inside dynamic branches: FlyDSL's rewrite of a branch carries the object of
        # a method it calls (ops.f(...)) as branch state
        load_vec, lds_store_chunk = ops.load_vec, ops.lds_store_chunk

        # per-thread invariants of the cooperative tile copy: chunk c of K is row c // ROW_CH,
        # column (c % ROW_CH) * CE; of V key c % BLOCK_N, column (c // BLOCK_N) * CE (consecutive
        # lanes take consecutive keys of one column chunk, so the transposed LDS writes of a
        # wave land on consecutive addresses). The offsets inside a tile are fixed per thread;
        # each tile gets its own buffer descriptors (base at its first key, num_records ending
        # with key Sk - 1 of this head), so keys past Sk read as zero with no VALU per load.
        tile_rows = []
        for it in range_constexpr(S.CH_ITERS):
            c = tid + it * S.THREADS
            c = c if const_expr(S.CH_EXACT) else (c < S.TILE_CH).select(c, S.TILE_CH - 1)
            if const_expr(S.VTR):  # V copied like K
                tile_rows.append(((c // S.ROW_CH) * k_ss + (c % S.ROW_CH) * S.CE,
                                  (c // S.ROW_CH) * v_ss + (c % S.ROW_CH) * S.CE))
            else:
                tile_rows.append(((c // S.ROW_CH) * k_ss + (c % S.ROW_CH) * S.CE,
                                  (c % S.BLOCK_N) * v_ss + (c // S.BLOCK_N) * S.CE))
        k_glob = fx.get_iter(K)
        v_glob = fx.get_iter(V)

        def gload_tile(kb):
            """Cooperative global loads of the K and V tiles at key kb: CH_ITERS 16-byte chunks
            per thread and tensor (keys past Sk read zero)."""
            ks, vs = [], []
            k_tile = ops.tile_desc(k_glob, k_base, kb, k_ss)
            v_tile = ops.tile_desc(v_glob, v_base, kb, v_ss)
            for it in range_constexpr(S.CH_ITERS):
                k_off, v_off = tile_rows[it]
                if const_expr(S.CH_EXACT or it < S.CH_ITERS - 1):
                    ks.append(load_vec(k_tile, k_off, S.CE))
                    vs.append(load_vec(v_tile, v_off, S.CE))
                    continue
                # the last round has fewer chunks than threads: the others load nothing
                kx = fx.Vector.filled(S.CE, 0.0, S.Elem)
                vx = fx.Vector.filled(S.CE, 0.0, S.Elem)
                if tid + it * S.THREADS < S.TILE_CH:
                    kx = fx.Vector(load_vec(k_tile, k_off, S.CE))
                    vx = fx.Vector(load_vec(v_tile, v_off, S.CE))
                ks.append(kx)
                vs.append(vx)
            return ks, vs

        def lds_store_tile(ks, vs):
            for it in range_constexpr(S.CH_ITERS):
                c = tid + it * S.THREADS
                if const_expr(S.CH_EXACT):
                    lds_store_chunk(ks[it], vs[it], c)
                else:
                    if c < S.TILE_CH:
                        lds_store_chunk(ks[it], vs[it], c)

        # ---- Q: this lane's rows (RAW_MAX: a negative scale flips Q's sign bits once, c_qk > 0) ----
        q_chunks, c_qk, inv_c = ops.q_rows(q_ptr, q_base, q_ss, rows_c, c_qk, zero_f)
        if const_expr(S.USE_LDS and S.PADDED):
            # the padding columns of the LDS tiles are never written by the tile copies: zero them
            # once (the loop's first barrier orders this before any read)
            pad = S.D - S.DV
            for it in range_constexpr(S.PAD_ITERS):
                e = tid + it * S.THREADS
                if e < S.PAD_EL:
                    fx.ptr_store(fx.Float32(0.0).to(S.Elem), lds_k + fx.Int64((e // pad) * S.LSTR + S.DV + e % pad))
                    if const_expr(S.VTR):
                        fx.ptr_store(fx.Float32(0.0).to(S.Elem), lds_v + fx.Int64((e // pad) * S.LSTR + S.DV + e % pad))
                    else:
                        fx.ptr_store(fx.Float32(0.0).to(S.Elem),
                                     lds_v + fx.Int64((S.DV + e // S.BLOCK_N) * S.VSTR + e % S.BLOCK_N))

        # ---- key range: [kv_start, kv_end), unmasked whole tiles in [kv_start, full_end) ----
        kv_start, kv_end, full_end = masking.key_range(S, causal, pos_causal, split, mask_kind, qblk, sk, zero_i,
                                                       p_lo, p_hi, part if split else None, chunk, kv_lo)

        # loop state: m per group, l per group, Oᵀ tiles of group 0, of group 1, ..., prefetched K / V
        init = ([neg_inf] * S.RG + ([fx.Vector.filled(4, 0.0, fx.Float32)] * S.RG if S.ONES_L else [zero_f] * S.RG)
                + [fx.Vector.filled(4, 0.0, fx.Float32) for _ in range_constexpr(S.RG * S.VN)])
        if const_expr(S.USE_LDS):
            pk, pv = gload_tile(kv_start)
            init = init + pk + pv
        scores = masking.Scores(S, causal, pos_causal, mask_kind, softcap, g, sk, sk_last, m_ptr, m_base, m_sq, m_sk,
                                rows, rows_c, pos_rows, c_qk, cap, neg_inf)

        def kv_step(kb, state, masked, first=False):
            """One KV tile: scores, online softmax, Oᵀ update; `masked` adds the bounds, causal and
            user-mask checks (only the tiles that straddle them need those); `first` (an unmasked
            tile that starts the row: O = l = 0) sets the reference max with no rescale branch."""
            m_old = state[:S.RG]
            l_old = state[S.RG:2 * S.RG]
            o_acc = [[state[2 * S.RG + u * S.VN + i] for i in range_constexpr(S.VN)] for u in range_constexpr(S.RG)]
            ST = 2 * S.RG + S.RG * S.VN        # first prefetch entry of the state
            nxt = []
            if const_expr(S.USE_LDS):
                # stage the prefetched tile, then prefetch the next one while computing
                gpu_barrier()
                lds_store_tile([state[ST + i] for i in range_constexpr(S.CH_ITERS)],
                               [state[ST + S.CH_ITERS + i] for i in range_constexpr(S.CH_ITERS)])
                gpu_barrier()
                # prefetch the next tile, if there is one (the last tile's would be wasted bytes)
                nxt = [state[ST + i] for i in range_constexpr(2 * S.CH_ITERS)]
                if kb + S.BLOCK_N < kv_end:
                    nk, nv = gload_tile(kb + S.BLOCK_N)
                    nxt = nk + nv

            def tile_math(o_acc, mvals=None):
                # one wave (no LDS): every K and V load of the tile is issued before the first MFMA, so
                # the tile waits one memory round trip, not one per 16-key step (HOIST_KV)
                k_pre = v_pre = None
                if const_expr(S.HOIST_KV):
                    k_pre = [ops.k_operand(kb, t) for t in range_constexpr(S.N_TILES)]
                    v_pre = [[ops.v_operand(kb, t, j) for j in range_constexpr(4)] for t in range_constexpr(S.N_TILES)]
                # ---- Sᵀ = K Qᵀ per 16-key tile, one K operand read for all row groups ----
                s_tiles = [[] for _ in range_constexpr(S.RG)]
                for t in range_constexpr(S.N_TILES):
                    k_chunks = k_pre[t] if const_expr(S.HOIST_KV) else ops.k_operand(kb, t)
                    for u in range_constexpr(S.RG):
                        acc = fx.Vector.filled(4, 0.0, fx.Float32)
                        if const_expr(S.QK32):
                            for s in range_constexpr(S.D // 32):
                                acc = mfma32(k_chunks[s], q_chunks[u][s], acc)
                        else:
                            for s in range_constexpr(S.KSTEPS):
                                if const_expr(S.is_f32):
                                    acc = mfma(elem(k_chunks, S.QC, s), elem(q_chunks[u], S.QC, s), acc)
                                else:
                                    acc = mfma(slice4(k_chunks, S.QC, 4 * s), slice4(q_chunks[u], S.QC, 4 * s), acc)
                        s_tiles[u].append(scores.score_tile(fx.Vector(acc), kb, t, u, masked,
                                                     None if mvals is None else mvals[u]))

                # ---- online softmax, per row group (softmax.py) ----
                raw = not masked and S.RAW_MAX  # scores unscaled (score_tile): m = max(m_old, c max(s))
                # raw: this lane's max; masked: the row max (exchanged across the 4 lane groups)
                m_tile = [softmax.lane_max(s_tiles[u], s_tiles[u][0][0]) if raw else
                          softmax.row_max(softmax.lane_max(s_tiles[u], m_old[u]), lane_xor) for u in range_constexpr(S.RG)]
                if const_expr(raw and first):
                    l_base = l_old
                    m_new, thr_new = softmax.first_tile(m_tile, c_qk, inv_c, lane_xor)
                elif const_expr(raw):
                    # a wave-uniform branch the steady state skips (the rescale, with the row-max exchange)
                    thr = state[len(state) - S.RG:]
                    any_grow = softmax.rescale_wanted(m_tile, thr)
                    neg_m = [m_old[u] for u in range_constexpr(S.RG)]
                    thr_new = [thr[u] for u in range_constexpr(S.RG)]
                    l_base = [l_old[u] for u in range_constexpr(S.RG)]
                    o_flat = [o_acc[u][i] for u in range_constexpr(S.RG) for i in range_constexpr(S.VN)]
                    if any_grow:
                        neg_m, thr_new, l_base, o_flat = softmax.rescale(m_tile, m_old, l_old, o_flat, c_qk, inv_c, lane_xor,
                                                                         S.ONES_L)
                    o_acc = [[o_flat[u * S.VN + i] for i in range_constexpr(S.VN)] for u in range_constexpr(S.RG)]
                    m_new = neg_m
                else:
                    neg_m, l_base, o_acc = softmax.masked_tile(m_tile, m_old, l_old, o_acc, S.ONES_L)
                    m_new = m_tile
                if const_expr(raw):
                    neg_m = [fx.Vector.from_elements([m_new[u]] * 4, fx.Float32) for u in range_constexpr(S.RG)]
                p_tiles = [softmax.probabilities(s_tiles[u], neg_m[u], c_qk, raw) for u in range_constexpr(S.RG)]
                # + sum p: 16-bit inputs add it with the ones MFMA of the PV step
                l_new = [l_base[u] if S.ONES_L else softmax.row_sum(l_base[u], p_tiles[u]) for u in range_constexpr(S.RG)]

                # ---- Oᵀ += Vᵀ Pᵀ, one V operand for all row groups (and l += the ones-tile MFMA) ----
                o_acc, l_new = mma.pv_update(p_tiles, o_acc, l_new, dtype=dtype, trunc=S.TRUNC_P, pv32=S.PV32,
                                             vt_operand=ops.vt_operand if S.VT else None, vc=S.VC, ones_l=S.ONES_L,
                                             v_rows=(lambda t: v_pre[t]) if S.HOIST_KV else (lambda t: [ops.v_operand(kb, t, j) for j in range_constexpr(4)]))

                return m_new + l_new + [x for u in range_constexpr(S.RG) for x in o_acc[u]] + (thr_new if raw else [])

            raw = not masked and S.RAW_MAX
            if const_expr(masked and causal and S.SKIP_DEAD):
                # a causal diagonal tile whose first key is past this wave's last row holds no key
                # any of its rows sees: the wave only stages the tile (LDS) and keeps its state
                out = list(state[:2 * S.RG + S.RG * S.VN])
                # this wave's last query row, made here (wave-uniform: a scalar), not kept live
                # across the unmasked loop
                wave_last = qblk * S.BLOCK_M + (16 * S.RG - 1) + fx.Int32(
                    rocdl.readfirstlane(ir.IntegerType.get_signless(32), wave.ir_value())) * (16 * S.RG)
                if kb <= wave_last:
                    out = tile_math(o_acc)
            elif const_expr(masked and S.KEY_SKIP):
                # a tile the user mask drops for every row of the wave: no K / V loads, state kept
                # (exact: its keys' weights are 0; a slice left empty stores m = -inf, l = 0, O = 0)
                mvals, live = scores.mask_tile(kb)
                out = list(state[:2 * S.RG + S.RG * S.VN])
                if live:
                    out = tile_math(o_acc, mvals)
            else:
                out = tile_math(o_acc)
            return out[:2 * S.RG + S.RG * S.VN] + nxt + out[2 * S.RG + S.RG * S.VN:]

        # the unmasked loop (RAW_MAX) carries -m_ref (+inf: no reference yet) and the rescale
        # thresholds (-inf) at the end of its state; the masked loop takes m_ref
        init_full = init
        if const_expr(S.RAW_MAX):
            init_full = [fx.Float32(float("inf"))] * S.RG + init[S.RG:] + [neg_inf] * S.RG
        # counted in tiles from 0 with step 1: LLVM then tests the exit with != (a scalar compare)
        # instead of a 64-bit < on the VALU
        # The first unmasked tile is peeled (a loop of at most one trip): it sets each row's reference
        # max, so the rescale branch runs only when a max outgrows it, never for a row's first tile
        n_full = (full_end - kv_start) // S.BLOCK_N
        res_full = init_full
        if const_expr(S.RAW_MAX):
            n_peel = (n_full > zero_i).select(fx.Int32(1), zero_i)
            for _p, state in range(fx.Index(0), fx.Index(n_peel), fx.Index(1), init=init_full):
                res_full = yield kv_step(kv_start, state, False, first=True)
            kv_start = kv_start + n_peel * S.BLOCK_N
            n_full = n_full - n_peel
        for it_idx, state in range(fx.Index(0), fx.Index(n_full), fx.Index(1), init=res_full):
            res_full = yield kv_step(kv_start + fx.Int32(it_idx) * S.BLOCK_N, state, False)
        if const_expr(S.RAW_MAX):
            res_full = [zero_f - res_full[u] for u in range_constexpr(S.RG)] + res_full[S.RG:len(res_full) - S.RG]
        for kb_idx, state in range(fx.Index(full_end), fx.Index(kv_end), fx.Index(S.BLOCK_N), init=res_full):
            results = yield kv_step(fx.Int32(kb_idx), state, True)

        def store_output(row, o_fin, inv_l):
            """O[row, d] = acc / l over this lane's d (see VT), real head-dim columns only."""
            if const_expr(S.VT):
                if row < sq:
                    for dt in range_constexpr(S.VN):
                        col = 16 * dt + 4 * g
                        for c in range_constexpr(4 // S.OC):
                            vals = [o_fin[dt][c * S.OC + e] * inv_l for e in range_constexpr(S.OC)]
                            out = fx.Vector.from_elements(vals, fx.Float32) if S.OC > 1 else fx.Float32(vals[0])
                            if const_expr(not S.is_f32):
                                out = out.to(S.Elem)
                            if const_expr(S.PADDED):
                                if col + c * S.OC < S.DV:
                                    fx.ptr_store(out, o_ptr + fx.Int64(o_base + row * o_ss + col + c * S.OC))
                            else:
                                fx.ptr_store(out, o_ptr + fx.Int64(o_base + row * o_ss + col + c * S.OC))
                return
            if row < sq:
                for i in range_constexpr(4):
                    col = (4 * g + i) * S.VN
                    off = o_base + row * o_ss + col
                    for c in range_constexpr(S.VN // S.VC):
                        vals = [o_fin[c * S.VC + e][i] * inv_l for e in range_constexpr(S.VC)]
                        if const_expr(S.VC == 1):
                            out = fx.Float32(vals[0])
                        else:
                            out = fx.Vector.from_elements(vals, fx.Float32)
                        if const_expr(not S.is_f32):
                            out = out.to(S.Elem)
                        if const_expr(S.PADDED):
                            if col + c * S.VC < S.DV:
                                fx.ptr_store(out, o_ptr + fx.Int64(off + c * S.VC))
                        else:
                            fx.ptr_store(out, o_ptr + fx.Int64(off + c * S.VC))

        def store_partials(row, o_fin, m, l_tot):
            """Split KV: fp32 unnormalized partials, W [B, H, nsplit, Sq, D] and WML [..., Sq, 2] =
            (m, l) in log2 units; an empty slice leaves m = -inf, l = 0, O = 0 (combine weight 0)."""
            prow = ((b * nh + h) * nsplit + part) * sq + row
            if row < sq:
                if g == 0:
                    fx.ptr_store(fx.Vector.from_elements([m, l_tot], fx.Float32), ml_ptr + fx.Int64(prow * 2))
                if const_expr(S.VT):
                    for dt in range_constexpr(S.VN):
                        fx.ptr_store(fx.Vector(o_fin[dt]), w_ptr + fx.Int64(prow * S.D + 16 * dt + 4 * g))
                for i in range_constexpr(0 if S.VT else 4):
                    off = prow * S.D + (4 * g + i) * S.VN
                    for c in range_constexpr(S.VN // S.WC):
                        vals = [o_fin[c * S.WC + e][i] for e in range_constexpr(S.WC)]
                        out = fx.Vector.from_elements(vals, fx.Float32) if S.WC > 1 else fx.Float32(vals[0])
                        fx.ptr_store(out, w_ptr + fx.Int64(off + c * S.WC))

        def merge_rows():
            """The last arriver's merge of this wave's rows below Sq: lanes over (row, MERGE_CPL head-dim
            columns), MERGE_RPP rows per pass; each pass folds the slices in batches of MERGE_SLICES whose
            loads (m, l and this lane's O columns of every slice of the batch) are all issued before any is
            used, so a batch costs one round trip, in slice order 0..nsplit-1 by an online rescale:
            M' = max(M, m_s), L = L exp2(M - M') + l_s exp2(m_s - M'), O likewise; out = O / L (sinks:
            O a / (L a + exp2(sink - max(M, sink))), a = exp2(M - max(M, sink))). A slot past nsplit
            re-reads the last slice with weight 0 (a cache hit on a GPU)."""
            first = (b * nh + h) * nsplit
            row0 = qblk * S.BLOCK_M + wave * (16 * S.RG)
            left = sq - row0
            left = (left < zero_i).select(zero_i, left)
            n_rows = (left < 16 * S.RG).select(left, fx.Int32(16 * S.RG))
            rr = lane // S.MERGE_LPR
            c0 = (lane % S.MERGE_LPR) * S.MERGE_CPL
            ml_ty = ir.VectorType.get([2], ir.F32Type.get())
            o_ty = ir.VectorType.get([4], ir.F32Type.get())
            n_pass = (n_rows + (S.MERGE_RPP - 1)) // S.MERGE_RPP
            n_batch = (nsplit + (S.MERGE_SLICES - 1)) // S.MERGE_SLICES
            for p_idx in range(fx.Index(0), fx.Index(n_pass), fx.Index(1)):
                pr = fx.Int32(p_idx) * S.MERGE_RPP + rr
                live = (rr < S.MERGE_RPP) & (pr < n_rows)
                row = row0 + live.select(pr, zero_i)  # a lane without a row reads row0's (n_rows > 0 here)
                for t_idx, st in range(fx.Index(0), fx.Index(n_batch), fx.Index(1),
                                       init=[neg_inf, zero_f] + [zero_f for _ in range_constexpr(S.MERGE_CPL)]):
                    s0 = fx.Int32(t_idx) * S.MERGE_SLICES
                    loads = []
                    for j in range_constexpr(S.MERGE_SLICES):
                        ok = s0 + j < nsplit
                        prow = (first + ok.select(s0 + j, nsplit - 1)) * sq + row
                        loads.append((ok, fx.Vector(fx.ptr_load(ml_ptr + fx.Int64(prow * 2), result_type=ml_ty)),
                                      [fx.Vector(fx.ptr_load(w_ptr + fx.Int64(prow * S.D + c0 + 4 * q), result_type=o_ty))
                                       for q in range_constexpr(S.MERGE_CPL // 4)]))
                    m_run, l_run = st[0], st[1]
                    o_run = [st[2 + i] for i in range_constexpr(S.MERGE_CPL)]
                    for ok, ml, o_s in loads:  # in slice order
                        m_s = ok.select(ml[0], neg_inf)
                        m_new = fx.arith.maximumf(m_run, m_s)
                        m_u = (m_new == neg_inf).select(zero_f, m_new)
                        a = fx.math.exp2(m_run - m_u, fastmath=AFN)
                        w = fx.math.exp2(m_s - m_u, fastmath=AFN)
                        l_run = l_run * a + ml[1] * w
                        o_run = [o_run[i] * a + o_s[i // 4][i % 4] * w for i in range_constexpr(S.MERGE_CPL)]
                        m_run = m_new
                    res = yield [m_run, l_run] + o_run
                m_all, l_all = res[0], res[1]
                if const_expr(sinks):
                    sink2 = sink_of(row)
                    m_top = fx.arith.maximumf(m_all, sink2)
                    m_top = (m_top == neg_inf).select(zero_f, m_top)
                    a = fx.math.exp2(m_all - m_top, fastmath=AFN)
                    den = l_all * a + fx.math.exp2(sink2 - m_top, fastmath=AFN)
                    inv = (den == zero_f).select(zero_f, a / den)
                else:
                    inv = (l_all == zero_f).select(zero_f, fx.Float32(1.0) / l_all)
                if live:
                    for oc in range_constexpr(S.MERGE_CPL // S.MERGE_OC):
                        vals = [res[2 + oc * S.MERGE_OC + e] * inv for e in range_constexpr(S.MERGE_OC)]
                        out = fx.Vector.from_elements(vals, fx.Float32) if S.MERGE_OC > 1 else fx.Float32(vals[0])
                        if const_expr(not S.is_f32):
                            out = out.to(S.Elem)
                        col = c0 + oc * S.MERGE_OC
                        if col < S.DV:
                            fx.ptr_store(out, o_ptr + fx.Int64(o_base + row * o_ss + col))

        def combine_splits():
            """In-launch split-KV combine (docs/attention.md): after its partial stores each wave takes a ticket
            of its (batch, head, query block, wave) region; the one that draws nsplit - 1 arrived last:
            it resets the counter (zero for the next launch) and merges the slices of its rows."""
            region = ((b * nh + h) * nq + qblk) * num_waves + wave
            if ticket(CNT, region, lane) == nsplit - 1:
                if lane == 0:
                    fx.ptr_store(fx.Int32(0), fx.get_iter(fx.rocdl.make_buffer_tensor(CNT)) + fx.Int64(region))
                merge_rows()

        # ---- epilogue, per row group: O[row, (4g+i)*VN + dt] = acc_dt[i] / l ----
        if const_expr(split):
            w_ptr = fx.get_iter(fx.rocdl.make_buffer_tensor(W))
            ml_ptr = fx.get_iter(fx.rocdl.make_buffer_tensor(WML))
        if const_expr(sinks):  # this head's (sink_rows: this row's) sink logit in log2 units
            sk_ptr = fx.get_iter(fx.rocdl.make_buffer_tensor(SK))

            def sink_of(row):
                at = h
                if const_expr(sink_rows):
                    at = h * sq + (row < sq).select(row, sq - 1)
                return fx.Float32(fx.ptr_load(sk_ptr + fx.Int64(at), result_type=fx.Float32)) * LOG2E
        for u in range_constexpr(S.RG):
            l_part = results[S.RG + u]
            if const_expr(S.ONES_L):  # the ones MFMA summed the row over all lanes already
                l_tot = fx.Vector(l_part)[0]
            else:
                l_tot = l_part + fx.Float32(fx.gpu.shuffle_xor(l_part, 16, 64))
                l_tot = l_tot + fx.Float32(fx.gpu.shuffle_xor(l_tot, 32, 64))
            o_fin = [fx.Vector(results[2 * S.RG + u * S.VN + dt]) for dt in range_constexpr(S.VN)]
            if const_expr(split):
                store_partials(rows[u], o_fin, results[u], l_tot)
            elif const_expr(sinks):
                # the sink joins the denominator: with M = max(m, sink), O / l becomes
                # O a / (l a + exp2(sink - M)), a = exp2(m - M) (a row with no key: O = 0, output 0)
                m_u = fx.Float32(results[u])
                sink2 = sink_of(rows[u])
                m_top = fx.arith.maximumf(m_u, sink2)
                a = fx.math.exp2(m_u - m_top, fastmath=AFN)
                den = l_tot * a + fx.math.exp2(sink2 - m_top, fastmath=AFN)
                store_output(rows[u], o_fin, a / den)
            else:
                store_output(rows[u], o_fin, (l_tot == zero_f).select(zero_f, fx.Float32(1.0) / l_tot))
        if const_expr(split):
            combine_splits()

    @flyc.jit
    def launch(Q: fx.Tensor, K: fx.Tensor, V: fx.Tensor, O: fx.Tensor, M: fx.Tensor, HS: fx.Tensor,
               W: fx.Tensor, WML: fx.Tensor, P: fx.Tensor, SK: fx.Tensor, CNT: fx.Tensor,
               sq: fx.Int32, sk: fx.Int32, group: fx.Int32, c_qk: fx.Float32, cap: fx.Float32,
               nq: fx.Int32, chunk: fx.Int32, nh: fx.Int32, nsplit: fx.Int32,
               q_sb: fx.Int32, q_sh: fx.Int32, q_ss: fx.Int32,
               k_sb: fx.Int32, k_sh: fx.Int32, k_ss: fx.Int32,
               v_sb: fx.Int32, v_sh: fx.Int32, v_ss: fx.Int32,
               o_sb: fx.Int32, o_sh: fx.Int32, o_ss: fx.Int32,
               m_sb: fx.Int32, m_sh: fx.Int32, m_sq: fx.Int32, m_sk: fx.Int32, p_s: fx.Int32,
               grid_x: fx.Int32, grid_y: fx.Int32, grid_z: fx.Int32,
               stream: fx.Stream = fx.Stream(None)):
        attention_fwd_kernel(Q, K, V, O, M, HS, W, WML, P, SK, CNT, sq, sk, group, c_qk, cap, nq, chunk, nh, nsplit, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss,
                             v_sb, v_sh, v_ss, o_sb, o_sh, o_ss, m_sb, m_sh, m_sq, m_sk, p_s).launch(
            grid=(grid_x, grid_y, grid_z), block=(S.THREADS, 1, 1), stream=stream)

    return launch
