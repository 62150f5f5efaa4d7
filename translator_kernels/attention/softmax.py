"""Online-softmax steps of the attention kernel body (fwd.py), per KV tile, for the RG 16-row
groups of a wave: straight-line pieces the kernel traces; the loops and the wave-uniform rescale
branch stay in the kernel body (FlyDSL rewrites the control flow of the kernel function only).

Lane (g, r) holds row r of a group and keys 4g .. 4g + 3 of each 16-key tile (the Sᵀ accumulator
layout), so a row's max over a tile is the lane's max, then two xor exchanges (16, 32).

Three kinds of tile (translator_kernels.hotloop prices the loop of the second):
  * the first unmasked tile of a row (peeled out of the loop): the scores are raw (unscaled);
    the row max sets the reference m_ref = c max(s) and the rescale threshold
    thr = (m_ref + RESCALE_TAU) / c in raw-score units; O and l are still zero, nothing to rescale;
  * later unmasked tiles: the lane's raw max is compared with thr; only when a row of the wave
    exceeds it does the kernel run `rescale` (row-max exchange, alpha = exp2(m_old - m_new), the O
    and l multiplies) inside a wave-uniform branch; p = exp2(c s - m_ref) <= 2^TAU meanwhile;
  * masked tiles (diagonal, tail, user mask; scores scaled and masked first): the exact per-tile
    rescale, a row whose keys are all masked keeping m = -inf (exp2 of m_old - 0).
The carried state of the unmasked loops is -m_ref (so exp2's argument is one fma, c s + (-m_ref))
and thr; the masked loop carries m.
"""

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl.expr import range_constexpr, rocdl

from translator_kernels.attention.mma import exp2
from translator_kernels.attention.tiles import NNAN, RESCALE_TAU


def row_max(x, lane_xor):
    """The max of x over the 4 lane groups holding one row (NaN canonicalization skipped)."""
    x = fx.arith.maximumf(x, lane_xor(x, 16), fastmath=NNAN)
    return fx.arith.maximumf(x, lane_xor(x, 32), fastmath=NNAN)


def lane_max(tiles, start):
    """max(start, every score of one row group's tiles held by this lane)."""
    m = start
    for t in range_constexpr(len(tiles)):
        for i in range_constexpr(4):
            m = fx.arith.maximumf(m, tiles[t][i], fastmath=NNAN)
    return m


def first_tile(m_tile, c_qk, inv_c, lane_xor):
    """A row's first unmasked tile -> (-m_ref, thr) per group: m_ref = c x the raw row max."""
    m_ref = [row_max(m, lane_xor) * c_qk for m in m_tile]
    return [fx.Float32(0.0) - m for m in m_ref], [(m + RESCALE_TAU) * inv_c for m in m_ref]


def rescale_wanted(m_tile, thr):
    """True on every lane of a wave in which some row's raw max exceeds its threshold (ballot)."""
    grow = m_tile[0] > thr[0]
    for u in range_constexpr(1, len(m_tile)):
        grow = grow | (m_tile[u] > thr[u])
    return fx.Int64(rocdl.ballot(ir.IntegerType.get_signless(64), grow)) != fx.Int64(0)


def rescale(m_tile, neg_m, l_old, o_flat, c_qk, inv_c, lane_xor, ones_l):
    """The rare branch: new (-m_ref, thr, l, flat O tiles) after this tile's row max (the reference
    only moves up; alpha = 1 for the rows that did not grow)."""
    rg = len(m_tile)
    vn = len(o_flat) // rg
    zero = fx.Float32(0.0)
    m_prev = [zero - neg_m[u] for u in range_constexpr(rg)]
    m_ref = [fx.arith.maximumf(m_prev[u], row_max(m_tile[u], lane_xor) * c_qk, fastmath=NNAN) for u in range_constexpr(rg)]
    alphas = [exp2(m_prev[u] - m_ref[u]) for u in range_constexpr(rg)]
    l_new = [(fx.Vector(l_old[u]) if ones_l else l_old[u]) * alphas[u] for u in range_constexpr(rg)]
    o_new = [fx.Vector(o_flat[j]) * alphas[j // vn] for j in range_constexpr(len(o_flat))]
    return ([zero - m for m in m_ref], [(m + RESCALE_TAU) * inv_c for m in m_ref], l_new, o_new)


def masked_tile(m_tile, m_old, l_old, o_acc, ones_l):
    """A masked tile (m_tile: the exchanged row max of scaled, masked scores) -> (-m as a 4-vector
    per group, l, O) rescaled by exp2(m_old - m); a row with every key masked so far uses m = 0."""
    zero = fx.Float32(0.0)
    m_use = [(m == fx.Float32(float("-inf"))).select(zero, m) for m in m_tile]
    alphas = [exp2(m_old[u] - m_use[u]) for u in range_constexpr(len(m_tile))]
    l_base = [(fx.Vector(l_old[u]) if ones_l else l_old[u]) * alphas[u] for u in range_constexpr(len(m_tile))]
    o_new = [[fx.Vector(o) * alphas[u] for o in o_acc[u]] for u in range_constexpr(len(m_tile))]
    return [fx.Vector.filled(4, 0.0, fx.Float32) - m for m in m_use], l_base, o_new


def probabilities(tiles, m_vec, c_qk, raw):
    """exp2 per score: of c s - m_ref (raw: one packed fma per two scores) or of s - m."""
    c_vec = fx.Vector.filled(4, 0.0, fx.Float32) + c_qk
    pt = []
    for t in range_constexpr(len(tiles)):
        sv = fx.Vector.from_elements(tiles[t], fx.Float32)
        dv = fx.Vector(fx.math.fma(sv, c_vec, m_vec) if raw else sv + m_vec)
        pt.append([exp2(dv[i]) for i in range_constexpr(4)])
    return pt


def row_sum(l_base, pt):
    """fp32 inputs: l + this lane's sum of p as a 4-vector (v_pk_add), reduced across lanes in the
    epilogue (16-bit inputs sum p with the ones-tile MFMA of the PV step instead)."""
    l_vec = fx.Vector.filled(4, 0.0, fx.Float32)
    for t in range_constexpr(len(pt)):
        l_vec = l_vec + fx.Vector.from_elements(pt[t], fx.Float32)
    l_vec = fx.Vector(l_vec)
    return l_base + ((l_vec[0] + l_vec[1]) + (l_vec[2] + l_vec[3]))
