"""LayerNorm, RMSNorm, residual-add + norm and GroupNorm: one row-norm kernel family.

`build_row_norm` specializes one kernel body at compile time on: the norm kind ("layer":
(x - mean) * rstd, "rms": x * rstd), whether a residual is added first (the sum is stored as a
second output, rounded to x's dtype before the statistics, as eager computes norm(x + r)),
whether weight / bias exist and their dtypes, and how the affine is indexed ("row": weight[j]
along the row; "channel": GroupNorm's per-channel weight[g * Cg + j // HW], one weight per
vector because VEC divides HW). Statistics are fp32.

Three shapes of work, chosen at build time:
- resident (rows up to 64K elements): the row sits in registers; LayerNorm is two-pass
  (mean, then the mean of squared deviations), so no cancellation. Short rows share a wave
  (row_common.row_tiling) and reduce with shuffles only.
- multi-row (resident + row weights): each workgroup loads weight / bias into registers once
  and walks rows bid, bid + G, ...; the host picks G so the weight re-reads stay within
  PARAM_TRAFFIC of the compulsory bytes (flysim counts 1.04x at 4096 x 8192 bf16 RMSNorm).
- streamed (longer rows): a statistics pass (sums shifted by the row's first element), then
  a pass that re-reads x (and the residual), normalizes and stores.

Per-token fp8 output (`quant="fp8" | "bf8"`, resident rows with VEC >= 4): the normalized row,
rounded to x's dtype as the plain kernel stores it, stays in registers; its |max| is reduced over
the row like the statistics, then ``s = max(amax / FMAX, 1e-12)`` and each value is divided by s,
clamped to +-FMAX and packed four per word by v_cvt_pk_{fp8,bf8}_f32 (the arch's format: fnuz on
gfx942, OCP on gfx950). The kernel writes q (and the scale per row) instead of y: the same numbers
as quantizing the plain kernel's output (gemm/quantize.py), one launch and no y round trip. Rows the
fused form cannot take (streamed, VEC < 4) run the plain norm and the quantize kernel.
"""


import torch

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import const_expr, gpu, range_constexpr

from translator_kernels import launch as kl
from translator_kernels import replay as kr
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.fp8 import fp8_dtype
from translator_kernels.rows import common as rc
from translator_kernels.rows import quant as rq

AFN = fx.arith.FastMathFlags.afn  # v_rsq_f32
PARAM_TRAFFIC = 0.04  # weight/bias re-reads allowed, as a share of the compulsory bytes
MIN_GRID = 64


@kl.builder
def build_row_norm(n: int, dtype_str: str, vec: int, kind: str, eps: float, arch: str, *,
                   w_dtype: str | None = None, b_dtype: str | None = None, residual: bool = False,
                   affine: str = "row", groups: int = 1, hw: int = 1, quant: str | None = None,
                   pre_w: str | None = None, pre_eps: float = 0.0, sum_only: bool = False):
    """Compiled launcher `launch(X, R, W, B, Out, Sum, Q, S, m, g)` over m rows with g workgroups;
    operands a specialization does not use may be any tensor. quant: Out is not written; Q (fp8
    bytes viewed as int32) and S (fp32 per row) are. pre_w (a sandwich norm: RMSNorm, residual, resident
    rows): x is first RMS-normalized with the weight in B (pre_w its dtype name) and pre_eps, rounded to x's
    dtype as flydsl.rms_norm returns it, and that is what the residual is added to. sum_only (with pre_w):
    only that sum is stored (Sum), Out is not written (OLMo2's `r + norm(o)` with no norm after it)."""
    if kind not in ("layer", "rms"):
        raise KernelInputError(f"row norm: kind must be 'layer' or 'rms', got {kind!r}")
    tiling = rc.row_tiling(n, vec)
    STREAM = not rc.row_fits(tiling)
    if (pre_w is not None or sum_only) and (kind != "rms" or not residual or b_dtype is not None or quant is not None
                                            or STREAM or pre_w is None):
        raise KernelInputError(f"row norm: a norm before the residual add takes RMSNorm with a residual, no bias, "
                               f"no fp8 output and a row that fits registers (N={n})")
    if STREAM:  # too long for registers: a statistics pass, then a normalize pass that re-reads
        tiling = rc.stream_tiling(n, vec)
    U = rc.STREAM_VECS_PER_THREAD
    NCH = -(-tiling.nv // (tiling.block * U))  # chunks of BLOCK * U vectors
    if affine == "channel" and hw % vec:
        raise KernelInputError(f"group_norm: vector width {vec} must divide HW={hw}")
    BLOCK, NT, NV, VEC, W = tiling.block, tiling.nt, tiling.nv, tiling.vec, tiling.waves
    SUB, LPR, RPB = tiling.sub, tiling.lpr, tiling.rows_per_block
    if SUB:
        W = 1  # rows live inside one wave: no LDS
    PARTIAL = tiling.partial
    ebits = rc.elem_bits(dtype_str)
    INV_N = 1.0 / n
    MULTI = _multi_rows(n, vec, affine, w_dtype is not None or b_dtype is not None or pre_w is not None)
    if quant is not None and not rq.fusable(n, vec, affine):
        raise KernelInputError(f"row norm: fp8 output needs resident rows and VEC >= 4 (N={n}, VEC={vec})")
    FMAX = rq.fmax(arch, quant) if quant is not None else 0.0
    CVT = rq.cvt(quant) if quant is not None else None
    CG = n // hw  # channels per group (GroupNorm)

    @fx.struct
    class Scratch:
        red_a: fx.Array[fx.Float32, W, 16]
        red_b: fx.Array[fx.Float32, W, 16]
        red_c: fx.Array[fx.Float32, W, 16]

    kwargs = {"known_block_size": [BLOCK, 1, 1]} if BLOCK > 256 else {}

    @flyc.kernel(**kwargs)
    def row_norm_kernel(X: fx.Tensor, R: fx.Tensor, Wt: fx.Tensor, Bs: fx.Tensor, Out: fx.Tensor,
                        Sum: fx.Tensor, Q: fx.Tensor, S: fx.Tensor, M: fx.Int32, G: fx.Int32):
        tid = fx.thread_idx.x
        lane = tid % LPR if const_expr(SUB) else tid
        edt = rc.elem_type(dtype_str)
        atom = rc.copy_atom(VEC * ebits, ebits)
        views = {}

        def set_row(rb):
            """Select this thread's row in row-block rb (RPB rows of LPR lanes each)."""
            if const_expr(SUB):
                row_raw = rb * RPB + tid // LPR
                views["ok"] = row_raw < M
                row = views["ok"].select(row_raw, M - 1)  # rows past M re-read M - 1, store nothing
            else:
                row = rb
            views["row"] = row
            views["x"] = rc.row_view(X, row, VEC)
            views["out"] = rc.row_view(Out, row, VEC)
            if const_expr(residual):
                views["r"] = rc.row_view(R, row, VEC)
                views["sum"] = rc.row_view(Sum, row, VEC)

        def block_allreduce(val, slots, op="sum"):
            if const_expr(SUB):
                return rc.wave_allreduce(val, op, LPR)
            w = rc.wave_allreduce(val, op)
            if const_expr(W == 1):
                return w
            if const_expr(MULTI):
                gpu.barrier()  # the previous row's readers are done with the slots
            wave_lane = tid % rc.WAVE
            wave = tid // rc.WAVE
            if wave_lane == 0:
                fx.memref_store(w, slots, wave)
            gpu.barrier()
            r = fx.memref_load(slots, 0)
            for i in range_constexpr(1, W):
                r = fx.max(r, fx.memref_load(slots, i)) if const_expr(op == "max") else r + fx.memref_load(slots, i)
            return r

        def load_param(T, pdtype_str, idx):
            """VEC fp32 values of a weight/bias for vector `idx` of the row."""
            pbits = rc.elem_bits(pdtype_str)
            pdt = rc.elem_type(pdtype_str)
            if const_expr(affine == "channel"):
                ch = (views["row"] % groups) * CG + (idx * VEC) // hw
                pview = rc.vec_view(T, 1)
                p = rc.load_vec(rc.copy_atom(pbits, pbits), 1, pdt, pview, ch).to(fx.Float32)
                return fx.Vector.filled(VEC, p[0], fx.Float32)
            per = min(VEC, 128 // pbits)  # elements per <= 128-bit access
            pview = rc.vec_view(T, per)
            patom = rc.copy_atom(per * pbits, pbits)
            parts = [rc.load_vec(patom, per, pdt, pview, idx * (VEC // per) + k).to(fx.Float32)
                     for k in range_constexpr(VEC // per)]
            if const_expr(len(parts) == 1):
                return parts[0]
            return fx.Vector.from_elements([p[i] for p in parts for i in range_constexpr(per)], fx.Float32)

        lds = fx.SharedAllocator().allocate(Scratch).peek()
        s_a = lds.red_a.view(fx.make_layout(W, 1))
        s_b = lds.red_b.view(fx.make_layout(W, 1))
        s_c = lds.red_c.view(fx.make_layout(W, 1))
        zero = fx.Float32(0.0)

        def load_row(idx, x_e=None):
            """(x in x's dtype -- the rounded sum when a residual is added, x in fp32); x_e: x given (pre_w)."""
            if const_expr(x_e is None):
                x_e = rc.load_vec(atom, VEC, edt, views["x"], idx)
            if const_expr(residual):
                s_e = x_e.to(fx.Float32) + rc.load_vec(atom, VEC, edt, views["r"], idx).to(fx.Float32)
                x_e = s_e.to(edt) if const_expr(dtype_str != "f32") else s_e
            return x_e, x_e.to(fx.Float32)

        def affine_store(y, idx, x_e, pre=None):
            if const_expr(SUB):
                if views["ok"]:
                    store_one(y, idx, x_e, pre)
            else:
                store_one(y, idx, x_e, pre)

        def apply_affine(y, idx, pre):
            """y * weight + bias, rounded to x's dtype (what the plain kernel stores)."""
            if const_expr(w_dtype is not None):
                y = y * (pre[0] if const_expr(pre is not None) else load_param(Wt, w_dtype, idx))
            if const_expr(b_dtype is not None):
                y = y + (pre[1] if const_expr(pre is not None) else load_param(Bs, b_dtype, idx))
            return y.to(edt) if const_expr(dtype_str != "f32") else y

        def store_one(y, idx, x_e, pre):
            rc.store_vec(atom, VEC, edt, apply_affine(y, idx, pre), views["out"], idx)
            if const_expr(residual):
                rc.store_vec(atom, VEC, edt, x_e, views["sum"], idx)

        def quantize_store(xs, valid, normalize, pre):
            """The fp8 output: normalized rows in registers, their |max| over the row, then q and s."""
            ys, amax = [], zero
            for t in range_constexpr(NT):
                idx = lane + t * LPR
                if const_expr(valid[t] is not None):
                    idx = valid[t].select(idx, 0)
                y = apply_affine(normalize(xs[t][1]), idx, pre[t] if const_expr(MULTI) else None)
                y = y.to(fx.Float32) if const_expr(dtype_str != "f32") else y
                ys.append(y)
                a = rq.lane_absmax(y, VEC)
                amax = fx.max(amax, valid[t].select(a, zero) if const_expr(valid[t] is not None) else a)
            scale = rq.row_scale(block_allreduce(amax, s_c, "max"), FMAX)
            keep = views["ok"] if const_expr(SUB) else None
            for t in range_constexpr(NT):
                idx = lane + t * LPR
                ok = keep
                if const_expr(valid[t] is not None):
                    ok = (idx < NV) if const_expr(keep is None) else keep & (idx < NV)
                rq.store_q(Q, M * n, views["row"] * n + idx * VEC, ys[t], scale, VEC, FMAX, CVT, ok)
                if const_expr(residual):
                    affine_store_sum(xs[t][0], idx, valid[t])
            first = lane == 0
            rq.store_scale(S, M, views["row"], scale, first if const_expr(keep is None) else first & keep)

        def affine_store_sum(x_e, idx, ok):
            if const_expr(SUB):
                if views["ok"]:
                    sum_store(x_e, idx, ok)
            else:
                sum_store(x_e, idx, ok)

        def sum_store(x_e, idx, ok):
            if const_expr(ok is not None):
                if idx < NV:
                    rc.store_vec(atom, VEC, edt, x_e, views["sum"], idx)
            else:
                rc.store_vec(atom, VEC, edt, x_e, views["sum"], idx)

        def chunk(t):
            """Vector t of this lane's row: its index and, for a partial row's last vector, the in-row mask (the
            index then clamped to 0)."""
            idx = lane + t * LPR
            if const_expr(PARTIAL and t == NT - 1):
                ok = idx < NV
                return ok.select(idx, 0), ok
            return idx, None

        def pre_normed():
            """pre_w: the row of x RMS-normalized with the weight in B, rounded to x's dtype, per vector."""
            raw, acc0 = [], None
            for t in range_constexpr(NT):
                idx, ok = chunk(t)
                x = rc.load_vec(atom, VEC, edt, views["x"], idx).to(fx.Float32)
                if const_expr(ok is not None):
                    x = fx.Vector.filled(VEC, ok, fx.Boolean).select(x, zero)
                raw.append(x)
                acc0 = x * x if t == 0 else acc0 + x * x
            r0 = fx.math.rsqrt(block_allreduce(rc.lane_sum(acc0, VEC), s_c) * INV_N + pre_eps, fastmath=AFN)
            out = []
            for t in range_constexpr(NT):
                y = raw[t] * r0 * load_param(Bs, pre_w, chunk(t)[0])
                out.append(y.to(edt) if const_expr(dtype_str != "f32") else y)
            return out

        def resident(pre):
            prenormed = pre_normed() if const_expr(pre_w is not None) else None
            # pass 1: load (and add the residual), first statistic
            xs = []
            valid = []
            acc = None
            for t in range_constexpr(NT):
                idx, ok = chunk(t)
                x_e, x = load_row(idx, prenormed[t] if const_expr(prenormed is not None) else None)
                if const_expr(ok is not None):
                    x = fx.Vector.filled(VEC, ok, fx.Boolean).select(x, zero)
                xs.append((x_e, x))
                valid.append(ok)
                term = x if const_expr(kind == "layer") else x * x
                acc = term if t == 0 else acc + term
            if const_expr(sum_only):
                for t in range_constexpr(NT):
                    affine_store_sum(xs[t][0], lane + t * LPR, valid[t])
                return
            total = block_allreduce(rc.lane_sum(acc, VEC), s_a)

            if const_expr(kind == "layer"):
                mean = total * INV_N
                acc2 = None
                for t in range_constexpr(NT):
                    d = xs[t][1] - mean
                    if const_expr(valid[t] is not None):
                        d = fx.Vector.filled(VEC, valid[t], fx.Boolean).select(d, zero)
                    acc2 = d * d if t == 0 else acc2 + d * d
                var = block_allreduce(rc.lane_sum(acc2, VEC), s_b) * INV_N
                rstd = fx.math.rsqrt(var + eps, fastmath=AFN)
            else:
                rstd = fx.math.rsqrt(total * INV_N + eps, fastmath=AFN)

            if const_expr(quant is not None):
                if const_expr(kind == "layer"):
                    quantize_store(xs, valid, lambda x: (x - mean) * rstd, pre)
                else:
                    quantize_store(xs, valid, lambda x: x * rstd, pre)
                return
            # pass 2: normalize, affine, store
            for t in range_constexpr(NT):
                idx = lane + t * LPR
                x_e, x = xs[t]
                y = (x - mean) * rstd if const_expr(kind == "layer") else x * rstd
                p = pre[t] if const_expr(MULTI) else None
                if const_expr(valid[t] is not None):
                    if idx < NV:
                        affine_store(y, idx, x_e, p)
                else:
                    affine_store(y, idx, x_e, p)

        def streamed():
            # pass 1: shifted sums (shift = the row's first element, against cancellation)
            k = load_row(0)[1][0] if const_expr(kind == "layer") else zero
            acc1 = zero
            acc2 = zero
            for c in range(fx.Int32(0), fx.Int32(NCH), fx.Int32(1)):
                for u in range_constexpr(U):
                    idx = tid + (c * U + u) * BLOCK
                    ok = idx < NV
                    d = load_row(ok.select(idx, 0))[1] - k
                    d = fx.Vector.filled(VEC, ok, fx.Boolean).select(d, zero)
                    acc1 = acc1 + rc.lane_sum(d, VEC)
                    acc2 = acc2 + rc.lane_sum(d * d, VEC)
            s2 = block_allreduce(acc2, s_b) * INV_N
            if const_expr(kind == "layer"):
                s1 = block_allreduce(acc1, s_a) * INV_N
                mean = k + s1
                var = fx.max(s2 - s1 * s1, zero)
                rstd = fx.math.rsqrt(var + eps, fastmath=AFN)
            else:
                rstd = fx.math.rsqrt(s2 + eps, fastmath=AFN)
            # pass 2: re-read (and re-add), normalize, store
            for c in range(fx.Int32(0), fx.Int32(NCH), fx.Int32(1)):
                for u in range_constexpr(U):
                    idx = tid + (c * U + u) * BLOCK
                    ok = idx < NV
                    x_e, x = load_row(ok.select(idx, 0))
                    y = (x - mean) * rstd if const_expr(kind == "layer") else x * rstd
                    if ok:
                        affine_store(y, idx, x_e)

        if const_expr(MULTI):
            # weights / bias stay in registers while this workgroup walks rows bid, bid + G, ...
            pre = []
            for t in range_constexpr(NT):
                idx = chunk(t)[0]
                pre.append((load_param(Wt, w_dtype, idx) if const_expr(w_dtype is not None) else None,
                            load_param(Bs, b_dtype, idx) if const_expr(b_dtype is not None) else None))
            for rb in range(fx.Int32(fx.block_idx.x), (M + (RPB - 1)) // RPB, G):
                set_row(rb)
                resident(pre)
        else:
            set_row(fx.Int32(fx.block_idx.x))
            if const_expr(STREAM):
                streamed()
            else:
                resident(None)

    @flyc.jit
    def launch(X: fx.Tensor, R: fx.Tensor, Wt: fx.Tensor, Bs: fx.Tensor, Out: fx.Tensor, Sum: fx.Tensor,
               Q: fx.Tensor, S: fx.Tensor, m: fx.Int32, g: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        row_norm_kernel(X, R, Wt, Bs, Out, Sum, Q, S, m, g).launch(grid=(g, 1, 1), block=(BLOCK, 1, 1),
                                                                  stream=stream)

    return launch


def _run(op, x, residual, weight, bias, eps, kind, *, affine="row", groups=1, hw=1, rows_view=None, quant=None,
         pre=None, sum_only=False):
    """Validate, allocate and launch; x is [M, N] (rows_view: GroupNorm's [B*G, Cg*HW] view).
    Returns (out, sum); with quant (a format name), (q, sum, s) and out is not written."""
    xr = x if rows_view is None else rows_view
    rc.check_rows(op, xr)
    if xr.stride(-1) != 1:
        xr = xr.contiguous()
    m, n = xr.shape
    plen = n if affine == "row" else groups * (n // hw)
    weight = rc.check_vector(op, weight, plen, "weight", x.device)
    bias = rc.check_vector(op, bias, plen, "bias", x.device)
    if residual is not None:
        if not isinstance(residual, torch.Tensor) or residual.shape != xr.shape or residual.dtype != xr.dtype:
            got = (tuple(residual.shape), residual.dtype) if isinstance(residual, torch.Tensor) else type(residual)
            raise KernelInputError(f"{op}: residual must match x's shape {tuple(xr.shape)} and dtype {xr.dtype}, "
                                   f"got {got}")
        rc.check_rows(op, residual, "residual")
        if residual.stride(-1) != 1:
            residual = residual.contiguous()
    out = torch.empty((m, n), dtype=xr.dtype, device=xr.device)
    total = torch.empty((m, n), dtype=xr.dtype, device=xr.device) if residual is not None else None
    q = s = None
    if quant is not None:
        arch = rc.current_arch()
        q = torch.empty((m, n), dtype=fp8_dtype(arch, quant), device=xr.device)
        s = torch.empty((m, 1), dtype=torch.float32, device=xr.device)
    if m == 0 or n == 0:
        return (out, total) if quant is None else (q, total, s)
    row_tensors = [xr, out, residual, total]
    vec = rc.pick_vec(n, xr.dtype, *row_tensors, *([weight, bias] if affine == "row" else []))
    if affine == "channel":
        while hw % vec:
            vec //= 2
    if quant is not None and not rq.fusable(n, vec, affine):  # the plain norm, then the quantize kernel
        from translator_kernels.gemm.quantize import quantize_rows

        y, total = _run(op, x, residual, weight, bias, eps, kind, affine=affine, rows_view=rows_view)
        q, s = quantize_rows(y, quant)
        return q, total, s
    pre_kw = {}
    if pre is not None:  # (weight, eps) of a norm of x before the residual add; the weight rides in B
        bias = rc.check_vector(op, pre[0], plen, "pre_weight", x.device)
        pre_kw = dict(pre_w=rc.DTYPES[bias.dtype], pre_eps=float(pre[1]), sum_only=sum_only)
    launch = build_row_norm(n, rc.DTYPES[xr.dtype], vec, kind, float(eps), rc.current_arch(),
                            w_dtype=rc.DTYPES.get(weight.dtype) if weight is not None else None,
                            b_dtype=rc.DTYPES.get(bias.dtype) if bias is not None and pre is None else None,
                            residual=residual is not None, affine=affine, groups=groups, hw=hw, quant=quant, **pre_kw)
    dummy = xr
    rc.launch(launch, xr, residual if residual is not None else dummy, weight if weight is not None else dummy,
              bias if bias is not None else dummy, out, total if total is not None else out,
              q.view(torch.int32) if q is not None else dummy, s if s is not None else dummy, m,
              _grid(m, n, vec, xr.element_size(), residual is not None, weight, bias, affine))
    return (out, total) if quant is None else (q, total, s)


def _multi_rows(n, vec, affine, has_params):
    """Whether a workgroup keeps row weights in registers and walks several rows."""
    return rc.row_fits(rc.row_tiling(n, vec)) and affine == "row" and has_params


def _grid(m, n, vec, esize, residual, weight, bias, affine):
    """Workgroups for m rows (a workgroup takes a row-block: one row, or RPB short rows). With
    row weights, each workgroup loads them once and walks row-blocks bid, bid + G, ...; G keeps
    the weight re-reads under PARAM_TRAFFIC of the compulsory bytes (x in, out (and residual,
    sum) once), but never below MIN_GRID workgroups."""
    pbytes = sum(t.numel() * t.element_size() for t in (weight, bias) if t is not None)
    blocks = -(-m // rc.row_tiling(n, vec).rows_per_block) if rc.row_fits(rc.row_tiling(n, vec)) else m
    if not _multi_rows(n, vec, affine, pbytes > 0):
        return blocks
    compulsory = m * n * esize * (4 if residual else 2) + pbytes
    g = int(PARAM_TRAFFIC * compulsory / pbytes)
    return max(1, min(blocks, max(MIN_GRID, g)))


@kr.replayed
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """LayerNorm over the last dim of a 2-D [M, N] x; returns a new contiguous tensor of x's dtype."""
    return _run("layer_norm", x, None, weight, bias, eps, "layer")[0]


@kr.replayed
def rms_norm(x, weight=None, eps=1e-6):
    """RMSNorm over the last dim of a 2-D [M, N] x: x * rsqrt(mean(x^2) + eps) * weight."""
    return _run("rms_norm", x, None, weight, None, eps, "rms")[0]


@kr.replayed
def add_layer_norm(x, residual, weight, bias, eps):
    """(x + residual, layer_norm(x + residual)) in one pass."""
    out, total = _run("add_layer_norm", x, residual, weight, bias, eps, "layer")
    return total, out


@kr.replayed
def add_rms_norm(x, residual, weight, eps):
    """(x + residual, rms_norm(x + residual)) in one pass."""
    out, total = _run("add_rms_norm", x, residual, weight, None, eps, "rms")
    return total, out


@kr.replayed
def norm_add_rms_norm(x, residual, pre_weight, weight, pre_eps, eps):
    """(s, rms_norm(s)) with s = rms_norm(x, pre_weight, pre_eps) + residual, each rounded to x's dtype (Gemma's
    post-norm of a GEMM's output, the residual add and the next pre-norm) in one pass over resident rows; rows
    too long for registers take two launches (the norm, then add_rms_norm)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise KernelInputError(f"norm_add_rms_norm: x must be a 2-D [M, N] tensor, got {getattr(x, 'shape', x)}")
    n = x.shape[1]
    if not rc.row_fits(rc.row_tiling(n, rc.pick_vec(n, x.dtype, x))):
        return add_rms_norm(rms_norm(x, pre_weight, pre_eps), residual, weight, eps)
    out, total = _run("norm_add_rms_norm", x, residual, weight, None, eps, "rms", pre=(pre_weight, pre_eps))
    return total, out


@kr.replayed
def norm_add(x, residual, pre_weight, pre_eps):
    """rms_norm(x, pre_weight, pre_eps) + residual, each rounded to x's dtype (OLMo2's post-norm and residual add)
    in one pass over resident rows; rows too long for registers take two launches (the norm, then an add)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise KernelInputError(f"norm_add: x must be a 2-D [M, N] tensor, got {getattr(x, 'shape', x)}")
    n = x.shape[1]
    if not rc.row_fits(rc.row_tiling(n, rc.pick_vec(n, x.dtype, x))):
        return add_rms_norm(rms_norm(x, pre_weight, pre_eps), residual, None, 0.0)[0]
    return _run("norm_add", x, residual, None, None, 0.0, "rms", pre=(pre_weight, pre_eps), sum_only=True)[1]


def _fmt(fmt):
    if fmt not in rq.FORMATS:
        raise KernelInputError(f"norm with fp8 output: format {fmt!r} is not one of {rq.FORMATS}")
    return fmt


@kr.replayed
def norm_fp8(x, kind, weight=None, bias=None, eps=1e-6, fmt="fp8"):
    """kind "rms" | "layer" norm of a 2-D [M, N] x, written per token as fp8: (q [M, N] in the arch's
    format, s [M, 1] fp32) with norm(x) rounded to x's dtype ≈ q * s (one launch)."""
    q, _, s = _run(f"{kind}_norm_fp8", x, None, weight, bias, eps, kind, quant=_fmt(fmt))
    return q, s


@kr.replayed
def add_norm_fp8(x, residual, kind, weight=None, bias=None, eps=1e-6, fmt="fp8"):
    """(x + residual, q, s): the residual add, then norm_fp8 of the sum (one launch)."""
    q, total, s = _run(f"add_{kind}_norm_fp8", x, residual, weight, bias, eps, kind, quant=_fmt(fmt))
    return total, q, s


@kr.replayed
def group_norm(x, num_groups, weight, bias, eps):
    """GroupNorm of x [B, C, *spatial]: statistics per (sample, group), per-channel affine."""
    op = "group_norm"
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise KernelInputError(f"{op}: x must be a tensor [B, C, *spatial], got "
                               f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    b, c = x.shape[0], x.shape[1]
    if num_groups <= 0 or c % num_groups:
        raise KernelInputError(f"{op}: C={c} (shape {tuple(x.shape)}) is not divisible by num_groups={num_groups}")
    hw = 1
    for s in x.shape[2:]:
        hw *= s
    xc = x.contiguous()
    rows = xc.view(b * num_groups, (c // num_groups) * hw)
    out, _ = _run(op, xc, None, weight, bias, eps, "layer", affine="channel", groups=num_groups, hw=hw,
                  rows_view=rows)
    return out.view(x.shape)
