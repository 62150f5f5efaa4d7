"""A narrow weight with a long K at M > 64 (a MoE router: N = 64, K = 7168): the large tile gave the whole K loop to
one workgroup (MODEL 237 us at M = 128; AITER's tuned FlyDSL kernel is measured at 5.9 us, the ROCm blog's decode
GEMMs). `tiles._starved` sends such shapes to the split-K ranking; short-K small GEMMs keep the large tile."""

import pytest
import torch

from translator.tolerances import op_tol

import executors  # the session's executor (tests/executors.py)
from translator_kernels import gemm as G
from translator_kernels.arch import ARCHS
from translator_kernels.gemm import tiles
from translator_kernels.gemm.preshuffle import shuffle_weight


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("m,n,k", [(128, 64, 7168), (128, 128, 2880), (2048, 64, 7168), (4096, 64, 7168)])
def test_starved_large_tile_takes_a_split_k_tile(arch, m, n, k):
    large = tiles._large(tiles.m_bucket(m), n, k, "bf16", arch)
    cfg = tiles.choose_config(tiles.m_bucket(m), n, k, "bf16", arch)
    e, e_large = (tiles.model_estimate(m, n, k, "bf16", arch, c) for c in (cfg, large))
    assert cfg != large and e["grid"] >= 4 * e_large["grid"]
    assert e["kernel_t"] < 0.25 * e_large["kernel_t"], (cfg, e["kernel_t"], e_large["kernel_t"])


@pytest.mark.parametrize("arch", ARCHS)
def test_short_k_small_gemm_keeps_the_large_tile(arch):
    for m, n, k in ((256, 512, 512), (128, 4096, 256)):
        assert tiles.choose_config(m, n, k, "bf16", arch) == tiles._large(m, n, k, "bf16", arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_starved_shape_runs_split_k_in_one_launch(arch):
    """M = 100 (bucket 128), N = 64, K = 1024: the chosen split-K tile, one launch, numerics against torch."""
    m, n, k = 100, 64, 1024
    cfg = G.choose_config(G.m_bucket(m), n, k, torch.bfloat16, arch)
    assert cfg.split > 1 and cfg != tiles._large(G.m_bucket(m), n, k, "bf16", arch)
    g = torch.Generator().manual_seed(3)
    a = (torch.randn(m, k, generator=g) / k**0.5).to(torch.bfloat16)
    w = torch.randn(n, k, generator=g).to(torch.bfloat16)
    with executors.current().run(arch) as ex:
        out = G.gemm(ex.put(a), ex.put(shuffle_weight(w)), n, k)
    assert len(ex.launches) == 1
    torch.testing.assert_close(out.cpu().float(), (a.float() @ w.float().T).to(torch.bfloat16).float(),
                               **op_tol(torch.bfloat16, "gemm"))
