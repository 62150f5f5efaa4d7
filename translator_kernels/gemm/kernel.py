"""The preshuffle MFMA GEMM kernel: C[b] = epilogue(A[b] · W[b]ᵀ), W preshuffled (see preshuffle.py).

One workgroup = 4 waves (256 lanes) computes a BM x BN tile of C; wave w owns columns
[w*BN/4, (w+1)*BN/4) and all BM rows, as (BM/16) x (BN/64) MFMA 16x16 accumulators.

Data path per K step of BK elements (K_pad/BK steps, a runtime scf.for, M is runtime):
  A  global --128-bit buffer loads--> registers --ds_write_b128--> LDS (2 stages)
     LDS is laid out like the preshuffled weight, (BM/16, BK/32, 32/kpack, 16, kpack), so
     every MFMA A operand is one conflict-free ds_read_b128 (64 lanes x 16 B contiguous).
  W  global --128-bit buffer loads--> registers (no LDS): the preshuffle puts each lane's
     operand in one contiguous 16-byte chunk; loads for step k+1 are issued before the
     MFMAs of step k (register double buffer), A for step k+1 likewise (LDS double buffer),
     one barrier per step.
  MFMA: fp32 -> v_mfma_f32_16x16x4_f32 (8 per 16x16x32 block), bf16/fp16 -> 16x16x16
     (gfx942, 2 per block) or 16x16x32 (gfx950, 1 per block); fp32 accumulation.

K ordering: lane (r, q) of a 16x16x32 block holds the 16-byte chunk q (and q+4 for fp32)
of its row; each MFMA sums over q, so A and W are permuted identically along K and the
dot product is exact up to fp32 summation order.

Tails (never an out-of-bounds access, never a wrong answer): K must be a multiple of
kpack (the entry point pads A otherwise); A chunks with row >= M or k >= K, W chunks past
N_pad, and C elements with row >= M or col >= N get a sentinel byte offset beyond the
buffer descriptor's num_records, so the hardware returns 0 / drops the store.

Epilogue, in this order: y = scale * acc; y += bias[col]; y = program(y); y += residual[row, col];
C = y cast to the output dtype. `program` is a one-input per-element program of
translator_kernels.program (the same program and op table as the generated elementwise, reduce
and scan kernels): any op of the table with compile-time constants, e.g. the chain spellings
"mul(0.5);sigmoid", "gelu;clamp(-1.0,1.0)", "sqrt;log", or an activation name ("relu", "gelu").
It runs on each lane's 4-accumulator vector through the table's device functions
(device_math.run), and its canonical text is part of the kernel's cache key.
"""


import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import scf, vector
from flydsl.expr import const_expr, gpu, range_constexpr, rocdl
from flydsl.expr.typing import T, as_ir_value

from translator_kernels import device_math as em
from translator_kernels import launch as kl
from translator_kernels.errors import KernelInputError
from translator_kernels.program import epilogue, evaluate, parse

WAVES = 4
THREADS = 64 * WAVES
OOB = 0x7FFFFFF0  # byte offset past every descriptor we build (tensors are < 2 GiB)

_ELEM = {  # name -> (bytes, DSL type)
    "f32": (4, fx.Float32),
    "bf16": (2, fx.BFloat16),
    "f16": (2, fx.Float16),
}


# ---- the epilogue program: a one-input per-element program (translator_kernels.program) ----


def canonical_epilogue(program) -> str | None:
    """The epilogue's canonical program text (None for none): what gemm nodes carry and caches key on.
    Accepts a Program, its JSON, or a chain spelling such as "gelu" or "mul(0.5);sigmoid"."""
    return epilogue(program)


def apply_epilogue_torch(y, program):
    """The program on an fp32 tensor (the reference)."""
    if not program:
        return y
    prog = parse(canonical_epilogue(program))
    return evaluate(prog, [y])[prog.out[0][0]]


def apply_epilogue_device(v, program, width: int = 4):
    """The program on a lane's fp32 fx.Vector of `width` accumulators while the kernel traces."""
    if not program:
        return v
    prog = parse(canonical_epilogue(program))
    return em.run(prog, [v], width)[prog.out[0][0]]


def mfma_per_block(dtype: str, arch: str) -> int:
    """MFMA instructions per 16x16x32 (M x N x K) block."""
    if dtype == "f32":
        return 8
    return 1 if arch.startswith("gfx950") else 2


def _raw(v):
    return v if isinstance(v, ir.Value) else as_ir_value(v)


def _i32(v):
    return fx.Int32(v)


@kl.builder
def build_gemm(n: int, k: int, n_pad: int, k_pad: int, dtype: str, out_dtype: str, arch: str,
               bm: int, bn: int, bk: int, activation, has_bias: bool, has_residual: bool):
    """Compile-time specialization of the GEMM; returns the @flyc.jit launcher

    launch(C, A, W, bias, residual, m, batch, a_bstride, w_bstride, c_bstride, scale)
    (batch strides in elements; bias/residual are ignored placeholders when absent)."""
    if dtype not in _ELEM or out_dtype not in _ELEM:
        raise KernelInputError(f"gemm: dtype {dtype}/{out_dtype} not in {sorted(_ELEM)}")
    activation = canonical_epilogue(activation)  # validates
    esz, _ = _ELEM[dtype]
    osz, out_t = _ELEM[out_dtype]
    kp = 16 // esz  # elements per 16-byte chunk
    cpb = 32 // kp  # chunks per row of a 16x16x32 block (bf16: 4, f32: 8)
    lph = cpb // 4  # 16-byte loads per lane per block (bf16: 1, f32: 2)
    if bm % 16 or bn % (16 * WAVES) or bk % 32 or k_pad % bk or k % kp:
        raise KernelInputError(f"gemm: bad tile {bm}x{bn}x{bk} for K={k} (K_pad={k_pad})")
    is950 = arch.startswith("gfx950")
    m_rep, n_rep, k_blk = bm // 16, bn // (16 * WAVES), bk // 32
    nk = k_pad // bk
    a_chunks = bm * bk // kp  # 16-byte chunks in one A tile
    a_loads = -(-a_chunks // THREADS)
    a_cpr = bk // kp  # chunks per A tile row
    stage_dw = bm * bk * esz // 4  # one LDS stage, in dwords
    nb_total = n_pad // 16
    kb_total = k_pad // 32
    n_per_wave = bn // WAVES

    @fx.struct
    class Smem:
        a: fx.Array[fx.Int32, 2 * stage_dw, 16]

    def mfma_block(acc, a_regs, b_regs):
        """acc += one 16x16x32 block; a_regs/b_regs: list of `lph` vector<4xi32> chunks."""
        if dtype == "f32":
            for h in range_constexpr(lph):
                af = vector.bitcast(_v4f32(), a_regs[h])
                bf = vector.bitcast(_v4f32(), b_regs[h])
                for e in range_constexpr(4):
                    a_s = vector.extract(af, [], [e])
                    b_s = vector.extract(bf, [], [e])
                    acc = rocdl.mfma_f32_16x16x4f32_(_v4f32(), a_s, b_s, acc, 0, 0, _none_blgp())
            return acc
        half_t = T.bf16 if dtype == "bf16" else T.f16
        if is950:
            av = vector.bitcast(T.vec(8, half_t), a_regs[0])
            bv = vector.bitcast(T.vec(8, half_t), b_regs[0])
            op = rocdl.mfma_f32_16x16x32_bf16 if dtype == "bf16" else rocdl.mfma_f32_16x16x32_f16
            return op(_v4f32(), [av, bv, acc])
        lane_t = T.i16 if dtype == "bf16" else T.f16
        av = vector.bitcast(T.vec(8, lane_t), a_regs[0])
        bv = vector.bitcast(T.vec(8, lane_t), b_regs[0])
        op = rocdl.mfma_f32_16x16x16bf16_1k if dtype == "bf16" else rocdl.mfma_f32_16x16x16f16
        for s in range_constexpr(2):
            sel = [4 * s + i for i in range(4)]
            acc = op(_v4f32(), [vector.shuffle(av, av, sel), vector.shuffle(bv, bv, sel), acc])
        return acc

    @flyc.kernel
    def gemm_kernel(C: fx.Tensor, A: fx.Tensor, W: fx.Tensor, Bias: fx.Tensor, Res: fx.Tensor,
                    m: fx.Int32, a_bs: fx.Int32, w_bs: fx.Int32, c_bs: fx.Int32, scale: fx.Float32,
                    a_bytes: fx.Int32, w_bytes: fx.Int32, c_bytes: fx.Int32):
        tid = _i32(fx.thread_idx.x)
        bx, by, bz = fx.block_idx
        bx, by, bz = _i32(bx), _i32(by), _i32(bz)
        lane = tid % 64
        wave = tid // 64
        l16 = lane % 16
        q = lane // 16

        def rsrc(t, nbytes):
            return rocdl.get_buffer_rsrc(rocdl.make_buffer_ptr(fx.get_iter(t), num_records_bytes=fx.Int64(nbytes)))

        ra, rw, rc = rsrc(A, a_bytes), rsrc(W, w_bytes), rsrc(C, c_bytes)
        lds = fx.SharedAllocator().allocate(Smem).peek()
        zero = _raw(fx.Int32(0))

        def gload(r, byte_off):
            return rocdl.raw_ptr_buffer_load(_v4i32(), r, _raw(byte_off), zero)

        # ---- A tile: global -> regs (each thread a_loads chunks) ----
        a_row0 = bx * bm
        a_base = bz * a_bs

        def a_chunk(i):
            # chunk c -> (row r, k-chunk kc) with 16 consecutive rows fastest: a wave reads 16 rows x
            # 4 chunks (64 contiguous bytes per row) and its LDS writes land at unit c, conflict-free.
            c = tid + i * THREADS
            rest = c // 16
            return c, (rest // a_cpr) * 16 + c % 16, rest % a_cpr

        def load_a(kt):
            regs = []
            for i in range_constexpr(a_loads):
                c, r, kc = a_chunk(i)
                row = a_row0 + r
                kk = kt * bk + kc * kp
                ok = (row < m) & (kk < k)
                if const_expr(a_chunks % THREADS != 0):
                    ok = ok & (c < a_chunks)
                off = ok.select((a_base + row * k + kk) * esz, fx.Int32(OOB))
                regs.append(gload(ra, off))
            return regs

        def lds_a_dw(c, r, kc):
            # (BM/16, BK/32, cpb, 16, kp) layout: unit ((r//16*a_cpr + kc)*16 + r%16), which is c itself
            return c * 4

        def store_a(regs, stage_off):
            for i in range_constexpr(a_loads):
                c, r, kc = a_chunk(i)
                p = fx.add_offset(lds.a.ptr, _raw(stage_off + lds_a_dw(c, r, kc)))
                if const_expr(a_chunks % THREADS != 0):
                    if_op = scf.IfOp(_raw(c < a_chunks), has_else=False)
                    with ir.InsertionPoint(if_op.then_block):
                        fx.ptr_store(regs[i], p)
                        scf.YieldOp([])
                else:
                    fx.ptr_store(regs[i], p)

        # ---- W: global -> regs, per wave: n_rep x k_blk x lph chunks ----
        nb0 = (by * bn + wave * n_per_wave) // 16
        w_base = bz * w_bs

        def load_w(kt):
            regs = []
            for nr in range_constexpr(n_rep):
                nb = nb0 + nr
                for kb in range_constexpr(k_blk):
                    blk = nb * kb_total + kt * k_blk + kb
                    for h in range_constexpr(lph):
                        el = ((blk * cpb + h * 4) * 16 + lane) * kp
                        off = (nb < nb_total).select((w_base + el) * esz, fx.Int32(OOB))
                        regs.append(gload(rw, off))
            return regs

        def compute(accs, w_regs, stage_off):
            accs = list(accs)
            for kb in range_constexpr(k_blk):
                a_ops = []
                for mr in range_constexpr(m_rep):
                    ops = []
                    for h in range_constexpr(lph):
                        dw = stage_off + (((mr * k_blk + kb) * cpb + h * 4) * 16 + lane) * 4
                        ops.append(fx.ptr_load(fx.add_offset(lds.a.ptr, _raw(dw)), _v4i32()))
                    a_ops.append(ops)
                for mr in range_constexpr(m_rep):
                    for nr in range_constexpr(n_rep):
                        wb = (nr * k_blk + kb) * lph
                        i = mr * n_rep + nr
                        accs[i] = mfma_block(accs[i], a_ops[mr], w_regs[wb:wb + lph])
            return accs

        # ---- prologue ----
        accs = [_raw(fx.Vector.filled(4, 0.0, fx.Float32)) for _ in range(m_rep * n_rep)]
        store_a(load_a(fx.Int32(0)), fx.Int32(0))
        w_cur = load_w(fx.Int32(0))
        gpu.barrier()
        n_acc = len(accs)
        # ---- main loop: prefetch k+1 (A regs, W regs) while computing k ----
        if const_expr(nk > 1):
            init = accs + w_cur
            for kt_idx, st in range(fx.Index(0), fx.Index(nk - 1), fx.Index(1), init=init):
                kt = fx.Int32(kt_idx)
                a_next = load_a(kt + 1)
                w_next = load_w(kt + 1)
                cur_off = (kt % 2) * stage_dw
                new_accs = compute(st[:n_acc], st[n_acc:], cur_off)
                store_a(a_next, ((kt + 1) % 2) * stage_dw)
                gpu.barrier()
                res = yield [_raw(v) for v in new_accs] + [_raw(v) for v in w_next]
            accs = list(res[:n_acc])
            w_cur = list(res[n_acc:])
        accs = compute(accs, w_cur, fx.Int32(((nk - 1) % 2) * stage_dw))

        # ---- epilogue: lane holds C[mr*16 + q*4 + i, nr*16 + l16] ----
        c_base = bz * c_bs
        if const_expr(has_bias):
            rb = rsrc(Bias, n * 4)
        if const_expr(has_residual):
            rr = rsrc(Res, c_bytes)
        col0 = by * bn + wave * n_per_wave + l16
        for nr in range_constexpr(n_rep):
            col = col0 + nr * 16
            col_ok = col < n
            if const_expr(has_bias):
                b_off = col_ok.select(col * 4, fx.Int32(OOB))
                bias_v = fx.Float32(rocdl.raw_ptr_buffer_load(T.f32, rb, _raw(b_off), zero))
            for mr in range_constexpr(m_rep):
                yv = fx.Vector(_raw(accs[mr * n_rep + nr])) * fx.Vector.filled(4, scale, fx.Float32)
                if const_expr(has_bias):
                    yv = yv + fx.Vector.filled(4, bias_v, fx.Float32)
                yv = apply_epilogue_device(yv, activation)
                for i in range_constexpr(4):
                    row = a_row0 + mr * 16 + q * 4 + i
                    ok = (row < m) & col_ok
                    c_off = ok.select((c_base + row * n + col) * osz, fx.Int32(OOB))
                    y = yv[i]
                    if const_expr(has_residual):
                        rv = rocdl.raw_ptr_buffer_load(out_t.ir_type, rr, _raw(c_off), zero)
                        y = y + out_t(rv).to(fx.Float32)
                    rocdl.raw_ptr_buffer_store(_raw(y.to(out_t)), rc, _raw(c_off), zero)

    @flyc.jit
    def launch(C: fx.Tensor, A: fx.Tensor, W: fx.Tensor, Bias: fx.Tensor, Res: fx.Tensor,
               m: fx.Int32, batch: fx.Int32, a_bs: fx.Int32, w_bs: fx.Int32, c_bs: fx.Int32,
               scale: fx.Float32, a_bytes: fx.Int32, w_bytes: fx.Int32, c_bytes: fx.Int32,
               stream: fx.Stream = fx.Stream(None)):
        gemm_kernel(C, A, W, Bias, Res, m, a_bs, w_bs, c_bs, scale, a_bytes, w_bytes, c_bytes).launch(
            grid=((m + (bm - 1)) // bm, -(-n_pad // bn), batch), block=(THREADS, 1, 1), stream=stream)

    return launch


def _v4i32():
    return T.vec(4, T.i32)


def _v4f32():
    return T.vec(4, T.f32)


def _none_blgp():
    return ir.Attribute.parse("#rocdl<mfma_perm_b none>")
