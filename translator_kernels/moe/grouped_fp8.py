"""MoE experts in fp8: the grouped GEMM (grouped.py) with the fp8 GEMM's operands and per-expert scales.

    moe_align / moe_gather     as in bf16 (__init__.py): xs [cap, H] in expert order, zero padding rows
    quantize_rows              xs -> q [cap, H] fp8, sa [cap] fp32, per token (gemm/quantize.py)
    grouped_gemm_fp8           act(sa * sg * q · Wg8[e]ᵀ) * (sa * su * q · Wu8[e]ᵀ) -> hid [cap, I] bf16
    quantize_rows              hid -> per-token fp8 (a GEMM epilogue cannot see a row's |max| across N tiles)
    grouped_gemm_fp8           sh * sd[e] * hq · Wd8[e]ᵀ -> y [cap, H] bf16
    moe_unpermute              as in bf16

Seven launches against bf16's five (the two quantizes). The rows are quantized after the gather: a padding row
is all zeros and quantizes to zeros with the floor scale 1e-12, so its accumulators stay 0 as in bf16.

Weights (`prepare_experts_fp8`, once at translate time): each expert's gate, up and down rows quantized per
output channel to the arch's e4m3 (fnuz on gfx942, OCP on gfx950; fp8.quantize_fp8); the gate / up pair in
fp8_gated.py's arrangement, the down projection preshuffled like any fp8 weight, both stacked over experts.
The per-column scales are arranged like their weight rows and stacked too: s13 [E, 2·I16] (fp8_gated.gated_scale
per expert), s2 [E, H]. The kernel (gemm/kernel.py, `grouped=True` with w_scale "col") reads the scale row of the
tile's expert, at the same expert offset as a stacked bias: the epilogue is store_c's / store_gated's order,
scale · acc · sw[e, col] · sa[row], so the numbers equal fp8.ref_gemm_fp8 of the row's own expert.

Tiles: grouped.grouped_config's choice for the f32 GEMM with K in 4-byte units (the fp8 chooser's rule: same bytes
per tile), so BK = 32 units = 128 values, the fp8 K block. No split-K (the down projection at decode runs its
small grid unsplit; the bf16 path splits it).
"""

from __future__ import annotations

import torch

from translator_kernels import launch as kl
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.fp8 import (_units, fp8_dtype, fp8_format, mfma_per_block, quantize_fp8, ref_gemm_fp8,
                                         shuffle_weight_fp8, unshuffle_weight_fp8)
from translator_kernels.gemm.fp8_gated import gated_scale, gated_weight_fp8, unarrange_gated_fp8
from translator_kernels.gemm.gated import gated_shape
from translator_kernels.gemm.kernel import apply_epilogue_torch, build_gemm, canonical_epilogue
from translator_kernels.gemm.preshuffle import padded_shape
from translator_kernels.gemm.tiles import GemmConfig
from translator_kernels.moe.grouped import _INT32_MAX, capacity, grouped_config


def prepare_experts_fp8(gate_up, down, arch: str):
    """HF's gate_up_proj [E, 2I, H] (gate rows first) and down_proj [E, H, I] -> (w13, s13, w2, s2):
    w13 [E, 2·I16, H_pad] fp8 (fp8_gated arrangement), s13 [E, 2·I16] fp32, w2 [E, H16, I_pad] fp8, s2 [E, H]."""
    e, two_i, h = gate_up.shape
    i = two_i // 2
    if two_i % 2 or tuple(down.shape) != (e, h, i) or h % 16 or i % 16:
        raise KernelInputError(f"prepare_experts_fp8: gate_up {tuple(gate_up.shape)} and down {tuple(down.shape)} "
                               f"must be [E, 2I, H] and [E, H, I] with H and I multiples of 16 (16-byte fp8 rows)")
    dt = fp8_dtype(arch)
    w13, s13, w2, s2 = [], [], [], []
    for j in range(e):
        (gq, gs), (uq, us) = (quantize_fp8(gate_up[j, a:b].detach(), dt, dim=-1) for a, b in ((0, i), (i, 2 * i)))
        w13.append(gated_weight_fp8(gq, uq))
        s13.append(gated_scale(gs, us, i))
        dq, ds = quantize_fp8(down[j].detach(), dt, dim=-1)
        w2.append(shuffle_weight_fp8(dq))
        s2.append(ds.reshape(-1))
    return torch.stack(w13), torch.stack(s13), torch.stack(w2), torch.stack(s2)


def prepare_gpt_oss_experts_fp8(gate_up, gate_up_bias, down, down_bias, arch: str):
    """HF GptOssExperts' parameters (moe.prepare_gpt_oss_experts: x @ W layout, interleaved gate / up columns) ->
    (w13, s13, w2, s2, b13, b2) for moe_experts_fp8: the columns de-interleaved and transposed, then quantized as
    prepare_experts_fp8 does; the biases stay fp32, arranged like the column scales."""
    from translator_kernels.gemm.gated import gated_weight

    e, h, two_i = gate_up.shape
    if two_i % 2 or tuple(down.shape) != (e, two_i // 2, h):
        raise KernelInputError(f"prepare_gpt_oss_experts_fp8: gate_up {tuple(gate_up.shape)} / down {tuple(down.shape)}"
                               f" are not [E, H, 2I] / [E, I, H]")
    gu = gate_up.detach().float()
    hf = torch.cat([gu[..., 0::2], gu[..., 1::2]], -1).transpose(1, 2)  # [E, 2I, H], gate rows first
    w13, s13, w2, s2 = prepare_experts_fp8(hf, down.detach().float().transpose(1, 2), arch)
    bf = gate_up_bias.detach().float()
    b13 = torch.stack([gated_weight(bf[j, 0::2].contiguous(), bf[j, 1::2].contiguous()) for j in range(e)])
    return w13, s13, w2, s2, b13, down_bias.detach().float().contiguous()


def grouped_config_fp8(rows_per_expert: int, n: int, k: int, gated: bool) -> GemmConfig:
    """The tile of a grouped fp8 GEMM (bk in 4-byte units; module notes)."""
    cfg = grouped_config(rows_per_expert, n, k // 4, torch.float32, gated)
    return GemmConfig(cfg.bm, cfg.bn, 32)


def expected_mfma_count_grouped_fp8(rows: int, n: int, k: int, arch: str, cfg: GemmConfig, gated: bool) -> int:
    """Wave-level MFMA instructions of a grouped fp8 GEMM whose real tiles hold `rows` rows (a multiple of BM:
    grouped.real_tiles x BM; the grid's tiles past them exit, tile_exit.py)."""
    n_pad, k_pad = (gated_shape if gated else padded_shape)(n, k // 4)
    tiles = rows // cfg.bm * -(-n_pad // cfg.bn)
    return tiles * (cfg.bm // 16) * (cfg.bn // 16) * (k_pad * 4 // 128) * mfma_per_block("fp8", arch)


def grouped_gemm_fp8(a_q, a_scale, w, w_scale, tile_expert, n: int, k: int, cfg: GemmConfig, *, gate=None,
                     out_dtype=torch.bfloat16, up=None, bias=None):
    """a_q [cap, k] fp8 (cap a multiple of cfg.bm), a_scale [cap] fp32 per row, w [E, N_pad, K_pad] fp8 (stacked
    shuffle_weight_fp8, or stacked gated_weight_fp8 with `gate`), w_scale [E, n] ([E, N_pad] gated_scale rows with
    `gate`) fp32 -> [cap, n] in out_dtype; tile_expert [cap / bm] int32. One launch. bias: fp32, shaped like
    w_scale (one row per expert, gated arrangement with `gate`), added after the scales; up: the up-side program
    (gate(g) * up(u), with `gate`): gpt-oss's experts (moe.gpt_oss_programs)."""
    op = "grouped_gemm_fp8"
    arch = kl.arch()
    gate, up = canonical_epilogue(gate), canonical_epilogue(up)
    if up and not gate:
        raise KernelInputError(f"{op}: an up program ({up}) needs a gated GEMM (gate=...)")
    fa, fw = fp8_format(a_q.dtype, arch), fp8_format(w.dtype, arch)
    ku = k // 4
    n_pad, k_pad = (gated_shape if gate else padded_shape)(n, ku)
    cap = a_q.shape[0] if a_q.dim() == 2 else -1
    if k % 16 or w.dim() != 3 or tuple(w.shape[1:]) != (n_pad, k_pad * 4) or a_q.dim() != 2 or a_q.shape[1] != k:
        raise KernelInputError(f"{op}: a {tuple(a_q.shape)}, w {tuple(w.shape)}; want a [cap, {k}] with K % 16 == 0 "
                               f"and w [E, {n_pad}, {k_pad * 4}] (moe.grouped_fp8.prepare_experts_fp8)")
    if cap % cfg.bm or tuple(tile_expert.shape) != (cap // cfg.bm,) or cfg.split != 1:
        raise KernelInputError(f"{op}: a {tuple(a_q.shape)} / tile map {tuple(tile_expert.shape)} do not fit [cap, "
                               f"{k}] with cap a multiple of BM={cfg.bm} and cap / BM tiles (split {cfg.split}: want 1)")
    e, n_s = w.shape[0], n_pad if gate else n
    if a_scale.numel() != cap or tuple(w_scale.shape) != (e, n_s):
        raise KernelInputError(f"{op}: a_scale has {a_scale.numel()} values (want {cap}), w_scale "
                               f"{tuple(w_scale.shape)} (want ({e}, {n_s}): one row of column scales per expert)")
    if bias is not None and (bias.dtype != torch.float32 or tuple(bias.shape) != (e, n_s)):
        raise KernelInputError(f"{op}: bias {tuple(bias.shape)} {bias.dtype} must be float32 ({e}, {n_s}) like w_scale")
    out = torch.empty((cap, n), dtype=out_dtype, device=a_q.device)
    for name, t in (("a", a_q), ("w", w), ("out", out)):
        if t.numel() * t.element_size() > _INT32_MAX:
            raise KernelInputError(f"{op}: {name} {tuple(t.shape)} exceeds 2 GiB (32-bit buffer offsets)")
    if cap == 0:
        return out
    from translator_kernels.arch import FLOAT_NAMES

    launcher = build_gemm(n, ku, n_pad, k_pad, fa if fa == fw else f"{fa}x{fw}", FLOAT_NAMES[out_dtype], arch,
                          cfg.bm, cfg.bn, cfg.bk, None, bias is not None, False, 1, "shuffled", gate, 1, grouped=True,
                          a_scale="row", w_scale="col", up=up)
    a3, w3 = _units(a_q.contiguous()), _units(w.contiguous())
    tmap = tile_expert.to(torch.int32).contiguous()
    sa, sw = a_scale.float().reshape(cap).contiguous(), w_scale.float().contiguous()
    b = tmap if bias is None else bias.contiguous()  # p_bytes carries the bias size (grouped.py)
    sizes = (a3.numel() * 4, w3.numel() * 4, out.numel() * out.element_size())
    kl.call(launcher, out, a3, w3, b, out, tmap, tmap, cap, 1, cap * ku, n_pad * k_pad, cap * n, 1.0, *sizes,
            b.numel() * 4, tmap.numel() * 4, sa, sw)
    return out


def moe_experts_fp8(x, weights, ids, w13, s13, w2, s2, inter: int, gate: str = "silu", *, residual=None,
                    out_dtype=None, first_expert: int = 0, up=None, b13=None, b2=None):
    """moe_experts (__init__.py) with fp8 experts (prepare_experts_fp8) and per-token fp8 activations; up / b13 / b2:
    gpt-oss's up program and fp32 biases (prepare_gpt_oss_experts_fp8), as in moe_experts."""
    from translator_kernels.gemm.quantize import quantize_rows
    from translator_kernels.moe import moe_align, moe_gather, moe_unpermute

    if x.dim() != 2 or weights.shape != ids.shape or weights.shape[0] != x.shape[0]:
        raise KernelInputError(f"moe_experts_fp8: x {tuple(x.shape)}, weights {tuple(weights.shape)}, ids "
                               f"{tuple(ids.shape)}; need [T, H], [T, k], [T, k]")
    t, h = x.shape
    e, k = w13.shape[0], ids.shape[1]
    fmt = fp8_format(w13.dtype, kl.arch())
    rows = -(-t * k // e)
    cfg_up = grouped_config_fp8(rows, inter, h, gated=True)
    cfg_dn = GemmConfig(cfg_up.bm, grouped_config_fp8(rows, h, inter, gated=False).bn, 32)
    src, tiles, pos = moe_align(ids, e, cfg_up.bm, first_expert)
    q, sa = quantize_rows(moe_gather(x, src), fmt)
    hid = grouped_gemm_fp8(q, sa, w13, s13, tiles, inter, h, cfg_up, gate=gate, up=up, bias=b13)
    q2, sh = quantize_rows(hid, fmt)
    y = grouped_gemm_fp8(q2, sh, w2, s2, tiles, h, inter, cfg_dn, bias=b2)
    return moe_unpermute(y, weights, pos, residual=residual, out_dtype=out_dtype or x.dtype)


def ref_moe_experts_fp8(x, weights, ids, w13, s13, w2, s2, inter, gate="silu", residual=None, out_dtype=None,
                        first_expert=0, up=None, b13=None, b2=None):
    """The same quantized math in torch: per-token fp8 rows, each expert's two fp8 GEMMs (fp8.ref_gemm_fp8, the
    kernel's scale order), act(g) * u to bf16, per-token fp8 again, the down GEMM to bf16, the weighted sum in fp32."""
    e, h = w13.shape[0], x.shape[1]
    dt = w13.dtype
    xq, xs = quantize_fp8(x, dt, dim=-1)
    out = torch.zeros(x.shape, dtype=torch.float32)
    for j in range(e):
        wg, wu, sg, su = unarrange_gated_fp8(w13[j], s13[j], inter, h)
        bg, bu = unarrange_gated_fp8(w13[j], b13[j], inter, h)[2:] if b13 is not None else (None, None)
        g = ref_gemm_fp8(xq, wg, xs, sg, bias=bg, out_dtype=torch.float32)
        u = ref_gemm_fp8(xq, wu, xs, su, bias=bu, out_dtype=torch.float32)
        hid = (apply_epilogue_torch(g, gate) * apply_epilogue_torch(u, up)).to(torch.bfloat16)
        hq, hs = quantize_fp8(hid, dt, dim=-1)
        y = ref_gemm_fp8(hq, unshuffle_weight_fp8(w2[j], h, inter), hs, s2[j], bias=None if b2 is None else b2[j],
                         out_dtype=torch.bfloat16).float()
        sel = (ids == j + first_expert).float() * weights.float()
        out += sel.sum(-1, keepdim=True) * y
    if residual is not None:
        out += residual.float()
    return out.to(out_dtype or x.dtype)


__all__ = ["expected_mfma_count_grouped_fp8", "grouped_config_fp8", "grouped_gemm_fp8", "moe_experts_fp8",
           "prepare_experts_fp8", "prepare_gpt_oss_experts_fp8", "ref_moe_experts_fp8"]
