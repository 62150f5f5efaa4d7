"""MoE kernels (translator_kernels/moe): top-k gating, the counting-sort permutation, the grouped
GEMM (the dense GEMM's kernel with the tile -> expert map) and the weighted un-permute, alone and as
the five launches of `moe_experts`; launches and numerics against plain-torch math."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import executors
from translator.tolerances import op_tol
from translator_kernels import moe as M
from translator_kernels.arch import ARCHS
from translator_kernels.gemm.gated import gated_shape



def _names(launches):
    return [r.kernel.rsplit("_", 1)[0] if hasattr(r, "kernel") else str(r) for r in launches]


@pytest.mark.parametrize("scoring,renorm,e,k,dt", [("softmax", True, 8, 2, torch.float32),
                                                    ("softmax", False, 64, 8, torch.bfloat16),
                                                    ("sigmoid", True, 16, 4, torch.float16)],
                         ids=["mixtral", "olmoe-bf16", "sigmoid-fp16"])
def test_topk_gating(scoring, renorm, e, k, dt):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(70, e, generator=g).to(dt)  # 70 tokens: two workgroups, the second masked
    with executors.current().run("gfx942") as ex:
        w, ids = M.topk_gating(ex.put(logits), k, scoring=scoring, renormalize=renorm)
    assert len(ex.launches) == 1
    rw, rids = M.ref_topk_gating(logits, k, scoring, renorm)
    w, ids = w.cpu(), ids.cpu()
    torch.testing.assert_close(w, rw, **op_tol(torch.float32))
    assert ids.dtype == torch.int64 and all(len(set(r)) == k for r in ids.tolist())
    # bf16 / fp16 logits tie often: the chosen experts must carry the reference's scores
    s = logits.float().softmax(-1) if scoring == "softmax" else logits.float().sigmoid()
    picked = s.gather(1, ids)
    torch.testing.assert_close(picked / picked.sum(-1, keepdim=True) if renorm else picked, rw,
                               **op_tol(torch.float32))
    if dt == torch.float32:  # no ties: the same experts in the same order
        assert torch.equal(ids, rids)


def test_group_limited_routing():
    """DeepSeek-V3 style: sigmoid scores, 8 groups of 4, the 3 best groups by their top-2 sum, top 4."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(33, 32, generator=g)
    with executors.current().run("gfx942") as ex:
        w, ids = M.topk_gating(ex.put(logits), 4, scoring="sigmoid", groups=8, topk_group=3, group_score="top2")
    rw, rids = M.ref_topk_gating(logits, 4, "sigmoid", True, 8, 3, "top2")
    assert torch.equal(ids.cpu(), rids)
    torch.testing.assert_close(w.cpu(), rw, **op_tol(torch.float32))
    assert len({int(i) // 4 for i in ids[0]}) <= 3  # the experts come from at most 3 groups


@pytest.mark.parametrize("t,k,e,bm", [(37, 3, 6, 16), (150, 2, 5, 32)])  # 111 pairs: one chunk; 300: two
def test_align_is_a_stable_counting_sort(t, k, e, bm):
    """Every pair gets one slot; an expert's slots are contiguous, in token order, padded to BM; every
    BM tile belongs to one expert; padding slots read row -1, slots past the real total -2. More than 256 pairs: the ids
    are staged through LDS in chunks of 256, the order holds across chunks."""
    g = torch.Generator().manual_seed(3)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    ids[:, 0] = 2  # a popular expert: more than one tile
    with executors.current().run("gfx942") as ex:
        src, tiles, pos = (x.cpu() for x in M.moe_align(ex.put(ids), e, bm))
    assert len(ex.launches) == 1
    assert src.shape[0] == M.capacity(t * k, e, bm) and tiles.shape[0] == src.shape[0] // bm
    flat = ids.reshape(-1)
    assert sorted(pos.tolist()) == sorted(set(pos.tolist()))  # one slot per pair
    assert torch.equal(src[pos.long()], torch.arange(t * k) // k)  # the slot holds the pair's token
    assert torch.equal(tiles[pos.long() // bm], flat.int())  # the slot's tile is the pair's expert
    off = 0
    for x in range(e):  # expert order, token order inside, padded to bm
        mine = (flat == x).nonzero().flatten()
        assert torch.equal(pos[mine].long(), torch.arange(off, off + len(mine)))
        off += -(-len(mine) // bm) * bm
    assert (src[off:] == -2).all() and (tiles[off // bm:] == -1).all()  # the tail: no gather, the GEMM tiles exit
    assert int((src == -1).sum()) == off - t * k  # the padding of the experts' last tiles
    assert int((src >= 0).sum()) == t * k
    with executors.current().run("gfx942") as ex:  # a rank holding experts 2, 3: the others' pairs get pos -1
        src2, _, pos2 = (x.cpu() for x in M.moe_align(ex.put(ids), 2, bm, first_expert=2))
    mine = (flat == 2) | (flat == 3)
    assert torch.equal(pos2 < 0, ~mine) and torch.equal(src2[pos2[mine].long()], (torch.arange(t * k) // k)[mine])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float32])
def test_moe_experts_five_launches(arch, dt):
    """The whole expert path on flysim: align, gather, the gated grouped GEMM, the down grouped GEMM and
    the un-permute (with a residual); MFMA counts are the real tiles' (the tail tile exits); numerics vs per-token torch."""
    g = torch.Generator().manual_seed(4)
    t, h, inter, e, k = 9, 64, 40, 4, 2  # I = 40: a column tail in both GEMMs
    x = torch.randn(t, h, generator=g).to(dt)
    res = torch.randn(t, h, generator=g).to(dt)
    w, ids = M.ref_topk_gating(torch.randn(t, e, generator=g), k)
    gu, dn = (torch.randn(e, 2 * inter, h, generator=g) / 8).to(dt), (torch.randn(e, h, inter, generator=g) / 8).to(dt)
    w13, w2 = M.prepare_experts(gu, dn)
    with executors.current().run(arch) as ex:
        out = M.moe_experts(ex.put(x), ex.put(w), ex.put(ids), ex.put(w13), ex.put(w2), inter, "silu",
                            residual=ex.put(res)).cpu()
    assert len(ex.launches) == 5, ex.launches
    want = res.float().clone()
    for ti in range(t):
        for j in range(k):
            x_ = ids[ti, j]
            hid = (F.silu(x[ti].float() @ gu[x_, :inter].float().T) * (x[ti].float() @ gu[x_, inter:].float().T))
            want[ti] += w[ti, j] * (hid.to(dt).float() @ dn[x_].float().T)
    torch.testing.assert_close(out.float(), want, **op_tol(dt, "gemm", reduction_length=h, scale=float(want.abs().max())))
    torch.testing.assert_close(out, M.ref_moe_experts(x, w, ids, w13, w2, inter, residual=res), **op_tol(dt))
    if ex.name == "flysim":
        from translator_kernels.gemm import expected_mfma_count

        cfg = M.grouped_config(-(-t * k // e), inter, h, dt, gated=True)
        real = M.real_tiles(ids, e, cfg.bm) * cfg.bm  # the tiles past them exit (moe/tile_exit.py)
        assert real < M.capacity(t * k, e, cfg.bm)
        up, down = ex.launches[2], ex.launches[3]
        assert sum(up.counters["mfma_by_kind"].values()) == expected_mfma_count(
            real, gated_shape(inter, h)[0], h, dt, arch, cfg)
        assert sum(down.counters["mfma_by_kind"].values()) > 0


def test_grouped_gemm_reads_each_tiles_expert():
    """Tiles of one permuted buffer routed to different experts: each tile's rows are multiplied by its
    own expert's weight (a wrong map would pick up another expert's numbers)."""
    g = torch.Generator().manual_seed(5)
    e, n, k, bm = 3, 64, 64, 16
    a = torch.randn(4 * bm, k, generator=g).bfloat16()
    wt = torch.randn(e, n, k, generator=g).bfloat16()
    from translator_kernels.gemm.preshuffle import shuffle_weight_batched

    tiles = torch.tensor([2, 0, 2, 1], dtype=torch.int32)
    with executors.current().run("gfx942") as ex:
        out = M.grouped_gemm(ex.put(a), ex.put(shuffle_weight_batched(wt)), ex.put(tiles), n, k,
                             M.grouped_config(bm, n, k, torch.bfloat16, False)).cpu()
    assert len(ex.launches) == 1
    want = torch.cat([a[i * bm:(i + 1) * bm].float() @ wt[int(x)].float().T for i, x in enumerate(tiles)])
    torch.testing.assert_close(out.float(), want, **op_tol(torch.bfloat16, "gemm", reduction_length=k,
                                                           scale=float(want.abs().max())))


def test_bad_inputs_name_the_fix():
    from translator_kernels.errors import KernelInputError

    with pytest.raises(KernelInputError, match="k=9 with E=8"):
        M.topk_gating(torch.randn(2, 8), 9)
    with pytest.raises(KernelInputError, match="groups must divide E"):
        M.topk_gating(torch.randn(2, 8), 2, groups=3)
    with pytest.raises(KernelInputError, match=r"\[E, 2I, H\]"):
        M.prepare_experts(torch.randn(2, 6, 4), torch.randn(2, 4, 4))


def test_expert_parallel_shares_add_up():
    """Expert parallel: rank r holds experts [2r, 2r + 2) of 4 (first_expert); pairs routed to the other
    rank get pos -1 and add nothing, so the two ranks' outputs sum to the whole layer's (what an
    all_reduce of the ranks gives)."""
    g = torch.Generator().manual_seed(6)
    t, h, inter, e, k = 6, 32, 48, 4, 2
    x = torch.randn(t, h, generator=g)
    w, ids = M.ref_topk_gating(torch.randn(t, e, generator=g), k)
    gu, dn = torch.randn(e, 2 * inter, h, generator=g) / 8, torch.randn(e, h, inter, generator=g) / 8
    outs = []
    with executors.current().run("gfx942") as ex:
        for r in range(2):
            w13, w2 = M.prepare_experts(gu[2 * r:2 * r + 2], dn[2 * r:2 * r + 2])
            outs.append(M.moe_experts(ex.put(x), ex.put(w), ex.put(ids), ex.put(w13), ex.put(w2), inter,
                                      first_expert=2 * r).cpu())
        _, _, pos = M.moe_align(ex.put(ids), 2, 16, first_expert=2)
    assert torch.equal(pos.cpu() < 0, (ids < 2).reshape(-1))
    w13, w2 = M.prepare_experts(gu, dn)
    torch.testing.assert_close(outs[0] + outs[1], M.ref_moe_experts(x, w, ids, w13, w2, inter),
                               **op_tol(torch.float32, "moe_experts"))
    torch.testing.assert_close(outs[1], M.ref_moe_experts(x, w, ids, *M.prepare_experts(gu[2:], dn[2:]), inter,
                                                          first_expert=2), **op_tol(torch.float32, "moe_experts"))
