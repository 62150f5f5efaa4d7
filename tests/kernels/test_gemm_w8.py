"""Weight-only int8 GEMM (translator_kernels.gemm.w8) on the session's executor (tests/executors.py), both
archs: the int8 weight is converted in the load path; one launch, the activation dtype's MFMAs, numerics
equal to the torch reference of the same math (fp32 matmul of a and the int8 values, x scale, + bias, one
cast) within the gemm tolerance. The test of the bytes read is flysim_only (flysim counts them)."""

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels.arch import ARCHS
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm import w8 as W


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt,m,n,k,bias", [(torch.bfloat16, 17, 96, 272, False), (torch.float16, 130, 160, 256, True),
                                           (torch.float32, 3, 64, 2048, True), (torch.bfloat16, 1, 48, 1000, False)])
def test_gemm_w8_flysim(arch, dt, m, n, k, bias):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).to(dt)
    w8 = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    s = torch.rand(n, generator=g) / 100
    b = torch.randn(n, generator=g) if bias else None
    ws = W.shuffle_weight_w8(w8, dt)
    assert torch.equal(W.unshuffle_weight_w8(ws, n, k, dt), w8)
    with executors.current().run(arch) as ex:
        out = W.gemm_w8(ex.put(a), ex.put(ws), n, k, ex.put(s), bias=ex.put(b))
    assert out.dtype == dt and out.shape == (m, n) and len(ex.launches) == 1
    torch.testing.assert_close(out.cpu().float(), W.ref_gemm_w8(a, w8, s, b).float(), **op_tol(dt, "gemm"))


@pytest.mark.flysim_only("reads flysim's counted global bytes")
def test_gemm_w8_reads_int8_bytes():
    """The weight moves as int8: against the same GEMM on the dequantized bf16 weight, the launch reads
    exactly W_pad bytes x row tiles fewer (the bf16 weight's second byte); A and the rest are the same."""
    from translator_kernels import gemm as G
    from translator_kernels.gemm.preshuffle import padded_shape, shuffle_weight

    m, n, k, dt = 16, 64, 512, torch.bfloat16
    g = torch.Generator().manual_seed(1)
    a, w8 = torch.randn(m, k, generator=g).to(dt), torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    s = torch.ones(n)
    cfg = G.GemmConfig(16, 64, 64)
    with executors.current().run("gfx942") as sim:
        W.gemm_w8(a, W.shuffle_weight_w8(w8, dt), n, k, s, _config=cfg)
        G.gemm(a, shuffle_weight(w8.to(dt)), n, k, _config=cfg)
    r8, r16 = (x.counters["global_bytes_read"] for x in sim.launches)
    n_pad, k_pad = padded_shape(n, k)
    # one workgroup: half the weight's bf16 bytes fewer, minus the scale its 256 lanes read (4 B each)
    assert r16 - r8 == n_pad * k_pad - 256 * 4


def test_gemm_w8_rejects_a_float_weight():
    with executors.current().run("gfx942") as ex, pytest.raises(KernelInputError, match="int8"):
        W.gemm_w8(ex.put(torch.randn(2, 32)), ex.put(torch.zeros(32, 32)), 32, 32, ex.put(torch.ones(32)))
