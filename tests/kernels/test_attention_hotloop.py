"""bench.hotloop: the loop finder and the cycle MODEL on a hand-written ISA listing (no compile)."""

from __future__ import annotations

import pytest

from bench.hotloop import find_loops, hot_loop, mfma_cycles

ISA = """
kern:
	s_load_dwordx4 s[0:3], s[4:5], 0x0
.LBB0_1:                                ; outer
	v_mov_b32_e32 v0, 0
.LBB0_2:                                ; =>This Inner Loop Header: Depth=2
	ds_read_b128 v[0:3], v10
	v_mfma_f32_16x16x16_bf16 v[4:7], v[0:1], v[2:3], v[4:7]
	v_mfma_f32_16x16x16_bf16 v[4:7], v[0:1], v[2:3], v[4:7]
	v_exp_f32_e32 v8, v8
	v_max_f32_e32 v9, v9, v8
	s_cbranch_vccnz .LBB0_4
.LBB0_3:
	v_cndmask_b32_e32 v9, v9, v8, vcc
.LBB0_4:
	buffer_load_dwordx4 v[0:3], v1, s[0:3], 0 offen
	s_cbranch_scc1 .LBB0_2
	v_add_f32_e32 v1, v1, v1
	s_branch .LBB0_1
	s_endpgm
"""


def test_finds_the_inner_mfma_loop_and_prices_it():
    loops = find_loops(ISA)
    assert sorted(lp.header for lp in loops) == [".LBB0_1", ".LBB0_2"]
    c = hot_loop(ISA, "gfx942")
    assert c["header"] == ".LBB0_2" and c["blocks"] == 3
    assert c["counts"]["MFMA"] == 2 and c["matrix_cycles"] == 32
    assert c["counts"]["VALU"] == 3 and c["vector_cycles"] == 16 + 4 + 4  # one transcendental
    assert c["lds_bytes"] == 1024 and c["lds_cycles"] == 32
    assert c["counts"]["vmem"] == 1 and c["bound"] == "matrix"


@pytest.mark.parametrize("mn,arch,cycles", [
    ("v_mfma_f32_16x16x16_bf16", "gfx942", 16),
    ("v_mfma_f32_32x32x8_bf16", "gfx942", 32),
    ("v_mfma_f32_16x16x16_bf16", "gfx950", 16),   # CDNA3-shaped: half rate on CDNA4
    ("v_mfma_f32_16x16x32_bf16", "gfx950", 16),
    ("v_mfma_f32_32x32x16_f16", "gfx950", 32),
    ("v_mfma_f32_16x16x4_f32", "gfx942", 32),
])
def test_mfma_cycle_table(mn, arch, cycles):
    assert mfma_cycles(mn, arch) == cycles


def test_no_loop_is_an_error():
    with pytest.raises(ValueError, match="no loop"):
        hot_loop("kern:\n\tv_mov_b32_e32 v0, 0\n\ts_endpgm\n")
