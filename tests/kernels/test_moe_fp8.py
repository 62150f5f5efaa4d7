"""MoE experts in fp8 (translator_kernels.moe.grouped_fp8) on the session's executor, both archs: per-expert fp8
weights with per-expert column scales, per-token fp8 activations, the gated grouped GEMM and the down grouped GEMM.
Each against the torch reference of the same quantized math; the launches, the MFMA kind (fp8) and the counts of the
real tiles asserted. A tile map pointing at another expert's scale row is caught."""

from __future__ import annotations

import pytest
import torch

import executors
from translator.tolerances import op_tol
from translator_kernels import moe as M
from translator_kernels.arch import ARCHS
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm import fp8 as F
from translator_kernels.moe import grouped_fp8 as G

MFMA = {"gfx942": "mfma.f32.16x16x32.fp8.fp8", "gfx950": "mfma.scale.f32.16x16x128.f8f6f4"}
NAMES = ["moe_align", "moe_gather", "quantize_rows", "gemm", "quantize_rows", "gemm", "moe_unpermute"]


def _experts(g, e, h, inter, spread=True):
    gu = torch.randn(e, 2 * inter, h, generator=g) / 8
    if spread:  # per-expert, per-row ranges that differ: a scale read from the wrong expert or column shows
        gu = gu * (torch.rand(e, 2 * inter, 1, generator=g) * 4 + 0.1)
    dn = torch.randn(e, h, inter, generator=g) / 8 * (torch.rand(e, h, 1, generator=g) * 4 + 0.1)
    return gu.bfloat16(), dn.bfloat16()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("t,h,inter,e,k", [(9, 64, 48, 4, 2), (1, 128, 32, 3, 2)], ids=["prefill", "decode"])
def test_moe_experts_fp8(arch, t, h, inter, e, k):
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(t, h, generator=g) * (torch.rand(t, 1, generator=g) * 4 + 0.1)).bfloat16()
    res = torch.randn(t, h, generator=g).bfloat16()
    w, ids = M.ref_topk_gating(torch.randn(t, e, generator=g), k)
    gu, dn = _experts(g, e, h, inter)
    w13, s13, w2, s2 = G.prepare_experts_fp8(gu, dn, arch)
    assert w13.dtype == w2.dtype == F.fp8_dtype(arch) and s13.shape[0] == s2.shape[0] == e
    with executors.current().run(arch) as ex:
        out = G.moe_experts_fp8(ex.put(x), ex.put(w), ex.put(ids), ex.put(w13), ex.put(s13), ex.put(w2),
                                ex.put(s2), inter, "silu", residual=ex.put(res)).cpu()
    assert [r.kernel.split("_")[0] for r in ex.launches][3::2] == ["gemm", "gemm"], ex.launches
    assert len(ex.launches) == 7, ex.launches
    ref = G.ref_moe_experts_fp8(x, w, ids, w13, s13, w2, s2, inter, residual=res)
    torch.testing.assert_close(out.float(), ref.float(), **op_tol(torch.bfloat16, "moe_experts_fp8"))
    # and against the bf16 experts (quantization error only: the fp8 rule's size)
    bf = M.ref_moe_experts(x, w, ids, *M.prepare_experts(gu, dn), inter, residual=res)
    assert float((out.float() - bf.float()).norm() / (bf.float() - res.float()).norm()) < 0.1
    if ex.counts:
        rows = -(-t * k // e)
        up, dn_cfg = G.grouped_config_fp8(rows, inter, h, True), G.grouped_config_fp8(rows, h, inter, False)
        dn_cfg = type(dn_cfg)(up.bm, dn_cfg.bn, dn_cfg.bk)
        real = M.real_tiles(ids, e, up.bm) * up.bm  # the tiles past the real rows exit (moe/tile_exit.py)
        assert ex.launches[3].counters["mfma_by_kind"] == {
            MFMA[arch]: G.expected_mfma_count_grouped_fp8(real, inter, h, arch, up, True)}
        assert ex.launches[5].counters["mfma_by_kind"] == {
            MFMA[arch]: G.expected_mfma_count_grouped_fp8(real, h, inter, arch, dn_cfg, False)}


@pytest.mark.parametrize("gated", [True, False], ids=["gated", "plain"])
def test_grouped_gemm_fp8_reads_each_tiles_expert_scales(gated):
    """Tiles routed to different experts: each tile uses its own expert's weight and scale row; the same
    weights with the scale rows of two experts swapped give other numbers (the reference sees the swap)."""
    arch = "gfx942"
    g = torch.Generator().manual_seed(5)
    e, n, k, bm = 3, 32, 128, 16
    gu, dn = _experts(g, e, k, n)
    w13, s13, w2, s2 = G.prepare_experts_fp8(gu, dn, arch)
    a_q, sa = F.quantize_fp8(torch.randn(4 * bm, k, generator=g), F.fp8_dtype(arch), dim=-1)
    tiles = torch.tensor([2, 0, 2, 1], dtype=torch.int32)
    cfg = G.grouped_config_fp8(bm, n, k, gated)
    w, s, nn = (w13, s13, n) if gated else (w2, s2, k)
    if not gated:  # the down weights [E, H=k, I=n] take rows of I values
        a_q, sa = F.quantize_fp8(torch.randn(4 * bm, n, generator=g), F.fp8_dtype(arch), dim=-1)
        cfg = G.grouped_config_fp8(bm, k, n, False)
    kk = k if gated else n
    with executors.current().run(arch) as ex:
        out = G.grouped_gemm_fp8(ex.put(a_q), ex.put(sa), ex.put(w), ex.put(s), ex.put(tiles), nn, kk, cfg,
                                 gate="silu" if gated else None, out_dtype=torch.float32).cpu()
    assert len(ex.launches) == 1
    from translator_kernels.gemm.fp8_gated import ref_gemm_fp8_gated, unarrange_gated_fp8

    def ref(scales):
        parts = []
        for i, x in enumerate(tiles.tolist()):
            rows, rs = a_q[i * bm:(i + 1) * bm], sa[i * bm:(i + 1) * bm]
            if gated:
                wg, wu, sg, su = unarrange_gated_fp8(w[x], scales[x], nn, kk)
                parts.append(ref_gemm_fp8_gated(rows, wg, wu, "silu", rs, sg, su, out_dtype=torch.float32))
            else:
                parts.append(F.ref_gemm_fp8(rows, F.unshuffle_weight_fp8(w[x], nn, kk), rs, scales[x],
                                            out_dtype=torch.float32))
        return torch.cat(parts)

    want = ref(s)
    tol = op_tol(torch.float32, "gemm", reduction_length=kk, scale=float(want.abs().max()))
    torch.testing.assert_close(out, want, **tol)
    swapped = s[[2, 1, 0]]
    with pytest.raises(AssertionError):
        torch.testing.assert_close(out, ref(swapped), **tol)


def test_bad_inputs_name_the_fix():
    g = torch.Generator().manual_seed(1)
    with pytest.raises(KernelInputError, match="multiples of 16"):
        G.prepare_experts_fp8(torch.randn(2, 16, 24, generator=g), torch.randn(2, 24, 8, generator=g), "gfx942")
    gu, dn = _experts(g, 2, 64, 32)
    w13, s13, w2, s2 = G.prepare_experts_fp8(gu, dn, "gfx942")
    a_q, sa = F.quantize_fp8(torch.randn(16, 64, generator=g), F.fp8_dtype("gfx942"), dim=-1)
    cfg = G.grouped_config_fp8(16, 32, 64, True)
    with executors.current().run("gfx942"):
        with pytest.raises(KernelInputError, match="one row of column scales per expert"):
            G.grouped_gemm_fp8(a_q, sa, w13, s13[0], torch.zeros(1, dtype=torch.int32), 32, 64, cfg, gate="silu")
