"""The XCD-grouped launch order (translator_kernels/gemm/xcd.py): the remap is a bijection for every grid, the
GEMM stays exact on grids that are not a multiple of the 8 XCDs (and smaller than 8), split-K on and off, and
the timing model's re-read bytes for the order are what an enumeration of the launch gives."""

from __future__ import annotations

import pytest
import torch

from test_gemm_schedule import TOL, _case, _ref, _run
from translator_kernels import gemm as G
from translator_kernels.gemm.xcd import xcd_logical, xcd_ranges, xcd_tile


@pytest.mark.parametrize("xcds", [8, 1, 3])
def test_remap_is_a_bijection(xcds):
    for g in range(1, 301):
        assert sorted(xcd_logical(p, g, xcds) for p in range(g)) == list(range(g)), g


def test_one_xcd_takes_consecutive_tiles_that_share_w():
    """G = 20: XCD x = id % 8 takes logical [s_x, s_x + c_x), counts 3,3,3,3,2,2,2,2, in hardware-id order."""
    assert xcd_ranges(20) == [(0, 3), (3, 6), (6, 9), (9, 12), (12, 14), (14, 16), (16, 18), (18, 20)]
    for x, (s, e) in enumerate(xcd_ranges(20)):
        assert [xcd_logical(p, 20) for p in range(x, 20, 8)] == list(range(s, e))
    # 5 row tiles x 4 column tiles: XCD 0 computes rows 0-2 of column tile 0 (one W block, three A blocks)
    assert [xcd_tile(p % 5, p // 5, 5, 4) for p in range(0, 20, 8)] == [(0, 0), (1, 0), (2, 0)]


def _brute_grouped(m, n, k, ea, ew, bm, bn, xcds, split):
    """Enumerate the launch: hardware id p lands on XCD p % xcds and computes the tile xcd_tile gives it."""
    gx, nt = -(-m // bm), -(-n // bn)
    w_on, a_on = {}, {}
    for p in range(gx * nt * split):
        x, y = xcd_tile(p % gx, p // gx, gx, nt * split, xcds)
        w_on.setdefault(y, set()).add(p % xcds)
        a_on.setdefault((x, y // nt), set()).add(p % xcds)
    ks = k / split
    return (sum(len(s) - 1 for s in w_on.values()) * bn * ks * ew
            + sum(len(s) - 1 for s in a_on.values()) * bm * ks * ea)


def test_grouped_rereads_match_the_enumerated_launch():
    from translator_kernels.timing import xcd_reread_bytes

    for m, n, k, bm, bn, split in ((128, 7168, 2048, 16, 64, 1), (256, 4096, 4096, 64, 128, 2), (16, 4096, 4096, 16, 16, 4),
                                   (33, 1024, 2048, 16, 64, 1), (5120, 5120, 8320, 64, 256, 1), (96, 640, 512, 32, 64, 3),
                                   (40, 72, 512, 16, 64, 2), (20, 72, 256, 16, 64, 1), (2048, 4096, 4096, 64, 256, 1)):
        want = _brute_grouped(m, n, k, 1, 2, bm, bn, 8, split)
        assert xcd_reread_bytes(m, n, k, 1, 2, bm, bn, 8, split, grouped=True) == want, (m, n, bm, bn, split)
        assert want <= xcd_reread_bytes(m, n, k, 1, 2, bm, bn, 8, split)  # never more than the hardware order here
    # M = 128 on 16x64 tiles: 8 row tiles per W block; rows first puts each W block on all 8 XCDs (7 more reads of
    # all of W), grouped on one XCD (no W again)
    assert xcd_reread_bytes(128, 7168, 2048, 1, 2, 16, 64, 8) >= 7 * 7168 * 2048 * 2
    assert xcd_reread_bytes(128, 7168, 2048, 1, 2, 16, 64, 8, grouped=True) < 7168 * 2048 * 2 / 8


def test_model_estimate_prices_the_grouped_rereads():
    from translator_kernels.arch import GPUS
    from translator_kernels.gemm.tiles import model_estimate

    cfg = G.GemmConfig(16, 64, 512, split=1)
    t = GPUS["gfx942"].timing
    free = model_estimate(2048, 4096, 4096, "bf16", "gfx942", cfg, consts=dict(t, reread_efficiency=1e30))
    priced = model_estimate(2048, 4096, 4096, "bf16", "gfx942", cfg)
    assert priced["t_mem"] > free["t_mem"]


# grids (row tiles x split x column tiles): 2x1x2 = 4 (< 8), 3x2x2 = 12, 5x1x4 = 20, 1x4x3 = 12 (kw = 4)
CASES = [(20, 72, 256, G.GemmConfig(16, 64, 128, split=1), "gfx942"),
         (40, 72, 512, G.GemmConfig(16, 64, 128, split=2), "gfx950"),
         (72, 200, 256, G.GemmConfig(16, 64, 128, split=1), "gfx950"),
         (5, 40, 512, G.GemmConfig(16, 16, 128, split=4, kw=4), "gfx942")]


@pytest.mark.parametrize("m,n,k,cfg,arch", CASES, ids=lambda x: x if isinstance(x, str) else None)
def test_gemm_on_grids_not_a_multiple_of_8(m, n, k, cfg, arch):
    from translator_kernels.gemm import padded_shape

    g = -(-m // cfg.bm) * -(-padded_shape(n, k)[0] // cfg.bn) * cfg.split
    assert g % 8 != 0
    a, w, b, r = _case(m, n, k, torch.bfloat16, seed=m)
    out, launches = _run(arch, a, w, cfg, bias=b, residual=r, activation="silu", scale=0.5)
    assert len(launches) == 1
    torch.testing.assert_close(out.float(), _ref(a, w, b, r).to(torch.bfloat16).float(), **TOL[torch.bfloat16])
