"""gfx950's 8-wave 256x256 GEMM tile (translator_kernels/gemm/wide.py) and the tile heuristic
that picks it (tiles.py).

flysim runs (flysim_only: they read the launch's block, grid and counters) use small multiples of the tile (M, N = 256..392, K = 128..184) and assert the launch
record (one launch, 512 lanes a workgroup, the tile's grid, the MFMA count the grid implies, C
written exactly once) and numerics against eager within the tolerance table. One ISA test compiles
the 4096^3 kernel (registers, spills, occupancy, dwordx4 C stores, the hot-loop MODEL per K step).
"""

import re

import pytest
import torch
from translator.tolerances import op_tol

import executors  # the session's executor (tests/executors.py)
from translator_kernels import gemm as G
from translator_kernels import launch as kl
from translator_kernels.arch import NAMED_DTYPES
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm import tiles
from translator_kernels.gemm.kernel import build_gemm, hot_loop_schedule
from translator_kernels.gemm.preshuffle import padded_shape, shuffle_weight

WIDE = G.GemmConfig(256, 256, 64, wm=2)
FLYDSL_A16W16_VGPR = 240  # FlyDSL's gemm_a16w16_gfx950 at 256x256x64 bf16 (bench.kernels, docs/gemm.md)
DT = {k: NAMED_DTYPES[k] for k in ("bf16", "f16")}


def _case(dt, m, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) / k**0.5).to(DT[dt])
    w = torch.randn(n, k, generator=g).to(DT[dt])
    return a, w, torch.randn(n, generator=g), torch.randn(m, n, generator=g).to(DT[dt])


def _assert_wide_launch(rec, m, n, k, dt):
    n_pad = padded_shape(n, k)[0]
    assert rec.block == (512, 1, 1) and rec.grid == (-(-m // 256), -(-n_pad // 256), 1)
    assert sum(rec.counters["mfma_by_kind"].values()) == G.expected_mfma_count(m, n, k, dt, "gfx950", WIDE)
    assert set(rec.counters["mfma_by_kind"]) == {f"mfma.f32.16x16x32.{dt}"}


# ---- the heuristic (pure Python) ----------------------------------------------------------------
@pytest.mark.parametrize("m,n,k,arch,tile", [
    (4096, 4096, 4096, "gfx950", (256, 256, 64, 2)),  # 256 tiles on 256 CUs, same time, 1/3 fewer bytes
    (8192, 8192, 4096, "gfx950", (256, 256, 64, 2)),
    (4096, 4096, 4096, "gfx942", (128, 128, 64, 1)),  # 2 x 128 KiB LDS does not fit gfx942's 64 KiB
    (2048, 2048, 4096, "gfx950", (64, 256, 128, 1)),  # mid M (<= 2048): the timing MODEL's ranking (64 wide
    # tiles would leave 192 CUs idle; 64x256x128 split 2 head 32 at 26.9 us; the W register ring's 32x256x256
    # head 32, 37.6 us before the L2 term, reads W through the L2s once per 32-row tile: 1.1 GB, 47.3 us)
    (3072, 3072, 4096, "gfx950", (128, 128, 64, 1)),
    (4096, 4100, 4096, "gfx950", (128, 128, 64, 1)),  # N not a multiple of 8: no 16-byte C pieces
])
def test_heuristic_takes_the_wide_tile_where_it_fills_the_gpu(m, n, k, arch, tile):
    c = G.choose_config(G.m_bucket(m), n, k, "bf16", arch)
    assert (c.bm, c.bn, c.bk, c.wm) == tile
    assert G.config_fits(c, "bf16", arch) is None


def test_large_estimate_at_4096():
    """4096^3 bf16 on gfx950: every candidate is MFMA-bound at the same modeled time; the wide tile's
    operand feed is half its MFMA time (128x128: all of it), and it fills its 256 slots exactly."""
    est = {c: G.large_estimate(4096, 4096, 4096, "bf16", "gfx950", c)
           for c in (G.GemmConfig(128, 128, 64), G.GemmConfig(128, 256, 64), WIDE)}
    ts = {round(e["t"] * 1e6, 1) for e in est.values()}
    assert ts == {54.6}
    assert est[WIDE]["tiles"] == est[WIDE]["slots"] == 256 and est[WIDE]["wave_efficiency"] == 1.0
    assert [round(e["feed_over_mfma"], 2) for e in est.values()] == [1.0, 0.75, 0.5]
    assert est[G.GemmConfig(128, 128, 64)]["wave_efficiency"] == pytest.approx(2 / 3)


def test_wide_config_rules():
    assert "gfx950 only" in tiles.config_fits(WIDE, "bf16", "gfx942")
    assert "gfx950 only" in tiles.config_fits(WIDE, "f32", "gfx950")
    assert "split" in tiles.config_fits(G.GemmConfig(256, 256, 64, split=2, wm=2), "bf16", "gfx950")
    assert tiles.lds_bytes(WIDE, "bf16") == 131072 and tiles.vgpr_estimate(WIDE, "bf16") == 248
    assert tiles.workgroups_per_cu(WIDE, "bf16", "gfx950") == 1
    assert tiles.four_wave(WIDE) == G.GemmConfig(128, 256, 64)  # gated / bmm [K, N] stand-in
    with pytest.raises(KernelInputError, match="gfx950"):
        build_gemm(256, 128, 256, 128, "bf16", "bf16", "gfx942", 256, 256, 64, None, False, False, wm=2)


def test_hot_loop_plan_reads_w_operands_with_their_k_block():
    """wide.py's step: 2 K blocks x 8 A operands x 4 MFMAs; the 4 W operands of a K block are read
    with its first A operand; no vmem groups (the DMA is left at the top of the step), no LDS writes."""
    plan = hot_loop_schedule(16, 1, 4, 0, 0, extra_reads={0: 4, 8: 4})
    total = {}
    for kind, cnt in plan:
        total[kind] = total.get(kind, 0) + cnt
    assert total == {"mfma": 64, "dsrd": 24}
    assert plan[0] == ("dsrd", 6)  # operands 0 and 1 ahead of the first MFMA, with K block 0's W
    assert ("dsrd", 5) in plan  # operand 8 (K block 1's first) carries its W reads


# ---- flysim ---------------------------------------------------------------------------------------
@pytest.mark.flysim_only("reads the launch's block, grid and counters")
def test_wide_tile_through_the_heuristic_and_entry_point(monkeypatch):
    """gemm() with the wide tile registered for its key (register_config: what autotune does):
    bias + gelu + residual, scale; one 512-lane launch, C written exactly once (16-byte pieces)."""
    monkeypatch.setattr(tiles, "_OVERRIDES", {})
    m, n, k = 256, 256, 128
    G.register_config(G.m_bucket(m), n, k, torch.bfloat16, "gfx950", WIDE)
    a, w, b, r = _case("bf16", m, n, k)
    with executors.current().run("gfx950") as sim:
        out = G.gemm(a, shuffle_weight(w), n, k, bias=b, activation="gelu", residual=r, scale=0.5)
    assert len(sim.launches) == 1
    _assert_wide_launch(sim.launches[0], m, n, k, "bf16")
    assert sim.launches[0].counters["global_bytes_written"] == m * n * 2
    ref = torch.nn.functional.gelu(0.5 * (a.float() @ w.float().T) + b) + r.float()
    torch.testing.assert_close(out.float(), ref.to(torch.bfloat16).float(), **op_tol(torch.bfloat16, "gemm"))


@pytest.mark.flysim_only("reads the launch's block, grid and counters")
def test_wide_tile_tails_f16():
    """M = 300, N = 392 (row and column tails of a 2 x 2 grid), K = 184 (K tail, 3 K tiles: a peeled
    step), f16, silu + bias: tail rows / columns / K chunks are read as zeros, never stored."""
    m, n, k = 300, 392, 184
    a, w, b, _ = _case("f16", m, n, k, seed=1)
    with executors.current().run("gfx950") as sim:
        out = G.gemm(a, shuffle_weight(w), n, k, bias=b, activation="silu", _config=WIDE)
    _assert_wide_launch(sim.launches[0], m, n, k, "f16")
    assert sim.launches[0].counters["global_bytes_written"] == m * n * 2
    ref = torch.nn.functional.silu(a.float() @ w.float().T + b)
    torch.testing.assert_close(out.float(), ref.to(torch.float16).float(), **op_tol(torch.float16, "gemm",
                                                                                    reduction_length=k))


@pytest.mark.flysim_only("reads the launch's block, grid and counters")
def test_wide_tile_reads_a_row_major_w_in_place():
    """w_layout "nk" (bmm's q @ kᵀ operand, row-major [N, K]), batch 2, fp32 output: W rows reach LDS
    by the same DMA as A's."""
    m, n, k, batch = 256, 264, 120, 2
    g = torch.Generator().manual_seed(2)
    a = (torch.randn(batch, m, k, generator=g) / k**0.5).to(torch.bfloat16)
    b = torch.randn(batch, n, k, generator=g).to(torch.bfloat16)
    out = torch.empty(batch, m, n)
    ph = torch.zeros(1)
    n_pad, k_pad = padded_shape(n, k)
    launcher = build_gemm(n, k, n_pad, k_pad, "bf16", "f32", "gfx950", 256, 256, 64, None, False, False, 1, "nk",
                          wm=2)
    with executors.current().run("gfx950") as sim:
        kl.call(launcher, out, a, b, ph, out, ph, ph, m, batch, m * k, n * k, m * n, 1.0, a.numel() * 2, b.numel() * 2,
                out.numel() * 4, 4, 4)
    rec = sim.launches[0]
    assert rec.block == (512, 1, 1) and rec.grid == (1, 2, batch)
    assert rec.counters["global_bytes_read"] == a.numel() * 2 * 2 + b.numel() * 2  # A once per column tile
    torch.testing.assert_close(out, a.float() @ b.float().transpose(1, 2), **op_tol(torch.float32, "gemm"))


# ---- ISA (compiles without a GPU, ~10-30 s) -----------------------------------------------------------
def test_isa_wide_tile():
    """bf16 4096^3, 256x256x64, bias + gelu + residual: 0 spills, VGPR + AGPR <= 240 (FlyDSL's gfx950
    GEMM at this tile, bench.kernels; 2 waves per SIMD with 8-wave workgroups), 128 KiB LDS, C leaves as buffer_store_dwordx4 only, operands arrive by
    LDS DMA (buffer_load_dwordx4 ... lds, no ds_write in the loop), and per K step 64 MFMAs, 24
    ds_read_b128, 8 DMA loads, no VALU: matrix-bound by the hot-loop MODEL (1024 matrix / 384 LDS
    cycles)."""
    from translator_kernels.hotloop import hot_loop
    from translator_kernels.measure.gemm_isa import gemm_isa_text
    from translator_kernels.isa import occupancy

    text, meta = gemm_isa_text(4096, 4096, "bf16", "gfx950", 256, 256, 64, wm=2, activation="gelu", bias=True,
                               residual=True)
    assert meta["vgpr_spill"] == 0 and meta["sgpr_spill"] == 0
    assert meta["vgpr"] + meta["agpr"] <= FLYDSL_A16W16_VGPR and meta["lds"] == 131072
    assert occupancy(meta["vgpr"] + meta["agpr"], meta["sgpr"], meta["lds"], 512, "gfx950")[0] == 2
    stores = re.findall(r"^\s*(buffer_store_\w+|global_store_\w+)", text, flags=re.M)
    assert stores and set(stores) == {"buffer_store_dwordx4"}, sorted(set(stores))
    loop = hot_loop(text, "gfx950")
    steps = loop["counts"]["MFMA"] // 64
    assert steps == 2 and loop["counts"]["MFMA"] == 128 and loop["counts"]["VALU"] == 0
    assert loop["ops"].get("ds_read_b128") == 24 * steps and "ds_write_b128" not in loop["ops"]
    assert len(re.findall(r"buffer_load_dwordx4 .* lds", text)) >= 8 * steps
    assert loop["matrix_cycles"] / steps == 1024 and loop["lds_cycles"] / steps == 384 and loop["bound"] == "matrix"


# ---- slow sweep (-m slow) -----------------------------------------------------------------------------
@pytest.mark.flysim_only("reads the launch's block, grid and counters")
@pytest.mark.slow
@pytest.mark.parametrize("dt", ["bf16", "f16"])
@pytest.mark.parametrize("m,n,k", [(256, 256, 64), (257, 512, 128), (512, 264, 320), (100, 200, 248), (513, 520, 512)])
@pytest.mark.parametrize("epi", [{}, dict(bias=True, activation="gelu_tanh", residual=True, scale=0.25),
                                 dict(activation="relu", out_dtype=torch.float32)], ids=["plain", "full", "f32-out"])
def test_wide_tile_sweep(dt, m, n, k, epi):
    """Row / column / K tails, odd K-tile counts (peeled steps), one-tile K, fp32 output."""
    a, w, b, r = _case(dt, m, n, k, seed=m + n + k)
    epi = dict(epi)
    bias = b if epi.pop("bias", False) else None
    res = r if epi.pop("residual", False) else None
    with executors.current().run("gfx950") as sim:
        out = G.gemm(a, shuffle_weight(w), n, k, bias=bias, residual=res, _config=WIDE, **epi)
    _assert_wide_launch(sim.launches[0], m, n, k, dt)
    y = epi.get("scale", 1.0) * (a.float() @ w.float().T) + (bias if bias is not None else 0.0)
    y = {"gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh"), "relu": torch.relu,
         None: lambda v: v}[epi.get("activation")](y) + (res.float() if res is not None else 0.0)
    torch.testing.assert_close(out.float(), y.to(out.dtype).float(), **op_tol(out.dtype, "gemm", reduction_length=k))
