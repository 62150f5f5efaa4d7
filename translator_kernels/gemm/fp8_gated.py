"""The gated MLP in one fp8 GEMM: act(sa[row] * sg[col] * (A_q · Wg_qᵀ) + bg) * (sa[row] * su[col] * (A_q · Wu_qᵀ) + bu).

The bf16 gated GEMM (kernel.build_gemm with `gate`, gated.py's weight arrangement) with the fp8 GEMM's operands
(fp8.py: 4-byte units of 4 values, the 8-bit MFMAs) and its epilogue scales. The pieces compose without a new
kernel path:

  - the weight: gate and up quantized per output channel, each to the arch's e4m3 / e5m2, then gated.py's
    arrangement of the two viewed as int32 units (16 gate rows, the 16 up rows of the same output columns,
    preshuffled): [2 * N16, K_pad] fp8, K padded to 128 values like every fp8 weight;
  - the per-column scale is arranged like the weight ([2 * N16] fp32: the gate's 16, then the up's 16), so the
    epilogue's column scale of an accumulator is the scale of that accumulator's own weight row; the gated
    epilogue (store.py store_gated) multiplies the gate and the up accumulator each by its column's scale and
    by the row's activation scale, in store_c's order (scale * acc * sw[col] * sa[row]), then adds the biases,
    and writes act(g) * u once in the output dtype: g and u never leave registers.
  - a per-tensor weight scale of each half is the same arrangement of two constant columns.

Tiles: the fp8 chooser's tile for the [2 * N16, K] arranged GEMM, widened to BN >= 128 with one wave column
per gate / up pair (the bf16 gated GEMM's rule: no split-K, kw = 1, since the pair must sit in one wave's
accumulators). `ref_gemm_fp8_gated` is the same math in torch: fp8.ref_gemm_fp8 of each half in fp32, then the
gate program times the up value, one cast.
"""

from __future__ import annotations

import torch

from translator_kernels import replay as kr
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.fp8 import (_scale_arg, _units, choose_fp8_config, expected_mfma_count_fp8, fp8_format,
                                         ref_gemm_fp8)
from translator_kernels.gemm.gated import gated_shape, gated_weight, unarrange_gated
from translator_kernels.gemm.tiles import GemmConfig, m_bucket


def gated_weight_fp8(wg_q: torch.Tensor, wu_q: torch.Tensor) -> torch.Tensor:
    """Gate and up fp8 [N, K] weights (K % 16 == 0) -> the arranged, preshuffled [2 * N16, K_pad] fp8 weight."""
    if wg_q.dim() != 2 or wg_q.shape != wu_q.shape or wg_q.dtype != wu_q.dtype or wg_q.element_size() != 1 \
            or wg_q.shape[1] % 16:
        raise KernelInputError(f"gated_weight_fp8: want two 8-bit [N, K] weights of one shape and dtype with "
                               f"K % 16 == 0, got {tuple(wg_q.shape)} {wg_q.dtype} / {tuple(wu_q.shape)} {wu_q.dtype}")
    return gated_weight(_units(wg_q.contiguous()), _units(wu_q.contiguous())).view(wg_q.dtype)


def gated_scale(sg: torch.Tensor, su: torch.Tensor, n: int) -> torch.Tensor:
    """Per-channel (or per-tensor) scales of the gate and up weights -> the arranged [2 * N16] fp32 column scale."""
    cols = []
    for name, s in (("gate", sg), ("up", su)):
        s = s.detach().float().reshape(-1)
        if s.numel() not in (1, n):
            raise KernelInputError(f"gated_scale: the {name} scale has {s.numel()} values; want 1 or N={n}")
        cols.append(s.expand(n).contiguous())
    return gated_weight(*cols).contiguous()


def unarrange_gated_fp8(w: torch.Tensor, w_scale: torch.Tensor | None, n: int, k: int):
    """Inverse of gated_weight_fp8 / gated_scale: (Wg_q, Wu_q, sg, su) as [N, K] fp8 / [N] fp32 (scales None if
    absent)."""
    wg, wu, sg, su = unarrange_gated(_units(w), w_scale, n, k // 4)
    return wg.contiguous().view(w.dtype), wu.contiguous().view(w.dtype), sg, su


def choose_gated_fp8_config(m: int, n: int, k: int, arch: str) -> GemmConfig:
    """The fp8 tile of the arranged [2 * N16, K] GEMM with BN >= 128, no split-K, kw = 1 (BK in units)."""
    cfg = choose_fp8_config(m_bucket(m), gated_shape(n, k)[0], k, arch)
    return GemmConfig(cfg.bm, max(cfg.bn, 128), cfg.bk)


def expected_mfma_count_gated_fp8(m: int, n: int, k: int, arch: str, cfg: GemmConfig) -> int:
    return expected_mfma_count_fp8(m, gated_shape(n, k)[0], k, arch, cfg)


def ref_gemm_fp8_gated(a_q, wg_q, wu_q, gate, a_scale=None, sg=None, su=None, *, bg=None, bu=None,
                       out_dtype=torch.bfloat16):
    """The kernel's math in torch: each half as fp8.ref_gemm_fp8 in fp32 (scales in the kernel's order, + bias),
    then gate(g) * u in fp32 and one cast."""
    from translator_kernels.gemm.kernel import apply_epilogue_torch

    g = ref_gemm_fp8(a_q, wg_q, a_scale, sg, bias=bg, out_dtype=torch.float32)
    u = ref_gemm_fp8(a_q, wu_q, a_scale, su, bias=bu, out_dtype=torch.float32)
    return (apply_epilogue_torch(g, gate) * u).to(out_dtype)


@kr.replayed
def gemm_fp8_gated(a_q, w_arranged, n, k, gate, *, a_scale=None, w_scale=None, bias=None, out_dtype=torch.bfloat16,
                   _config=None):
    """gate(sa * sg * (A_q @ Wg_qᵀ) + bg) * (sa * su * (A_q @ Wu_qᵀ) + bu), one FlyDSL launch.

    a_q [..., k] 8-bit float of the target arch; w_arranged = gated_weight_fp8(Wg_q, Wu_q); a_scale None, one
    value or one per row; w_scale None, one value for both halves, or gated_scale(sg, su, n) ([2 * N16]); bias None
    or gated.gated_weight(bg, bu). gate: an epilogue program (e.g. "silu"). Returns [..., n] in out_dtype."""
    from translator_kernels import launch as kl
    from translator_kernels.gemm import _launch, _rows
    from translator_kernels.gemm.kernel import canonical_epilogue

    op = "gemm_fp8_gated"
    arch = kl.arch()
    if not canonical_epilogue(gate):
        raise KernelInputError(f"{op}: a gate activation is required (e.g. 'silu'); use gemm_fp8 for a plain linear")
    fa, fw = fp8_format(a_q.dtype, arch), fp8_format(w_arranged.dtype, arch)
    n2, want = gated_shape(n, k)[0], (gated_shape(n, k)[0], -(-k // 128) * 128)
    if k % 16 or tuple(w_arranged.shape) != want or a_q.dim() < 1 or a_q.shape[-1] != k \
            or a_q.device != w_arranged.device:
        raise KernelInputError(f"{op}: a {tuple(a_q.shape)} on {a_q.device}, arranged weight "
                               f"{tuple(w_arranged.shape)} on {w_arranged.device}; want a [..., {k}] with K % 16 == 0 "
                               f"and the weight {want} (fp8_gated.gated_weight_fp8) on a's device")
    if bias is not None and tuple(bias.shape) != (n2,):
        raise KernelInputError(f"{op}: the arranged bias has shape {tuple(bias.shape)}, expected ({n2},)")
    bias = None if bias is None else bias.float().contiguous()
    lead, m, out_dtype = _rows(op, a_q, out_dtype)
    if m == 0:
        return torch.empty(lead + (n,), dtype=out_dtype, device=a_q.device)
    sa, sw = _scale_arg(op, "a_scale", a_scale, m, "row"), _scale_arg(op, "w_scale", w_scale, n2, "col")
    cfg = _config or choose_gated_fp8_config(m, n, k, arch)
    a3 = _units(a_q.reshape(m, k).contiguous()).unsqueeze(0)
    out = _launch(op, a3, _units(w_arranged).unsqueeze(0), n, k // 4, 1, m, bias=bias, activation=None,
                  residual=None, scale=1.0, out_dtype=out_dtype, cfg=cfg, gate=canonical_epilogue(gate),
                  dt=fa if fa == fw else f"{fa}x{fw}",
                  scales=(sa[0], sa[1], sw[0], sw[1]) if (sa[0] or sw[0]) else None)
    return out.reshape(lead + (n,))


__all__ = ["choose_gated_fp8_config", "expected_mfma_count_gated_fp8", "gated_scale", "gated_weight_fp8",
           "gemm_fp8_gated", "ref_gemm_fp8_gated", "unarrange_gated_fp8"]
