"""The fp8 GEMM compiles to the fp8 MFMAs on both archs with no spills (COMPILE_ONLY child, no GPU)."""

import pytest

from translator_kernels.arch import ARCHS
from translator_kernels.gemm.quant_isa import FP8_BLOCK_GEMM, W4_GEMM
from translator_kernels.measure.fp8_isa import FP8_GEMM, QUANTIZE, W8_GEMM

JOBS = {"fp8": (FP8_GEMM, (4096, 4096, 128, 128, 128), {}), "quantize": (QUANTIZE, (4096,), {}),
        "w8": (W8_GEMM, (4096, 4096, 128, 128, 64), {}), "block": (FP8_BLOCK_GEMM, (4096, 4096, 128, 128, 128), {}),
        "w4": (W4_GEMM, (4096, 4096, 16, 64, 256, 128), {})}
DEFAULT = {"gfx942": ("fp8", "w8", "w4"), "gfx950": ("fp8", "quantize", "block")}  # the default suite's cases


@pytest.fixture
def isa_text(compiled_isa):
    """isa_text(name, arch) -> the main kernel's ISA of JOBS[name]: an arch's default cases compile in one child
    (tests/kernels/conftest.py's compiled_isa), a slow case alone."""
    from translator_kernels.hotloop import main_text

    def get(name, arch):
        names = DEFAULT[arch] if name in DEFAULT[arch] else (name,)
        return main_text(compiled_isa({n: JOBS[n] for n in names}, name, arch).texts)

    return get


@pytest.mark.parametrize("arch", ARCHS)
def test_fp8_gemm_isa(arch, isa_text):
    from translator_kernels.isa import parse_isa

    text = isa_text("fp8", arch)
    meta = max(parse_isa(text, arch), key=lambda st: st.instructions).meta
    want = {"gfx942": "v_mfma_f32_16x16x32_fp8_fp8", "gfx950": "v_mfma_f32_16x16x128_f8f6f4"}[arch]
    assert want in text and meta["vgpr_spill"] == 0 and meta["sgpr_spill"] == 0
    assert meta["vgpr"] <= 192  # 2+ waves per SIMD (measured: 158 on gfx942, 168 on gfx950)


@pytest.mark.parametrize("arch", ["gfx950", pytest.param("gfx942", marks=pytest.mark.slow)])
def test_quantize_kernel_isa(arch, isa_text):
    """The per-token quantize kernel compiles (v_cvt_pk_fp8_f32 on both archs)."""
    text = isa_text("quantize", arch)
    assert "v_cvt_pk_fp8_f32" in text


@pytest.mark.parametrize("arch", ["gfx942", pytest.param("gfx950", marks=pytest.mark.slow)])
def test_w8_gemm_isa(arch, isa_text):
    """The weight-only int8 GEMM compiles: 8-byte W loads, the bf16 MFMA, no spills."""
    from translator_kernels.isa import parse_isa

    text = isa_text("w8", arch)
    meta = max(parse_isa(text, arch), key=lambda st: st.instructions).meta
    assert "buffer_load_dwordx2" in text and "v_mfma_f32_16x16x" in text
    assert meta["vgpr_spill"] == 0 and meta["sgpr_spill"] == 0, meta


@pytest.mark.parametrize("arch", ["gfx950", pytest.param("gfx942", marks=pytest.mark.slow)])
def test_fp8_block_gemm_isa(arch, isa_text):
    """The 128 x 128 block-scaled fp8 GEMM compiles at 128x128x128 with the fp8 MFMA and no spills."""
    from translator_kernels.isa import parse_isa

    text = isa_text("block", arch)
    meta = max(parse_isa(text, arch), key=lambda st: st.instructions).meta
    want = {"gfx942": "v_mfma_f32_16x16x32_fp8_fp8", "gfx950": "v_mfma_f32_16x16x128_f8f6f4"}[arch]
    assert want in text and meta["vgpr_spill"] == 0 and meta["sgpr_spill"] == 0, meta


@pytest.mark.parametrize("arch", ["gfx942", pytest.param("gfx950", marks=pytest.mark.slow)])
def test_w4_gemm_isa(arch, isa_text):
    """The int4 GEMM compiles: 4-byte W loads (8 codes), the bf16 MFMA, no spills."""
    from translator_kernels.isa import parse_isa

    text = isa_text("w4", arch)
    meta = max(parse_isa(text, arch), key=lambda st: st.instructions).meta
    assert "v_mfma_f32_16x16x" in text and "buffer_load_dword " in text
    assert meta["vgpr_spill"] == 0 and meta["sgpr_spill"] == 0, meta
