"""Split-K inside one launch, for skinny GEMMs (decode, M <= 64): deterministic partial sums.

Why: a decode step's linear (M = 1..64 tokens, N = K = 4096) has few output tiles, so without a
K split a few hundred workgroups at most stream the weight, with too few bytes in flight to
reach HBM bandwidth. Splitting K over `split` workgroups per output tile multiplies the grid.
A second (reduction) launch would cost a launch gap of about a third of the whole GEMM at these
sizes, so the splits meet inside the GEMM launch:

  1. every workgroup (x, y + s * N_tiles, z) sums its K_pad / BK / split K tiles; lane 0 takes a
     ticket: an atomic add (acq_rel, agent scope) on its region's ticket counter Cnt[2 region] (a
     region is a tile, or a tile's wave with the default layout where each wave owns its columns);
  2. a workgroup whose ticket is not split - 1 stores its accumulators, as each lane holds them
     (one 16-byte store per 16x16 block, rows >= M skipped), to slot s of its region in the fp32
     workspace P ([region, split, accumulators, 64 lanes, 4]), then adds 1 to the region's done
     counter Cnt[2 region + 1] (acq_rel: the release makes its stores visible first);
  3. the workgroup that draws ticket split - 1 is the last of its region and stores nothing: it waits
     until the done counter reaches split - 1 (acquire reads by lane 0), resets both counters to 0
     (a launch that completes leaves Cnt all zero, so no clearing launch is needed), adds the slots
     in the fixed order 0, 1, ..., split - 1 (its own from registers) and runs the GEMM epilogue.
The wait cannot deadlock: it waits only for workgroups that already drew a ticket, so are running,
and that reach their count without waiting on anything. Under flysim, which runs every workgroup of a
launch in lockstep, the others' stores and counts come first in program order, so the last one's
wait ends at its first read. The atomic only decides who adds; what is added, and in which order, is
fixed by the code, so the result is bit-identical from run to run whichever workgroup draws the last
ticket. It differs from split = 1 only in fp32 rounding of K's partial sums (within the tolerance
table). Cost: split - 1 partial tiles written and read back (tiles.partial_bytes; storing first and
taking the ticket after, as before issue 29, wrote split), which the tile heuristic weighs against the
fuller grid.

Who owns Cnt: the launch. A launch that stops between drawing tickets and the resets (a flysim
error, a Ctrl-C, a device fault) leaves its counters non-zero, and any later launch that used them
would find no last arriver: its output would never be written. So counters are never shared
between launches that could overlap or follow a fault: `take_counters` hands a launch an array of
its own from a pool keyed by (device, stream), and `give_back` returns it only after the launch
call returned; a launch that raised drops its array (it is freed, never reused). The pool is per
stream because a GPU launch is asynchronous: the array returned after the host call is next handed
to a launch on the same stream, which runs after it, never beside it (two streams never share an
array). An array taken while a CUDA (HIP) graph is being captured belongs to the graph: it is
kept alive and never handed out again. Per-call replays replay the take and the give-back
(`replay.replay_value`, `replay.replay_effect`), so a replayed launch owns its counters too. Steady state
costs no clearing launch and no host synchronization; the first split-K launch on a stream, or
the first after a fault, allocates a zeroed array (one memset on the stream).

`add_wave_parts` is the same idea one level down (kw = 4: the 4 waves of a workgroup split each
K tile): the waves' accumulators meet in LDS and are added in wave order 0..3.
"""

from __future__ import annotations

import flydsl.expr as fx
import torch
from flydsl._mlir import ir
from flydsl._mlir.dialects import arith, llvm, scf, vector
from flydsl.expr import gpu, range_constexpr, rocdl
from flydsl.expr.typing import T

from translator_kernels.gemm.common import OOB, WAVES, _raw, _v4f32, _v4i32
from translator_kernels.replay import replay_value


def add_wave_parts(accs, lds_ptr, wave, lane):
    """Every wave's accumulators (list of vector<4xf32>) summed over the 4 waves, in wave order,
    through LDS (which must hold WAVES x len(accs) x 1 KiB; the A stages are free by now)."""
    n = len(accs)
    gpu.barrier()  # the last K step's LDS reads are done in every wave
    for i in range_constexpr(n):
        fx.ptr_store(vector.bitcast(_v4i32(), _raw(accs[i])), fx.add_offset(lds_ptr, _raw((wave * n + i) * 256 + lane * 4)))
    gpu.barrier()
    out = []
    for i in range_constexpr(n):
        tot = None
        for w in range_constexpr(WAVES):
            v = fx.Vector(vector.bitcast(_v4f32(), fx.ptr_load(fx.add_offset(lds_ptr, _raw(lane * 4 + (w * n + i) * 256)),
                                                              _v4i32())))
            tot = v if tot is None else tot + v
        out.append(_raw(tot))
    return out


def _rsrc(t, nbytes):
    return rocdl.get_buffer_rsrc(rocdl.make_buffer_ptr(fx.get_iter(t), num_records_bytes=fx.Int64(nbytes)))


def ticket(cnt, region, lane, add: int = 1):
    """Lane 0 adds `add` to cnt[region] (acq_rel, agent scope); every lane gets the old value (add 0: an acquire read)."""
    ptr = fx.to_llvm_ptr(fx.add_offset(fx.get_iter(cnt), _raw(region)))
    if_op = scf.IfOp(_raw(lane == 0), [T.i32], has_else=True)
    with ir.InsertionPoint(if_op.then_block):
        old = llvm.AtomicRMWOp(llvm.AtomicBinOp.add, ptr, _raw(fx.Int32(add)), llvm.AtomicOrdering.acq_rel,
                               syncscope="agent", alignment=4).res
        scf.YieldOp([old])
    with ir.InsertionPoint(if_op.else_block):
        scf.YieldOp([_raw(fx.Int32(0))])
    return fx.Int32(rocdl.readlane(T.i32, if_op.results[0], 0))


def _wait_for(cnt, idx, want, lane):
    """Spin until cnt[idx] reaches `want` (acquire reads by lane 0; the wave follows lane 0)."""
    w = scf.WhileOp([T.i32], [_raw(fx.Int32(0))])
    before = w.before.blocks.append(T.i32)
    with ir.InsertionPoint(before):
        seen = ticket(cnt, idx, lane, add=0)
        scf.ConditionOp(_raw(seen < want), [_raw(seen)])
    after = w.after.blocks.append(T.i32)
    with ir.InsertionPoint(after):
        scf.YieldOp([after.arguments[0]])


def reduce_splits(accs, store, P, Cnt, p_bytes, cnt_bytes, region, s_idx, split, rows_ok, n_rep, lane):
    """Steps 1-3 of the module docstring for one region; `store(accs)` is the GEMM epilogue.
    rows_ok[mr]: whether the lane's first row of row block mr is < M (else its slot stays unwritten).
    Cnt[2 region] hands out the tickets, Cnt[2 region + 1] counts the partials stored."""
    n = len(accs)
    rp, rcnt = _rsrc(P, p_bytes), _rsrc(Cnt, cnt_bytes)
    zero = _raw(fx.Int32(0))

    def slot(s, i):
        return (((region * split + s) * n + i) * 64 + lane) * 16

    t = ticket(Cnt, 2 * region, lane)
    # the others first, in program order: under flysim's lockstep run their stores precede the last one's wait
    keep = scf.IfOp(_raw(t != split - 1), has_else=False)
    with ir.InsertionPoint(keep.then_block):
        for i in range_constexpr(n):
            rocdl.raw_ptr_buffer_store(_raw(accs[i]), rp, _raw(rows_ok[i // n_rep].select(slot(s_idx, i), fx.Int32(OOB))),
                                       zero)
        ticket(Cnt, 2 * region + 1, lane)  # release: the stores above are visible before the count
        scf.YieldOp([])
    last = scf.IfOp(_raw(t == split - 1), has_else=False)
    with ir.InsertionPoint(last.then_block):
        _wait_for(Cnt, 2 * region + 1, split - 1, lane)
        for c in range_constexpr(2):
            rocdl.raw_ptr_buffer_store(zero, rcnt, _raw((lane == 0).select((2 * region + c) * 4, fx.Int32(OOB))), zero)
        tot = []
        for i in range_constexpr(n):
            acc = None
            for s in range_constexpr(split):
                mine = s_idx == s
                off = (rows_ok[i // n_rep] & (s_idx != s)).select(slot(s, i), fx.Int32(OOB))
                v = rocdl.raw_ptr_buffer_load(_v4f32(), rp, _raw(off), zero)
                v = fx.Vector(arith.select(_raw(mine), _raw(accs[i]), v))
                acc = v if acc is None else acc + v
            tot.append(_raw(acc))
        store(tot)
        scf.YieldOp([])


MIN_COUNTERS = 4096  # an array holds at least this many regions (one array serves most GEMMs of a model)
_POOL: dict = {}  # (device, stream handle or None) -> free int32 counter arrays, all zero
_CAPTURED: list = []  # arrays baked into a captured CUDA (HIP) graph: alive, never handed out again


_CUDA: dict = {}  # device -> whether it is a CUDA (HIP) device (device.type costs ~1 us a read)


def _pool_key(device):
    cuda = _CUDA.get(device)
    if cuda is None:
        cuda = _CUDA[device] = device.type == "cuda"
    return (device, torch.cuda.current_stream(device).cuda_stream) if cuda else (device, None)


def take_counters(device, regions: int):
    """A zeroed int32 counter array of >= `regions` entries that this launch owns until `give_back`."""
    free = _POOL.get(_pool_key(device))
    while free:
        try:
            cnt = free.pop()
        except IndexError:  # another thread took the last one
            break
        if cnt.numel() >= regions:
            return cnt
    return torch.zeros(max(regions, MIN_COUNTERS), dtype=torch.int32, device=device)


def give_back(cnt) -> None:
    """Return a launch's counters to its stream's pool: call it only after the launch call returned
    (a launch that completes leaves them zero; one that raised must not return them)."""
    if cnt.is_cuda and torch.cuda.is_current_stream_capturing():
        _CAPTURED.append(cnt)
        return
    key = _pool_key(cnt.device)
    free = _POOL.get(key)
    if free is None:
        free = _POOL.setdefault(key, [])
    free.append(cnt)


def splitk_workspace(device, tiles: int, cfg):
    """(P, Cnt) for a split-K launch over `tiles` output tiles: P is fresh fp32 scratch, Cnt zeroed
    counters (one per region) owned by this launch: pass Cnt to `give_back` once the launch call
    has returned, never after it raised (see the module notes)."""
    p = torch.empty(tiles * cfg.split * cfg.bm * cfg.bn, dtype=torch.float32, device=device)
    return p, replay_value(take_counters, device, 2 * tiles * (WAVES // cfg.kw))
