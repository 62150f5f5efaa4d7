"""Inputs where a numerically careless kernel goes wrong, each on the session's executor (tests/executors.py) against fp32 torch:

- softmax / log-softmax on x + 100 and x - 100: exp(x) alone overflows (or underflows) in fp32,
  so a kernel that skips subtracting the row max returns NaN or garbage;
- RMSNorm and LayerNorm on rows whose mean square (or variance) is below eps, and on all-zero
  rows: without eps the result is far off or inf/NaN. (Rows with a large mean and a tiny
  variance are ill-conditioned for fp32 itself, torch's eager result included; not used here.)

Short rows (registers) and rows longer than one pass (streamed) both. Each case asserts the
kernel launched. Tolerances: the one table (translator.tolerances)."""

import pytest
import torch
import torch.nn.functional as F

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels.rows import norm
from translator_kernels.rows.softmax import softmax

F32 = torch.float32


def _launch(fn, *args, **kwargs):
    with executors.current().run("gfx942") as ex:
        out = fn(*map(ex.put, args), **kwargs)
    assert len(ex.launches) == 1, "the FlyDSL kernel did not run"
    return out.cpu()


@pytest.mark.parametrize("shift", [100.0, -100.0])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("n", [64, 1000])
def test_softmax_of_shifted_rows(shift, log, n):
    x = torch.randn(3, n) * 4 + shift
    out = _launch(softmax, x, log=log)
    ref = (torch.log_softmax if log else torch.softmax)(x, dim=-1)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, **op_tol(F32, "softmax"))


@pytest.mark.parametrize("n", [64, 1000])
def test_rms_norm_where_eps_matters(n):
    x = torch.randn(4, n) * 1e-3  # mean square ~1e-6, eps 1e-5: eps sets the scale
    x[1] = 0.0  # an all-zero row: 0 * rsqrt(eps), not 0 * inf
    w = torch.randn(n)
    out = _launch(norm.rms_norm, x, w, 1e-5)
    ref = F.rms_norm(x, (n,), w, 1e-5)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, **op_tol(F32, "rms_norm"))


@pytest.mark.parametrize("n", [64, 1000])
def test_layer_norm_where_eps_matters(n):
    x = torch.randn(4, n) * 1e-3  # variance ~1e-6, eps 1e-5: eps sets the scale
    x[2] = 0.0  # variance 0: (x - mean) * rsqrt(eps) = 0, not 0 * inf
    w, b = torch.randn(n), torch.randn(n)
    out = _launch(norm.layer_norm, x, w, b, 1e-5)
    ref = F.layer_norm(x, (n,), w, b, 1e-5)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, **op_tol(F32, "layer_norm"))
