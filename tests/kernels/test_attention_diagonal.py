"""Causal diagonal tiles, per wave (issue 29, item 4): a wave skips the math of a diagonal tile
whose first key is past its last row (it only stages the tile in LDS for the other waves).

flysim counts the MFMAs the kernel executed; bench.attention_diagonal's tile plan (the MODEL's
counts) says how many wave-iterations run unmasked, diagonal or skipped. The executed MFMAs must
be exactly (unmasked + diagonal live) x the MFMAs of one iteration (68 / 72 / 68 / 36: see
test_attention_hotloop.py), fewer than without the skip (on flysim: counters exist only there,
`ex.counts`), and the output SDPA's on any executor (tests/executors.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tolerance
from translator_kernels.attention import attention
from translator_kernels.measure.attention_diagonal import tile_counts


@pytest.mark.parametrize("arch,d,per_iter", [("gfx942", 128, 68), ("gfx950", 128, 68), ("gfx942", 64, 72),
                                             ("gfx950", 64, 36)])
def test_dead_diagonal_tiles_skip_their_math(arch, d, per_iter):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 256, d, generator=g).bfloat16() for _ in range(3))
    with executors.current().run(arch) as ex:
        out = attention(ex.put(q), ex.put(k), ex.put(v), causal=True).cpu()
    (rec,) = ex.launches
    n, before = tile_counts(arch, d, 256, skip=True), tile_counts(arch, d, 256, skip=False)
    assert n["skip"] > 0
    if ex.counts:  # flysim counts the MFMAs it executed
        ran = sum(rec.counters["mfma_by_kind"].values())
        assert ran == (n["steady"] + n["diagonal"]) * per_iter < (before["steady"] + before["diagonal"]) * per_iter
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    atol, rtol = op_tolerance(torch.bfloat16, "attention")
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=rtol)
