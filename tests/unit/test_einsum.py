"""einsum strings that are matmuls -> flydsl.bmm / flydsl.gemm (counter + numerics);
the others stay in PyTorch with the reason."""

from __future__ import annotations

import pytest
import torch
from translator.tolerances import model_tol
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
    torch.testing.assert_close(tm(a, b), m(a, b), **model_tol(check="few_ops"))


@pytest.mark.parametrize("eq,w", [("bnd,de->bne", (16, 24)), ("...d,ed->...e", (24, 16))])
def test_einsum_with_parameter_to_gemm(eq, w):
    m = E(eq, torch.randn(w)).eval()
    a = torch.randn(2, 5, 16)
    tm = translate(m, (a,), backend="reference")
    assert tm.report.counters.get("einsum") == 1 and flydsl(tm) == ["gemm"]
    torch.testing.assert_close(tm(a), m(a), **model_tol(check="few_ops"))


# (equation, operand shapes, which operands are parameters, FlyDSL matmuls expected)
TABLE = [
    ("bijl,lk->bijk", [(2, 3, 4, 8), (8, 5)], (), 1),            # KernelBench L1/11 (activations)
    ("bijl,lk->bijk", [(2, 3, 4, 8), (8, 5)], (1,), 1),          # ... with a parameter: one gemm
    ("bhzc,bchpn->bzhpn", [(2, 3, 4, 4), (2, 4, 3, 5, 6)], (), 1),  # Mamba-2 state passing (L3/48-49)
    ("bclhn,bcshn,bhcls,bcshp->bclhp", [(2, 3, 4, 2, 5), (2, 3, 4, 2, 5), (2, 2, 3, 4, 4), (2, 3, 4, 2, 6)], (), 2),
    ("bclhn,bhcl,bclhp->bchpn", [(2, 3, 4, 2, 5), (2, 2, 3, 4), (2, 3, 4, 2, 6)], (), 1),
    ("bclhn,bchpn,bhcl->bclhp", [(2, 3, 4, 2, 5), (2, 3, 2, 6, 5), (2, 2, 3, 4)], (), 1),
    ("ij,jk->ik", [(5, 8), (8, 3)], (), 1),
    ("ij,jk->ki", [(5, 8), (8, 3)], (), 1),
    ("ik,jk->ij", [(5, 8), (3, 8)], (1,), 1),
    ("bij,bjk->bik", [(2, 5, 8), (2, 8, 3)], (), 1),
    ("bij,bkj->bki", [(2, 5, 8), (2, 3, 8)], (), 1),
    ("abcd,cde->abe", [(2, 3, 4, 5), (4, 5, 6)], (1,), 1),      # two contracted letters, a parameter
    ("abcd,cde->abe", [(2, 3, 4, 5), (4, 5, 6)], (), 1),        # the same, activations
    ("bnd,de->bne", [(2, 5, 16), (16, 24)], (1,), 1),
    ("...d,ed->...e", [(2, 3, 5, 16), (24, 16)], (1,), 1),
    ("b...d,bd->b...", [(2, 3, 5, 16), (2, 16)], (), 1),
    ("bhd,bd->bh", [(2, 4, 8), (2, 8)], (), 1),
    ("i,i->", [(8,), (8,)], (), 1),                              # a dot product
    ("i,j->ij", [(4,), (5,)], (), 0),                            # an outer product: a broadcast mul
    ("bi,bi->bi", [(3, 4), (3, 4)], (), 0),                      # a Hadamard product
    ("bij,jk->bk", [(2, 5, 8), (8, 3)], (), 1),                  # i summed out of one operand first
    ("ab,bc,cd->ad", [(4, 5), (5, 6), (6, 7)], (), 2),           # a matrix chain
    ("ab,bc,cd,de->ae", [(4, 5), (5, 6), (6, 7), (7, 3)], (), 3),
    ("nchw,kc->nkhw", [(2, 8, 3, 3), (4, 8)], (1,), 1),           # a 1x1 convolution
]


class Ein(nn.Module):
    def __init__(self, eq, params):
        super().__init__()
        self.eq = eq
        self.ps = nn.ParameterList([nn.Parameter(p) for p in params])

    def forward(self, *xs):
        ps, xs = iter(self.ps), iter(xs)
        return torch.einsum(self.eq, *[next(ps) if i in self.where else next(xs) for i in range(self.n)])


def _ein(eq, shapes, params):
    torch.manual_seed(0)
    m = Ein(eq, [torch.randn(shapes[i]) for i in params]).eval()
    m.where, m.n = set(params), len(shapes)
    return m, tuple(torch.randn(s) for i, s in enumerate(shapes) if i not in params)


@pytest.mark.parametrize("eq,shapes,params,mms", TABLE, ids=[f"{e}{'-w' if p else ''}" for e, _, p, _ in TABLE])
def test_einsum_table(eq, shapes, params, mms):
    m, xs = _ein(eq, shapes, params)
    tm = translate(m, xs, backend="reference")
    ops = flydsl(tm)
    assert tm.report.counters.get("einsum", 0) == mms
    assert sum(o in ("bmm", "gemm") for o in ops) == mms, tm.gm.code
    assert "einsum" not in tm.gm.code  # nothing of the einsum is left to PyTorch's einsum
    torch.testing.assert_close(tm(*xs), m(*xs), **model_tol())
    assert tm.report.verification.passed


@pytest.mark.parametrize("eq", ["bijl,lk->bijk", "bhzc,bchpn->bzhpn", "ab,bc,cd->ad"])
def test_einsum_table_on_flysim(eq):
    shapes, params, mms = next((s, p, k) for e, s, p, k in TABLE if e == eq)
    m, xs = _ein(eq, shapes, params)
    tm = translate(m, xs, backend="flysim")
    assert tm.report.counters.get("einsum", 0) == mms and tm.report.verification.passed
    got = tm(*xs)
    assert len(tm.last_launches) >= mms  # each matmul ran as a FlyDSL kernel launch
    torch.testing.assert_close(got, m(*xs), **model_tol())


def test_einsum_declines_with_reasons():
    for eq, shapes in [("ii->i", [(4, 4)]), ("ij,ij->i", [(3, 4), (1, 4)])]:
        m, xs = _ein(eq, shapes, ())
        tm = translate(m, xs, backend="reference")
        row = next(r for r in tm.report.rows if "einsum" in r.op)
        assert row.where == "pytorch" and ("single operand" in row.detail or "broadcasting" in row.detail), row.detail


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
