"""einsum strings that are matmuls -> flydsl.bmm / flydsl.gemm (counter + numerics);
the others stay in PyTorch with the reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from translator import translate


class E(nn.Module):
    def __init__(self, eq, w=None):
        super().__init__()
        self.eq = eq
        self.w = nn.Parameter(w) if w is not None else None

    def forward(self, a, b=None):
        return torch.einsum(self.eq, a, self.w if self.w is not None else b)


def flydsl(tm):
    return [n.target._opname for n in tm.gm.graph.nodes if getattr(n.target, "namespace", "") == "flydsl"]


CASES = [
    ("bhqd,bhkd->bhqk", (2, 3, 5, 16), (2, 3, 7, 16)),
    ("bhqk,bhkd->bhqd", (2, 3, 5, 7), (2, 3, 7, 16)),
    ("bij,bjk->bik", (2, 5, 8), (2, 8, 3)),
    ("ij,kj->ki", (5, 8), (3, 8)),
    ("bhd,bd->bh", (2, 4, 8), (2, 8)),
]


@pytest.mark.parametrize("eq,sa,sb", CASES)
def test_einsum_activations_to_bmm(eq, sa, sb):
    m = E(eq).eval()
    a, b = torch.randn(sa), torch.randn(sb)
    tm = translate(m, (a, b), backend="reference")
    assert tm.report.counters.get("einsum") == 1 and flydsl(tm) == ["bmm"]
    torch.testing.assert_close(tm(a, b), m(a, b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("eq,w", [("bnd,de->bne", (16, 24)), ("...d,ed->...e", (24, 16))])
def test_einsum_with_parameter_to_gemm(eq, w):
    m = E(eq, torch.randn(w)).eval()
    a = torch.randn(2, 5, 16)
    tm = translate(m, (a,), backend="reference")
    assert tm.report.counters.get("einsum") == 1 and flydsl(tm) == ["gemm"]
    torch.testing.assert_close(tm(a), m(a), atol=1e-5, rtol=1e-5)


def test_einsum_on_flysim():
    m = E("bhqd,bhkd->bhqk").eval()
    a, b = torch.randn(1, 2, 5, 16), torch.randn(1, 2, 7, 16)
    tm = translate(m, (a, b), backend="flysim")
    assert tm.report.counters.get("einsum") == 1 and tm.report.verification.passed
    assert [c.family for c in tm.last_calls] == ["bmm"] and tm.last_calls[0].launches  # the kernel ran


def test_trace_stays_in_pytorch_with_reason():
    m = E("ii,ij->j").eval()
    tm = translate(m, (torch.randn(4, 4), torch.randn(4, 3)), backend="reference")
    (row,) = [r for r in tm.report.rows if r.op == "aten.einsum"]
    assert row.where == "pytorch" and "letter repeats" in row.detail
