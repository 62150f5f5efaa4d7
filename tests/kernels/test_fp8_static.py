"""fp8 linears with a static activation scale (translator_kernels.gemm.fp8_static) on the session's executor, both
archs: the static-scale quantize kernel bit-exact to torch's e4m3fn rounding (clamped values included; gfx942's
fnuz halves exactly half of it), and the two-launch linear (quantize + block-scaled or per-tensor fp8 GEMM) against
the torch math of the e4m3fn form within the gemm tolerance, M / N tails, bias."""

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels.arch import ARCHS
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm import fp8 as F
from translator_kernels.gemm import fp8_static as S
from translator_kernels.gemm.quantize import quantize_static

E4M3 = torch.float8_e4m3fn
FP8_MFMA = {"mfma.f32.16x16x32.fp8.fp8", "mfma.scale.f32.16x16x128.f8f6f4"}


@pytest.mark.parametrize("arch", ARCHS)
def test_quantize_static_is_the_e4m3fn_rounding(arch):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(7, 96, generator=g) * 3).to(torch.bfloat16)
    x[0, :4] = torch.tensor([1e4, -1e4, 0.0, 5e-7])  # clamped both ways, a zero, a value below fp8's range
    sa = torch.tensor([0.02])
    halves = arch == "gfx942"
    with executors.current().run(arch) as ex:
        q = quantize_static(ex.put(x), ex.put(sa), "fp8", 224.0 if halves else None, 2.0 if halves else 1.0).cpu()
    assert len(ex.launches) == 1 and q.dtype == F.fp8_dtype(arch)
    want = (x.float() / sa).clamp(-448, 448).to(E4M3).float()
    assert torch.equal(q.float() * (2 if halves else 1), want)


# (M, N, K, block weight scales, bias, x dtype)
CASES = [(5, 160, 256, True, True, torch.bfloat16), (33, 48, 384, True, False, torch.float16),
         (3, 72, 96, False, True, torch.bfloat16), (17, 64, 128, False, False, torch.float32)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}x{c[1]}x{c[2]}-{'block' if c[3] else 'tensor'}" for c in CASES])
def test_fp8_static_linear(arch, case):
    m, n, k, block, has_bias, dt = case
    g = torch.Generator().manual_seed(1)
    if block:
        wq, ws = F.quantize_fp8_blocks(torch.randn(n, k, generator=g), E4M3, (128, 128))
    else:
        wq, ws = F.quantize_fp8(torch.randn(n, k, generator=g), E4M3)
    x = (torch.randn(m, k, generator=g) * 2).to(dt)
    sa = torch.tensor(0.02)  # x / sa clamps at |x| = 8.96 (4.5 sigma): the calibrated range of such a model
    bias = torch.randn(n, generator=g) if has_bias else None
    wp, sp = S.prepare_static_weight(arch, wq, ws)
    with executors.current().run(arch) as ex:
        out = S.fp8_static_linear(ex.put(x), ex.put(wp), n, k, ex.put(sp), ex.put(sa), bias=ex.put(bias)).cpu()
    assert out.shape == (m, n) and out.dtype == dt
    assert len(ex.launches) == 2  # the quantize, the GEMM
    if ex.counts:
        assert FP8_MFMA & set(ex.launches[1].counters["mfma_by_kind"])
    ref = S.ref_fp8_static_linear(x, wq, ws, sa, bias)
    torch.testing.assert_close(out.float(), ref.float(), **op_tol(dt, "gemm"))
    deq = (x.float() @ (wq.float() * (ws.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k] if block
                                      else ws)).t())
    assert ((ref.float() - deq).norm() / deq.norm()) < 0.1  # the fp8 math is close to the unquantized product


def test_fp8_static_rejects_bad_input():
    wq, ws = F.quantize_fp8(torch.randn(32, 64), E4M3)
    with pytest.raises(KernelInputError, match="float8_e4m3fn"):
        S.prepare_static_weight("gfx950", wq.float(), ws)
    wp, sp = S.prepare_static_weight("gfx950", wq, ws)
    with executors.current().run("gfx950"):
        with pytest.raises(KernelInputError, match="one value"):
            S.fp8_static_linear(torch.randn(3, 64), wp, 32, 64, sp, torch.ones(3))
        with pytest.raises(KernelInputError, match="power of two"):
            quantize_static(torch.randn(3, 64), torch.ones(1), "fp8", None, 3.0)
