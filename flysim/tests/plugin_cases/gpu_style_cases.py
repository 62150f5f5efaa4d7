"""GPU kernel tests written the way FlyDSL's tests/kernels are (CUDA tensors, arch checks, skips),
run by test_plugin.py through flysim.pytest_plugin. Not collected by the default suite."""

import pytest
import torch

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import math as fmath
from flydsl.runtime.device import get_rocm_arch
from timing_common import run_perftest  # imported at collection, as FlyDSL's tests import tests.test_common

if not torch.cuda.is_available():
    pytest.skip("CUDA/ROCm not available", allow_module_level=True)

ARCH = str(get_rocm_arch())


def build_unary(fn, block=256):
    @flyc.kernel
    def unary_kernel(X: fx.Tensor, Y: fx.Tensor, n: fx.Int32):
        i = fx.block_idx.x * block + fx.thread_idx.x
        if i < n:
            Y[i] = fn(X[i])

    @flyc.jit
    def unary(X: fx.Tensor, Y: fx.Tensor, n: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        unary_kernel(X, Y, n).launch(grid=((n + block - 1) // block, 1, 1), block=(block, 1, 1), stream=stream)

    return unary


def _run(launcher, n, ref):
    x = torch.randn(n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(n))
    y = torch.empty_like(x)
    launcher(x, y, n, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    assert x.is_cuda and y.device.type == "cpu"
    torch.testing.assert_close(y, ref(x), rtol=1e-5, atol=1e-5)


DOUBLE = build_unary(lambda v: v + v)  # one compile for the four tests that use it


def test_double_passes():
    _run(DOUBLE, 1000, lambda x: 2 * x)


def test_wrong_reference_fails():
    _run(DOUBLE, 1000, lambda x: 2 * x + (x > 2.0).float())


def test_cube_root_unsupported():
    _run(build_unary(lambda v: fmath.cbrt(v)), 300, lambda x: x.sign() * x.abs() ** (1 / 3))


def test_large_launch_over_cap():
    _run(DOUBLE, 1 << 20, lambda x: 2 * x)


def test_wmma_needs_rdna4():
    if not ARCH.startswith("gfx12"):
        pytest.skip(f"WMMA test requires RDNA4 (gfx12xx), got {ARCH}")


def test_timed_double_passes():
    """A perftest-style timed region (timing_common.run_perftest: probe, 3 warm-ups, 20 launches
    under torch.profiler): the plugin makes it one launch, on the test's own output tensor."""
    x = torch.randn(1000, device="cuda")
    y = torch.zeros_like(x)
    _, us = run_perftest(DOUBLE, x, y, 1000, num_iters=20, num_warmup=3)
    assert us == 1.0
    torch.testing.assert_close(y, 2 * x)
