"""The GEMM kernel's operand loads (kernel.py): A global -> registers -> LDS, W global -> registers.

Every offset is split in two: a per-thread VGPR part computed once, before the K loop (`a_offsets`,
`w_offsets`: row < M and the N padding folded in as the sentinel offset OOB, so the hardware returns 0),
and a uniform per-tile part the loads pass as the buffer instruction's SGPR soffset; block and half offsets
are compile-time constants its immediate offset absorbs. The loop body does no per-lane address math.

A: chunk c of a BM x BK tile is 16 bytes of one row, 16 consecutive rows fastest (a wave reads 16 rows x
4 chunks, 64 contiguous bytes a row); chunk c lands in 16-byte unit c of the LDS stage, laid out like the
preshuffled weight, (BM/16, BK/32, 32/kpack, 16, kpack), so every MFMA A operand is one conflict-free
ds_read_b128. W: n_rep x k_blk x lph 16-byte chunks a lane, straight into registers: the preshuffle puts
each lane's operand in one contiguous chunk; "nk" (row-major [N, K]) reads a row's 16 bytes; "kn"
(row-major [K, N], bmm's att @ v) packs kpack 2- or 4-byte loads down a column. int8 / int4 / fp4 weights
load their bytes or nibbles, converted where the MFMA uses them.

The K tail: only the tile that crosses K checks k < K per chunk (k_tail); with `head` (a short first
tile) the later tiles start `lead` elements early, and a partial tile loads only its first nblk K blocks.
Straight-line code: the kernel's K loop calls these.
"""

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import scf, vector
from flydsl.expr import const_expr, range_constexpr, rocdl
from flydsl.expr.typing import T

from translator_kernels.gemm.common import OOB, THREADS, _raw, _v4i32
from translator_kernels.gemm.mfma8 import w8_load_type

_INT_T = {2: lambda: T.i16, 4: lambda: T.i32}


def gload(r, voff, soff):
    """One 16-byte buffer load at voff (per lane) + soff (uniform)."""
    return rocdl.raw_ptr_buffer_load(_v4i32(), r, _raw(voff), _raw(soff), 0)


class Loads:
    """A and W loads of one workgroup: the tile geometry (a_loads chunks a thread, a_cpr chunks an A row,
    kp elements a chunk of esz bytes, cpb chunks a 32-deep block row, lph loads a lane and block, W bytes an
    element wsz / wdiv) and the lane's ids (tid, lane, l16, q; wk: its first K block); ra / rw: A's and W's
    buffer resources; lds: the A stages; bs: the scales loaded with W (blockscale / mxscale / w4), or None."""

    def __init__(self, *, a_loads, a_chunks, a_cpr, kp, esz, k, n, bk, k_blk, lead, stage_dw, n_rep, lph, cpb,
                 w_layout, wsz, wdiv, w_int8, w_int4, w_fp4, mx, block, tid, lane, l16, q, wk, m, ra, rw, lds):
        self.a_loads, self.a_chunks, self.a_cpr, self.kp, self.esz = a_loads, a_chunks, a_cpr, kp, esz
        self.k, self.n, self.bk, self.k_blk, self.lead, self.stage_dw = k, n, bk, k_blk, lead, stage_dw
        self.n_rep, self.lph, self.cpb, self.w_layout, self.wsz, self.wdiv = n_rep, lph, cpb, w_layout, wsz, wdiv
        self.w_int8, self.w_int4, self.w_fp4, self.mx, self.block = w_int8, w_int4, w_fp4, mx, block
        self.tid, self.lane, self.l16, self.q, self.wk, self.m, self.ra, self.rw, self.lds = (tid, lane, l16, q, wk,
                                                                                              m, ra, rw, lds)
        self.bs = None

    def a_chunk(self, i):
        # chunk c -> (row r, k-chunk kc) with 16 consecutive rows fastest: a wave reads 16 rows x
        # 4 chunks (64 contiguous bytes per row) and its LDS writes land at unit c, conflict-free.
        c = self.tid + i * THREADS
        rest = c // 16
        return c, (rest // self.a_cpr) * 16 + c % 16, rest % self.a_cpr

    def a_offsets(self, a_row0, a_base):
        """The per-thread byte offsets of the A chunks (rows from a_row0; OOB past M)."""
        self.a_voff, self.a_kk = [], []
        for i in range_constexpr(self.a_loads):
            c, r, kc = self.a_chunk(i)
            row = a_row0 + r
            ok = row < self.m
            if const_expr(self.a_chunks % THREADS != 0):
                ok = ok & (c < self.a_chunks)
            self.a_voff.append(ok.select((a_base + row * self.k + kc * self.kp) * self.esz, fx.Int32(OOB)))
            self.a_kk.append(kc * self.kp)

    def load_a(self, kt, k_tail=False, first=False, nblk=None):
        """A tile kt -> registers; k_tail: this tile crosses K (chunks with k >= K read 0). With `head`, tiles
        after the first start `lead` elements early; only the first nblk K blocks are loaded (the rest read 0)."""
        nblk = self.k_blk if nblk is None else nblk
        bk, esz = self.bk, self.esz
        shift = 0 if first else self.lead
        soff = kt * (bk * esz) - shift * esz if shift else kt * (bk * esz)
        regs = []
        for i in range_constexpr(self.a_loads):
            voff = self.a_voff[i]
            if const_expr(k_tail):
                voff = ((kt * bk - shift if shift else kt * bk) + self.a_kk[i] < self.k).select(voff, fx.Int32(OOB))
            if const_expr(nblk < self.k_blk):
                voff = (self.a_kk[i] < nblk * 32).select(voff, fx.Int32(OOB))
            regs.append(gload(self.ra, voff, soff))
        return regs

    def store_a(self, regs, stage):
        # (BM/16, BK/32, cpb, 16, kp) layout: chunk c goes to 16-byte unit c of the stage
        for i in range_constexpr(self.a_loads):
            c = self.tid + i * THREADS
            p = fx.add_offset(self.lds.a.ptr, _raw(c * 4 + stage * self.stage_dw))
            if const_expr(self.a_chunks % THREADS != 0):
                if_op = scf.IfOp(_raw(c < self.a_chunks), has_else=False)
                with ir.InsertionPoint(if_op.then_block):
                    fx.ptr_store(regs[i], p)
                    scf.YieldOp([])
            else:
                fx.ptr_store(regs[i], p)

    def w_offsets(self, nb0, w_base, nb_total, kb_total):
        """The per-lane byte offsets of this wave's W columns (16-column blocks nb0 + nr; OOB past N / N_pad)."""
        kp, esz, k, n, l16, q, wk = self.kp, self.esz, self.k, self.n, self.l16, self.q, self.wk
        self.w_voff = []
        for nr in range_constexpr(self.n_rep):
            nb = nb0 + nr
            if const_expr(self.w_layout == "nk"):  # W[n, k] row-major, row stride K: lane (l16, q) reads row nb*16 + l16
                ok = nb * 16 + l16 < n
                off = (w_base + (nb * 16 + l16) * k + q * kp + wk * 32) * esz
            elif const_expr(self.w_layout == "kn"):  # B[k, n] row-major, row stride N: lane (l16, q) reads column nb*16 + l16
                ok = nb * 16 + l16 < n
                off = (w_base + (wk * 32 + q * kp) * n + nb * 16 + l16) * esz
            else:
                ok = nb < nb_total
                off = (w_base + nb * (kb_total * self.cpb * 16 * kp) + wk * (self.cpb * 16 * kp) + self.lane * kp) \
                    * self.wsz // self.wdiv
            self.w_voff.append(ok.select(off, fx.Int32(OOB)))

    def load_w(self, kt, k_tail=False, first=False, nblk=None, kbs=None):
        """W tile kt -> registers; k_tail (nk / kn layouts): chunks with k >= K read 0. `first` / nblk: as
        load_a (K blocks from nblk on are not loaded: placeholders that compute never reads). kbs (ring): load
        only these K blocks, None in the other places."""
        nblk = self.k_blk if nblk is None else nblk
        w_layout, kp, esz, bk, lead, wsz, wdiv = self.w_layout, self.kp, self.esz, self.bk, self.lead, self.wsz, self.wdiv
        per_k = {"nk": 1, "kn": self.n}.get(w_layout, 16) * wsz // wdiv  # bytes a K element adds to a tile's offset
        soff = kt * (bk * per_k) - lead * per_k if lead and not first else kt * (bk * per_k)
        regs = []
        for nr in range_constexpr(self.n_rep):
            for kb in range_constexpr(self.k_blk):
                for h in range_constexpr(self.lph):
                    if const_expr(kb >= nblk or (kbs is not None and kb not in kbs)):
                        regs.append(None)
                        continue
                    if const_expr(w_layout == "kn"):  # a lane's chunk: kp elements down column n
                        regs.append(self.load_kn_chunk(self.w_voff[nr], kt, kb, h, soff, k_tail))
                        continue
                    if const_expr(w_layout == "nk"):
                        voff = self.w_voff[nr] + (kb * 32 + h * 4 * kp) * esz
                        if const_expr(k_tail):
                            kk = kt * bk + (self.wk + kb) * 32 + h * 4 * kp + self.q * kp
                            voff = (kk < self.k).select(voff, fx.Int32(OOB))
                    else:
                        voff = self.w_voff[nr] + ((kb * self.cpb + h * 4) * 16 * kp) * wsz // wdiv
                    if const_expr(self.w_int8 or self.w_int4 or self.w_fp4):  # bytes / nibbles: converted in compute
                        ty = T.i32 if self.w_int4 else T.vec(2, T.i32) if self.w_fp4 else w8_load_type(kp)
                        regs.append(rocdl.raw_ptr_buffer_load(ty, self.rw, _raw(voff), _raw(soff), 0))
                        continue
                    regs.append(gload(self.rw, voff, soff))
        if const_expr(kbs is not None):
            return regs
        regs = [r if r is not None else regs[0] for r in regs]
        bs = self.bs
        return regs + (bs.load(kt, bk, k_tail) if self.mx else bs.load(kt, bk) if self.block or self.w_int4 else [])

    def load_kn_chunk(self, voff0, kt, kb, h, soff, k_tail):
        """kp scalar loads of rows k0 .. k0 + kp - 1 of a B[k, n] column, packed as one 16-byte chunk."""
        kp, esz = self.kp, self.esz
        elems = []
        for j in range_constexpr(kp):
            voff = voff0 + ((kb * 32 + h * 4 * kp + j) * self.n) * esz
            if const_expr(k_tail):
                kk = kt * self.bk + (self.wk + kb) * 32 + h * 4 * kp + self.q * kp + j
                voff = (kk < self.k).select(voff, fx.Int32(OOB))
            elems.append(rocdl.raw_ptr_buffer_load(_INT_T[esz](), self.rw, _raw(voff), _raw(soff), 0))
        return vector.bitcast(_v4i32(), vector.from_elements(T.vec(kp, _INT_T[esz]()), elems))
