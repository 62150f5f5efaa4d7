"""The timing MODEL (translator_kernels.timing) and its calibration (translator_kernels.measure.calibration)
against the measured MI350X points; the GEMM heuristic's use of it (tiles.model_estimate, stream_estimate)."""

from __future__ import annotations

import re

import pytest

from translator_kernels import timing
from translator_kernels.arch import GPUS
from translator_kernels.gemm import tiles
from translator_kernels.gemm.tiles import GemmConfig, choose_config, model_estimate, stream_estimate
from translator_kernels.measure import calibration as cal


@pytest.fixture(scope="module")
def rows():
    return cal.evaluate(cal.load_features())


def test_every_point_is_modeled_and_at_most_half_fit(rows):
    assert all(r["model_us"] for r in rows), [r for r in rows if not r["model_us"]]
    fit = sum(r["role"] == "fit" for r in rows)
    assert 2 * fit <= len(rows)


def test_quoted_calibration_error_is_current(rows):
    """timing.CALIBRATION (what the report, BENCHMARKS.md and the docs quote) is what the cached
    features and the constants in translator_kernels.arch give."""
    s = cal.error_summary(rows)
    m = re.search(r"fit on (\d+) .*? validated on (\d+): max \|error\| (\d+)%, median (\d+)%; (\d+) of", timing.CALIBRATION)
    assert m, timing.CALIBRATION
    assert (int(m[1]), int(m[2])) == (s["n_fit"], s["n_val"])
    assert int(m[3]) == round(100 * s["max_val"]) and int(m[4]) == round(100 * s["median_val"])
    within = sum(abs(r["ratio"] - 1) <= 0.25 for r in rows if r["role"] == "validation")
    assert int(m[5]) == within
    # beside it, the device-timed MI355X decode GEMMs' fit / validation split, as evaluated now
    from translator_kernels.measure import blog_gemm

    assert timing.CALIBRATION == cal.calibration_line(rows, blog_gemm.evaluate(ours=False))


def test_roofline_was_far_more_optimistic(rows):
    """Issue 29's three cases: the model is within 35 % where the roofline was 2-7x off."""
    pick = {(r["kernel"], r["shape"], r["measured_us"]): r["ratio"] for r in rows}
    assert 0.75 <= pick[("softmax", "m=32768,n=8192", 271.8)] <= 1.25
    # a fit point (1.27 since the L2 term's refit); the study's CSV run of the same shape measured 116.2 us (1.01)
    assert 0.75 <= pick[("attention", "b=1,s=2048,h=32,d=128,causal=True", 92.4)] <= 1.3
    assert 0.75 <= pick[("attention", "b=1,s=2048,h=32,d=128,causal=True", 116.24)] <= 1.25
    assert 0.65 <= pick[("gemm_bf16", "m=4096,n=5120,k=8192,bm=128,bn=128,bk=64", 448.0)] <= 1.35


def test_littles_law_caps_bandwidth_by_bytes_in_flight():
    f = timing.KernelFeatures("k", waves_per_simd=8, waves_per_wg=4, inflight_bytes=64)
    g = GPUS["gfx950"]
    big = timing.launch_time(f, timing.Launch(100000, 1, 1e9), "gfx950")
    assert big["bw"] == pytest.approx(min(g.timing["hbm_efficiency"] * g.hbm_bytes_per_s,
                                          g.cus * 8 * 4 * 64 / g.timing["mem_latency_s"]))
    few = timing.launch_time(f, timing.Launch(g.cus, 1, 1e9), "gfx950")  # one workgroup per CU
    assert few["bw"] < big["bw"] and few["in_flight_per_cu"] == 4 * 64


def test_wave_quantization_and_tails():
    f = timing.KernelFeatures("k", 1, 4, 1024, loop_matrix=1000, loop_vector=0, loop_lds=0, loop_flops=1,
                              has_loop=True)
    cus = GPUS["gfx950"].cus
    one = timing.launch_time(f, timing.Launch(cus, 100, 0), "gfx950")["t_issue"]
    plus_one = timing.launch_time(f, timing.Launch(cus + 1, 100, 0), "gfx950")["t_issue"]
    assert plus_one == pytest.approx(2 * one)  # one more workgroup than CUs: a second round
    uneven = timing.launch_time(f, timing.Launch(2, (100, 10), 0), "gfx950")["t_issue"]
    assert uneven == pytest.approx(one)  # the longest workgroup sets the time


def test_features_of_a_compiled_kernel():
    from translator_kernels.hotloop import compile_isa_texts, main_text
    from translator_kernels.measure import rows_isa

    text = main_text(compile_isa_texts(rows_isa.ENTRY, ("softmax", "bf16", (64, 4096)), arch="gfx950"))
    f = timing.features(text, "gfx950")
    assert 1 <= f.waves_per_wg <= 16 and 1 <= f.waves_per_simd <= 8 and f.inflight_bytes >= 64 * 16
    assert not f.has_loop or f.loop_matrix == 0


def test_stream_estimate_counts_only_weight_bytes_in_flight():
    cfg = GemmConfig(64, 16, 128, 4, 4)
    e = stream_estimate(64, 4096, 4096, "bf16", "gfx950", cfg)
    assert e["in_flight"] == e["resident"] * 16 * 128 * 2  # BN x BK of W per workgroup; A comes from L2


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_mid_m_is_no_longer_32_workgroups(arch):
    """M = 128, N = K = 4096: the unsplit 128 x 128 tile ran 32 workgroups on 256-304 CUs."""
    cfg = choose_config(128, 4096, 4096, "bf16", arch)
    est = model_estimate(128, 4096, 4096, "bf16", arch, cfg)
    old = model_estimate(128, 4096, 4096, "bf16", arch, GemmConfig(128, 128, 64))
    assert est["grid"] >= GPUS[arch].cus and est["t"] < old["t"], (cfg, est["grid"])


def test_deeper_prefetch_is_modeled_faster_for_decode():
    cfg = GemmConfig(16, 64, 256)  # 64 workgroups: too few bytes in flight with one K tile each
    one, two = (model_estimate(16, 4096, 4096, "bf16", "gfx950", cfg, p)["t"] for p in (1, 2))
    assert two < one


@pytest.mark.slow
def test_refit_gives_the_constants_in_arch():
    c = cal.fit(cal.load_features())
    assert c == pytest.approx(GPUS["gfx950"].timing)
    assert tiles  # the heuristic reads the same constants (translator_kernels.arch)


def test_config_fits_rejects_kw4_tiles_whose_lds_cannot_sum_the_accumulators():
    """kernel.py sums the 4 K-waves' accumulators through the two A stages: 64x64x128 kw=4 needs 64 KiB
    there, the stages hold 32 KiB (the mid-M ranking chose it before config_fits knew)."""
    assert "accumulators" in tiles.config_fits(GemmConfig(64, 64, 128, 2, 4), "bf16", "gfx942")
    assert tiles.config_fits(GemmConfig(64, 64, 256, 2, 4), "bf16", "gfx942") is None


@pytest.mark.parametrize("arch,mb,n", [(a, mb, n) for a in ("gfx942", "gfx950") for mb, n in ((128, 6144), (64, 4096))]
                         # the choices the L2 term changed at N = K = 4096 (gfx942 M = 128: 32x64x256 split 2 head 32,
                         # gfx950 M = 16: 16x32x128 kw4 split 4, M = 2048: 128x256x64 split 2 head 32)
                         + [("gfx942", 128, 4096), ("gfx950", 16, 4096), ("gfx950", 2048, 4096)])
def test_mid_m_choice_compiles(arch, mb, n):
    from translator_kernels.measure.gemm_isa import isa_stats

    c = choose_config(mb, n, 4096, "bf16", arch)
    s = isa_stats(n, 4096, "bf16", arch, c.bm, c.bn, c.bk, activation="gelu", bias=True, residual=True, split=c.split,
                  kw=c.kw, wm=c.wm, head=c.head, ring=c.ring, quad=c.quad)
    assert s["vgpr_spill"] == 0 and s["mfma_static"] > 0


def _trips(ops):
    t = timing._Trips()
    for mn, rest in ops:
        t.step(mn, rest, timing.classify(mn))
    return t.n


def test_trips_count_dependent_load_phases_not_staggered_waits():
    """RMSNorm's generic path (the validation miss before): one batch of loads with staggered waits is one
    trip; each later load-then-wait (its second pass, a chunk at a time) is another."""
    batch = [("buffer_load_ushort", " v1")] * 3 + [("s_waitcnt", " vmcnt(2)"), ("s_waitcnt", " vmcnt(1)"),
                                                   ("s_waitcnt", " vmcnt(0)")]
    assert _trips(batch) == 1
    chunk = [("buffer_load_ushort", " v1"), ("buffer_load_ushort", " v2"), ("s_waitcnt", " vmcnt(0)"),
             ("buffer_store_short", " v1")]
    assert _trips(batch + 4 * chunk) == 5
    # a prefetch pipeline: the wait needs the loads of the previous iteration, not the ones just issued
    pipelined = [("buffer_load_dwordx4", " v1"), ("buffer_load_dwordx4", " v2"), ("s_waitcnt", " vmcnt(2)")]
    assert _trips(pipelined) == 0


def test_f8f6f4_mfma_runs_at_the_fp8_rate():
    """gfx950's f8f6f4 MFMA (upstream's and our fp8 GEMM) was priced at the bf16 rate: the fp8 GEMM
    points were 1.2-1.65x slow in the MODEL."""
    from translator_kernels.hotloop import mfma_cycles

    g = GPUS["gfx950"]
    per_simd = g.matrix_flops_per_clk["fp8"] / g.simds
    for mn in ("v_mfma_f32_16x16x128_f8f6f4", "v_mfma_scale_f32_16x16x128_f8f6f4"):
        assert mfma_cycles(mn, "gfx950") == 2 * 16 * 16 * 128 / per_simd == 32


def test_two_former_validation_misses_are_within_25_percent(rows):
    """Flash attention B8 S512 (the 256-row blocks' prologue loads, every workgroup at once) and fp8 GEMM
    5120^2 (the f8f6f4 MFMA rate) were 0.65 and 1.32."""
    want = {("attention", "b=8,s=512,h=64,d=128,causal=True"), ("gemm_fp8", "m=5120,n=5120,k=8320,bm=64,bn=256,bk=128")}
    got = {(r["kernel"], r["shape"]): r["ratio"] for r in rows if (r["kernel"], r["shape"]) in want}
    assert len(got) == 2 and all(abs(x - 1) <= 0.25 for x in got.values()), got


def _scalar_rms(rows):
    return [r for r in rows if r["kernel"] == "rms_norm" and "generic-scalar" in r["note"]]


def test_rmsnorm_scalar_path_round_trips_are_identified_by_fit_points(rows):
    """RMSNorm's generic-scalar path (N = 2560 ... 7168) re-reads its row a chunk at a time: 11-29 dependent
    round trips per workgroup, each waiting the loaded L2 latency (L2_LATENCY). Seven measured rows of that
    path, three of them fit points, set it; every one of the seven is within 25 %. Without the term
    (L2_LATENCY = 0) they sat at 0.65-0.68, the miss this replaces."""
    feats = cal.load_features()
    assert [feats[f"rms_norm:n={n}"]["straight_trips"] for n in (2560, 2880, 5120, 7168)] == [11, 13, 21, 29]
    scalar = _scalar_rms(rows)
    assert len(scalar) == 7 and {r["role"] for r in scalar} == {"fit", "validation"}
    assert all(abs(r["ratio"] - 1) <= 0.25 for r in scalar), [(r["shape"], r["ratio"]) for r in scalar]
    assert GPUS["gfx950"].timing["l2_latency_s"] > 0
    without = _scalar_rms(cal.evaluate(feats, dict(GPUS["gfx950"].timing, l2_latency_s=0.0)))
    assert all(r["ratio"] < 0.75 for r in without), [(r["shape"], r["ratio"]) for r in without]


def test_validation_points_outside_25_percent_are_the_known_mid_m_misses(rows):
    """Issue 29's goal (every MI350X validation point within 25 %) is not met: a measured mid-M fp8 GEMM row
    misses it (calibration.KNOWN_MISSES says why). Any other miss is new and fails here; a fixed one
    fails too, so the list (and the docs) follow the model."""
    bad = {(r["kernel"], r["shape"]) for r in rows if r["role"] == "validation" and abs(r["ratio"] - 1) > 0.25}
    assert bad == set(cal.KNOWN_MISSES), bad ^ set(cal.KNOWN_MISSES)


def test_a_graph_replayed_launch_pays_the_measured_gap_not_the_fitted_floor():
    f = timing.KernelFeatures("k", waves_per_simd=8, waves_per_wg=4, inflight_bytes=2048)
    g = GPUS["gfx950"]
    r = timing.launch_time(f, timing.Launch(4096, 1, 64e6), "gfx950")
    assert r["t"] == pytest.approx(g.timing["launch_s"] + r["kernel_t"])
    assert r["t_graph"] == pytest.approx(g.timing["graph_launch_s"] + r["kernel_t"])
    assert 0 < g.timing["graph_launch_s"] < g.timing["launch_s"]


def test_prologue_loads_take_the_cus_share_of_bandwidth():
    """A loop kernel's loads outside the loop happen on every resident workgroup at once: the more
    workgroups share the CU, the longer each one's prologue."""
    base = dict(loop_matrix=1000, loop_flops=1, has_loop=True)
    lean = timing.KernelFeatures("k", 2, 4, 1024, **base)
    heavy = timing.KernelFeatures("k", 2, 4, 1024, straight_bytes=16384, **base)
    cus = GPUS["gfx950"].cus
    t = {(f.straight_bytes, n): timing.launch_time(f, timing.Launch(n * cus, 10, 0), "gfx950")["t_issue"]
         for f in (lean, heavy) for n in (1, 2)}
    assert t[(16384, 1)] > t[(0, 1)]
    assert t[(16384, 2)] - t[(0, 2)] == pytest.approx(2 * (t[(16384, 1)] - t[(0, 1)]))


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_m64_streams_at_least_0_8_of_achievable_hbm(arch):
    """N = K = 4096, M = 64: row tiles of 16 / 32 beside 64 (0.66 on gfx942 with 64-row tiles only)."""
    g = GPUS[arch]
    cfg = choose_config(64, 4096, 4096, "bf16", arch)
    e = model_estimate(64, 4096, 4096, "bf16", arch, cfg)
    assert e["hbm_floor"] / g.timing["hbm_efficiency"] / e["kernel_t"] >= 0.8, (cfg, e["kernel_t"])


def test_mi300x_points_are_modeled_and_kept_out_of_the_mi350x_split():
    """AMD's published MI300X hipBLASLt GEMMs (bf16 708, fp8 1273 TFLOPS) against the MODEL of upstream's
    kernel on gfx942: MODEL / measured 1.01 and 1.25 (bench.calibration prints them)."""
    rows = cal.evaluate(cal.load_features(), None, cal.MI300X_POINTS, "gfx942")
    assert [r["role"] for r in rows] == ["validation"] * len(cal.MI300X_POINTS)
    assert all(r["model_us"] and 0.75 <= r["ratio"] <= 1.3 for r in rows), rows
    assert cal.error_summary(cal.evaluate(cal.load_features()))["n_val"] == 33
