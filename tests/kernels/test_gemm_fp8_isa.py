"""The fp8 GEMM compiles to the fp8 MFMAs on both archs with no spills (COMPILE_ONLY child, no GPU)."""

import pytest

from translator_kernels.arch import ARCHS
from translator_kernels.measure.fp8_isa import FP8_GEMM, QUANTIZE, W8_GEMM


@pytest.mark.parametrize("arch", ARCHS)
def test_fp8_gemm_isa(arch):
    from translator_kernels.hotloop import compile_isa_texts, main_text
    from translator_kernels.isa import parse_isa

    text = main_text(compile_isa_texts(FP8_GEMM, (4096, 4096, 128, 128, 128), arch=arch))
    meta = max(parse_isa(text, arch), key=lambda st: st.instructions).meta
    want = {"gfx942": "v_mfma_f32_16x16x32_fp8_fp8", "gfx950": "v_mfma_f32_16x16x128_f8f6f4"}[arch]
    assert want in text and meta["vgpr_spill"] == 0 and meta["sgpr_spill"] == 0
    assert meta["vgpr"] <= 192  # 2+ waves per SIMD (measured: 158 on gfx942, 168 on gfx950)


@pytest.mark.parametrize("arch", ["gfx950", pytest.param("gfx942", marks=pytest.mark.slow)])
def test_quantize_kernel_isa(arch):
    """The per-token quantize kernel compiles (v_cvt_pk_fp8_f32 on both archs)."""
    from translator_kernels.hotloop import compile_isa_texts, main_text

    text = main_text(compile_isa_texts(QUANTIZE, (4096,), arch=arch))
    assert "v_cvt_pk_fp8_f32" in text


@pytest.mark.parametrize("arch", ["gfx942", pytest.param("gfx950", marks=pytest.mark.slow)])
def test_w8_gemm_isa(arch):
    """The weight-only int8 GEMM compiles: 8-byte W loads, the bf16 MFMA, no spills."""
    from translator_kernels.hotloop import compile_isa_texts, main_text
    from translator_kernels.isa import parse_isa

    text = main_text(compile_isa_texts(W8_GEMM, (4096, 4096, 128, 128, 64), arch=arch))
    meta = max(parse_isa(text, arch), key=lambda st: st.instructions).meta
    assert "buffer_load_dwordx2" in text and "v_mfma_f32_16x16x" in text
    assert meta["vgpr_spill"] == 0 and meta["sgpr_spill"] == 0, meta


@pytest.mark.parametrize("arch", ["gfx950", pytest.param("gfx942", marks=pytest.mark.slow)])
def test_fp8_block_gemm_isa(arch):
    """The 128 x 128 block-scaled fp8 GEMM compiles at 128x128x128 with the fp8 MFMA and no spills."""
    from translator_kernels.gemm.quant_isa import FP8_BLOCK_GEMM
    from translator_kernels.hotloop import compile_isa_texts, main_text
    from translator_kernels.isa import parse_isa

    text = main_text(compile_isa_texts(FP8_BLOCK_GEMM, (4096, 4096, 128, 128, 128), arch=arch))
    meta = max(parse_isa(text, arch), key=lambda st: st.instructions).meta
    want = {"gfx942": "v_mfma_f32_16x16x32_fp8_fp8", "gfx950": "v_mfma_f32_16x16x128_f8f6f4"}[arch]
    assert want in text and meta["vgpr_spill"] == 0 and meta["sgpr_spill"] == 0, meta


@pytest.mark.parametrize("arch", ["gfx942", pytest.param("gfx950", marks=pytest.mark.slow)])
def test_w4_gemm_isa(arch):
    """The int4 GEMM compiles: 4-byte W loads (8 codes), the bf16 MFMA, no spills."""
    from translator_kernels.gemm.quant_isa import W4_GEMM
    from translator_kernels.hotloop import compile_isa_texts, main_text
    from translator_kernels.isa import parse_isa

    text = main_text(compile_isa_texts(W4_GEMM, (4096, 4096, 16, 64, 256, 128), arch=arch))
    meta = max(parse_isa(text, arch), key=lambda st: st.instructions).meta
    assert "v_mfma_f32_16x16x" in text and "buffer_load_dword " in text
    assert meta["vgpr_spill"] == 0 and meta["sgpr_spill"] == 0, meta
