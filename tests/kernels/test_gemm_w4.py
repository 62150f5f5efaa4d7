"""Weight-only group-wise int4 GEMM (translator_kernels.gemm.w4) on the session's executor, both archs: the packed
codes are unpacked and dequantized (q * s + b per group of 32 / 64 / 128 along K) in the load path; one launch, the
activation dtype's MFMAs, numerics equal to the torch reference of the same math within the gemm tolerance."""

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels.arch import ARCHS
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm import w4 as W
from translator_kernels.gemm.tiles import GemmConfig


def _case(n, k, group, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g)
    s = torch.rand(k // group, n, generator=g) / 50 + 1e-3
    b = torch.randn(k // group, n, generator=g) / 20
    return q, s, b, g


# (dtype, M, N, K, group, bias, config): M / N tails, split-K decode tiles, kw = 4, several groups per tile
CASES = [(torch.bfloat16, 17, 96, 256, 32, False, None), (torch.float16, 130, 160, 384, 128, True, None),
         (torch.bfloat16, 1, 48, 2048, 64, True, None), (torch.bfloat16, 40, 64, 512, 32, False, GemmConfig(32, 64, 128))]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[1]}x{c[2]}x{c[3]}-g{c[4]}" for c in CASES])
def test_gemm_w4_flysim(arch, case):
    dt, m, n, k, group, with_bias, cfg = case
    q, s, b, g = _case(n, k, group)
    a = torch.randn(m, k, generator=g).to(dt)
    bias = torch.randn(n, generator=g) if with_bias else None
    wp = W.pack_weight_w4(q)
    assert torch.equal(W.unpack_weight_w4(wp, n, k), q.to(torch.uint8))
    with executors.current().run(arch) as ex:
        out = W.gemm_w4(ex.put(a), ex.put(wp), n, k, group, ex.put(s), ex.put(b), bias=ex.put(bias), _config=cfg)
    assert out.dtype == dt and out.shape == (m, n) and len(ex.launches) == 1
    torch.testing.assert_close(out.cpu().float(), W.ref_gemm_w4(a, q, s, b, group, bias).float(), **op_tol(dt, "gemm"))


@pytest.mark.flysim_only("reads flysim's counted global bytes")
def test_gemm_w4_reads_a_quarter_of_the_weight_bytes():
    """Against the same GEMM on the dequantized bf16 weight, the launch reads 3/4 of the bf16 weight's bytes fewer,
    plus the s and b its lanes read (4 B each per column block and K block; groups of 32: one group per K block, so
    no two of those loads are the same and the compiler merges none)."""
    from translator_kernels import gemm as G
    from translator_kernels.gemm.preshuffle import padded_shape, shuffle_weight

    m, n, k, dt, group = 16, 64, 512, torch.bfloat16, 32
    q, s, b, g = _case(n, k, group, seed=1)
    a = torch.randn(m, k, generator=g).to(dt)
    cfg = G.GemmConfig(16, 64, 64)
    with executors.current().run("gfx942") as sim:
        W.gemm_w4(a, W.pack_weight_w4(q), n, k, group, s, b, _config=cfg)
        G.gemm(a, shuffle_weight(W.dequantize_w4(q, s, b, group).to(dt)), n, k, _config=cfg)
    r4, r16 = (x.counters["global_bytes_read"] for x in sim.launches)
    n_pad, k_pad = padded_shape(n, k)
    scale_bytes = 2 * 4 * 256 * (k_pad // 32)  # s and b: every lane, each 32-deep K block
    assert r16 - r4 == n_pad * k_pad * 2 * 3 // 4 - scale_bytes


def test_gemm_w4_rejects_bad_groups():
    q, s, b, _ = _case(32, 96, 32)
    with executors.current().run("gfx942") as ex, pytest.raises(KernelInputError, match="group"):
        W.gemm_w4(ex.put(torch.randn(2, 96).to(torch.bfloat16)), ex.put(W.pack_weight_w4(q)), 32, 96, 48,
                  ex.put(s), ex.put(b))
