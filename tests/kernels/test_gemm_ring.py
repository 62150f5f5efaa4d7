"""The GEMM's W register ring (kernel.py `ring`, GemmConfig.ring; issue 29 item 3, mid M).

Without it a wave holds two W register sets (the tile it computes and the next one, in flight). With it, the next
tile's W block kb is loaded right after the MFMAs of this tile's block kb, into the registers they free: one set
and the blocks landing, so the same VGPRs hold twice the columns per wave, and each A operand read from LDS feeds
twice the MFMAs (the MODEL's LDS term per MFMA halves). Only when the loads are issued changes: the K blocks, their
order and the MFMAs are the plain kernel's, so the result is bit-identical.
"""

import dataclasses

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels import gemm as G
from translator_kernels.arch import ARCHS, NAMED_DTYPES as DT
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm import tiles, variants
from translator_kernels.gemm.kernel import build_gemm
from translator_kernels.gemm.preshuffle import padded_shape, shuffle_weight


def _case(m, n, k, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) / k**0.5).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)
    return a, w, torch.randn(n, generator=g), torch.randn(m, n, generator=g).to(dtype)


@pytest.fixture
def rings(monkeypatch):
    """(ring, quad) of every kernel the GEMM entry points build in the test (recorded, then built)."""
    seen = []
    real = G.build_gemm

    def spy(*args, **kwargs):
        seen.append((kwargs.get("ring", False), kwargs.get("quad", False)))
        return real(*args, **kwargs)

    monkeypatch.setattr(G, "build_gemm", spy)
    return seen


def _run(arch, a, w, b, r, cfg):
    n, k = w.shape
    with executors.current().run(arch) as ex:
        out = G.gemm(ex.put(a), ex.put(shuffle_weight(w)), n, k, bias=ex.put(b), residual=ex.put(r),
                     activation="gelu", _config=cfg)
    return out.cpu(), ex.launches


CASES = [  # (arch, dtype, M, N, K, config): M / N / K tails, split-K with a short first tile, 4 W column blocks, fp32
    *(("bf16", a, 70, 200, 1000, G.GemmConfig(32, 64, 128, 2, head=32, ring=True)) for a in ARCHS),
    ("f16", "gfx950", 21, 300, 488, G.GemmConfig(16, 256, 128, 1, ring=True)),
    ("f32", "gfx942", 33, 80, 512, G.GemmConfig(16, 64, 128, 2, ring=True)),
    # 2 x 2 waves: the second wave row of a 64-row tile past M, the ring, head, split; fp32 without the ring
    ("bf16", "gfx942", 70, 200, 1000, G.GemmConfig(64, 64, 128, 2, head=32, ring=True, quad=True)),
    ("f32", "gfx950", 45, 80, 512, G.GemmConfig(32, 64, 128, quad=True)),
]


@pytest.mark.parametrize("dt,arch,m,n,k,cfg", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}x{c[3]}x{c[4]}" for c in CASES])
def test_ring_is_bit_identical_to_two_w_sets(arch, dt, m, n, k, cfg, rings):
    """One launch with the plain kernel's grid, MFMAs and bytes moved (2 x 2 waves: W and the bias read once more per
    row tile, the second wave row's loads); torch's numerics; the plain kernel's bits."""
    a, w, b, r = _case(m, n, k, DT[dt])
    out, launches = _run(arch, a, w, b, r, cfg)
    plain, plain_launches = _run(arch, a, w, b, r, dataclasses.replace(cfg, ring=False, quad=False))
    assert rings == [(cfg.ring, cfg.quad), (False, False)]
    assert len(launches) == 1 and launches[0].grid == plain_launches[0].grid
    if executors.current().counts:
        assert sum(launches[0].counters["mfma_by_kind"].values()) == G.expected_mfma_count(m, n, k, dt, arch, cfg)
        got, want = ({key: rec.counters[key] for key in ("global_bytes_read", "global_bytes_written")}
                     for rec in (launches[0], plain_launches[0]))
        if cfg.quad:  # both wave rows of a tile load its W columns and bias (4 lanes a column): no cache in flysim
            n_pad, k_pad = padded_shape(n, k)
            want["global_bytes_read"] += -(-m // cfg.bm) * (n_pad * k_pad * DT[dt].itemsize + n * 4 * 4)
        assert got == want
    ref = torch.nn.functional.gelu(a.float() @ w.float().T + b) + r.float()
    torch.testing.assert_close(out.float(), ref.to(DT[dt]).float(), **op_tol(DT[dt], "gemm"))
    assert torch.equal(out, plain)


def test_ring_rules():
    assert "ring" in tiles.config_fits(G.GemmConfig(16, 16, 128, kw=4, ring=True), "bf16", "gfx942")
    with pytest.raises(KernelInputError, match="ring"):
        build_gemm.__wrapped__(64, 256, 64, 256, "bf16", "bf16", "gfx942", 16, 64, 128, None, False, False,
                               w_layout="nk", ring=True)
    # a call the ring does not serve (scales, gate, rownorm, bmm's in-place operand) gets two W sets at a BK
    # whose registers fit: 32x256x256 holds ~232 VGPRs as a ring, ~360 with two sets
    cfg = G.GemmConfig(32, 256, 256, 2, head=32, ring=True)
    assert tiles.config_fits(cfg, "bf16", "gfx942") is None
    assert tiles.config_fits(dataclasses.replace(cfg, ring=False), "bf16", "gfx942")
    two = tiles.without_ring(cfg, "bf16", "gfx942")
    assert not two.ring and two.bk == 128 and two.head == 32 and tiles.config_fits(two, "bf16", "gfx942") is None


@pytest.mark.parametrize("arch", ARCHS)
def test_bmm_in_place_operand_drops_the_ring(arch, rings, monkeypatch):
    """bmm's att @ v (B read in place, w_layout "kn") with a ring / quad config chosen for its key: 4 x 1 waves, two
    W sets."""
    monkeypatch.setitem(tiles._OVERRIDES, (32, 64, 256, "bf16", arch), G.GemmConfig(32, 64, 128, ring=True, quad=True))
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(1, 20, 256, generator=g).bfloat16(), torch.randn(1, 256, 64, generator=g).bfloat16()
    with executors.current().run(arch) as ex:
        out = G.bmm(ex.put(a), ex.put(b))
    assert len(ex.launches) == 1 and rings == [(False, False)]
    torch.testing.assert_close(out.cpu().float(), (a.float() @ b.float()).bfloat16().float(),
                               **op_tol(torch.bfloat16, "gemm"))


# ---- the MODEL and the heuristic (pure Python) ---------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_mid_m_ring_under_the_l2_term(arch):
    """N = K = 4096, M = 256 - 1024: the ring's gain is 64 columns per wave at BK 256 with 32-row tiles (two W sets
    would need ~360 VGPRs). Before the L2 term it was ranked first at M = 512 (gfx942 0.55, gfx950 0.58 of the
    achievable bandwidth). The L2 term (timing's t_l2) charges what every workgroup loads: 32-row tiles read W once
    per row tile through the L2s, and at M = 512 the former choice 32x256x256 split 2 head 32 ring is L2-bound (gfx942
    27.4 us, tied with the plain 64x256x128 split 2 at 27.4; gfx950 above it). No ring tile is 2 % ahead of the best plain one at these M, so the heuristic
    takes none (the ring and the plain tile of the same shape are priced alike: the ring changes registers only)."""
    former = tiles.model_estimate(512, 4096, 4096, "bf16", arch, G.GemmConfig(32, 256, 256, 2, head=32, ring=True))
    assert former["bound"] == "L2"
    for m in (256, 512, 1024):
        cfg = G.choose_config(m, 4096, 4096, "bf16", arch)
        e = tiles.model_estimate(m, 4096, 4096, "bf16", arch, cfg)
        est = [(tiles.model_estimate(m, 4096, 4096, "bf16", arch, c)["kernel_t"], c)
               for c in variants.candidates(4096, 4096, "bf16", arch)]
        plain = min(t for t, c in est if not (c.ring or c.quad))
        assert not cfg.ring and min(t for t, c in est if c.ring) > plain * 0.98, (m, cfg)
        assert e["kernel_t"] <= plain * 1.02 and (m != 512 or e["kernel_t"] <= former["kernel_t"])


def test_quad_is_taken_only_when_ahead_of_every_4x1_tile():
    """2 x 2 waves read each W column twice per workgroup (flysim counts it; L1 / L2 on hardware, which the MODEL does
    not price): within 2 % of a 4 x 1 tile the 4 x 1 tile wins (gfx942 M = 2048 stays at 64x256x128)."""
    c = G.choose_config(2048, 4096, 4096, "bf16", "gfx942")
    assert not c.quad and (c.bm, c.bn, c.bk) == (64, 256, 128)
    quad = G.GemmConfig(32, 128, 256, 2, head=32, ring=True, quad=True)
    four = dataclasses.replace(quad, quad=False)
    f4, fq = (tiles.model_features(c, "bf16", "gfx942") for c in (four, quad))
    assert fq.loop_lds < f4.loop_lds and fq.inflight_bytes == f4.inflight_bytes and fq.loop_flops == f4.loop_flops
    assert "quad" in tiles.config_fits(G.GemmConfig(16, 128, 256, quad=True), "bf16", "gfx942")


def test_ring_halves_the_w_registers_in_the_estimate():
    two, ring = (tiles.vgpr_estimate(G.GemmConfig(32, 128, 256, 2, ring=r), "bf16") for r in (False, True))
    n_rep, k_blk = 2, 8  # per wave: 2 column blocks x 8 K blocks, one 4-VGPR chunk each
    assert two - ring == (n_rep * k_blk - 2 * n_rep) * 4 == 48  # one set less, two blocks landing more


# ---- ISA ----------------------------------------------------------------------------------------
def test_isa_ring_registers_and_lds_bytes_per_mfma():
    """gfx942 bf16 with the full epilogue (bias + gelu + residual), split 2, head 32: 32x128x256 compiles to fewer
    VGPRs as a ring (136 vs 180 compiled); M = 256's choice 32x256x256 ring compiles with 0 spills and 2 waves per
    SIMD (two W sets: 312 registers with AGPRs, 1 wave per SIMD), and its hot loop reads half the LDS bytes per
    MFMA (one ds_read_b128 of A feeds 4 x 2 MFMAs instead of 2 x 2); each W load follows MFMAs of its block."""
    from translator_kernels.hotloop import compile_isa_texts_many, find_loops, main_text
    from translator_kernels.isa import parse_isa
    from translator_kernels.measure.gemm_isa import ENTRY, spec

    got = {}
    cases = ((128, False), (128, True), (256, True))
    jobs = [(ENTRY, (dict(spec(4096, 4096, "bf16", "gfx942", 32, bn, 256, "gelu", True, True), split=2, head=32,
                          ring=ring),), {}) for bn, ring in cases]
    for (bn, ring), texts in zip(cases, compile_isa_texts_many(jobs, "gfx942")):  # one child for the three
        text = main_text(texts)
        st = max(parse_isa(text, "gfx942"), key=lambda x: x.instructions)
        hot = max(find_loops(text, st.kernel), key=lambda lp: lp.cycles("gfx942")["matrix_cycles"])
        got[(bn, ring)] = (st.meta, st.occupancy[0], text, hot)
    (m0, *_), (m1, *_), (m2, w2, *_) = got[(128, False)], got[(128, True)], got[(256, True)]
    assert m1["vgpr"] <= m0["vgpr"] - 32, (m0["vgpr"], m1["vgpr"])
    assert m2["vgpr_spill"] == m2["sgpr_spill"] == 0 and m2["agpr"] == 0 and m2["vgpr"] <= 256 and w2 == 2

    def per_mfma(text, hot):
        body = text.splitlines()[hot.start:hot.end + 1]
        ins = [ln.split()[0] for ln in body if ln.strip() and not ln.strip().startswith((";", "."))]
        return 16 * 64 * sum(i == "ds_read_b128" for i in ins) / sum(i.startswith("v_mfma") for i in ins), ins

    (b1, _), (b2, ins2) = per_mfma(*got[(128, True)][2:]), per_mfma(*got[(256, True)][2:])
    assert b2 == pytest.approx(b1 / 2) and b2 == 128
    loads = [j for j, i in enumerate(ins2) if i.startswith("buffer_load")]
    mfmas_between = [sum(x.startswith("v_mfma") for x in ins2[a:b]) for a, b in zip(loads, loads[1:])]
    assert sum(g > 0 for g in mfmas_between) >= 8, mfmas_between  # the W blocks' loads spread over the step


@pytest.mark.parametrize("arch", ARCHS)
def test_isa_m256_choice_holds_two_waves_per_simd(arch):
    """The M = 256 choice at N = K = 4096, full epilogue: 0 spills, no AGPRs, 2 waves per SIMD as the MODEL assumes
    (gfx942 32x128x256 ring quad: 218 VGPRs, estimate 212; gfx950 32x256x256 ring: 248, estimate 232). BK 512 rings
    are not ranked: gfx950 32x128x512 compiled to 288 registers (32 AGPRs, 1 wave per SIMD), estimate 216."""
    from translator_kernels.measure.gemm_isa import isa_stats

    # the M = 256 choices before the XCD re-reads were priced (gemm/xcd.py: now they tie the plain tile there)
    c = (G.GemmConfig(32, 128, 256, 2, head=32, ring=True, quad=True) if arch == "gfx942"
         else G.GemmConfig(32, 256, 256, 2, head=32, ring=True))
    s = isa_stats(4096, 4096, "bf16", arch, c.bm, c.bn, c.bk, activation="gelu", bias=True, residual=True,
                  split=c.split, head=c.head, ring=c.ring, quad=c.quad)
    assert s["vgpr_spill"] == s["sgpr_spill"] == s["agpr"] == 0 and s["waves_per_simd"] == 2
    assert s["vgpr"] <= tiles.vgpr_estimate(c, "bf16") + 16
    assert "BK <= 256" in tiles.config_fits(G.GemmConfig(32, 128, 512, ring=True), "bf16", "gfx950")
