"""The mid-M GEMM MODEL's terms (issue 29 item 3): how `head`'s partial K steps are priced, what split-K's partial
tiles cost under each variant, and which term of the MODEL stops each M (variants.model_terms). Pure Python."""

import pytest

from translator_kernels import gemm as G
from translator_kernels.arch import ARCHS
from translator_kernels.gemm import tiles, variants
from translator_kernels.timing import Launch, launch_time


def test_head_steps_are_priced_by_their_share_of_the_tile():
    """head's first and last K steps hold head / BK and (BK - head) / BK of a tile's MFMAs (the flysim test in
    test_gemm_head counts them): each costs less than a full step and at least the latency floor and the loop's
    vector work; before, the estimate charged nk + 1 full steps."""
    cfg = G.GemmConfig(64, 256, 128, 1, head=32)
    feat = tiles.model_features(cfg, "bf16", "gfx942")
    grid = 2048 // 64 * 4096 // 256
    parts = [tiles._partial_step(feat, f, grid, "gfx942") for f in (0.0, 0.25, 0.75, 1.0)]
    assert 0 < parts[0] <= parts[1] <= parts[2] < parts[3] == pytest.approx(1.0)
    e = tiles.model_estimate(2048, 4096, 4096, "bf16", "gfx942", cfg)
    nk = 4096 // 128
    full = [launch_time(feat, Launch(grid, n, e["bytes"]), "gfx942")["kernel_t"] for n in (nk, nk + 1)]
    assert full[0] < e["rank_t"] < full[1]  # the cycles (gfx942's measured matrix ceiling left out)


def test_plain_tile_is_priced_as_before():
    cfg = G.GemmConfig(32, 256, 128, 2)
    e = tiles.model_estimate(512, 4096, 4096, "bf16", "gfx950", cfg)
    feat = tiles.model_features(cfg, "bf16", "gfx950")
    r = launch_time(feat, Launch(e["grid"], 4096 // 128 // 2, e["bytes"],
                                 l2_bytes=tiles.l2_bytes(512, 4096, 4096, "bf16", cfg)), "gfx950")
    assert e["kernel_t"] == pytest.approx(r["kernel_t"])


def test_partials_are_charged_as_stored():
    """split 4: the three splits that do not draw the last ticket store their partial tiles and the last one
    reads them back (splitk.py); before issue 29's change every split stored (4 written, 3 read). "free": none."""
    cfg = G.GemmConfig(64, 128, 256, 4)
    w, r = tiles.partial_bytes(256, 4096, 4096, cfg)
    assert w == r == 3 * 256 * 4096 * 4
    b = {p: tiles.model_estimate(256, 4096, 4096, "bf16", "gfx950", cfg, partials=p)["bytes"] for p in ("all", "free")}
    assert b["all"] - b["free"] == w + r


@pytest.mark.parametrize("arch", ARCHS)
def test_model_terms_name_what_stops_mid_m(arch):
    """N = K = 4096: from M = 512 up the chosen tile is issue- or L2-bound (gfx942 M = 512: 32x256x128 split 2 at
    t_l2 27.4 us, t_issue 26.1; the 64x256 tile ties it within 2 %, issue-bound), split-K's partials cost it
    nothing, and A's LDS traffic (OVERLAP = 0: the MFMAs and the LDS reads do not overlap) is the largest term
    after the MFMAs at M = 2048; at M = 256 the split-K partials and the XCD re-reads bind (t_mem)."""
    for m in (512, 2048):
        cfg = G.choose_config(m, 4096, 4096, "bf16", arch)
        r = variants.model_terms(m, 4096, 4096, "bf16", arch, cfg)
        t = r["terms"]
        # the cycles at the boost clock (rank_t); on gfx942 from M = 1024 up the measured matrix ceiling (AMD's
        # Max-Achievable FLOPs, 708 TFLOPS bf16) is the kernel time instead: t_maf
        assert r["binds"] in ("t_issue", "t_l2") and r["t_issue"] >= 0.95 * r["rank_t"]
        if arch == "gfx942" and m == 2048:
            assert r["bound"] == "MAF" and r["kernel_t"] == pytest.approx(2.0 * m * 4096 * 4096 / 708e12)
            assert r["kernel_t"] > r["rank_t"]
        assert r["gain_without"]["partials"] < 0.02 * r["kernel_t"]
        assert all(v >= 0 for v in t.values()) and r["mfma_and_rest"] > 0
        assert r["mfma_and_rest"] + sum(t.values()) == pytest.approx(r["t_issue"])
        assert r["mfma_and_rest"] >= r["flop_floor"] * 0.95
        if m == 2048:
            assert t["lds"] == max(t.values()) and r["binds"] == "t_issue"
    # M = 256: the split-K partials and the XCD re-reads (gemm/xcd.py) put t_mem at or within 2 % of t_issue
    r = variants.model_terms(256, 4096, 4096, "bf16", arch, G.choose_config(256, 4096, 4096, "bf16", arch))
    assert r["partial_t"] > 0 and r["t_mem"] >= 0.98 * r["t_issue"] and r["binds"] in ("t_mem", "t_issue")


def test_m256_with_one_partial_tile_fewer():
    """gfx950 M = 256: the W register ring (32x256x256 split 2 head 32 ring: kernel.py `ring`) once reached 0.82 of the
    achievable bandwidth without the XCD re-reads. Under the L2 term its 16 row tiles read W 16 times through the L2s
    (t_l2 12.0 us against t_mem 9.6 without re-reads: 0.66); the plain 64x128x256 split 2 head 32 loads half of
    that (t_l2 8.0 us) and binds t_mem (10.6 us with the 6 MB of A that the 4 XCDs of each split read): 0.74, short
    of issue 29's 0.8."""
    from translator_kernels.arch import GPUS
    from translator_kernels.gemm import tiles

    ring = G.GemmConfig(32, 256, 256, split=2, head=32, ring=True)
    free = tiles.model_estimate(256, 4096, 4096, "bf16", "gfx950", ring,
                                consts=dict(GPUS["gfx950"].timing, reread_efficiency=1e30))
    assert free["t_l2"] > free["t_mem"] > free["t_issue"] and free["of_achievable"] < 0.7
    cfg = G.choose_config(256, 4096, 4096, "bf16", "gfx950")
    r = variants.model_terms(256, 4096, 4096, "bf16", "gfx950", cfg)
    assert (cfg.bm, cfg.bn, cfg.bk, cfg.split) == (64, 128, 256, 2) and r["binds"] == "t_mem"
    assert 0.73 < r["of_achievable"] < 0.76 and r["t_l2"] < r["t_mem"]
