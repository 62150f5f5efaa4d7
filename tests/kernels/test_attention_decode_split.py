"""Decode attention's slice count from the timing MODEL, and the split-KV merge's batched loads (issue 23).

split_geometry asks attention/decode_plan.model_split for the slice count the MODEL prices fastest (the
features of our compiled decode kernel, checked in as measure/decode_attention_isa.json); without features it
keeps the grid rule (2x the CUs). The merge (fwd.merge_rows) folds the slices in batches whose loads are issued
together, several row passes where a wave has more rows than a pass: here more slices than a batch and more
rows than a pass, against SDPA, in one launch, with the same bits whichever slice merges.
"""

from __future__ import annotations

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
import flysim.ops_atomic
from translator.tolerances import op_tolerance
from translator_kernels.arch import GPUS, NAMED_DTYPES
from translator_kernels.attention import CUS, attention, split_geometry
from translator_kernels.attention import decode_plan as dp
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
    assert dp.decode_plan(1, 32, 8, ctx, 128, "bf16", arch)["grid"] == (n, 8, 1)
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


def _sdpa(q, k, v, pos=None, sinks=None):
    rep = q.shape[1] // k.shape[1]
    q, k, v = q.float(), k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if pos is not None:
        s = s.masked_fill(torch.arange(k.shape[2]) > pos, float("-inf"))
    if sinks is None:
        return torch.softmax(s, -1) @ v
    col = sinks.float().view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
    return torch.softmax(torch.cat([s, col], -1), -1)[..., :-1] @ v


def _reversed_tickets(monkeypatch):
    """flysim hands an atomic's tickets out in workgroup order; reversed, slice 0 draws the last one."""
    real = flysim.ops_atomic.serialize

    def serialize(kind, addr, x, read, write, bits, need_old=True):
        old = real(kind, addr.flip(0), x.flip(0), read, write, bits, need_old)
        return None if old is None else old.flip(0)

    monkeypatch.setattr(flysim.ops_atomic, "serialize", serialize)


@pytest.mark.flysim_only("reorders flysim's atomics")
@pytest.mark.parametrize("dtype,D,splits,sinks", [
    ("bf16", 128, 20, False),  # 8 packed rows: 2 passes of 4; 20 slices: batches of 8, 8 and 4 (+4 re-read)
    ("f32", 64, 19, True),     # 2 passes of 4 rows, batches of 16 and 3; sinks added once, in the merge
])
def test_merge_batches_and_passes_match_sdpa(monkeypatch, dtype, D, splits, sinks):
    dt = NAMED_DTYPES[dtype]
    g = torch.Generator().manual_seed(3)
    H, Hkv, Sk, pos = 16, 2, 64 * splits, 64 * splits - 90   # the last slices are empty (past the position)
    q = torch.randn(1, H, 1, D, generator=g).to(dt)
    k = torch.randn(1, Hkv, Sk, D, generator=g).to(dt)
    v = torch.randn(1, Hkv, Sk, D, generator=g).to(dt)
    sink_t = torch.linspace(-1.0, 2.0, H) if sinks else None
    q_pos = torch.tensor([pos])
    assert merge_trips(D, H // Hkv, splits) >= 4
    outs = []
    for reverse in (False, True):
        with monkeypatch.context() as mp:
            if reverse:
                _reversed_tickets(mp)
            with executors.current().run("gfx950") as ex:
                outs.append(attention(ex.put(q), ex.put(k), ex.put(v), num_splits=splits, q_pos=ex.put(q_pos),
                                      sinks=None if sink_t is None else ex.put(sink_t)).cpu())
            assert [ln.kernel.rsplit("_", 1)[0] for ln in ex.launches] == ["attention_fwd_kernel"]
    assert torch.equal(outs[0], outs[1])  # the merge adds in slice order, whoever merges
    atol, rtol = op_tolerance(dt, "attention")
    torch.testing.assert_close(outs[0].float(), _sdpa(q, k, v, pos, sink_t), atol=atol, rtol=rtol)
