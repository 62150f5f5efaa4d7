"""MX GEMM on gfx950 (OCP microscaling: 8-bit float values with one e8m0 scale per 32 along K): the host side.

    y = epilogue( sum_g 2^(sa[r, g] - 127) 2^(sw[c, g] - 127) sum_{k in g} A_q[r, k] W_q[c, k] )

The family's fp8 kernel (kernel.build_gemm with w_scale "mx": fp8.py's geometry, split-K, kw = 4 decode tiles,
the epilogue program, bias, residual) with gfx950's v_mfma_scale_f32_16x16x128_f8f6f4 taking the lane's e8m0
bytes (device side and the lane layout: mxscale.py). Formats: A and W e4m3fn ("fp8", MXFP8) or e5m2 ("bf8"),
mixed allowed. Scales: float8_e8m0fnu (or its uint8 bytes), W's [N, K / 32], A's [..., K / 32] (MX A) or an
fp32 one value / one per row applied in the epilogue (per-token A with MX weights: precision="fp8",
fp8_format="mxfp8").

Translate time (`prepare_weight_mx`): W is padded to K % 128 == 0 with zeros, its 16-value chunks permuted
inside each 128-block (position 4h + q holds chunk 2q + h, `CHUNK_PERM`) so that the ordinary fp8 preshuffle
hands lane q the contiguous 32 values of its scale group, and its scales are laid out [N_pad / 16, KB, 64]
(`shuffle_scale_mx`: a lane's byte of an n-block and K block at lane = 16 q + l16) with 0 bytes (2^-127) in
the padding, where the values are exact zeros.

gfx942 has no scaled MFMA: gemm_mx raises KernelInputError there (quantize per channel to e4m3fnuz instead).
A decomposition (one 16x16x32 fp8 MFMA per 32-group and the two scales applied to each partial, blockscale.py's
way) is possible but not built.

`quantize_mx` is the OCP rule (shared exponent floor(log2(amax)) - emax of the element format, values
x / 2^e rounded to nearest and saturated); `ref_gemm_mx` the reference of the kernel's math: both operands
dequantized exactly in fp32, the fp32 matmul, then the epilogue in kernel order.
"""

from __future__ import annotations

import torch

from translator_kernels import replay as kr
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.fp8 import (_scale_arg, _units, choose_fp8_config, fp8_format, m_bucket,
                                         padded_shape_fp8, ref_gemm_fp8, shuffle_weight_fp8,
                                         unshuffle_weight_fp8)
from translator_kernels.gemm.mxscale import GROUP

MX_DTYPES = {"fp8": torch.float8_e4m3fn, "bf8": torch.float8_e5m2}
E8M0 = torch.float8_e8m0fnu
FP4 = torch.float4_e2m1fn_x2  # MXFP4: quantize_mx returns its codes one per byte (uint8 0..15), packed for the kernel
_EMAX = {torch.float8_e4m3fn: 8, torch.float8_e5m2: 15, FP4: 2}  # exponent of the format's largest power of two
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # e2m1 magnitudes by code & 7; code & 8 is the sign
CHUNK_PERM = [0, 2, 4, 6, 1, 3, 5, 7]  # W chunk position 4h + q <- chunk 2q + h of a 128-block


def quantize_mx(x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn):
    """(q, scale) with x ≈ q * 2^(scale) per group of 32 along the last dim (OCP MX): scale float8_e8m0fnu
    [..., K / 32] = floor(log2(amax)) - emax(dtype) (clamped to e8m0's range), q = x / 2^scale rounded to
    nearest and saturated to the format's largest value. K % 32 == 0."""
    if dtype not in _EMAX:
        raise KernelInputError(f"quantize_mx: dtype {dtype} is not an MX 8-bit format ({list(_EMAX)})")
    k = x.shape[-1]
    if k % GROUP:
        raise KernelInputError(f"quantize_mx: the last dim {k} is not a multiple of {GROUP}")
    xg = x.float().reshape(*x.shape[:-1], k // GROUP, GROUP)
    amax = xg.abs().amax(-1)
    e = torch.frexp(amax).exponent - 1 - _EMAX[dtype]  # floor(log2(amax)) - emax, exact
    e = torch.where(amax > 0, e, torch.full_like(e, -127)).clamp(-127, 127)
    v = xg / torch.ldexp(torch.ones_like(amax), e).unsqueeze(-1)
    q = _e2m1_codes(v) if dtype == FP4 else v.clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype)
    return q.reshape(x.shape), (e + 127).to(torch.uint8).view(E8M0)


def _e2m1_codes(v):
    """fp32 -> e2m1 codes (uint8 0..15): round to nearest, ties to the even code (mantissa 0), saturate at 6."""
    d = (v.abs().clamp(max=6.0).unsqueeze(-1) - E2M1).abs()
    near = d == d.amin(-1, keepdim=True)
    code = (near * (16 - torch.arange(8) % 2 * 8 - torch.arange(8))).argmax(-1)  # the even one of a tie
    return (code + 8 * (v < 0)).to(torch.uint8)


def scale_bytes(s: torch.Tensor) -> torch.Tensor:
    """e8m0 scales as their uint8 bytes (float8_e8m0fnu or uint8 in)."""
    if s.dtype == E8M0:
        return s.view(torch.uint8)
    if s.dtype != torch.uint8:
        raise KernelInputError(f"MX scales must be float8_e8m0fnu (or their uint8 bytes), got {s.dtype}")
    return s


def dequantize_mx(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """q * 2^(s - 127) per group of 32 along the last dim (exact in fp32); q 8-bit floats or e2m1 codes (uint8)."""
    v = torch.where(q >= 8, -1.0, 1.0) * E2M1[(q & 7).long()] if q.dtype == torch.uint8 else q.float()
    return v * scale_bytes(s).view(E8M0).float().repeat_interleave(GROUP, -1)


def shuffle_weight_mx(w: torch.Tensor) -> torch.Tensor:
    """W[N, K] e4m3fn / e5m2 (or e2m1 codes, uint8), K % 32 == 0 -> the (N_pad, K_pad) layout the MX kernel reads
    (a new tensor); fp4: the same layout of the codes with byte pairs packed low nibble first, (N_pad, K_pad / 2)
    uint8, so a lane's half-chunk of 16 values is 8 bytes at half the fp8 offset."""
    if w.dim() != 2 or (w.dtype not in _EMAX and w.dtype != torch.uint8) or w.shape[1] % GROUP:
        raise KernelInputError(f"shuffle_weight_mx: want a 2-D [N, K] e4m3fn / e5m2 weight (or e2m1 codes as uint8) "
                               f"with K % {GROUP} == 0, got {tuple(w.shape)} {w.dtype}")
    n, k = w.shape
    kp = padded_shape_fp8(n, k)[1]
    b = torch.nn.functional.pad(w.view(torch.uint8), (0, kp - k))
    b = b.reshape(n, kp // 128, 8, 16)[:, :, CHUNK_PERM].reshape(n, kp)
    if w.dtype != torch.uint8:
        return shuffle_weight_fp8(b.view(w.dtype))
    c = shuffle_weight_fp8(b.view(torch.float8_e4m3fn)).view(torch.uint8)  # any 1-byte dtype: a byte layout
    return (c[:, 0::2] | (c[:, 1::2] << 4)).contiguous()


def shuffle_scale_mx(s: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """W's scales [N, K / 32] -> uint8 [N_pad / 16, KB, 64] (lane 16 q + l16 of n-block nb, K block kb holds
    s[16 nb + l16, 4 kb + q]); 0 bytes in the padding."""
    s = scale_bytes(s)
    if tuple(s.shape) != (n, k // GROUP):
        raise KernelInputError(f"shuffle_scale_mx: scales {tuple(s.shape)}, want [{n}, {k // GROUP}] (one per 32 of K)")
    n_pad, k_pad = padded_shape_fp8(n, k)
    kb = k_pad // 128
    p = torch.nn.functional.pad(s, (0, kb * 4 - s.shape[1], 0, n_pad - n))
    return p.reshape(n_pad // 16, 16, kb, 4).permute(0, 2, 3, 1).contiguous().reshape(n_pad // 16, kb, 64)


def unshuffle_weight_mx(ws: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The inverse of shuffle_weight_mx: W_q [N, K] (fp4: the codes, uint8)."""
    if ws.dtype == torch.uint8:  # packed e2m1 codes
        ws = torch.stack([ws & 15, ws >> 4], -1).reshape(ws.shape[0], -1).view(torch.float8_e4m3fn)
        return unshuffle_weight_mx(ws, n, k).view(torch.uint8)
    b = unshuffle_weight_fp8(ws, n, ws.shape[1]).view(torch.uint8)
    inv = [CHUNK_PERM.index(c) for c in range(8)]
    return b.reshape(n, -1, 8, 16)[:, :, inv].reshape(n, -1)[:, :k].contiguous().view(ws.dtype)


def unshuffle_scale_mx(sp: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The inverse of shuffle_scale_mx: e8m0 [N, K / 32]."""
    nb, kb = sp.shape[0], sp.shape[1]
    s = sp.reshape(nb, kb, 4, 16).permute(0, 3, 1, 2).reshape(nb * 16, kb * 4)
    return s[:n, :k // GROUP].contiguous().view(E8M0)


def prepare_weight_mx(w_q: torch.Tensor, w_scale: torch.Tensor):
    """(weight, scales) the kernel reads, from W_q [N, K] and its e8m0 scales [N, K / 32]."""
    n, k = w_q.shape
    return shuffle_weight_mx(w_q), shuffle_scale_mx(w_scale, n, k)


def ref_gemm_mx(a_q, a_scale, w_q, w_scale, *, bias=None, activation=None, residual=None, scale=1.0,
                out_dtype=torch.bfloat16):
    """The kernel's math in torch: dequantize both operands exactly (MX scales), the fp32 matmul, then scale,
    an fp32 per-tensor / per-row a_scale (when A is not MX), bias, the program, the residual, one cast."""
    n, k = w_q.shape
    a_mx = a_scale is not None and a_scale.dtype in (E8M0, torch.uint8)
    a = dequantize_mx(a_q.reshape(-1, k), a_scale.reshape(-1, k // GROUP)) if a_mx else a_q.reshape(-1, k).float()
    y = ref_gemm_fp8(a, dequantize_mx(w_q, w_scale), None if a_mx else a_scale, bias=bias, activation=activation,
                     residual=residual, scale=scale, out_dtype=out_dtype)
    return y.reshape(*a_q.shape[:-1], n)


@kr.replayed
def gemm_mx(a_q, w_prepared, n, k, w_scale, *, a_scale=None, bias=None, activation=None, residual=None, scale=1.0,
            out_dtype=torch.bfloat16, _config=None):
    """act(scale * MX-scaled (A_q @ W_qᵀ) [* sa[row]] + bias) + residual, one FlyDSL launch (gfx950).

    a_q [..., k] e4m3fn / e5m2; (w_prepared, w_scale) = prepare_weight_mx(W_q[n, k], its e8m0 [n, k / 32]);
    a_scale: e8m0 [..., k / 32] (MX activation), or an fp32 one value / one per row (epilogue), or None."""
    from translator_kernels import launch as kl
    from translator_kernels.gemm import _epilogue_args, _launch, _rows

    op = "gemm_mx"
    arch = kl.arch()
    if not arch.startswith("gfx950"):
        raise KernelInputError(f"{op}: MX scales need gfx950's scaled MFMA (v_mfma_scale_f32_16x16x128_f8f6f4); "
                               f"{arch} has none: quantize per channel to its fp8 formats (gemm_fp8) instead")
    fp4 = w_prepared.dtype == torch.uint8  # packed e2m1 codes (MXFP4)
    fa, fw = fp8_format(a_q.dtype, arch), "fp4" if fp4 else fp8_format(w_prepared.dtype, arch)
    n_pad, k_pad = padded_shape_fp8(n, k)
    if k % GROUP or tuple(w_prepared.shape) != (n_pad, k_pad // 2 if fp4 else k_pad) or a_q.dim() < 1 \
            or a_q.shape[-1] != k:
        raise KernelInputError(f"{op}: a {tuple(a_q.shape)}, weight {tuple(w_prepared.shape)}; want a [..., {k}], the "
                               f"weight {(n_pad, k_pad)} from mx.prepare_weight_mx, K % {GROUP} == 0")
    if tuple(w_scale.shape) != (n_pad // 16, k_pad // 128, 64) or w_scale.dtype != torch.uint8:
        raise KernelInputError(f"{op}: w_scale {tuple(w_scale.shape)} {w_scale.dtype}; want the uint8 "
                               f"{(n_pad // 16, k_pad // 128, 64)} of mx.prepare_weight_mx")
    lead, m, out_dtype = _rows(op, a_q, out_dtype)
    if m == 0:
        return torch.empty(lead + (n,), dtype=out_dtype, device=a_q.device)
    if isinstance(a_scale, torch.Tensor) and a_scale.dtype in (E8M0, torch.uint8):
        if tuple(a_scale.shape) != lead + (k // GROUP,):
            raise KernelInputError(f"{op}: MX a_scale has shape {tuple(a_scale.shape)}, want {lead + (k // GROUP,)}")
        sa = ("mx", scale_bytes(a_scale).reshape(m, k // GROUP).contiguous())
    else:
        sa = _scale_arg(op, "a_scale", a_scale, m, "row")
    bias, residual = _epilogue_args(op, bias, residual, lead, n, out_dtype)
    cfg = _config or choose_fp8_config(m_bucket(m), n, k, arch)
    a3 = _units(a_q.reshape(m, k).contiguous()).unsqueeze(0)
    w_units = w_prepared.view(torch.int16 if fp4 else torch.int32).unsqueeze(0)  # one 4-value unit of K each
    out = _launch(op, a3, w_units, n, k // 4, 1, m, bias=bias, activation=activation,
                  residual=residual, scale=scale, out_dtype=out_dtype, cfg=cfg, dt=fa if fa == fw else f"{fa}x{fw}",
                  scales=(sa[0], sa[1], "mx", w_scale))
    return out.reshape(lead + (n,))


__all__ = ["CHUNK_PERM", "E8M0", "MX_DTYPES", "dequantize_mx", "gemm_mx", "prepare_weight_mx", "quantize_mx",
           "ref_gemm_mx", "scale_bytes", "shuffle_scale_mx", "shuffle_weight_mx", "unshuffle_scale_mx",
           "unshuffle_weight_mx"]
