"""The scheduled K loop, split-K and the tile heuristic of the preshuffle GEMM.

Runs on the session's executor (tests/executors.py) check numerics and launch records (launch count;
flysim's MFMA counter where it counts); the ISA checks
compile without a GPU and read the hot loop with translator_kernels.hotloop's model.
"""

import pytest
import torch

from translator.tolerances import op_tol

import executors  # the session's executor (tests/executors.py)
from translator_kernels import gemm as G
from translator_kernels.gemm.kernel import hot_loop_schedule
from translator_kernels.gemm.preshuffle import shuffle_weight
from translator_kernels.gemm.preshuffle import padded_shape
from translator_kernels.gemm.tiles import CUS, four_wave, partial_bytes, wave_efficiency

from translator_kernels.arch import ARCHS  # noqa: E402
TOL = {dt: op_tol(dt, "gemm") for dt in (torch.float32, torch.bfloat16)}


def _case(m, n, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) / k**0.5).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)
    return a, w, torch.randn(n, generator=g), torch.randn(m, n, generator=g).to(dtype)


def _run(arch, a, w, cfg, **epi):
    n, k = w.shape
    with executors.current().run(arch) as ex:
        out = G.gemm(ex.put(a), ex.put(shuffle_weight(w)), n, k, _config=cfg, **{name: ex.put(v) for name, v in epi.items()})
    return out.cpu(), ex.launches


def _mfma_is(launch, want):
    """flysim's MFMA counter equals `want` (rocm counts nothing: true there)."""
    return not executors.current().counts or sum(launch.counters["mfma_by_kind"].values()) == want


def _ref(a, w, bias, res, scale=0.5):
    return torch.nn.functional.silu(scale * (a.float() @ w.float().T) + bias) + res.float()


def test_hot_loop_plan_orders_one_step():
    """128x128x64 bf16 on gfx942: 16 A operands x 4 MFMAs, 8 global loads, 4 LDS writes."""
    plan = hot_loop_schedule(16, 1, 4, 8, 4)
    total = {}
    for kind, cnt in plan:
        total[kind] = total.get(kind, 0) + cnt
    assert total == {"mfma": 64, "dsrd": 16, "vmem": 8, "dswr": 4}
    assert plan[0] == ("dsrd", 2)  # two operands read ahead of the first MFMA
    kinds = [k for k, _ in plan]
    first_mfma = kinds.index("mfma")
    mfma_before = [kinds[:i].count("mfma") for i, k in enumerate(kinds) if k == "vmem"]
    assert max(mfma_before) <= 32  # global loads in the first half of the MFMAs
    assert [k for k, _ in plan[-8:]].count("dswr") == 4 and first_mfma == 1  # LDS writes after the last MFMAs


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k,bk", [(72, 32), (96, 32), (128, 32), (160, 32), (1000, 64), (64, 64)],
                         ids=["3tiles-tail", "3tiles", "4tiles", "5tiles", "16tiles-tail", "1tile"])
def test_k_loop_peeling(arch, k, bk):
    """Every loop shape: 0..n two-step iterations, 1-3 peeled steps, the K-tail tile loaded with its check."""
    a, w, b, r = _case(21, 64, k, torch.float32)
    cfg = G.GemmConfig(32, 64, bk)
    out, launches = _run(arch, a, w, cfg, bias=b, residual=r, activation="silu", scale=0.5)
    assert len(launches) == 1
    assert _mfma_is(launches[0], G.expected_mfma_count(21, 64, k, "f32", arch, cfg))
    torch.testing.assert_close(out, _ref(a, w, b, r), **TOL[torch.float32])


SPLIT_CFGS = [G.GemmConfig(16, 64, 64, split=4), G.GemmConfig(16, 16, 128, split=4, kw=4),
              G.GemmConfig(32, 32, 128, split=2, kw=4), G.GemmConfig(16, 16, 256, split=1, kw=4)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("cfg", SPLIT_CFGS, ids=lambda c: f"{c.bm}x{c.bn}x{c.bk}-s{c.split}-kw{c.kw}")
def test_split_k_matches_eager_and_is_deterministic(arch, cfg):
    """bf16 M=5 (a decode shape), K=1000 (the last split has the K tail), N=72 (an N tail), full
    epilogue after the in-launch reduction: one launch, every MFMA of the tile grid, eager numerics,
    the same bits on a second run, and every split-K ticket counter back at 0."""
    from translator_kernels.gemm.splitk import _POOL

    m, n, k = 5, 72, 1000
    a, w, b, r = _case(m, n, k, torch.bfloat16)
    out, launches = _run(arch, a, w, cfg, bias=b, residual=r, activation="silu", scale=0.5)
    again, _ = _run(arch, a, w, cfg, bias=b, residual=r, activation="silu", scale=0.5)
    assert len(launches) == 1
    assert _mfma_is(launches[0], G.expected_mfma_count(m, n, k, "bf16", arch, cfg))
    assert torch.equal(out, again)
    assert all(int(c.abs().sum()) == 0 for free in _POOL.values() for c in free)
    torch.testing.assert_close(out.float(), _ref(a, w, b, r).to(torch.bfloat16).float(), **TOL[torch.bfloat16])
    single, _ = _run(arch, a, w, G.GemmConfig(16, 64, 64), bias=b, residual=r, activation="silu", scale=0.5)
    torch.testing.assert_close(out.float(), single.float(), **TOL[torch.bfloat16])


@pytest.mark.flysim_only("sets the CPU device's split-K counters and relies on flysim's workgroup order")
@pytest.mark.parametrize("arch", ARCHS)
def test_split_k_result_does_not_depend_on_the_last_arriver(arch, monkeypatch):
    """flysim serializes the tickets in workgroup order, so split 3 draws the last one and adds the
    partials. With every counter starting at 1, split 2 draws ticket split - 1 instead (split 3 stores
    its partial: its ticket is not split - 1) and adds them: the same bits. The counters this launch
    used (a ticket and a done counter per region) end at 0 again; the others keep their 1."""
    from translator_kernels.gemm import splitk

    cfg = G.GemmConfig(16, 16, 128, split=4, kw=4)
    a, w, b, r = _case(5, 72, 1000, torch.bfloat16)
    out, _ = _run(arch, a, w, cfg, bias=b, residual=r, activation="silu", scale=0.5)
    cnt = torch.ones(4096, dtype=torch.int32)
    monkeypatch.setitem(splitk._POOL, (torch.device("cpu"), None), [cnt])  # the next launch takes these
    other, _ = _run(arch, a, w, cfg, bias=b, residual=r, activation="silu", scale=0.5)
    assert torch.equal(out, other) and splitk._POOL[torch.device("cpu"), None][-1] is cnt  # given back
    regions = 5  # 1 row tile x 5 column tiles of 16 (N_pad = 80), one region per tile with kw = 4
    used = 2 * regions  # a ticket and a done counter per region
    assert int(cnt[:used].abs().sum()) == 0 and bool((cnt[used:] == 1).all())


def test_split_k_batched_one_tile_per_split():
    """bmm-style batch (grid z) with split = number of K tiles (3, odd), two M tiles."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(3, 21, 96, generator=g) / 10
    w = torch.randn(3, 40, 96, generator=g)
    from translator_kernels.gemm import _launch
    from translator_kernels.gemm.preshuffle import shuffle_weight_batched

    with executors.current().run("gfx942") as ex:
        out = _launch("bmm", ex.put(a), ex.put(shuffle_weight_batched(w)), 40, 96, 3, 21, bias=None, activation=None,
                      residual=None, scale=1.0, out_dtype=torch.float32, cfg=G.GemmConfig(16, 64, 32, split=3))
    assert len(ex.launches) == 1
    torch.testing.assert_close(out.cpu(), a @ w.transpose(1, 2), **TOL[torch.float32])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("m", [1, 16, 64])
def test_decode_fills_the_gpu(arch, m):
    """N = K = 4096 bf16 decode: grid >= 2 x the CUs, one launch, and the least time of the timing MODEL
    (tiles.model_estimate) among the tiles it ranks, the unsplit 16 x 64 one included. (Issue 16's
    ">= 80 % of HBM" counted A's bytes in flight; with W's alone it holds at M = 1-16 on gfx950 only:
    issue 29 and docs/gemm.md's decode table.)"""
    cfg = G.choose_config(G.m_bucket(m), 4096, 4096, "bf16", arch)
    est = G.stream_estimate(m, 4096, 4096, "bf16", arch, cfg)
    assert est["grid"] >= 2 * CUS[arch], (cfg, est)
    t = G.tiles.model_estimate(m, 4096, 4096, "bf16", arch, cfg)["t"]
    assert t <= G.tiles.model_estimate(m, 4096, 4096, "bf16", arch, G.GemmConfig(max(16, m), 64, 256))["t"]


def test_wave_quantization_picks_128x256_on_gfx950_only():
    """4096^2 bf16: 128x128 fills 1024 / 1536 slots on gfx950 (0.67), 128x256 512 / 512. gfx950 now
    runs the 8-wave 256x256 tile there (test_gemm_wide.py); 128x256 is its 4-wave stand-in (gated
    epilogue, bmm's [K, N] operand)."""
    c942 = G.choose_config(4096, 4096, 4096, "bf16", "gfx942")
    c950 = G.choose_config(4096, 4096, 4096, "bf16", "gfx950")
    assert (c942.bm, c942.bn) == (128, 128) and (c950.bm, c950.bn, c950.wm) == (256, 256, 2)
    c950_4 = four_wave(c950)
    assert (c950_4.bm, c950_4.bn) == (128, 256)
    assert wave_efficiency(1024, CUS["gfx950"] * 3) == pytest.approx(2 / 3)
    assert G.config_fits(c950_4, "bf16", "gfx950") is None


@pytest.mark.parametrize("arch", ARCHS)
def test_wide_tile_flysim(arch):
    """The 128x256 tile (gfx950's large-M choice) under flysim: N tail, K tail."""
    a, w, b, r = _case(130, 300, 240, torch.bfloat16)
    cfg = G.GemmConfig(128, 256, 64)
    out, launches = _run(arch, a, w, cfg, bias=b, residual=r, activation="silu", scale=0.5)
    assert _mfma_is(launches[0], G.expected_mfma_count(130, 300, 240, "bf16", arch, cfg))
    torch.testing.assert_close(out.float(), _ref(a, w, b, r).to(torch.bfloat16).float(), **TOL[torch.bfloat16])


FLYDSL_AT_EQUAL_TILE = {"gfx942": 150, "gfx950": 136}  # FlyDSL's preshuffle GEMM, 128x128x64 bf16 (bench.kernels)


@pytest.mark.parametrize("arch", ARCHS)
def test_isa_scheduled_loop_at_flydsl_tile(arch):
    """128x128x64 bf16, 4096^3: VGPRs <= FlyDSL's at the same tile, <= 8 VALU per K step, 0 spills,
    and a loop body of two K steps."""
    from translator_kernels.hotloop import hot_loop
    from translator_kernels.measure.gemm_isa import gemm_isa_text

    text, meta = gemm_isa_text(4096, 4096, "bf16", arch, 128, 128, 64)
    loop = hot_loop(text, arch)
    mfma_per_step = 8 * 2 * 2 * (1 if arch == "gfx950" else 2)
    steps = loop["counts"]["MFMA"] // mfma_per_step
    assert steps == 2 and loop["counts"]["MFMA"] == steps * mfma_per_step
    assert loop["counts"]["VALU"] / steps <= 8
    assert meta["vgpr"] <= FLYDSL_AT_EQUAL_TILE[arch] and meta["vgpr_spill"] == 0 and meta["sgpr_spill"] == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_bmm_reads_a_transposed_operand_in_place(arch, monkeypatch):
    """q @ k.transpose(-2, -1) (bf16, 4-D, K = 72 has a K tail) and a right operand shared by the
    batch: no per-call preshuffle (it would raise here), one launch, eager numerics."""
    import translator_kernels.gemm as gemm_mod

    def no_shuffle(*_a, **_k):
        raise AssertionError("bmm preshuffled a transposed operand")

    monkeypatch.setattr(gemm_mod, "shuffle_weight_batched", no_shuffle)
    g = torch.Generator().manual_seed(5)
    q = (torch.randn(2, 3, 17, 72, generator=g) / 8).to(torch.bfloat16)
    k = torch.randn(2, 3, 40, 72, generator=g).to(torch.bfloat16)
    shared = torch.randn(1, 50, 72, generator=g)
    a3 = torch.randn(3, 9, 72, generator=g) / 8
    with executors.current().run(arch) as ex:
        s = G.bmm(ex.put(q), ex.put(k).transpose(-2, -1)).cpu()
        s2 = G.bmm(ex.put(a3), ex.put(shared).transpose(-2, -1)).cpu()
    assert len(ex.launches) == 2
    assert _mfma_is(ex.launches[0], G.expected_mfma_count(
        17, 40, 72, "bf16", arch, G.choose_config(32, 40, 72, "bf16", arch), batch=6))
    torch.testing.assert_close(s.float(), (q.float() @ k.float().transpose(-2, -1)).to(torch.bfloat16).float(),
                               **TOL[torch.bfloat16])
    torch.testing.assert_close(s2, a3 @ shared.transpose(-2, -1), **TOL[torch.float32])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.flysim_only("reads flysim's counted global bytes")
def test_bmm_reads_att_at_v_in_place(arch, dt, monkeypatch):
    """att @ v with v row-major [K, N] (w_layout "kn"): no per-call preshuffle (it would raise here),
    one launch per bmm, eager numerics, and flysim's read bytes are exactly A x N tiles + B x M tiles
    (no reshuffle pass over v). Prefill (M = 17, K tail) and decode (M = 1: kw = 4 split-K tile)."""
    import translator_kernels.gemm as gemm_mod

    def no_shuffle(*_a, **_k):
        raise AssertionError("bmm preshuffled a row-major [K, N] operand")

    monkeypatch.setattr(gemm_mod, "shuffle_weight_batched", no_shuffle)
    if arch == "gfx942":  # the decode case covers the in-launch kw = 4 split-K path whatever the heuristic ranks first
        from translator_kernels.arch import DTYPE_NAMES

        monkeypatch.setitem(G.tiles._OVERRIDES, (4, 64, 512, DTYPE_NAMES[dt], "gfx942"), G.GemmConfig(16, 16, 256, 2, 4))
    g = torch.Generator().manual_seed(6)
    esz = torch.empty((), dtype=dt).element_size()
    for (m, k, n) in ((17, 40, 72), (1, 512, 64)):
        att = (torch.randn(2, 3, m, k, generator=g) / 8).to(dt)
        v = torch.randn(2, 3, k, n, generator=g).to(dt)
        cfg = G.choose_config(G.m_bucket(m), n, k, dt, arch)
        with executors.current().run(arch) as sim:
            out = G.bmm(att, v)
        assert len(sim.launches) == 1
        tiles_n, tiles_m = -(-padded_shape(n, k)[0] // cfg.bn), -(-m // cfg.bm)
        tickets = tiles_n * tiles_m * (4 // cfg.kw) * cfg.split if cfg.split > 1 else 0  # 4-byte atomics
        # each ticket's atomic, and the "done" counter (splitk.reduce_splits): the S - 1 others' release adds and
        # the last arriver's acquire read, one 4-byte atomic per ticket as well
        split_reads = partial_bytes(m, n, k, cfg)[1] + 2 * 4 * tickets
        assert sim.launches[0].counters["global_bytes_read"] == 6 * ((m * k * tiles_n + k * n * tiles_m) * esz
                                                                     + split_reads)
        assert sum(sim.launches[0].counters["mfma_by_kind"].values()) == G.expected_mfma_count(m, n, k, dt, arch, cfg,
                                                                                              batch=6)
        torch.testing.assert_close(out.float(), (att.float() @ v.float()).to(dt).float(), **TOL[dt])
    if arch == "gfx942":
        assert cfg.kw == 4 and cfg.split > 1  # the decode case ran the in-launch split-K path


def test_isa_wide_tile_fp32_is_not_chosen_where_it_spills():
    """fp32 4096^2 on gfx950: 128x256x32 (estimated 248 VGPRs) compiled with SGPR spills, so the
    register cap keeps fp32 at 128x128; the chosen tile compiles with 0 spills."""
    from translator_kernels.measure.gemm_isa import isa_stats

    cfg = G.choose_config(4096, 4096, 4096, "f32", "gfx950")
    assert (cfg.bm, cfg.bn) == (128, 128)
    s = isa_stats(4096, 4096, "f32", "gfx950", cfg.bm, cfg.bn, cfg.bk, activation="gelu", bias=True, residual=True)
    assert s["vgpr_spill"] == 0 and s["sgpr_spill"] == 0
