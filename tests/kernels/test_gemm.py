"""Preshuffle MFMA GEMM on the session's executor (tests/executors.py; both archs) against eager torch,
plus layout/heuristic checks.

On flysim the numeric tests also assert that flysim's MFMA counter equals the count the tile grid
implies (tiles x 16x16x32 blocks x MFMAs per block): counters exist only there (`ex.counts`). References for bf16/fp16 are computed in fp32 from the
same (rounded) inputs. Default run: a covering subset; the full issue sweep is `-m slow`.
"""

import itertools

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
import gemm_isa_jobs  # tests/kernels: the GEMM ISA compiles, batched per arch (conftest gemm_isa)
from translator.tolerances import op_tol
from translator_kernels import gemm as G
from translator_kernels.arch import ARCHS, NAMED_DTYPES
from translator_kernels.gemm.kernel import mfma_per_block
from translator_kernels.gemm.preshuffle import (padded_shape, shuffle_weight, shuffle_weight_batched,
                                           unshuffle_weight)

DT = {k: NAMED_DTYPES[k] for k in ("f32", "bf16", "f16")}
# One dtype-keyed table. fp32 override: rtol 1e-4 because the kernel sums K products in MFMA
# order (4-deep partial sums per 16x16x4 step), not torch's order; K up to 4096.
TOL = {k: op_tol(dt, "gemm") for k, dt in DT.items()}
MFMA_NAME = {("f32", "gfx942"): "mfma.f32.16x16x4f32", ("f32", "gfx950"): "mfma.f32.16x16x4f32",
             ("bf16", "gfx942"): "mfma.f32.16x16x16bf16.1k", ("bf16", "gfx950"): "mfma.f32.16x16x32.bf16",
             ("f16", "gfx942"): "mfma.f32.16x16x16f16", ("f16", "gfx950"): "mfma.f32.16x16x32.f16"}
ACTS = {None: lambda y: y, "relu": torch.relu, "gelu": torch.nn.functional.gelu,
        "gelu_tanh": lambda y: torch.nn.functional.gelu(y, approximate="tanh"), "silu": torch.nn.functional.silu}


def _inputs(dt, m, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) / k**0.5).to(DT[dt])
    w = torch.randn(n, k, generator=g).to(DT[dt])
    return a, w, g


def _ref(a, w, *, bias=None, activation=None, residual=None, scale=1.0):
    y = scale * (a.float() @ w.float().T)
    if bias is not None:
        y = y + bias.float()
    y = ACTS[activation](y)
    if residual is not None:
        y = y + residual.float()
    return y


def _check(out, ref, dt):
    torch.testing.assert_close(out.cpu().float(), ref.to(out.dtype).float(), **TOL[dt])


def _run(arch):
    return executors.current().run(arch)


def _mfma_total(rec):
    return sum(rec.counters["mfma_by_kind"].values())


def run_gemm(arch, dt, m, n, k, *, bias=False, activation=None, residual=False, scale=1.0, seed=0):
    a, w, g = _inputs(dt, m, n, k, seed)
    b = torch.randn(n, generator=g) if bias else None
    r = torch.randn(m, n, generator=g).to(DT[dt]) if residual else None
    ws = shuffle_weight(w)
    with _run(arch) as ex:
        out = G.gemm(ex.put(a), ex.put(ws), n, k, bias=ex.put(b), activation=activation, residual=ex.put(r),
                     scale=scale)
    assert out.shape == (m, n) and out.dtype == DT[dt]
    _check(out, _ref(a, w, bias=b, activation=activation, residual=r, scale=scale), dt)
    cfg = G.choose_config(G.m_bucket(m), n, k, DT[dt], arch)
    assert len(ex.launches) == 1  # split-K adds its partial sums inside the one launch
    rec = ex.launches[0]
    if ex.counts:  # flysim counts the MFMAs it executed
        assert rec.counters["mfma_by_kind"] == {MFMA_NAME[dt, arch]: G.expected_mfma_count(m, n, k, dt, arch, cfg)}
    return rec


# (dtype, M, N, K, epilogue) -- covers each dtype, M tail, N and K not multiples of the tile,
# a multi-step K loop, single-step K, and every epilogue piece.
EPI_FULL = dict(bias=True, activation="gelu", residual=True, scale=0.5)
CASES = [  # K = 744: three steps of the chosen 256-deep K tile, the last one a 232 tail
    ("f32", 17, 96, 744, EPI_FULL),
    ("bf16", 17, 96, 744, EPI_FULL),
    ("f16", 17, 96, 744, EPI_FULL),
    ("bf16", 1, 64, 64, {}),
    ("bf16", 128, 1000, 96, dict(bias=True, activation="relu")),
    ("f32", 300, 64, 96, dict(activation="silu")),
    ("bf16", 33, 160, 768, dict(activation="gelu_tanh", residual=True)),
]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt,m,n,k,epi", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}x{c[3]}" for c in CASES])
def test_gemm_flysim(arch, dt, m, n, k, epi):
    run_gemm(arch, dt, m, n, k, **epi)


def test_one_compile_serves_all_m():
    """M is a runtime argument: two M in one bucket reuse one launcher and one compiled kernel."""
    k, n = 64, 64
    w = torch.randn(n, k)
    ws = shuffle_weight(w)
    with _run("gfx942") as ex:
        for m in (3, 11):
            a = torch.randn(m, k) / 8
            _check(G.gemm(ex.put(a), ex.put(ws), n, k), _ref(a, w), "f32")
    info = G.build_gemm.cache_info()
    assert info.hits >= 1


@pytest.mark.parametrize("arch", ARCHS)
def test_gemm_precision_mode_bf16_weight(arch):
    """fp32 activation x bf16 preshuffled weight: A is cast to bf16, output stays fp32."""
    m, n, k = 5, 64, 96
    a = torch.randn(m, k) / k**0.5
    w = torch.randn(n, k).to(torch.bfloat16)
    with _run(arch) as ex:
        out = G.gemm(ex.put(a), ex.put(shuffle_weight(w)), n, k)
    assert out.dtype == torch.float32
    _check(out, _ref(a.to(torch.bfloat16), w), "bf16")


def test_gemm_k_not_multiple_of_kpack_and_3d_input():
    """K=250 (not a multiple of 8 bf16): A is zero-padded to 16-byte rows; [..., K] inputs flatten."""
    n, k = 70, 250
    a = (torch.randn(2, 3, k) / k**0.5).to(torch.bfloat16)
    w = torch.randn(n, k).to(torch.bfloat16)
    with _run("gfx950") as ex:
        out = G.gemm(ex.put(a), ex.put(shuffle_weight(w)), n, k, out_dtype=torch.float32)
    assert out.shape == (2, 3, n) and out.dtype == torch.float32
    _check(out, _ref(a.reshape(6, k), w).reshape(2, 3, n), "bf16")


@pytest.mark.parametrize("arch", ARCHS)
def test_bmm_3d_and_broadcast_4d(arch):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 17, 40, generator=g) / 6
    b = torch.randn(3, 40, 70, generator=g)
    a4 = (torch.randn(2, 1, 9, 64, generator=g) / 8).to(torch.bfloat16)
    b4 = torch.randn(1, 3, 64, 32, generator=g).to(torch.bfloat16)
    with _run(arch) as ex:
        out = G.bmm(ex.put(a), ex.put(b))
        out4 = G.bmm(ex.put(a4), ex.put(b4))
    _check(out, a @ b, "f32")
    _check(out4, a4.float() @ b4.float(), "bf16")
    assert out4.shape == (2, 3, 9, 32)
    cfg = G.choose_config(16, 70, 40, torch.float32, arch)
    assert len(ex.launches) == 2
    if ex.counts:  # flysim counts the MFMAs it executed
        assert _mfma_total(ex.launches[0]) == G.expected_mfma_count(17, 70, 40, "f32", arch, cfg, batch=3)


def test_entry_point_errors_name_the_fix():
    w = shuffle_weight(torch.randn(64, 64))
    with pytest.raises(ValueError, match="padded|expected"):
        G.gemm(torch.randn(4, 64), w[:, :32], 64, 64)
    with pytest.raises(ValueError, match="float64"):
        G.gemm(torch.randn(4, 64, dtype=torch.float64), w, 64, 64)
    with pytest.raises(ValueError, match="activation"):
        G.gemm(torch.randn(4, 64), w, 64, 64, activation="cosh")
    with pytest.raises(ValueError, match="takes 2 params"):
        G.gemm(torch.randn(4, 64), w, 64, 64, activation="gelu;clamp(1.0)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_preshuffle_roundtrip_and_batched(dtype):
    w = torch.randn(3, 70, 100).to(dtype)
    ws = shuffle_weight_batched(w)
    assert ws.shape == (3,) + padded_shape(70, 100)
    for i in range(3):
        assert torch.equal(ws[i], shuffle_weight(w[i]))
        assert torch.equal(unshuffle_weight(ws[i], 70, 100), w[i])


def test_choose_config_is_legal_everywhere():
    for mb, n, k, dt, arch in itertools.product((4, 16, 32, 64, 128), (64, 96, 768, 1000, 4096),
                                                (64, 96, 768, 1000, 4096), ("f32", "bf16", "f16"), ARCHS):
        cfg = G.choose_config(mb, n, k, dt, arch)
        assert G.config_fits(cfg, dt, arch) is None
        assert padded_shape(n, k)[1] % (cfg.bk * cfg.split) == 0 and cfg.bm <= max(16, mb)
        assert mfma_per_block(dt, arch) in (1, 2, 8)


@pytest.mark.parametrize("arch", ARCHS)
def test_isa_chosen_tile_no_spills(arch, gemm_isa):
    """The large-M bf16 tile compiles to ISA with 0 spills and the arch's MFMA (full table: docs/gemm.md)."""
    cfg = G.choose_config(128, 4096, 4096, "bf16", arch)
    s = gemm_isa_jobs.row(gemm_isa("chosen", arch), "chosen", arch)
    assert (s["bm"], s["bn"], s["bk"]) == (cfg.bm, cfg.bn, cfg.bk)
    assert s["vgpr_spill"] == 0 and s["sgpr_spill"] == 0
    assert s["mfma_ops"] == (["v_mfma_f32_16x16x32_bf16"] if arch == "gfx950" else ["v_mfma_f32_16x16x16_bf16"])
    assert s["lds_bytes"] == 2 * cfg.bm * cfg.bk * 2


SWEEP_MNK = list(itertools.product((1, 17, 128, 300), (64, 96, 768, 1000, 4096), (64, 96, 768, 1000, 4096)))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt", list(DT))
@pytest.mark.parametrize("m,n,k", SWEEP_MNK)
def test_gemm_sweep(arch, dt, m, n, k):
    run_gemm(arch, dt, m, n, k, **EPI_FULL)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("dt", list(DT))
def test_gemm_epilogue_sweep(arch, act, dt):
    run_gemm(arch, dt, 17, 96, 1000, bias=True, activation=act, residual=True, scale=0.25)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("mb", [16, 32, 64, 128, 4096])
def test_isa_sweep_no_spills(arch, dt, mb):
    """The chosen config itself (split-K, K-split waves, gfx950's 8-wave tile) with a full epilogue."""
    from translator_kernels.measure.gemm_isa import isa_stats

    cfg = G.choose_config(mb, 4096, 4096, dt, arch)
    s = isa_stats(4096, 4096, dt, arch, cfg.bm, cfg.bn, cfg.bk, activation="gelu", bias=True, residual=True,
                  split=cfg.split, kw=cfg.kw, wm=cfg.wm, head=cfg.head, ring=cfg.ring, quad=cfg.quad)
    assert s["vgpr_spill"] == 0 and s["sgpr_spill"] == 0


# ---- epilogue programs: chains of per-element steps with scalar constants ----------------------
F = torch.nn.functional
PROGRAMS = [  # (program, the same math written in torch, dtype)
    ("mul(2.0);sigmoid", lambda y: torch.sigmoid(y * 2.0), "f32"),
    ("gelu;clamp(-0.25,0.75)", lambda y: F.gelu(y).clamp(-0.25, 0.75), "bf16"),
    ("div(3.0);tanh;sub(0.5);neg;abs;exp", lambda y: torch.exp(torch.abs(-(torch.tanh(y / 3.0) - 0.5))), "f32"),
    ("leaky_relu(0.1);hardswish;add(1.0);softplus(2.0,5.0)",
     lambda y: F.softplus(F.hardswish(F.leaky_relu(y, 0.1)) + 1.0, 2.0, 5.0), "f16"),
    (gemm_isa_jobs.LONG_PROGRAM,
     lambda y: F.elu(F.gelu(F.mish(torch.clamp(F.silu(torch.relu(1.0 - F.hardsigmoid(y))), max=0.3)),
                            approximate="tanh"), 0.5), "f32"),
]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("prog,fn,dt", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_gemm_epilogue_program_flysim(arch, prog, fn, dt):
    """The program runs after scale and bias and before the residual, in fp32, in the kernel."""
    m, n, k = 19, 80, 96
    a, w, g = _inputs(dt, m, n, k)
    b = torch.randn(n, generator=g)
    r = torch.randn(m, n, generator=g).to(DT[dt])
    with _run(arch) as ex:
        out = G.gemm(ex.put(a), ex.put(shuffle_weight(w)), n, k, bias=ex.put(b), activation=prog, residual=ex.put(r),
                     scale=0.5)
    assert len(ex.launches) == 1
    _check(out, fn(0.5 * (a.float() @ w.float().T) + b) + r.float(), dt)


def test_epilogue_program_is_in_the_cache_key():
    k, n = 64, 64
    a, w = torch.randn(5, k) / 8, torch.randn(n, k)
    ws = shuffle_weight(w)
    with _run("gfx942") as ex:
        ad, wsd = ex.put(a), ex.put(ws)
        relu = G.gemm(ad, wsd, n, k, activation="relu")
        clamp = G.gemm(ad, wsd, n, k, activation="clamp(0.0,0.1)")
        before = G.build_gemm.cache_info().misses
        again = G.gemm(ad, wsd, n, k, activation="clamp(0,0.1)")  # the same program, spelled otherwise
    assert G.build_gemm.cache_info().misses == before
    _check(relu, torch.relu(a @ w.T), "f32")
    _check(clamp, torch.clamp(a @ w.T, 0.0, 0.1), "f32")
    assert torch.equal(again, clamp) and not torch.equal(relu, clamp)


@pytest.mark.parametrize("arch", ARCHS)
def test_isa_long_epilogue_program_no_spills(arch, gemm_isa):
    """The largest bf16 tile with a long program (every transcendental kind) still has 0 spills."""
    s = gemm_isa_jobs.row(gemm_isa("long_program", arch), "long_program", arch)
    assert s["activation"] == PROGRAMS[4][0] and s["bias"] and s["residual"]  # the table's job is this one
    assert s["vgpr_spill"] == 0 and s["sgpr_spill"] == 0
