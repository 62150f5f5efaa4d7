"""Mixture-of-experts kernels: gating, token permutation, the grouped GEMM and the weighted un-permute.

One MoE layer's experts (`moe_experts`) are five launches:

    topk_gating      logits [T, E] -> weights [T, k] fp32, ids [T, k] int64     (routing.py)
    moe_align        ids -> src_row [cap], tile_expert [cap / BM], pos [T·k]     (permute.py: counting sort)
    moe_gather       x [T, H] -> xs [cap, H] in expert order, zero padding rows  (permute.py)
    grouped_gemm     xs · W13[e]ᵀ with the SwiGLU epilogue -> [cap, I]           (grouped.py, the GEMM's kernel)
    grouped_gemm     · W2[e]ᵀ -> [cap, H]
    moe_unpermute    out[t] = sum_j w[t, j] · y[pos[t, j]] (+ residual)          (permute.py)

Weights are prepared once (`prepare_experts`): HF's concatenated gate_up_proj [E, 2I, H] becomes E
gated arrangements (translator_kernels.gemm.gated) stacked, down_proj [E, H, I] E preshuffled
matrices stacked. The `ref_*` functions are the references (plain torch, never reported as kernels).
fp8 experts (per-expert fp8 weights and column scales, per-token fp8 rows): grouped_fp8.py.
"""

from __future__ import annotations

import torch

from translator_kernels import launch as kl
from translator_kernels.arch import FLOAT_NAMES
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.gated import gated_weight, unarrange_gated
from translator_kernels.gemm.kernel import apply_epilogue_torch, canonical_epilogue
from translator_kernels.gemm.preshuffle import shuffle_weight_batched, unshuffle_weight
from translator_kernels.moe.grouped import capacity, grouped_config, grouped_gemm, grouped_split, real_tiles
from translator_kernels.moe.permute import build_moe_align, build_moe_gather, build_moe_unpermute
from translator_kernels.moe.routing import MAX_EXPERTS, build_topk_gating

SCORINGS = ("softmax", "sigmoid")


def topk_gating(logits, k: int, *, scoring: str = "softmax", renormalize: bool = True, groups: int = 1,
                topk_group: int = 1, group_score: str = "max"):
    """(weights [T, k] fp32, ids [T, k] int64) of router logits [T, E]: scores (softmax or sigmoid, fp32),
    the k best experts (group-limited to the `topk_group` best of `groups` groups when groups > 1), the
    weights divided by their sum when `renormalize`."""
    op = "topk_gating"
    if logits.dim() != 2 or logits.dtype not in FLOAT_NAMES:
        raise KernelInputError(f"{op}: logits {tuple(logits.shape)} {logits.dtype}; need [T, E] float32/bfloat16/float16")
    t, e = logits.shape
    if scoring not in SCORINGS or group_score not in ("max", "top2"):
        raise KernelInputError(f"{op}: scoring {scoring!r} / group_score {group_score!r}; use one of {SCORINGS} / "
                               f"('max', 'top2')")
    if not 1 <= k <= e or e > MAX_EXPERTS:
        raise KernelInputError(f"{op}: k={k} with E={e} experts; need 1 <= k <= E <= {MAX_EXPERTS}")
    if groups < 1 or e % groups or not 1 <= topk_group <= groups or k > topk_group * (e // groups):
        raise KernelInputError(f"{op}: {groups} groups, topk_group={topk_group} do not fit E={e}, k={k} (groups must "
                               f"divide E and the kept groups must hold k experts)")
    w = torch.empty((t, k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, k), dtype=torch.int64, device=logits.device)
    if t:
        launcher = build_topk_gating(e, k, FLOAT_NAMES[logits.dtype], scoring, bool(renormalize), groups, topk_group,
                                     group_score, kl.arch())
        kl.call(launcher, logits.contiguous(), w, ids.view(torch.int32), t)
    return w, ids


def moe_align(ids, num_experts: int, bm: int, first_expert: int = 0):
    """(src_row [cap], tile_expert [cap / bm], pos [T·k]) int32 of expert ids [T, k] (int32 or int64);
    the experts served are [first_expert, first_expert + num_experts), other pairs get pos -1."""
    if ids.dim() != 2 or ids.dtype not in (torch.int32, torch.int64):
        raise KernelInputError(f"moe_align: ids {tuple(ids.shape)} {ids.dtype}; need [T, k] int32/int64")
    if num_experts > MAX_EXPERTS:
        raise KernelInputError(f"moe_align: {num_experts} experts > {MAX_EXPERTS} (one lane per expert)")
    t, k = ids.shape
    cap = capacity(t * k, num_experts, bm)
    dev = ids.device
    src = torch.empty(cap, dtype=torch.int32, device=dev)
    tiles = torch.empty(cap // bm, dtype=torch.int32, device=dev)
    pos = torch.empty(t * k, dtype=torch.int32, device=dev)
    if t * k:
        words = 2 if ids.dtype == torch.int64 else 1
        ids32 = ids.contiguous().view(torch.int32)
        kl.call(build_moe_align(num_experts, k, bm, words, kl.arch(), first_expert), ids32, src, tiles, pos, t * k, cap,
                ids32.numel() * 4)
    return src, tiles, pos


def moe_gather(x, src_row):
    """xs [cap, H]: xs[s] = x[src_row[s]], zero rows where src_row[s] = -1 (padding); rows past the real total
    (src_row -2) are left unwritten: no GEMM tile reads them (tile_exit.py)."""
    cap, h = src_row.shape[0], x.shape[1]
    xs = torch.empty((cap, h), dtype=x.dtype, device=x.device)
    row_bytes = h * x.element_size()
    piece = next(p for p in (16, 4, 2, 1) if row_bytes % p == 0)
    if piece == 1:
        raise KernelInputError(f"moe_gather: rows of {row_bytes} bytes are not a multiple of 2")
    if cap:
        x = x.contiguous()
        kl.call(build_moe_gather(row_bytes, piece, kl.arch()), x, src_row, xs, cap, x.numel() * x.element_size())
    return xs


def moe_unpermute(y, weights, pos, *, residual=None, out_dtype=None):
    """out [T, H]: sum_j weights[t, j] · y[pos[t·k + j]] in fp32 (+ residual), cast once."""
    t, k = weights.shape
    h = y.shape[1]
    out_dtype = out_dtype or y.dtype
    out = torch.empty((t, h), dtype=out_dtype, device=y.device)
    if residual is not None:
        if tuple(residual.shape) != (t, h):
            raise KernelInputError(f"moe_unpermute: residual {tuple(residual.shape)}, expected {(t, h)}")
        residual = residual.to(out_dtype).contiguous()
    if t and h:
        launcher = build_moe_unpermute(h, k, FLOAT_NAMES[y.dtype], FLOAT_NAMES[out_dtype], residual is not None,
                                       kl.arch())
        kl.call(launcher, y.contiguous(), weights.float().contiguous(), pos, out if residual is None else residual,
                out, t)
    return out


def prepare_experts(gate_up, down, dtype=None):
    """HF's gate_up_proj [E, 2I, H] (gate rows first) and down_proj [E, H, I] -> (w13, w2) for moe_experts:
    w13 the stacked gated arrangements [E, 2·I16, H_pad], w2 the stacked preshuffled [E, H_pad16, I_pad]."""
    e, two_i, h = gate_up.shape
    i = two_i // 2
    if two_i % 2 or tuple(down.shape) != (e, h, i):
        raise KernelInputError(f"prepare_experts: gate_up {tuple(gate_up.shape)} and down {tuple(down.shape)} are not "
                               f"[E, 2I, H] and [E, H, I]")
    gate_up, down = gate_up.detach(), down.detach()
    if dtype is not None:
        gate_up, down = gate_up.to(dtype), down.to(dtype)
    w13 = torch.stack([gated_weight(gate_up[j, :i], gate_up[j, i:]) for j in range(e)])
    return w13, shuffle_weight_batched(down)


def gpt_oss_programs(alpha: float, limit: float) -> tuple[str, str]:
    """gpt-oss's clamped SwiGLU as the gated epilogue's two programs: gate g -> c·sigmoid(alpha·c) with
    c = min(g, limit); up u -> clamp(u, -limit, limit) + 1 (the kernel multiplies the two)."""
    gate = ('{"n":1,"ops":[["clamp",[0],[null,%r]],["const",[],[%r]],["mul",[1,2],[]],["sigmoid",[3],[]],'
            '["mul",[1,4],[]]],"out":[[5,"f32"]]}' % (float(limit), float(alpha)))
    return canonical_epilogue(gate), canonical_epilogue(f"clamp({-float(limit)!r},{float(limit)!r});add(1.0)")


def prepare_gpt_oss_experts(gate_up, gate_up_bias, down, down_bias, dtype=None):
    """HF GptOssExperts' parameters (x @ W layout: gate_up_proj [E, H, 2I] with gate / up in the even / odd
    columns, its bias [E, 2I], down_proj [E, I, H], its bias [E, H]) -> (w13, b13, w2, b2) for moe_experts:
    the interleaved columns are de-interleaved and transposed here, once (weight preparation only)."""
    e, h, two_i = gate_up.shape
    i = two_i // 2
    if two_i % 2 or tuple(down.shape) != (e, i, h) or tuple(gate_up_bias.shape) != (e, two_i) or \
            tuple(down_bias.shape) != (e, h):
        raise KernelInputError(f"prepare_gpt_oss_experts: gate_up {tuple(gate_up.shape)}, its bias "
                               f"{tuple(gate_up_bias.shape)}, down {tuple(down.shape)}, its bias {tuple(down_bias.shape)} "
                               f"are not [E, H, 2I], [E, 2I], [E, I, H], [E, H]")
    gu, dn = gate_up.detach(), down.detach()
    if dtype is not None:
        gu, dn = gu.to(dtype), dn.to(dtype)
    w13 = torch.stack([gated_weight(gu[j, :, 0::2].t().contiguous(), gu[j, :, 1::2].t().contiguous()) for j in range(e)])
    bf = gate_up_bias.detach().float()
    b13 = torch.stack([gated_weight(bf[j, 0::2].contiguous(), bf[j, 1::2].contiguous()) for j in range(e)])
    return w13, b13, shuffle_weight_batched(dn.transpose(1, 2).contiguous()), down_bias.detach().float().contiguous()


def moe_experts(x, weights, ids, w13, w2, inter: int, gate: str = "silu", *, residual=None, out_dtype=None,
                first_expert: int = 0, up=None, b13=None, b2=None):
    """The experts of one MoE layer: x [T, H], routing weights [T, k], ids [T, k], prepared w13 / w2
    (prepare_experts) -> [T, H] = sum_j weights[t, j] · expert_{ids[t, j]}(x[t]) (+ residual).
    first_expert: w13 / w2 hold experts [first_expert, first_expert + E) (expert parallel: one rank's
    share); choices of other experts add nothing here (their rank adds them, e.g. by all_reduce).
    up / b13 / b2: the up-side program and the per-expert biases (gpt-oss: gpt_oss_programs,
    prepare_gpt_oss_experts)."""
    if x.dim() != 2 or weights.shape != ids.shape or weights.shape[0] != x.shape[0]:
        raise KernelInputError(f"moe_experts: x {tuple(x.shape)}, weights {tuple(weights.shape)}, ids "
                               f"{tuple(ids.shape)}; need [T, H], [T, k], [T, k]")
    t, h = x.shape
    e, k = w13.shape[0], ids.shape[1]
    x = x.to(w13.dtype)
    cfg_up = grouped_config(-(-t * k // e), inter, h, x.dtype, gated=True)
    cfg_dn = grouped_config(-(-t * k // e), h, inter, x.dtype, gated=False)
    cfg_dn = type(cfg_dn)(cfg_up.bm, cfg_dn.bn, cfg_dn.bk)  # one row tile: both GEMMs read the same tile map
    if b2 is None:  # decode's down projection: split-K where its grid is small (grouped.grouped_split)
        cfg_dn = grouped_split(capacity(t * k, e, cfg_up.bm) // cfg_up.bm, h, inter, cfg_dn, kl.arch())
    src, tiles, pos = moe_align(ids, e, cfg_up.bm, first_expert)
    xs = moe_gather(x, src)
    hid = grouped_gemm(xs, w13, tiles, inter, h, cfg_up, gate=gate, up=up, bias=b13)
    y = grouped_gemm(hid, w2, tiles, h, inter, cfg_dn, bias=b2)
    return moe_unpermute(y, weights, pos, residual=residual, out_dtype=out_dtype or x.dtype)


# ---- references (plain torch, fp32 math) ----


def ref_topk_gating(logits, k, scoring="softmax", renormalize=True, groups=1, topk_group=1, group_score="max"):
    s = logits.float().softmax(-1) if scoring == "softmax" else logits.float().sigmoid()
    if groups > 1:
        g = s.view(s.shape[0], groups, -1)
        gs = g.max(-1).values if group_score == "max" else g.topk(2, -1).values.sum(-1)
        keep = torch.zeros_like(gs).scatter_(1, gs.topk(topk_group, -1).indices, 1.0)
        s = (g * keep.unsqueeze(-1)).view_as(s).masked_fill(keep.repeat_interleave(g.shape[-1], 1) == 0, -1.0)
    w, ids = s.topk(k, -1)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return w, ids


def ref_moe_experts(x, weights, ids, w13, w2, inter, gate="silu", residual=None, out_dtype=None, first_expert=0,
                    up=None, b13=None, b2=None):
    e, h = w13.shape[0], x.shape[1]
    out = torch.zeros(x.shape, dtype=torch.float32)
    xf = x.float()
    for j in range(e):
        wg, wu, bg, bu = unarrange_gated(w13[j], None if b13 is None else b13[j], inter, h)
        wd = unshuffle_weight(w2[j], h, inter)
        g, u = xf @ wg.float().t(), xf @ wu.float().t()
        if b13 is not None:
            g, u = g + bg, u + bu
        hid = (apply_epilogue_torch(g, gate) * apply_epilogue_torch(u, up)).to(w13.dtype).float()
        y = hid @ wd.float().t() + (0.0 if b2 is None else b2[j])
        y = y.to(w13.dtype).float()
        sel = (ids == j + first_expert).float() * weights.float()
        out += sel.sum(-1, keepdim=True) * y
    if residual is not None:
        out += residual.float()
    return out.to(out_dtype or x.dtype)


__all__ = ["capacity", "grouped_config", "grouped_gemm", "grouped_split", "moe_align", "moe_experts", "moe_gather", "moe_unpermute",
           "gpt_oss_programs", "prepare_experts", "prepare_gpt_oss_experts", "real_tiles", "ref_moe_experts", "ref_topk_gating", "topk_gating"]
