"""The timing MODEL's measured matrix ceiling (timing's t_maf): AMD's published Max-Achievable FLOPs of MI300X.

The MODEL counted MFMA cycles at the 2.1 GHz boost clock, so at FLOP-bound GEMM shapes it gave our kernel more than
AMD measured its own best GEMM to reach on MI300X (gfx942 M = 2048, N = K = 4096 bf16: 830 TFLOPS modeled, 708
measured at the GEMM's real 1207 MHz clock). The ceiling is a floor of the kernel time; the tile heuristics rank by
the cycles (rank_t), so no choice moves."""

import pytest

from translator_kernels.arch import GPUS
from translator_kernels.gemm import tiles
from translator_kernels.gemm.tiles import GemmConfig, model_estimate, model_features
from translator_kernels.timing import Launch, launch_time


def test_achievable_matrix_rate_is_the_published_maf_where_there_is_one():
    g942, g950 = GPUS["gfx942"], GPUS["gfx950"]
    assert g942.achievable_flops("bf16") == 708e12 and g942.achievable_flops("f16") == 654e12
    assert g942.achievable_flops("fp8") == 1273e12
    assert g942.achievable_flops("f32") == g942.peak_flops("f32")  # no published f32 figure
    assert all(g950.achievable_flops(d) == g950.peak_flops(d) for d in ("bf16", "f16", "fp8"))  # none for MI355X


def test_the_ceiling_binds_only_where_the_cycles_beat_it_and_only_with_a_dtype():
    cfg = GemmConfig(64, 256, 128, 1, head=32)
    feat = model_features(cfg, "bf16", "gfx942")
    m = n = k = 4096
    grid, flops = (m // 64) * (n // 256), 2.0 * m * n * k
    plain = launch_time(feat, Launch(grid, k // 128, 3 * m * n * 2, flops), "gfx942")
    capped = launch_time(feat, Launch(grid, k // 128, 3 * m * n * 2, flops, dtype="bf16"), "gfx942")
    assert plain["t_maf"] == 0.0 and plain["kernel_t"] == plain["kernel_t_boost"]
    assert capped["kernel_t_boost"] == pytest.approx(plain["kernel_t"])
    assert capped["kernel_t"] == pytest.approx(max(plain["kernel_t"], flops / 708e12))
    assert capped["bound"] == "MAF" and capped["kernel_t"] > capped["kernel_t_boost"]
    # an f32 launch (no published figure) and gfx950 (none) keep the cycle time
    f32 = launch_time(feat, Launch(grid, k // 128, 3 * m * n * 2, flops, dtype="f32"), "gfx942")
    assert f32["kernel_t"] == f32["kernel_t_boost"]
    feat950 = model_features(cfg, "bf16", "gfx950")
    r950 = launch_time(feat950, Launch(grid, k // 128, 3 * m * n * 2, flops, dtype="bf16"), "gfx950")
    assert r950["t_maf"] == 0.0 and r950["bound"] != "MAF"


@pytest.mark.parametrize("m", [1024, 2048])
def test_gfx942_mid_m_no_longer_beats_the_vendors_measured_maximum(m):
    cfg = tiles.choose_config(m, 4096, 4096, "bf16", "gfx942")
    e = model_estimate(m, 4096, 4096, "bf16", "gfx942", cfg)
    assert 2.0 * m * 4096 * 4096 / e["kernel_t"] <= 708e12 * (1 + 1e-9)
    assert e["bound"] == "MAF" and e["rank_t"] < e["kernel_t"]
    # of the vendor-peak FLOP floor, no gfx942 bf16 kernel can show more than MAF / peak (0.54)
    assert e["floor_fraction"] == pytest.approx(708e12 / GPUS["gfx942"].peak_flops("bf16"), rel=1e-6)


def test_the_ranking_is_the_cycles_so_no_choice_moves(monkeypatch):
    shapes = [(m, 4096, 4096) for m in (512, 1024, 2048)] + [(1024, 28672, 4096), (2048, 4096, 14336)]
    with_ceiling = [tiles._mid(*s, "bf16", "gfx942") for s in shapes]
    for dt in list(GPUS["gfx942"].maf_flops):
        monkeypatch.delitem(GPUS["gfx942"].maf_flops, dt)
    without = [tiles._mid(*s, "bf16", "gfx942") for s in shapes]
    assert with_ceiling == without


def test_large_tile_estimate_keeps_the_ceiling_too():
    cfg = GemmConfig(128, 128, 64)
    e942 = tiles.large_estimate(4096, 4096, 4096, "bf16", "gfx942", cfg)
    assert e942["t"] == pytest.approx(2.0 * 4096**3 / 708e12) and e942["t_boost"] < e942["t"]
    e950 = tiles.large_estimate(4096, 4096, 4096, "bf16", "gfx950", cfg)
    assert e950["t"] == e950["t_boost"]
