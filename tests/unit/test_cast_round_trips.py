"""passes/casts.py: `x.to(fp32).to(bf16)` between lowered ops (precision "bf16" / "fp8" on an fp32 model,
and the views between: HF Llama's heads split / merge) is `x` itself, so no cast kernels launch for it;
numerics are bit-identical with the pass and without. A narrowing first (`x.to(bf16).to(fp32)`), a
storage written in place, and a result the graph returns keep their casts."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import translator
import translator.passes as passes
from translator.passes.casts import cast_of
from translator.tolerances import model_tol
from translator_kernels.program import parse


class Block(nn.Module):
    """norm -> projection -> heads split (view, transpose) -> attention -> heads merge -> projection."""

    def __init__(self, d=64, h=4):
        super().__init__()
        torch.manual_seed(0)
        self.h = h
        self.norm = nn.RMSNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x):
        B, S, D = x.shape
        n = self.norm(x)

        def heads(t):
            return t.view(B, S, self.h, D // self.h).transpose(1, 2)

        a = F.scaled_dot_product_attention(heads(self.q(n)), heads(self.k(n)), heads(self.v(n)), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, S, D))
        return x + self.down(self.up(x))  # GEMM -> GEMM: a direct bf16 -> fp32 -> bf16 pair


def _round_trips(tm, dense_only=False) -> list:
    """Casts that narrow a value widened from that very dtype (directly or through views); dense_only:
    those whose source has the widened copy's strides (a slice of the merged QKV GEMM's output has not:
    the copy is contiguous, and the views on the slice would give the attention other strides)."""
    out = []
    for n in tm.gm.graph.nodes:
        hit = cast_of(n)
        if hit is None:
            continue
        b = hit[0]
        while b.op == "call_function" and b.target in passes.casts.VIEWS:
            b = b.args[0]
        inner = cast_of(b)
        if inner is not None and inner[0].meta["val"].dtype == hit[1]:
            if not dense_only or inner[0].meta["val"].stride() == b.meta["val"].stride():
                out.append(n.name)
    return out


def _kernels(tm) -> int:
    return sum(1 for n in tm.gm.graph.nodes if getattr(n.target, "namespace", None) == "flydsl")


def _cast_kernels(tm) -> int:
    """Generated kernels that only cast."""
    return sum(1 for n in tm.gm.graph.nodes if n.target is torch.ops.flydsl.fused_elementwise.default
               and {op for op, _a, _p in parse(n.args[1]).ops} == {"cast"})


@pytest.fixture
def without_pass(monkeypatch):
    def off():
        monkeypatch.setattr(passes, "PIPELINE", [(k, f) for k, f in passes.PIPELINE if not k.startswith("cast_round")])
    return off


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_round_trips_between_lowered_ops_launch_nothing(precision, without_pass):
    m, x = Block().eval(), (torch.randn(2, 8, 64),)
    tm = translator.translate(m, x, backend="reference", precision=precision)
    assert tm.report.verification.passed, tm.report.verification.message
    assert tm.report.counters.get("cast_round_trip", 0) >= 3, tm.report.counters  # norm -> QKV, o's input, down's
    assert _round_trips(tm, dense_only=True) == [], tm.code
    without_pass()
    before = translator.translate(m, x, backend="reference", precision=precision, verify=False)
    # norm -> QKV GEMM, attention -> heads merge -> o, up -> down: a cast kernel or two each before
    assert _cast_kernels(before) - _cast_kernels(tm) >= 3, (_cast_kernels(before), _cast_kernels(tm))
    assert _kernels(before) - _kernels(tm) == _cast_kernels(before) - _cast_kernels(tm)
    with torch.no_grad():
        assert torch.equal(tm(*x), before(*x))  # an identity on every value: the same bits


class Narrowing(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return self.lin(self.lin(x).to(torch.bfloat16).to(torch.float32))  # rounds: not an identity


def test_a_narrowing_first_keeps_its_rounding():
    m, x = Narrowing().eval(), (torch.randn(4, 16),)
    tm = translator.translate(m, x, backend="reference")
    assert tm.report.counters.get("cast_round_trip", 0) == 0
    with torch.no_grad():
        torch.testing.assert_close(tm(*x), m(*x), **model_tol("fp32", "few_ops"))


class Returned(nn.Module):
    def forward(self, x):
        return x.float().to(torch.bfloat16) * 1  # * 1: the cast pair alone would be bypassed as a copy


class ReturnedBare(nn.Module):
    def forward(self, x):
        return x.float().to(torch.bfloat16)


@pytest.mark.parametrize("model", [Returned, ReturnedBare])
def test_a_returned_round_trip_is_a_fresh_tensor(model):
    x = torch.randn(4, 8).to(torch.bfloat16)
    tm = translator.translate(model().eval(), (x,), backend="reference")
    with torch.no_grad():
        y = tm(x)
    assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()  # never the user's own tensor
    y.add_(1)
    assert not torch.equal(y, x)


class Written(nn.Module):
    """The widened copy is read after the narrow value is written in place: the round trip is not `x`."""

    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(4, 8, dtype=torch.bfloat16))
        self.lin = nn.Linear(8, 8).to(torch.bfloat16)

    def forward(self, x):
        before = self.state.float()
        self.state.add_(x)
        return self.lin(before.to(torch.bfloat16)) + self.state


def test_a_written_storage_keeps_its_copy():
    m = Written().eval()
    x = torch.randn(4, 8).to(torch.bfloat16)
    tm = translator.translate(m, (x,), backend="reference")
    ref = Written().eval()
    ref.load_state_dict(m.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(tm(x), ref(x), **model_tol(torch.bfloat16))  # reading the write: O(1) off
