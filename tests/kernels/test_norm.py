"""Row-norm kernels (translator_kernels.rows.norm) against eager torch, on the session's
executor (flysim, or rocm on an AMD GPU: tests/executors.py).

LayerNorm, RMSNorm, residual-add + LayerNorm / RMSNorm (two outputs) and GroupNorm.
References are computed in fp32 from the same inputs (for add+norm: from the sum rounded to
x's dtype, which is what eager normalizes). Every case asserts the FlyDSL kernel was launched.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels.arch import ARCHS
from translator_kernels.rows import norm

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TOL = {dt: op_tol(dt, "layer_norm") for dt in DTYPES}
NS = (1, 7, 64, 1000, 1024, 4096, 8193)
ROWS = (1, 3, 128)


def run_kernel(arch, fn, *args, **kwargs):
    with executors.current().run(arch) as ex:
        out = fn(*(ex.put(a) for a in args), **kwargs)
    assert len(ex.launches) == 1, "the FlyDSL kernel did not run"
    return tuple(o.cpu() for o in out) if isinstance(out, tuple) else out.cpu()


def close(out, ref, dtype, what):
    assert out.dtype == dtype and out.shape == ref.shape and out.is_contiguous()
    torch.testing.assert_close(out.float(), ref, **TOL[dtype], msg=lambda m: f"{what}: {m}")


def rnd(shape, dtype, seed, scale=1.0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale + shift).to(dtype)


def params(n, w_dtype, seed, with_weight=True, with_bias=True):
    w = rnd((n,), w_dtype, seed + 1, 0.5, 1.0) if with_weight else None
    b = rnd((n,), w_dtype, seed + 2, 0.5) if with_bias else None
    return w, b


def ref_layer_norm(x, w, b, eps):
    return F.layer_norm(x.float(), x.shape[-1:], None if w is None else w.float(), None if b is None else b.float(), eps)


def ref_rms_norm(x, w, eps):
    return F.rms_norm(x.float(), x.shape[-1:], None if w is None else w.float(), eps)


def check_layer_norm(arch, rows, n, dtype, w_dtype, with_weight=True, with_bias=True, eps=1e-5):
    x = rnd((rows, n), dtype, n + rows, 2.0, 0.5)
    w, b = params(n, w_dtype, n, with_weight, with_bias)
    out = run_kernel(arch, norm.layer_norm, x, w, b, eps)
    close(out, ref_layer_norm(x, w, b, eps), dtype, f"layer_norm {rows}x{n} {dtype} w={w_dtype} {arch}")


def check_rms_norm(arch, rows, n, dtype, w_dtype, with_weight=True, eps=1e-6):
    x = rnd((rows, n), dtype, n + rows, 2.0)
    w, _ = params(n, w_dtype, n, with_weight, False)
    out = run_kernel(arch, norm.rms_norm, x, w, eps)
    close(out, ref_rms_norm(x, w, eps), dtype, f"rms_norm {rows}x{n} {dtype} w={w_dtype} {arch}")


def check_add_norm(arch, kind, rows, n, dtype, w_dtype):
    x = rnd((rows, n), dtype, n + rows, 2.0)
    r = rnd((rows, n), dtype, n + rows + 7, 2.0)
    w, b = params(n, w_dtype, n)
    s_ref = (x.float() + r.float()).to(dtype)
    if kind == "layer":
        s, y = run_kernel(arch, norm.add_layer_norm, x, r, w, b, 1e-5)
        y_ref = ref_layer_norm(s_ref, w, b, 1e-5)
    else:
        s, y = run_kernel(arch, norm.add_rms_norm, x, r, w, 1e-6)
        y_ref = ref_rms_norm(s_ref, w, 1e-6)
    what = f"add_{kind}_norm {rows}x{n} {dtype} {arch}"
    close(s, s_ref.float(), dtype, what + " (sum)")
    close(y, y_ref, dtype, what + " (normed)")


# Covering subsets: every N, dtype and arch appears; mixed weight dtypes (fp32 weights with
# 16-bit x) and missing weight / bias appear. Full cross products are the slow sweeps.
def _fast(ns_rows):
    return [(n, rows, dtype, arch) for (n, rows), dtype, arch in
            zip(ns_rows, itertools.cycle(DTYPES), itertools.cycle(ARCHS + ARCHS[::-1]))]


FAST = _fast([(1, 3), (7, 3), (64, 128), (1000, 3), (1024, 1), (4096, 3), (8193, 3), (1000, 128), (7, 1)])


@pytest.mark.parametrize("n,rows,dtype,arch", FAST)
def test_layer_norm(n, rows, dtype, arch):
    check_layer_norm(arch, rows, n, dtype, dtype)


@pytest.mark.parametrize("n,rows,dtype,arch", FAST)
def test_rms_norm(n, rows, dtype, arch):
    check_rms_norm(arch, rows, n, dtype, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_weights_with_16bit_x(dtype):
    check_layer_norm("gfx950", 3, 1000, dtype, torch.float32)
    check_rms_norm("gfx942", 3, 4096, dtype, torch.float32)


@pytest.mark.parametrize("with_weight,with_bias", [(False, False), (True, False), (False, True)])
def test_layer_norm_optional_affine(with_weight, with_bias):
    check_layer_norm("gfx942", 3, 1000, torch.float32, torch.float32, with_weight, with_bias)


def test_rms_norm_without_weight():
    check_rms_norm("gfx950", 3, 64, torch.bfloat16, torch.bfloat16, with_weight=False)


@pytest.mark.parametrize("kind,n,rows,dtype,arch", [
    ("layer", 1000, 3, torch.bfloat16, "gfx942"), ("layer", 4096, 1, torch.float32, "gfx950"),
    ("rms", 7, 3, torch.float16, "gfx950"), ("rms", 8193, 3, torch.bfloat16, "gfx942"),
    ("rms", 4096, 3, torch.float32, "gfx942")])
def test_add_norm(kind, n, rows, dtype, arch):
    check_add_norm(arch, kind, rows, n, dtype, dtype)


@pytest.mark.parametrize("arch", ARCHS)
def test_non_contiguous_inputs(arch):
    base = rnd((48, 1030), torch.float16, 5, 2.0)
    x = base[::2, 3:1003]  # strided rows, odd offset: narrow vectors
    w, b = params(1000, torch.float16, 9)
    close(run_kernel(arch, norm.layer_norm, x, w, b, 1e-5), ref_layer_norm(x, w, b, 1e-5), torch.float16, "ln strided")
    xt = base[:, :64].t()  # [64, 48], last-dim stride 1030
    close(run_kernel(arch, norm.rms_norm, xt, w[:48], 1e-6), ref_rms_norm(xt, w[:48], 1e-6), torch.float16, "rms xT")


@pytest.mark.parametrize("shape,groups,dtype,arch", [
    ((2, 6, 5, 7), 3, torch.float32, "gfx942"), ((3, 32, 8, 8), 8, torch.bfloat16, "gfx950"),
    ((2, 16, 64), 16, torch.float16, "gfx942"), ((1, 4, 3, 3, 3), 1, torch.float32, "gfx950"),
    ((2, 8, 4, 4), 8, torch.bfloat16, "gfx942")])  # groups == C: InstanceNorm
def test_group_norm(shape, groups, dtype, arch):
    x = rnd(shape, dtype, 11, 2.0, 0.3)
    c = shape[1]
    w, b = rnd((c,), dtype, 12, 0.5, 1.0), rnd((c,), dtype, 13, 0.5)
    out = run_kernel(arch, norm.group_norm, x, groups, w, b, 1e-5)
    ref = F.group_norm(x.float(), groups, w.float(), b.float(), 1e-5)
    close(out, ref, dtype, f"group_norm {shape} G={groups} {dtype} {arch}")


def test_rejects_unsupported_inputs():
    with pytest.raises(ValueError, match="layer_norm: x dtype torch.float64"):
        norm.layer_norm(torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="weight must be a 1-D tensor of length N=8"):
        norm.rms_norm(torch.randn(2, 8), torch.randn(7))
    with pytest.raises(ValueError, match="residual must match"):
        norm.add_rms_norm(torch.randn(2, 8), torch.randn(2, 9), None, 1e-6)
    with pytest.raises(ValueError, match="not divisible by num_groups"):
        norm.group_norm(torch.randn(2, 6, 4), 4, None, None, 1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("n,rows,dtype,arch", list(itertools.product(NS, ROWS, DTYPES, ARCHS)))
def test_norm_sweep(n, rows, dtype, arch):
    check_layer_norm(arch, rows, n, dtype, dtype)
    check_rms_norm(arch, rows, n, dtype, dtype)
    check_add_norm(arch, "layer", rows, n, dtype, dtype)
    check_add_norm(arch, "rms", rows, n, dtype, dtype)


def test_long_rows_stream_through_two_passes():
    # rows too long for registers (> 64K elements): a statistics pass, then a normalize pass
    check_layer_norm("gfx942", 2, 70001, torch.float32, torch.float32)
    check_add_norm("gfx950", "rms", 1, 70000, torch.bfloat16, torch.float32)


def test_group_norm_without_affine():
    x = rnd((2, 6, 10), torch.float16, 21, 2.0)
    out = run_kernel("gfx950", norm.group_norm, x, 2, None, None, 1e-5)
    close(out, F.group_norm(x.float(), 2, None, None, 1e-5), torch.float16, "group_norm no affine")
