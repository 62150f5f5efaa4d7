"""Kernels of ours that reproduce, in a few lines, patterns found in upstream FlyDSL kernels
(written for these tests, in the same style; no upstream code)."""

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu

WAVE = 64


def build_count_rewrite(n_bins=8, threads=4 * WAVE, spare=0):
    """The counting-sort step of a MoE sorting kernel: slot[0] is a dump slot that lanes without a
    bin (tid >= n_bins) read and rewrite, in every wave, within one barrier interval.

    slot[0] = 0 and slot[t + 1] = X[t] (t < n_bins); barrier; each lane reads slot[t + 1] (or the
    dump slot) and writes back 2 * value (or ``spare + 0 * value``); barrier; Out[t] = slot[t]
    for t <= n_bins. With spare = 0 every dump-slot store writes the value the slot holds (a
    benign race: the result is the same in every order); spare != 0 is a real race.
    """

    @fx.struct
    class Smem:
        slot: fx.Array[fx.Int32, n_bins + 1, 16]

    @flyc.kernel(known_block_size=[threads, 1, 1])
    def count_rewrite_kernel(X: fx.Tensor, Out: fx.Tensor):
        tid = fx.Int32(gpu.thread_idx.x)
        zero = fx.Int32(0)
        slot = fx.SharedAllocator().allocate(Smem).peek().slot.ptr
        valid = tid < fx.Int32(n_bins)
        at = valid.select(tid + fx.Int32(1), zero)
        fx.ptr_store(zero, slot + fx.Int64(zero))  # every lane of every wave: slot[0] = 0
        if valid:
            fx.ptr_store(X[tid], slot + fx.Int64(at))
        gpu.barrier()
        v = fx.ptr_load(slot + fx.Int64(at))
        fx.ptr_store(valid.select(v * fx.Int32(2), fx.Int32(spare) + v * zero), slot + fx.Int64(at))
        gpu.barrier()
        if tid <= fx.Int32(n_bins):
            Out[tid] = fx.ptr_load(slot + fx.Int64(tid))

    @flyc.jit
    def count_rewrite(X: fx.Tensor, Out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        count_rewrite_kernel(X, Out).launch(grid=(1, 1, 1), block=(threads, 1, 1), stream=stream)

    return count_rewrite


def build_same_op_store(by_wave):
    """One store instruction in which lanes of all 4 waves write LDS word 0: the value 7 (the same
    everywhere, benign) or, with ``by_wave``, their wave's number (a race between the waves)."""

    @fx.struct
    class Smem:
        word: fx.Array[fx.Int32, 4, 16]

    @flyc.kernel(known_block_size=[4 * WAVE, 1, 1])
    def same_op_kernel(Out: fx.Tensor):
        tid = fx.Int32(gpu.thread_idx.x)
        word = fx.SharedAllocator().allocate(Smem).peek().word.ptr
        fx.ptr_store(tid // fx.Int32(WAVE) if by_wave else fx.Int32(7), word + fx.Int64(fx.Int32(0)))
        gpu.barrier()
        Out[tid] = fx.ptr_load(word + fx.Int64(fx.Int32(0)))

    @flyc.jit
    def same_op_store(Out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        same_op_kernel(Out).launch(grid=(1, 1, 1), block=(4 * WAVE, 1, 1), stream=stream)

    return same_op_store


def build_past_lds(n=16, threads=2 * WAVE):
    """Every lane stores X[t] to slot[t] and loads slot[t] back, keeping the value only for
    t < n: lanes t >= n address past the n-slot LDS (a MoE sorting kernel's unguarded
    ``select(valid, lds[t + 1], 0)``). Out[t] = X[t] for t < n, else -1."""

    @fx.struct
    class Smem:
        slot: fx.Array[fx.Int32, n, 16]

    @flyc.kernel(known_block_size=[threads, 1, 1])
    def past_lds_kernel(X: fx.Tensor, Out: fx.Tensor):
        tid = fx.Int32(gpu.thread_idx.x)
        slot = fx.SharedAllocator().allocate(Smem).peek().slot.ptr
        fx.ptr_store(X[tid], slot + fx.Int64(tid))
        gpu.barrier()
        v = fx.ptr_load(slot + fx.Int64(tid))
        Out[tid] = (tid < fx.Int32(n)).select(v, fx.Int32(-1))

    @flyc.jit
    def past_lds(X: fx.Tensor, Out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        past_lds_kernel(X, Out).launch(grid=(1, 1, 1), block=(threads, 1, 1), stream=stream)

    return past_lds


def build_buffer_atomics(elem, nbytes, threads=2 * WAVE):
    """The buffer atomics FlyDSL's MoE GEMM epilogues emit, through a descriptor of ``nbytes``
    bytes of Acc: lane t adds the pair (X[2t], X[2t + 1]) of ``elem`` (fx.BFloat16 / fx.Float16:
    buffer_atomic_pk_add_*, a vector<2x..> operand) at element pair Idx[t] of Acc, takes the
    float max of F[t] into Mx[Idx[t]] and swaps Cas[Idx[t]] from Idx[t] to t (one lane wins
    per slot); Old[t] = the value its swap found."""
    from flydsl._mlir.dialects import rocdl
    from flydsl.expr.typing import T
    from flydsl.expr.typing import Vector as Vec

    def rsrc(t, n):
        return fx.rocdl.get_buffer_rsrc(fx.get_iter(fx.rocdl.make_buffer_tensor(t, num_records_bytes=n)))

    @flyc.kernel(known_block_size=[threads, 1, 1])
    def buffer_atomics_kernel(X: fx.Tensor, F: fx.Tensor, Idx: fx.Tensor, Acc: fx.Tensor, Mx: fx.Tensor,
                              Cas: fx.Tensor, Old: fx.Tensor):
        tid = fx.Int32(gpu.thread_idx.x)
        zero = fx.Int32(0)
        i = fx.Int32(Idx[tid])
        pair = Vec.from_elements([X[2 * tid], X[2 * tid + 1]], elem)
        fx.rocdl.raw_ptr_buffer_atomic_fadd(pair, rsrc(Acc, nbytes), i * fx.Int32(4), zero, 0)
        fx.rocdl.raw_ptr_buffer_atomic_fmax(F[tid], rsrc(Mx, nbytes), i * fx.Int32(4), zero, 0)
        old = rocdl.raw_ptr_buffer_atomic_cmpswap(T.i32, tid.ir_value(), i.ir_value(), rsrc(Cas, nbytes),
                                                  (i * fx.Int32(4)).ir_value(), zero.ir_value())
        Old[tid] = fx.Int32(old)

    @flyc.jit
    def buffer_atomics(X: fx.Tensor, F: fx.Tensor, Idx: fx.Tensor, Acc: fx.Tensor, Mx: fx.Tensor, Cas: fx.Tensor,
                       Old: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        buffer_atomics_kernel(X, F, Idx, Acc, Mx, Cas, Old).launch(grid=(1, 1, 1), block=(threads, 1, 1),
                                                                   stream=stream)

    return buffer_atomics


def build_lds_exchange(sync):
    """Two waves: each lane stores X[t] to LDS slot t, the waves synchronize by ``sync``, and each
    lane reads the other wave's slot (t + 64) % 128 into Out[t]. ``sync``: "gpu" (gpu.barrier,
    fenced), "wait" (rocdl s_waitcnt lgkmcnt(0) then a bare rocdl.s.barrier), "bare" (the bare
    barrier alone: the seeded missing wait), "asm_wait" / "asm_bare" (the same in inline asm)."""
    from flydsl._mlir.dialects import llvm
    from flydsl.expr import rocdl

    @fx.struct
    class Smem:
        buf: fx.Array[fx.Int32, 128, 16]

    def asm(text):
        llvm.InlineAsmOp(None, [], text, "", has_side_effects=True)

    @flyc.kernel(known_block_size=[128, 1, 1])
    def lds_exchange_kernel(X: fx.Tensor, Out: fx.Tensor):
        tid = fx.Int32(gpu.thread_idx.x)
        buf = fx.SharedAllocator().allocate(Smem).peek().buf.view(fx.make_layout(128, 1))
        fx.memref_store(X[tid], buf, tid)
        if sync == "gpu":
            gpu.barrier()
        elif sync in ("wait", "bare"):
            if sync == "wait":
                rocdl.s_waitcnt(0xC07F)  # lgkmcnt(0) only (vmcnt 63, expcnt 7)
            rocdl.s_barrier()
        else:
            asm(("s_waitcnt lgkmcnt(0)\n\t" if sync == "asm_wait" else "") + "s_barrier")
        Out[tid] = fx.memref_load(buf, (tid + 64) % 128)

    @flyc.jit
    def lds_exchange(X: fx.Tensor, Out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        lds_exchange_kernel(X, Out).launch(grid=(1, 1, 1), block=(128, 1, 1), stream=stream)

    return lds_exchange
