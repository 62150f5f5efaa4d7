"""MX GEMM (gfx950: e4m3fn / e5m2 values with e8m0 scales per 32 along K, in the scaled MFMA; translator_kernels.gemm.mx)
on the session's executor against the torch reference of the same quantized math (both operands dequantized exactly
in fp32, the fp32 matmul, the epilogue in kernel order): within the fp32-sum tolerance. One launch, the scaled MFMA
kind and the count the tile grid implies (flysim)."""

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm import fp8 as F, mx

MFMA = "mfma.scale.f32.16x16x128.f8f6f4"


def _data(m, n, k, seed=0):
    """Scale groups of very different ranges along K and across rows / columns, so a misplaced scale shows."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-6, 6, (m, k // 32), generator=g).float()) \
        .repeat_interleave(32, 1)
    w = torch.randn(n, k, generator=g) * torch.exp2(torch.randint(-6, 6, (n, k // 32), generator=g).float()) \
        .repeat_interleave(32, 1)
    return a, w, g


def _run(aq, sa, wq, sw, n, k, cfg=None, **kw):
    wp, swp = mx.prepare_weight_mx(wq, sw)
    put = lambda t: t if not isinstance(t, torch.Tensor) else ex.put(t)  # noqa: E731
    with executors.current().run("gfx950") as ex:
        out = mx.gemm_mx(ex.put(aq), ex.put(wp), n, k, ex.put(swp), a_scale=put(sa), _config=cfg,
                         **{key: put(v) for key, v in kw.items()})
    return out.cpu(), ex


def _assert_within_sum_tol(out, ref, aq, sa, wq, sw, out_dtype):
    """|out - ref| within the output dtype's GEMM tolerance plus the fp32 summation error of the two orders
    (1e-5 of sum |a| |w| per element: the scale groups span 2^12, so the sums cancel)."""
    a_abs = mx.dequantize_mx(aq, sa).abs() if sa is not None and sa.dtype == mx.E8M0 else aq.float().abs()
    if sa is not None and sa.dtype != mx.E8M0:
        a_abs = a_abs * sa.float().reshape(-1, 1)
    bound = 1e-5 * (a_abs @ mx.dequantize_mx(wq, sw).abs().t())
    tol = op_tol(out_dtype, "gemm")
    err = (out.float() - ref.float()).abs()
    excess = err - (tol["atol"] + tol["rtol"] * ref.float().abs() + bound)
    assert (excess <= 0).all(), f"max |out - ref| {err.max():.3g}, worst excess {excess.max():.3g} at " \
                                f"{divmod(int(excess.argmax()), out.shape[-1])}"


# (M, N, K, A format, W format, A scale, extras, out dtype, config): M / N / K tails, split-K, kw = 4, 2 blocks a tile
CASES = [
    (5, 32, 256, "fp8", "fp8", "mx", {}, torch.float32, None),
    (17, 96, 288, "fp8", "fp8", "mx", {"bias": True}, torch.bfloat16, None),  # K tail (K % 128 = 32), split-K tile
    (130, 144, 256, "fp8", "fp8", "mx", {"residual": True}, torch.float32, None),  # 128-row tile, M and N tails
    (3, 64, 2048, "fp8", "fp8", "mx", {"activation": "gelu"}, torch.float16, None),  # kw = 4, split-K
    (40, 48, 1504, "bf8", "fp8", "mx", {}, torch.float32, F.GemmConfig(32, 64, 64, split=3)),  # 2 blocks a tile, K tail
    (33, 200, 256, "fp8", "bf8", "row", {"bias": True}, torch.bfloat16, None),  # per-token fp32 A, MX W
    (9, 64, 512, "fp8", "fp8", "tensor", {}, torch.float32, None),  # a per-tensor A scale, MX W
    # MXFP4 weights (e2m1, 2 codes a byte): fp8 x fp4 scaled MFMA
    (5, 32, 256, "fp8", "fp4", "mx", {}, torch.float32, None),
    pytest.param(130, 160, 288, "fp8", "fp4", "mx", {"bias": True}, torch.bfloat16, None,  # tails, 128-row tile
                 marks=pytest.mark.slow),  # ~25 s; the fp4 tails of the 33 x 96 x 1504 case run by default
    (3, 64, 2048, "bf8", "fp4", "mx", {}, torch.float32, None),  # kw = 4, split-K
    (33, 96, 1504, "fp8", "fp4", "row", {"residual": True}, torch.float32, F.GemmConfig(32, 64, 64, split=3)),
]


def _id(c):
    c = getattr(c, "values", c)
    return f"{c[0]}x{c[1]}x{c[2]}-{c[3]}{c[4]}-{c[5]}"


@pytest.mark.parametrize("m,n,k,fa,fw,a_mode,extras,out_dtype,cfg", CASES, ids=[_id(c) for c in CASES])
def test_gemm_mx_flysim(m, n, k, fa, fw, a_mode, extras, out_dtype, cfg):
    a, w, g = _data(m, n, k)
    wq, sw = mx.quantize_mx(w, mx.FP4 if fw == "fp4" else mx.MX_DTYPES[fw])
    if a_mode == "mx":
        aq, sa = mx.quantize_mx(a, mx.MX_DTYPES[fa])
    else:
        aq, sa = F.quantize_fp8(a, mx.MX_DTYPES[fa], dim=-1 if a_mode == "row" else None)
    kw = {"out_dtype": out_dtype}
    if extras.get("bias"):
        kw["bias"] = torch.randn(n, generator=g)
    if extras.get("residual"):
        kw["residual"] = torch.randn(m, n, generator=g).to(out_dtype)
    if extras.get("activation"):
        kw["activation"] = extras["activation"]
    out, ex = _run(aq, sa, wq, sw, n, k, cfg, **kw)
    ref = mx.ref_gemm_mx(aq, sa, wq, sw, **kw)
    assert out.shape == (m, n) and out.dtype == out_dtype and len(ex.launches) == 1
    _assert_within_sum_tol(out, ref, aq, sa, wq, sw, out_dtype)
    cfg = cfg or F.choose_fp8_config(F.m_bucket(m), n, k, "gfx950")
    if ex.counts:
        assert ex.launches[0].counters["mfma_by_kind"] == {MFMA: F.expected_mfma_count_fp8(m, n, k, "gfx950", cfg)}


def test_mx_cases_cover_split_k_and_kw4():
    assert F.choose_fp8_config(F.m_bucket(17), 96, 288, "gfx950").split > 1
    assert F.choose_fp8_config(F.m_bucket(3), 64, 2048, "gfx950").kw == 4


def test_gemm_mx_is_the_dequantized_matmul():
    """Against what a user writes (dequantize both MX operands, matmul): close; the same values with their scales
    dropped are far off (the scales are applied, per group)."""
    m, n, k = 8, 64, 512
    a, w, _ = _data(m, n, k, seed=3)
    aq, sa = mx.quantize_mx(a)
    wq, sw = mx.quantize_mx(w)
    out, _ = _run(aq, sa, wq, sw, n, k, out_dtype=torch.float32)
    want = mx.dequantize_mx(aq, sa) @ mx.dequantize_mx(wq, sw).t()
    _assert_within_sum_tol(out, want, aq, sa, wq, sw, torch.float32)
    assert (out - a @ w.t()).norm() / (a @ w.t()).norm() < 0.1  # e4m3's 3 mantissa bits
    one = torch.full_like(sw.view(torch.uint8), 127).view(mx.E8M0)
    assert (out - mx.ref_gemm_mx(aq, sa, wq, one, out_dtype=torch.float32)).norm() > 0.5 * out.norm()


def test_quantize_mx_is_the_ocp_rule():
    x = torch.tensor([[448.0, -1.0] + [0.0] * 30, [0.0] * 32, [1e-3] + [0.0] * 31])
    q, s = mx.quantize_mx(x)
    # amax 448 = 1.75 * 2^8: shared exponent 8 - 8 = 0; all-zero group: 2^-127; 1e-3 ~ 2^-10: 2^-18
    assert s.view(torch.uint8).tolist() == [[127], [0], [127 - 18]]
    want = x.clone()
    want[2, 0] = torch.tensor(1e-3 * 2 ** 18).to(torch.float8_e4m3fn).float() * 2 ** -18  # 262.1 -> e4m3's 256
    assert torch.equal(mx.dequantize_mx(q, s), want) and want[2, 0] == 2 ** -10


def test_gemm_mx_is_gfx950_only():
    """gfx942 has no scaled MFMA: a clear error that names the alternative (per-channel fnuz fp8)."""
    wq, sw = mx.quantize_mx(torch.randn(32, 64))
    aq, sa = mx.quantize_mx(torch.randn(4, 64))
    wp, swp = mx.prepare_weight_mx(wq, sw)
    with executors.current().run("gfx942") as ex:
        with pytest.raises(KernelInputError, match="gfx950's scaled MFMA.*gemm_fp8"):
            mx.gemm_mx(ex.put(aq), ex.put(wp), 32, 64, ex.put(swp), a_scale=ex.put(sa))
    assert not ex.launches


def test_gemm_mx_rejects_bad_inputs():
    wq, sw = mx.quantize_mx(torch.randn(32, 64))
    aq, sa = mx.quantize_mx(torch.randn(4, 64))
    wp, swp = mx.prepare_weight_mx(wq, sw)
    with pytest.raises(KernelInputError, match="multiple of 32"):
        mx.quantize_mx(torch.randn(4, 48))
    with pytest.raises(KernelInputError, match=r"want \[32, 2\]"):
        mx.shuffle_scale_mx(sw[:, :1], 32, 64)
    with executors.current().run("gfx950") as ex:
        with pytest.raises(KernelInputError, match="MX a_scale has shape"):
            mx.gemm_mx(ex.put(aq), ex.put(wp), 32, 64, ex.put(swp), a_scale=ex.put(sa[:, :1]))
        with pytest.raises(KernelInputError, match="w_scale"):
            mx.gemm_mx(ex.put(aq), ex.put(wp), 32, 64, ex.put(sw.view(torch.uint8)), a_scale=ex.put(sa))
    assert not ex.launches
