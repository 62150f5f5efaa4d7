"""The timing MODEL's L2 term (issue 29): every byte the workgroups load passes the XCDs' L2s, at most
L2_EFFICIENCY x their data-sheet peak (t_l2, a third floor beside t_mem and t_issue), and a later round's
prologue loads hit the L2 as often as the launch's loads do. What it fixed in the calibration: the fp8 GEMM
16x64x512 at M = 2048, N = K = 2560 (MODEL / measured 1.61 -> within 25 %) while M = 4096, N = K = 8192 stays."""

from __future__ import annotations

import pytest

from translator_kernels import timing
from translator_kernels.arch import GPUS
from translator_kernels.gemm import tiles
from translator_kernels.gemm.tiles import GemmConfig
from translator_kernels.timing import Launch, launch_time
from translator_kernels.measure import calibration as cal

LOOP = dict(loop_matrix=1000, loop_flops=1, has_loop=True)


def test_l2_peak_is_the_data_sheet_width_per_xcd():
    # 8 XCDs x 16 channels x 128 B per clock at the boost clock: MI355X 39.3 TB/s, MI300X 34.4 TB/s
    for arch, g in GPUS.items():
        assert g.xcds == 8 and g.l2_read_bytes_per_clk == 16 * 128
        assert timing.l2_bytes_per_s(arch) == g.xcds * g.l2_read_bytes_per_clk * g.clock_hz
    assert timing.l2_bytes_per_s("gfx950") > timing.l2_bytes_per_s("gfx942")


def test_l2_bytes_are_a_third_floor():
    """A launch that loads far more bytes than it moves from HBM (operand tiles re-read by many workgroups) is
    bound by the L2s: its kernel time is the loaded bytes over L2_EFFICIENCY x the peak."""
    g = GPUS["gfx950"]
    f = timing.KernelFeatures("k", 2, 4, 1024, loop_matrix=10, loop_flops=1, has_loop=True)
    lean = timing.launch_time(f, timing.Launch(g.cus, 1, 1e6, l2_bytes=1e6), "gfx950")
    heavy = timing.launch_time(f, timing.Launch(g.cus, 1, 1e6, l2_bytes=4e9), "gfx950")
    assert lean["bound"] != "L2" and heavy["bound"] == "L2"
    assert heavy["kernel_t"] == pytest.approx(4e9 / (g.timing["l2_efficiency"] * timing.l2_bytes_per_s("gfx950")))


def test_loaded_bytes_default_to_the_features_times_the_grid():
    """Without Launch.l2_bytes the loads are counted from the features: every wave's straight-line loads plus
    its hot loop's loads per iteration x the iterations (an upper bound for a GEMM whose peeled K steps the
    iteration count includes: callers of a GEMM pass the closed form)."""
    f = timing.KernelFeatures("k", 2, 4, 1000, straight_bytes=300, **LOOP)
    assert timing.loaded_bytes(f, timing.Launch(10, 3, 0)) == 4 * (300 * 10 + 1000 * 30)
    assert timing.loaded_bytes(f, timing.Launch(2, (1, 5), 0)) == 4 * (300 * 2 + 1000 * 6)
    assert timing.loaded_bytes(f, timing.Launch(2, 1, 0, l2_bytes=7.0)) == 7.0


def test_later_rounds_prologue_hits_the_l2():
    """Three rounds of workgroups. The first round's prologue (cold L2s) takes the CU's share of the HBM
    bandwidth; a later round's loads come from beyond the L2 only in the launch's share of HBM bytes: when the
    launch loads every byte once (HBM bytes = loaded bytes) each round pays the full prologue, when its loads are
    mostly re-reads (HBM bytes 1 % of them) the later rounds pay far less."""
    g = GPUS["gfx950"]
    slots = g.cus * 2
    loaded = 3 * slots * 4 * 16384.0

    def issue(hbm, straight=16384):
        ff = timing.KernelFeatures("k", 2, 4, 1024, straight_bytes=straight, **LOOP)
        return timing.launch_time(ff, timing.Launch(3 * slots, 10, hbm, l2_bytes=loaded), "gfx950")["t_issue"]

    once, reread = issue(loaded) - issue(loaded, 0), issue(0.01 * loaded) - issue(0.01 * loaded, 0)
    pro = 2 * 4 * 16384  # resident workgroups per CU x waves x each wave's straight-line bytes
    hbm_cu = g.timing["hbm_efficiency"] * g.hbm_bytes_per_s / g.cus
    l2_cu = g.timing["l2_efficiency"] * timing.l2_bytes_per_s("gfx950") / g.cus
    assert once == pytest.approx(3 * pro / hbm_cu)
    assert reread == pytest.approx(pro / hbm_cu + 2 * (0.01 * pro / hbm_cu + 0.99 * pro / l2_cu))
    assert reread < 0.5 * once


@pytest.fixture(scope="module")
def rows():
    return {(r["kernel"], r["shape"]): r for r in cal.evaluate(cal.load_features())}


def test_the_former_mid_m_miss_is_within_25_percent_and_m4096_stays(rows):
    """fp8 16x64x512: M = 2048, N = K = 2560 (5 rounds of 3-iteration workgroups, 1.0 GB loaded) was 1.61 with
    every round's prologue at the HBM share; M = 4096, N = K = 8192 (32 rounds, 21 GB loaded) was 1.04 with that
    rule and 0.47 without it. With the L2 term and later rounds' prologue hitting the L2 both are within 25 %,
    the latter (and the M = 2048, N = K = 7168 fit row) bound by the L2s."""
    miss = rows[("gemm_fp8", "m=2048,n=2560,k=2560,bm=16,bn=64,bk=512")]
    big = rows[("gemm_fp8", "m=4096,n=8192,k=8192,bm=16,bn=64,bk=512")]
    fit = rows[("gemm_fp8", "m=2048,n=7168,k=7168,bm=16,bn=64,bk=512")]
    assert abs(miss["ratio"] - 1) <= 0.25 and abs(big["ratio"] - 1) <= 0.25, (miss["ratio"], big["ratio"])
    assert big["bound"] == "L2" and fit["bound"] == "L2" and fit["role"] == "fit"
    free = dict(GPUS["gfx950"].timing, l2_efficiency=1e9)  # the L2s at no cost: M = 4096 falls below 0.75
    no_l2 = {(r["kernel"], r["shape"]): r for r in cal.evaluate(cal.load_features(), free)}
    assert no_l2[("gemm_fp8", "m=4096,n=8192,k=8192,bm=16,bn=64,bk=512")]["ratio"] < 0.75


@pytest.mark.parametrize("grid", [1, 200, 1000, 5000])
def test_alike_workgroups_take_the_closed_form_schedule(grid):
    """Workgroups of equal iterations are priced in closed form (a first round at the cold prologue, then
    ceil(rest / slots) rounds), not by list-scheduling one entry per workgroup (the heuristic prices hundreds
    of candidates; an LM head's grid has tens of thousands of workgroups): the same time as the general
    scheduler, which a near-equal last workgroup forces."""
    cfg = GemmConfig(32, 64, 256, 2, head=32)
    feat = tiles.model_features(cfg, "bf16", "gfx950")
    alike = launch_time(feat, Launch(grid, 7, 1e8), "gfx950")
    listed = launch_time(feat, Launch(grid, (7,) * (grid - 1) + (7 + 1e-9,), 1e8), "gfx950")
    assert alike["t_issue"] == pytest.approx(listed["t_issue"], rel=1e-9) and alike["t_issue"] > 0
