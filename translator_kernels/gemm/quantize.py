"""Per-token (per-row) fp8 quantization of a GEMM's activation: x[M, K] -> q[M, K] fp8 and s[M] fp32.

    s[r] = max(max_j |x[r, j]| / FMAX, 1e-12),   q[r, j] = fp8(clamp(x[r, j] / s[r], -FMAX, FMAX))

(FMAX: the format's largest finite value; the cast rounds to nearest even; fp32 division, so the
kernel equals fp8.quantize_fp8(x, dtype, dim=-1) bit for bit). A standalone launch before
gemm_fp8 where no producer writes fp8 itself: a row norm does (rows/norm.py, `quant=`, with the same
scale / pack / store pieces: rows/quant.py), and an elementwise region joins this kernel as its prologue
(`quantize_program`); a GEMM epilogue does not (docs/fp8.md). `quantize_static`: the same kernel with a fixed
scale read from the device (a static activation scale, fp8_static.py).

One wave per row: each lane loads 16-byte chunks (8 bf16 / fp16 or 4 fp32 values), keeps them in
registers, takes the row's |max| with a butterfly over the wave, then divides, clamps and converts
four values per 32-bit word with v_cvt_pk_fp8_f32 / v_cvt_pk_bf8_f32 (two per word, word_sel 0 / 1)
and stores 8 (or 4) bytes per chunk. Lane 0 stores the scale. Rows up to MAX_CHUNKS chunks per lane
(K <= 16384 bf16) fit the registers; longer rows raise KernelInputError.
"""

from __future__ import annotations

import math

import torch

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import const_expr, range_constexpr, rocdl
from flydsl.expr.typing import T

from translator_kernels import device_math as em
from translator_kernels import launch as kl
from translator_kernels import replay as kr
from translator_kernels.arch import FLOAT_NAMES
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.common import OOB, _raw
from translator_kernels.gemm.fp8 import fp8_dtype
from translator_kernels.rows import quant as rq
from translator_kernels.program import parse
from translator_kernels.rows.common import wave_allreduce

MAX_CHUNKS = 32
MAX_MORE = 3  # inputs of a program beyond the first
_IN = {"f32": (4, lambda: T.f32), "bf16": (2, lambda: T.bf16), "f16": (2, lambda: T.f16)}


@kl.builder
def build_quantize_rows(k: int, in_dtype: str, fmt: str, arch: str, program: str | None = None,
                        more: tuple = (), fmax: float | None = None, static: float = 0.0):
    """launch(Q, S, X, m, x_bytes, q_bytes, *Xs): m rows of K values -> Q (fp8 bytes, viewed as int32), S
    fp32. program: a per-element program (translator_kernels.program) of X and the inputs of dtypes `more`
    (each [m, K] contiguous, x_bytes long per value of X's size), one float output: the values quantized.
    static (a power of two, nonzero): S is read, not written: every row's scale is S[0] * static (a fixed
    activation scale, fp8_static.py; no |max| reduction)."""
    dts = (in_dtype, *more)
    if any(d not in _IN for d in dts) or fmt not in ("fp8", "bf8") or k % 16:
        raise KernelInputError(f"quantize_rows: dtypes {dts} / format {fmt} / K={k} (want f32/bf16/f16, "
                               f"fp8/bf8, K % 16 == 0)")
    if len(more) > MAX_MORE:
        raise KernelInputError(f"quantize_rows: {len(dts)} inputs (at most {MAX_MORE + 1})")
    prog = parse(program) if program else None
    if prog is not None and (prog.n != len(dts) or len(prog.out) != 1 or prog.out[0][1] not in _IN):
        raise KernelInputError(f"quantize_rows: program {program!r} must read {len(dts)} inputs and write one "
                               f"float value")
    vec = 16 // max(_IN[d][0] for d in dts)
    out_dt = prog.out[0][1] if prog is not None else in_dtype
    nc = -(-k // (64 * vec))
    if nc > MAX_CHUNKS:
        raise KernelInputError(f"quantize_rows: K={k} needs {nc} chunks per lane (at most {MAX_CHUNKS}); split K")
    fmax = float(fmax or rq.fmax(arch, fmt))  # a smaller range: blockscale.py's e4m3fn on gfx942
    cvt = rq.cvt(fmt)

    @flyc.kernel
    def quantize_kernel(Q: fx.Tensor, S: fx.Tensor, X: fx.Tensor, m: fx.Int32, x_bytes: fx.Int32,
                        q_bytes: fx.Int32, X1: fx.Tensor, X2: fx.Tensor, X3: fx.Tensor):
        lane = fx.Int32(fx.thread_idx.x)
        row = fx.Int32(fx.block_idx.x)
        esz0 = _IN[in_dtype][0]
        srcs = [(rq.rsrc(t, x_bytes // esz0 * _IN[d][0]), d) for t, d in zip((X, X1, X2, X3), dts)]
        rqb = rq.rsrc(Q, q_bytes)
        zero = _raw(fx.Int32(0))
        vals, amax = [], fx.Float32(0.0)
        for c in range_constexpr(nc):
            col = (lane + c * 64) * vec
            ins = []
            for res, d in srcs:
                esz, elem_t = _IN[d]
                off = (col < k).select((row * k + col) * esz, fx.Int32(OOB))
                ins.append(fx.Vector(rocdl.raw_ptr_buffer_load(T.vec(vec, elem_t()), res, _raw(off), zero, 0))
                           .to(fx.Float32))
            v = ins[0]
            if const_expr(prog is not None):
                v = em.run(prog, ins, vec, list(dts))[prog.out[0][0]]
                if const_expr(out_dt != "f32"):
                    v = em.cast(v, out_dt)  # the value the elementwise kernel would store, rounded to its dtype
            vals.append(v)
            if const_expr(not static):
                amax = fx.max(amax, rq.lane_absmax(v, vec))
        if const_expr(static):
            scale = fx.Float32(rocdl.raw_ptr_buffer_load(T.f32, rq.rsrc(S, 4), zero, zero, 0)) * fx.Float32(static)
        else:
            scale = rq.row_scale(wave_allreduce(amax, "max"), fmax)
        for c in range_constexpr(nc):
            col = (lane + c * 64) * vec
            words = rq.pack([vals[c][i] for i in range(vec)], scale, fmax, cvt)
            rq.store_words(rqb, words, row * k + col, col < k)
        if const_expr(not static):
            rq.store_scale(S, m, row, scale, lane == 0)

    @flyc.jit
    def launch(Q: fx.Tensor, S: fx.Tensor, X: fx.Tensor, m: fx.Int32, x_bytes: fx.Int32, q_bytes: fx.Int32,
               X1: fx.Tensor, X2: fx.Tensor, X3: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        quantize_kernel(Q, S, X, m, x_bytes, q_bytes, X1, X2, X3).launch(grid=(m, 1, 1), block=(64, 1, 1),
                                                                         stream=stream)

    return launch


def _rows(op, x, fmt):
    """(arch, K, leading dims, x as [M, K] contiguous, M, the empty fp8 q[M, K]) of an activation x[..., K]."""
    if x.dtype not in FLOAT_NAMES:
        raise KernelInputError(f"{op}: x dtype {x.dtype} is not float32 / bfloat16 / float16")
    arch = kl.arch()
    k = x.shape[-1]
    x2 = x.reshape(-1, k).contiguous()
    return arch, k, tuple(x.shape[:-1]), x2, x2.shape[0], torch.empty(x2.shape, dtype=fp8_dtype(arch, fmt),
                                                                      device=x.device)


@kr.replayed
def quantize_rows(x, fmt: str = "fp8", fmax: float | None = None):
    """x[..., K] (fp32 / bf16 / fp16) -> (q[..., K] in the target arch's 8-bit format, s[..., 1] fp32)."""
    arch, k, lead, x2, m, q = _rows("quantize_rows", x, fmt)
    s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        launcher = build_quantize_rows(k, FLOAT_NAMES[x.dtype], fmt, arch, fmax=fmax)
        kl.call(launcher, q.view(torch.int32), s, x2, m, x2.numel() * x2.element_size(), q.numel(), x2, x2, x2)
    return q.reshape(lead + (k,)), s.reshape(lead + (1,))


@kr.replayed
def quantize_program(inputs, program: str, fmt: str = "fp8"):
    """(q, s) of the per-element `program` (translator_kernels.program: one float output) of `inputs` (1 to
    MAX_MORE + 1 tensors of one shape [..., K], fp32 / bf16 / fp16), quantized per row as quantize_rows
    does: the elementwise kernel and the quantize kernel in one launch; the program's value never goes to
    memory. Bit-exact to quantize_rows(fused_elementwise(inputs, program)[0])."""
    inputs = list(inputs)
    if not inputs or len(inputs) > MAX_MORE + 1 or any(t.dtype not in FLOAT_NAMES for t in inputs) \
            or any(t.shape != inputs[0].shape for t in inputs):
        raise KernelInputError(f"quantize_program: want 1 to {MAX_MORE + 1} float inputs of one shape, got "
                               f"{[(tuple(t.shape), t.dtype) for t in inputs]}")
    arch = kl.arch()
    x = inputs[0]
    k = x.shape[-1]
    lead = tuple(x.shape[:-1])
    xs = [t.reshape(-1, k).contiguous() for t in inputs]
    m = xs[0].shape[0]
    q = torch.empty((m, k), dtype=fp8_dtype(arch, fmt), device=x.device)
    s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        launcher = build_quantize_rows(k, FLOAT_NAMES[x.dtype], fmt, arch, program,
                                       tuple(FLOAT_NAMES[t.dtype] for t in inputs[1:]))
        pad = xs + [xs[0]] * (MAX_MORE + 1 - len(xs))
        kl.call(launcher, q.view(torch.int32), s, pad[0], m, xs[0].numel() * xs[0].element_size(), q.numel(),
                *pad[1:])
    return q.reshape(lead + (k,)), s.reshape(lead + (1,))


@kr.replayed
def quantize_static(x, scale, fmt: str = "fp8", fmax: float | None = None, mul: float = 1.0):
    """x[..., K] (fp32 / bf16 / fp16) -> q[..., K] = fp8(clamp(x / (scale * mul), -FMAX, FMAX)) with a fixed
    activation scale (one fp32 value on the device, never read on the host; mul a power of two: gfx942's
    e4m3fn-as-fnuz halves, fp8_static.py). One launch, one wave per row, no |max| reduction."""
    if not isinstance(scale, torch.Tensor) or scale.numel() != 1 or scale.dtype != torch.float32:
        raise KernelInputError(f"quantize_static: the scale must be one fp32 value, got "
                               f"{getattr(scale, 'shape', type(scale))} {getattr(scale, 'dtype', '')}")
    if mul <= 0 or math.frexp(mul)[0] != 0.5:
        raise KernelInputError(f"quantize_static: mul {mul} is not a power of two (it must scale exactly)")
    arch, k, lead, x2, m, q = _rows("quantize_static", x, fmt)
    if m:
        launcher = build_quantize_rows(k, FLOAT_NAMES[x.dtype], fmt, arch, fmax=fmax, static=float(mul))
        kl.call(launcher, q.view(torch.int32), scale.reshape(1).contiguous(), x2, m, x2.numel() * x2.element_size(),
                q.numel(), x2, x2, x2)
    return q.reshape(lead + (k,))
