"""Gemma's sandwich norm step in one row-norm launch (translator_kernels.rows.norm.norm_add_rms_norm), on the
session's executor: s = residual + rms_norm(x, w0) (the post-norm of a GEMM's output, rounded to x's dtype as
flydsl.rms_norm returns it, then the add rounded as eager's), y = rms_norm(s, w1) (the next pre-norm). Rows that
share a wave (N = 64), rows of several waves with a partial last vector (N = 1000) and a Gemma-2-2B row
(N = 2304, bf16). Checked against torch's rms_norm and add in that order, with the project's tolerances."""

import pytest
import torch
import torch.nn.functional as F

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels.errors import KernelInputError
from translator_kernels.rows.norm import build_row_norm, norm_add, norm_add_rms_norm


def _want(x, r, w0, w1, e0, e1):
    s = (r.float() + F.rms_norm(x.float(), (x.shape[-1],), w0.float(), e0).to(x.dtype).float()).to(x.dtype)
    return s, F.rms_norm(s.float(), (x.shape[-1],), w1.float(), e1).to(x.dtype)


@pytest.mark.parametrize("dtype,m,n", [(torch.float32, 3, 64), (torch.bfloat16, 3, 64), (torch.float32, 2, 1000),
                                       (torch.bfloat16, 2, 2304)])
def test_post_norm_residual_add_and_pre_norm_in_one_launch(dtype, m, n):
    g = torch.Generator().manual_seed(0)
    x, r = (torch.randn(m, n, generator=g).mul(3).to(dtype) for _ in range(2))
    w0, w1 = (torch.randn(n, generator=g).to(dtype) for _ in range(2))
    want_s, want_y = _want(x, r, w0, w1, 1e-6, 1e-5)
    with executors.current().run("gfx942") as ex:
        s, y = norm_add_rms_norm(ex.put(x), ex.put(r), ex.put(w0), ex.put(w1), 1e-6, 1e-5)
    assert [ln.kernel.split("_kernel")[0] for ln in ex.launches] == ["row_norm"], ex.launches
    tol = op_tol(dtype, "rms_norm", reduction_length=n)
    torch.testing.assert_close(s.cpu(), want_s, **tol)
    torch.testing.assert_close(y.cpu(), want_y, **tol)


def test_a_norm_before_the_add_needs_rms_with_a_residual():
    with pytest.raises(KernelInputError, match="norm before the residual add"):
        build_row_norm(64, "f32", 4, "layer", 1e-5, "gfx942", w_dtype="f32", residual=True, pre_w="f32")


def test_many_rows_without_a_second_weight():
    """The first weight alone (in the bias slot): the workgroups walk rows as the host's grid says (80 rows, more
    than MIN_GRID workgroups of one row each: 64 workgroups, some taking two rows)."""
    g = torch.Generator().manual_seed(1)
    x, r = (torch.randn(80, 1000, generator=g) for _ in range(2))
    w0 = torch.randn(1000, generator=g)
    want_s, want_y = _want(x, r, w0, torch.ones(1000), 1e-6, 1e-6)
    with executors.current().run("gfx942") as ex:
        s, y = norm_add_rms_norm(ex.put(x), ex.put(r), ex.put(w0), None, 1e-6, 1e-6)
    assert len(ex.launches) == 1
    tol = op_tol(torch.float32, "rms_norm", reduction_length=1000)
    torch.testing.assert_close(s.cpu(), want_s, **tol)
    torch.testing.assert_close(y.cpu(), want_y, **tol)


@pytest.mark.parametrize("dtype,m,n", [(torch.float32, 3, 64), (torch.bfloat16, 2, 1000)])
def test_post_norm_and_residual_add_in_one_launch(dtype, m, n):
    """OLMo2's `r + post_norm(o)` with no norm after it: the sum alone (norm_add)."""
    g = torch.Generator().manual_seed(2)
    x, r = (torch.randn(m, n, generator=g).mul(3).to(dtype) for _ in range(2))
    w0 = torch.randn(n, generator=g).to(dtype)
    want_s, _ = _want(x, r, w0, w0, 1e-6, 1e-6)
    with executors.current().run("gfx942") as ex:
        s = norm_add(ex.put(x), ex.put(r), ex.put(w0), 1e-6)
    assert [ln.kernel.split("_kernel")[0] for ln in ex.launches] == ["row_norm"], ex.launches
    torch.testing.assert_close(s.cpu(), want_s, **op_tol(dtype, "rms_norm", reduction_length=n))
