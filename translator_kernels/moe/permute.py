"""Token permutation for the grouped GEMM, and the weighted un-permute after it.

`build_moe_align` (one workgroup, lane e = expert e, E <= 256): a counting sort of the T·k
(token, choice) pairs by expert. Pair p = t·k + j has expert ids[p]. The ids are read in chunks of
256: each lane loads one (coalesced) into LDS, then every lane scans the chunk there, so a lane's
serial work is T·k LDS reads (tens of cycles each) and T·k / 256 global loads, not T·k dependent
global loads (a memory latency each: bench.moe_model priced those at 11 ms for a 2k-token Mixtral
prefill).
  1. lane e counts its pairs and rounds the count up to the GEMM's row tile BM (padded_e);
  2. the padded counts meet in LDS; lane e's offset is the sum of the padded counts before it
     (a fixed order: the layout does not depend on scheduling), `total` the sum of them all;
  3. lane e walks the pairs again in order: its i-th pair gets slot offset_e + i
     (pos[p] = slot, src_row[slot] = t); its padding slots get src_row = -1;
  4. tile_expert[tile] = e for the tiles of [offset_e, offset_e + padded_e); the tiles past
     `total` (the buffer is sized for the worst case) get -1, their slots src_row = -2 (TAIL_ROW): the
     gather writes nothing there and the grouped GEMM's workgroups of those tiles exit before any load
     (tile_exit.py).
So every BM tile of the permuted rows belongs to one expert, which is what the grouped GEMM needs
(kernel.build_gemm `grouped`: the tile's expert picks the weight). The pairs of one expert stay in
token order. Each lane still scans the T·k ids twice (from LDS): O(T·k) per lane; a multi-workgroup
histogram is the next step for long prefill.

`build_moe_gather`: xs[slot, :] = x[src_row[slot], :], zeros where src_row = -1 (an expert's padding), nothing
where src_row = -2 (a slot past the real total: the grouped GEMM's tile of it exits, tile_exit.py); moves bits, one
thread per 16-byte (or 4- / 2-byte, as the row length allows) piece.

`build_moe_unpermute`: out[t, c] = sum_j w[t, j] · y[pos[t·k + j], c] (+ residual[t, c]), the k terms
added in j order in fp32, one cast: a gather, so no atomics and the same bits run to run. A pair
with pos -1 (its expert lives on another rank) adds nothing.
"""

# (no `from __future__ import annotations`: fx.struct reads its field annotations as types)

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import const_expr, gpu, range_constexpr, rocdl
from flydsl.expr.typing import T

from translator_kernels import launch as kl
from translator_kernels.gemm.common import OOB, _raw, _v4i32
from translator_kernels.moe.tile_exit import PAST_TOTAL

ALIGN_LANES = 256
TAIL_ROW = -2  # src_row of a slot past the real padded total (an expert's padding slot holds -1)
BLOCK = 256
_ELEM = {"f32": fx.Float32, "bf16": fx.BFloat16, "f16": fx.Float16}


def _rsrc(t, nbytes):
    return rocdl.get_buffer_rsrc(rocdl.make_buffer_ptr(fx.get_iter(t), num_records_bytes=fx.Int64(nbytes)))


def _ld32(r, idx):
    return fx.Int32(rocdl.raw_ptr_buffer_load(T.i32, r, _raw(idx * 4), _raw(fx.Int32(0))))


def _st32(val, r, idx, ok):
    """Store an int32 at element idx where ok (elsewhere the offset is past the descriptor: dropped)."""
    rocdl.raw_ptr_buffer_store(_raw(fx.Int32(val)), r, _raw(ok.select(idx * 4, fx.Int32(OOB))), _raw(fx.Int32(0)))


@kl.builder
def build_moe_align(e: int, k: int, bm: int, words: int, arch: str, first: int = 0):
    """first: the first expert id this launch serves (expert parallel: a rank holds experts
    [first, first + e)); a pair routed elsewhere gets pos -1 and no slot.

    Launcher `launch(Ids32, SrcRow, TileExpert, Pos, n_pairs, cap, ids_bytes)`: Ids32 the [T, k]
    ids as int32 words (`words` per id: 1 int32, 2 int64), SrcRow [cap] / TileExpert [cap / bm] /
    Pos [n_pairs] int32, cap a multiple of bm. arch keys the cache."""

    @fx.struct
    class Smem:
        padded: fx.Array[fx.Int32, ALIGN_LANES, 16]
        ids: fx.Array[fx.Int32, ALIGN_LANES, 16]  # one chunk of ids, staged for every lane to scan

    @flyc.kernel(known_block_size=[ALIGN_LANES, 1, 1])
    def moe_align_kernel(Ids: fx.Tensor, SrcRow: fx.Tensor, TileExpert: fx.Tensor, Pos: fx.Tensor, n_pairs: fx.Int32,
                         cap: fx.Int32, ids_bytes: fx.Int32):
        lane = fx.Int32(fx.thread_idx.x)
        live = lane < e
        r_ids = _rsrc(Ids, ids_bytes)
        r_src, r_tile, r_pos = _rsrc(SrcRow, cap * 4), _rsrc(TileExpert, (cap // bm) * 4), _rsrc(Pos, n_pairs * 4)
        lds = fx.SharedAllocator().allocate(Smem).peek()
        chunks = (n_pairs + (ALIGN_LANES - 1)) // ALIGN_LANES

        def stage(c):
            """Chunk c's ids (minus `first`; -1 past the end) into LDS, one coalesced load per lane; the
            lane's own pair and its id are returned."""
            p = c * ALIGN_LANES + lane
            ok = p < n_pairs
            lid = ok.select(_ld32(r_ids, ok.select(p, fx.Int32(0)) * words) - first, fx.Int32(-1))
            fx.ptr_store(lid, fx.add_offset(lds.ids.ptr, _raw(lane)))
            gpu.barrier()
            return p, ok, lid

        def staged(j):
            return fx.Int32(fx.ptr_load(fx.add_offset(lds.ids.ptr, _raw(fx.Int32(j))), T.i32))

        for c_idx, st in range(fx.Index(0), fx.Index(chunks), fx.Index(1), init=[fx.Int32(0)]):
            stage(fx.Int32(c_idx))
            for j_idx, sj in range(fx.Index(0), fx.Index(ALIGN_LANES), fx.Index(1), init=[st[0]]):
                res_j = yield [sj[0] + (staged(j_idx) == lane).select(fx.Int32(1), fx.Int32(0))]
            gpu.barrier()  # every lane has read the chunk before the next one is staged
            res = yield [res_j[0] if isinstance(res_j, (list, tuple)) else res_j]
        cnt = res[0] if isinstance(res, (list, tuple)) else res
        padded = live.select((cnt + (bm - 1)) // bm * bm, fx.Int32(0))
        fx.ptr_store(padded, fx.add_offset(lds.padded.ptr, _raw(lane)))
        gpu.barrier()
        for j_idx, st in range(fx.Index(0), fx.Index(e), fx.Index(1), init=[fx.Int32(0), fx.Int32(0)]):
            j = fx.Int32(j_idx)
            v = fx.Int32(fx.ptr_load(fx.add_offset(lds.padded.ptr, _raw(j)), T.i32))
            res2 = yield [st[0] + (j < lane).select(v, fx.Int32(0)), st[1] + v]
        off, total = res2[0], res2[1]
        # the pairs of expert `lane`, in order (chunk by chunk, each scanned in order): slot off + i
        for c_idx, st in range(fx.Index(0), fx.Index(chunks), fx.Index(1), init=[fx.Int32(0)]):
            c = fx.Int32(c_idx)
            p_own, ok, lid_own = stage(c)
            _st32(-1, r_pos, p_own, ok & ((lid_own < 0) | (lid_own >= e)))  # another rank's expert
            for j_idx, sj in range(fx.Index(0), fx.Index(ALIGN_LANES), fx.Index(1), init=[st[0]]):
                p = c * ALIGN_LANES + fx.Int32(j_idx)
                hit = (staged(j_idx) == lane) & live
                slot = off + sj[0]
                _st32(slot, r_pos, p, hit)
                _st32(p // k, r_src, slot, hit)
                res_j = yield [sj[0] + hit.select(fx.Int32(1), fx.Int32(0))]
            gpu.barrier()
            _ = yield [res_j[0] if isinstance(res_j, (list, tuple)) else res_j]
        for i in range_constexpr(bm):  # this expert's padding slots
            _st32(-1, r_src, off + cnt + i, live & (cnt + i < padded))
        for t_idx, st in range(fx.Index(0), fx.Index(cap // bm), fx.Index(1), init=[fx.Int32(0)]):
            row0 = fx.Int32(t_idx) * bm
            mine = live & (row0 >= off) & (row0 < off + padded)
            tail = (lane == 0) & (row0 >= total)
            _st32(tail.select(fx.Int32(PAST_TOTAL), lane), r_tile, fx.Int32(t_idx), mine | tail)
            _ = yield [st[0]]
        for i_idx, st in range(fx.Index(0), fx.Index((cap + (ALIGN_LANES - 1)) // ALIGN_LANES), fx.Index(1),
                               init=[fx.Int32(0)]):
            s = fx.Int32(i_idx) * ALIGN_LANES + lane
            _st32(TAIL_ROW, r_src, s, (s >= total) & (s < cap))
            _ = yield [st[0]]

    @flyc.jit
    def launch(Ids: fx.Tensor, SrcRow: fx.Tensor, TileExpert: fx.Tensor, Pos: fx.Tensor, n_pairs: fx.Int32,
               cap: fx.Int32, ids_bytes: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        moe_align_kernel(Ids, SrcRow, TileExpert, Pos, n_pairs, cap, ids_bytes).launch(
            grid=(1, 1, 1), block=(ALIGN_LANES, 1, 1), stream=stream)

    return launch


_PIECE = {16: _v4i32, 4: lambda: T.i32, 2: lambda: T.i16}


@kl.builder
def build_moe_gather(row_bytes: int, piece: int, arch: str):
    """Launcher `launch(X, SrcRow, Xs, cap, x_bytes)`: Xs[s] = X[SrcRow[s]] (zeros where SrcRow[s] = -1, not
    written where it is TAIL_ROW),
    rows of `row_bytes` moved in `piece`-byte pieces. arch keys the cache."""
    ppr = row_bytes // piece  # pieces per row

    @flyc.kernel(known_block_size=[BLOCK, 1, 1])
    def moe_gather_kernel(X: fx.Tensor, SrcRow: fx.Tensor, Xs: fx.Tensor, cap: fx.Int32, x_bytes: fx.Int32):
        v = fx.Int32(fx.block_idx.x) * BLOCK + fx.Int32(fx.thread_idx.x)
        live = v < cap * ppr
        slot = live.select(v // ppr, fx.Int32(0))
        col = v % ppr
        src = _ld32(_rsrc(SrcRow, cap * 4), slot)
        ok = live & (src >= 0)
        zero = _raw(fx.Int32(0))
        # a padding slot (src < 0) reads past the descriptor: the hardware returns zeros
        x_off = ok.select(src * row_bytes + col * piece, fx.Int32(OOB))
        x = rocdl.raw_ptr_buffer_load(_PIECE[piece](), _rsrc(X, x_bytes), _raw(x_off), zero)
        out_off = (live & (src != TAIL_ROW)).select(slot * row_bytes + col * piece, fx.Int32(OOB))
        rocdl.raw_ptr_buffer_store(_raw(x), _rsrc(Xs, cap * row_bytes), _raw(out_off), zero)

    @flyc.jit
    def launch(X: fx.Tensor, SrcRow: fx.Tensor, Xs: fx.Tensor, cap: fx.Int32, x_bytes: fx.Int32,
               stream: fx.Stream = fx.Stream(None)):
        moe_gather_kernel(X, SrcRow, Xs, cap, x_bytes).launch(
            grid=((cap * ppr + (BLOCK - 1)) // BLOCK, 1, 1), block=(BLOCK, 1, 1), stream=stream)

    return launch


@kl.builder
def build_moe_unpermute(h: int, k: int, dt: str, out_dt: str, has_residual: bool, arch: str):
    """Launcher `launch(Y, W, Pos, Res, Out, t)`: Y [cap, h] (dtype dt), W [t, k] fp32, Pos [t·k] int32,
    Res / Out [t, h] (out_dt; Res ignored without a residual). arch keys the cache."""
    elem, out_elem = _ELEM[dt], _ELEM[out_dt]

    def load(ptr, idx, et):
        v = fx.ptr_load(ptr + fx.Int64(idx), result_type=et)
        return fx.Float32(v) if et is fx.Float32 else fx.Float32(v.to(fx.Float32))

    @flyc.kernel(known_block_size=[BLOCK, 1, 1])
    def moe_unpermute_kernel(Y: fx.Tensor, W: fx.Tensor, Pos: fx.Tensor, Res: fx.Tensor, Out: fx.Tensor, t: fx.Int32):
        v = fx.Int32(fx.block_idx.x) * BLOCK + fx.Int32(fx.thread_idx.x)
        live = v < t * h
        vv = live.select(v, fx.Int32(0))
        tok, col = vv // h, vv % h
        yp = fx.get_iter(fx.rocdl.make_buffer_tensor(Y))
        wp = fx.get_iter(fx.rocdl.make_buffer_tensor(W))
        pp = fx.get_iter(fx.rocdl.make_buffer_tensor(Pos))
        acc = fx.Float32(0.0)
        for j in range_constexpr(k):
            slot = fx.Int32(fx.ptr_load(pp + fx.Int64(tok * k + j), result_type=fx.Int32))
            mine = slot >= 0
            term = load(wp, tok * k + j, fx.Float32) * load(yp, mine.select(slot, fx.Int32(0)) * h + col, elem)
            acc = acc + mine.select(term, fx.Float32(0.0))
        if const_expr(has_residual):
            acc = acc + load(fx.get_iter(fx.rocdl.make_buffer_tensor(Res)), vv, out_elem)
        out = acc if out_dt == "f32" else acc.to(out_elem)
        if live:
            fx.ptr_store(out, fx.get_iter(fx.rocdl.make_buffer_tensor(Out)) + fx.Int64(vv))

    @flyc.jit
    def launch(Y: fx.Tensor, W: fx.Tensor, Pos: fx.Tensor, Res: fx.Tensor, Out: fx.Tensor, t: fx.Int32,
               stream: fx.Stream = fx.Stream(None)):
        moe_unpermute_kernel(Y, W, Pos, Res, Out, t).launch(
            grid=((t * h + (BLOCK - 1)) // BLOCK, 1, 1), block=(BLOCK, 1, 1), stream=stream)

    return launch
