"""Row norms that write per-token fp8 (translator_kernels.rows.norm: norm_fp8 / add_norm_fp8), on the
session's executor (tests/executors.py), both archs (e4m3fnuz on gfx942, OCP e4m3fn on gfx950).

The math: y = norm(x) rounded to x's dtype (what the plain norm kernel stores), then
s = max(amax|y| / FMAX, 1e-12), q = fp8(clamp(y / s)). Its torch reference is
translator_kernels.gemm.fp8.quantize_fp8 of y; against it the fused kernel is bit-exact (y from the
plain norm kernel, which tests/kernels/test_norm.py holds to eager), and its dequantized q is within
fp8 error of the fp32 eager norm. One launch each; rows it cannot take in registers fall back to the
norm + quantize kernels (two launches, the same numbers). The quantize kernel with an elementwise
prologue (gemm/quantize.quantize_program) equals the elementwise kernel followed by the quantize kernel.
"""

import pytest
import torch
import torch.nn.functional as F

import executors
from translator_kernels.arch import ARCHS  # gfx942, gfx950
from translator_kernels.gemm.fp8 import fp8_dtype, quantize_fp8
from translator_kernels.rows import norm

# (rows, N, dtype): short rows sharing a wave, several waves with the row weights kept while a workgroup
# walks rows (LDS reductions), a partial last tile, fp32 input
SHAPES = [(5, 128, torch.bfloat16), (3, 64, torch.float32), (66, 4096, torch.bfloat16), (2, 1040, torch.float16)]


def _inputs(m, n, dt, kind, seed=0):
    g = torch.Generator().manual_seed(seed + n)
    x = (torch.randn(m, n, generator=g) * 3 + 0.5).to(dt)
    r = torch.randn(m, n, generator=g).to(dt)
    w = (torch.randn(n, generator=g) * 0.5 + 1).to(dt)
    b = torch.randn(n, generator=g) if kind == "layer" else None  # fp32 bias with 16-bit x
    return x, r, w, b


def _run(arch, fn, *args):
    with executors.current().run(arch) as ex:
        out = fn(*(ex.put(a) if isinstance(a, torch.Tensor) else a for a in args))
    return tuple(None if o is None else o.cpu() for o in out), len(ex.launches)


def _plain(kind, x, r, w, b, eps):
    if r is None:
        return (None, norm.layer_norm(x, w, b, eps) if kind == "layer" else norm.rms_norm(x, w, eps))
    return norm.add_layer_norm(x, r, w, b, eps) if kind == "layer" else norm.add_rms_norm(x, r, w, eps)


def _eager(kind, x, w, b, eps):
    xf = x.float()
    return F.layer_norm(xf, xf.shape[-1:], w.float(), b, eps) if kind == "layer" else \
        F.rms_norm(xf, xf.shape[-1:], w.float(), eps)


def _same_bits(q, s, y, arch, what):
    qr, sr = quantize_fp8(y, fp8_dtype(arch), dim=-1)
    assert q.dtype == fp8_dtype(arch) and q.shape == y.shape and s.shape == (y.shape[0], 1), what
    bad = (q.view(torch.uint8) != qr.view(torch.uint8)).sum().item()
    assert bad == 0 and torch.equal(s, sr), f"{what}: {bad} fp8 bytes differ, scales equal: {torch.equal(s, sr)}"


# the multi-wave path (N = 4096) runs on gfx942 only: gfx950 changes only the format (the other shapes)
NORM_CASES = [(a, m, n, dt) for a in ARCHS for m, n, dt in SHAPES if not (n == 4096 and a == "gfx950")]


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("arch,m,n,dt", NORM_CASES, ids=[f"{a}-{m}x{n}-{str(d)[6:]}" for a, m, n, d in NORM_CASES])
def test_norm_fp8_is_quantize_of_the_norm(arch, kind, m, n, dt):
    x, r, w, b = _inputs(m, n, dt, kind)
    eps = 1e-6
    (q, s), launches = _run(arch, norm.norm_fp8, x, kind, w, b, eps, "fp8")
    assert launches == 1
    (_, y), _ = _run(arch, _plain, kind, x, None, w, b, eps)
    _same_bits(q, s, y, arch, f"{kind}_norm_fp8 {m}x{n} {dt}")
    deq = q.float() * s
    ref = _eager(kind, x, w, b, eps)
    assert ((deq - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item() < 0.05  # e4m3: ~2-3 %

    (total, q2, s2), launches = _run(arch, norm.add_norm_fp8, x, r, kind, w, b, eps, "fp8")
    assert launches == 1
    (t_ref, y2), _ = _run(arch, _plain, kind, x, r, w, b, eps)
    assert torch.equal(total, t_ref) and torch.equal(total, x + r)  # the sum rounded to x's dtype, as eager
    _same_bits(q2, s2, y2, arch, f"add_{kind}_norm_fp8 {m}x{n} {dt}")


@pytest.mark.parametrize("arch", ARCHS)
def test_norm_bf8_and_zero_row(arch):
    """e5m2 output, and a zero row without a weight: scale 1e-12, q all zero (no division by zero)."""
    x, _, w, _ = _inputs(4, 256, torch.bfloat16, "rms", seed=3)
    x[1] = 0
    (q, s), launches = _run(arch, norm.norm_fp8, x, "rms", None, None, 1e-6, "bf8")
    assert launches == 1
    (_, y), _ = _run(arch, _plain, "rms", x, None, None, None, 1e-6)
    qr, sr = quantize_fp8(y, fp8_dtype(arch, "bf8"), dim=-1)
    assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8)) and torch.equal(s, sr)
    assert s[1].item() == pytest.approx(1e-12) and not q[1].float().any()


def test_rows_the_fused_kernel_cannot_take_fall_back():
    """x with a row stride of 33 bf16 values (scalar loads: VEC 1 < 4): the plain norm and the quantize
    kernel, the same numbers."""
    x, r, w, _ = _inputs(3, 33, torch.bfloat16, "rms")
    x, r, w = x[:, 1:], r[:, 1:].contiguous(), w[1:].contiguous()
    (total, q, s), launches = _run("gfx942", norm.add_norm_fp8, x, r, "rms", w, None, 1e-6, "fp8")
    assert launches == 2
    (_, y), _ = _run("gfx942", _plain, "rms", x, r, w, None, 1e-6)
    _same_bits(q, s, y, "gfx942", "fallback")


def test_bad_format_is_a_clear_error():
    from translator_kernels.errors import KernelInputError

    x, _, w, _ = _inputs(2, 64, torch.bfloat16, "rms")
    with pytest.raises(KernelInputError, match="format 'int8'"):
        _run("gfx942", norm.norm_fp8, x, "rms", w, None, 1e-6, "int8")


SILU_MUL = ('{"n":2,"ops":[["cast",[0],["f32"]],["silu",[2],[]],["cast",[1],["f32"]],["mul",[3,4],[]],'
            '["cast",[5],["bf16"]]],"out":[[6,"bf16"]]}')  # Llama's silu(gate) * up region under precision="fp8"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt,k", [(torch.bfloat16, 384), (torch.float32, 96)])
def test_quantize_program_is_quantize_of_the_elementwise_kernel(arch, dt, k):
    """The elementwise program joined to the quantize (gemm/quantize.quantize_program): one launch,
    bit-exact to the generated elementwise kernel followed by the quantize kernel."""
    from translator_kernels.codegen.elementwise import fused_elementwise
    from translator_kernels.gemm.quantize import quantize_program, quantize_rows

    g = torch.Generator().manual_seed(k)
    a, b = (torch.randn(5, k, generator=g) * 3).to(dt), torch.randn(5, k, generator=g).to(dt)
    (q, s), launches = _run(arch, quantize_program, [a, b], SILU_MUL, "fp8")
    assert launches == 1
    (y,), _ = _run(arch, lambda *xs: fused_elementwise(list(xs), SILU_MUL), a, b)
    (q2, s2), _ = _run(arch, quantize_rows, y, "fp8")
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)
