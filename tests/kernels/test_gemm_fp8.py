"""fp8 GEMM (translator_kernels.gemm.fp8) on the session's executor (tests/executors.py), both archs,
against the torch reference of the same quantized math (fp32 matmul of the 8-bit values, then the scales
and the epilogue in the kernel's order). Each case asserts one launch, the MFMA kind and count the tile
grid implies (on flysim: counters exist only there, `ex.counts`), and the numerics: flysim's MFMAs are
fp32 and every fp8 x fp8 product is exact in fp32, so the only difference left is the order of the fp32
sums (the gemm tolerance of translator.tolerances for the output dtype)."""

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels.arch import ARCHS
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm import fp8 as F

MFMA = {"gfx942": "mfma.f32.16x16x32.{a}.{w}", "gfx950": "mfma.scale.f32.16x16x128.f8f6f4"}

# (A format, W format, M, N, K, a_scale, w_scale, epilogue, out dtype)
CASES = [
    ("fp8", "fp8", 17, 96, 272, "row", "col", {}, torch.bfloat16),  # split-K decode tile, K tail of 16
    ("bf8", "bf8", 5, 64, 128, "tensor", "tensor", dict(bias=True, activation="gelu", residual=True), torch.float16),
    ("fp8", "bf8", 130, 160, 256, "row", "col", dict(bias=True, scale=0.5), torch.bfloat16),  # 128-row tile, M tail
    ("fp8", "fp8", 3, 64, 2048, "row", "col", dict(activation="silu"), torch.float32),  # kw = 4, split 2
    ("fp8", "fp8", 33, 48, 96, None, None, dict(scale=0.25), torch.bfloat16),  # no scales, N tail
]


def _case(arch, fa, fw, m, n, k, sa_mode, sw_mode, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 4  # per-token ranges differ
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g)
    aq, sa = F.quantize_fp8(a, F.fp8_dtype(arch, fa), dim=None if sa_mode == "tensor" else -1)
    wq, sw = F.quantize_fp8(w, F.fp8_dtype(arch, fw), dim=None if sw_mode == "tensor" else -1)
    return aq, wq, (sa if sa_mode else None), (sw if sw_mode else None), g


def run_fp8(arch, fa, fw, m, n, k, sa_mode, sw_mode, epi, out_dtype):
    aq, wq, sa, sw, g = _case(arch, fa, fw, m, n, k, sa_mode, sw_mode)
    bias = torch.randn(n, generator=g) if epi.get("bias") else None
    res = torch.randn(m, n, generator=g).to(out_dtype) if epi.get("residual") else None
    kw = dict(bias=bias, activation=epi.get("activation"), residual=res, scale=epi.get("scale", 1.0))
    with executors.current().run(arch) as ex:
        out = F.gemm_fp8(ex.put(aq), ex.put(F.shuffle_weight_fp8(wq)), n, k, a_scale=ex.put(sa), w_scale=ex.put(sw),
                         out_dtype=out_dtype, **{key: ex.put(val) for key, val in kw.items()})
    out = out.cpu()
    ref = F.ref_gemm_fp8(aq, wq, sa, sw, out_dtype=out_dtype, **kw)
    assert out.shape == (m, n) and out.dtype == out_dtype
    torch.testing.assert_close(out.float(), ref.float(), **op_tol(out_dtype, "gemm"))
    assert len(ex.launches) == 1
    cfg = F.choose_fp8_config(F.m_bucket(m), n, k, arch)
    if ex.counts:  # flysim counts the MFMAs it executed
        assert ex.launches[0].counters["mfma_by_kind"] == {
            MFMA[arch].format(a=fa, w=fw): F.expected_mfma_count_fp8(m, n, k, arch, cfg)}
    return out, ref, cfg


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}x{c[1]}-{c[2]}x{c[3]}x{c[4]}-{c[5]}" for c in CASES])
def test_gemm_fp8_flysim(arch, case):
    run_fp8(arch, *case)


@pytest.mark.parametrize("arch", ARCHS)
def test_gemm_fp8_dequantized_matmul(arch):
    """The kernel against the dequantize-then-matmul form (what a user writes): the same up to the
    output rounding, and close to the unquantized fp32 product (fp8 error, a few %)."""
    m, n, k = 16, 64, 256
    g = torch.Generator().manual_seed(1)
    a, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    aq, sa = F.quantize_fp8(a, F.fp8_dtype(arch), dim=-1)
    wq, sw = F.quantize_fp8(w, F.fp8_dtype(arch), dim=-1)
    with executors.current().run(arch) as ex:
        out = F.gemm_fp8(ex.put(aq), ex.put(F.shuffle_weight_fp8(wq)), n, k, a_scale=ex.put(sa), w_scale=ex.put(sw),
                         out_dtype=torch.float32).cpu()
    deq = (aq.float() * sa) @ (wq.float() * sw).t()
    torch.testing.assert_close(out, deq, **op_tol(torch.float32, "gemm"))
    rel = ((out - a @ w.t()).norm() / (a @ w.t()).norm()).item()
    assert rel < 0.1, rel


def test_gemm_fp8_split_k_used():
    """The decode shapes of CASES run split-K inside the launch (the reduction order is fixed)."""
    assert F.choose_fp8_config(4, 64, 2048, "gfx942").split > 1
    assert F.choose_fp8_config(16, 96, 272, "gfx950").split > 1


@pytest.mark.parametrize("arch", ARCHS)
def test_gemm_fp8_rejects_bad_input(arch):
    other = {"gfx942": torch.float8_e4m3fn, "gfx950": torch.float8_e4m3fnuz}[arch]
    w = torch.zeros(32, 64).to(F.fp8_dtype(arch))
    ws = F.shuffle_weight_fp8(w)
    with executors.current().run(arch) as ex:
        with pytest.raises(KernelInputError, match="not an 8-bit float format of"):
            F.gemm_fp8(ex.put(torch.zeros(2, 64).to(other)), ex.put(ws), 32, 64)
        with pytest.raises(KernelInputError, match="per row"):
            F.gemm_fp8(ex.put(torch.zeros(2, 64).to(F.fp8_dtype(arch))), ex.put(ws), 32, 64,
                       a_scale=ex.put(torch.ones(3)))
    with pytest.raises(KernelInputError, match="K % 16"):
        F.shuffle_weight_fp8(torch.zeros(4, 40).to(F.fp8_dtype(arch)))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt,fmt,k", [(torch.bfloat16, "fp8", 272), (torch.float32, "bf8", 1040),
                                      (torch.float16, "fp8", 16)])
def test_quantize_rows_is_quantize_fp8(arch, dt, fmt, k):
    """The per-token quantize kernel equals fp8.quantize_fp8(x, dim=-1) bit for bit (a zero row: scale 1e-12)."""
    from translator_kernels.gemm.quantize import quantize_rows

    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 3, k, generator=g) * torch.rand(2, 3, 1, generator=g) * 50).to(dt)
    x[1, 2] = 0
    with executors.current().run(arch) as ex:
        q, s = (t.cpu() for t in quantize_rows(ex.put(x), fmt))
    rq, rs = F.quantize_fp8(x, F.fp8_dtype(arch, fmt), dim=-1)
    assert len(ex.launches) == 1 and q.dtype == F.fp8_dtype(arch, fmt) and s.shape == (2, 3, 1)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
