"""Weight-only group-wise int4 GEMM: y = a @ Wᵀ with W[n, k] = q[n, k] * s[g, n] + b[g, n], g = k // G.

q: unsigned 4-bit codes (0..15), G (the group along K) 32, 64 or 128; s, b: fp32 per (group, output column).
Both public zero conventions are this affine map, prepared at translate time:
  - gpt-fast / torch's int4pack (`_weight_int4pack_mm*`): W = (q - 8) * scale + zero  ->  s = scale, b = zero - 8 scale;
  - the hand-written unpack (GPTQ / AWQ style):          W = (q - z) * scale          ->  s = scale, b = -z scale.

The dequantization happens in the GEMM's load path (kernel.py, w_int4=G, bf16 / fp16 activations): the weight is
preshuffled as the activation's (kpack 8: one 16-byte chunk of 8 values) with each chunk's 8 codes packed into one
32-bit word (value j in bits 4j .. 4j + 3), so a lane loads 4 bytes per chunk (a quarter of the bf16 weight's
bytes). At the top of the K step that uses it, each lane unpacks the 8 codes (shift, mask, convert), computes
q * s + b in fp32 and rounds once to the activation's dtype; the MFMA and the fp32 accumulation are the bf16 /
fp16 GEMM's. s and b of a lane's column and group are loaded with the K tile's W (one tile ahead) and ride in
the loop's carried registers, as blockscale.py's scales do (device side: dequant.py) (a 32-deep K block lies inside one group, G >= 32).

Reference (`ref_gemm_w4`): W dequantized the same way (fp32, one rounding to the activation dtype), the fp32
matmul, one cast. torch's int4pack op keeps W in fp32: the two differ by that rounding (a bf16 ulp of W).
"""

from __future__ import annotations

import torch

from translator_kernels import replay as kr
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.dequant import GROUPS
from translator_kernels.gemm.preshuffle import padded_shape, shuffle_weight


# ---- host side ----
def pack_weight_w4(q: torch.Tensor) -> torch.Tensor:
    """q[N, K] codes 0..15 (any integer dtype) -> the (N_pad, K_pad / 2) uint8 layout the kernel reads."""
    if q.dim() != 2 or q.is_floating_point():
        raise KernelInputError(f"pack_weight_w4: want 2-D integer codes [N, K], got {tuple(q.shape)} {q.dtype}")
    qs = shuffle_weight(q.to(torch.uint8), 8)  # chunks of 8 codes, the bf16 / fp16 layout
    lo, hi = qs.view(qs.shape[0], -1, 2).unbind(-1)
    return (lo | (hi << 4)).contiguous()


def unpack_weight_w4(wp: torch.Tensor, n: int, k: int) -> torch.Tensor:
    from translator_kernels.gemm.preshuffle import unshuffle_weight

    codes = torch.stack([wp & 0xF, wp >> 4], -1).reshape(wp.shape[0], -1)
    return unshuffle_weight(codes, n, k, 8)


def dequantize_w4(q, s, b, group: int) -> torch.Tensor:
    """W[N, K] fp32 = q * s[k // G, n] + b[k // G, n]."""
    return q.float() * s.float().repeat_interleave(group, 0).t() + b.float().repeat_interleave(group, 0).t()


def ref_gemm_w4(a, q, s, b, group: int, bias=None):
    """The kernel's math: W dequantized in fp32 and rounded to a's dtype, the fp32 matmul, + bias, one cast."""
    w = dequantize_w4(q, s, b, group).to(a.dtype).float()
    y = a.float() @ w.t()
    if bias is not None:
        y = y + bias.float()
    return y.to(a.dtype)


@kr.replayed
def gemm_w4(a, w_packed, n, k, group, s, b, *, bias=None, _config=None):
    """a[..., k] (bf16 / fp16) @ Wᵀ, W = q * s + b per group of `group` values along K (see the module note);
    w_packed = pack_weight_w4(q[n, k]); s, b fp32 [k / group, n]. Returns [..., n] in a's dtype."""
    from translator_kernels import launch as kl
    from translator_kernels.gemm import _epilogue_args, _launch, _rows
    from translator_kernels.gemm.tiles import choose_config, four_wave, m_bucket

    op = "gemm_w4"
    n_pad, k_pad = padded_shape(n, k)
    if group not in GROUPS or k % group:
        raise KernelInputError(f"{op}: group {group} with K={k}; want a group in {GROUPS} dividing K")
    if w_packed.dtype != torch.uint8 or tuple(w_packed.shape) != (n_pad, k_pad // 2):
        raise KernelInputError(f"{op}: weight {tuple(w_packed.shape)} {w_packed.dtype}; want uint8 "
                               f"{(n_pad, k_pad // 2)} from w4.pack_weight_w4")
    if a.dtype not in (torch.bfloat16, torch.float16) or a.dim() < 1 or a.shape[-1] != k:
        raise KernelInputError(f"{op}: a is {a.dtype} {tuple(a.shape)}; want bf16 / fp16 [..., {k}]")
    for name, t in (("s", s), ("b", b)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (k // group, n):
            raise KernelInputError(f"{op}: {name} must be a [{k // group}, {n}] tensor (one per group and column)")
    lead, m, out_dtype = _rows(op, a, None)
    if m == 0:
        return torch.empty(lead + (n,), dtype=out_dtype, device=a.device)
    bias, _ = _epilogue_args(op, bias, None, lead, n, out_dtype)
    cfg = _config or four_wave(choose_config(m_bucket(m), n, k, a.dtype, kl.arch()))
    out = _launch(op, a.reshape(m, k).contiguous().unsqueeze(0), w_packed.unsqueeze(0), n, k, 1, m, bias=bias,
                  activation=None, residual=None, scale=1.0, out_dtype=out_dtype, cfg=cfg,
                  scales=("", s.float().contiguous(), "", b.float().contiguous()), w_int4=group)
    return out.reshape(lead + (n,))
