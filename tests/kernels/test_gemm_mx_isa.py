"""The MX GEMM compiles on gfx950 to the scaled f8f6f4 MFMA with its scale operands, no spills (COMPILE_ONLY
child, no GPU)."""

import pytest

from translator_kernels.gemm.mx_isa import MX_GEMM


@pytest.mark.parametrize("a_mode,w_fmt", [("mx", "fp8"), ("row", "fp8"), ("mx", "fp4")])
def test_mx_gemm_isa(a_mode, w_fmt):
    from translator_kernels.hotloop import compile_isa_texts, main_text
    from translator_kernels.isa import parse_isa

    text = main_text(compile_isa_texts(MX_GEMM, (4096, 4096, 128, 128, 128, a_mode, w_fmt), arch="gfx950"))
    meta = max(parse_isa(text, "gfx950"), key=lambda st: st.instructions).meta
    # the scaled form (v_mfma_scale_...) with the e8m0 bytes, loaded one per lane (buffer_load_ubyte)
    assert "v_mfma_scale_f32_16x16x128_f8f6f4" in text and "buffer_load_ubyte" in text, text[:2000]
    assert meta["vgpr_spill"] == 0 and meta["sgpr_spill"] == 0, meta
    if w_fmt == "fp4":  # a lane's 16 W values of a half-chunk are 8 bytes
        assert "buffer_load_dwordx2" in text
    print(a_mode, w_fmt, {k: meta[k] for k in ("vgpr", "agpr", "sgpr", "lds")})
