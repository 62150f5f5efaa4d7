"""fallback_on_mismatch: a deliberately wrong FlyDSL op (its reference monkeypatched to return
wrong numbers) is found, returned to PyTorch whole, and translate() ends with a passing
verification; never a loop (each test runs under an alarm)."""

from __future__ import annotations

import signal

import pytest
import torch

from translator import translate
import translator.lowerings  # noqa: F401  (fills the registry)
from translator.registry import FAMILIES
from translator_kernels.gemm.kernel import canonical_epilogue


@pytest.fixture
def deadline():
    def boom(*_):
        raise TimeoutError("translate(fallback_on_mismatch=True) did not end within 120 s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _break(monkeypatch, family, when=lambda *a: True):
    fam = FAMILIES[family]
    good = fam.reference

    def wrong(*args):
        out = good(*args)
        if not when(*args):
            return out
        return [o + 0.5 for o in out] if isinstance(out, (list, tuple)) else out + 0.5

    monkeypatch.setattr(fam, "reference", wrong)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 16)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_a_diverging_gemm_with_a_fused_epilogue_goes_back_to_pytorch(monkeypatch, deadline):
    # only the GEMM carrying the relu epilogue is wrong: denying the relu alone brought the same rewrite back
    _break(monkeypatch, "gemm", lambda a, w, n, k, bias, act, *rest: act == canonical_epilogue("relu"))
    tm = translate(MLP(), (torch.randn(4, 32),), backend="reference", fallback_on_mismatch=True)
    v = tm.report.verification
    assert v.passed, v.message
    assert len(v.fallbacks) == 1 and v.fallbacks[0]["op"] == "flydsl.gemm"
    assert set(v.fallbacks[0]["nodes"]) == {"linear", "relu"}
    rows = {r.node: r for r in tm.report.rows}
    assert rows["linear"].where == "pytorch" and rows["relu"].where == "pytorch"
    assert rows["linear_1"].where != "pytorch"  # the healthy GEMM stays a FlyDSL op
    assert "verification mismatch" in rows["linear"].detail


def test_without_fallback_the_diverging_node_is_named(monkeypatch, deadline):
    _break(monkeypatch, "gemm", lambda a, w, n, k, bias, act, *rest: act == canonical_epilogue("relu"))
    tm = translate(MLP(), (torch.randn(4, 32),), backend="reference")
    v = tm.report.verification
    assert v.passed is False
    assert v.divergence.op == "flydsl.gemm" and v.divergence.replaces == "relu"
    assert set(v.divergence.sources) == {"linear", "relu"}


class Chain(torch.nn.Module):
    def forward(self, x):
        y = torch.sigmoid(x) * 3.0 + 1.0
        return y.sum(-1), y.amax(-1)


@pytest.mark.parametrize("family", ["fused_elementwise", "fused_reduce"])
def test_list_returning_ops_are_localized_and_fall_back(monkeypatch, deadline, family):
    _break(monkeypatch, family)
    x = torch.randn(4, 64)
    tm = translate(Chain(), (x,), backend="reference", fallback_on_mismatch=True)
    v = tm.report.verification
    assert v.passed, v.message
    assert v.fallbacks and all(f["op"] == f"flydsl.{family}" for f in v.fallbacks)
    assert all(not n.meta.get("flydsl") or n.meta["flydsl"]["family"] != family for n in tm.gm.graph.nodes)
    torch.testing.assert_close(tm(x), Chain()(x))


def test_fallback_ends_when_everything_diverges(monkeypatch, deadline):
    for fam in ("gemm", "fused_elementwise", "fused_reduce"):
        _break(monkeypatch, fam)
    tm = translate(MLP(), (torch.randn(4, 32),), backend="reference", fallback_on_mismatch=True)
    assert tm.report.verification.passed
    assert not any("flydsl" in n.meta for n in tm.gm.graph.nodes)
