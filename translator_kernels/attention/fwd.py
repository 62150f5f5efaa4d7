"""Flash-attention forward kernel body (FlyDSL), one wave per 16 query rows.

Design notes
------------
Each wave owns 16 query rows and walks the keys in blocks of BLOCK_N = 16 * N_TILES with an
online softmax (running max `m`, running sum `l`, fp32 accumulators). Both products run on
16x16 MFMAs (bf16/fp16: 16x16x16, fp32: 16x16x4f32) in *transposed* form so that no data
ever crosses lanes except for the row max:

    Sᵀ = K · Qᵀ     A = K tile (16 keys x D),  B = Qᵀ (D x 16 rows)
    Oᵀ = Vᵀ · Pᵀ    A = Vᵀ (16 d x 16 keys),   B = Pᵀ (16 keys x 16 rows)

With lane = 16 * g + r, the Sᵀ accumulator of lane (g, r) holds row r, keys 4g..4g+3 of the
tile, which is exactly the Pᵀ B-operand layout of the second MFMA, and the Oᵀ accumulator
holds row r as well, so the per-row rescale by exp2(m_old - m_new) is lane-local. The row
max needs two xor-shuffles (16, 32); the row sum stays per lane until the epilogue.

Contractions may permute their K index freely, so the head dimension is laid out to make
every global access a contiguous per-lane vector:
  * QKᵀ: lane group g covers d in [g*D/4, (g+1)*D/4); k-step s reads 4 (or 1, fp32) of them.
  * PV:  output tile dt, MFMA row m stands for d = m * D/16 + dt, so a lane reads and
         writes D/16 contiguous elements of one V / O row.
K and V rows are read straight from global memory (L1/L2 serve the waves of a workgroup);
there is no LDS. Row and key indices are clamped into range so every access is in bounds;
out-of-range keys are masked to -inf and out-of-range rows are not stored.

Rows whose keys are all masked end with l == 0 and are written as 0, as torch SDPA does.
Causal masking is SDPA's top-left aligned form: key k is visible to row q iff k <= q.
"""


import math

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl.expr import const_expr, gpu, range_constexpr, rocdl

LOG2E = 1.4426950408889634
AFN = fx.arith.FastMathFlags.afn
# gfx950 16x16x32 MFMA for PV too: flysim-verified, but gathering 8 V keys per operand costs
# ~56 VGPRs (bf16 D=128: 170 vs 114, 2 vs 4 waves/SIMD), so it is off by default
PV32_ON = False

# mask kinds (constexpr)
MASK_NONE, MASK_BOOL, MASK_ADD = 0, 1, 2

_FX_DTYPES = {"f32": fx.Float32, "bf16": fx.BFloat16, "f16": fx.Float16}
_ELEM_BYTES = {"f32": 4, "bf16": 2, "f16": 2}


def gpu_barrier():
    gpu.barrier()


def _ir_elem(name: str):
    return {"f32": ir.F32Type.get, "bf16": ir.BF16Type.get, "f16": ir.F16Type.get}[name]()


def _chunk(n: int, elem_bytes: int) -> int:
    """Largest power-of-two chunk (<= 16 bytes) that divides n elements."""
    c = 16 // elem_bytes
    while c > 1 and n % c:
        c //= 2
    return c


def kernel_config(dtype: str, head_dim: int, num_waves: int) -> dict:
    """Static tile parameters of one specialization (also used by bench/isa_attention.py)."""
    eb = _ELEM_BYTES[dtype]
    use_lds = num_waves > 1
    # keys per iteration: register-bounded without LDS; with LDS an 8 KB K tile (17 KB of K+V
    # staging with padding) so that three workgroups fit the 64 KB LDS of a gfx942 CU
    budget = 8192 if use_lds else 16384
    n_tiles = max(1, min(4, budget // (16 * head_dim * eb)))
    block_n = 16 * n_tiles
    kstride = head_dim + 16 // eb          # padded LDS row: conflict-free 16-byte row reads
    return dict(
        n_tiles=n_tiles,
        block_n=block_n,
        block_m=16 * num_waves,
        threads=64 * num_waves,
        use_lds=use_lds,
        lds_stride=kstride,
        lds_bytes=2 * block_n * kstride * eb if use_lds else 0,
    )


def make_attention_kernel(dtype: str, head_dim: int, causal: bool, mask_kind: int, mask_dtype: str,
                          num_waves: int, arch: str = "gfx942"):
    """Return the @flyc.jit launcher for one specialization (not cached here)."""
    D = head_dim
    is_f32 = dtype == "f32"
    eb = _ELEM_BYTES[dtype]
    cfg = kernel_config(dtype, D, num_waves)
    N_TILES, BLOCK_N, BLOCK_M, THREADS = cfg["n_tiles"], cfg["block_n"], cfg["block_m"], cfg["threads"]
    QN = D // 4                      # d elements per lane for Q / K rows
    QC = _chunk(QN, eb)              # load chunk (elements)
    VN = D // 16                     # d elements per lane for V / O rows (= number of Oᵀ tiles)
    VC = _chunk(VN, eb)
    KSTEPS = D // 4 if is_f32 else D // 16
    # gfx950: 16x16x32 bf16/f16 MFMA (8 k-elements per lane) for QKᵀ when a lane's D/4 slice
    # splits into 8-element steps, and for PV over pairs of 16-key tiles
    QK32 = arch.startswith("gfx950") and not is_f32 and (D // 4) % 8 == 0
    PV32 = arch.startswith("gfx950") and not is_f32 and N_TILES % 2 == 0 and PV32_ON
    Elem = _FX_DTYPES[dtype]
    MElem = _FX_DTYPES.get(mask_dtype, fx.Float32)
    USE_LDS, LSTR = cfg["use_lds"], cfg["lds_stride"]
    CE = 16 // eb                    # elements per 16-byte cooperative chunk
    ROW_CH = D // CE                 # chunks per K/V row
    TILE_CH = BLOCK_N * ROW_CH       # chunks per K (or V) tile
    CH_ITERS = -(-TILE_CH // THREADS)
    CH_EXACT = TILE_CH % THREADS == 0

    @fx.struct
    class KVStage:
        k: fx.Array[Elem, max(1, BLOCK_N * LSTR), 16]
        v: fx.Array[Elem, max(1, BLOCK_N * LSTR), 16]

    def f32v4():
        return ir.VectorType.get([4], ir.F32Type.get())

    @flyc.kernel(known_block_size=[THREADS, 1, 1])
    def attention_fwd_kernel(
        Q: fx.Tensor, K: fx.Tensor, V: fx.Tensor, O: fx.Tensor, M: fx.Tensor,
        sq: fx.Int32, sk: fx.Int32, group: fx.Int32, c_qk: fx.Float32,
        q_sb: fx.Int32, q_sh: fx.Int32, q_ss: fx.Int32,
        k_sb: fx.Int32, k_sh: fx.Int32, k_ss: fx.Int32,
        v_sb: fx.Int32, v_sh: fx.Int32, v_ss: fx.Int32,
        o_sb: fx.Int32, o_sh: fx.Int32, o_ss: fx.Int32,
        m_sb: fx.Int32, m_sh: fx.Int32, m_sq: fx.Int32, m_sk: fx.Int32,
    ):
        tid = fx.Int32(fx.thread_idx.x)
        qblk = fx.Int32(fx.block_idx.x)
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

        q_base = b * q_sb + h * q_sh
        k_base = b * k_sb + kvh * k_sh
        v_base = b * v_sb + kvh * v_sh
        o_base = b * o_sb + h * o_sh
        m_base = b * m_sb + h * m_sh

        zero_i = fx.Int32(0)
        neg_inf = fx.Float32(float("-inf"))
        zero_f = fx.Float32(0.0)
        sk_last = sk - 1

        row = qblk * BLOCK_M + wave * 16 + r
        row_c = (row < sq).select(row, sq - 1)

        def load_vec(ptr, off, n):
            if const_expr(n == 1):  # LLVM cannot legalize a <1 x bf16> buffer load
                x = fx.ptr_load(ptr + fx.Int64(off), result_type=Elem)
                return fx.Vector.from_elements([x], Elem)
            return fx.ptr_load(ptr + fx.Int64(off), result_type=ir.VectorType.get([n], _ir_elem(dtype)))

        def load_chunks(ptr, off, total, chunk):
            return [load_vec(ptr, off + c * chunk, chunk) for c in range_constexpr(total // chunk)]

        def elem(chunks, chunk, idx):
            return fx.Vector(chunks[idx // chunk])[idx % chunk]

        def slice4(chunks, chunk, start):
            v = fx.Vector(chunks[start // chunk])
            if const_expr(chunk == 4):
                return v
            o = start % chunk
            return v.shuffle(v, [o, o + 1, o + 2, o + 3])

        def exp2(x):
            """Hardware v_exp_f32 (afn: no device-library call); exp2(-inf) = 0."""
            return fx.math.exp2(x, fastmath=AFN)

        def mfma(a, b_, c):
            """One 16x16 MFMA step: fp32 16x16x4 (scalar operands) or 16x16x16 (4-vectors)."""
            if const_expr(is_f32):
                op = rocdl.mfma_f32_16x16x4f32(f32v4(), fx.Float32(a).ir_value(), fx.Float32(b_).ir_value(),
                                               fx.Vector(c).ir_value(), 0, 0,
                                               ir.Attribute.parse("#rocdl<mfma_perm_b none>"))
                return fx.Vector(op.result)
            if const_expr(dtype == "bf16"):
                a16 = fx.Vector(a).bitcast(fx.Int16)
                b16 = fx.Vector(b_).bitcast(fx.Int16)
                return fx.Vector(rocdl.mfma_f32_16x16x16bf16_1k(f32v4(), [a16, b16, c, 0, 0, 0]))
            return fx.Vector(rocdl.mfma_f32_16x16x16f16(f32v4(), [a, b_, c, 0, 0, 0]))

        if const_expr(USE_LDS):
            stage = fx.SharedAllocator().allocate(KVStage).peek()
            lds_k = stage.k.ptr
            lds_v = stage.v.ptr

        def gload_tile(kb):
            """Cooperative global loads of the K and V tiles at key kb: CH_ITERS 16-byte chunks
            per thread and tensor (keys clamped in range)."""
            ks, vs = [], []
            for it in range_constexpr(CH_ITERS):
                c = tid + it * THREADS
                c = c if const_expr(CH_EXACT) else (c < TILE_CH).select(c, TILE_CH - 1)
                key = kb + c // ROW_CH
                key = (key < sk).select(key, sk_last)
                col = (c % ROW_CH) * CE
                ks.append(load_vec(k_ptr, k_base + key * k_ss + col, CE))
                vs.append(load_vec(v_ptr, v_base + key * v_ss + col, CE))
            return ks, vs

        def lds_store_tile(ks, vs):
            for it in range_constexpr(CH_ITERS):
                c = tid + it * THREADS
                off = (c // ROW_CH) * LSTR + (c % ROW_CH) * CE
                if const_expr(CH_EXACT):
                    fx.ptr_store(ks[it], lds_k + fx.Int64(off))
                    fx.ptr_store(vs[it], lds_v + fx.Int64(off))
                else:
                    if c < TILE_CH:
                        fx.ptr_store(ks[it], lds_k + fx.Int64(off))
                        fx.ptr_store(vs[it], lds_v + fx.Int64(off))

        def lds_chunks(ptr, off, total, chunk):
            ty = ir.VectorType.get([chunk], _ir_elem(dtype))
            if const_expr(chunk == 1):
                return [fx.Vector.from_elements([fx.ptr_load(ptr + fx.Int64(off + c), result_type=Elem)], Elem)
                        for c in range_constexpr(total)]
            return [fx.ptr_load(ptr + fx.Int64(off + c * chunk), result_type=ty)
                    for c in range_constexpr(total // chunk)]

        def k_operand(kb, t):
            """This lane's K row (key kb + 16t + r), d in [g*QN, (g+1)*QN)."""
            if const_expr(USE_LDS):
                return lds_chunks(lds_k, (16 * t + r) * LSTR + g * QN, QN, QC)
            key = kb + 16 * t + r
            key_c = (key < sk).select(key, sk_last)
            return load_chunks(k_ptr, k_base + key_c * k_ss + g * QN, QN, QC)

        def v_operand(kb, t, j):
            """V row of key kb + 16t + 4g + j, d in [r*VN, (r+1)*VN)."""
            if const_expr(USE_LDS):
                return lds_chunks(lds_v, (16 * t + 4 * g + j) * LSTR + r * VN, VN, VC)
            key = kb + 16 * t + 4 * g + j
            key_c = (key < sk).select(key, sk_last)
            return load_chunks(v_ptr, v_base + key_c * v_ss + r * VN, VN, VC)

        def mfma32(a, b_, c):
            """gfx950 16x16x32 step: lane (g, r) supplies k = 8g .. 8g+7 as an 8-vector."""
            if const_expr(dtype == "bf16"):
                return fx.Vector(rocdl.mfma_f32_16x16x32_bf16(f32v4(), [a, b_, c, 0, 0, 0]))
            return fx.Vector(rocdl.mfma_f32_16x16x32_f16(f32v4(), [a, b_, c, 0, 0, 0]))

        # ---- Q: this lane's row, d in [g*QN, (g+1)*QN) ----
        q_chunks = load_chunks(q_ptr, q_base + row_c * q_ss + g * QN, QN, QC)

        # ---- key range ----
        kv_end = sk
        if const_expr(causal):
            blk_end = qblk * BLOCK_M + BLOCK_M
            kv_end = (blk_end < sk).select(blk_end, sk)

        init = [neg_inf, zero_f] + [fx.Vector.filled(4, 0.0, fx.Float32) for _ in range_constexpr(VN)]
        if const_expr(USE_LDS):
            pk, pv = gload_tile(zero_i)
            init = init + pk + pv
        for kb_idx, state in range(fx.Index(0), fx.Index(kv_end), fx.Index(BLOCK_N), init=init):
            kb = fx.Int32(kb_idx)
            m_old = state[0]
            l_old = state[1]
            o_acc = [state[2 + i] for i in range_constexpr(VN)]
            nxt = []
            if const_expr(USE_LDS):
                # stage the prefetched tile, then prefetch the next one while computing
                gpu_barrier()
                lds_store_tile([state[2 + VN + i] for i in range_constexpr(CH_ITERS)],
                               [state[2 + VN + CH_ITERS + i] for i in range_constexpr(CH_ITERS)])
                gpu_barrier()
                nk, nv = gload_tile(kb + BLOCK_N)
                nxt = nk + nv

            # ---- Sᵀ = K Qᵀ per 16-key tile ----
            s_tiles = []
            for t in range_constexpr(N_TILES):
                k_chunks = k_operand(kb, t)
                acc = fx.Vector.filled(4, 0.0, fx.Float32)
                if const_expr(QK32):
                    for s in range_constexpr(D // 32):
                        acc = mfma32(k_chunks[s], q_chunks[s], acc)
                else:
                    for s in range_constexpr(KSTEPS):
                        if const_expr(is_f32):
                            acc = mfma(elem(k_chunks, QC, s), elem(q_chunks, QC, s), acc)
                        else:
                            acc = mfma(slice4(k_chunks, QC, 4 * s), slice4(q_chunks, QC, 4 * s), acc)
                acc = fx.Vector(acc)
                # scale, mask, tails: element i is key kb + 16t + 4g + i of row `row`
                vals = []
                for i in range_constexpr(4):
                    kidx = kb + 16 * t + 4 * g + i
                    sc = acc[i] * c_qk
                    ok = kidx < sk
                    if const_expr(causal):
                        ok = ok & (kidx <= row)
                    if const_expr(mask_kind != MASK_NONE):
                        kc = (kidx < sk).select(kidx, sk_last)
                        moff = m_base + row_c * m_sq + kc * m_sk
                        if const_expr(mask_kind == MASK_BOOL):
                            mv = fx.ptr_load(m_ptr + fx.Int64(moff), result_type=fx.Uint8)
                            ok = ok & (mv != fx.Uint8(0))
                        else:
                            mv = fx.ptr_load(m_ptr + fx.Int64(moff), result_type=MElem)
                            sc = sc + fx.Float32(mv) * LOG2E
                    vals.append(ok.select(sc, neg_inf))
                s_tiles.append(vals)

            # ---- online softmax ----
            m_loc = m_old
            for t in range_constexpr(N_TILES):
                for i in range_constexpr(4):
                    m_loc = fx.arith.maximumf(m_loc, s_tiles[t][i])
            m_loc = fx.arith.maximumf(m_loc, fx.Float32(fx.gpu.shuffle_xor(m_loc, 16, 64)))
            m_new = fx.arith.maximumf(m_loc, fx.Float32(fx.gpu.shuffle_xor(m_loc, 32, 64)))
            m_use = (m_new == neg_inf).select(zero_f, m_new)
            alpha = exp2(m_old - m_use)
            l_new = l_old * alpha
            p_tiles = []
            for t in range_constexpr(N_TILES):
                ps = []
                for i in range_constexpr(4):
                    p = exp2(s_tiles[t][i] - m_use)
                    l_new = l_new + p
                    ps.append(p)
                p_tiles.append(ps)
            o_acc = [fx.Vector(o_acc[i]) * alpha for i in range_constexpr(VN)]

            # ---- Oᵀ += Vᵀ Pᵀ ----
            if const_expr(PV32):
                # k = 8g + j stands for key 16(t + j//4) + 4g + j%4 of the tile pair (t, t+1)
                for tp in range_constexpr(N_TILES // 2):
                    t0 = 2 * tp
                    v_rows = [v_operand(kb, t0 + j // 4, j % 4) for j in range_constexpr(8)]
                    pb = fx.Vector.from_elements(p_tiles[t0] + p_tiles[t0 + 1], fx.Float32).to(Elem)
                    for dt in range_constexpr(VN):
                        va = fx.Vector.from_elements([elem(v_rows[j], VC, dt) for j in range_constexpr(8)], Elem)
                        o_acc[dt] = mfma32(va, pb, o_acc[dt])
            for t in range_constexpr(0 if PV32 else N_TILES):
                v_rows = [v_operand(kb, t, j) for j in range_constexpr(4)]
                if const_expr(is_f32):
                    for dt in range_constexpr(VN):
                        acc = o_acc[dt]
                        for j in range_constexpr(4):
                            acc = mfma(elem(v_rows[j], VC, dt), p_tiles[t][j], acc)
                        o_acc[dt] = acc
                else:
                    pb = fx.Vector.from_elements(p_tiles[t], fx.Float32).to(Elem)
                    for dt in range_constexpr(VN):
                        va = fx.Vector.from_elements([elem(v_rows[j], VC, dt) for j in range_constexpr(4)], Elem)
                        o_acc[dt] = mfma(va, pb, o_acc[dt])

            results = yield [m_new, l_new] + o_acc + nxt

        # ---- epilogue: O[row, (4g+i)*VN + dt] = acc_dt[i] / l ----
        l_part = results[1]
        l_tot = l_part + fx.Float32(fx.gpu.shuffle_xor(l_part, 16, 64))
        l_tot = l_tot + fx.Float32(fx.gpu.shuffle_xor(l_tot, 32, 64))
        inv_l = (l_tot == zero_f).select(zero_f, fx.Float32(1.0) / l_tot)
        o_fin = [fx.Vector(results[2 + dt]) for dt in range_constexpr(VN)]
        if row < sq:
            for i in range_constexpr(4):
                off = o_base + row * o_ss + (4 * g + i) * VN
                for c in range_constexpr(VN // VC):
                    vals = [o_fin[c * VC + e][i] * inv_l for e in range_constexpr(VC)]
                    if const_expr(VC == 1):
                        out = fx.Float32(vals[0])
                        if const_expr(not is_f32):
                            out = out.to(Elem)
                    else:
                        out = fx.Vector.from_elements(vals, fx.Float32)
                        if const_expr(not is_f32):
                            out = out.to(Elem)
                    fx.ptr_store(out, o_ptr + fx.Int64(off + c * VC))

    @flyc.jit
    def launch(Q: fx.Tensor, K: fx.Tensor, V: fx.Tensor, O: fx.Tensor, M: fx.Tensor,
               sq: fx.Int32, sk: fx.Int32, group: fx.Int32, c_qk: fx.Float32,
               q_sb: fx.Int32, q_sh: fx.Int32, q_ss: fx.Int32,
               k_sb: fx.Int32, k_sh: fx.Int32, k_ss: fx.Int32,
               v_sb: fx.Int32, v_sh: fx.Int32, v_ss: fx.Int32,
               o_sb: fx.Int32, o_sh: fx.Int32, o_ss: fx.Int32,
               m_sb: fx.Int32, m_sh: fx.Int32, m_sq: fx.Int32, m_sk: fx.Int32,
               grid_x: fx.Int32, grid_y: fx.Int32, grid_z: fx.Int32,
               stream: fx.Stream = fx.Stream(None)):
        attention_fwd_kernel(Q, K, V, O, M, sq, sk, group, c_qk, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss,
                             v_sb, v_sh, v_ss, o_sb, o_sh, o_ss, m_sb, m_sh, m_sq, m_sk).launch(
            grid=(grid_x, grid_y, grid_z), block=(THREADS, 1, 1), stream=stream)

    return launch
