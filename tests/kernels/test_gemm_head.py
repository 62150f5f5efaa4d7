"""The GEMM's short first K tile (kernel.py `head`, GemmConfig.head) and the mid-M choices it enables.

Issue 29 item 3: at mid M (65..2048) the timing MODEL charges every workgroup's first A and W tiles at the
CU's share of the bandwidth (all resident workgroups load them at once, before any MFMA). With `head`, the
first tile holds `head` K elements and the last one the rest of a tile, so that prologue shrinks BK / head
times; the K blocks, their order and the MFMAs are those of the plain kernel, so the result is bit-identical.
"""

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels import gemm as G
from translator_kernels.arch import ARCHS, GPUS, NAMED_DTYPES as DT
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm import tiles, variants
from translator_kernels.gemm.kernel import build_gemm
from translator_kernels.gemm.preshuffle import shuffle_weight


def _case(m, n, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) / k**0.5).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)
    return a, w, torch.randn(n, generator=g), torch.randn(m, n, generator=g).to(dtype)


def _run(arch, a, w, b, r, cfg):
    n, k = w.shape
    with executors.current().run(arch) as ex:
        out = G.gemm(ex.put(a), ex.put(shuffle_weight(w)), n, k, bias=ex.put(b), residual=ex.put(r),
                     activation="silu", scale=0.5, _config=cfg)
    return out.cpu(), ex.launches


CASES = [  # (dtype, M, N, K, config): M / N / K tails, split-K, one full tile per split, kp = 4 (fp32)
    ("bf16", 70, 200, 1000, G.GemmConfig(32, 64, 128, 2, head=32)),
    ("f32", 33, 80, 512, G.GemmConfig(32, 64, 128, head=64)),
    ("f16", 21, 72, 256, G.GemmConfig(16, 64, 128, 2, head=96)),
]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt,m,n,k,cfg", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}x{c[3]}-h{c[4].head}" for c in CASES])
def test_head_is_bit_identical_to_the_plain_kernel(arch, dt, m, n, k, cfg):
    """One launch, every MFMA of the plain tile (the empty K blocks of the partial tiles are not computed),
    torch's numerics, and the plain kernel's bits (the same K blocks in the same order)."""
    import dataclasses

    a, w, b, r = _case(m, n, k, DT[dt])
    out, launches = _run(arch, a, w, b, r, cfg)
    plain, plain_launches = _run(arch, a, w, b, r, dataclasses.replace(cfg, head=0))
    assert len(launches) == 1 and launches[0].grid == plain_launches[0].grid
    if executors.current().counts:
        want = G.expected_mfma_count(m, n, k, dt, arch, cfg)
        assert sum(launches[0].counters["mfma_by_kind"].values()) == want
        for key in ("global_bytes_read", "global_bytes_written"):  # masked chunks move no bytes
            assert launches[0].counters[key] == plain_launches[0].counters[key]
    ref = torch.nn.functional.silu(0.5 * (a.float() @ w.float().T) + b) + r.float()
    torch.testing.assert_close(out.float(), ref.to(DT[dt]).float(), **op_tol(DT[dt], "gemm"))
    assert torch.equal(out, plain)


def test_head_rules():
    for bad in (dict(kw=4, bn=16, bk=128, head=32), dict(head=48), dict(head=128)):
        cfg = G.GemmConfig(**{**dict(bm=16, bn=64, bk=128), **bad})
        assert "head" in tiles.config_fits(cfg, "bf16", "gfx942")
    with pytest.raises(KernelInputError, match="head"):
        build_gemm.__wrapped__(64, 256, 64, 256, "bf16", "bf16", "gfx942", 16, 64, 128, None, False, False,
                               w_layout="nk", head=32)


# ---- the MODEL and the heuristic (pure Python) ---------------------------------------------------
def test_model_charges_the_short_first_tile_and_one_more_step():
    cfg = G.GemmConfig(32, 256, 128, 2, head=32)
    plain = G.GemmConfig(32, 256, 128, 2)
    f, fp = tiles.model_features(cfg, "bf16", "gfx942"), tiles.model_features(plain, "bf16", "gfx942")
    assert f.straight_bytes == (32 + 256) * 32 * 2 // 4 and fp.straight_bytes == (32 + 256) * 128 * 2 // 4
    e, ep = (tiles.model_estimate(256, 4096, 4096, "bf16", "gfx942", c) for c in (cfg, plain))
    assert e["kernel_t"] < ep["kernel_t"] and e["bytes"] == ep["bytes"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("m", [128, 256])
def test_mid_m_of_achievable_hbm(arch, m):
    """N = K = 4096 (MODEL, constants of the refit: 12 us launch floor, 0.63 streaming cap): M = 128 meets issue
    29's 0.8 of the achievable HBM bandwidth on both archs (0.94 / 0.94; 0.71 / 0.74 before the short first
    tile); M = 256 (with the W register ring and gfx942's 2 x 2 waves, test_gemm_ring) 0.82 / 0.82 (0.74 / 0.79
    with the short first tile alone; 0.74 / 0.75 with the XCD re-reads priced, gemm/xcd.py: t_mem binds)."""
    cfg = G.choose_config(m, 4096, 4096, "bf16", arch)
    e = tiles.model_estimate(m, 4096, 4096, "bf16", arch, cfg)
    assert cfg.head and e["of_achievable"] >= (0.8 if m == 128 else 0.73), (cfg, e["of_achievable"])
    assert tiles.config_fits(tiles.gated_config(cfg, "bf16", arch), "bf16", arch) is None


@pytest.mark.parametrize("arch", ARCHS)
def test_m2048_is_ranked_by_the_model(arch):
    """M = 2048 takes the mid-M ranking (it took the MFMA-bound 128 x 128 tile: 0.50 / 0.41 of the better floor),
    ranked by the cycles at the boost clock (rank_t); on gfx942 both run into the measured matrix ceiling (t_maf)."""
    cfg = G.choose_config(2048, 4096, 4096, "bf16", arch)
    e, old = (tiles.model_estimate(2048, 4096, 4096, "bf16", arch, c) for c in (cfg, G.GemmConfig(128, 128, 64)))
    assert old["rank_t"] >= 1.25 * e["rank_t"], (cfg, e["rank_t"])
    assert (e["bound"] == "MAF") == (arch == "gfx942") and e["kernel_t"] <= old["kernel_t"]


def test_persistent_variant_pays_one_prologue_per_workgroup():
    """A persistent grid of G = the resident slots over 2 G tiles: the same loop work as two rounds of the
    plain grid, one prologue instead of two per slot; G >= the tiles is the plain launch."""
    cfg = G.GemmConfig(32, 64, 128, 2)
    slots = GPUS["gfx950"].cus * tiles.workgroups_per_cu(cfg, "bf16", "gfx950")
    m = 2 * slots // (4096 // 64 * 2) * 32  # 2 x slots tiles
    plain = tiles.model_estimate(m, 4096, 4096, "bf16", "gfx950", cfg)
    assert plain["units"] == 2 * slots
    assert tiles.model_estimate(m, 4096, 4096, "bf16", "gfx950", cfg, persistent=2 * slots)["t"] == plain["t"]
    pers = tiles.model_estimate(m, 4096, 4096, "bf16", "gfx950", cfg, persistent=slots)
    assert pers["grid"] == slots and pers["t_issue"] < plain["t_issue"]


def test_prefetch_2_variant_pays_its_registers_and_its_second_w_tile():
    cfg = G.GemmConfig(64, 128, 128, 2)
    f1, f2 = (tiles.model_features(cfg, "bf16", "gfx950", p) for p in (1, 2))
    assert f2.straight_bytes - f1.straight_bytes == 128 * 128 * 2 // 4
    assert tiles.vgpr_estimate(cfg, "bf16", 2) > tiles.vgpr_estimate(cfg, "bf16")


def test_variants_search_keeps_the_built_kernel_ahead_at_m128():
    """The variants priced but not built (variants.py) do not beat the plain kernel's best tile at M = 128 on
    gfx942 (the search's own 'as built' row), and no kernel of the family beats the prologue-free bound."""
    built, _ = variants.best(128, 4096, 4096, "bf16", "gfx942", "as built")
    for v in ("prefetch 2", "persistent"):
        assert variants.best(128, 4096, 4096, "bf16", "gfx942", v)[0]["kernel_t"] >= built["kernel_t"] * 0.999
    assert variants.best(128, 4096, 4096, "bf16", "gfx942", "prologue free (bound)")[0]["kernel_t"] <= built["kernel_t"]


# ---- ISA ----------------------------------------------------------------------------------------
def test_isa_head_shrinks_the_prologue_without_spills():
    """gfx950, the M = 256 choice at N = K = 4096: 0 spills, about the same VGPRs, and the bytes a wave loads before
    its first wait (the prologue the MODEL charges) at most a third of the plain kernel's."""
    from translator_kernels.hotloop import compile_isa_texts_many, main_text
    from translator_kernels.isa import parse_isa
    from translator_kernels.measure.gemm_isa import ENTRY, spec

    cfg = G.choose_config(256, 4096, 4096, "bf16", "gfx950")
    assert cfg.head
    got = {}
    heads = (0, cfg.head)
    jobs = [(ENTRY, (dict(spec(4096, 4096, "bf16", "gfx950", cfg.bm, cfg.bn, cfg.bk), split=cfg.split, head=head,
                          ring=cfg.ring, quad=cfg.quad),), {}) for head in heads]
    for head, texts in zip(heads, compile_isa_texts_many(jobs, "gfx950")):  # one child for both
        text = main_text(texts)
        meta = max(parse_isa(text, "gfx950"), key=lambda st: st.instructions).meta
        got[head] = (variants.prologue_bytes(text, "gfx950"), meta)
    (p0, m0), (p1, m1) = got[0], got[cfg.head]
    assert m1["vgpr_spill"] == 0 and m1["sgpr_spill"] == 0 and m1["vgpr"] <= m0["vgpr"] + 8  # compiled: 176 vs 174 (before the ring)
    assert 3 * p1 <= p0, (p0, p1)
