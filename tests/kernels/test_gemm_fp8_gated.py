"""The gated MLP as one fp8 GEMM (translator_kernels.gemm.fp8_gated) on the session's executor, both archs: each
case against the torch reference of the same quantized math (each half's fp32 matmul of the 8-bit values with its
scales in the kernel's order, + bias, then gate(g) * u, one cast). One launch, the MFMA kind and the count the
arranged [2 * N16, K] tile grid implies; M / N / K tails (N not a multiple of 16, K not of 128), a decode M, a
128-row tile, e5m2 weights, per-tensor and no scales, biases, gelu gates. A swapped gate / up scale fails."""

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels.arch import ARCHS
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm import fp8 as F
from translator_kernels.gemm import fp8_gated as FG
from translator_kernels.gemm.gated import gated_weight

MFMA = {"gfx942": "mfma.f32.16x16x32.{a}.{w}", "gfx950": "mfma.scale.f32.16x16x128.f8f6f4"}

# (A format, W format, M, N, K, a_scale, w_scale, gate, bias, out dtype)
CASES = [
    ("fp8", "fp8", 19, 200, 272, "row", "col", "silu", False, torch.bfloat16),  # N tail (200 = 12.5 x 16), K tail
    ("fp8", "fp8", 1, 96, 512, "row", "col", "silu", True, torch.bfloat16),  # decode row, biases
    ("fp8", "bf8", 130, 64, 256, "row", "col", "gelu_tanh", False, torch.float16),  # 128-row tile, M tail
    ("bf8", "bf8", 7, 48, 128, "tensor", "tensor", "gelu", True, torch.float32),  # per-tensor scales
    ("fp8", "fp8", 5, 32, 96, None, None, "silu", False, torch.bfloat16),  # no scales, K < 128
]


def _case(arch, fa, fw, m, n, k, sa_mode, sw_mode, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g) * (torch.rand(m, 1, generator=g) * 4 + 0.1)  # per-token ranges differ
    per = dict(dim=None if sw_mode == "tensor" else -1)
    wg_q, sg = F.quantize_fp8(torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g), F.fp8_dtype(arch, fw),
                              **per)
    wu_q, su = F.quantize_fp8(torch.randn(n, k, generator=g) * 3, F.fp8_dtype(arch, fw), **per)
    aq, sa = F.quantize_fp8(a, F.fp8_dtype(arch, fa), dim=None if sa_mode == "tensor" else -1)
    bg, bu = (torch.randn(n, generator=g), torch.randn(n, generator=g)) if bias else (None, None)
    if not sw_mode:
        sg = su = None
    return aq, (sa if sa_mode else None), wg_q, wu_q, sg, su, bg, bu


def run_gated(arch, fa, fw, m, n, k, sa_mode, sw_mode, gate, bias, out_dtype, swap_scales=False):
    aq, sa, wg_q, wu_q, sg, su, bg, bu = _case(arch, fa, fw, m, n, k, sa_mode, sw_mode, bias)
    w = FG.gated_weight_fp8(wg_q, wu_q)
    rg, ru, rsg, rsu = FG.unarrange_gated_fp8(w, FG.gated_scale(sg, su, n) if sg is not None else None, n, k)
    assert torch.equal(rg.view(torch.uint8), wg_q.view(torch.uint8)) and torch.equal(ru.view(torch.uint8),
                                                                                     wu_q.view(torch.uint8))
    sw = None
    if sg is not None:
        sw = FG.gated_scale(su, sg, n) if swap_scales else FG.gated_scale(sg, su, n)
        assert torch.equal(rsg, sg.reshape(-1).expand(n)) and torch.equal(rsu, su.reshape(-1).expand(n))
    b = gated_weight(bg, bu) if bias else None
    with executors.current().run(arch) as ex:
        out = FG.gemm_fp8_gated(ex.put(aq), ex.put(w), n, k, gate, a_scale=ex.put(sa), w_scale=ex.put(sw),
                                bias=ex.put(b), out_dtype=out_dtype)
    out = out.cpu()
    ref = FG.ref_gemm_fp8_gated(aq, wg_q, wu_q, gate, sa, sg, su, bg=bg, bu=bu, out_dtype=out_dtype)
    assert out.shape == (m, n) and out.dtype == out_dtype
    assert len(ex.launches) == 1
    cfg = FG.choose_gated_fp8_config(m, n, k, arch)
    assert cfg.split == 1 and cfg.kw == 1 and cfg.bn >= 128
    if ex.counts:  # flysim counts the MFMAs it executed
        assert ex.launches[0].counters["mfma_by_kind"] == {
            MFMA[arch].format(a=fa, w=fw): FG.expected_mfma_count_gated_fp8(m, n, k, arch, cfg)}
    return out, ref


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}x{c[1]}-{c[2]}x{c[3]}x{c[4]}-{c[5]}-{c[7]}" for c in CASES])
def test_gemm_fp8_gated_flysim(arch, case):
    out, ref = run_gated(arch, *case)
    torch.testing.assert_close(out.float(), ref.float(), **op_tol(case[-1], "gemm"))


@pytest.mark.parametrize("arch", ARCHS)
def test_swapped_gate_and_up_scales_fail(arch):
    """The gate's column scales read for the up half (and back): the reference rejects it, so the cases above
    would see a misplaced scale."""
    out, ref = run_gated(arch, "fp8", "fp8", 9, 64, 128, "row", "col", "silu", False, torch.float32, swap_scales=True)
    assert not torch.allclose(out, ref, **op_tol(torch.float32, "gemm"))


def test_gated_fp8_rejects_bad_input():
    arch = "gfx942"
    wq, _ = F.quantize_fp8(torch.randn(32, 64), F.fp8_dtype(arch), dim=-1)
    with pytest.raises(KernelInputError, match="K % 16"):
        FG.gated_weight_fp8(wq[:, :40], wq[:, :40])
    with pytest.raises(KernelInputError, match="1 or N=32"):
        FG.gated_scale(torch.ones(5), torch.ones(32), 32)
    w = FG.gated_weight_fp8(wq, wq)
    aq, sa = F.quantize_fp8(torch.randn(3, 64), F.fp8_dtype(arch), dim=-1)
    with executors.current().run(arch):
        with pytest.raises(KernelInputError, match="gate activation is required"):
            FG.gemm_fp8_gated(aq, w, 32, 64, None, a_scale=sa)
        with pytest.raises(KernelInputError, match="arranged weight"):
            FG.gemm_fp8_gated(aq, w[:, :64], 32, 64, "silu", a_scale=sa)
