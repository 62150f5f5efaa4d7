"""Weights the translator prepares at translate time (preshuffled GEMM weights, the gated GEMM's
arranged gate/up weight and bias, bf16 casts) follow parameter updates made after translate():
load_state_dict and in-place updates under no_grad (an optimizer step)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from translator import translate
from translator.tolerances import model_tol


class GatedBlock(nn.Module):
    def __init__(self, d=32, h=64):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, h), nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def flydsl_ops(tm):
    return sorted(n.target._opname for n in tm.gm.graph.nodes if getattr(n.target, "namespace", "") == "flydsl")


@pytest.mark.parametrize("backend,precision", [("reference", "fp32"), ("flysim", "fp32"), ("reference", "bf16")])
def test_prepared_weights_follow_parameter_updates(backend, precision):
    torch.manual_seed(0)
    m = GatedBlock().eval()
    x = torch.randn(4, 32)
    tm = translate(m, (x,), backend=backend, precision=precision)
    assert {"gemm", "gemm_gated"} <= set(flydsl_ops(tm)), tm.code  # bf16 adds cast kernels
    tol = model_tol(precision)
    torch.testing.assert_close(tm(x), m(x), **tol)
    with torch.no_grad():
        m.load_state_dict({k: v.flip(-1) for k, v in m.state_dict().items()})  # (a) new values
        torch.testing.assert_close(tm(x), m(x), **tol)
        for p in m.parameters():  # (b) in place, as an optimizer step does
            p.mul_(-0.5)
        torch.testing.assert_close(tm(x), m(x), **tol)
    if backend == "flysim":
        assert len(tm.last_launches) == 2


class EinsumProjection(nn.Module):
    """einsum against a parameter: the gemm weight is a permuted copy of it (einsum._to_nk)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 24))

    def forward(self, a):
        return torch.einsum("bnd,de->bne", a, self.w)


def test_einsum_weight_follows_parameter_updates():
    torch.manual_seed(0)
    m = EinsumProjection().eval()
    a = torch.randn(2, 5, 16)
    tm = translate(m, (a,), backend="reference")
    assert tm.report.counters.get("einsum") == 1 and flydsl_ops(tm) == ["gemm"]
    tol = model_tol(check="few_ops")
    with torch.no_grad():
        m.w.copy_(torch.randn(16, 24))
        torch.testing.assert_close(tm(a), m(a), **tol)
        m.w.mul_(-2)
        torch.testing.assert_close(tm(a), m(a), **tol)
