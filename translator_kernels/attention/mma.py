"""Per-lane building blocks of the attention kernel body (fwd.py): MFMA steps, the PV product,
P's conversion to the 16-bit operand type, exp2 and the cross-lane xor exchange.

They are plain functions of static arguments (dtype, arch flags) called while the kernel is
traced, so they hold no dynamic control flow: everything here becomes straight-line code.
"""

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl.expr import rocdl

from translator_kernels.attention.tiles import AFN, FX_DTYPES


def f32v4():
    return ir.VectorType.get([4], ir.F32Type.get())


def mfma(dtype: str, a, b_, c):
    """One 16x16 MFMA step: fp32 16x16x4 (scalar operands) or 16x16x16 (4-vectors)."""
    if dtype == "f32":
        op = rocdl.mfma_f32_16x16x4f32(f32v4(), fx.Float32(a).ir_value(), fx.Float32(b_).ir_value(),
                                       fx.Vector(c).ir_value(), 0, 0, ir.Attribute.parse("#rocdl<mfma_perm_b none>"))
        return fx.Vector(op.result)
    if dtype == "bf16":
        a16 = fx.Vector(a).bitcast(fx.Int16)
        b16 = fx.Vector(b_).bitcast(fx.Int16)
        return fx.Vector(rocdl.mfma_f32_16x16x16bf16_1k(f32v4(), [a16, b16, c, 0, 0, 0]))
    return fx.Vector(rocdl.mfma_f32_16x16x16f16(f32v4(), [a, b_, c, 0, 0, 0]))


def mfma32(dtype: str, a, b_, c):
    """gfx950 16x16x32 step: lane (g, r) supplies k = 8g .. 8g+7 as an 8-vector."""
    if dtype == "bf16":
        return fx.Vector(rocdl.mfma_f32_16x16x32_bf16(f32v4(), [a, b_, c, 0, 0, 0]))
    return fx.Vector(rocdl.mfma_f32_16x16x32_f16(f32v4(), [a, b_, c, 0, 0, 0]))


def p_to_elem(ps, dtype: str, trunc: bool):
    """4 probabilities (finite, >= 0) -> the MFMA's 16-bit type. gfx942 has no bf16 convert
    instruction and LLVM's round-to-nearest-even with NaN care costs ~4.5 VALU per value;
    keeping the high half of the bits (`trunc`) is one v_perm per 2 values. Its bias (every
    weight rounded down) cancels in O / l because l sums the same rounded p (the ones-tile row
    sum); alone it measured 1.6x the mean error of round-to-nearest. fp16 likewise rounds toward
    zero with v_cvt_pkrtz_f16_f32 (one per 2 values; RTN costs a convert per value + a pack)."""
    pv = fx.Vector.from_elements(ps, fx.Float32)
    if dtype == "f16":  # v_cvt_pkrtz_f16_f32: 2 values, toward zero
        f16x2 = ir.VectorType.get([2], ir.F16Type.get())
        lo = fx.Vector(rocdl.cvt_pkrtz(f16x2, fx.Float32(ps[0]).ir_value(), fx.Float32(ps[1]).ir_value()))
        hi = fx.Vector(rocdl.cvt_pkrtz(f16x2, fx.Float32(ps[2]).ir_value(), fx.Float32(ps[3]).ir_value()))
        return lo.shuffle(hi, [0, 1, 2, 3])
    if not trunc:
        return pv.to(FX_DTYPES[dtype])
    halves = fx.Vector(pv.bitcast(fx.Int16))
    return fx.Vector(halves.shuffle(halves, [1, 3, 5, 7])).bitcast(fx.BFloat16)


def exp2(x):
    """Hardware v_exp_f32 (afn: no device-library call); exp2(-inf) = 0."""
    return fx.math.exp2(x, fastmath=AFN)


def xor_addresses(lane) -> dict:
    """ds_bpermute byte addresses of lane ^ 16 and lane ^ 32 (for lane_xor on gfx950)."""
    return {k: ((lane ^ k) * 4).ir_value() for k in (16, 32)}


def lane_xor(x, k: int, addr=None):
    """x of lane ^ k. With `addr` (xor_addresses) one ds_bpermute on the LDS pipe: gfx950's
    generic shuffle lowering (permlane swaps plus a compare and a select per step) costs ~7 VALU."""
    if addr is None:
        return fx.Float32(fx.gpu.shuffle_xor(x, k, 64))
    bits = rocdl.ds_bpermute(ir.IntegerType.get_signless(32), addr[k], fx.Float32(x).bitcast(fx.Int32).ir_value())
    return fx.Float32(fx.Int32(bits).bitcast(fx.Float32))


def elem(chunks, chunk: int, idx: int):
    """Element idx of a row held as `chunk`-element vectors."""
    return fx.Vector(chunks[idx // chunk])[idx % chunk]


def slice4(chunks, chunk: int, start: int):
    """Elements start .. start + 3 of a row held as `chunk`-element vectors, as one 4-vector."""
    v = fx.Vector(chunks[start // chunk])
    if chunk == 4:
        return v
    o = start % chunk
    return v.shuffle(v, [o, o + 1, o + 2, o + 3])


def pv_update(p_tiles, o_acc, l_acc, *, dtype: str, trunc: bool, pv32: bool, vt_operand=None, v_rows=None,
              vc: int = 1, ones_l: bool = True):
    """Oᵀ += Vᵀ Pᵀ over one KV block, one V operand read for all row groups (o_acc[u][dt], p_tiles[u][t]).

    pv32 (gfx950, V in LDS): 16x16x32 over pairs of 16-key tiles, k = 8g + j standing for key
    16(t + j//4) + 4g + j%4 of the pair; vt_operand(t, dt): the Vᵀ 4-vector from LDS (tile order);
    v_rows(t) (no LDS): the 4 V rows this lane reads, each d in [r VN, (r+1) VN) as vc-element
    chunks, regrouped into the operand here. With ones_l (16-bit inputs) l_acc[u] also takes the
    ones-tile MFMA of the same Pᵀ operand: row u's sum of p, in every element."""
    rg, n_tiles, vn = len(p_tiles), len(p_tiles[0]), len(o_acc[0])
    is_f32 = dtype == "f32"
    elem_t = FX_DTYPES[dtype]
    l_acc = list(l_acc)
    if pv32:
        for tp in range(n_tiles // 2):
            t0 = 2 * tp
            pbs = [fx.Vector.from_elements(p_tiles[u][t0] + p_tiles[u][t0 + 1], fx.Float32).to(elem_t) for u in range(rg)]
            for dt in range(vn):
                lo, hi = fx.Vector(vt_operand(t0, dt)), fx.Vector(vt_operand(t0 + 1, dt))
                va = lo.shuffle(hi, [0, 1, 2, 3, 4, 5, 6, 7])
                for u in range(rg):
                    o_acc[u][dt] = mfma32(dtype, va, pbs[u], o_acc[u][dt])
            for u in range(rg):
                l_acc[u] = mfma32(dtype, fx.Vector.filled(8, 1.0, elem_t), pbs[u], l_acc[u])
        return o_acc, l_acc
    for t in range(n_tiles):
        rows = None if vt_operand is not None else v_rows(t)
        pbs = [p_tiles[u][t] if is_f32 else p_to_elem(p_tiles[u][t], dtype, trunc) for u in range(rg)]
        for dt in range(vn):
            if vt_operand is not None:
                va = fx.Vector(vt_operand(t, dt))
                va = [va[j] for j in range(4)] if is_f32 else va
            elif is_f32:
                va = [elem(rows[j], vc, dt) for j in range(4)]
            else:
                va = fx.Vector.from_elements([elem(rows[j], vc, dt) for j in range(4)], elem_t)
            for u in range(rg):
                if is_f32:
                    acc = o_acc[u][dt]
                    for j in range(4):
                        acc = mfma(dtype, va[j], pbs[u][j], acc)
                    o_acc[u][dt] = acc
                else:
                    o_acc[u][dt] = mfma(dtype, va, pbs[u], o_acc[u][dt])
        if ones_l:
            for u in range(rg):
                l_acc[u] = mfma(dtype, fx.Vector.filled(4, 1.0, elem_t), pbs[u], l_acc[u])
    return o_acc, l_acc
