"""bench.isa_fp8's decode rows: the plan takes the tile chooser's split-K tiles and says which ones FlyDSL's
preshuffle GEMM cannot take; the split-K compile entry builds the kernel the chooser picks (COMPILE_ONLY)."""

import pytest

from bench import isa_fp8
from translator_kernels.gemm import GemmConfig
from translator_kernels.gemm.fp8 import choose_fp8_config
from translator_kernels.gemm.tiles import m_bucket


def test_decode_plan_uses_the_chosen_tiles_and_their_split():
    plan = isa_fp8.decode_plan(("gfx942", "gfx950"))
    assert len(plan) == 2 * (2 * len(isa_fp8.DECODE_SHAPES) + 1)
    for r in plan:
        if r["chosen"]:
            assert r["cfg"] == choose_fp8_config(m_bucket(r["m"]), r["n"], r["k"], r["arch"])
        e = r["est"]
        assert e["kernel_t"] > 0 and 0 < e["hbm_floor"] / e["kernel_t"] <= 1
    assert any(r["cfg"].split > 1 for r in plan)  # decode is split-K: the rows the split-1 entries could not build
    assert [r["cfg"] for r in plan if not r["chosen"]] == [GemmConfig(16, 64, 128)] * 2


def test_upstream_reason():
    assert isa_fp8.upstream_reason(GemmConfig(16, 16, 128, 4, 4)) == isa_fp8.NO_SPLIT_UPSTREAM
    assert "BN=16" in isa_fp8.upstream_reason(GemmConfig(16, 16, 128, 1, 4))
    assert isa_fp8.upstream_reason(GemmConfig(16, 64, 128)) is None


@pytest.mark.parametrize("arch", ["gfx950"])
def test_split_k_decode_entry_compiles(arch):
    """Llama-3-8B down at M=16 on gfx950: 16x16x512 split 2, kw 4 (the chooser's tile) compiles with no
    spills to the fp8 MFMA, and its per-K-step MFMA count is one K tile's (the K loop is unrolled: 14 tiles)."""
    cfg = choose_fp8_config(16, 4096, 14336, arch)
    assert (cfg.bm, cfg.bn, cfg.bk, cfg.split, cfg.kw) == (16, 16, 128, 2, 4)
    c = isa_fp8._isa_cells(isa_fp8.FP8_GEMM, (4096, 14336, 16, 16, 512, 2, 4), arch, (16, 16, 512), 14)
    assert "error" not in c, c
    assert c["spills"] == 0 and c["waves"] >= 4
    assert c["mfma"] == 1 and c["mfma_total"] == 14  # gfx950: one 16x16x128 MFMA per 16x16x128 block, / 4 waves


def test_block_scaled_decode_entry_compiles():
    """The 128 x 128 block-scaled kernel at the same chooser's tile (gfx950 down, M = 16: 16x16x512, split 2, kw 4):
    it compiles with no spills, one MFMA per K step per wave as the epilogue-scaled kernel, and its scales cost
    VALU (sa x sw, the fma per partial) where the epilogue-scaled K loop has none."""
    tile = (16, 16, 512)
    plain = isa_fp8._isa_cells(isa_fp8.FP8_GEMM, (4096, 14336, *tile, 2, 4), "gfx950", tile, 14)
    block = isa_fp8._isa_cells(isa_fp8.FP8_BLOCK_GEMM, (4096, 14336, *tile, 2, 4), "gfx950", tile, 14)
    assert "error" not in block, block
    assert block["spills"] == 0 and block["mfma"] == plain["mfma"] == 1
    assert block["valu"] > plain["valu"]


def test_gated_fp8_entry_compiles():
    """The fp8 gated GEMM at its decode tile (Llama-3-8B gate + up, gfx942: 16x128x512): no spills, the plain fp8
    GEMM's MFMAs per K step over the same [2N, K] weight, a few more registers for the pairs."""
    from translator_kernels.gemm.fp8_gated import choose_gated_fp8_config

    cfg = choose_gated_fp8_config(1, 14336, 4096, "gfx942")
    tile = (cfg.bm, cfg.bn, cfg.bk * 4)
    assert tile == (16, 128, 512) and cfg.split == 1 and cfg.kw == 1
    gated = isa_fp8._isa_cells(isa_fp8.FP8_GATED_GEMM, (14336, 4096, *tile), "gfx942", tile, 8)
    plain = isa_fp8._isa_cells(isa_fp8.FP8_GEMM, (28672, 4096, *tile, 1, 1), "gfx942", tile, 8)
    assert "error" not in gated, gated
    assert gated["spills"] == 0 and gated["mfma"] == plain["mfma"] and gated["vgpr"] <= plain["vgpr"] + 16
