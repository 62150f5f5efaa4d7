"""Decode attention's slice count from the timing MODEL, and the split-KV merge's batched loads (issue 23).

split_geometry asks attention/split_model.model_split for the slice count the MODEL prices fastest (the
features of our compiled decode kernel, checked in as measure/decode_attention_isa.json); without features it
keeps the grid rule (2x the CUs). The merge's lane plan and round trips (tiles.merge_geometry, merge_trips); its
numerics with several batches and row passes: test_attention_splitkv.py.
"""

from __future__ import annotations

import pytest

from translator_kernels.arch import GPUS
from translator_kernels.attention import CUS, split_geometry
from translator_kernels.attention import split_model as dp
from translator_kernels.attention.decode_plan import decode_plan
from translator_kernels.attention.tiles import merge_geometry, merge_trips


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("ctx", [2048, 8192])
def test_llama3_split_is_the_models_cheapest(arch, ctx):
    """Llama-3-8B batch 1 (8 KV heads, 4 packed query rows, D 128, bf16): the chosen count prices no slower than
    any other candidate, split_geometry and decode_plan take it, and it is deterministic."""
    n, chunk = dp.model_split(1, 8, 4, ctx, 128, "bf16", arch)
    feats = dp.cached_features(arch, "bf16", 128)
    assert feats is not None
    best = dp.price(*feats, 1, 8, 4, ctx, 128, "bf16", arch, n, chunk)["kernel_t"]
    tiles = ctx // 64
    for m in dp.candidates(tiles, 8 * GPUS[arch].cus // 8):
        per = -(-tiles // m)
        assert dp.price(*feats, 1, 8, 4, ctx, 128, "bf16", arch, m, per * 64)["kernel_t"] >= best * (1 - 1e-9), m
    assert split_geometry(1, 8, 4, ctx, 128, "bf16", arch) == (n, chunk)
    assert decode_plan(1, 32, 8, ctx, 128, "bf16", arch)["grid"] == (n, 8, 1)
    dp.model_split.cache_clear()
    assert dp.model_split(1, 8, 4, ctx, 128, "bf16", arch) == (n, chunk)
    # not the grid rule's 2x the CUs (MI300X 8k: 128 slices of one or two tiles)
    assert n < -(-2 * CUS[arch] // 8)


def test_without_features_the_grid_rule_stays(monkeypatch):
    dp.model_split.cache_clear()
    monkeypatch.setattr(dp, "cached_features", lambda *a: None)
    try:
        assert split_geometry(1, 8, 4, 8192, 128, "bf16", "gfx942") == (128, 64)  # 76 wanted: one tile per slice
        assert split_geometry(1, 8, 4, 2048, 128, "bf16", "gfx950") == (32, 64)
    finally:
        dp.model_split.cache_clear()


def test_merge_geometry_and_trips():
    assert merge_geometry(128) == dict(cpl=8, lpr=16, rpp=4, slices=8)
    assert merge_geometry(64) == dict(cpl=4, lpr=16, rpp=4, slices=16)
    assert merge_geometry(40) == dict(cpl=4, lpr=12, rpp=5, slices=16)   # padded to 48: 60 lanes busy
    assert merge_trips(128, 4, 16) == 2 and merge_trips(128, 4, 8) == 1 and merge_trips(128, 8, 20) == 6
    assert merge_trips(64, 16, 16) == 4 and merge_trips(64, 0, 16) == 0


@pytest.mark.parametrize("arch", ["gfx942", pytest.param("gfx950", marks=pytest.mark.slow)])
def test_merge_loads_are_issued_together(arch):
    """Llama-3-8B's split decode kernel (COMPILE_ONLY child): the merge's batch loop issues every load of its
    8 slices (m and l, two 16-byte O loads each) before its first vmcnt wait, so a batch is one round trip;
    no spills, 2 waves per SIMD (186 / 196 VGPRs)."""
    import re

    from translator_kernels.hotloop import _kernel_lines, compile_isa_texts, find_loops, main_text
    from translator_kernels.isa import parse_isa
    from translator_kernels.measure.decode_isa import DECODE_ATTENTION

    text = main_text(compile_isa_texts(DECODE_ATTENTION, (1, 32, 8, 128, 8192, 16), arch=arch))
    stats = max(parse_isa(text, arch), key=lambda s: s.instructions)
    assert stats.meta["vgpr_spill"] == 0 and stats.occupancy[0] >= 2, stats.meta
    lines = _kernel_lines(text, stats.kernel)
    g = merge_geometry(128)
    batch = [lp for lp in find_loops(text, stats.kernel) if not lp.cycles(arch)["matrix_cycles"]]
    inner = min(batch, key=lambda lp: lp.end - lp.start)
    issued, first_wait = 0, None
    for ln in lines[inner.start:inner.end + 1]:
        s = ln.strip()
        issued += bool(re.match(r"(buffer|global)_load", s))
        if first_wait is None and s.startswith("s_waitcnt") and "vmcnt" in s:
            first_wait = issued
    assert issued == first_wait == g["slices"] * (1 + g["cpl"] // 4)
