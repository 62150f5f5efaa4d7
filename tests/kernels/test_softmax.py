"""Softmax / log-softmax kernel (translator_kernels.rows.softmax) against eager torch, on the session's
executor (flysim, or rocm on an AMD GPU: tests/executors.py).

References are computed in fp32 from the same inputs; outputs are compared in fp32 with the
project's dtype tolerance table. Every case asserts the FlyDSL kernel was launched.
"""

import itertools

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels.arch import ARCHS
from translator_kernels.rows.softmax import softmax

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TOL = {dt: op_tol(dt, "softmax") for dt in DTYPES}
NS = (1, 7, 64, 1000, 1024, 4096, 8193)
ROWS = (1, 3, 128)


def ref_softmax(x, log):
    f = torch.log_softmax if log else torch.softmax
    return f(x.float(), dim=-1)


def run_kernel(arch, x, log):
    with executors.current().run(arch) as ex:
        out = softmax(ex.put(x), log=log)
    assert len(ex.launches) == 1, "the FlyDSL kernel did not run"
    return out.cpu()


def check(arch, x, log):
    out = run_kernel(arch, x, log)
    assert out.dtype == x.dtype and out.shape == x.shape and out.is_contiguous()
    torch.testing.assert_close(out.float(), ref_softmax(x, log), **TOL[x.dtype],
                               msg=lambda m: f"{'log_' if log else ''}softmax {tuple(x.shape)} {x.dtype} "
                               f"{arch}: {m}")


def make(rows, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed + 1000 * n + rows)
    return (torch.randn(rows, n, generator=g) * 3).to(dtype)


# A covering subset: every N, every dtype, both archs and both variants appear; the full
# cross product is the slow sweep below.
FAST = [(n, rows, dtype, arch, log) for (n, rows), dtype, arch, log in zip(
    [(1, 3), (7, 3), (64, 128), (1000, 3), (1024, 1), (4096, 3), (8193, 3), (1000, 128), (7, 1)],
    itertools.cycle(DTYPES), itertools.cycle(ARCHS + ARCHS[::-1]), itertools.cycle((False, True, True, False)))]


@pytest.mark.parametrize("n,rows,dtype,arch,log", FAST)
def test_softmax(n, rows, dtype, arch, log):
    check(arch, make(rows, n, dtype), log)


@pytest.mark.slow
@pytest.mark.parametrize("n,rows,dtype,arch,log", list(itertools.product(NS, ROWS, DTYPES, ARCHS, (False, True))))
def test_softmax_sweep(n, rows, dtype, arch, log):
    check(arch, make(rows, n, dtype), log)


@pytest.mark.parametrize("log", [False, True])
def test_all_neg_inf_rows_give_nan_like_torch(log):
    x = make(4, 300, torch.float32)
    x[1] = float("-inf")
    x[2, ::3] = float("-inf")  # partly -inf: stays finite
    out = run_kernel("gfx942", x, log)
    ref = ref_softmax(x, log)
    assert torch.isnan(ref[1]).all() and torch.isnan(out[1]).all()
    torch.testing.assert_close(out, ref, equal_nan=True, **TOL[torch.float32])


@pytest.mark.parametrize("arch", ARCHS)
def test_non_contiguous_inputs(arch):
    base = make(64, 130, torch.bfloat16)
    check(arch, base[:, 2:130], False)  # row stride 130, 16-bit aligned only: narrower vectors
    check(arch, base[::3, :128], True)  # every third row
    check(arch, base[:40, :40].t(), False)  # transposed: last-dim stride != 1


def test_rejects_unsupported_inputs():
    with pytest.raises(ValueError, match="softmax: x dtype torch.float64"):
        softmax(torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="must be 2-D"):
        softmax(torch.randn(2, 3, 8))


@pytest.mark.parametrize("n,dtype,arch,log", [(70001, torch.float32, "gfx942", False),
                                              (70000, torch.bfloat16, "gfx950", True)])
def test_long_rows_stream_through_two_passes(n, dtype, arch, log):
    # rows too long for registers (> 64K elements) take the online-max / rescaled-sum path
    x = make(2, n, dtype)
    x[1] = float("-inf")
    out = run_kernel(arch, x, log)
    ref = ref_softmax(x, log)
    assert torch.isnan(out[1]).all()
    torch.testing.assert_close(out[:1].float(), ref[:1], **TOL[dtype])


@pytest.mark.parametrize("log", [False, True])
def test_inf_and_nan_rows_match_torch(log):
    x = torch.tensor([[float("inf"), 1.0, 2.0], [float("nan"), 1.0, 2.0], [1.0, 2.0, 3.0]])
    out = run_kernel("gfx950", x, log)
    torch.testing.assert_close(out, ref_softmax(x, log), equal_nan=True, **TOL[torch.float32])
