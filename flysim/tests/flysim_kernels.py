"""Small FlyDSL kernels that flysim's tests run (written for these tests)."""


import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu

WAVE = 64


def build_add(block=64, guarded=True):
    """C[i] = A[i] + B[i] for i < n; the unguarded variant reads past the end."""

    @flyc.kernel
    def add_kernel(A: fx.Tensor, B: fx.Tensor, C: fx.Tensor, n: fx.Int32):
        i = fx.block_idx.x * block + fx.thread_idx.x
        if guarded:
            if i < n:
                C[i] = A[i] + B[i]
        else:
            C[i] = A[i] + B[i]

    @flyc.jit
    def add(A: fx.Tensor, B: fx.Tensor, C: fx.Tensor, n: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        add_kernel(A, B, C, n).launch(grid=((n + block - 1) // block, 1, 1), block=(block, 1, 1), stream=stream)

    return add


def build_row_sum(threads=256, barrier=True):
    """out[row] = sum(x[row, :threads]): wave shuffles, then LDS across waves."""
    waves = threads // WAVE

    @fx.struct
    class Smem:
        part: fx.Array[fx.Float32, waves, 16]

    @flyc.kernel
    def row_sum_kernel(X: fx.Tensor, Out: fx.Tensor):
        row = fx.block_idx.x
        tid = fx.thread_idx.x
        lane = tid % WAVE
        wave = tid // WAVE
        smem = fx.SharedAllocator().allocate(Smem).peek()
        part = smem.part.view(fx.make_layout(waves, 1))
        v = X[row * threads + tid]
        for k in fx.range_constexpr(6):
            v = v + v.shuffle_xor(WAVE >> (k + 1), WAVE)
        if lane == 0:
            fx.memref_store(v, part, wave)
        if barrier:
            gpu.barrier()
        if tid == 0:
            total = fx.memref_load(part, 0)
            for w in fx.range_constexpr(1, waves):
                total = total + fx.memref_load(part, w)
            Out[row] = total

    @flyc.jit
    def row_sum(X: fx.Tensor, Out: fx.Tensor, rows: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        row_sum_kernel(X, Out).launch(grid=(rows, 1, 1), block=(threads, 1, 1), stream=stream)

    return row_sum


def _mma_and_store(mma_atom, fa, fb, fc, c_copy, cc, C):
    fx.gemm(mma_atom, fc, fa, fb, fc)
    fx.copy(c_copy, cc.retile(fc), cc.partition_S(C), pred=None)


def build_mma_tile(m, n, k, elem, elem_bits, *, acc=None, tiles=1, load_c=False, active=None, atom=None):
    """C = A @ B.T (+ C when ``load_c``) for one MFMA atom tile per workgroup of one wave.

    A: (tiles*m) x k, B: (tiles*n) x k, C: (tiles*m) x n (f32, or ``acc`` = fx.Int32 for i8);
    workgroup b works on tile b. With ``active``, only workgroups b < active run the MFMA
    (a branch the other waves skip entirely); the others leave their C tile untouched.
    """
    acc_t = acc or fx.Float32

    @flyc.kernel
    def mma_tile_kernel(A: fx.Tensor, B: fx.Tensor, C: fx.Tensor):
        tid = fx.thread_idx.x
        bid = fx.block_idx.x
        A = fx.rocdl.make_buffer_tensor(A)
        B = fx.rocdl.make_buffer_tensor(B)
        C = fx.rocdl.make_buffer_tensor(C)
        A = fx.slice(fx.zipped_divide(A, (m, k)), (None, bid))
        B = fx.slice(fx.zipped_divide(B, (n, k)), (None, bid))
        C = fx.slice(fx.zipped_divide(C, (m, n)), (None, bid))
        mma_atom = fx.make_mma_atom(atom() if atom else fx.rocdl.MFMA(m, n, k, elem, acc))
        tiled = fx.make_tiled_mma(mma_atom, fx.make_layout((1, 1, 1), (0, 0, 0)))
        thr = tiled.thr_slice(tid)
        ab_copy = fx.make_copy_atom(fx.rocdl.BufferCopy32b() if elem_bits == 32 else
                                    fx.rocdl.BufferCopy16b() if elem_bits == 16 else fx.rocdl.BufferCopy8b(), elem_bits)
        c_copy = fx.make_copy_atom(fx.rocdl.BufferCopy32b(), acc_t)
        ca = fx.make_tiled_copy_A(ab_copy, tiled).get_slice(tid)
        cb = fx.make_tiled_copy_B(ab_copy, tiled).get_slice(tid)
        cc = fx.make_tiled_copy_C(c_copy, tiled).get_slice(tid)
        fa, fb, fc = thr.make_fragment_A(A), thr.make_fragment_B(B), thr.make_fragment_C(C)
        fx.copy(ab_copy, ca.partition_S(A), ca.retile(fa), pred=None)
        fx.copy(ab_copy, cb.partition_S(B), cb.retile(fb), pred=None)
        if load_c:
            fx.copy(c_copy, cc.partition_S(C), cc.retile(fc), pred=None)
        else:
            fc.fill(0)
        if active is None:
            _mma_and_store(mma_atom, fa, fb, fc, c_copy, cc, C)
        else:
            if bid < active:
                _mma_and_store(mma_atom, fa, fb, fc, c_copy, cc, C)

    @flyc.jit
    def mma_tile(A: fx.Tensor, B: fx.Tensor, C: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        mma_tile_kernel(A, B, C).launch(grid=(tiles, 1, 1), block=(WAVE, 1, 1), stream=stream)

    return mma_tile


def build_transpose_read(gran=16):
    """gfx950 ds_read_tr<gran>_b64: lane l stages X[8l:8l+8) bytes in LDS, then reads transposed."""
    from flydsl._mlir import ir
    from flydsl.expr import rocdl
    from flydsl.expr.typing import Vector as Vec

    def read(ptr):
        if gran == 16:
            return Vec(rocdl.ds_read_tr16_b64(ir.VectorType.get([4], ir.IntegerType.get_signless(16)), ptr).result)
        i32x2 = ir.VectorType.get([2], ir.IntegerType.get_signless(32))
        return Vec(rocdl.ds_read_tr8_b64(i32x2, ptr).result).bitcast(fx.Int16)

    @fx.struct
    class Smem:
        buf: fx.Array[fx.Int16, 4 * WAVE, 16]

    @flyc.kernel
    def tr_kernel(X: fx.Tensor, Out: fx.Tensor):
        tid = fx.thread_idx.x
        smem = fx.SharedAllocator().allocate(Smem).peek()
        buf = smem.buf.view(fx.make_layout(4 * WAVE, 1))
        for j in fx.range_constexpr(4):
            fx.memref_store(X[4 * tid + j], buf, 4 * tid + j)
        gpu.barrier()
        ptr = fx.to_llvm_ptr(fx.add_offset(smem.buf.ptr, 4 * tid))
        v = read(ptr)
        for j in fx.range_constexpr(4):
            Out[4 * tid + j] = v[j]

    @flyc.jit
    def transpose_read(X: fx.Tensor, Out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        tr_kernel(X, Out).launch(grid=(1, 1, 1), block=(WAVE, 1, 1), stream=stream)

    return transpose_read


def build_asm_select(thr=3):
    """Out[i] = X[i] < thr ? Fill : Y[i] and Mask[i] = the wave's compare mask, through inline asm."""
    from flydsl._mlir import ir
    from flydsl._mlir.dialects import llvm

    asm = f"v_cmp_lt_i32_e64 $0, $3, {thr}\n\tv_cndmask_b32_e64 $1, $2, $4, $0"

    def pick(x, y, fill):
        i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
        ret = llvm.inline_asm(ir.Type.parse("!llvm.struct<(i64, i32)>"), [y.ir_value(), x.ir_value(), fill.ir_value()],
                              asm, "=s,=v,1,v,v,~{vcc}", has_side_effects=True)
        return fx.Int32(llvm.extractvalue(i32, ret, [1])), fx.Int64(llvm.extractvalue(i64, ret, [0]))

    @flyc.kernel
    def asm_kernel(X: fx.Tensor, Y: fx.Tensor, Out: fx.Tensor, Mask: fx.Tensor):
        i = fx.thread_idx.x
        v, m = pick(X[i], Y[i], fx.Int32(-7))
        Out[i] = v
        Mask[i] = m

    @flyc.jit
    def asm_select(X: fx.Tensor, Y: fx.Tensor, Out: fx.Tensor, Mask: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        asm_kernel(X, Y, Out, Mask).launch(grid=(1, 1, 1), block=(2 * WAVE, 1, 1), stream=stream)

    return asm_select


def _i32(x):
    return fx.Int32(x).ir_value()


def build_buffer_offsets(nbytes=None):
    """Raw buffer load and store at byte offset voffset + soffset (the soffsets runtime arguments).

    Lane t loads the dword at 4 t + load_soff of X (a descriptor of ``nbytes`` bytes, None:
    the whole tensor) and stores it at 4 t + store_soff of Out.
    """
    from flydsl._mlir import ir
    from flydsl._mlir.dialects import rocdl

    def rsrc(t, n=None):
        buf = fx.rocdl.make_buffer_tensor(t, num_records_bytes=n) if n is not None else fx.rocdl.make_buffer_tensor(t)
        return fx.rocdl.get_buffer_rsrc(fx.get_iter(buf))

    @flyc.kernel
    def offsets_kernel(X: fx.Tensor, Out: fx.Tensor, load_soff: fx.Int32, store_soff: fx.Int32):
        tid = fx.thread_idx.x
        i32 = ir.IntegerType.get_signless(32)
        v = rocdl.raw_ptr_buffer_load(i32, rsrc(X, nbytes), _i32(tid * 4), load_soff.ir_value())
        rocdl.raw_ptr_buffer_store(v, rsrc(Out), _i32(tid * 4), store_soff.ir_value())

    @flyc.jit
    def buffer_offsets(X: fx.Tensor, Out: fx.Tensor, load_soff: fx.Int32, store_soff: fx.Int32,
                       stream: fx.Stream = fx.Stream(None)):
        offsets_kernel(X, Out, load_soff, store_soff).launch(grid=(1, 1, 1), block=(WAVE, 1, 1), stream=stream)

    return buffer_offsets


def build_buffer_to_lds(size, imm, asynchronous=False, waves=2, cross=False, vmcnt=None):
    """Buffer loads written straight into LDS (``rocdl.raw.ptr.buffer.load[.async].lds``).

    Thread t (lane l of wave w) loads ``size`` bytes of X at byte t * size + soff + imm into
    LDS at byte w * 64 * size + imm + l * size (the wave's base, the immediate offset, the
    lane's slot); after a barrier, thread t copies those size/4 dwords to Out[t * size/4 ...].
    ``cross``: thread t copies the slot of thread t + 64 (the next wave's) instead, which is
    ordered only if the loading wave waited (``vmcnt``: emit s_waitcnt vmcnt(n) before the barrier).
    """
    from flydsl._mlir.dialects import rocdl

    dw = size // 4
    threads = waves * WAVE
    words = threads * dw + imm // 4

    @fx.struct
    class Smem:
        buf: fx.Array[fx.Int32, words, 16]

    @flyc.kernel
    def lds_dma_kernel(X: fx.Tensor, Out: fx.Tensor, soff: fx.Int32):
        tid = fx.thread_idx.x
        wave = tid // WAVE
        smem = fx.SharedAllocator().allocate(Smem).peek()
        buf = smem.buf.view(fx.make_layout(words, 1))
        rs = fx.rocdl.get_buffer_rsrc(fx.get_iter(fx.rocdl.make_buffer_tensor(X)))
        lds = fx.to_llvm_ptr(fx.add_offset(smem.buf.ptr, wave * WAVE * dw))
        op = rocdl.raw_ptr_buffer_load_async_lds if asynchronous else rocdl.raw_ptr_buffer_load_lds
        op(rs, lds, _i32(size), _i32(tid * size), soff.ir_value(), _i32(imm))
        if asynchronous:
            fx.rocdl.asyncmark()
            fx.rocdl.wait_asyncmark(0)
        if vmcnt is not None:
            fx.rocdl.s_waitcnt(vmcnt=vmcnt)
        gpu.barrier()
        src = (tid + WAVE) % threads if cross else tid
        for j in fx.range_constexpr(dw):
            Out[tid * dw + j] = fx.memref_load(buf, imm // 4 + src * dw + j)

    @flyc.jit
    def buffer_to_lds(X: fx.Tensor, Out: fx.Tensor, soff: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        lds_dma_kernel(X, Out, soff).launch(grid=(1, 1, 1), block=(threads, 1, 1), stream=stream)

    return buffer_to_lds


def build_atomic(kind, block=128, lds_bins=None):
    """Old[t] = atomicrmw <kind> Acc[Idx[t]], X[t] (monotonic, agent scope); returns the launcher.

    With ``lds_bins``, the atomics hit an LDS copy of Acc[:lds_bins] (one per workgroup, loaded
    before and added back with a global atomic add after, by threads < lds_bins).
    """
    from flydsl._mlir.dialects import llvm

    def rmw(ptr, x, how=None):
        return llvm.AtomicRMWOp(getattr(llvm.AtomicBinOp, how or kind), ptr, x.ir_value(),
                                llvm.AtomicOrdering.monotonic, syncscope="agent", alignment=4).res

    def elem(t, i):
        return fx.to_llvm_ptr(fx.add_offset(fx.get_iter(t), i))

    @fx.struct
    class Smem:
        bins: fx.Array[fx.Int32, lds_bins or 1, 16]

    @flyc.kernel
    def atomic_kernel(X: fx.Tensor, Idx: fx.Tensor, Acc: fx.Tensor, Old: fx.Tensor):
        tid = fx.thread_idx.x
        t = fx.block_idx.x * block + tid
        if lds_bins is None:
            Old[t] = X.element_type(rmw(elem(Acc, Idx[t]), X[t]))
        else:
            smem = fx.SharedAllocator().allocate(Smem).peek()
            bins = smem.bins.view(fx.make_layout(lds_bins, 1))
            if tid < lds_bins:
                fx.memref_store(fx.Int32(0), bins, tid)
            gpu.barrier()
            Old[t] = fx.Int32(rmw(fx.to_llvm_ptr(fx.add_offset(smem.bins.ptr, Idx[t])), X[t]))
            gpu.barrier()
            if tid < lds_bins:
                rmw(elem(Acc, tid), fx.memref_load(bins, tid), "add")

    @flyc.jit
    def atomic(X: fx.Tensor, Idx: fx.Tensor, Acc: fx.Tensor, Old: fx.Tensor, n: fx.Int32,
               stream: fx.Stream = fx.Stream(None)):
        atomic_kernel(X, Idx, Acc, Old).launch(grid=(n // block, 1, 1), block=(block, 1, 1), stream=stream)

    return atomic


def build_counted_loop(threads=128):
    """Out[b, t] = (b + 1) * (11 if wave 0 else 1): workgroup b loops b + 1 times; inside, a
    wave-uniform branch that only wave 0 takes (for the region_waves counter)."""

    @flyc.kernel
    def counted_loop_kernel(Out: fx.Tensor):
        bid = fx.Int32(fx.block_idx.x)
        tid = fx.Int32(fx.thread_idx.x)
        for _j, acc in range(fx.Index(0), fx.Index(bid + 1), fx.Index(1), init=[fx.Float32(0.0)]):
            x = fx.Float32(acc[0]) + fx.Float32(1.0)
            if tid // WAVE == 0:
                x = x + fx.Float32(10.0)
            res = yield [x]
        Out[bid * threads + tid] = fx.Float32(res)  # one carried value comes back unwrapped

    @flyc.jit
    def counted_loop(Out: fx.Tensor, blocks: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        counted_loop_kernel(Out).launch(grid=(blocks, 1, 1), block=(threads, 1, 1), stream=stream)

    return counted_loop


def build_phase_shift(iters=4, seed=None):
    """Two wave groups exchange data through LDS, one barrier out of phase (the wave-specialized style).

    Block of 256 lanes = 4 waves; group g = wave // 2, lane r = tid % 128. Group 1 runs one extra
    ``s_barrier`` first, so its step s falls in the barrier interval where group 0 runs step s + 1.
    Iteration i: write X[i, g, r] into slot i % 2 of the group's buffer; barrier; read the other
    group's buffer (group 0: slot (i - 1) % 2 from i = 1 on, group 1: slot i % 2) into the sum;
    barrier. Race-free only under the hardware's barrier (arrival counting). Out[tid] += 1 first
    (global memory written before the barrier that splits the workgroup), then Out[tid] += the sum.
    ``seed``: "race" makes group 1 read the slot group 0 writes in the same interval;
    "missing_barrier" drops the barrier between the write and the read; "lane_split" gives the
    extra barrier to half of each wave's lanes instead of to group 1.
    """
    from flydsl.expr import rocdl

    half = 2 * WAVE

    @fx.struct
    class Smem:
        buf: fx.Array[fx.Float32, 4 * half, 16]  # [group][slot][lane]

    @flyc.kernel
    def phase_kernel(X: fx.Tensor, Out: fx.Tensor):
        tid = fx.thread_idx.x
        g = tid // half
        r = tid % half
        smem = fx.SharedAllocator().allocate(Smem).peek()
        buf = smem.buf.view(fx.make_layout(4 * half, 1))
        base = Out[tid] + fx.Float32(1.0)
        Out[tid] = base
        if (g if seed != "lane_split" else tid % WAVE // (WAVE // 2)) == 1:
            rocdl.s_barrier()
        acc = fx.Float32(0.0)
        for i in fx.range_constexpr(iters):
            fx.memref_store(X[i * 4 * WAVE + tid], buf, (g * 2 + i % 2) * half + r)
            if seed != "missing_barrier":
                rocdl.s_barrier()
            slot = (i - 1 + g) % 2 if seed != "race" else (i + 1) % 2
            v = fx.memref_load(buf, ((1 - g) * 2 + slot) * half + r)
            acc = acc + (v if i >= 1 else v * fx.Float32(g))
            rocdl.s_barrier()
        Out[tid] = base + acc

    @flyc.jit
    def phase_shift(X: fx.Tensor, Out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        phase_kernel(X, Out).launch(grid=(1, 1, 1), block=(4 * WAVE, 1, 1), stream=stream)

    return phase_shift


DPP_CASES = (  # (dpp_ctrl, row_mask, bank_mask, bound_ctrl): the controls FlyDSL's kernels use, and a few more
    (177, 0xF, 0xF, False),  # quad_perm [1,0,3,2]: lane ^ 1
    (78, 0xF, 0xF, False),  # quad_perm [2,3,0,1]: lane ^ 2
    (0x118, 0xF, 0xC, False),  # row_shr:8 on banks 2-3 ...
    (0x108, 0xF, 0x3, False),  # ... then row_shl:8 on banks 0-1: together lane ^ 8
    (0x111, 0xF, 0xF, True),  # row_shr:1, bound_ctrl: lane - 1 in the row, 0 at the row start
    (0x142, 0xA, 0xF, False),  # row_bcast:15 on rows 1 and 3
)


def build_lane_moves():
    """Out[k, t] = the k-th DPP case applied to X (old = -1; case 3 chains on case 2's result);
    Out[6, t], Out[7, t] = permlane16_swap(X, Y); Out[8, t] = xor 1 through llvm.amdgcn.update.dpp.i32; Out[9, t], Out[10, t] = permlane32_swap(X, Y)."""
    from flydsl._mlir import ir
    from flydsl._mlir.dialects import arith, llvm
    from flydsl._mlir.dialects import rocdl as rocdl_d
    from flydsl.expr.typing import T

    def v(x):
        return fx.Int32(x).ir_value()

    @flyc.kernel
    def lanes_kernel(X: fx.Tensor, Y: fx.Tensor, Out: fx.Tensor):
        tid = fx.thread_idx.x
        x = v(X[tid])
        old = v(fx.Int32(-1))
        prev = old
        for k, (ctrl, rm, bm, bc) in enumerate(DPP_CASES):
            r = fx.rocdl.update_dpp(T.i32, prev if k == 3 else old, x, ctrl, rm, bm, bc)
            prev = r
            Out[k * WAVE + tid] = fx.Int32(r)
        for k, swap in ((6, rocdl_d.permlane16_swap), (9, rocdl_d.permlane32_swap)):
            pair = swap(ir.Type.parse("!llvm.struct<(i32, i32)>"), x, v(Y[tid]), False, False)
            Out[k * WAVE + tid] = fx.Int32(llvm.extractvalue(T.i32, pair, [0]))
            Out[(k + 1) * WAVE + tid] = fx.Int32(llvm.extractvalue(T.i32, pair, [1]))
        imm = [v(fx.Int32(c)) for c in (177, 0xF, 0xF)] + [arith.constant(ir.IntegerType.get_signless(1), 0)]
        r = llvm.call_intrinsic(T.i32, "llvm.amdgcn.update.dpp.i32", [old, x] + imm, [], [])
        Out[8 * WAVE + tid] = fx.Int32(r)

    @flyc.jit
    def lane_moves(X: fx.Tensor, Y: fx.Tensor, Out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        lanes_kernel(X, Y, Out).launch(grid=(1, 1, 1), block=(WAVE, 1, 1), stream=stream)

    return lane_moves


def build_buffer_atomic_fadd(nbytes):
    """rocdl.raw.ptr.buffer.atomic.fadd of X[t] into Acc[Idx[t]] through a descriptor of ``nbytes``
    bytes of Acc (lanes past it are dropped)."""
    from flydsl._mlir.dialects import rocdl
    from flydsl.expr.typing import T

    @flyc.kernel
    def buf_fadd_kernel(X: fx.Tensor, Idx: fx.Tensor, Acc: fx.Tensor):
        tid = fx.thread_idx.x
        rs = fx.rocdl.get_buffer_rsrc(fx.get_iter(fx.rocdl.make_buffer_tensor(Acc, num_records_bytes=nbytes)))
        rocdl.raw_ptr_buffer_atomic_fadd(T.f32, X[tid].ir_value(), rs, _i32(Idx[tid] * 4), _i32(0))

    @flyc.jit
    def buffer_fadd(X: fx.Tensor, Idx: fx.Tensor, Acc: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        buf_fadd_kernel(X, Idx, Acc).launch(grid=(1, 1, 1), block=(2 * WAVE, 1, 1), stream=stream)

    return buffer_fadd


def build_scaled_mfma_regs(m, fmt_a, fmt_b, dw_a, dw_b, opsel_a=0, opsel_b=0):
    """One gfx950 ``mfma.scale.f32.{16x16x128,32x32x64}.f8f6f4`` on raw registers: lane l takes
    dwords A[l*dw_a:(l+1)*dw_a] (vector<dw_a x i32>), the same of B, scale words SA[l], SB[l],
    C[l*acc:(l+1)*acc] (acc = 4 or 16 floats), and writes D likewise. ``fmt_a`` / ``fmt_b`` are
    the cbsz / blgp format codes (0 fp8 e4m3, 1 bf8 e5m2, 2 fp6 e2m3, 3 fp6 e3m2, 4 fp4 e2m1)."""
    from flydsl._mlir import ir
    from flydsl.expr.typing import Vector as Vec

    acc = 4 if m == 16 else 16
    mfma = fx.rocdl.mfma_scale_f32_16x16x128_f8f6f4 if m == 16 else fx.rocdl.mfma_scale_f32_32x32x64_f8f6f4

    @flyc.kernel(known_block_size=[WAVE, 1, 1])
    def scaled_mfma_kernel(A: fx.Tensor, B: fx.Tensor, SA: fx.Tensor, SB: fx.Tensor, C: fx.Tensor, D: fx.Tensor):
        lane = fx.Int32(gpu.thread_idx.x)
        a = Vec.from_elements([A[lane * dw_a + i] for i in range(dw_a)], fx.Int32)
        b = Vec.from_elements([B[lane * dw_b + i] for i in range(dw_b)], fx.Int32)
        c = Vec.from_elements([C[lane * acc + i] for i in range(acc)], fx.Float32)
        res = ir.VectorType.get([acc], ir.F32Type.get())
        d = Vec(mfma(res, [a, b, c, fmt_a, fmt_b, opsel_a, fx.Int32(SA[lane]), opsel_b, fx.Int32(SB[lane])]))
        for i in fx.range_constexpr(acc):
            D[lane * acc + i] = d[i]

    @flyc.jit
    def scaled_mfma(A: fx.Tensor, B: fx.Tensor, SA: fx.Tensor, SB: fx.Tensor, C: fx.Tensor, D: fx.Tensor,
                    stream: fx.Stream = fx.Stream(None)):
        scaled_mfma_kernel(A, B, SA, SB, C, D).launch(grid=(1, 1, 1), block=(WAVE, 1, 1), stream=stream)

    return scaled_mfma
