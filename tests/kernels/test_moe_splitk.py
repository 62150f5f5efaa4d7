"""Split-K in the grouped GEMM (translator_kernels/moe/grouped.py): decode's down projection has few row
tiles and a long K; its splits meet inside the launch (gemm/splitk.py) with the tile map in the residual
slot. Numerics against the unsplit launch and torch, the counters handed back, and the choice."""

from __future__ import annotations

import pytest
import torch

import executors
from translator.tolerances import op_tol
from translator_kernels import moe as M
from translator_kernels.gemm.preshuffle import shuffle_weight_batched
from translator_kernels.gemm.tiles import GemmConfig
from translator_kernels.errors import KernelInputError


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_grouped_split_k_adds_each_tiles_expert(arch):
    g = torch.Generator().manual_seed(7)
    e, n, k, bm = 3, 64, 512, 16
    a = torch.randn(3 * bm, k, generator=g).bfloat16()
    wt = (torch.randn(e, n, k, generator=g) / 8).bfloat16()
    tiles = torch.tensor([2, 0, 1], dtype=torch.int32)
    want = torch.cat([a[i * bm:(i + 1) * bm].float() @ wt[int(x)].float().T for i, x in enumerate(tiles)])
    outs = {}
    with executors.current().run(arch) as ex:
        for split in (1, 4):
            outs[split] = M.grouped_gemm(ex.put(a), ex.put(shuffle_weight_batched(wt)), ex.put(tiles), n, k,
                                         GemmConfig(bm, 64, 64, split)).cpu()
    assert len(ex.launches) == 2, ex.launches
    tol = op_tol(torch.bfloat16, "gemm", reduction_length=k, scale=float(want.abs().max()))
    torch.testing.assert_close(outs[4].float(), want, **tol)
    torch.testing.assert_close(outs[4].float(), outs[1].float(), **tol)
    if ex.name == "flysim":  # the same MFMAs, over 4x the workgroups
        one, four = (sum(r.counters["mfma_by_kind"].values()) for r in ex.launches)
        assert one == four > 0
        assert ex.launches[1].grid[1] == 4 * ex.launches[0].grid[1], [r.grid for r in ex.launches]


def test_split_k_counters_come_back_zero():
    """Every split-K launch leaves its ticket counters zero and hands them back (gemm/splitk.py's pool)."""
    from translator_kernels.gemm import splitk

    g = torch.Generator().manual_seed(8)
    a = torch.randn(32, 256, generator=g).bfloat16()
    w = shuffle_weight_batched((torch.randn(2, 64, 256, generator=g) / 8).bfloat16())
    tiles = torch.tensor([1, 0], dtype=torch.int32)
    with executors.current().run("gfx942") as ex:
        for _ in range(2):
            M.grouped_gemm(ex.put(a), ex.put(w), ex.put(tiles), 64, 256, GemmConfig(16, 64, 64, 2))
    pool = [c for cs in splitk._POOL.values() for c in cs]
    assert pool and all(int(c.abs().sum()) == 0 for c in pool)


def test_moe_experts_splits_decodes_down_projection(monkeypatch):
    """moe_experts at T = 1 (2 row tiles) with a long intermediate size: the down GEMM runs split-K, the
    result equals the per-token torch math."""
    seen = []
    real = M.grouped_gemm

    def spy(a, w, tile_expert, n, k, cfg, **kw):
        seen.append(cfg.split)
        return real(a, w, tile_expert, n, k, cfg, **kw)

    monkeypatch.setattr(M, "grouped_gemm", spy)
    g = torch.Generator().manual_seed(9)
    t, h, inter, e, k = 1, 64, 1024, 4, 2
    x = torch.randn(t, h, generator=g).bfloat16()
    w, ids = M.ref_topk_gating(torch.randn(t, e, generator=g), k)
    gu, dn = (torch.randn(e, 2 * inter, h, generator=g) / 8).bfloat16(), (torch.randn(e, h, inter, generator=g) / 8).bfloat16()
    w13, w2 = M.prepare_experts(gu, dn)
    with executors.current().run("gfx942") as ex:
        out = M.moe_experts(ex.put(x), ex.put(w), ex.put(ids), ex.put(w13), ex.put(w2), inter, "silu").cpu()
    assert seen == [1, 2], seen  # gate/up (gated epilogue: no split), down: 16 K tiles in 2 splits
    assert len(ex.launches) == 5
    torch.testing.assert_close(out, M.ref_moe_experts(x, w, ids, w13, w2, inter), **op_tol(torch.bfloat16))


def test_grouped_split_choice():
    """Mixtral-8x7B decode (T = 1, k = 2: 2 row tiles, N = 4096, K = 14336): split 4 on MI300X (64 -> 256 of 304
    CUs); a grid that fills the GPU (prefill) or a short K stays unsplit."""
    cfg = M.grouped_config(1, 4096, 14336, torch.bfloat16, gated=False)
    assert M.grouped_split(2, 4096, 14336, GemmConfig(16, cfg.bn, cfg.bk), "gfx942").split == 4
    assert M.grouped_split(128, 4096, 14336, GemmConfig(128, cfg.bn, cfg.bk), "gfx942").split == 1
    assert M.grouped_split(2, 4096, 256, GemmConfig(16, cfg.bn, cfg.bk), "gfx942").split == 1
    with pytest.raises(KernelInputError, match="no gate, no bias"):
        M.grouped_gemm(torch.zeros(16, 64), torch.zeros(1, 64, 64), torch.zeros(1, dtype=torch.int32), 64, 64,
                       GemmConfig(16, 64, 32, 2), bias=torch.zeros(1, 64))
