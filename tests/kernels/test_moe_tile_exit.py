"""Early exit of the grouped GEMM's tiles past the real rows (translator_kernels/moe/tile_exit.py).

The grid covers the worst-case row count; the align kernel marks the tiles past the real padded total
with -1 in the tile map, on the device, and their workgroups exit before any load. flysim's counters
show it: a launch with tail tiles executes exactly the MFMAs, writes exactly the bytes and reads the same
bytes as the launch over the real tiles alone, plus one tile-map word per lane of each exiting workgroup
(no A, W or bias byte). Numerics against torch. Also with routing that leaves experts empty, and under
split-K, where the ticket counters must stay right for the next launch."""

from __future__ import annotations

import pytest
import torch

import executors
from translator.tolerances import op_tol
from translator_kernels import moe as M
from translator_kernels.arch import ARCHS
from translator_kernels.gemm.preshuffle import shuffle_weight_batched
from translator_kernels.gemm.tiles import GemmConfig

THREADS = 256  # lanes of a GEMM workgroup: each reads its tile's map word (4 bytes)


def _mfma(rec):
    return sum(rec.counters["mfma_by_kind"].values())


def _with_and_without_tail(arch, cfg, gate=None, bias=None, n=64, k=256):
    """Two launches of one GEMM: 4 row tiles of which 2 are past the real rows (map -1), and the 2 real
    tiles alone. Returns (their outputs, their launch records, the torch result of the real rows)."""
    g = torch.Generator().manual_seed(11)
    bm, e = cfg.bm, 3
    a = torch.cat([torch.randn(2 * bm, k, generator=g), torch.zeros(2 * bm, k)]).bfloat16()
    if gate:
        wg, wu = (torch.randn(e, n, k, generator=g) / 8).bfloat16(), (torch.randn(e, n, k, generator=g) / 8).bfloat16()
        from translator_kernels.gemm.gated import gated_weight

        w = torch.stack([gated_weight(wg[j], wu[j]) for j in range(e)])
    else:
        wt = (torch.randn(e, n, k, generator=g) / 8).bfloat16()
        w = shuffle_weight_batched(wt)
    live = torch.tensor([2, 0], dtype=torch.int32)
    with executors.current().run(arch) as ex:
        tail = M.grouped_gemm(ex.put(a), ex.put(w), ex.put(torch.tensor([2, 0, -1, -1], dtype=torch.int32)), n, k,
                              cfg, gate=gate, bias=None if bias is None else ex.put(bias)).cpu()
        real = M.grouped_gemm(ex.put(a[:2 * bm]), ex.put(w), ex.put(live), n, k, cfg, gate=gate,
                              bias=None if bias is None else ex.put(bias)).cpu()
    rows = []
    for i, x in enumerate(live.tolist()):
        ai = a[i * bm:(i + 1) * bm].float()
        if gate:
            y = torch.nn.functional.silu(ai @ wg[x].float().T) * (ai @ wu[x].float().T)
        else:
            y = ai @ wt[x].float().T + (0.0 if bias is None else bias[x])
        rows.append(y)
    return (tail, real), ex, torch.cat(rows)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
def test_tail_tiles_read_no_weight_and_run_no_mfma(arch, gated):
    bm, n, k = 16, 64, 256
    cfg = GemmConfig(bm, 128 if gated else 64, 64)
    bias = None if gated else torch.randn(3, n, generator=torch.Generator().manual_seed(3))
    (tail, real), ex, want = _with_and_without_tail(arch, cfg, "silu" if gated else None, bias, n, k)
    tol = op_tol(torch.bfloat16, "gemm", reduction_length=k, scale=float(want.abs().max()))
    torch.testing.assert_close(tail[:2 * bm].float(), want, **tol)
    assert torch.equal(tail[:2 * bm], real)
    if ex.counts:
        with_tail, alone = ex.launches
        assert _mfma(with_tail) == _mfma(alone) > 0
        col_tiles = with_tail.grid[1]
        assert with_tail.counters["global_bytes_written"] == alone.counters["global_bytes_written"]
        extra = with_tail.counters["global_bytes_read"] - alone.counters["global_bytes_read"]
        assert extra == 2 * col_tiles * THREADS * 4, extra  # the exiting workgroups' tile-map words only


def test_moe_experts_with_empty_experts():
    """Routing that reaches 2 of 6 experts: the grid is sized for 6 non-empty experts, the tiles of the 4
    empty ones' share exit; both GEMMs run the real tiles' MFMAs only, the result is the per-token math."""
    g = torch.Generator().manual_seed(12)
    t, h, inter, e, k = 12, 64, 64, 6, 2
    x = torch.randn(t, h, generator=g).bfloat16()
    ids = torch.tensor([[1, 4]] * 7 + [[4, 1]] * 5)
    w = torch.rand(t, k, generator=g)
    w = w / w.sum(-1, keepdim=True)
    gu, dn = (torch.randn(e, 2 * inter, h, generator=g) / 8).bfloat16(), (torch.randn(e, h, inter, generator=g) / 8).bfloat16()
    w13, w2 = M.prepare_experts(gu, dn)
    with executors.current().run("gfx942") as ex:
        out = M.moe_experts(ex.put(x), ex.put(w), ex.put(ids), ex.put(w13), ex.put(w2), inter, "silu").cpu()
    assert len(ex.launches) == 5
    torch.testing.assert_close(out, M.ref_moe_experts(x, w, ids, w13, w2, inter), **op_tol(torch.bfloat16))
    if ex.counts:
        from translator_kernels.gemm import expected_mfma_count
        from translator_kernels.gemm.gated import gated_shape
        from translator_kernels.gemm.preshuffle import padded_shape

        cfg = M.grouped_config(-(-t * k // e), inter, h, torch.bfloat16, gated=True)
        cap, real = M.capacity(t * k, e, cfg.bm), M.real_tiles(ids, e, cfg.bm)
        assert real == 2 and cap // cfg.bm == 8, (real, cap)
        up, down = ex.launches[2], ex.launches[3]
        assert _mfma(up) == expected_mfma_count(real * cfg.bm, gated_shape(inter, h)[0], h, torch.bfloat16, "gfx942", cfg)
        dn_cfg = M.grouped_config(-(-t * k // e), h, inter, torch.bfloat16, gated=False)
        assert _mfma(down) == expected_mfma_count(real * cfg.bm, padded_shape(h, inter)[0], inter, torch.bfloat16,
                                                  "gfx942", GemmConfig(cfg.bm, dn_cfg.bn, dn_cfg.bk))


def test_split_k_tail_tiles_leave_the_tickets_right():
    """Split-K with tail tiles: every split of a tail tile exits, so none draws a ticket; the counters come back
    zero, and the next launch on the same counters, whose tiles are all live, adds every tile (a wrong counter
    would leave a tile without a last arriver: its rows never written)."""
    from translator_kernels.gemm import splitk

    g = torch.Generator().manual_seed(13)
    bm, n, k, e = 16, 64, 1024, 2
    a = torch.randn(4 * bm, k, generator=g).bfloat16()
    wt = (torch.randn(e, n, k, generator=g) / 8).bfloat16()
    w = shuffle_weight_batched(wt)
    cfg = GemmConfig(bm, 64, 64, 4)
    maps = [torch.tensor([1, -1, 0, -1], dtype=torch.int32), torch.tensor([0, 1, 1, 0], dtype=torch.int32)]
    splitk._POOL.clear()
    outs = []
    with executors.current().run("gfx942") as ex:
        for tmap in maps:
            outs.append(M.grouped_gemm(ex.put(a), ex.put(w), ex.put(tmap), n, k, cfg).cpu())
    pool = [c for cs in splitk._POOL.values() for c in cs]
    assert len(pool) == 1 and int(pool[0].abs().sum()) == 0  # one array, used by both launches, zero again
    for out, tmap in zip(outs, maps):
        live = [i for i, x in enumerate(tmap.tolist()) if x >= 0]
        want = torch.cat([a[i * bm:(i + 1) * bm].float() @ wt[int(tmap[i])].float().T for i in live])
        got = torch.cat([out[i * bm:(i + 1) * bm] for i in live]).float()
        torch.testing.assert_close(got, want, **op_tol(torch.bfloat16, "gemm", reduction_length=k,
                                                       scale=float(want.abs().max())))
    if ex.counts:
        assert 2 * _mfma(ex.launches[0]) == _mfma(ex.launches[1]) > 0


def test_moe_experts_split_k_decode_with_tail_tiles():
    """Decode of 2 tokens routed to the same 2 of 4 experts: 4 row tiles in the grid, 2 real; the down
    projection runs split-K (16 K tiles in 2 splits) over them; the result is the per-token math."""
    g = torch.Generator().manual_seed(14)
    t, h, inter, e, k = 2, 64, 1024, 4, 2
    x = torch.randn(t, h, generator=g).bfloat16()
    ids = torch.tensor([[3, 0], [0, 3]])
    w = torch.tensor([[0.75, 0.25], [0.4, 0.6]])
    gu, dn = (torch.randn(e, 2 * inter, h, generator=g) / 8).bfloat16(), (torch.randn(e, h, inter, generator=g) / 8).bfloat16()
    w13, w2 = M.prepare_experts(gu, dn)
    with executors.current().run("gfx942") as ex:
        out = M.moe_experts(ex.put(x), ex.put(w), ex.put(ids), ex.put(w13), ex.put(w2), inter, "silu").cpu()
    assert M.grouped_split(4, h, inter, GemmConfig(16, 64, 64), "gfx942").split == 2
    assert M.capacity(t * k, e, 16) // 16 == 4 and M.real_tiles(ids, e, 16) == 2
    torch.testing.assert_close(out, M.ref_moe_experts(x, w, ids, w13, w2, inter), **op_tol(torch.bfloat16))
    if ex.counts:
        from translator_kernels.gemm import expected_mfma_count
        from translator_kernels.gemm.gated import gated_shape

        up, down = ex.launches[2], ex.launches[3]
        assert up.grid[0] == down.grid[0] == 4 and down.grid[1] == 2  # 4 row tiles launched; down: 1 column tile x 2
        assert _mfma(up) == expected_mfma_count(32, gated_shape(inter, h)[0], h, torch.bfloat16, "gfx942",
                                                GemmConfig(16, 128, 64))
        assert _mfma(down) == expected_mfma_count(32, h, inter, torch.bfloat16, "gfx942", GemmConfig(16, 64, 64, 2))


def test_gather_writes_no_row_past_the_real_total():
    """The align kernel marks the slots past the real total src_row -2: the gather writes the real rows (tokens and
    zero padding) and nothing past them (flysim: bytes written = real rows x row bytes)."""
    g = torch.Generator().manual_seed(15)
    t, k, e, h, bm = 12, 2, 6, 64, 16
    x = torch.randn(t, h, generator=g).bfloat16()
    ids = torch.tensor([[1, 4]] * 7 + [[4, 1]] * 5)
    with executors.current().run("gfx942") as ex:
        src, tiles, _ = M.moe_align(ex.put(ids), e, bm)
        xs = M.moe_gather(ex.put(x), src).cpu()
    src = src.cpu()
    real = M.real_tiles(ids, e, bm) * bm
    assert real < src.shape[0] and (src[real:] == -2).all()
    assert torch.equal(xs[:real][src[:real] >= 0], x[src[:real][src[:real] >= 0].long()])
    assert not xs[:real][src[:real] == -1].any()  # the padding rows are zeros
    if ex.counts:
        assert ex.launches[1].counters["global_bytes_written"] == real * h * 2
