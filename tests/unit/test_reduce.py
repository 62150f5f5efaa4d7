"""Reduction lowerings and reduction + elementwise-prologue fusion: each test checks the
counters and numerics against eager (reference backend for graph logic, flysim for kernels)."""

import math

import pytest
import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves

import flysim  # noqa: F401  (the package, not tests/flysim; conftest puts the repo root first)
from translator.tolerances import op_tol, op_tolerance
from translator import translate

RED = torch.ops.flydsl.fused_reduce.default
EW = torch.ops.flydsl.fused_elementwise.default

FP32 = op_tolerance(torch.float32, "fused_reduce")


def nodes(tm, target):
    return [n for n in tm.gm.graph.nodes if n.target is target]


def check(model, inputs, backend="reference", atol=FP32[0], rtol=FP32[1], precision="fp32"):
    tm = translate(model.eval(), inputs, backend=backend, precision=precision)
    assert tm.report.verification.passed, tm.report.verification.message
    with torch.no_grad():
        want, got = model(*inputs), tm(*inputs)
    want, got = tree_leaves(want), tree_leaves(got)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        if w.dtype == torch.int64:
            assert torch.equal(g, w)
        else:
            torch.testing.assert_close(g, w, atol=atol, rtol=rtol, equal_nan=True)
    if backend == "flysim":  # every FlyDSL op launched a kernel (rows say flydsl-kernel from launches)
        assert tm.last_launches and not tm.report.without_launch(), tm.report.without_launch()
    return tm


class AllKinds(nn.Module):
    def forward(self, x):
        return (x.sum(-1), x.mean((0, 2), keepdim=True), x.amax(1), x.amin(-1, keepdim=True), x.var(-1),
                x.std(1, correction=0), torch.logsumexp(x, (0, 2)), x.argmax(-1), x.argmin(1, keepdim=True),
                x.max(1), x.min(-1), torch.linalg.vector_norm(x, dim=-1), x.norm(p=1, dim=(1, 2)),
                torch.linalg.vector_norm(x, float("inf")), x.sum(), x.max(), x.argmax())


def test_every_reduction_lowers_any_dims():
    tm = check(AllKinds(), (torch.randn(3, 5, 9),))
    assert len(nodes(tm, RED)) == 17
    left = {str(n.target) for n in tm.gm.graph.nodes if n.op == "call_function"} - {"<built-in function getitem>", str(RED)}
    assert not left, left
    for k in ("sum", "mean", "amax", "amin", "var", "std", "logsumexp", "argmax", "argmin", "max", "min", "norm"):
        assert tm.report.counters[f"reduce_{k}"] >= 1, k


def test_every_reduction_on_flysim():
    check(AllKinds(), (torch.randn(3, 5, 9),), backend="flysim")


class MeanSquare(nn.Module):  # hand-written RMSNorm statistics
    def forward(self, x):
        return (x * x).mean(-1, keepdim=True)


class SumExp(nn.Module):  # hand-written stable logsumexp / softmax denominator
    def forward(self, x):
        m = x.amax(-1, keepdim=True)
        return torch.log(torch.exp(x - m).sum(-1)) + m.squeeze(-1)


class VarOfScaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.rand(24) + 0.5)

    def forward(self, x):
        return (x * self.w + 1.0).var(dim=1, keepdim=True)  # over dim 1: moved last on the host


@pytest.mark.parametrize("backend", ["reference", "flysim"])
@pytest.mark.parametrize("model,shape,n_fused", [(MeanSquare, (4, 33), 1), (SumExp, (5, 40), 1),
                                                 (VarOfScaled, (3, 7, 24), 1)])
def test_prologue_fuses_into_reduction(model, shape, n_fused, backend):
    if model is VarOfScaled:
        x = torch.randn(shape).transpose(1, 2).contiguous().transpose(1, 2)  # [3, 7, 24], dim 1 not last
    else:
        x = torch.randn(shape)
    tm = check(model(), (x,), backend=backend)
    assert tm.report.counters["reduce_prologue_fused"] == n_fused
    red = nodes(tm, RED)
    assert any(len(__import__("json").loads(r.args[1])["ops"]) >= 1 for r in red)
    if model is MeanSquare:
        assert not nodes(tm, EW) and len(red) == 1  # one kernel in all


def test_region_used_elsewhere_is_not_folded():
    class M(nn.Module):
        def forward(self, x):
            a = torch.exp(x)
            return a / a.sum(-1, keepdim=True)

    tm = check(M(), (torch.randn(3, 8),))
    assert tm.report.counters.get("reduce_prologue_fused", 0) == 0
    assert len(nodes(tm, RED)) == 1 and len(nodes(tm, EW)) == 2


def test_reasons_for_what_stays_in_pytorch():
    class M(nn.Module):
        def forward(self, x, i):
            return x.var(-1), i.sum(-1), x.sum(-1)  # sum of 70000: two stages; var has none

    x = torch.randn(2, 70000)
    tm = translate(M().eval(), (x, torch.arange(6).reshape(2, 3)), backend="reference", dynamic_shapes=None)
    text = " ".join(r.detail for r in tm.report.fallbacks())
    assert "exceeds 65536" in text and "var has no two-stage form" in text and "int64" in text, text
    assert tm.report.counters["reduce_sum"] == 1


def test_bf16_statistics_and_argmax_flysim():
    class M(nn.Module):
        def forward(self, x):
            return x.float().pow(2).mean(-1), x.argmax(-1), torch.logsumexp(x, -1)

    x = torch.randn(4, 136).to(torch.bfloat16)
    tm = check(M(), (x,), backend="flysim", **op_tol(torch.bfloat16),
               precision="bf16")  # bf16 outputs: verification at the bf16 model tolerance
    assert tm.report.counters["reduce_prologue_fused"] == 1


def test_norm_orders():
    class M(nn.Module):
        def forward(self, x):
            return tuple(torch.linalg.vector_norm(x, p, dim=-1) for p in (0, 1, 2, 3, math.inf, -math.inf))

    check(M(), (torch.randn(4, 10),))


class SharedDiff(nn.Module):
    def forward(self, x, y):
        d = (x - y) * 0.5
        return (d * d).mean(-1), torch.tanh(d)  # the region keeps tanh(d); the mean recomputes d * d


@pytest.mark.parametrize("backend", ["reference", "flysim"])
def test_multi_output_region_recomputed_in_reduction(backend):
    x, y = torch.randn(4, 24), torch.randn(24)
    tm = check(SharedDiff(), (x, y), backend=backend)
    assert tm.report.counters["reduce_prologue_fused"] == 1
    (ew,) = nodes(tm, EW)
    assert len(__import__("json").loads(ew.args[1])["out"]) == 1  # the squared value is no longer stored
    if backend == "flysim":
        assert len(tm.last_launches) == 2


class LseByHand(nn.Module):
    def forward(self, x):
        m = x.amax(-1)
        s = torch.exp(x - m[:, None]).sum(-1)
        return torch.log(s) + m  # the epilogue: [M]-shaped, reads the result and m


@pytest.mark.parametrize("backend", ["reference", "flysim"])
def test_epilogue_after_reduction_folds(backend):
    tm = check(LseByHand(), (torch.randn(5, 40),), backend=backend)
    assert tm.report.counters["reduce_epilogue_fused"] == 1 and tm.report.counters["reduce_prologue_fused"] == 1
    assert len(nodes(tm, RED)) == 2 and not nodes(tm, EW)  # amax; then exp-sum-log-add in one kernel
    if backend == "flysim":
        assert len(tm.last_launches) == 2


class AtanSum(nn.Module):
    def forward(self, x):
        return torch.atan(x * 2.0).sum(-1)


def test_a_new_table_op_joins_a_reduction_prologue_on_flysim():
    """docs/adding-an-op.md: atan, added as one table row and one device function, folds into a
    reduction's prologue with no other edit (one fused_reduce launch)."""
    tm = check(AtanSum(), (torch.randn(4, 48),), backend="flysim")
    assert tm.report.counters["reduce_prologue_fused"] == 1 and not nodes(tm, EW)
    (r,) = nodes(tm, RED)
    assert "atan" in r.args[1] and len(tm.last_launches) == 1, tm.last_launches
