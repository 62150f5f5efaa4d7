"""RMSNorm folded into the GEMM (translator_kernels/gemm/rownorm.py): rstd(a) ⊙ (a @ (W·diag(γ))ᵀ) per row, the
rstd computed inside the one GEMM launch over the full K (also by split-K workgroups that own a K slice).

On the session's executor against torch: M in {1, 5, 16}, split-K (kw = 4 and kw = 1) and one-tile configs,
fp32 and bf16, K tails (K not a multiple of the tile, nor of kpack), the gated gate / up GEMM; and the
eager norm-then-linear it replaces, within the dtype's GEMM tolerance."""

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels import gemm as G
from translator_kernels.arch import NAMED_DTYPES
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.gated import gated_weight
from translator_kernels.gemm.preshuffle import padded_shape, shuffle_weight

DT = {k: NAMED_DTYPES[k] for k in ("f32", "bf16")}
EPS = 1e-5


def _rstd(a):
    return torch.rsqrt(a.float().pow(2).mean(-1, keepdim=True) + EPS)


def _inputs(dt, m, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (3.0 * torch.randn(m, k, generator=g)).to(DT[dt])  # not unit rows: rstd matters
    w = (torch.randn(n, k, generator=g) / k**0.5).to(DT[dt])
    gamma = (1.0 + 0.5 * torch.randn(k, generator=g)).to(DT[dt])
    return a, w, gamma, g


def _folded(w, gamma):
    return (w.float() * gamma.float()).to(w.dtype)  # what norm_gemm.py prepares


# (dtype, M, N, K, config): split-K with kw = 4 (decode's tile) and kw = 1, one K tile per workgroup, several
# K tiles, K tails (744 = 2 x 256 + 232; 100: not a multiple of bf16's kpack 8, padded with zeros)
CASES = [
    ("bf16", 1, 64, 512, G.GemmConfig(16, 16, 128, split=4, kw=4)),
    ("bf16", 5, 96, 744, G.GemmConfig(16, 64, 256, split=1)),
    ("bf16", 16, 48, 512, G.GemmConfig(16, 64, 128, split=2)),
    ("f32", 1, 32, 256, G.GemmConfig(16, 16, 128, split=2, kw=4)),
    ("f32", 5, 64, 744, G.GemmConfig(16, 64, 128, split=1)),
    ("f32", 16, 40, 100, G.GemmConfig(16, 64, 128)),
    ("bf16", 16, 64, 100, G.GemmConfig(32, 64, 128)),
]


RUNS = [("gfx942", *c) for c in CASES] + [("gfx950", *c) for c in CASES[:1] + CASES[4:5]]  # gfx950: its MFMAs


@pytest.mark.parametrize("arch,dt,m,n,k,cfg", RUNS, ids=[f"{r[0]}-{r[1]}-{r[2]}x{r[3]}x{r[4]}-s{r[5].split}kw{r[5].kw}"
                                                         for r in RUNS])
def test_gemm_rownorm_matches_torch(arch, dt, m, n, k, cfg):
    a, w, gamma, g = _inputs(dt, m, n, k)
    wf = _folded(w, gamma)
    bias = torch.randn(n, generator=g)
    with executors.current().run(arch) as ex:
        out = G.gemm(ex.put(a), ex.put(shuffle_weight(wf)), n, k, bias=ex.put(bias), rms_eps=EPS, _config=cfg)
    assert len(ex.launches) == 1  # the norm, the K loop, split-K's sum and the epilogue: one launch
    ref = _rstd(a) * (a.float() @ wf.float().T) + bias
    torch.testing.assert_close(out.cpu().float(), ref.to(out.dtype).float(), **op_tol(DT[dt], "gemm"))
    # the eager form it replaces: norm (rounded to the dtype), times γ, then the linear
    y = (a.float() * _rstd(a)).to(DT[dt]) * gamma
    eager = (y.float() @ w.float().T + bias).to(DT[dt])
    torch.testing.assert_close(out.cpu(), eager, **op_tol(DT[dt], "gemm"))


@pytest.mark.parametrize("dt", ["bf16", "f32"])
def test_gated_gemm_rownorm_matches_torch(dt):
    m, n, k = 5, 128, 256
    a, w, gamma, g = _inputs(dt, m, n, k)
    wu = (torch.randn(n, k, generator=g) / k**0.5).to(DT[dt])
    wgf, wuf = _folded(w, gamma), _folded(wu, gamma)
    with executors.current().run("gfx942") as ex:
        out = G.gemm_gated(ex.put(a), ex.put(gated_weight(wgf, wuf)), n, k, "silu", rms_eps=EPS)
    assert len(ex.launches) == 1
    r = _rstd(a)
    ref = torch.nn.functional.silu(r * (a.float() @ wgf.float().T)) * (r * (a.float() @ wuf.float().T))
    torch.testing.assert_close(out.cpu().float(), ref.to(out.dtype).float(), **op_tol(DT[dt], "gemm"))


def test_rownorm_errors_name_what_it_takes():
    from translator_kernels.gemm.kernel import build_gemm

    with pytest.raises(KernelInputError, match="rownorm"):
        build_gemm(64, 64, 64, 64, "bf16", "bf16", "gfx942", 16, 16, 64, None, False, False, w_layout="nk",
                   rownorm=(EPS, 64))
    with pytest.raises(KernelInputError, match="needs K"):
        build_gemm(64, 70000, 64, 70016, "f32", "f32", "gfx942", 16, 64, 128, None, False, False,
                   rownorm=(EPS, 70000))
    a = torch.randn(2, 64)
    with pytest.raises(KernelInputError, match="rms_eps needs a in the weight's dtype"):
        G.gemm(a, shuffle_weight(torch.randn(32, 64).bfloat16()), 32, 64, rms_eps=EPS)


@pytest.mark.flysim_only("reads flysim's counted global bytes")
@pytest.mark.parametrize("m,k,cfg", [(1, 512, CASES[0][4]), (5, 744, CASES[1][4])], ids=["m1-split4", "m5-one-tile"])
def test_prologue_reads_its_rows_once_more(m, k, cfg):
    """What the prologue costs in bytes (docs/llama-layer.md, the timing MODEL): every workgroup reads its rows of A
    over the full K once more (its valid rows only: the groups past M are skipped), nothing else changes."""
    n = 64
    a, w, gamma, _ = _inputs("bf16", m, n, k)
    ws = shuffle_weight(_folded(w, gamma))
    with executors.current().run("gfx942") as ex:
        for eps in (None, EPS):
            G.gemm(ex.put(a), ex.put(ws), n, k, rms_eps=eps, _config=cfg)
    plain, folded = (rec.counters["global_bytes_read"] for rec in ex.launches)
    workgroups_per_row_tile = -(-padded_shape(n, k)[0] // cfg.bn) * cfg.split
    assert folded - plain == workgroups_per_row_tile * m * k * 2, (plain, folded)
