"""The ROCm blog's measured MI355X bf16 decode GEMMs (translator_kernels.measure.blog_gemm): the data file, its
source, and the validation-only table against the timing MODEL (from the cached features; no compile)."""

import statistics

import pytest

from translator_kernels import timing
from translator_kernels.measure import blog_gemm

# cell text of the two SVG figures (ROCm/rocm-blogs: decode-gemm-speedup-table.svg @ 6419e31b, K = 7168;
# bf16-model-shape-speedup-table.svg @ 87e6cfaa), copied by hand: (N, K, M) -> text
SVG_TEXT = {(64, 7168, 1): "4.6us / 8.9us", (384, 7168, 32): "6.8us / 8.0us", (512, 7168, 64): "7.8us / 11.9us",
            (1024, 7168, 2): "6.5us / 15.4us", (1024, 7168, 128): "11.2us / 15.8us",
            (128, 2880, 1): "4.1us / 5.5us", (640, 2880, 1): "4.7us / 11.1us", (2112, 7168, 128): "20.9us / 24.6us",
            (2880, 4096, 128): "16.5us / 15.4us", (5120, 2880, 64): "11.8us / 15.4us"}
SYNTHETIC_ISA = """\t.text
k:
\tbuffer_load_dwordx4 v[0:3], v4, s[0:3], 0 offen
\ts_waitcnt vmcnt(0)
\tv_mfma_f32_16x16x32_bf16 v[6:9], v[0:3], v[0:3], 0
.LBB0_1:
\tglobal_load_dword v3, v[4:5], off sc1
\ts_waitcnt vmcnt(0)
\tv_cmp_eq_u32 vcc, 0, v3
\ts_cbranch_vccnz .LBB0_1
\ts_endpgm
amdhsa.kernels:
  - .agpr_count:    0
    .max_flat_workgroup_size: 128
    .name:           k
    .vgpr_count:     16
"""


def _rows():
    return {(r["n"], r["k"], r["m"]): r for r in blog_gemm.load_points()["rows"]}


def test_points_parse_and_every_row_has_a_source():
    data = blog_gemm.load_points()
    src = data["source"]
    assert src["repo"] == "ROCm/rocm-blogs" and src["date"] == "29 Jun 2026" and "MI355X" in src["gpu"]
    rows = data["rows"]
    ms = (1, 2, 4, 8, 16, 32, 64, 128)
    families = {(r["n"], r["k"], r["bias"]) for r in rows}
    assert len(rows) == 80 and len(families) == 10  # 4 + 6 families x 8 M: the figures' 32 and 48 shapes
    assert {(n, k, m) for n, k, _ in families for m in ms} == set(_rows())
    for r in rows:
        assert r["figure"] in src["figures"] and len(src["figures"][r["figure"]]["commit"]) == 40
        assert r["flydsl_us"] > 0 and r["best_baseline_us"] > 0
        assert (r["flydsl_us"] < r["best_baseline_us"]) == (r["speedup_printed"] > 1)
        if "aiter_tuned" in r:
            assert r["aiter_tuned"]["csv"].startswith("aiter/configs/model_configs/")


def test_values_equal_the_svg_text():
    rows = _rows()
    for key, text in SVG_TEXT.items():
        r = rows[key]
        assert f"{r['flydsl_us']:.1f}us / {r['best_baseline_us']:.1f}us" == text


def test_figure_7_fastest_backends():
    # Figure 7 (decode-gemm-fastest-backend-table.svg @ 8d32d268): AITER ASM fastest at N = 64, M = 2 / 8 / 16, the
    # FlyDSL kernel at the other 29 shapes with Figure 6's FLYDSL latency ("AITER FLYDSL wins 29/32 shapes")
    rows = [r for r in blog_gemm.load_points()["rows"] if r["k"] == 7168 and "fastest" in r]
    assert len(rows) == 32
    asm = {(r["n"], r["m"]): r["fastest"]["us"] for r in rows if r["fastest"]["backend"] == "AITER ASM"}
    assert asm == {(64, 2): 4.9, (64, 8): 4.9, (64, 16): 5.0}
    assert all(r["fastest"]["us"] == r["flydsl_us"] for r in rows if r["fastest"]["backend"] == "AITER FLYDSL")


def test_printed_speedups_agree_with_the_latencies():
    # each cell prints baseline / FLYDSL: equal to the two latencies up to their one-decimal rounding (a check of
    # the transcription of all 64 numbers)
    for r in blog_gemm.load_points()["rows"]:
        lo = (r["best_baseline_us"] - 0.05) / (r["flydsl_us"] + 0.05)
        hi = (r["best_baseline_us"] + 0.05) / (r["flydsl_us"] - 0.05)
        assert lo - 0.005 <= r["speedup_printed"] <= hi + 0.005, r


def test_config_names_parse():
    c = blog_gemm.config_of("flydsl_gemm2_abf16_wbf16_bf16_t32x64x256_split_k7_block_m_warp2_block_n_warp2_async_copyTrue"
                            "_b_to_ldsTrue_b_preshuffleFalse_c_to_ldsFalse_gfx950")
    assert c == dict(TILE_M=32, TILE_N=64, TILE_K=256, STAGES=2, SPLIT_K=7, BLOCK_M_WARPS=2, BLOCK_N_WARPS=2,
                     BLOCK_K_WARPS=1, B_TO_LDS=True)
    with pytest.raises(ValueError):
        blog_gemm.config_of("_ZN5aiter39bf16gemm_fp32bf16_tn_32x64_splitk_cleanE")


def test_a_skipped_loop_is_never_the_hot_loop():
    # the split-K spin-wait is the only loop of a kernel whose K loop the compiler unrolled: skipped, the kernel
    # has no hot loop (before, `skip` only left it out of the straight-line code and it stayed the hot loop)
    assert timing.features(SYNTHETIC_ISA, "gfx950").has_loop
    f = timing.features(SYNTHETIC_ISA, "gfx950", skip=(".LBB0_1",))
    assert not f.has_loop and f.loop_vector == 0


def test_table_rows_evaluate():
    rows = blog_gemm.evaluate()
    assert len(rows) == 80
    priced = [r for r in rows if r["config"]]
    assert len(priced) == 63  # the shapes whose AITER tuned winner is its FlyDSL kernel
    assert all(r["model_us"] for r in priced), [r["note"] for r in priced if not r["model_us"]]
    looped = [r for r in priced if r["has_loop"]]
    unrolled = [r for r in priced if not r["has_loop"]]
    assert len(looped) == 44 and len(unrolled) == 19
    # kernel_t alone, before the per-launch device time (docs/timing-model.md): with a K loop 0.52-1.04 of the measured
    # device time; K loop unrolled, with the largest batch a wave waits on in flight (timing._Outstanding), 0.31-0.69
    # (1.3-6.9 with the loads before the first wait, the rule before)
    ks = [r["kernel_us"] / r["flydsl_us"] for r in looped]
    assert 0.5 < min(ks) and max(ks) < 1.1 and 0.6 < statistics.median(ks) < 0.75
    assert all(0.3 < r["kernel_us"] / r["flydsl_us"] < 0.7 for r in unrolled)
    # the MODEL of a device-timed launch: kernel_t + T_DEVICE
    t_dev = blog_gemm.GPUS[blog_gemm.ARCH].timing["device_launch_s"] * 1e6
    assert all(r["model_us"] == pytest.approx(r["kernel_us"] + t_dev) for r in priced)
    assert all(r["ratio"] == pytest.approx(r["model_us"] / r["flydsl_us"]) for r in priced)
    for r in rows:
        assert r["ours_kernel_us"] > 0 and r["ours_graph_us"] > r["ours_kernel_us"]
        # ours is set beside a device-timed measurement in the same harness's terms: kernel_t + T_DEVICE
        assert r["ours_device_us"] == pytest.approx(r["ours_kernel_us"] + t_dev)
        assert r["ours_vs_best"] * min(r["flydsl_us"], r["best_baseline_us"]) >= r["ours_device_us"] - 1e-9


def test_at_most_half_of_the_points_fit_t_device():
    rows = blog_gemm.evaluate(ours=False)
    roles = [r["role"] for r in rows if r["config"]]
    assert roles[:4] == ["validation", "fit", "validation", "fit"]  # every other priced row, in the file's order
    assert 2 * roles.count("fit") <= len(roles) and roles.count("fit") == 31
    assert all(r["role"] is None for r in rows if not r["config"])
    # the constant is what the fit points give (the grid search, the other constants as in arch.py)
    assert blog_gemm.fit_device() == pytest.approx(blog_gemm.GPUS[blog_gemm.ARCH].timing["device_launch_s"])


def test_the_validation_count_is_computed():
    rows = blog_gemm.evaluate(ours=False)
    s = blog_gemm.summary(rows)
    assert s["n"] == 32 and s["within"] == sum(abs(r["ratio"] - 1) <= 0.25 for r in rows if r["role"] == "validation")
    assert f"{s['within']} of 32 within 25%" in blog_gemm.device_line(rows)
    # move one validation row out of the band: the line follows (nothing in it is a constant)
    v = next(r for r in rows if r["role"] == "validation")
    moved = [dict(r, ratio=2.0) if r is v else r for r in rows]
    assert f"{s['within'] - 1} of 32 within 25%" in blog_gemm.device_line(moved)
    assert "max |error| 100%" in blog_gemm.device_line(moved)

