"""fp8 GEMM with 128 x 128 block scales (the DeepSeek-V3 layout: translator_kernels.gemm.blockscale) on the
session's executor, both archs, against the torch reference of the same quantized math (per K block of 128:
the fp32 matmul of the 8-bit values times sa[row, kb] * sw[col // 128, kb], summed in fp32). One launch, the
MFMA count the tile grid implies (flysim), the numerics within the fp32-sum tolerance (flysim's MFMA sums a
block's 128 exact products in its own order, the reference in BLAS's)."""

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels.arch import ARCHS
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm import fp8 as F

MFMA = {"gfx942": "mfma.f32.16x16x32.fp8.fp8", "gfx950": "mfma.scale.f32.16x16x128.f8f6f4"}

# (M, N, K, activation scale, bias, out dtype, config): K tails (K % 128), M / N tails, split-K and kw = 4
CASES = [
    (17, 96, 272, "block", False, torch.bfloat16, None),  # decode tile: split-K, K tail of 16 values
    (130, 160, 384, "block", True, torch.float32, None),  # 128-row tile, M tail, N blocks 0 and 1
    (3, 64, 2048, "block", False, torch.float32, None),  # kw = 4, split-K
    (33, 200, 256, "tensor", True, torch.bfloat16, None),  # a static activation scale (epilogue) x block W
    (40, 48, 1520, "block", False, torch.float16, F.GemmConfig(32, 64, 64, split=3)),  # 2 blocks a tile
]


def _case(arch, m, n, k, a_mode, seed=0):
    g = torch.Generator().manual_seed(seed)
    # per-block ranges differ along K and along N, so a misplaced scale shows
    a = torch.randn(m, k, generator=g) * (torch.rand(m, -(-k // 128), generator=g) * 8).repeat_interleave(128, 1)[:, :k]
    w = torch.randn(n, k, generator=g) * (torch.rand(-(-n // 128), -(-k // 128), generator=g) * 2 + 0.1) \
        .repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    dt = F.fp8_dtype(arch)
    if a_mode == "block":
        aq, sa = F.quantize_fp8_blocks(a, dt, (1, 128))
    else:
        aq, sa = F.quantize_fp8(a, dt)
    wq, sw = F.quantize_fp8_blocks(w, dt, (128, 128))
    return aq, sa, wq, sw, g


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}x{c[1]}x{c[2]}-{c[3]}" for c in CASES])
def test_gemm_fp8_block_flysim(arch, case):
    m, n, k, a_mode, with_bias, out_dtype, cfg = case
    aq, sa, wq, sw, g = _case(arch, m, n, k, a_mode)
    bias = torch.randn(n, generator=g) if with_bias else None
    with executors.current().run(arch) as ex:
        out = F.gemm_fp8_block(ex.put(aq), ex.put(F.shuffle_weight_fp8(wq)), n, k, ex.put(sa), ex.put(sw),
                               bias=ex.put(bias), out_dtype=out_dtype, _config=cfg)
    out = out.cpu()
    ref = F.ref_gemm_fp8_block(aq, wq, sa, sw, bias=bias, out_dtype=out_dtype)
    assert out.shape == (m, n) and out.dtype == out_dtype and len(ex.launches) == 1
    torch.testing.assert_close(out.float(), ref.float(), **op_tol(out_dtype, "gemm"))
    cfg = cfg or F.choose_fp8_config(F.m_bucket(m), n, k, arch)
    if ex.counts:
        assert ex.launches[0].counters["mfma_by_kind"] == {MFMA[arch]: F.expected_mfma_count_fp8(m, n, k, arch, cfg)}


def test_block_cases_cover_split_k():
    assert F.choose_fp8_config(F.m_bucket(17), 96, 272, "gfx942").split > 1
    assert F.choose_fp8_config(F.m_bucket(3), 64, 2048, "gfx950").kw == 4


@pytest.mark.parametrize("arch", ["gfx950"])
def test_gemm_fp8_block_is_the_dequantized_matmul(arch):
    """Against what a user writes (dequantize both operands, matmul): close, and the block scales matter
    (per-row / per-column scales of the same data would be a different, worse, answer)."""
    m, n, k = 8, 256, 512
    aq, sa, wq, sw, _ = _case(arch, m, n, k, "block", seed=2)
    deq_a = aq.float() * sa.repeat_interleave(128, 1)[:, :k]
    deq_w = wq.float() * sw.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    with executors.current().run(arch) as ex:
        out = F.gemm_fp8_block(ex.put(aq), ex.put(F.shuffle_weight_fp8(wq)), n, k, ex.put(sa), ex.put(sw),
                               out_dtype=torch.float32).cpu()
    torch.testing.assert_close(out, deq_a @ deq_w.t(), **op_tol(torch.float32, "gemm"))


def test_gemm_fp8_block_rejects_bad_scales():
    arch = "gfx942"
    wq = torch.zeros(32, 256).to(F.fp8_dtype(arch))
    with executors.current().run(arch) as ex:
        args = (ex.put(torch.zeros(2, 256).to(F.fp8_dtype(arch))), ex.put(F.shuffle_weight_fp8(wq)), 32, 256)
        with pytest.raises(KernelInputError, match=r"w_scale must be a float \[1, 2\]"):
            F.gemm_fp8_block(*args, ex.put(torch.ones(2, 2)), ex.put(torch.ones(32)))
        with pytest.raises(KernelInputError, match="a_scale"):
            F.gemm_fp8_block(*args, ex.put(torch.ones(2, 3)), ex.put(torch.ones(1, 2)))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float32])
def test_fp8_block_linear_is_the_e4m3fn_math_on_both_archs(arch, dt):
    """Quantize kernel + block GEMM (two launches) equal the e4m3fn math on both archs: gfx942 runs e4m3fn values
    as fnuz halves (weight / 2 with doubled scales, activation with FMAX 224), which rounds nothing."""
    from translator_kernels.gemm import fp8_block as B

    g = torch.Generator().manual_seed(4)
    m, n, k = 6, 160, 384
    x = (torch.randn(2, m // 2, k, generator=g) * 3).to(dt)
    w, sw = F.quantize_fp8_blocks(torch.randn(n, k, generator=g), B.HF_FP8, (128, 128))
    bias = torch.randn(n, generator=g)
    wp, swp = B.prepare_weight(arch, w, sw)
    with executors.current().run(arch) as ex:
        out = B.fp8_block_linear(ex.put(x), ex.put(wp), n, k, ex.put(swp), bias=ex.put(bias)).cpu()
    assert out.shape == (2, m // 2, n) and out.dtype == dt and len(ex.launches) == 2
    torch.testing.assert_close(out.float(), B.ref_fp8_block_linear(x, w, sw, bias).float(), **op_tol(dt, "gemm"))
