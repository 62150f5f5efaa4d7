"""gpt-oss's experts in fp8 (translator_kernels.moe.grouped_fp8 with biases and the up program): HF's
GptOssExperts (interleaved gate / up columns, x @ W, both biases, the clamped SwiGLU) quantized per expert and
output channel, seven launches on the session's executor for both archs; against the torch reference of the
same quantized math, and against HF's own forward within the fp8 error."""

from __future__ import annotations

import pytest
import torch

import executors
from test_moe_gpt_oss import _hf_experts
from translator.tolerances import op_tol
from translator_kernels import moe as M
from translator_kernels.arch import ARCHS
from translator_kernels.errors import KernelInputError
from translator_kernels.moe import grouped_fp8 as G


@pytest.mark.parametrize("arch", ARCHS)
def test_gpt_oss_experts_fp8_seven_launches(arch):
    dt, t, h, inter, e, k = torch.bfloat16, 7, 64, 48, 4, 2
    hf, cfg = _hf_experts(e, h, inter, dt, 3)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(t, h, generator=g).to(dt)
    w, ids = M.ref_topk_gating(torch.randn(t, e, generator=g), k)
    with torch.no_grad():
        want = hf.float()(x.float(), ids, w)
        gu = x.float() @ hf.gate_up_proj + hf.gate_up_proj_bias[:, None]
    assert (gu[..., ::2] > cfg.swiglu_limit).any() and (gu[..., 1::2].abs() > cfg.swiglu_limit).any()
    w13, s13, w2, s2, b13, b2 = G.prepare_gpt_oss_experts_fp8(hf.gate_up_proj, hf.gate_up_proj_bias, hf.down_proj,
                                                              hf.down_proj_bias, arch)
    gate, up = M.gpt_oss_programs(cfg.swiglu_alpha, cfg.swiglu_limit)
    with executors.current().run(arch) as ex:
        out = G.moe_experts_fp8(ex.put(x), ex.put(w), ex.put(ids), ex.put(w13), ex.put(s13), ex.put(w2), ex.put(s2),
                                inter, gate, up=up, b13=ex.put(b13), b2=ex.put(b2)).cpu()
    assert len(ex.launches) == 7, ex.launches
    ref = G.ref_moe_experts_fp8(x, w, ids, w13, s13, w2, s2, inter, gate, up=up, b13=b13, b2=b2)
    torch.testing.assert_close(out.float(), ref.float(), **op_tol(torch.bfloat16, "moe_experts_fp8"))
    # against HF's fp32 forward: the fp8 quantization error only (weights per channel, activations per token)
    err = float((out.float() - want).norm() / want.norm())
    assert err < 0.1, err
    # the biases and the up program matter at this size: without them the reference is far off
    plain = G.ref_moe_experts_fp8(x, w, ids, w13, s13, w2, s2, inter, gate)
    assert float((plain.float() - want).norm() / want.norm()) > 5 * err


def test_gpt_oss_fp8_errors_name_the_fix():
    with pytest.raises(KernelInputError, match="are not"):
        G.prepare_gpt_oss_experts_fp8(torch.zeros(2, 16, 6), torch.zeros(2, 6), torch.zeros(2, 4, 16),
                                      torch.zeros(2, 16), "gfx942")
    from translator_kernels.gemm import fp8 as F

    w13, s13, _, _ = G.prepare_experts_fp8(torch.randn(2, 64, 64) / 8, torch.randn(2, 64, 32) / 8, "gfx942")
    a_q, sa = F.quantize_fp8(torch.randn(16, 64), F.fp8_dtype("gfx942"), dim=-1)
    args = (a_q, sa, w13, s13, torch.zeros(1, dtype=torch.int32), 32, 64, G.grouped_config_fp8(16, 32, 64, True))
    with executors.current().run("gfx942"):
        with pytest.raises(KernelInputError, match="like w_scale"):
            G.grouped_gemm_fp8(*args, gate="silu", bias=torch.zeros(32))
        with pytest.raises(KernelInputError, match="needs a gated GEMM"):
            G.grouped_gemm_fp8(*args, up="add(1.0)")
