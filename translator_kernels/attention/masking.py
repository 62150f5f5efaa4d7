"""Which keys a query row sees, for the attention kernel body (fwd.py): the key range of a query block,
its split into unmasked and masked tiles, causal positions, the user mask, and one tile's scores.

Key k is visible to row q iff k < Sk, and k <= q when causal (SDPA's top-left aligned form), and
k <= P[q] with positions (pos_causal: a decode step on a static cache passes its cache positions), and
k >= L[b] with key starts (key_start: a left-padded batch, row b's pads are its first L[b] keys), and
the user mask keeps it (a bool True, or an additive value that is not -inf). A block's keys end at
min(Sk, its last row + 1) when causal, at its largest position + 1 with positions, and at the end of the
workgroup's slice under split KV. They start at L[b] with key starts (split KV: the slices tile the keys
from L[b] on, slice p from L[b] + p * chunk): the keys before it are never loaded, so no tile needs a
compare for them, and the tiles start where the keys do (not on a multiple of BLOCK_N: the loads address
each key row; the tiles of a slice still end at its end, chunk being a multiple of BLOCK_N). Whole tiles below Sk and below the block's first row (or smallest
position) need no check: they run in the unmasked loop, with the raw scores (the scale goes into exp2's
fma, fwd.py and softmax.py); the rest, and every tile under a user mask, run masked.

A tile's masked scores are scaled to log2 units, soft-capped (cap * tanh(s / cap)), then masked to -inf.
An additive mask is added in log2 units, with finfo.min kept finite (-FLT_MAX) as SDPA's s + finfo.min
is: a row masked entirely with it gets SDPA's uniform weights (an -inf row: 0). One wave (K / V read
from global memory) loads a tile's mask bytes first (`mask_tile`) and skips the tile when no row of the
wave keeps any of its keys (a ballot: wave-uniform, decided on the device).

All of it is straight-line code (compile-time loops only); the loops and branches stay in the kernel
body, whose control flow FlyDSL rewrites.
"""

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl.expr import const_expr, range_constexpr, rocdl

from translator_kernels.attention.tiles import LOG2E, MASK_BOOL, MASK_NONE
from translator_kernels.device_math import tanh

FLT_MAX = 3.4028234663852886e38


def causal_positions(S, P, p_s, rows_c, qblk, lane, sq):
    """(this lane's rows' positions, the block's smallest, its largest) from the int32 positions P
    (element stride p_s): every wave of the workgroup reads all BLOCK_M rows and reduces over its 64
    lanes, so the bounds are uniform (scalars)."""
    p_ptr = fx.get_iter(fx.rocdl.make_buffer_tensor(P))
    pos_rows = [fx.Int32(fx.ptr_load(p_ptr + fx.Int64(rows_c[u] * p_s), result_type=fx.Int32))
                for u in range_constexpr(S.RG)]
    p_lo = p_hi = None
    for j in range_constexpr(-(-S.BLOCK_M // 64)):
        br = qblk * S.BLOCK_M + (lane + 64 * j) % S.BLOCK_M
        br = (br < sq).select(br, sq - 1)
        pv_ = fx.Int32(fx.ptr_load(p_ptr + fx.Int64(br * p_s), result_type=fx.Int32))
        p_lo = pv_ if p_lo is None else (pv_ < p_lo).select(pv_, p_lo)
        p_hi = pv_ if p_hi is None else (pv_ > p_hi).select(pv_, p_hi)
    for k_ in (1, 2, 4, 8, 16, 32):
        o_lo = fx.Int32(fx.gpu.shuffle_xor(p_lo, k_, 64))
        o_hi = fx.Int32(fx.gpu.shuffle_xor(p_hi, k_, 64))
        p_lo = (o_lo < p_lo).select(o_lo, p_lo)
        p_hi = (o_hi > p_hi).select(o_hi, p_hi)
    p_lo = fx.Int32(rocdl.readfirstlane(ir.IntegerType.get_signless(32), p_lo.ir_value()))
    p_hi = fx.Int32(rocdl.readfirstlane(ir.IntegerType.get_signless(32), p_hi.ir_value()))
    return pos_rows, p_lo, p_hi


def key_start(l_ptr, at):
    """The batch row's first visible key, read at l_ptr + at (int32; wave-uniform: a scalar); a negative
    start is 0 (every key is visible, none before key 0 is loaded)."""
    lo = fx.Int32(fx.ptr_load(l_ptr + fx.Int64(at), result_type=fx.Int32))
    lo = fx.Int32(rocdl.readfirstlane(ir.IntegerType.get_signless(32), lo.ir_value()))
    return (lo < fx.Int32(0)).select(fx.Int32(0), lo)


def key_range(S, causal, pos_causal, split, mask_kind, qblk, sk, zero_i, p_lo, p_hi, part, chunk, kv_lo=None):
    """(kv_start, kv_end, full_end) of this workgroup: its keys [kv_start, kv_end), the unmasked whole
    tiles [kv_start, full_end). p_lo / p_hi: causal_positions' bounds; part / chunk: the KV slice (split);
    kv_lo: key_start's first visible key (None: 0)."""
    kv_end = sk
    if const_expr(causal):
        blk_end = qblk * S.BLOCK_M + S.BLOCK_M
        kv_end = (blk_end < sk).select(blk_end, sk)
    if const_expr(pos_causal):  # up to the block's largest position
        kv_end = (p_hi + 1 < sk).select(p_hi + 1, sk)
    kv_start = zero_i
    if const_expr(split):  # this workgroup's slice of the keys (chunk is a multiple of BLOCK_N)
        kv_start = part * chunk
        if const_expr(kv_lo is not None):  # the slices tile the keys from the row's first one on, so that
            kv_start = kv_start + kv_lo     # a slice's last tile ends at the next slice's start
        kv_stop = kv_start + chunk
        kv_end = (kv_stop < kv_end).select(kv_stop, kv_end)
    elif const_expr(kv_lo is not None):  # the pads before the row's first key: never loaded
        kv_start = kv_lo
    # [kv_start, full_end): whole tiles below Sk (and below the block's first row when causal)
    # run without any mask; the rest, and every tile under a user mask, run masked
    full_end = kv_start
    if const_expr(mask_kind == MASK_NONE):
        lim = kv_end
        if const_expr(causal):
            first_row = qblk * S.BLOCK_M + 1
            lim = (first_row < lim).select(first_row, lim)
        if const_expr(pos_causal):  # every row of the block sees the keys up to its smallest position
            lim = (p_lo + 1 < lim).select(p_lo + 1, lim)
        lim = (lim < kv_start).select(kv_start, lim)
        full_end = kv_start + ((lim - kv_start) // S.BLOCK_N) * S.BLOCK_N
    return kv_start, kv_end, full_end


class Scores:
    """The score side of a KV tile for this lane (g: its lane group, rows / rows_c: its rows, unclamped /
    clamped to Sq - 1; pos_rows: their positions or None; c_qk: the scale in log2 units, after the
    kernel's sign fold; M at m_ptr + m_base with strides m_sq, m_sk: the user mask)."""

    def __init__(self, S, causal, pos_causal, mask_kind, softcap, g, sk, sk_last, m_ptr, m_base, m_sq, m_sk, rows,
                 rows_c, pos_rows, c_qk, cap, neg_inf):
        self.S, self.causal, self.pos_causal, self.mask_kind, self.softcap = S, causal, pos_causal, mask_kind, softcap
        self.g, self.sk, self.sk_last, self.rows, self.rows_c, self.pos_rows = g, sk, sk_last, rows, rows_c, pos_rows
        self.m_ptr, self.m_base, self.m_sq, self.m_sk = m_ptr, m_base, m_sq, m_sk
        self.c_qk, self.cap, self.neg_inf = c_qk, cap, neg_inf

    def mask_tile(self, kb):
        """This lane's user-mask values of the tile at key kb, [u][t][i] (key kb + 16t + 4g + i of
        row rows[u]; keys past Sk read key Sk - 1's), and whether any row of the wave keeps one
        of its keys below Sk (ballot: wave-uniform). A key is dropped by a bool False or an
        additive -inf only, the values whose weight is exactly 0 in SDPA and here; a finite fill
        (finfo.min) keeps the tile, as SDPA gives a fully masked row uniform weights there."""
        S, g, sk, neg_inf = self.S, self.g, self.sk, self.neg_inf
        vals, keep = [], None
        for u in range_constexpr(S.RG):
            vu = []
            for t in range_constexpr(S.N_TILES):
                vt = []
                for i in range_constexpr(4):
                    kidx = kb + 16 * t + 4 * g + i
                    kc = (kidx < sk).select(kidx, self.sk_last)
                    moff = self.m_base + self.rows_c[u] * self.m_sq + kc * self.m_sk
                    if const_expr(self.mask_kind == MASK_BOOL):
                        mv = fx.ptr_load(self.m_ptr + fx.Int64(moff), result_type=fx.Uint8)
                        ok = mv != fx.Uint8(0)
                    else:
                        mv = fx.ptr_load(self.m_ptr + fx.Int64(moff), result_type=S.MElem)
                        ok = fx.Float32(mv) != neg_inf
                    ok = ok & (kidx < sk)
                    keep = ok if keep is None else keep | ok
                    vt.append(mv)
                vu.append(vt)
            vals.append(vu)
        return vals, fx.Int64(rocdl.ballot(ir.IntegerType.get_signless(64), keep)) != fx.Int64(0)

    def score_tile(self, acc, kb, t, u, masked, mvals=None):
        """Scale (log2 units), soft-cap and, if `masked`, mask one Sᵀ tile of row group u:
        element i is key kb + 16t + 4g + i of row rows[u] (mvals: its mask values, mask_tile's)."""
        S, sk, neg_inf, mask_kind = self.S, self.sk, self.neg_inf, self.mask_kind
        if const_expr(not masked and S.RAW_MAX):  # raw: the scale goes into exp2's fma
            return [acc[i] for i in range_constexpr(4)]
        vals = []
        for i in range_constexpr(4):
            kidx = kb + 16 * t + 4 * self.g + i
            sc = acc[i] * self.c_qk
            if const_expr(self.softcap):  # cap * tanh(s / cap), in log2 units (cap = c * log2 e)
                sc = fx.Float32(tanh(sc / self.cap)) * self.cap
            if const_expr(not masked):
                vals.append(sc)
                continue
            ok = kidx < sk
            if const_expr(self.causal):
                ok = ok & (kidx <= self.rows[u])
            if const_expr(self.pos_causal):
                ok = ok & (kidx <= self.pos_rows[u])
            if const_expr(mask_kind != MASK_NONE):
                kc = (kidx < sk).select(kidx, self.sk_last)
                moff = self.m_base + self.rows_c[u] * self.m_sq + kc * self.m_sk
                if const_expr(mask_kind == MASK_BOOL):
                    mv = mvals[t][i] if mvals is not None else fx.ptr_load(self.m_ptr + fx.Int64(moff),
                                                                           result_type=fx.Uint8)
                    ok = ok & (mv != fx.Uint8(0))
                else:
                    mv = mvals[t][i] if mvals is not None else fx.ptr_load(self.m_ptr + fx.Int64(moff),
                                                                           result_type=S.MElem)
                    # finfo.min (HF's additive masks) times log2 e would overflow to -inf: kept finite
                    # (-FLT_MAX) as SDPA's s + finfo.min is, so a row masked entirely with it gets
                    # SDPA's uniform weights (an -inf row: 0); its weight beside any kept key is 0
                    mf = fx.Float32(mv)
                    sc = sc + (mf == neg_inf).select(neg_inf, fx.arith.maximumf(mf * LOG2E, fx.Float32(-FLT_MAX)))
            vals.append(ok.select(sc, neg_inf))
        return vals
