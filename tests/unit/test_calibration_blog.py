"""The ROCm blog's measured MI355X bf16 decode GEMMs (translator_kernels.measure.blog_gemm): the data file, its
source, and the validation-only table against the timing MODEL (from the cached features; no compile)."""

import statistics

import pytest

from translator_kernels.measure import blog_gemm

# cell text of images/decode-gemm-speedup-table.svg (ROCm/rocm-blogs @ 6419e31b), copied by hand: (N, M) -> text
SVG_TEXT = {(64, 1): "4.6us / 8.9us", (384, 32): "6.8us / 8.0us", (512, 64): "7.8us / 11.9us",
            (1024, 2): "6.5us / 15.4us", (1024, 128): "11.2us / 15.8us"}


def _rows():
    return {(r["n"], r["m"]): r for r in blog_gemm.load_points()["rows"]}


def test_points_parse_and_every_row_has_a_source():
    data = blog_gemm.load_points()
    src = data["source"]
    assert src["repo"] == "ROCm/rocm-blogs" and src["date"] == "29 Jun 2026" and "MI355X" in src["gpu"]
    rows = data["rows"]
    assert len(rows) == 32  # 4 N x 8 M, the figure's 32 shapes
    assert {(r["n"], r["m"]) for r in rows} == {(n, m) for n in (64, 384, 512, 1024) for m in (1, 2, 4, 8, 16, 32, 64, 128)}
    for r in rows:
        assert r["figure"] in src["figures"] and len(src["figures"][r["figure"]]["commit"]) == 40
        assert r["k"] == 7168 and r["bias"] is False and 0 < r["flydsl_us"] < r["best_baseline_us"]


def test_values_equal_the_svg_text():
    rows = _rows()
    for (n, m), text in SVG_TEXT.items():
        r = rows[(n, m)]
        assert f"{r['flydsl_us']:.1f}us / {r['best_baseline_us']:.1f}us" == text


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


def test_table_rows_evaluate():
    rows = blog_gemm.evaluate()
    assert len(rows) == 32
    priced = [r for r in rows if r["config"]]
    assert len(priced) == 21  # the shapes whose AITER tuned winner is its FlyDSL kernel
    assert all(r["model_us"] for r in priced), [r["note"] for r in priced if not r["model_us"]]
    ratios = [r["ratio"] for r in priced]
    # what the MODEL gets today (docs/timing-model.md, "Published decode GEMMs on MI355X"): it prices the measured
    # kernel 0.56-0.84 of its measured device time, median 0.69; only 2 of the 21 are within 25 % (known misses,
    # not a band the data meets)
    assert 0.5 < min(ratios) and max(ratios) < 0.9
    assert 0.6 < statistics.median(ratios) < 0.75
    # with the measured graph launch (1.7 us) added, 0.73-1.06: 20 of 21 within 25 % (M = 128, N = 384 misses)
    graph = [r["model_graph_us"] / r["flydsl_us"] for r in priced]
    assert 0.7 < min(graph) and max(graph) < 1.1
    assert sum(abs(x - 1) <= 0.25 for x in graph) == 20
    for r in rows:
        assert r["ours_kernel_us"] > 0 and r["ours_graph_us"] > r["ours_kernel_us"]
