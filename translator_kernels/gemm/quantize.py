"""Per-token (per-row) fp8 quantization of a GEMM's activation: x[M, K] -> q[M, K] fp8 and s[M] fp32.

    s[r] = max(max_j |x[r, j]| / FMAX, 1e-12),   q[r, j] = fp8(clamp(x[r, j] / s[r], -FMAX, FMAX))

(FMAX: the format's largest finite value; the cast rounds to nearest even; fp32 division, so the
kernel equals fp8.quantize_fp8(x, dtype, dim=-1) bit for bit). A standalone launch before
gemm_fp8 (precision="fp8"); fusing it into the producer (a norm, the previous GEMM's epilogue) is
the next step (docs/fp8.md).

One wave per row: each lane loads 16-byte chunks (8 bf16 / fp16 or 4 fp32 values), keeps them in
registers, takes the row's |max| with a butterfly over the wave, then divides, clamps and converts
four values per 32-bit word with v_cvt_pk_fp8_f32 / v_cvt_pk_bf8_f32 (two per word, word_sel 0 / 1)
and stores 8 (or 4) bytes per chunk. Lane 0 stores the scale. Rows up to MAX_CHUNKS chunks per lane
(K <= 16384 bf16) fit the registers; longer rows raise KernelInputError.
"""

from __future__ import annotations

import torch

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import range_constexpr, rocdl
from flydsl.expr.typing import T

from translator_kernels import launch as kl
from translator_kernels import replay as kr
from translator_kernels.arch import FLOAT_NAMES
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.common import OOB, _raw
from translator_kernels.gemm.fp8 import fp8_dtype
from translator_kernels.rows.common import wave_allreduce

MAX_CHUNKS = 32
_IN = {"f32": (4, lambda: T.f32), "bf16": (2, lambda: T.bf16), "f16": (2, lambda: T.f16)}


@kl.builder
def build_quantize_rows(k: int, in_dtype: str, fmt: str, arch: str, fmax: float | None = None):
    """launch(Q, S, X, m, x_bytes, q_bytes): m rows of K values -> Q (fp8 bytes, viewed as int32), S fp32."""
    if in_dtype not in _IN or fmt not in ("fp8", "bf8") or k % 16:
        raise KernelInputError(f"quantize_rows: dtype {in_dtype} / format {fmt} / K={k} (want f32/bf16/f16, "
                               f"fp8/bf8, K % 16 == 0)")
    esz, elem_t = _IN[in_dtype]
    vec = 16 // esz
    nc = -(-k // (64 * vec))
    if nc > MAX_CHUNKS:
        raise KernelInputError(f"quantize_rows: K={k} needs {nc} chunks per lane (at most {MAX_CHUNKS}); split K")
    fmax = float(fmax or torch.finfo(fp8_dtype(arch, fmt)).max)  # fmax: a smaller range (blockscale.py: e4m3fn on gfx942)
    cvt = rocdl.cvt_pk_fp8_f32 if fmt == "fp8" else rocdl.cvt_pk_bf8_f32

    @flyc.kernel
    def quantize_kernel(Q: fx.Tensor, S: fx.Tensor, X: fx.Tensor, m: fx.Int32, x_bytes: fx.Int32,
                        q_bytes: fx.Int32):
        lane = fx.Int32(fx.thread_idx.x)
        row = fx.Int32(fx.block_idx.x)

        def rsrc(t, nbytes):
            return rocdl.get_buffer_rsrc(rocdl.make_buffer_ptr(fx.get_iter(t), num_records_bytes=fx.Int64(nbytes)))

        rx, rq, rs = rsrc(X, x_bytes), rsrc(Q, q_bytes), rsrc(S, m * 4)
        zero = _raw(fx.Int32(0))
        vals, amax = [], fx.Float32(0.0)
        for c in range_constexpr(nc):
            col = (lane + c * 64) * vec
            off = (col < k).select((row * k + col) * esz, fx.Int32(OOB))
            v = fx.Vector(rocdl.raw_ptr_buffer_load(T.vec(vec, elem_t()), rx, _raw(off), zero, 0)).to(fx.Float32)
            vals.append(v)
            for i in range_constexpr(vec):
                amax = fx.max(amax, fx.math.absf(v[i]))
        amax = wave_allreduce(amax, "max")
        scale = fx.max(amax / fx.Float32(fmax), fx.Float32(1e-12))
        hi, lo = fx.Float32(fmax), fx.Float32(-fmax)
        for c in range_constexpr(nc):
            col = (lane + c * 64) * vec
            y = [fx.max(fx.min(vals[c][i] / scale, hi), lo) for i in range(vec)]
            words = []
            for w in range_constexpr(vec // 4):
                word = cvt(T.i32, _raw(y[4 * w]), _raw(y[4 * w + 1]), zero, False)
                words.append(cvt(T.i32, _raw(y[4 * w + 2]), _raw(y[4 * w + 3]), word, True))
            data = words[0] if vec == 4 else fx.Vector.from_elements([fx.Int32(wd) for wd in words], fx.Int32)
            q_off = (col < k).select(row * k + col, fx.Int32(OOB))
            rocdl.raw_ptr_buffer_store(_raw(data), rq, _raw(q_off), zero)
        s_off = (lane == 0).select(row * 4, fx.Int32(OOB))
        rocdl.raw_ptr_buffer_store(_raw(scale), rs, _raw(s_off), zero)

    @flyc.jit
    def launch(Q: fx.Tensor, S: fx.Tensor, X: fx.Tensor, m: fx.Int32, x_bytes: fx.Int32, q_bytes: fx.Int32,
               stream: fx.Stream = fx.Stream(None)):
        quantize_kernel(Q, S, X, m, x_bytes, q_bytes).launch(grid=(m, 1, 1), block=(64, 1, 1), stream=stream)

    return launch


@kr.replayed
def quantize_rows(x, fmt: str = "fp8", fmax: float | None = None):
    """x[..., K] (fp32 / bf16 / fp16) -> (q[..., K] in the target arch's 8-bit format, s[..., 1] fp32)."""
    if x.dtype not in FLOAT_NAMES:
        raise KernelInputError(f"quantize_rows: x dtype {x.dtype} is not float32 / bfloat16 / float16")
    arch = kl.arch()
    k = x.shape[-1]
    lead = tuple(x.shape[:-1])
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    q = torch.empty((m, k), dtype=fp8_dtype(arch, fmt), device=x.device)
    s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        launcher = build_quantize_rows(k, FLOAT_NAMES[x.dtype], fmt, arch, fmax)
        kl.call(launcher, q.view(torch.int32), s, x2, m, x2.numel() * x2.element_size(), q.numel())
    return q.reshape(lead + (k,)), s.reshape(lead + (1,))
