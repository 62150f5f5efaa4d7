"""The MFMA operand reads of the attention kernel body (fwd.py): Q, K and V for one lane, from global
memory or from the workgroup's LDS copy of a KV tile.

Lane (g, r) (lane = 16 g + r) holds, for the transposed products of fwd.py (Sᵀ = K · Qᵀ, Oᵀ = Vᵀ · Pᵀ):
  * Q / K: row r of a 16-row (16-key) tile, head-dim elements [g QN, (g + 1) QN), QN = D / 4;
  * V without LDS: the rows of keys 16t + 4g .. + 3, head-dim elements [r VN, (r + 1) VN), VN = D / 16;
  * Vᵀ from LDS: d = 16 dt + r, keys 16t + 4g .. + 3 (one 4-element read; gfx950 reads V row-major with
    ds_read_b64_tr_b16, which returns the group's 4 x 16 tile transposed).
Loads go in chunks of QC / VC elements (16 bytes, or fewer where the head dim is odd-sized) that never
straddle the padding edge: head dims 8..256 run on tiles of D = DV rounded up to 16; a Q / K chunk past DV
reads column 0 and is zeroed, a V chunk past DV only feeds Oᵀ rows that are never stored. Keys past Sk are
clamped to key Sk - 1 (their scores are masked). fp32 K / V under a 16-bit dtype (KV32, one wave) load in
fp32 and round to the dtype in registers (round to nearest even, as torch's cast).

With LDS, each KV tile has its own buffer descriptors (`tile_desc`: base at the tile's first key, bounds at
the end of key Sk - 1 of this head), so keys past Sk read zero and the per-thread offsets stay
loop-invariant; `lds_store_chunk` writes one 16-byte chunk of the copy (V transposed unless VTR).
Straight-line code only: the copy's loops with a dynamic bound stay in the kernel body.
"""

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl.expr import const_expr, range_constexpr, rocdl

from translator_kernels.attention.tiles import ir_elem


class Operands:
    """One lane's operand reads (S: the specialization's FwdSpec; r, g: the lane's row and group;
    K / V at k_ptr + k_base, v_ptr + v_base with key strides k_ss, v_ss; lds_k / lds_v: the LDS tile, or
    None without LDS)."""

    def __init__(self, S, dtype, r, g, sk, sk_last, k_ptr, k_base, k_ss, v_ptr, v_base, v_ss, lds_k, lds_v):
        self.S, self.dtype, self.r, self.g, self.sk, self.sk_last = S, dtype, r, g, sk, sk_last
        self.k_ptr, self.k_base, self.k_ss, self.v_ptr, self.v_base, self.v_ss = k_ptr, k_base, k_ss, v_ptr, v_base, v_ss
        self.lds_k, self.lds_v = lds_k, lds_v

    def load_vec(self, ptr, off, n):
        S = self.S
        if const_expr(n == 1):  # LLVM cannot legalize a <1 x bf16> buffer load
            x = fx.ptr_load(ptr + fx.Int64(off), result_type=S.Elem)
            return fx.Vector.from_elements([x], S.Elem)
        return fx.ptr_load(ptr + fx.Int64(off), result_type=ir.VectorType.get([n], ir_elem(self.dtype)))

    def load_vec_f32(self, ptr, off, n):
        """n fp32 elements at off (KV32), in loads of at most 16 bytes, rounded to Elem."""
        S = self.S
        out = []
        for c in range_constexpr(0, n, 4):
            w = min(4, n - c)
            if const_expr(w == 1):
                out.append(fx.Float32(fx.ptr_load(ptr + fx.Int64(off + c), result_type=fx.Float32)).to(S.Elem))
                continue
            x = fx.Vector(fx.ptr_load(ptr + fx.Int64(off + c), result_type=ir.VectorType.get([w], ir.F32Type.get())))
            xe = fx.Vector(x.to(S.Elem))
            out.extend(xe[e] for e in range_constexpr(w))
        return fx.Vector.from_elements(out, S.Elem)

    def load_chunks(self, ptr, off, total, chunk, start=None, zero=True, kv=False):
        """`total` elements at off in `chunk`s; with `start` (the first element's column) the
        chunks at or past the real head dim read column 0 instead and, if `zero`, give 0. kv:
        a K / V operand (KV32: fp32 loads rounded to Elem)."""
        S = self.S
        load = self.load_vec_f32 if kv and S.KV32 else self.load_vec
        if const_expr(not S.PADDED or start is None):
            return [load(ptr, off + c * chunk, chunk) for c in range_constexpr(total // chunk)]
        out = []
        for c in range_constexpr(total // chunk):
            ok = start + c * chunk < S.DV
            x = load(ptr, off + ok.select(fx.Int32(c * chunk), fx.Int32(0) - start), chunk)
            if const_expr(zero):
                x = ok.select(fx.Vector(x), fx.Vector.filled(chunk, 0.0, S.Elem))
            out.append(x)
        return out

    def q_rows(self, q_ptr, q_base, q_ss, rows_c, c_qk, zero_f):
        """(Q chunks per row group, c_qk, 1 / c_qk): this lane's rows, d in [g QN, (g + 1) QN). RAW_MAX:
        c s = |c| (-s), a negative scale flips the sign bits of Q once, so c > 0 and max(c s) = c max(s);
        1 / c is the rescale threshold's unit (raw scores; a zero scale: +inf). Else 1 / c is None."""
        S, g = self.S, self.g
        q_chunks = [self.load_chunks(q_ptr, q_base + rows_c[u] * q_ss + g * S.QN, S.QN, S.QC, g * S.QN)
                    for u in range_constexpr(S.RG)]
        inv_c = None
        if const_expr(S.RAW_MAX):
            neg = c_qk < zero_f
            c_qk = neg.select(zero_f - c_qk, c_qk)
            inv_c = fx.Float32(1.0) / c_qk
            IntE = fx.Int32 if S.is_f32 else fx.Int16
            sign = neg.select(IntE(-(2 ** (8 * S.eb - 1))), IntE(0))
            q_chunks = [[fx.Vector(fx.Vector(fx.Vector(ch).bitcast(IntE)) ^ sign).bitcast(S.Elem) for ch in q_chunks[u]]
                        for u in range_constexpr(S.RG)]
        return q_chunks, c_qk, inv_c

    def tile_desc(self, glob, base, kb, stride):
        """A buffer descriptor of one K or V tile: element 0 = key kb, bounds at the end of the
        real head-dim columns of key Sk - 1 (a key past Sk loads zeros, never another head's
        data)."""
        rec = ((self.sk_last - kb) * stride + self.S.DV) * self.S.eb
        return fx.rocdl.make_buffer_ptr(glob + fx.Int64(base + kb * stride), num_records_bytes=fx.Int64(rec))

    def lds_store_chunk(self, k_chunk, v_chunk, c):
        S, lds_k, lds_v = self.S, self.lds_k, self.lds_v
        fx.ptr_store(k_chunk, lds_k + fx.Int64((c // S.ROW_CH) * S.LSTR + (c % S.ROW_CH) * S.CE))
        if const_expr(S.VTR):
            fx.ptr_store(v_chunk, lds_v + fx.Int64((c // S.ROW_CH) * S.LSTR + (c % S.ROW_CH) * S.CE))
            return
        vt = (c // S.BLOCK_N) * S.CE * S.VSTR + c % S.BLOCK_N  # Vᵀ[col][key], one element at a time
        vv = fx.Vector(v_chunk)
        for e in range_constexpr(S.CE):
            fx.ptr_store(vv[e], lds_v + fx.Int64(vt + e * S.VSTR))

    def lds_chunks(self, ptr, off, total, chunk):
        S = self.S
        ty = ir.VectorType.get([chunk], ir_elem(self.dtype))
        if const_expr(chunk == 1):
            return [fx.Vector.from_elements([fx.ptr_load(ptr + fx.Int64(off + c), result_type=S.Elem)], S.Elem)
                    for c in range_constexpr(total)]
        return [fx.ptr_load(ptr + fx.Int64(off + c * chunk), result_type=ty)
                for c in range_constexpr(total // chunk)]

    def k_operand(self, kb, t):
        """This lane's K row (key kb + 16t + r), d in [g*QN, (g+1)*QN)."""
        S, r, g = self.S, self.r, self.g
        if const_expr(S.USE_LDS):
            return self.lds_chunks(self.lds_k, (16 * t + r) * S.LSTR + g * S.QN, S.QN, S.QC)
        key = kb + 16 * t + r
        key_c = (key < self.sk).select(key, self.sk_last)
        return self.load_chunks(self.k_ptr, self.k_base + key_c * self.k_ss + g * S.QN, S.QN, S.QC, g * S.QN, kv=True)

    def vt_operand(self, t, dt):
        """Vᵀ from LDS: d = 16 dt + r, keys 16t + 4g .. 16t + 4g + 3 (one 4-element read)."""
        S, r, g, lds_v = self.S, self.r, self.g, self.lds_v
        if const_expr(S.VTR):
            # ds_read_b64_tr_b16: lane 4j + q of a 16-lane group reads V[key 16t + 4g + j][d 16dt + 4q ..
            # + 3]; the group's 4 x 16 tile comes back transposed: lane r holds d = 16 dt + r, keys
            # 16t + 4g .. + 3, the layout the Vᵀ operand needs
            ptr = fx.to_llvm_ptr(lds_v + fx.Int64((16 * t + 4 * g + r // 4) * S.LSTR + 16 * dt + 4 * (r % 4)))
            i16x4 = ir.VectorType.get([4], ir.IntegerType.get_signless(16))
            return fx.Vector(rocdl.ds_read_tr16_b64(i16x4, ptr).result).bitcast(S.Elem)
        ty = ir.VectorType.get([4], ir_elem(self.dtype))
        return fx.ptr_load(lds_v + fx.Int64((16 * dt + r) * S.VSTR + 16 * t + 4 * g), result_type=ty)

    def v_operand(self, kb, t, j):
        """V row of key kb + 16t + 4g + j, d in [r*VN, (r+1)*VN) (global memory, no LDS)."""
        S, r = self.S, self.r
        key = kb + 16 * t + 4 * self.g + j
        key_c = (key < self.sk).select(key, self.sk_last)
        # padding columns only feed padding rows of Oᵀ, which are never stored
        return self.load_chunks(self.v_ptr, self.v_base + key_c * self.v_ss + r * S.VN, S.VN, S.VC, r * S.VN,
                                zero=False, kv=True)
