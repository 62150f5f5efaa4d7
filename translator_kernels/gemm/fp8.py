"""fp8 GEMM: C = epilogue(sa[row] * sw[col] * (A_q · W_qᵀ)) with 8-bit float A and W, fp32 accumulation.

The same kernel as every other GEMM of the family (kernel.py: the 4-wave tiles, the scheduled K loop,
split-K inside the launch, kw = 4 decode tiles, 128-bit C stores, the epilogue program, bias and
residual). What differs is confined to three places:

  - the operands travel as 4-byte units of 4 fp8 values (the kernel's f32 geometry: a 16-byte chunk
    is 16 values, a 32-unit block 128 values of K, two chunks per lane per block), so the weight
    layout is preshuffle.shuffle_weight of the fp8 weight viewed as int32: N padded to 16, K to 128;
  - the MFMA (mfma8.py): gfx942 v_mfma_f32_16x16x32_fp8/bf8 (fnuz formats), four per block; gfx950
    the f8f6f4 16x16x128 MFMA (OCP formats), one per block;
  - the epilogue multiplies by the scales after the accumulation: y = scale * acc * sw[col] * sa[row]
    (w_scale per output channel or one per tensor, a_scale per row = token or one per tensor; fp32
    tensors on the device, never read on the host), then bias, the program, the residual, one cast.

Formats: gfx942 takes torch.float8_e4m3fnuz / float8_e5m2fnuz, gfx950 float8_e4m3fn / float8_e5m2;
A and W may differ (e4m3 x e5m2). K must be a multiple of 16 (16-byte rows, as torch._scaled_mm
requires); the kernel pads K with zeros to 128 through the descriptor bounds.

Tiles: the f32 tile of the same byte geometry (tiles.choose_config with K in units, dtype "f32";
always the 4-wave layout): at 4096^2 128x128 with BK = 128 fp8 values, decode tiles 16x16 with BK =
512 values split four ways across the waves. Quantization helpers (`quantize_fp8`) are torch math used
at translate time for weights and as the reference; `ref_gemm_fp8` is the reference of the kernel.
"""

from __future__ import annotations

import torch

from translator_kernels import replay as kr
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.kernel import mfma_per_block
from translator_kernels.gemm.preshuffle import padded_shape, shuffle_weight, unshuffle_weight
from translator_kernels.gemm.tiles import GemmConfig, choose_config, four_wave, m_bucket  # noqa: F401 (m_bucket re-exported)

FP8_DTYPES = {
    "gfx942": {"fp8": torch.float8_e4m3fnuz, "bf8": torch.float8_e5m2fnuz},
    "gfx950": {"fp8": torch.float8_e4m3fn, "bf8": torch.float8_e5m2},
}
K_TILE8 = 128  # fp8 values per 32-unit K block


def _arch_key(arch: str) -> str:
    return "gfx950" if arch.startswith("gfx950") else "gfx942"


def fp8_dtype(arch: str, fmt: str = "fp8") -> torch.dtype:
    """The torch dtype of format `fmt` ("fp8" = e4m3, "bf8" = e5m2) on `arch`."""
    return FP8_DTYPES[_arch_key(arch)][fmt]


def fp8_format(dtype: torch.dtype, arch: str) -> str:
    """"fp8" / "bf8" for a dtype the arch's MFMA takes; KernelInputError otherwise."""
    for fmt, dt in FP8_DTYPES[_arch_key(arch)].items():
        if dt == dtype:
            return fmt
    want = ", ".join(str(d) for d in FP8_DTYPES[_arch_key(arch)].values())
    raise KernelInputError(f"gemm_fp8: {dtype} is not an 8-bit float format of {arch} (takes {want}); "
                           f"quantize to one of those (gfx942: fnuz, gfx950: OCP)")


def padded_shape_fp8(n: int, k: int) -> tuple[int, int]:
    return -(-n // 16) * 16, -(-k // K_TILE8) * K_TILE8


def _units(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def shuffle_weight_fp8(w: torch.Tensor) -> torch.Tensor:
    """W[N, K] fp8 -> the preshuffled (N_pad, K_pad) fp8 tensor the kernel reads (a new tensor)."""
    if w.dim() != 2 or w.element_size() != 1 or w.shape[1] % 16:
        raise KernelInputError(f"shuffle_weight_fp8: want a 2-D [N, K] 8-bit weight with K % 16 == 0, got "
                               f"{tuple(w.shape)} {w.dtype}")
    return shuffle_weight(_units(w.contiguous())).view(w.dtype)


def unshuffle_weight_fp8(ws: torch.Tensor, n: int, k: int) -> torch.Tensor:
    return unshuffle_weight(_units(ws), n, k // 4).contiguous().view(ws.dtype)


def choose_fp8_config(mb: int, n: int, k: int, arch: str) -> GemmConfig:
    """The tile of the f32 GEMM with K in 4-byte units (the same bytes per tile), 4-wave layout."""
    return four_wave(choose_config(mb, n, k // 4, "f32", arch))


def expected_mfma_count_fp8(m: int, n: int, k: int, arch: str, cfg: GemmConfig) -> int:
    """Wave-level MFMA instructions of the tile grid (cfg.bk in units)."""
    n_pad, k_pad = padded_shape_fp8(n, k)
    tiles = -(-m // cfg.bm) * -(-n_pad // cfg.bn)
    return tiles * (cfg.bm // 16) * (cfg.bn // 16) * (k_pad // K_TILE8) * mfma_per_block("fp8", arch)


def quantize_fp8(x: torch.Tensor, dtype: torch.dtype, dim: int | None = None):
    """(q, scale) with x ≈ q.float() * scale: amax scaling to the format's largest finite value, per
    tensor (dim None, scale of shape [1]) or per slice along `dim` (scale keeps `dim` as size 1).
    Torch math: translate-time weight quantization and the reference of activation quantization."""
    xf = x.float()
    amax = xf.abs().amax() if dim is None else xf.abs().amax(dim=dim, keepdim=True)
    fmax = torch.finfo(dtype).max
    scale = (amax / fmax).clamp(min=1e-12)
    q = (xf / scale).clamp(-fmax, fmax).to(dtype)
    return q, (scale.reshape(1) if dim is None else scale)


def ref_gemm_fp8(a_q, w_q, a_scale=None, w_scale=None, *, bias=None, activation=None, residual=None,
                 scale=1.0, out_dtype=torch.bfloat16):
    """The kernel's math in torch: dequantize-free fp32 matmul of the 8-bit values, then the epilogue in
    the kernel's order (scale, x sw[col], x sa[row], + bias, program, + residual, one cast)."""
    from translator_kernels.gemm.kernel import apply_epilogue_torch

    n, k = w_q.shape
    y = (a_q.reshape(-1, k).float() @ w_q.float().t()) * scale
    if w_scale is not None:
        y = y * w_scale.float().reshape(1, -1)
    if a_scale is not None:
        y = y * a_scale.float().reshape(-1, 1)
    if bias is not None:
        y = y + bias.float()
    y = apply_epilogue_torch(y, activation)
    if residual is not None:
        y = y + residual.reshape(-1, n).to(out_dtype).float()
    return y.to(out_dtype).reshape(*a_q.shape[:-1], n)


def _scale_arg(op, name, s, count, per):
    """(mode, fp32 tensor) for a scale given as None, one value, or one per `per` (`count` of them)."""
    if s is None:
        return "", None
    if not isinstance(s, torch.Tensor) or not s.is_floating_point():
        raise KernelInputError(f"{op}: {name} must be a float tensor (one value, or {count} for per-{per})")
    if s.numel() == 1:
        return "tensor", s.reshape(1).float().contiguous()
    if s.numel() != count:
        raise KernelInputError(f"{op}: {name} has {s.numel()} values; want 1 (per tensor) or {count} (per {per})")
    return ("row" if per == "row" else "col"), s.reshape(count).float().contiguous()


@kr.replayed
def gemm_fp8(a_q, w_shuffled, n, k, *, a_scale=None, w_scale=None, bias=None, activation=None, residual=None,
             scale=1.0, out_dtype=torch.bfloat16, _config=None):
    """act(scale * (A_q @ W_qᵀ) * sw[col] * sa[row] + bias) + residual, one FlyDSL launch.

    a_q: [..., k] 8-bit float of the target arch's formats; w_shuffled: shuffle_weight_fp8(W_q[n, k]);
    a_scale: None, one value, or one per row of a_q (per token); w_scale: None, one value or [n];
    bias [n] (any float dtype, applied in fp32). Returns [..., n] in out_dtype (bf16 / fp16 / fp32)."""
    from translator_kernels import launch as kl
    from translator_kernels.gemm import _epilogue_args, _launch, _rows

    op = "gemm_fp8"
    arch = kl.arch()
    fa, fw = fp8_format(a_q.dtype, arch), fp8_format(w_shuffled.dtype, arch)
    if k % 16:
        raise KernelInputError(f"{op}: K={k} is not a multiple of 16 (16-byte rows of 8-bit values)")
    if tuple(w_shuffled.shape) != padded_shape_fp8(n, k):
        raise KernelInputError(f"{op}: prepared weight has shape {tuple(w_shuffled.shape)}, expected "
                               f"{padded_shape_fp8(n, k)} for N={n}, K={k}; build it with fp8.shuffle_weight_fp8")
    if a_q.dim() < 1 or a_q.shape[-1] != k or a_q.device != w_shuffled.device:
        raise KernelInputError(f"{op}: a has shape {tuple(a_q.shape)} on {a_q.device}, expected [..., {k}] on "
                               f"{w_shuffled.device}")
    lead, m, out_dtype = _rows(op, a_q, out_dtype)
    if m == 0:
        return torch.empty(lead + (n,), dtype=out_dtype, device=a_q.device)
    sa = _scale_arg(op, "a_scale", a_scale, m, "row")
    sw = _scale_arg(op, "w_scale", w_scale, n, "col")
    bias, residual = _epilogue_args(op, bias, residual, lead, n, out_dtype)
    cfg = _config or choose_fp8_config(m_bucket(m), n, k, arch)
    a3 = _units(a_q.reshape(m, k).contiguous()).unsqueeze(0)
    dt = fa if fa == fw else f"{fa}x{fw}"
    out = _launch(op, a3, _units(w_shuffled).unsqueeze(0), n, k // 4, 1, m, bias=bias, activation=activation,
                  residual=residual, scale=scale, out_dtype=out_dtype, cfg=cfg, dt=dt,
                  scales=(sa[0], sa[1], sw[0], sw[1]) if (sa[0] or sw[0]) else None)
    return out.reshape(lead + (n,))


# ---- 128 x 128 block scales (DeepSeek-V3 layout; applied in the K loop: blockscale.py) ----
def quantize_fp8_blocks(x: torch.Tensor, dtype: torch.dtype, block: tuple[int, int]):
    """(q, scale) with x[r, c] ≈ q[r, c] * scale[r // block[0], c // block[1]] (amax per block to the format's
    largest value, as quantize_fp8; a partial last block takes its own amax). block (1, 128): per-token groups
    of an activation [M, K] -> scale [M, KB]; (128, 128): a weight [N, K] -> scale [NB, KB]."""
    rows, cols = x.shape
    br, bc = block
    nr, nc = -(-rows // br), -(-cols // bc)
    xp = torch.nn.functional.pad(x.float(), (0, nc * bc - cols, 0, nr * br - rows))
    amax = xp.reshape(nr, br, nc, bc).abs().amax(dim=(1, 3))
    fmax = torch.finfo(dtype).max
    scale = (amax / fmax).clamp(min=1e-12)
    full = scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]
    return (x.float() / full).clamp(-fmax, fmax).to(dtype), scale


def ref_gemm_fp8_block(a_q, w_q, a_scale, w_scale, *, bias=None, out_dtype=torch.bfloat16):
    """The kernel's math in torch: for each K block of 128, the fp32 matmul of the 8-bit values times
    (sa[row, kb] * sw[col // 128, kb]) added to an fp32 sum; a_scale [M, KB] (or one value / one per row,
    applied after the sum), w_scale [ceil(N / 128), KB]; then + bias and one cast."""
    from translator_kernels.gemm.blockscale import BLOCK

    n, k = w_q.shape
    a2 = a_q.reshape(-1, k).float()
    kbt = -(-k // BLOCK)
    a_blk = a_scale is not None and a_scale.dim() >= 2 and a_scale.shape[-1] == kbt and a_scale.numel() == len(a2) * kbt
    swc = w_scale.float().repeat_interleave(BLOCK, 0)[:n]  # [N, KB]
    y = torch.zeros(a2.shape[0], n)
    for kb in range(kbt):
        part = a2[:, kb * BLOCK:(kb + 1) * BLOCK] @ w_q[:, kb * BLOCK:(kb + 1) * BLOCK].float().t()
        s = swc[:, kb].reshape(1, n)
        if a_blk:
            s = a_scale[:, kb].float().reshape(-1, 1) * s
        y = y + part * s
    if a_scale is not None and not a_blk:
        y = y * a_scale.float().reshape(-1, 1)
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype).reshape(*a_q.shape[:-1], n)


@kr.replayed
def gemm_fp8_block(a_q, w_shuffled, n, k, a_scale, w_scale, *, bias=None, out_dtype=torch.bfloat16, _config=None):
    """(A_q @ W_qᵀ) with 128 x 128 block scales + bias, one FlyDSL launch (the scales inside the K loop).

    a_q [..., k] 8-bit float; w_shuffled = shuffle_weight_fp8(W_q[n, k]); a_scale fp32 [..., KB] (per token
    and K block of 128, KB = ceil(k / 128)) or one value / one per row (applied in the epilogue: a static
    activation scale); w_scale fp32 [ceil(n / 128), KB]. Returns [..., n] in out_dtype."""
    from translator_kernels import launch as kl
    from translator_kernels.gemm import _epilogue_args, _launch, _rows
    from translator_kernels.gemm.blockscale import BLOCK

    op = "gemm_fp8_block"
    arch = kl.arch()
    fa, fw = fp8_format(a_q.dtype, arch), fp8_format(w_shuffled.dtype, arch)
    if k % 16 or tuple(w_shuffled.shape) != padded_shape_fp8(n, k) or a_q.dim() < 1 or a_q.shape[-1] != k:
        raise KernelInputError(f"{op}: a {tuple(a_q.shape)}, weight {tuple(w_shuffled.shape)}; want a [..., {k}], "
                               f"the weight {padded_shape_fp8(n, k)} from fp8.shuffle_weight_fp8, K % 16 == 0")
    lead, m, out_dtype = _rows(op, a_q, out_dtype)
    if m == 0:
        return torch.empty(lead + (n,), dtype=out_dtype, device=a_q.device)
    kb, nb = -(-k // BLOCK), -(-n // BLOCK)
    if not isinstance(w_scale, torch.Tensor) or tuple(w_scale.shape) != (nb, kb) or not w_scale.is_floating_point():
        raise KernelInputError(f"{op}: w_scale must be a float [{nb}, {kb}] tensor (one per 128 x 128 block of "
                               f"W[{n}, {k}]), got {getattr(w_scale, 'shape', type(w_scale))}")
    if isinstance(a_scale, torch.Tensor) and a_scale.dim() >= 2 and tuple(a_scale.shape) == lead + (kb,):
        sa = ("block", a_scale.reshape(m, kb).float().contiguous())
    else:
        sa = _scale_arg(op, "a_scale", a_scale, m, "row")
        if not sa[0]:
            raise KernelInputError(f"{op}: a_scale is required: [..., {kb}] per token and K block, one value, or "
                                   f"one per row")
    bias, _ = _epilogue_args(op, bias, None, lead, n, out_dtype)
    cfg = _config or choose_fp8_config(m_bucket(m), n, k, arch)
    a3 = _units(a_q.reshape(m, k).contiguous()).unsqueeze(0)
    out = _launch(op, a3, _units(w_shuffled).unsqueeze(0), n, k // 4, 1, m, bias=bias, activation=None,
                  residual=None, scale=1.0, out_dtype=out_dtype, cfg=cfg, dt=fa if fa == fw else f"{fa}x{fw}",
                  scales=(sa[0], sa[1], "block", w_scale.float().contiguous()))
    return out.reshape(lead + (n,))


__all__ = ["FP8_DTYPES", "choose_fp8_config", "expected_mfma_count_fp8", "fp8_dtype", "fp8_format", "gemm_fp8",
           "gemm_fp8_block", "padded_shape_fp8", "quantize_fp8", "quantize_fp8_blocks", "ref_gemm_fp8",
           "ref_gemm_fp8_block", "shuffle_weight_fp8", "unshuffle_weight_fp8"]
