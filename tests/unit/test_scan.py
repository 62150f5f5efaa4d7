"""Scan lowerings (cumsum / cumprod / logcumsumexp, reversed, exclusive, masked): each test checks
the counter moved and numerics against eager, on the reference backend and on flysim."""

import pytest
import torch
import torch.nn as nn

import flysim  # noqa: F401  (the package, not tests/flysim; conftest puts the repo root first)
from translator.tolerances import op_tolerance
from translator import translate

SCAN = torch.ops.flydsl.scan.default
EW = torch.ops.flydsl.fused_elementwise.default
BACKENDS = ["reference", "flysim"]

FP32 = op_tolerance(torch.float32, "scan")


def nodes(tm, target):
    return [n for n in tm.gm.graph.nodes if n.target is target]


def check(model, inputs, backend, atol=FP32[0], rtol=FP32[1], precision="fp32"):
    tm = translate(model.eval(), inputs, backend=backend, precision=precision)
    assert tm.report.verification.passed, tm.report.verification.message
    with torch.no_grad():
        want, got = model(*inputs), tm(*inputs)
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol, equal_nan=True)
    if backend == "flysim":  # every FlyDSL op launched a kernel (rows say flydsl-kernel from launches)
        assert tm.last_launches and not tm.report.without_launch(), tm.report.without_launch()
    return tm


def aten_left(tm, *names):
    return [n for n in tm.gm.graph.nodes if n.op == "call_function" and any(s in str(n.target) for s in names)]


class Scans(nn.Module):  # every kind, several dims (dim != -1 is moved last by the kernel adapter)
    def forward(self, x):
        return (torch.cumsum(x, -1) + torch.cumprod(1 + 0.1 * x, 1).sum(1, keepdim=True)
                + torch.logcumsumexp(x, 0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_kind_any_dim(backend):
    tm = check(Scans(), (torch.randn(3, 5, 6),), backend)
    assert len(nodes(tm, SCAN)) == 3
    for k in ("cumsum", "cumprod", "logcumsumexp"):
        assert tm.report.counters[k] == 1, k
    assert not aten_left(tm, "cumsum", "cumprod", "logcumsumexp")


class Positions(nn.Module):  # HF: position_ids = attention_mask.cumsum(-1) - 1 (mask given as float)
    def forward(self, m):
        return m.cumsum(-1) * m - 1


class ReturnsToGo(nn.Module):  # suffix sums: x.flip(-1).cumsum(-1).flip(-1)
    def forward(self, r):
        return r.flip(-1).cumsum(-1).flip(-1)


class SuffixProd(nn.Module):  # survival products over dim 1
    def forward(self, p):
        return torch.flip(torch.cumprod(torch.flip(p, [1]), 1), [1])


class Exclusive(nn.Module):  # offsets: tokens before this one
    def forward(self, c):
        return torch.cumsum(c, -1) - c


class Masked(nn.Module):  # masked cumsum: the mask chain joins the scan kernel
    def forward(self, x, mask):
        return torch.cumsum(x * mask, -1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reversed(backend):
    tm = check(ReturnsToGo(), (torch.randn(4, 37),), backend)
    assert tm.report.counters["scan_reversed"] == 1
    assert len(nodes(tm, SCAN)) == 1 and not aten_left(tm, "flip", "cumsum")
    tm = check(SuffixProd(), (torch.rand(3, 9, 2) + 0.5,), backend)
    assert tm.report.counters["scan_reversed"] == 1 and not aten_left(tm, "flip", "cumprod")


@pytest.mark.parametrize("backend", BACKENDS)
def test_exclusive(backend):
    tm = check(Exclusive(), (torch.randn(5, 70),), backend)
    assert tm.report.counters["scan_exclusive"] == 1
    assert len(nodes(tm, SCAN)) == 1 and not aten_left(tm, "cumsum", "sub")
    node = nodes(tm, SCAN)[0]
    assert node.args[5] is True  # exclusive


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_cumsum_one_kernel(backend):
    x, mask = torch.randn(3, 50), (torch.rand(3, 50) > 0.4).float()
    tm = check(Masked(), (x, mask), backend)
    assert tm.report.counters["scan_prologue"] == 1
    assert len(nodes(tm, SCAN)) == 1 and not nodes(tm, EW)
    assert len(nodes(tm, SCAN)[0].args[0]) == 2  # reads x and the mask


@pytest.mark.parametrize("backend", BACKENDS)
def test_positions(backend):
    m = torch.ones(2, 12)
    m[0, :4] = 0
    tm = check(Positions(), (m,), backend)
    assert tm.report.counters["cumsum"] == 1


def test_bf16_precision():
    x = torch.randn(4, 300)
    tm = check(ReturnsToGo(), (x,), "flysim", atol=0.1, rtol=1.6e-2, precision="bf16")
    assert tm.report.counters["scan_reversed"] == 1


class IntScan(nn.Module):
    def forward(self, i, d):
        return torch.cumsum(i, -1), torch.cumsum(d, 0)


def test_reasons_for_what_stays_in_pytorch():
    tm = translate(IntScan(), (torch.randint(0, 5, (3, 8)), torch.randn(4, 3, dtype=torch.float64)),
                   backend="reference")
    assert not nodes(tm, SCAN)
    details = [r.detail for r in tm.report.rows if r.where == "pytorch" and "cumsum" in r.op]
    assert any("int64 input stays in PyTorch (torch scans integer" in d for d in details), details
    assert any("float64 input stays in PyTorch" in d for d in details), details
