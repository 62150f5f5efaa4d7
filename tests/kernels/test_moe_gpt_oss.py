"""gpt-oss's experts on the MoE kernels: the grouped GEMM's per-expert bias (indexed by the tile's
expert), the gated epilogue's up-side program (gate(g) * up(u): the clamped SwiGLU), and the
interleaved gate/up columns prepared once; checked against HF's own GptOssExperts module."""

from __future__ import annotations

import pytest
import torch

import executors
from translator.tolerances import model_tol, op_tol
from translator_kernels import moe as M
from translator_kernels.arch import ARCHS
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.preshuffle import shuffle_weight_batched


def test_grouped_bias_is_the_tiles_experts():
    """Each tile's rows get its own expert's bias row (one shared row, or a row of another expert, would
    give other numbers: the biases differ by expert)."""
    g = torch.Generator().manual_seed(7)
    e, n, k, bm = 3, 48, 64, 16  # N = 48: a column tail
    a = torch.randn(4 * bm, k, generator=g).bfloat16()
    wt = torch.randn(e, n, k, generator=g).bfloat16()
    bias = torch.randn(e, n, generator=g) * 4
    tiles = torch.tensor([2, 0, 2, 1], dtype=torch.int32)
    with executors.current().run("gfx942") as ex:
        out = M.grouped_gemm(ex.put(a), ex.put(shuffle_weight_batched(wt)), ex.put(tiles), n, k,
                             M.grouped_config(bm, n, k, torch.bfloat16, False), bias=ex.put(bias)).cpu()
    assert len(ex.launches) == 1
    want = torch.cat([a[i * bm:(i + 1) * bm].float() @ wt[int(x)].float().T + bias[int(x)]
                      for i, x in enumerate(tiles)])
    torch.testing.assert_close(out.float(), want, **op_tol(torch.bfloat16, "gemm", reduction_length=k,
                                                           scale=float(want.abs().max())))


def _hf_experts(e, h, inter, dt, seed):
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    cfg = GptOssConfig(hidden_size=h, intermediate_size=inter, num_local_experts=e, num_experts_per_tok=2)
    torch.manual_seed(seed)
    m = GptOssExperts(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5 if p.dim() == 2 else 0.3)  # biases and weights large enough to reach the clamps
    return m.to(dt).eval(), cfg


@pytest.mark.parametrize("arch", ARCHS)
def test_gpt_oss_experts_five_launches(arch):
    """HF GptOssExperts (its own forward is the truth) against moe_experts with the prepared interleaved
    weights, both biases and the clamped SwiGLU programs: five launches on flysim, the gate/up values
    reaching both clamps."""
    dt, t, h, inter, e, k = torch.bfloat16, 7, 64, 40, 4, 2  # I = 40: a column tail
    hf, cfg = _hf_experts(e, h, inter, dt, 3)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(t, h, generator=g).to(dt)
    w, ids = M.ref_topk_gating(torch.randn(t, e, generator=g), k)
    with torch.no_grad():  # HF's math in fp32 on the same bf16 values (its bf16 forward rounds each step)
        want = hf.float()(x.float(), ids, w)
        gu = x.float() @ hf.gate_up_proj + hf.gate_up_proj_bias[:, None]  # [E, T, 2I]
    assert (gu[..., ::2] > cfg.swiglu_limit).any() and (gu[..., 1::2].abs() > cfg.swiglu_limit).any()
    w13, b13, w2, b2 = M.prepare_gpt_oss_experts(hf.gate_up_proj, hf.gate_up_proj_bias, hf.down_proj,
                                                 hf.down_proj_bias, dtype=dt)
    gate, up = M.gpt_oss_programs(cfg.swiglu_alpha, cfg.swiglu_limit)
    with executors.current().run(arch) as ex:
        out = M.moe_experts(ex.put(x), ex.put(w), ex.put(ids), ex.put(w13), ex.put(w2), inter, gate, up=up,
                            b13=ex.put(b13), b2=ex.put(b2)).cpu()
    assert len(ex.launches) == 5 and w13.dtype == dt, ex.launches
    tol = op_tol(dt, "gemm", reduction_length=h, scale=float(want.abs().max()))
    torch.testing.assert_close(out.float(), M.ref_moe_experts(x, w, ids, w13, w2, inter, gate, up=up, b13=b13,
                                                               b2=b2).float(), **tol)
    w13f, _, w2f, _ = M.prepare_gpt_oss_experts(hf.gate_up_proj, hf.gate_up_proj_bias, hf.down_proj,
                                               hf.down_proj_bias)  # fp32 arrangements (the layout is per dtype)
    ref32 = M.ref_moe_experts(x.float(), w, ids, w13f, w2f, inter, gate, up=up, b13=b13, b2=b2)
    torch.testing.assert_close(ref32, want, **model_tol())  # preparation + programs = HF's math (fp32, K-term sums)
    # against HF directly: the hidden [T·k, I] is rounded to bf16 between the GEMMs (HF's bf16 forward rounds
    # it too), so the bound is a bf16 step of the output's magnitude
    torch.testing.assert_close(out.float(), want, atol=2 ** -8 * float(want.abs().max()), rtol=2 ** -6)


def test_up_program_and_bias_errors_name_the_fix():
    a = torch.zeros(16, 64, dtype=torch.bfloat16)
    w = shuffle_weight_batched(torch.zeros(2, 32, 64, dtype=torch.bfloat16))
    tiles = torch.zeros(1, dtype=torch.int32)
    cfg = M.grouped_config(16, 32, 64, torch.bfloat16, False)
    with pytest.raises(KernelInputError, match="needs a gated GEMM"):
        M.grouped_gemm(a, w, tiles, 32, 64, cfg, up="add(1.0)")
    with pytest.raises(KernelInputError, match=r"float32 \[E, 32\]"):
        M.grouped_gemm(a, w, tiles, 32, 64, cfg, bias=torch.zeros(32))
    with pytest.raises(KernelInputError, match="are not"):
        M.prepare_gpt_oss_experts(torch.zeros(2, 8, 6), torch.zeros(2, 6), torch.zeros(2, 3, 9), torch.zeros(2, 8))
